"""Grader of the flops-memory kata (katas/flops-memory/README.md).

Every answer is a count, so it must be an int (or a float holding a whole number, with a note)
and is compared exactly. Diagnoses ask each bug
oracle the same call and compare ints directly: ``bugs.match`` compares as float64, which cannot
tell two counts apart above 2**53.
"""
from fractions import Fraction

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from graders.engine import expect
from graders.engine.learner import describe_value

# A dtype of each element size: torch computes the bytes of meta tensors of these dtypes, an
# oracle independent of the reference's arithmetic.
DTYPES = {1: torch.int8, 2: torch.float16, 4: torch.float32, 8: torch.float64}

NOT_INT = ("Return a Python int: parameters, FLOPs and bytes are counts. A float passes only where it holds "
           "a whole number; `/` that does not divide exactly and math.sqrt give fractions (use `//` and "
           "math.isqrt), and NumPy integers are not ints (wrap them in int()).")

WRONG = {"attention_params": "Wrong number of parameters.", "attention_flops": "Wrong number of FLOPs.",
         "attention_scores_bytes": "Wrong number of bytes for the scores.",
         "kv_cache_bytes": "Wrong number of bytes for the KV cache.", "max_seq_len": "Wrong sequence length."}

# (function, args, kwargs, the answer, what it is): numbers quoted in papers and interviews.
TEXTBOOK = [
    ("attention_params", (768, 12), {}, 2_359_296, "GPT-2 small: four 768 x 768 projections, no bias"),
    ("attention_params", (768, 12), {"bias": True}, 2_362_368, "GPT-2 small with biases: 4 x 768 more"),
    ("attention_params", (4096, 32), {}, 67_108_864, "Llama-2-7B: four 4096 x 4096 projections"),
    ("attention_params", (8192, 64), {"n_kv_heads": 8}, 150_994_944,
     "Llama-2-70B: 64 query heads of 128 but only 8 K/V heads, so W_k and W_v are 8192 x 1024"),
    ("attention_flops", (1, 1024, 768, 12), {}, 8_053_063_680, "GPT-2 small, one layer, one 1024-token sequence"),
    ("attention_scores_bytes", (1, 32, 8192), {"bytes_per_element": 2}, 4_294_967_296,
     "32 heads, fp16, T = 8192: 4 GiB for ONE layer's scores"),
    ("attention_scores_bytes", (2, 12, 1024), {}, 100_663_296, "GPT-2 small, batch 2, fp32 (the default)"),
    ("kv_cache_bytes", (1, 4096, 32, 32, 128), {}, 2_147_483_648,
     "Llama-2-7B (32 layers, 32 K/V heads of 128), fp16, 4096 tokens: 2 GiB"),
    ("kv_cache_bytes", (1, 4096, 80, 8, 128), {}, 1_342_177_280,
     "Llama-2-70B (80 layers, 8 K/V heads of 128), fp16, 4096 tokens: 1.25 GiB"),
    ("max_seq_len", (2**30, 1, 32), {}, 4096, "1 GiB, 32 heads, fp16: 32 x 4096² x 2 bytes is exactly 1 GiB"),
    ("max_seq_len", (80 * 10**9, 8, 32), {}, 12_500, "80 GB, batch 8, 32 heads, fp16: exactly full at T = 12,500"),
]

# (d_model, n_heads, n_kv_heads): H != head_dim; the GQA ones have n_kv_heads >= 2 and groups >= 2.
PARAM_CONFIGS = [(48, 4, None), (48, 4, 4), (48, 4, 2), (40, 8, 2), (60, 6, 3)]

# (B, T, d_model, n_heads, n_kv_heads). T != d_model + kv_dim in each: counting only Q @ Kᵀ and
# weights @ V gives T / (T + d_model + kv_dim) of the answer, which then never looks like the 1/2
# of counting multiply-adds.
FLOP_CONFIGS = [(2, 7, 48, 4, None), (2, 11, 48, 4, 2), (3, 5, 40, 8, 2), (2, 80, 32, 2, None)]

