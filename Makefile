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

.PHONY: setup lint format test test-cuda test-slow bench table2 table3 table4 table5 table6 table7 2bw-table1 planner-check plan pipeline-timelines pipeline-bench 2bw-fig6 2bw-fig7 2bw-fig8 2bw-fig9 2bw-figs list gpu-campaign clean-venv

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[test,metrics,lint]'
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

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

test-cuda: $(STAMP)
	$(PY) -m pytest -q -m cuda

bench: $(STAMP)
	$(PY) -m pytest -q --benchmark-only -m "not cuda"
	$(PY) -m experiments.benchmarks.overhead

# The GPU campaign (README "Running on a GPU"): STAGE=1|2|3|all, each stage one command of at most 9 minutes
# that resumes where the last call stopped. It runs on the machine's own Python and torch (CUDA): nothing is
# installed there. DRY=1 is its CPU rehearsal at tiny shapes, in this project's virtual environment.
STAGE ?= all
DRY ?=
GPU_PY ?= python3
CAMPAIGN_FLAGS ?=
gpu-campaign: $(if $(DRY),$(STAMP))
	PYTHONPATH=. $(if $(DRY),$(PY),$(GPU_PY)) -m suite campaign --stage $(STAGE) $(if $(DRY),--dry) $(CAMPAIGN_FLAGS)

list: $(STAMP)
	$(PY) -m suite list

table2 table3 table4 table5 table6: $(STAMP)
	$(PY) -m suite run $@ --profile $(PROFILE) $(RUN_FLAGS)

# GLUE fine-tuning: DATA_DIR is the folder of GLUE TSVs (the `small` profile's default is ../shared/data/glue).
DATA_DIR ?=
table7: $(STAMP)
	$(PY) -m suite run table7 --profile $(PROFILE) $(if $(DATA_DIR),--data-dir $(DATA_DIR)) $(RUN_FLAGS)

# 2BW Table 1: pre-training on the GLUE training sentences of DATA_DIR (tiny: the test fixtures), 2 gloo ranks.
2bw-table1: $(STAMP)
	$(PY) -m suite run 2bw-table1 --profile $(PROFILE) $(if $(DATA_DIR),--data-dir $(DATA_DIR)) $(RUN_FLAGS)

# The 2BW planner: predictions against measured 2-rank runs (results/planner-check.md), and a ranked plan.
planner-check: $(STAMP)
	$(PY) -m suite run planner-check --profile $(PROFILE) $(RUN_FLAGS)

PLAN_FLAGS ?= --device v100 --workers 8 --batch 512 --methods pipedream-2bw pipedream-flush gpipe \
	--set model.layers=42 --set model.hidden=2048 --set model.heads=16 --set model.intermediate=8192 \
	--set model.vocab_size=51200 --set model.max_seq=1024 --set seq_len=512
plan: $(STAMP)
	$(PY) -m suite plan $(PLAN_FLAGS)

# PipeDream-2BW paper Figures 6-9: measured (torchrun ranks) and projected (the planner at the paper's scale) rows.
2bw-fig6 2bw-fig7 2bw-fig8 2bw-fig9: $(STAMP)
	$(PY) -m suite run $@ --profile $(PROFILE) $(RUN_FLAGS)

2bw-figs: 2bw-fig6 2bw-fig7 2bw-fig8 2bw-fig9

pipeline-timelines: $(STAMP)
	$(PY) -m experiments.pipeline_timelines

pipeline-bench: $(STAMP)
	$(PY) -m torch.distributed.run --standalone --nproc_per_node=2 -m experiments.benchmarks.pipeline_vs_torch

clean-venv:
	rm -rf $(VENV)
