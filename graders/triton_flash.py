"""Grader of the triton-flash kata (katas/triton-flash/README.md)."""
import math

import pytest
import torch
import torch.nn.functional as F

from graders.engine import expect, kernels
from graders.engine.learner import describe_value
from graders.engine.weights import normal

# (B, H, T, D, BLOCK_M, BLOCK_N): T a multiple of neither block, so the last query block and the
# last key block are ragged; B * H <= 4 and at most three key blocks: the interpreter is slow.
SDPA_CASES = [(1, 2, 40, 16, 16, 16), (2, 2, 21, 32, 32, 16)]   # the first with the defaults
CAUSAL_CASES = [(1, 2, 40, 16, 16, 16), (2, 1, 37, 16, 32, 16)]
HALF_CASE = (1, 2, 40, 16, 16, 16)
# Flat scores and values near 2,000: the unnormalised accumulator of a row sums about 40 x 2,000 =
# 80,000, beyond float16's largest, 65,504, while every output (about 2,000) is a float16.
HALF_OFFSET, HALF_FLAT = 2000.0, 0.05
LSE_CASES = [((2, 2, 21, 32, 32, 16), False), ((1, 2, 40, 16, 16, 16), True)]
# Recorded launches: three query blocks against three key blocks, then BLOCK_M twice BLOCK_N.
VISIT_CASES = [(1, 2, 40, 16, 16, 16), (1, 2, 40, 16, 32, 16)]
BLOCK_CASE = (1, 2, 40, 16, 16, 16)
CASE = "q, k, v: {dtype} ({B}, {H}, {T}, {D}), standard normal"


def inputs(rng, B, H, T, D, dtype=torch.float32):
    """q, k, v (B, H, T, D), unit variance, so correctly scaled scores are too."""
    return tuple(normal(rng, B, H, T, D).to(dtype) for _ in range(3))


def case_text(B, H, T, D, dtype=torch.float32, about=""):
    text = CASE.format(dtype=str(dtype).removeprefix("torch."), B=B, H=H, T=T, D=D)
    return text + (f"; {about}" if about else "")


def call_text(causal, bm, bn):
    return f"flash_attention(q, k, v, causal={causal}, BLOCK_M={bm}, BLOCK_N={bn})"


def truth(q, k, v, causal):
    """F.scaled_dot_product_attention in float64 on the same (rounded) inputs: an oracle nobody here
    wrote, in q's dtype (T_q = T_k, so is_causal is the mask query i <= key i)."""
    out = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)   # (B, H, T, D)
    return out.to(q.dtype)


def logsumexp(q, k, causal):
    """torch.logsumexp of the scaled scores over each query's keys, in float64, as float32."""
    T = q.size(-2)
    scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.size(-1))   # (B, H, T, T)
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.logsumexp(scores, dim=-1).float()   # (B, H, T)


def pair(got, *, call, case):
    """flash_attention returned a pair (out, lse)."""
    expect.that(type(got) is tuple and len(got) == 2, "flash_attention must return a pair (out, lse).", call=call,
                case=case, got=describe_value(got), expected="tuple (out (B, H, T, D), lse (B, H, T) float32)")


def part(bugs, got, i, q, k, v, causal, bm, bn, tol):
    """The known bug whose out (i = 0) or lse (i = 1) on this call is the learner's."""
    def compute(impl):
        result = impl.flash_attention(q, k, v, causal=causal, BLOCK_M=bm, BLOCK_N=bn)
        return result[i] if type(result) is tuple and len(result) == 2 else None
    return lambda: bugs.match(got[i], compute, **tol)


def judge_out(got, bugs, kata, q, k, v, causal, bm, bn, *, call, case, device):
    """out equals F.scaled_dot_product_attention's in type, shape, dtype (q's) and values."""
    pair(got, call=call, case=case)
    tol = kata.tolerance(q.dtype, magnitude=float(v.abs().max()))
    expect.array(got[0], truth(q, k, v, causal), call=call, case=case, what="the output", device=device, **tol,
                 against="F.scaled_dot_product_attention in float64" + (", is_causal=True" if causal else ""),
                 diagnose=part(bugs, got, 0, q, k, v, causal, bm, bn, tol))


def judge_lse(got, bugs, kata, q, k, v, causal, bm, bn, *, call, case, device):
    """lse equals torch.logsumexp of the scaled scores over each query's keys, float32."""
    pair(got, call=call, case=case)
    tol = kata.tolerance("float32")
    expect.array(got[1], logsumexp(q, k, causal), call=call, case=case, what="lse", device=device, **tol,
                 against="torch.logsumexp(q @ k.transpose(-2, -1) / sqrt(D), -1) in float64"
                 + (" over the keys <= each query" if causal else ""),
                 diagnose=part(bugs, got, 1, q, k, v, causal, bm, bn, tol))


