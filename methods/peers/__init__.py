"""The field's own implementations (torch's pipeline schedules, FSDP2, DeepSpeed), registered as peers beside ours."""
