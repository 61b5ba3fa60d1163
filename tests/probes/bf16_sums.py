"""How far 16-bit sums of micro-batch gradients drift from the FP32 sum, at Llama 3 8B's block (issue 63, item 5).

One Llama 3 8B decoder block (4096 wide, 14336 feed-forward, 32 heads, 8 key-value heads) in bf16; each of 16
micro-batches of 128 random tokens gives its parameter gradients, summed two ways in micro-batch order: in bf16 (as
autograd accumulates into a 16-bit .grad) and in FP32. Prints, after 1, 2, 4, 8 and 16 micro-batches, the bf16
sum's error as a share of the FP32 sum's norm, beside one bf16 rounding of the FP32 sum (what L2L's slot ships now).

    python tests/probes/bf16_sums.py        # about 20 s on a 2-core CPU
"""

import time

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding


def main(seq: int = 128, micro_batches: int = 16) -> None:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
    )
    cfg._attn_implementation = "sdpa"
    layer = LlamaDecoderLayer(cfg, 0).to(torch.bfloat16)
    for p in layer.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, 0, 0.02)
    rotary = LlamaRotaryEmbedding(cfg)
    params = list(layer.parameters())
    in16 = [torch.zeros_like(p) for p in params]
    in32 = [torch.zeros_like(p, dtype=torch.float32) for p in params]
    t0 = time.time()
    for u in range(1, micro_batches + 1):
        x = torch.randn(1, seq, 4096, dtype=torch.bfloat16)
        pos = torch.arange(seq)[None]
        for p in params:
            p.grad = None
        y = layer(x, position_embeddings=rotary(x, pos), attention_mask=None, position_ids=pos)
        y = y[0] if isinstance(y, tuple) else y
        (y.float() * torch.randn_like(y, dtype=torch.float32)).sum().backward()
        for a16, a32, p in zip(in16, in32, params):
            a16 += p.grad
            a32 += p.grad.float()
        if u & (u - 1) == 0:
            norm = sum((a32**2).sum() for a32 in in32) ** 0.5
            drift = sum(((a16.float() - a32) ** 2).sum() for a16, a32 in zip(in16, in32)) ** 0.5
            once = sum(((a32.bfloat16().float() - a32) ** 2).sum() for a32 in in32) ** 0.5
            print(
                f"{u} micro-batches: bf16 sum's error {float(drift / norm):.2e} of its norm; one bf16 rounding of the "
                f"FP32 sum {float(once / norm):.2e} ({time.time() - t0:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
