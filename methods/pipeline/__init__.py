"""Pipeline parallelism: schedule IR, validator, simulator, partitioner, stages and executors (reference and torch.distributed)."""
