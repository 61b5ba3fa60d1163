"""Experiment definitions: a module per paper table or figure (found by name by the catalogue); benchmarks/."""
