"""Pipelines, layered: planner/ over method.py over executors/ over schedules/ (the schedule language)."""
