"""Baseline methods: gradient accumulation (FP32) and automatic mixed precision."""
