"""memtrain-suite: the face (cli, sweep) over rooms that import only downward (see pyproject.toml)."""
