"""Measurement: step timing, memory (tracker, cap, host), provenance; imports suite.config and harness."""
