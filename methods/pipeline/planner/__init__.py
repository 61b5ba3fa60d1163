"""The 2BW planner (paper section 4): cost model, predictions, projections, its check; imports the pipeline."""
