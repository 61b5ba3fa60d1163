"""The Triton kernels compiled for the GPU (make test-cuda; the campaign's stage 1): every check of
tests/test_kernels.py and tests/test_lamb_kernel.py on CUDA (bf16 among them, which the CPU's interpreter cannot
run), and the attention at BERT-Large's head shape against the materialised keyed attention."""

import pytest
import torch

pytest.importorskip("triton")

from test_kernels import *  # noqa: E402, F403 — the same tests, collected here under the cuda mark
from test_kernels import _attention  # noqa: E402
from test_lamb_kernel import *  # noqa: E402, F403

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 4e-3), (torch.bfloat16, 3e-2), (torch.float32, 1e-4)])
def test_fused_attention_at_bert_larges_head_shape(dtype, tol):
    """Heads of 64 over 512 tokens, key padding: many query and key tiles, the mask and the keyed dropout."""
    b, h, s, d = 4, 16, 512, 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", generator=gen).to(dtype) for _ in range(3))
    grad = torch.randn(b, s, h, d, device="cuda", generator=gen).to(dtype)
    lengths = torch.tensor([512, 300, 77, 1], device="cuda")
    mask = (torch.arange(s, device="cuda")[None, :] < lengths[:, None])[:, None, None, :]
    ref = _attention("hash", q, k, v, mask, 0.1, grad)
    out = _attention("hash_triton", q, k, v, mask, 0.1, grad)
    for name, a, r in zip(("out", "dq", "dk", "dv"), out[:4], ref[:4]):
        err = (a.float() - r.float()).abs().max().item() / r.float().abs().max().item()
        assert err < tol, f"{name}: relative error {err:.2e} over {tol:.0e}"
