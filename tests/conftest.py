"""Shared test setup: seeded randomness, W&B sandboxed to a temp folder, one CPU thread per test process."""

import os
import random
import sys

import pytest
import torch

# Without a GPU, Triton's kernels (suite/harness/kernels) run on numpy: the variable must be set before triton is
# imported, so it is set here, first. On a CUDA machine (make test-cuda) they compile for the GPU.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture
def kernel_here(monkeypatch):
    """Let the device's LAMB kernel take this machine's tensors (CPU ones run by Triton's interpreter)."""
    from suite.harness.optim import Lamb

    monkeypatch.setattr(Lamb, "KERNEL_DEVICES", ("cuda", "cpu"))


def real_wandb():
    """Skip unless the W&B library itself imports (a `wandb` folder of offline runs on the path is not it)."""
    from suite.records import tracking

    if not tracking.installed():
        pytest.skip("the wandb library is not installed")


@pytest.fixture
def wandb_sandbox(tmp_path, monkeypatch):
    """Point every W&B directory at tmp_path and drop any key so runs stay offline."""
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        d = tmp_path / var.lower()
        d.mkdir()
        monkeypatch.setenv(var, str(d))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    return tmp_path
