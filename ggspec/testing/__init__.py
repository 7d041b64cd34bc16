"""Harness code for tests and benchmarks: the losslessness oracle and forced acceptance."""