def attend(learner, bugs, kata, q, k, v, causal, bm, bn, case, device):
    """One call, its output judged."""
    got = learner.flash_attention(q, k, v, causal=causal, BLOCK_M=bm, BLOCK_N=bn)
    judge_out(got, bugs, kata, q, k, v, causal, bm, bn, call=call_text(causal, bm, bn), case=case, device=device)
    return got


def recorded_call(learner, q, k, v, causal, bm, bn):
    """The learner's result and what its call ran: its torch functions and its kernel launches."""
    with learner.recording() as ops:
        result = learner.flash_attention(q, k, v, causal=causal, BLOCK_M=bm, BLOCK_N=bn)
    return result, ops


def attention_launch(ops, *, call, case):
    """The launch with the most programs: the attention kernel (a launcher may also fill a buffer)."""
    launches = kernels.launches(ops)
    expect.that(bool(launches), "Your function launched no Triton kernel.", call=call, case=case,
                got="no launch", expected="a kernel launched with kernel[grid](...)")
    return max(launches, key=lambda op: len(op.get("programs", [])))


def visits(launch, program, size) -> int:
    """Key blocks a program visited: its most loads of one argument of q's size (K and V are loaded
    once per key block, Q once; a scratch buffer or lse is another size)."""
    sized = {name for name, arg in launch.get("args", {}).items()
             if type(arg) is dict and math.prod(arg.get("shape", [0])) == size}
    return max((n for name, n in program.get("loads", {}).items() if name in sized), default=0)


# --- checks --------------------------------------------------------------------------------------

def test_matches_sdpa(learner, bugs, kata, rng, device):
    """out equals F.scaled_dot_product_attention (float64) for T a multiple of neither block, float32; the defaults are causal=False, BLOCK_M = BLOCK_N = 16"""
    (B, H, T, D, bm, bn), *others = SDPA_CASES
    q, k, v = inputs(rng, B, H, T, D)
    got = learner.flash_attention(q, k, v)   # the first case is the defaults': causal=False, blocks of 16
    judge_out(got, bugs, kata, q, k, v, False, bm, bn, call="flash_attention(q, k, v)", case=case_text(B, H, T, D),
              device=device)
    for B, H, T, D, bm, bn in others:
        q, k, v = inputs(rng, B, H, T, D)
        attend(learner, bugs, kata, q, k, v, False, bm, bn, case_text(B, H, T, D), device)


def test_causal_matches_sdpa(learner, bugs, kata, rng, device):
    """causal=True: out equals F.scaled_dot_product_attention with is_causal=True (float64), float32"""
    for B, H, T, D, bm, bn in CAUSAL_CASES:
        q, k, v = inputs(rng, B, H, T, D)
        attend(learner, bugs, kata, q, k, v, True, bm, bn, case_text(B, H, T, D), device)


def test_float16_accumulates_in_float32(learner, bugs, kata, rng, device):
    """float16 q, k, v: out is float16, within float16's rounding of the float64 truth, even where a row's weighted sum of values passes 65,504"""
    B, H, T, D, bm, bn = HALF_CASE
    q, k, v = inputs(rng, B, H, T, D, torch.float16)
    attend(learner, bugs, kata, q, k, v, False, bm, bn, case_text(B, H, T, D, torch.float16), device)
    q, k, v = inputs(rng, B, H, T, D)
    q, k, v = (q * HALF_FLAT).half(), (k * HALF_FLAT).half(), (v + HALF_OFFSET).half()
    about = (f"q and k times {HALF_FLAT} (nearly flat scores), v plus {HALF_OFFSET:,.0f}: each output is about "
             f"{HALF_OFFSET:,.0f}, and the sum of exp(score - max) v over {T} keys about {T * HALF_OFFSET:,.0f}")
    case = case_text(B, H, T, D, torch.float16, about)
    attend(learner, bugs, kata, q, k, v, True, bm, bn, case, device)


def test_lse_matches_logsumexp(learner, bugs, kata, rng, device):
    """lse (B, H, T) float32 equals torch.logsumexp of the scaled scores over each query's keys, causal and not"""
    for (B, H, T, D, bm, bn), causal in LSE_CASES:
        q, k, v = inputs(rng, B, H, T, D)
        got = learner.flash_attention(q, k, v, causal=causal, BLOCK_M=bm, BLOCK_N=bn)
        judge_lse(got, bugs, kata, q, k, v, causal, bm, bn, call=call_text(causal, bm, bn),
                  case=case_text(B, H, T, D), device=device)


