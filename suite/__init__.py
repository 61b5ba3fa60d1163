"""Shared harness of the memory-efficient training suite."""
