"""Language-model pre-training with any registered method, validation at intervals, GLUE fine-tuning of the result."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from suite.config.errors import ConfigError
from suite.config.paths import ROOT
from suite.config.run import RunConfig
from suite.core.cell import cell_options
from suite.core.check import build_method
from suite.harness.families import FAMILIES
from suite.harness.model import build_model
from suite.tasks.corpus import Corpus, build_corpus


@dataclass
class PretrainOptions:
    """Pre-training settings, read from RunConfig.options beside the method's own options."""

    data_dir: str = ""  # folder of GLUE TSVs whose training sentences form the corpus (from the repo root)
    evals: int = 10  # validation evaluations spread over the run (and one at step 0)
    snapshot_ratio: float = 0.9  # bert-mlm: also keep the weights after this share of the steps
    finetune_task: str = ""  # bert-mlm: GLUE task each saved model is fine-tuned on ("" for none)
    finetune_epochs: int = 3
    finetune_batch: int = 8
    finetune_lr: float = 1e-4
    checkpoint_dir: str | None = None  # where the Hugging Face folders go; None: results/.cache/pretrain/<digest>

    @staticmethod
    def from_run(run: RunConfig) -> "PretrainOptions":
        opts = cell_options(PretrainOptions, run, "pre-training")
        if not opts.data_dir:
            raise ConfigError("pre-training needs data_dir: a folder of GLUE TSVs (--data-dir or SUITE_GLUE_DIR)")
        if opts.evals < 1 or not 0.0 < opts.snapshot_ratio <= 1.0 or opts.finetune_epochs < 1:
            raise ConfigError(f"need evals >= 1, 0 < snapshot_ratio <= 1 and finetune_epochs >= 1, got {opts}")
        return opts


def objective_of(run: RunConfig) -> str:
    family = run.model.resolved().family
    objective = FAMILIES[family].objective
    if objective not in ("mlm", "clm"):
        raise ConfigError(f"pre-training needs a language-model family (bert-mlm, gpt2, llama), not {family!r}")
    return objective


class LMEvaluator:
    """Mean validation loss (each block's mean token loss, averaged over blocks) of given weights, dropout off."""

    def __init__(self, run: RunConfig, corpus: Corpus, device: torch.device):
        self.run, self.device = run, device
        self.model = build_model(run.model, run.seed).to(device).eval()
        self.batches = corpus.validation(run.batch_size)

    @torch.no_grad()
    def __call__(self, state: dict[str, torch.Tensor]) -> float:
        self.model.hf.load_state_dict(state, strict=False)  # strict would also demand buffers
        total, count = 0.0, 0
        for b in self.batches:
            ctx = self.model.begin(b.to(self.device), self.run.seed, 0, b.size)
            total += float(self.model.forward_micro_batch(ctx)) * b.size
            count += b.size
        return total / count


def save_hf(run: RunConfig, state: dict[str, torch.Tensor], tokenizer, folder: Path) -> Path:
    """The weights as a Hugging Face folder (config, weights, tokenizer) that from_pretrained loads."""
    model = build_model(run.model, run.seed)
    model.hf.load_state_dict(state, strict=False)
    folder.mkdir(parents=True, exist_ok=True)
    model.hf.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def finetune_folder(run: RunConfig, opts: PretrainOptions, folder: Path, device: torch.device, log) -> dict:
    """Fine-tune a saved bert-mlm folder on opts.finetune_task with grad_accum (the same settings for every row)."""
    from suite.tasks.finetune import FinetuneOptions, finetune
    from suite.tasks.glue import get_task

    task = get_task(opts.finetune_task)
    model = dataclasses.replace(run.model, family="bert", pretrained=str(folder), num_labels=task.num_labels)
    ft_run = RunConfig(
        method="grad_accum",
        model=model,
        micro_batch_size=opts.finetune_batch,
        num_micro_batches=1,
        seq_len=run.seq_len,
        optimizer="adamw",
        lr=opts.finetune_lr,
        schedule="linear",
        seed=run.seed,
        device=run.device,
    )
    ft_opts = FinetuneOptions(
        task=opts.finetune_task, data_dir=opts.data_dir, epochs=opts.finetune_epochs, evals_per_epoch=1
    )
    res = finetune(ft_run, ft_opts, device, log=log)
    return {"score": res.score, "best_score": res.best_score, "curve": res.curve}


