"""Grader of the roofline kata (katas/roofline/README.md).

Times, intensities and MFU are real numbers, compared with a relative tolerance RTOL (plain
Python floats through a handful of operations: far above their rounding, far below any slip the
kata diagnoses, the smallest of which is a factor of 3/4). train_flops_per_token is a count,
compared exactly. FLOPs come from torch's FlopCounterMode where torch can count them; bytes from
the tensors a step would read.
"""
import math
from fractions import Fraction
from numbers import Real

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from graders.engine import expect
from graders.engine.learner import describe_value

RTOL = 1e-9

H100_BYTES, H100_FLOPS = 3.35e12, 989e12   # H100 SXM: HBM3 bandwidth, dense bf16 peak
A100_BYTES, A100_FLOPS = 2.039e12, 312e12  # A100 80 GB SXM

# Bytes per element of each dtype name, from torch where torch has the dtype.
TORCH_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
                "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
                "fp8": torch.float8_e4m3fn, "float8": torch.float8_e4m3fn, "int8": torch.int8}

NOT_NUMBER = "Return a Python number (an int or a float): times, FLOPs per byte and MFU are real numbers."
NOT_COUNT = "Return an int: FLOPs are a count, compared exactly."
FLOAT_COUNT = (" A float is not one, even a whole one: it holds whole numbers exactly only up to 2**53, and `/`, "
               "or any float in the sum (3.0 * ..., 1e9 * ...), makes one. Keep the arithmetic in ints: `*`, `+`, "
               "and `//` where a division is exact.")
NOT_STEP = "decode_step returns a pair (seconds, bound), bound being \"memory\" or \"compute\"."

WRONG = {"dtype_bytes": "Wrong number of bytes per element.", "decode_step": "Wrong decode-step time.",
         "attention_decode_intensity": "Wrong FLOPs per byte for decode attention.",
         "decode_intensity": "Wrong FLOPs per byte for a decode step.",
         "prefill_intensity": "Wrong FLOPs per byte for a prefill.",
         "crossover_batch": "Wrong crossover batch.", "train_flops_per_token": "Wrong training FLOPs per token.",
         "mfu": "Wrong MFU."}

LLAMA2_7B_KV = 2 * 32 * 32 * 128 * 2    # bytes of K and V per token: 32 layers, 32 K/V heads of 128, bf16
LLAMA2_70B_KV = 2 * 80 * 8 * 128 * 2    # 80 layers, 8 K/V heads of 128, bf16

# (function, args, the answer, what it is): answers worked out by hand.
TEXTBOOK = [
    ("dtype_bytes", ("bf16",), 2, "bf16 is 16 bits: 2 bytes"),
    ("dtype_bytes", ("int4",), 0.5, "two int4 values pack into a byte"),
    ("decode_step", (7_000_000_000, LLAMA2_7B_KV, 4096, 1, H100_BYTES, H100_FLOPS),
     ((14e9 + 4096 * 524_288) / 3.35e12, "memory"),
     "a 7B model in bf16 (Llama-2-7B's cache, 0.5 MiB per token), one 4096-token sequence on an H100: ~4.8 ms"),
    ("decode_step", (70_000_000_000, LLAMA2_70B_KV, 4096, 8, H100_BYTES, H100_FLOPS),
     ((140e9 + 8 * 4096 * 327_680) / 3.35e12, "memory"),
     "a 70B model in bf16 (Llama-2-70B's GQA cache, 320 KiB per token), 8 sequences of 4096 on an H100: ~45 ms"),
    ("decode_step", (7_000_000_000, LLAMA2_7B_KV, 0, 512, H100_BYTES, H100_FLOPS),
     (2 * 7e9 * 512 / 989e12, "compute"), "a 7B model, an empty cache, batch 512 > the H100's ~295"),
    ("crossover_batch", (H100_FLOPS, H100_BYTES), 989e12 * 2 / (2 * 3.35e12), "H100, bf16 weights: ~295"),
    ("crossover_batch", (H100_FLOPS * 2, H100_BYTES, 1), 1978e12 / (2 * 3.35e12), "H100, fp8 weights and fp8 peak: ~295"),
    ("attention_decode_intensity", (64, 8, 4096, 16), 8.0, "Llama-2-70B, 64 query heads over 8 K/V heads, bf16 cache"),
    ("attention_decode_intensity", (32, 32, 4096, 16), 1.0, "Llama-2-7B, multi-head attention, bf16 cache"),
    ("train_flops_per_token", (540_000_000_000, 118, 2048, 48 * 256), 6 * 540 * 10**9 + 12 * 118 * 2048 * 48 * 256,
     "PaLM 540B: N = 540·10⁹ (its total count), 118 layers, n_heads·head_dim = 48 × 256 = 12,288 (not its "
     "d_model), 2048-token sequences"),
]