# (B, T, n_layers, n_kv_heads, head_dim, bytes_per_element or None for the default). n_layers is
# never 1 or 2: forgetting the layers must not look like forgetting V.
KV_CONFIGS = [(2, 7, 3, 4, 16, None), (3, 11, 5, 2, 64, 4), (2, 1000, 80, 8, 128, None), (4, 513, 12, 6, 32, 1)]

# (B, H, T, head_dim, dtype) on CUDA. Each score tensor is a multiple of 512 bytes, the caching
# allocator's block size, so its peak is exactly its size.
CUDA_CASES = [(2, 4, 512, 64, torch.float16), (3, 2, 384, 32, torch.float32), (2, 8, 256, 16, torch.bfloat16)]


def literal(value) -> str:
    return f"{value:_}" if type(value) is int and abs(value) >= 10_000 else repr(value)


def call_text(name, args, kwargs) -> str:
    return f"{name}({', '.join([*map(literal, args), *(f'{k}={literal(v)}' for k, v in kwargs.items())])})"


def ratio(got: int, expected: int) -> str:
    """How far off, as a learner reads it: ``(1/2 of the right answer)``."""
    if got < 0 or expected <= 0 or got == expected:
        return ""
    r = Fraction(got, expected)
    shown = str(r) if r.numerator <= 100 and r.denominator <= 100 else f"{float(r):.3g}"
    return f" ({shown} times the right answer)" if r > 1 else f" ({shown} of the right answer)"


def as_count(got, *, call, case, expected: int) -> int:
    """``got`` as an int: an int, or a float holding a whole number (`/` that divides exactly gives
    one), noted. A float equal to an int is that exact integer: ``==`` between a float and an int
    compares exactly, even above 2**53. Anything else, non-integral floats included, is refused."""
    if type(got) is float and got.is_integer():
        expect.note("integral-float", f"{call} answered the float {got!r}: accepted as the integer it holds "
                                      f"exactly, but counts are ints (`//` where `/` divides exactly, "
                                      "math.isqrt for math.sqrt).")
        return int(got)
    expect.that(type(got) is int, NOT_INT, call=call, case=case,
                got=f"{describe_value(got)} ({type(got).__name__})", expected=f"int {expected:,}")
    return got


def check_count(got, expected: int, *, call, case, wrong, diagnose=None, how=""):
    """``got`` is the count ``expected``: the type first, then the value."""
    got = as_count(got, call=call, case=case, expected=expected)
    expect.that(got == expected, wrong, call=call, case=case, got=f"{got:,}{ratio(got, expected)}",
                expected=f"{expected:,}{how}", diagnose=diagnose)


def diagnosis(bugs, got, name, args, kwargs):
    """The bug oracle whose answer to this call is exactly ``got``, compared as ints."""
    compute = lambda impl: getattr(impl, name)(*args, **kwargs)
    right = compute(bugs.reference)
    for code, impl in bugs.variants():
        out = compute(impl)
        if out != right and out == got:
            return code
    return None


def ask(learner, bugs, name, args, kwargs, expected, *, case, how=""):
    """Call the learner's ``name`` and judge its answer against ``expected``."""
    got = getattr(learner, name)(*args, **kwargs)
    check_count(got, expected, call=call_text(name, args, kwargs), case=case, wrong=WRONG[name], how=how,
                diagnose=lambda: diagnosis(bugs, got, name, args, kwargs))


class Attention(nn.Module):
    """The grader's own self-attention layer, shaped like Llama's: q_proj and o_proj map d -> d,
    k_proj and v_proj map d -> n_kv_heads * head_dim (grouped-query attention when fewer)."""

    def __init__(self, d_model, n_heads, n_kv_heads, bias=False, **factory):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        kv_dim = n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, d_model, bias=bias, **factory)
        self.k_proj = nn.Linear(d_model, kv_dim, bias=bias, **factory)
        self.v_proj = nn.Linear(d_model, kv_dim, bias=bias, **factory)
        self.o_proj = nn.Linear(d_model, d_model, bias=bias, **factory)

    def forward(self, x):
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)   # (B, H, T, hd)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)   # (B, H_kv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)   # (B, H_kv, T, hd)
        # The math backend runs Q @ Kᵀ and weights @ V as bmm, which FlopCounterMode counts;
        # the fused CPU kernel counts 0 FLOPs.
        with sdpa_kernel(SDPBackend.MATH):
            y = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)   # (B, H, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))   # (B, T, C)


