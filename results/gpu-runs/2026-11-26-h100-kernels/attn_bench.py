"""Microbenchmark of the keyed kernels at Table 3's attention shape on CUDA (not committed: a smoke check)."""
import time, torch, torch.nn.functional as F
from suite.harness import rng
from suite.harness.kernels import attention, dropout

def t(fn, n=10):
    fn(); torch.cuda.synchronize()
    s = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - s) / n * 1e3

B, H, S, D = 64, 16, 512, 64
q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
g = torch.randn(B, S, H, D, device="cuda", dtype=torch.float16)
key = (*rng.site_words(1, 2, 3, 0), 0, round(0.1 * 2**32), rng._scale(0.1, torch.float16))
def fused_fwd():
    with torch.no_grad(): attention.keyed_attention(q, k, v, None, D**-0.5, 0.1, key)
def fused_fb():
    attention.keyed_attention(q, k, v, None, D**-0.5, 0.1, key).backward(g)
def sdpa_fwd():
    with torch.no_grad(): F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
def sdpa_fb():
    F.scaled_dot_product_attention(q, k, v, dropout_p=0.1).transpose(1, 2).backward(g)
def mat_fb():
    with rng.forced("hash"), rng.keyed(0, 0, 1, 0):
        s = torch.matmul(q, k.transpose(2, 3)) * D**-0.5
        p = torch.softmax(s, -1, dtype=torch.float32).to(q.dtype)
        p = rng.keyed_dropout(p, 0.1, True)
        torch.matmul(p, v).transpose(1, 2).backward(g)
fl = 4 * B * H * S * S * D
for name, fn, mult in (("fused fwd", fused_fwd, 1), ("sdpa fwd", sdpa_fwd, 1), ("fused fwd+bwd", fused_fb, 3.5), ("sdpa fwd+bwd", sdpa_fb, 3.5), ("materialised hash fwd+bwd", mat_fb, 3.5)):
    ms = t(fn)
    print(f"{name}: {ms:.2f} ms, {fl * mult / ms / 1e9:.0f} TFLOPS", flush=True)
x = torch.randn(64, 512, 1024, device="cuda", dtype=torch.float16)
k0, k1 = rng.site_words(1, 2, 3, 4)
ms = t(lambda: dropout.dropped(x, k0, k1, 0, round(0.1 * 2**32), rng._scale(0.1, torch.float16)))
print(f"dropout kernel 64x512x1024 fp16: {ms:.3f} ms, {2 * x.numel() * 2 / ms / 1e6:.0f} GB/s", flush=True)
ms = t(lambda: F.dropout(x, 0.1))
print(f"torch dropout same: {ms:.3f} ms", flush=True)
print("peak", torch.cuda.max_memory_allocated() / 1e9)
