"""Where a cell's result goes: the record store under results/runs/, W&B tracking; imports measure and below."""
