"""The schedule language: actions, generators, validator, simulator, partitioner; pure Python, no torch."""
