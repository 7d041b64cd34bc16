"""Speculative layer: the propose -> verify -> accept -> commit/roll back transaction."""
