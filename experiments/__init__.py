"""Experiment definitions: one module per paper table or figure."""