def literal(value) -> str:
    return f"{value:_}" if type(value) is int and abs(value) >= 10_000 else repr(value)


def call_text(name, args) -> str:
    return f"{name}({', '.join(map(literal, args))})"


def is_number(x) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool)


def close(a, b) -> bool:
    """Same answer: numbers within RTOL, strings equal, pairs elementwise."""
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return is_number(a) and is_number(b) and math.isclose(a, b, rel_tol=RTOL, abs_tol=0.0)


def ratio(got, expected) -> str:
    """How ``got`` stands to ``expected``, in words that point at the slip: a simple fraction (17/18, 3 times),
    else how many per cent off where that is under 10 % (a ratio that prints as 1 says nothing), and a
    whole number within 1 of an answer that is not one is said to be rounded."""
    if not (is_number(got) and is_number(expected)) or expected == 0 or got == expected or got <= 0:
        return ""
    r = got / expected
    simple = Fraction(r).limit_denominator(100)
    if simple != 1 and math.isclose(float(simple), r, rel_tol=1e-6):
        return f" ({simple} times the right answer)" if simple > 1 else f" ({simple} of the right answer)"
    if abs(r - 1) >= 0.1:
        return f" ({r:.3g} times the right answer)"
    side = "above" if r > 1 else "below"
    off = f"{abs(r - 1) * 100:.2g} % {side} the right answer"
    if float(got).is_integer() and not float(expected).is_integer() and abs(got - expected) < 1:
        way = "up" if r > 1 else "down"
        off += f": {expected:.6g} rounded {way} to a whole number, where the answer is not rounded"
    return f" ({off})"


def step_times(args) -> tuple[Fraction, Fraction]:
    """(seconds of the FLOPs, seconds of the bytes) of decode_step(*args), exactly."""
    P, kvt, T, B, hbm, fps, bpp = (*args, 2)[:7]   # bytes_per_param defaults to 2
    return Fraction(2 * P * B) / Fraction(fps), (Fraction(P) * Fraction(bpp) + B * T * kvt) / Fraction(hbm)


def tie(args) -> str:
    """The sentence that says a step's FLOPs and bytes take exactly as long, where they do; else ""."""
    compute_s, memory_s = step_times(args)
    if compute_s != memory_s:
        return ""
    return (f" The FLOPs and the bytes take exactly as long here, {float(compute_s):.6g} s each: a tie, which is "
            "\"memory\" (the bound is \"compute\" only where the FLOPs take strictly longer).")


def wrong_bound(args) -> str:
    """"Wrong bound.", with the step's two times: what decides it, or that they tie."""
    compute_s, memory_s = step_times(args)
    if compute_s == memory_s:
        return "Wrong bound." + tie(args)
    longer, shorter = ("FLOPs", "bytes") if compute_s > memory_s else ("bytes", "FLOPs")
    return (f"Wrong bound. The FLOPs take {float(compute_s)!r} s and the bytes {float(memory_s)!r} s: "
            f"the {longer} take longer than the {shorter}.")


def diagnosis(bugs, got, name, args, pick=lambda x: x):
    """The bug oracle whose answer to this call (its part ``pick``) is ``got``, and not the reference's."""
    right = pick(getattr(bugs.reference, name)(*args))
    for code, impl in bugs.variants():
        out = pick(getattr(impl, name)(*args))
        if not close(out, right) and close(out, got):
            return code
    return None


