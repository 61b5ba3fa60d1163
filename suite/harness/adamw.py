"""torch's fused AdamW as the suite calls it on part of a step: a window, a tail, a layer on the device."""

from __future__ import annotations

import torch


def fused_adamw(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, beta1, beta2, weight_decay, eps, maximize=False):
    """torch's fused AdamW over lists of tensors (no AMSGrad, no gradient scaler): the one call every partial step of
    the suite makes (a window, a tail, a layer on the device, the one-pass kernel's probe)."""
    torch._fused_adamw_(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        [],
        steps,
        amsgrad=False,
        lr=lr,
        beta1=beta1,
        beta2=beta2,
        weight_decay=weight_decay,
        eps=eps,
        maximize=maximize,
        grad_scale=None,
        found_inf=None,
    )


def group_hyper(group: dict) -> dict:
    """An AdamW param group's hyperparameters as fused_adamw takes them."""
    beta1, beta2 = group["betas"]
    return dict(
        lr=group["lr"], beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
        maximize=group.get("maximize", False),
    )  # fmt: skip
