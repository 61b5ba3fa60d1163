"""The 2BW planner (paper section 4): cost model, predictions, projections, check, command; imports the pipeline."""