def step_diagnosis(learner, bugs, got, args):
    """The bug whose decode_step gives the learner's whole (seconds, bound) here. Where several
    codes do (a compute-bound answer hides the bytes), ask the learner once more, memory-bound:
    one sequence of at least 3 cached tokens, whose time shows which bytes it counts."""
    right = tuple(bugs.reference.decode_step(*args))
    codes = list(dict.fromkeys(code for code, impl in bugs.variants()
                               if not close(tuple(impl.decode_step(*args)), right)
                               and close(tuple(impl.decode_step(*args)), tuple(got))))
    if len(codes) <= 1:
        return codes[0] if codes else None
    P, kvt, T, B, hbm, fps, bpp = args
    probe = (P, kvt, max(T, 3), 1, hbm, fps, bpp)
    again = learner.decode_step(*probe)
    return diagnosis(bugs, again[0], "decode_step", probe, lambda s: s[0])


def check_number(got, expected, *, call, case, wrong, diagnose=None, how=""):
    expect.that(is_number(got), NOT_NUMBER, call=call, case=case,
                got=f"{describe_value(got)} ({type(got).__name__})", expected=f"{expected!r}")
    expect.that(close(got, expected), wrong, call=call, case=case, got=f"{got!r}{ratio(got, expected)}",
                expected=f"{expected!r}{how}", diagnose=diagnose)


def step_of(learner, args, *, call, case):
    """The learner's decode_step answer as (seconds, bound), its form checked."""
    got = learner.decode_step(*args)
    expect.that(isinstance(got, (tuple, list)) and len(got) == 2 and is_number(got[0])
                and got[1] in ("memory", "compute"), NOT_STEP, call=call, case=case,
                got=describe_value(got), expected="(seconds, \"memory\" | \"compute\")")
    return got


def ask(learner, bugs, name, args, expected, *, case, how=""):
    """Call the learner's ``name`` and judge its answer against ``expected`` (a number, or a
    (seconds, bound) pair for decode_step, or a (weights, attention) pair for the intensities)."""
    call = call_text(name, args)
    if name == "decode_step":
        got = step_of(learner, args, call=call, case=case)
        check_number(got[0], expected[0], call=call, case=case, wrong=WRONG[name], how=how,
                     diagnose=lambda: diagnosis(bugs, got[0], name, args, lambda s: s[0]))
        expect.that(got[1] == expected[1], wrong_bound(args), call=call, case=case, got=repr(got[1]),
                    expected=repr(expected[1]), diagnose=lambda: step_diagnosis(learner, bugs, got, args))
        return
    got = getattr(learner, name)(*args)
    if isinstance(expected, tuple):
        expect.that(isinstance(got, (tuple, list)) and len(got) == 2, f"{name} returns a pair (weight matmuls, attention).",
                    call=call, case=case, got=describe_value(got), expected=repr(expected))
        for i, part in enumerate(("weight matmuls", "attention")):
            check_number(got[i], expected[i], call=call, case=f"{case}; the {part} part", wrong=WRONG[name], how=how,
                         diagnose=lambda: diagnosis(bugs, got[i], name, args, lambda s: s[i]))
        return
    if name == "train_flops_per_token":
        expect.that(type(got) is int, NOT_COUNT + (FLOAT_COUNT if type(got) is float else ""), call=call, case=case,
                    got=f"{describe_value(got)} ({type(got).__name__})", expected=f"int {expected:,}")
        expect.that(got == expected, WRONG[name], call=call, case=case, got=f"{got:,}{ratio(got, expected)}",
                    expected=f"{expected:,}{how}", diagnose=lambda: diagnosis(bugs, got, name, args))
        return
    check_number(got, expected, call=call, case=case, wrong=WRONG[name], how=how,
                 diagnose=lambda: diagnosis(bugs, got, name, args))


def attention(q, k, v):
    """Attention written out, so that FlopCounterMode counts its two matmuls (the fused CPU kernel
    counts 0). q: (B, H, Tq, hd); k, v: (B, H_kv, T, hd)."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1)   # (B, H, T, hd)
    weights = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)   # (B, H, Tq, T)
    return weights @ v   # (B, H, Tq, hd)


def counted(fn, *args):
    """(FLOPs FlopCounterMode counts in fn(*args), its output)."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        out = fn(*args)
    return counter.get_total_flops(), out


class Block(nn.Module):
    """A decoder block without biases or norms: N = 12 * d² parameters (attention 4d², MLP 8d²)."""

    def __init__(self, d, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d, 3 * d, bias=False, dtype=torch.float64)
        self.out = nn.Linear(d, d, bias=False, dtype=torch.float64)
        self.up = nn.Linear(d, 4 * d, bias=False, dtype=torch.float64)
        self.down = nn.Linear(4 * d, d, bias=False, dtype=torch.float64)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)   # (B, H, T, hd) each
        x = x + self.out(attention(q, k, v).transpose(1, 2).reshape(B, T, d))
        return x + self.down(F.gelu(self.up(x)))


