"""The Triton katas' reference kernels, compiled for the GPU, against the PyTorch path each replaces:
the fused softmax against torch.softmax, FlashAttention's forward against SDPA, and the paged decode
against attention over the gathered cache (the copy a paged kernel avoids, then SDPA). Each pair is
checked to agree first, then timed side by side (triton.testing.do_bench: the median of many runs,
in milliseconds, after a warm-up), and the ratio printed. Exits 2 without CUDA or Triton.

    python benchmarks/triton_kernels.py [--dtype float16]
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cases(dtype):
    """(name, the reference's call, the PyTorch path, tolerance) for each kata, at sizes a GPU
    serves: 4096 rows of 4000, attention of 8 x 16 heads x 2048 tokens x 64, a decode step of 64
    sequences of up to 4096 tokens in blocks of 16, 32 query heads sharing 8 KV heads."""
    import torch
    import torch.nn.functional as F

    from reference.triton_flash import flash_attention
    from reference.triton_paged_decode import paged_decode
    from reference.triton_softmax import softmax

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4096, 4000, device="cuda", dtype=dtype, generator=g)   # (R, C)
    yield "triton-softmax", lambda: softmax(x), lambda: torch.softmax(x, dim=-1), 2e-3

    q, k, v = torch.randn(3, 8, 16, 2048, 64, device="cuda", dtype=dtype, generator=g).unbind(0)   # (B, H, T, D)
    yield ("triton-flash (causal)", lambda: flash_attention(q, k, v, causal=True, BLOCK_M=64, BLOCK_N=64)[0],
           lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 2e-2)

    B, Hq, Hkv, D, size, longest = 64, 32, 8, 64, 16, 4096
    lens = torch.randint(1, longest + 1, (B,), device="cuda", generator=g, dtype=torch.int32)   # (B,)
    per = math.ceil(longest / size)
    blocks = B * per
    table = torch.randperm(blocks, device="cuda", generator=g).view(B, per).to(torch.int32)   # (B, per)
    k_cache = torch.randn(blocks, size, Hkv, D, device="cuda", dtype=dtype, generator=g)   # (N, size, Hkv, D)
    v_cache = torch.randn(blocks, size, Hkv, D, device="cuda", dtype=dtype, generator=g)
    qd = torch.randn(B, Hq, D, device="cuda", dtype=dtype, generator=g)   # (B, Hq, D)
    mask = torch.arange(per * size, device="cuda")[None, :] < lens[:, None]   # (B, per * size) keys that exist

    def gathered():
        k = k_cache[table].flatten(1, 2).transpose(1, 2)   # (B, Hkv, per * size, D): the copy
        v = v_cache[table].flatten(1, 2).transpose(1, 2)
        return F.scaled_dot_product_attention(qd[:, :, None], k, v, attn_mask=mask[:, None, None],
                                              enable_gqa=True)[:, :, 0]   # (B, Hq, D)

    yield "triton-paged-decode", lambda: paged_decode(qd, k_cache, v_cache, table, lens), gathered, 2e-2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    args = parser.parse_args()
    if importlib.util.find_spec("triton") is None:
        print("Triton is not installed: pip install 'attention-katas[triton]'", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: these benchmarks compile the kernels for a GPU", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    dtype = getattr(torch, args.dtype)
    print(f"{torch.cuda.get_device_name()}, {args.dtype}; median ms of triton.testing.do_bench")
    print(f"{'kata':24} {'Triton ms':>10} {'PyTorch ms':>11} {'PyTorch / Triton':>17}")
    for name, kernel, baseline, tol in cases(dtype):
        got, want = kernel().float(), baseline().float()
        if not torch.allclose(got, want, rtol=tol, atol=tol):
            print(f"{name}: the kernel and the PyTorch path differ by {(got - want).abs().max().item():.3g}")
            return 1
        ms, base = do_bench(kernel), do_bench(baseline)
        print(f"{name:24} {ms:10.3f} {base:11.3f} {base / ms:17.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
