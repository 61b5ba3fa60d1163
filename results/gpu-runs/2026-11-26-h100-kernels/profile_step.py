"""Where an AMP-recompute step's time goes at Table 3's shape (one micro-batch): torch.profiler's top CUDA kernels."""
import dataclasses, itertools, sys, torch
from suite.config.run import RunConfig, apply_overrides
from suite.core.check import build_method
from suite.harness.data import synthetic_batches
from experiments.table3 import EXPERIMENT
cells = [c for c in EXPERIMENT.cells("paper", ["amp-rc-u1"], None, None)]
run = RunConfig.from_dict(cells[0].resolved()["run"]).validate()
method = build_method(run, torch.device("cuda"))
batches = itertools.islice(synthetic_batches(run), 4)
b = next(batches)
for _ in range(2):
    method.step(b)
torch.cuda.synchronize()
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
    method.step(b); torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=60))