def training_flops(rng, L, T, d, n_heads, B=2):
    """(FLOPs per token of a forward and backward, N): the input requires grad, as an embedding's output does."""
    blocks = nn.Sequential(*[Block(d, n_heads) for _ in range(L)])
    x = torch.from_numpy(rng.standard_normal((B, T, d))).requires_grad_()   # (B, T, d)
    with FlopCounterMode(display=False) as counter:
        blocks(x).sum().backward()
    return counter.get_total_flops() // (B * T), sum(p.numel() for p in blocks.parameters())


def test_textbook_answers(learner, bugs):
    """the textbook answers: Llama-2-7B and -70B decoding on an H100, its crossover batch, PaLM's count"""
    for name, args, answer, case in TEXTBOOK:
        ask(learner, bugs, name, args, answer, case=case)


def test_dtype_bytes(learner, bugs):
    """dtype_bytes of every name, and ValueError for an unknown one"""
    for name, dtype in TORCH_DTYPES.items():
        ask(learner, bugs, "dtype_bytes", (name,), torch.empty(0, dtype=dtype).element_size(),
            case=f"torch.{str(dtype).removeprefix('torch.')}", how=" = torch's element_size()")
    ask(learner, bugs, "dtype_bytes", ("int4",), 0.5, case="two 4-bit values per byte")
    expect.refused(lambda: learner.dtype_bytes("int3"), call="dtype_bytes('int3')", expected="ValueError",
                   raised="Raise ValueError for a dtype name outside the table.",
                   returned="A dtype name outside the table must raise ValueError, not return a number.")


def step_cases(case_rng):
    """(params, kv_bytes_per_token, T, B, hbm, flops, bytes_per_param): memory- and compute-bound,
    B and T never 1 together with the other (so B * T, B and T tell the slips apart)."""
    drawn = (int(case_rng.integers(10**8, 10**10)), int(case_rng.integers(10**4, 10**6)), int(case_rng.integers(2, 8193)),
             int(case_rng.integers(2, 65)), A100_BYTES, A100_FLOPS, 2)
    return [
        (7_000_000_000, LLAMA2_7B_KV, 2048, 4, H100_BYTES, H100_FLOPS, 2),
        (13_000_000_000, 819_200, 513, 3, A100_BYTES, A100_FLOPS, 2),
        (8_000_000_000, 131_072, 100, 1024, H100_BYTES, H100_FLOPS, 1),   # fp8 weights, short cache: compute
        (1_000_000_000, 65_536, 3, 700, 2e12, 300e12, 4),
        (70_000_000_000, LLAMA2_70B_KV, 8192, 32, H100_BYTES, H100_FLOPS, 0.5),   # int4 weights, cache-bound
        (8_000_000_000, 131_072, 4096, 1024, H100_BYTES, H100_FLOPS, 1),   # compute-bound but for the cache
        drawn,
    ]


def test_decode_step_time(learner, bugs, case_rng):
    """decode_step's time: the longer of its bytes and its FLOPs, over batch sizes and cache lengths"""
    for args in step_cases(case_rng):
        P, kvt, T, B, hbm, fps, bpp = args
        weights = P * bpp   # read once, shared by the batch
        cache = B * T * kvt   # B sequences of T cached tokens
        expected = max((weights + cache) / hbm, 2 * P * B / fps)
        call = call_text("decode_step", args)
        case = f"{P:,} parameters at {bpp} bytes, {B} sequences of {T:,} cached tokens at {kvt:,} bytes each"
        got = step_of(learner, args, call=call, case=case)
        check_number(got[0], expected, call=call, case=case, wrong=WRONG["decode_step"],
                     how=f" = max(({weights:,} + {cache:,}) bytes / {hbm:g}, {2 * P * B:,} FLOPs / {fps:g})",
                     diagnose=lambda: diagnosis(bugs, got[0], "decode_step", args, lambda s: s[0]))


