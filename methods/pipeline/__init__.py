"""Pipeline parallelism: schedule IR, validator, simulator, partitioner (pure Python, no torch)."""
