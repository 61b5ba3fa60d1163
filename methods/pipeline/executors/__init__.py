"""Run schedules: stages, the reference and torch.distributed executors, torchrun; import schedules/, harness."""