def test_decode_step_bound(learner, bugs, case_rng):
    """decode_step's bound, "memory" or "compute", ties included"""
    cases = [*step_cases(case_rng),
             (10**9, 1000, 0, 100, 10, 1000, 2),    # FLOPs and bytes take exactly as long: "memory"
             (10**9, 1000, 0, 101, 10, 1000, 2)]    # one more sequence: "compute"
    for args in cases:
        P, kvt, T, B, hbm, fps, bpp = args
        flops, nbytes = 2 * P * B, P * bpp + B * T * kvt
        compute = Fraction(flops) / Fraction(fps) > Fraction(nbytes) / Fraction(hbm)
        expected = "compute" if compute else "memory"
        call = call_text("decode_step", args)
        got = step_of(learner, args, call=call, case=f"{flops:,} FLOPs, {nbytes:,} bytes")
        expect.that(got[1] == expected, wrong_bound(args), call=call, case=f"{flops:,} FLOPs, {nbytes:,} bytes",
                    got=repr(got[1]), expected=repr(expected),
                    diagnose=lambda: step_diagnosis(learner, bugs, got, args))


def test_weight_intensity(learner, bugs, case_rng):
    """the weight matmuls' FLOPs per byte in prefill and decode"""
    for B, T, H, Hkv, bpp in [(3, 5, 4, 2, 2), (7, 11, 8, 8, 1), (int(case_rng.integers(2, 65)), int(case_rng.integers(2, 999)), 8, 2, 4)]:
        weight = torch.empty(40, 48, device="meta", dtype={1: torch.int8, 2: torch.bfloat16, 4: torch.float32}[bpp])
        wbytes = weight.numel() * weight.element_size()
        for name, tokens in (("prefill_intensity", B * T), ("decode_intensity", B)):
            flops = 2 * tokens * weight.numel()   # (tokens, 48) @ (48, 40)
            args = (B, T, H, Hkv) if bpp == 2 else (B, T, H, Hkv, bpp)   # bf16: the default bytes_per_param
            call = call_text(name, args)
            got = getattr(learner, name)(*args)
            expect.that(isinstance(got, (tuple, list)) and len(got) == 2, f"{name} returns a pair (weight matmuls, attention).",
                        call=call, got=describe_value(got), expected="(weights, attention)")
            check_number(got[0], flops / wbytes, call=call, case=f"{tokens} tokens through a weight of {bpp} bytes",
                         wrong=WRONG[name], how=" FLOPs per weight byte",
                         diagnose=lambda: diagnosis(bugs, got[0], name, args, lambda s: s[0]))


def test_attention_decode_intensity(learner, bugs, case_rng, rng):
    """attention_decode_intensity equals FlopCounterMode's FLOPs over the cache's bytes, MHA and GQA, any batch"""
    for H, Hkv, T, B, dtype in [(8, 2, 37, 3, torch.float32), (4, 4, 16, 5, torch.float64), (6, 1, 9, 4, torch.float32),
                                (8, 2, 21, 3, torch.bfloat16),   # the default bytes_per_element
                                (8, 4, int(case_rng.integers(2, 200)), int(case_rng.integers(2, 9)), torch.float64)]:
        q = torch.from_numpy(rng.standard_normal((B, H, 1, 8))).to(dtype)   # (B, H, 1, hd): one new token
        k = torch.from_numpy(rng.standard_normal((B, Hkv, T, 8))).to(dtype)   # (B, H_kv, T, hd): the cache
        v = torch.from_numpy(rng.standard_normal((B, Hkv, T, 8))).to(dtype)
        flops, _ = counted(attention, q, k, v)
        expected = flops / (k.nbytes + v.nbytes)
        args = (H, Hkv, T, B, k.element_size())
        ask(learner, bugs, "attention_decode_intensity", args, expected,
            case=f"{B} sequences, {H} query heads, {Hkv} K/V heads, {T} cached tokens",
            how=f" = {flops:,} FLOPs (FlopCounterMode) / {k.nbytes + v.nbytes:,} bytes of K and V")
        step = (B, T, H, Hkv) if dtype == torch.bfloat16 else (B, T, H, Hkv, 2, k.element_size())
        got = learner.decode_intensity(*step)
        call = call_text("decode_intensity", step)
        expect.that(isinstance(got, (tuple, list)) and len(got) == 2, "decode_intensity returns a pair (weight matmuls, attention).",
                    call=call, got=describe_value(got), expected="(weights, attention)")
        check_number(got[1], expected, call=call, case="the attention part", wrong=WRONG["decode_intensity"],
                     diagnose=lambda: diagnosis(bugs, got[1], "decode_intensity", step, lambda s: s[1]))


