"""Execution methods beyond the baselines; each module registers itself."""
