"""The engine: registry, experiments, cells, runner, oracle; imports the rooms below, finds methods by name."""
