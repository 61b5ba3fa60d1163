"""Benchmarks of the harness and of our pipelines against torch's: scripts for python -m, no EXPERIMENT."""