def module_params(d_model, n_heads, n_kv_heads, bias):
    """``(sum of numel over the parameters, what the module is)``: torch's own nn.MultiheadAttention
    for multi-head attention, the Llama-shaped layer otherwise. Meta tensors: nothing is allocated."""
    if n_kv_heads is None:
        module = nn.MultiheadAttention(d_model, n_heads, bias=bias, device="meta")
        what = f"torch.nn.MultiheadAttention({d_model}, {n_heads}, bias={bias})"
    else:
        module = Attention(d_model, n_heads, n_kv_heads, bias, device="meta")
        kv_dim = n_kv_heads * (d_model // n_heads)
        what = (f"a layer with q_proj, o_proj = Linear({d_model}, {d_model}) and k_proj, v_proj = "
                f"Linear({d_model}, {kv_dim}) ({n_kv_heads} K/V heads of {d_model // n_heads}), bias={bias}")
    return sum(p.numel() for p in module.parameters()), what


def counted_flops(rng, B, T, d_model, n_heads, n_kv_heads):
    """``(total, {op: FLOPs})`` that FlopCounterMode counts in a forward of the grader's layer."""
    model = Attention(d_model, n_heads, n_kv_heads or n_heads, dtype=torch.float64)
    x = torch.from_numpy(rng.standard_normal((B, T, d_model)))   # (B, T, C)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    return counter.get_total_flops(), by_op


def meta_bytes(shape, bytes_per_element) -> int:
    t = torch.empty(shape, dtype=DTYPES[bytes_per_element], device="meta")
    return t.numel() * t.element_size()


def cache_bytes(B, T, n_layers, n_kv_heads, head_dim, bytes_per_element) -> int:
    """Bytes of a cache built as a list of (K, V) pairs, one per layer, the way HF's DynamicCache holds it."""
    cache = [tuple(torch.empty(B, n_kv_heads, T, head_dim, dtype=DTYPES[bytes_per_element], device="meta")
                   for _ in "kv") for _ in range(n_layers)]
    return sum(t.numel() * t.element_size() for layer in cache for t in layer)


def scores_peak(q, k) -> int:
    """Peak CUDA memory, in bytes, that materialising q @ kᵀ adds to what is already allocated."""
    warm_up = q @ k.transpose(-2, -1)   # the first matmul allocates cuBLAS's workspace, once
    del warm_up
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    scores = q @ k.transpose(-2, -1)   # (B, H, T, T)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del scores
    return peak


def random_gqa(case_rng):
    """(d_model, n_heads, n_kv_heads): H != head_dim, n_kv_heads >= 2, groups >= 2."""
    n_heads = int(case_rng.choice([4, 6, 8]))
    head_dim = int(case_rng.choice([h for h in range(5, 13) if h != n_heads]))
    n_kv_heads = int(case_rng.choice([g for g in range(2, n_heads // 2 + 1) if n_heads % g == 0]))
    return n_heads * head_dim, n_heads, n_kv_heads


def test_textbook_answers(learner, bugs):
    """the textbook answers: GPT-2 small, Llama-2-7B and -70B, 4 GiB of fp16 scores at T = 8192"""
    for name, args, kwargs, answer, case in TEXTBOOK:
        ask(learner, bugs, name, args, kwargs, answer, case=case)


def test_params_match_torch_modules(learner, bugs, case_rng):
    """attention_params equals sum(p.numel()) of torch modules: MHA and GQA, with and without bias"""
    for d, H, n_kv in [*PARAM_CONFIGS, random_gqa(case_rng)]:
        for bias in (False, True):
            expected, what = module_params(d, H, n_kv, bias)
            kwargs = {**({} if n_kv is None else {"n_kv_heads": n_kv}), **({"bias": True} if bias else {})}
            ask(learner, bugs, "attention_params", (d, H), kwargs, expected, case=what,
                how=" = sum(p.numel() for p in module.parameters())")


def test_flops_match_flop_counter(learner, bugs, case_rng, rng):
    """attention_flops equals torch.utils.flop_counter.FlopCounterMode on a forward pass, MHA and GQA"""
    d, H, n_kv = random_gqa(case_rng)
    drawn = (int(case_rng.integers(2, 4)), int(case_rng.integers(5, 25)), d, H, n_kv)   # T <= 24 < d + kv_dim
    for B, T, d, H, n_kv in [*FLOP_CONFIGS, drawn]:
        total, by_op = counted_flops(rng, B, T, d, H, n_kv)
        counted = ", ".join(f"{op} {n:,}" for op, n in by_op.items())
        heads = f"{H} heads" + ("" if n_kv is None else f", {n_kv} K/V heads")
        ask(learner, bugs, "attention_flops", (B, T, d, H), {} if n_kv is None else {"n_kv_heads": n_kv}, total,
            case=f"x: float64 ({B}, {T}, {d}), {heads}, no bias; the forward of a reference layer "
                 "(projections, then F.scaled_dot_product_attention on the math backend)",
            how=f" counted by FlopCounterMode ({counted}: the projections run as mm, Q @ Kᵀ and weights @ V as bmm)")


def test_scores_bytes_values(learner, bugs, case_rng):
    """attention_scores_bytes equals the bytes of a (B, H, T, T) tensor, for 1- to 8-byte elements"""
    drawn = (int(case_rng.integers(2, 9)), int(case_rng.integers(2, 33)), int(case_rng.integers(5, 4097)), int(case_rng.choice([1, 2, 4])))
    for B, H, T, size in [(2, 4, 9, None), (3, 6, 17, 2), (2, 12, 33, 1), (2, 3, 5, 8), drawn]:
        dtype = str(DTYPES[size or 4]).removeprefix("torch.")
        ask(learner, bugs, "attention_scores_bytes", (B, H, T), {} if size is None else {"bytes_per_element": size},
            meta_bytes((B, H, T, T), size or 4), case=f"{dtype} scores of shape ({B}, {H}, {T}, {T})",
            how=" = numel() * element_size() of a tensor that shape")


@pytest.mark.cuda
def test_scores_bytes_measured_on_cuda(learner, bugs, rng):
    """attention_scores_bytes equals the peak CUDA memory measured while q @ kᵀ is materialised"""
    for B, H, T, hd, dtype in CUDA_CASES:
        q = torch.from_numpy(rng.standard_normal((B, H, T, hd))).to("cuda", dtype)   # (B, H, T, hd)
        k = torch.from_numpy(rng.standard_normal((B, H, T, hd))).to("cuda", dtype)   # (B, H, T, hd)
        peak = scores_peak(q, k)
        ask(learner, bugs, "attention_scores_bytes", (B, H, T), {"bytes_per_element": q.element_size()}, peak,
            case=f"q, k: {str(dtype).removeprefix('torch.')} ({B}, {H}, {T}, {hd}) on CUDA",
            how=" bytes, the peak of torch.cuda.max_memory_allocated() while q @ k.transpose(-2, -1) runs")


def test_kv_cache_bytes_values(learner, bugs, case_rng):
    """kv_cache_bytes equals the bytes of a K and a V per layer, MHA and GQA caches"""
    drawn = (int(case_rng.integers(2, 9)), int(case_rng.integers(5, 4097)), int(case_rng.integers(3, 49)),
             int(case_rng.choice([2, 4, 8])), int(case_rng.choice([64, 80, 128])), int(case_rng.choice([1, 2, 4])))
    for B, T, L, n_kv, hd, size in [*KV_CONFIGS, drawn]:
        dtype = str(DTYPES[size or 2]).removeprefix("torch.")
        ask(learner, bugs, "kv_cache_bytes", (B, T, L, n_kv, hd), {} if size is None else {"bytes_per_element": size},
            cache_bytes(B, T, L, n_kv, hd, size or 2),
            case=f"{L} layers, each caching a K and a V of shape ({B}, {n_kv}, {T}, {hd}), {dtype}",
            how=f" = the bytes of {2 * L} tensors of that shape")