def test_causal_skips_blocks_above_the_diagonal(learner, bugs, kata, rng, device):
    """causal=True: grid (cdiv(T, BLOCK_M), B * H), and query block m loads only the key blocks up to its diagonal, ceil(min((m + 1) * BLOCK_M, T) / BLOCK_N)"""
    for B, H, T, D, bm, bn in VISIT_CASES:
        q, k, v = inputs(rng, B, H, T, D)
        call, case = call_text(True, bm, bn), case_text(B, H, T, D)
        got, ops = recorded_call(learner, q, k, v, True, bm, bn)
        judge_out(got, bugs, kata, q, k, v, True, bm, bn, call=call, case=case, device=device)
        launch = attention_launch(ops, call=call, case=case)
        grid = bugs.expected.grid(B, H, T, bm)
        expect.that(list(launch.get("grid", [])) == grid, "The grid must be one program per (query block, "
                    "batch·head): (triton.cdiv(T, BLOCK_M), B * H).", call=call, case=case,
                    got=f"grid {launch.get('grid')}", expected=f"grid {grid}")
        programs = launch.get("programs", [])
        got_visits = [visits(launch, programs[m * B * H], q.numel()) for m in range(grid[0])]   # x-major: program (m, 0)
        needed = bugs.expected.key_blocks(T, bm, bn, True)
        every = [-(-T // bn)] * grid[0]
        expect.that(got_visits == needed, "Query block m must load the key blocks up to the one holding its last "
                    "query, ceil(min((m + 1) * BLOCK_M, T) / BLOCK_N) of them: those after it are all masked.",
                    call=call, case=case, got=f"key blocks loaded by query blocks 0, 1, ...: {got_visits}",
                    expected=f"{needed}", diagnose=lambda: "causal-blocks-not-skipped" if got_visits == every else None)


def test_holds_one_block_of_scores(learner, bugs, kata, rng, device):
    """no load or tl.dot of a program holds more than BLOCK_M x max(BLOCK_N, D) elements: never a row of scores, nor all of K"""
    B, H, T, D, bm, bn = BLOCK_CASE
    q, k, v = inputs(rng, B, H, T, D)
    call, case = call_text(False, bm, bn), case_text(B, H, T, D)
    got, ops = recorded_call(learner, q, k, v, False, bm, bn)
    judge_out(got, bugs, kata, q, k, v, False, bm, bn, call=call, case=case, device=device)
    largest = max(program.get("largest", 0) for program in attention_launch(ops, call=call, case=case)["programs"])
    limit = bm * max(bn, D)
    expect.that(largest <= limit, "A program must hold one block of scores at a time: (BLOCK_M, BLOCK_N) scores, "
                "(BLOCK_M, D) queries and accumulator, (BLOCK_N, D) keys and values.", call=call, case=case,
                got=f"a block of {largest} elements", expected=f"at most {bm} x {max(bn, D)} = {limit} elements")


def test_kernels_compute(learner, bugs, kata, rng, device):
    """the kernel computes everything: the launcher allocates, reads shapes and strides, and launches"""
    B, H, T, D, bm, bn = BLOCK_CASE
    q, k, v = inputs(rng, B, H, T, D)
    call, case = call_text(True, bm, bn), case_text(B, H, T, D)
    got, ops = recorded_call(learner, q, k, v, True, bm, bn)
    kernels.check_kernels_compute(learner, ops, call=call, case=case, code="launcher-computes")
    judge_out(got, bugs, kata, q, k, v, True, bm, bn, call=call, case=case, device=device)


@pytest.mark.cuda
def test_compiled_on_cuda(learner, bugs, kata, rng):
    """CUDA only: the kernel Triton compiles, causal, float16, gives SDPA's output within float16's rounding"""
    # float16, the GPU's path: compiled, tl.dot on float32 blocks would round its inputs to tf32.
    B, H, T, D = 2, 4, 200, 64   # 13 query blocks of 16, the last ragged
    q, k, v = inputs(rng, B, H, T, D, torch.float16)
    with learner.compiled() as gpu:
        got = gpu.flash_attention(q, k, v, causal=True)
    call = call_text(True, 16, 16) + ", compiled"
    expect.type_of(got, tuple, call=call)
    expect.that(len(got) == 2, "flash_attention returns the pair (out, lse).", call=call, got=f"{len(got)} items",
                expected="2")
    tol = kata.tolerance(torch.float16, expect.magnitude(v))
    expect.array(got[0], truth(q, k, v, True).cuda(), call=call, device="cuda",
                 case=case_text(B, H, T, D, torch.float16) + ", on cuda", **tol, against="SDPA in float64")
