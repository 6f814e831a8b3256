"""sdpa's attention on a CPU at llama135m's shapes: bf16 against float32, flash against math.

    OMP_NUM_THREADS=1 python benchmarks/attention_backward.py

transformers' sdpa attention calls torch's scaled_dot_product_attention, which on a CPU picks its
flash kernel. This times one layer's attention as an `rloo.py` step at llama135m runs it in the
policy's pass: 32 sequences of 91 tokens (27 prompt, 64 completion), 9 heads of 64, causal. It
prints the forward and the backward of each dtype under the flash and the math backends, the
median of 10 after a warm-up, in CPU milliseconds; a step's backward runs 30 such layers.
"""

import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

B, H, L, D = 32, 9, 91, 64


def timed(dtype, backend):
    q, k, v = (torch.randn(B, H, L, D, dtype=dtype, requires_grad=True) for _ in range(3))
    forward, backward = [], []
    with sdpa_kernel([backend]):
        for _ in range(11):
            start = time.process_time()
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            middle = time.process_time()
            torch.autograd.grad(out.sum(), (q, k, v))  # not accumulated into .grad
            forward.append(middle - start)
            backward.append(time.process_time() - middle)
    return statistics.median(forward[1:]), statistics.median(backward[1:])


for dtype in (torch.bfloat16, torch.float32):
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH):
        f, b = timed(dtype, backend)
        print(f"{dtype} {backend.name}: forward {f * 1e3:.1f} ms, backward {b * 1e3:.1f} ms")
