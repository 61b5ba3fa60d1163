"""Table 7's `small` recipe, chosen without dev: candidate learning rates scored on a held-out fifth of train."""

from __future__ import annotations

from experiments import table7
from suite.core.experiment import Metric
from suite.tasks.glue import TASKS, check_folder

RATES = (2e-5, 5e-5, 1e-4)  # AdamW's usual range for a small pretrained BERT
TASKS_CHOSEN_ON = ("mrpc", "rte", "stsb", "cola")  # the small tasks with a train file; QNLI has none here
HOLDOUT = "holdout:0.2"
# Epoch counts past the recipe's, at its rate, for the task whose dev score stays under the bar (RTE, 2,490
# training pairs): chosen on the held-out fifth like the rate, never on dev.
EPOCHS = {"rte": (6, 10)}
# Longer token caps at the recipe's rate and epochs, for the task whose pairs the recipe's 128 tokens truncate: 12.2% of
# RTE's training pairs (and 11.9% of its dev pairs) are longer, up to 289 tokens; every CoLA, SST-2, MRPC and STS-B
# pair fits in 128 and QNLI's 4,000 training pairs all but 0.5%. 256 is the model's own maximum (its
# sentence_bert_config). Rule fixed before the run: RTE takes 256 unless it scores below 128 on the held-out fifth.
SEQ_LENS = {"small": {"rte": (256,)}}  # `tiny`'s model holds 128 tokens
# The pooler's input, for the task still under its bar, at the recipe's rate, epochs and RTE's 256 tokens.
# all-MiniLM-L6-v2 was trained to be read by the mean of its tokens (its 1_Pooling config), and its pooler never
# trained (its bias is all zeros), so [CLS] may be the weaker input. Rule fixed before the run: RTE takes "mean" if it
# scores at least one point (5 of the 498 held-out pairs) above "cls" (61.24) on the held-out fifth.
POOLINGS = {"small": {"rte": ("mean",)}}


def rows(profile: str):
    per_device, micro = table7.SHAPES[profile]
    lr, epochs = table7.RECIPE[profile]["lr"], table7.RECIPE[profile]["epochs"]
    out = []
    for task in TASKS_CHOSEN_ON:
        common = {
            "precision": "fp32",
            "micro_batch_size": micro,
            "num_micro_batches": per_device // micro,
            "model.num_labels": TASKS[task].num_labels,
        }
        for rate in RATES:
            out.append(_row(profile, task, rate, {**common, "lr": rate}, epochs, f"{task}-lr{rate:g}"))
        at_recipe = {**common, "lr": lr}  # the rows below vary one thing at the recipe's rate
        for n in EPOCHS.get(task, ()):
            out.append(_row(profile, task, lr, at_recipe, n, f"{task}-lr{lr:g}-ep{n}", {"epochs": n}))
        for tokens in SEQ_LENS.get(profile, {}).get(task, ()):
            overrides = {**at_recipe, "seq_len": tokens}
            out.append(_row(profile, task, lr, overrides, epochs, f"{task}-lr{lr:g}-seq{tokens}"))
        for pooling in POOLINGS.get(profile, {}).get(task, ()):
            tokens = table7.seq_len(profile, task)
            overrides = {**at_recipe, "seq_len": tokens, "model.pooling": pooling}
            out.append(_row(profile, task, lr, overrides, epochs, f"{task}-lr{lr:g}-seq{tokens}-{pooling}"))
    return out


def _row(profile: str, task: str, lr: float, overrides: dict, epochs: int, name: str, data: dict | None = None):
    metric = table7.METRIC_LABEL.get(task, "accuracy")
    tokens = overrides.get("seq_len", table7.base(profile)["seq_len"])
    pooling = overrides.get("model.pooling", "cls")
    labels = {
        "task": TASKS[task].folder,
        "lr": f"{lr:g}",
        "epochs": epochs,
        "max tokens": tokens,
        "pooling": pooling,
        "metric": metric,
    }
    return table7.TaskRow(name, "grad_accum", overrides, labels, {}, task=task, data={"split": HOLDOUT, **(data or {})})


EXPERIMENT = table7.FinetuneExperiment(
    name="table7-recipe",
    title="Table 7's recipe: AdamW learning rates scored on a held-out fifth of train (dev unseen)",
    source="ours: the recipe of Table 7's `small` profile (the issue asks for one chosen on training data, not dev)",
    metrics=[
        Metric("score", "held-out (%)", ratio=False),
        Metric("best_score", "best held-out (%)", ratio=False),
        Metric("best_step", "best step", "{:.0f}", ratio=False),
    ],
    label_columns=["task", "lr", "epochs", "max tokens", "pooling", "metric"],
    baseline="mrpc-lr5e-05",
    rows=rows,
    base=table7.base,
    kind="finetune",
    timeout=table7.EXPERIMENT.timeout,
    options=table7.options,
    data_check=lambda folder: check_folder(folder, "train"),  # it holds out a fifth of train
    notes=(
        "Every row trains the FP32 baseline (grad_accum) with Table 7's `small` recipe at one learning rate, on a "
        "seeded 80% of the task's train split, and scores the other 20% (the `held-out` columns): dev is never "
        "read. The rate with the best held-out scores across the tasks becomes table7.RECIPE['small']['lr']; the "
        "`-ep` rows train RTE longer at that rate, for its epoch count; the `-seq` rows cap its pairs at more tokens "
        "(`max tokens`; 12% of RTE's pairs exceed 128), for its cap; the `-mean` row feeds the pooler the mean of the "
        "tokens instead of [CLS] (`pooling`), for its head."
    ),
)
