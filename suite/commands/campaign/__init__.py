"""The GPU campaign: a lent GPU's minutes turned into committed results, in resumable stages of one command each.

stages.py says what each stage runs; stage.py runs one (StageRequest -> StageReport, report.py); pytest_steps.py
runs its test steps; precounting.py counts the capped cells before a GPU is lent."""