def pretrain(
    run: RunConfig, opts: PretrainOptions, device: torch.device, folder: Path, log=lambda msg: print(msg, flush=True)
) -> dict:
    """Train run.method for run.steps steps on the corpus; validation loss at intervals; bert-mlm saves, fine-tunes."""
    objective = objective_of(run)
    rank = int(os.environ.get("RANK", 0))
    data_dir = os.path.join(ROOT, opts.data_dir)
    corpus = build_corpus(data_dir, run.seq_len, objective, run.seed, run.model.resolved().vocab_size)
    run = dataclasses.replace(
        run,
        model=dataclasses.replace(run.model, vocab_size=corpus.vocab_size),
        total_steps=run.total_steps or run.steps,
    ).validate()
    method = build_method(run, device)
    evaluator = LMEvaluator(run, corpus, device) if rank == 0 else None
    every = max(run.steps // opts.evals, 1)
    snapshot = max(1, round(opts.snapshot_ratio * run.steps)) if objective == "mlm" else None
    out = {
        "loss_curve": [],
        "val_curve": [],
        "train_seconds": 0.0,
        "eval_seconds": 0.0,
        "vocab_size": corpus.vocab_size,
        "train_blocks": len(corpus.train),
        "valid_blocks": len(corpus.valid),
    }

    def evaluate(step: int) -> dict:  # collective: every rank gathers the weights, rank 0 scores them
        started = time.perf_counter()
        state = method.state_dict()
        if evaluator is not None:
            loss = evaluator(state)
            point = {"step": step, "val_loss": loss, **({"val_ppl": math.exp(loss)} if objective == "clm" else {})}
            out["val_curve"].append(point)
            log(f"step {step}/{run.steps}: validation {point}")
        out["eval_seconds"] += time.perf_counter() - started
        return state

    evaluate(0)
    started = time.perf_counter()
    for step in range(run.steps):
        out["loss_curve"].append({"step": step + 1, "loss": method.step(corpus.batch(step, run.batch_size)).loss})
        done = step + 1
        if done % every == 0 or done == run.steps or done == snapshot:
            out["train_seconds"] += time.perf_counter() - started
            state = evaluate(done)
            if rank == 0 and objective == "mlm" and done in (snapshot, run.steps):
                name = "final" if done == run.steps else "snapshot"
                out[f"{name}_folder"] = str(save_hf(run, state, corpus.tokenizer, folder / name))
                out[f"{name}_step"] = done
            started = time.perf_counter()
    out["samples_per_s"] = run.steps * run.batch_size / max(out["train_seconds"], 1e-9)
    if evaluator is None:
        return out
    last = out["val_curve"][-1]
    out.update(final_loss=out["loss_curve"][-1]["loss"], val_loss=last["val_loss"], val_ppl=last.get("val_ppl"))
    if objective == "mlm" and opts.finetune_task:
        for name, key in (("final", "ft_score"), ("snapshot", "ft_score_90")):
            where = out.get(f"{name}_folder") or out["final_folder"]  # snapshot_ratio 1: the final weights
            ft = finetune_folder(run, opts, Path(where), device, log)
            out[key], out[f"{key}_curve"] = ft["score"], ft["curve"]
        out["ft_task"] = opts.finetune_task
    return out


def pretrain_cell(run: RunConfig, device: torch.device, cap) -> dict:
    """One pre-training run as a table cell: loss curves, validation loss (perplexity), fine-tuned dev scores."""
    from suite.config import paths
    from suite.tasks.finetune import run_digest

    opts = PretrainOptions.from_run(run)
    root = Path(opts.checkpoint_dir) if opts.checkpoint_dir else paths.RESULTS_DIR / ".cache" / "pretrain"
    out = pretrain(run, opts, device, root / run_digest(run))
    for key in ("final_folder", "snapshot_folder"):  # relative to the results folder, so records survive a move
        if out.get(key) and paths.RESULTS_DIR in Path(out[key]).parents:
            out[key] = os.path.relpath(out[key], paths.RESULTS_DIR)
    return out
