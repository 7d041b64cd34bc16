"""The rules that choose how to speculate: draft length, costs, calibration, tree budget, memory fit."""