def test_prefill_attention_intensity(learner, bugs, case_rng, rng):
    """the attention part of prefill_intensity equals FlopCounterMode's FLOPs over the bytes of Q, K, V and the output"""
    for H, Hkv, T, B, dtype in [(8, 2, 37, 3, torch.float32), (4, 4, 16, 2, torch.float64),
                                (4, 2, 13, 2, torch.bfloat16),   # the default bytes_per_element
                                (6, 3, int(case_rng.integers(2, 100)), int(case_rng.integers(2, 5)), torch.float32)]:
        q = torch.from_numpy(rng.standard_normal((B, H, T, 8))).to(dtype)   # (B, H, T, hd)
        k = torch.from_numpy(rng.standard_normal((B, Hkv, T, 8))).to(dtype)   # (B, H_kv, T, hd)
        v = torch.from_numpy(rng.standard_normal((B, Hkv, T, 8))).to(dtype)
        flops, out = counted(attention, q, k, v)
        moved = q.nbytes + k.nbytes + v.nbytes + out.nbytes
        args = (B, T, H, Hkv) if dtype == torch.bfloat16 else (B, T, H, Hkv, 2, q.element_size())
        call = call_text("prefill_intensity", args)
        got = learner.prefill_intensity(*args)
        expect.that(isinstance(got, (tuple, list)) and len(got) == 2, "prefill_intensity returns a pair (weight matmuls, attention).",
                    call=call, got=describe_value(got), expected="(weights, attention)")
        check_number(got[1], flops / moved, call=call, case=f"the attention part; {B} prompts of {T}, {H} heads, {Hkv} K/V heads",
                     wrong=WRONG["prefill_intensity"], how=f" = {flops:,} FLOPs / {moved:,} bytes of Q, K, V and the output",
                     diagnose=lambda: diagnosis(bugs, got[1], "prefill_intensity", args, lambda s: s[1]))


def test_crossover_batch(learner, bugs):
    """crossover_batch for several GPUs and weight dtypes"""
    for fps, hbm, bpp, what in [(H100_FLOPS, H100_BYTES, 2, "H100, bf16"), (A100_FLOPS, A100_BYTES, 2, "A100, bf16"),
                                (A100_FLOPS, A100_BYTES, 0.5, "A100, int4 weights dequantised to bf16"),
                                (H100_FLOPS, H100_BYTES, 1, "H100, int8 weights, bf16 peak")]:
        ask(learner, bugs, "crossover_batch", (fps, hbm, bpp), fps * bpp / (2 * hbm), case=what,
            how=" (where 2 * N * B / flops_per_s = N * bytes_per_param / hbm_bytes_per_s)")


def test_train_flops_per_token(learner, bugs, case_rng, rng):
    """train_flops_per_token equals FlopCounterMode on the forward and backward of a small decoder"""
    for L, T, d, H in [(3, 24, 32, 4), (2, 10, 48, 6), (int(case_rng.integers(2, 5)), int(case_rng.integers(5, 40)), 40, 5)]:
        per_token, N = training_flops(rng, L, T, d, H)
        ask(learner, bugs, "train_flops_per_token", (N, L, T, d), per_token,
            case=f"{L} blocks (attention and a 4x MLP, no biases), d = {d}, {H} heads, T = {T}",
            how=" (FlopCounterMode over a forward and backward, per token)")


def test_mfu(learner, bugs):
    """mfu of runs of several sizes"""
    for tps, N, L, T, d, peak in [(3000, 6_442_450_944, 32, 4096, 4096, 989e12),
                                  (238_300, 540_000_000_000, 118, 2048, 48 * 256, 6144 * 275e12),   # PaLM 540B: 46.2 %
                                  (1e6, 12 * 24 * 2048**2, 24, 2048, 2048, 64 * 312e12)]:
        expected = tps * (6 * N + 12 * L * T * d) / peak
        ask(learner, bugs, "mfu", (tps, N, L, T, d, peak), expected, case=f"{tps:,} tokens/s, N = {N:,}",
            how=f" = {tps:,} x {6 * N + 12 * L * T * d:,} FLOPs / {peak:g}")
