"""Benchmarks of the harness and of our pipelines against torch's, as experiments (bench-*, found by the catalogue)."""
