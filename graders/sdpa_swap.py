"""Grader of the sdpa-swap kata (katas/sdpa-swap/README.md).

The CPU checks compare both paths with the reference in float64 (and with each other in float32)
and read the recorded F.scaled_dot_product_attention call. The @cuda checks run the flash path in
bfloat16: flash eligibility is judged in this trusted process, by replaying the learner's recorded
SDPA call (same shapes, dtype and arguments, fresh tensors) under
sdpa_kernel(SDPBackend.FLASH_ATTENTION), which raises if PyTorch would not pick FlashAttention;
strides are not recorded, so they are not judged.
"""
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from graders.engine import expect
from graders.engine.failures import LearnerRaised
from graders.engine.products import float_shapes
from graders.engine.recording import recorded
from graders.engine.structure import banned_in_ops, check_untampered
from graders.engine.weights import inject, normal

# n_embd, n_head, block_size: head_dim 12, so H != head_dim; T = 7 and 16 (< and = block_size).
C, H, BS = 48, 4, 16
B, T_SHORT = 2, 7
P = 0.2   # dropout probability of the dropout checks
CASE = "x: {dtype} ({B}, {T}, {C}), standard normal; n_head={H}, block_size={bs}; weights injected (W ~ N(0, 1/{C}))"

SDPA = "scaled_dot_product_attention"
SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
SDPA_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None}
# The manual path is what SDPA is checked against: no fused attention of any kind there.
FUSED = ["torch.nn.functional.scaled_dot_product_attention", "torch.nn.MultiheadAttention",
         "torch.nn.functional.multi_head_attention_forward"]

# The @cuda checks: head_dim 64, which FlashAttention takes (at most 256, no padding needed).
CUDA_C, CUDA_H, CUDA_T = 256, 4, 128
# The benchmark size of the kata's README: B=4, H=16, head_dim=64, T=4096; the first PREFIX positions of
# sequence 0 are checked against the float64 reference (causal: they see only the first PREFIX tokens).
BENCH_B, BENCH_H, BENCH_T, PREFIX = 4, 16, 4096, 64
MEMORY_RATIO, SPEEDUP = 20, 3
# The calls learner.measure times: more where 50 take under its MEASURE_MIN_S (the flash path's
# 50 take about 28 ms on an H100), so that a request's own jitter, a few ms, stays small beside them.
REPEATS = 50
REPLAY_DTYPES = {f"torch.{name}": getattr(torch, name) for name in ("bfloat16", "float16", "float32", "float64")}
REPLAY_NUMEL = 1 << 22


def weights(rng, n_embd, dtype=torch.float64):
    """A state_dict to inject. W ~ N(0, 1/n_embd) keeps q, k, v at unit variance, so correctly scaled
    scores stay near unit variance and a second scaling moves the softmax visibly."""
    std = n_embd ** -0.5
    return {"qkv.weight": normal(rng, 3 * n_embd, n_embd, std=std).to(dtype),
            "proj.weight": normal(rng, n_embd, n_embd, std=std).to(dtype)}


def ctor(n_embd, n_head, block_size, dropout, flash):
    return f"CausalSelfAttention({n_embd}, {n_head}, {block_size}, dropout={dropout}, flash={flash})"


def case_text(x, n_head=H, block_size=BS, extra=""):
    Bx, Tx, Cx = x.shape
    text = CASE.format(dtype=str(x.dtype).removeprefix("torch."), B=Bx, T=Tx, C=Cx, H=n_head, bs=block_size)
    return text + (f"; {extra}" if extra else "")


def build(learner, device, sd, *, flash, dropout=0.0, n_head=H, block_size=BS):
    """The learner's module: constructed, moved and cast with .to(), weights injected, eval mode.
    ``flash=None`` leaves flash and dropout out: the constructor's defaults."""
    n_embd = sd["proj.weight"].shape[0]
    if flash is None:
        call = f"CausalSelfAttention({n_embd}, {n_head}, {block_size})"
        m = learner.CausalSelfAttention(n_embd, n_head, block_size)
    else:
        call = ctor(n_embd, n_head, block_size, dropout, flash)
        m = learner.CausalSelfAttention(n_embd, n_head, block_size, dropout=dropout, flash=flash)
    return inject(learner, m, sd, device=device, exact=True, call=call,
                  problem="The module's parameters are not the ones the grader injects weights into.",
                  hint=" (self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False); "
                  "self.proj = nn.Linear(n_embd, n_embd, bias=False))")


def forward(learner, m, x):
    """m(x); a device error from a mask that .to() left on the CPU is named."""
    try:
        return m(x)
    except LearnerRaised as exc:
        if exc.type_name and "device" in exc.message and "mask" not in learner.module_info(m)["buffers"]:
            exc.diagnosis = "mask-not-buffer"
        raise


@recorded
def trusted(cls, sd, x, *, flash, dropout=0.0, training=False, seed=0, n_head=H, block_size=BS):
    """The output of a trusted module (the reference or a bug oracle), in float64 on the CPU, with
    the torch seed the sandbox sets before each call, so dropout draws the same mask."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        m = cls(x.shape[-1], n_head, block_size, dropout=dropout, flash=flash).double()
        m.load_state_dict({k: v.double() for k, v in sd.items()}, strict=False)
        m.train(training)
        torch.manual_seed(seed)
        out = m(x.detach().cpu().double())
    return out.to(x.dtype)


def sdpa_calls(ops):
    """Each recorded SDPA call as {parameter: value or tensor summary}: positional arguments named,
    defaults filled in, so `F.scaled_dot_product_attention(q, k, v, None, 0.0, True)` reads like
    `(q, k, v, is_causal=True)`."""
    calls = []
    for op in ops:
        if op.get("kind") == "function" and op.get("name") == SDPA:
            args = op.get("args") if isinstance(op.get("args"), list) else []
            kwargs = op.get("kwargs") if isinstance(op.get("kwargs"), dict) else {}
            calls.append({**SDPA_DEFAULTS, **dict(zip(SDPA_PARAMS, args)), **kwargs})
    return calls


def tensor_text(summary):
    """A recorded tensor summary as ``tensor bfloat16[2, 4, 128, 64] on cuda:0``; other values as repr."""
    if not isinstance(summary, dict):
        return repr(summary)
    return f"tensor {str(summary.get('dtype')).removeprefix('torch.')}{summary.get('shape')} on {summary.get('device')}"


def sdpa_text(call):
    return "F.scaled_dot_product_attention(q, k, v, " + ", ".join(
        f"{k}={tensor_text(call.get(k))}" for k in ("attn_mask", "dropout_p", "is_causal", "scale")) + ")"


def flash_refusal(sdpa, device):
    """None when PyTorch's FlashAttention kernel takes a recorded SDPA call, replayed here with
    fresh tensors of its shapes and dtypes on ``device`` under sdpa_kernel(FLASH_ATTENTION);
    else why not, in PyTorch's words (it explains a refusal in warnings)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    tensors = []
    for name in ("query", "key", "value"):
        summary = sdpa.get(name)
        shape = summary.get("shape") if isinstance(summary, dict) else None
        dtype = REPLAY_DTYPES.get(str(summary.get("dtype"))) if isinstance(summary, dict) else None
        if not (isinstance(shape, list) and all(type(n) is int and n > 0 for n in shape) and dtype):
            return f"{name} is {tensor_text(summary)}, not a floating-point tensor"
        if np.prod(shape) > REPLAY_NUMEL:   # the sandbox reports the shapes: never trust them with memory
            return f"{name} has {np.prod(shape):,} elements, more than this check uses"
        tensors.append(torch.zeros(shape, dtype=dtype, device=device))
    with warnings.catch_warnings(record=True) as caught, sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.no_grad():
        warnings.simplefilter("always")
        try:
            F.scaled_dot_product_attention(*tensors, dropout_p=sdpa.get("dropout_p"), is_causal=sdpa.get("is_causal"),
                                           scale=sdpa.get("scale"))
        except (RuntimeError, TypeError, ValueError) as exc:
            reasons = [str(w.message).split(" (Triggered internally")[0] for w in caught]
            return "; ".join(reasons) or str(exc).splitlines()[0]
    return None


def dropping_in_eval(ops):
    """Recorded calls that drop although the module is in eval mode: SDPA with dropout_p > 0, or
    dropout with training on (F.dropout's default)."""
    found = [call for call in sdpa_calls(ops) if _positive(call.get("dropout_p"))]
    for op in ops:
        if op.get("kind") == "function" and op.get("name") in ("dropout", "dropout_"):
            args = op.get("args") if isinstance(op.get("args"), list) else []
            kwargs = op.get("kwargs") if isinstance(op.get("kwargs"), dict) else {}
            named = {**dict(zip(("input", "p", "training"), args)), **kwargs}
            if _positive(named.get("p")) and named.get("training", named.get("train", True)) is True:
                found.append(op)
    return found


def _positive(value):
    return type(value) in (int, float) and value > 0


def check_output(got, bugs, kata, sd, x, *, flash, device, call, case):
    """got equals the reference's output (float64, eval mode); if not, the bug oracle it matches is named."""
    tol, inside = kata.tolerance("float64"), kata.tolerance("float32")
    # A bug is matched within float32's tolerance: code whose softmax runs in float32 inside makes
    # its mistake as surely, and every oracle differs from the reference by far more.
    expect.array(got, trusted(bugs.reference.CausalSelfAttention, sd, x, flash=flash), call=call, case=case,
                 device=device, what="the output", **tol, float32_inside=inside,
                 diagnose=lambda: bugs.match(got, lambda impl: trusted(impl.CausalSelfAttention, sd, x, flash=flash),
                                             **inside))


def check_reference(learner, bugs, kata, rng, device, *, T):
    """Each path, float64, equals the reference with the same injected weights."""
    sd, x = weights(rng, C), normal(rng, B, T, C)
    for flash in (True, False):
        got = forward(learner, build(learner, device, sd, flash=flash), x)
        check_output(got, bugs, kata, sd, x, flash=flash, device=device, call=ctor(C, H, BS, 0.0, flash) + "(x)",
                     case=case_text(x, extra="eval mode"))


def test_matches_reference(learner, bugs, kata, rng, device):
    """with injected weights, both paths equal the reference (T = block_size, float64)"""
    check_reference(learner, bugs, kata, rng, device, T=BS)


def test_paths_agree(learner, bugs, kata, rng, device):
    """flash=True and flash=False give the same output in float32 (atol 1e-5)"""
    tol = kata.tolerance("float32")
    for T in (T_SHORT, BS):
        sd = weights(rng, C, torch.float32)
        x = normal(rng, B, T, C).float()
        case = case_text(x, extra="eval mode; the same weights in both modules")
        got = {}
        for flash in (True, False):
            call = ctor(C, H, BS, 0.0, flash) + "(x)"
            got[flash] = forward(learner, build(learner, device, sd, flash=flash), x)
            expect.form(got[flash], torch.Tensor, x.shape, dtype=x.dtype, what="the output", device=device,
                        call=call, case=case)

        def diagnose():
            code = bugs.match((got[True], got[False]), lambda impl: tuple(
                trusted(impl.CausalSelfAttention, sd, x, flash=flash) for flash in (True, False)), **tol)
            right = [expect.mismatch(got[flash], trusted(bugs.reference.CausalSelfAttention, sd, x, flash=flash), **tol)
                     is None for flash in (True, False)]
            return code or ("paths-disagree" if right == [True, False] else None)

        problem = expect.mismatch(got[False], got[True], **tol)
        expect.that(problem is None, "The two paths compute different functions: flash=False must give what "
                    "flash=True gives.", call=f"{ctor(C, H, BS, 0.0, False)}(x) vs {ctor(C, H, BS, 0.0, True)}(x)",
                    case=case, got=f"the manual path's output vs the flash path's: {problem}",
                    expected=f"the same output (atol {tol['atol']:g})", diagnose=diagnose)


def test_flash_calls_sdpa(learner, bugs, kata, rng, device):
    """flash=True calls F.scaled_dot_product_attention once, with is_causal=True, no attn_mask, the default scale, and builds no (T, T) scores of its own"""
    tol = kata.tolerance("float64")
    sd = weights(rng, C)
    call = f"CausalSelfAttention({C}, {H}, {BS})(x)"   # the defaults: flash=True, dropout=0.0
    m = build(learner, device, sd, flash=None)
    forward(learner, m, normal(rng, B, BS, C))   # first call: lets lazy imports happen before recording
    x = normal(rng, B, BS, C)   # fresh: no earlier call saw it, so memoised outputs cannot skip the ops
    case = case_text(x, extra="eval mode")
    with learner.recording() as ops:
        got = forward(learner, m, x)
    calls = sdpa_calls(ops)
    expect.that(bool(calls), "With flash=True the module never calls F.scaled_dot_product_attention: the fused "
                "kernel is the point of the flash path.", call=call, case=case, got="no SDPA call recorded",
                expected="F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=...)",
                diagnose=lambda: "sdpa-not-used")
    # Called is not used: what defines SDPA doing the attention is that nothing else builds the (T, T)
    # scores or weights of every head (the mask buffer, one (T, T) for all of them, is smaller).
    scores = [shape for shape in float_shapes(ops) if shape.count(BS) >= 2 and math.prod(shape) >= B * H * BS * BS]
    expect.that(not scores, "With flash=True the module still builds the (T, T) attention scores by hand: SDPA is "
                "called, but the attention is not left to it.", call=call, case=case,
                got=f"a tensor of shape {scores[0]}" if scores else None,
                expected=f"no tensor of (T, T) = ({BS}, {BS}) scores for every head: SDPA's output as the attention",
                diagnose=lambda: "sdpa-not-used")
    expect.that(len(calls) == 1, "The flash path calls F.scaled_dot_product_attention more than once: one call "
                "takes every batch element and head at once.", call=call, case=case,
                got=f"{len(calls)} SDPA calls", expected="1 call with q, k, v shaped (B, n_head, T, head_dim)")
    sdpa = calls[0]
    expect.that(sdpa["attn_mask"] is None, "The flash path passes a mask tensor to SDPA. The values are right, "
                "but on a GPU an explicit mask rules out the FlashAttention kernel: say is_causal=True instead.",
                call=call, case=case, got=sdpa_text(sdpa), expected="attn_mask=None, is_causal=True",
                diagnose=lambda: "sdpa-with-explicit-mask")
    expect.that(sdpa["is_causal"] is True, "The flash path calls SDPA without is_causal=True, so it is not causal.",
                call=call, case=case, got=sdpa_text(sdpa), expected="attn_mask=None, is_causal=True")
    scale = sdpa["scale"]
    expect.that(scale is None or (type(scale) in (int, float) and abs(scale * math.sqrt(C // H) - 1) < 1e-12),
                "The flash path passes SDPA a scale other than 1/sqrt(head_dim). SDPA's default (scale=None) is "
                "1/sqrt(head_dim) already: leave it, or pass exactly head_dim ** -0.5.", call=call, case=case,
                got=sdpa_text(sdpa), expected=f"scale=None or {(C // H) ** -0.5:.6g} (1/sqrt({C // H}))",
                diagnose=lambda: bugs.match(got, lambda impl: trusted(impl.CausalSelfAttention, sd, x, flash=True), **tol)
                or "double-scale")
    # q or k scaled before the call is a value the value checks see: this check reads the call only.
    check_untampered(learner, call=call, case=case)


def test_sdpa_dropout_follows_mode(learner, rng, device):
    """the flash path passes dropout_p=0 to SDPA in eval mode and dropout_p=dropout in train mode (then drops the output too)"""
    sd = weights(rng, C)
    m = build(learner, device, sd, flash=True, dropout=P)
    forward(learner, m, normal(rng, B, BS, C))   # first call: lets lazy imports happen before recording
    for mode, want in (("eval", 0.0), ("train", P)):
        x = normal(rng, B, BS, C)   # fresh: no earlier call saw it, so memoised outputs cannot skip the ops
        call = f"{ctor(C, H, BS, P, True)}.{mode}()(x)"
        case = case_text(x, extra=f"{mode} mode")
        getattr(m, mode)()
        with learner.recording() as ops:
            forward(learner, m, x)
        calls = sdpa_calls(ops)
        expect.that(len(calls) == 1, "The flash path must call F.scaled_dot_product_attention once per forward.",
                    call=call, case=case, got=f"{len(calls)} SDPA calls", expected="1",
                    diagnose=lambda: "sdpa-not-used" if not calls else None)
        p = calls[0]["dropout_p"]
        expect.that(type(p) in (int, float) and abs(p - want) < 1e-12,
                    f"In {mode} mode SDPA must get dropout_p={want:g}. SDPA is a function, not a module: "
                    "it does not know the mode, so pass `self.dropout if self.training else 0.0`.",
                    call=call, case=case, got=sdpa_text(calls[0]), expected=f"dropout_p={want:g}",
                    diagnose=lambda: "dropout-in-eval" if mode == "eval" else None)
        if mode == "train":
            check_output_dropout(ops, call=call, case=case)
    x = normal(rng, B, BS, C)
    call = f"CausalSelfAttention({C}, {H}, {BS}).train()(x)"   # dropout's default is 0.0
    case = case_text(x, extra="train mode")
    m = build(learner, device, sd, flash=None)
    m.train()
    with learner.recording() as ops:
        forward(learner, m, x)
    calls = sdpa_calls(ops)
    expect.that([c["dropout_p"] for c in calls] == [0],
                "Built with the default dropout, the flash path must pass dropout_p=0 to SDPA in train mode too: "
                "dropout defaults to 0.0.", call=call, case=case,
                got=", ".join(map(sdpa_text, calls)) or "no SDPA call", expected="dropout_p=0.0")
    check_untampered(learner, call=call, case=case)


def test_manual_path_avoids_sdpa(learner, rng, device):
    """flash=False writes the attention out by hand: no SDPA call, nor any fused attention"""
    sd = weights(rng, C)
    call = ctor(C, H, BS, 0.0, False) + "(x)"
    m = build(learner, device, sd, flash=False)
    forward(learner, m, normal(rng, B, BS, C))   # first call: lets lazy imports happen before recording
    x = normal(rng, B, BS, C)   # fresh: no earlier call saw it, so memoised outputs cannot skip the ops
    case = case_text(x, extra="eval mode")
    with learner.recording() as ops:
        forward(learner, m, x)
    # The file's flash path names SDPA legitimately: only the recorded calls count here (and, last,
    # the source's tampering, which could hide them).
    used = banned_in_ops(ops, FUSED)
    expect.that(not used, "The manual path (flash=False) calls a fused attention: it is the reference the "
                "flash path is checked against, so write it out.", call=call, case=case,
                got=", ".join(used), expected="q @ k.transpose(-2, -1), scaling, masked_fill, softmax, @ v")
    check_untampered(learner, call=call, case=case)


def test_eval_deterministic(learner, bugs, kata, rng, device):
    """eval mode with dropout=0.2 drops nothing, on both paths"""
    tol = kata.tolerance("float64")
    sd, x = weights(rng, C), normal(rng, B, BS, C)
    for flash in (True, False):
        call = f"{ctor(C, H, BS, P, flash)}.eval()(x)"
        case = case_text(x, extra="compared with the reference built with dropout=0.0")
        m = build(learner, device, sd, flash=flash, dropout=P)
        with learner.recording() as ops:
            got = forward(learner, m, x)
        expect.form(got, torch.Tensor, x.shape, dtype=x.dtype, what="the output", device=device, call=call, case=case)

        def diagnose():
            if dropping_in_eval(ops):
                return "dropout-in-eval"
            return bugs.match(got, lambda impl: trusted(impl.CausalSelfAttention, sd, x, flash=flash, dropout=P,
                                                        seed=learner.seed), **kata.tolerance("float32"))

        expect.values(got, trusted(bugs.reference.CausalSelfAttention, sd, x, flash=flash), call=call, case=case,
                      what=f"the output in eval mode with dropout={P} (after .eval() nothing may be dropped)",
                      against="the reference's output, as with dropout=0.0", **tol,
                      float32_inside=kata.tolerance("float32"), diagnose=diagnose)


def dropouts(ops, p, shape):
    """Recorded dropout calls, on in train mode with probability ``p``, on a tensor whose last dims
    are ``shape``: (T, T) for attention weights, whether all heads at once or one head at a time;
    (T, C) for the output."""
    found = []
    for op in ops:
        if op.get("kind") == "function" and op.get("name") in ("dropout", "dropout_"):
            args = op.get("args") if isinstance(op.get("args"), list) else []
            kwargs = op.get("kwargs") if isinstance(op.get("kwargs"), dict) else {}
            named = {**dict(zip(("input", "p", "training"), args)), **kwargs}
            dims = named["input"].get("shape") if isinstance(named.get("input"), dict) else None
            if (named.get("training", True) is True and _positive(named.get("p")) and abs(named["p"] - p) < 1e-12
                    and isinstance(dims, list) and dims[-len(shape):] == list(shape)):
                found.append(op)
    return found


def check_output_dropout(ops, *, call, case):
    """resid_dropout ran on the (B, T, C) output, in train mode with p=P."""
    expect.that(bool(dropouts(ops, P, (BS, C))), "In train mode the module does not drop out its output: "
                "resid_dropout belongs after the output projection, on both paths.", call=call, case=case,
                got="no dropout call on a (B, T, C) output recorded",
                expected=f"self.resid_dropout(self.proj(y)), p={P}")


def test_manual_path_dropout(learner, rng, device):
    """flash=False in train mode applies dropout to the attention weights, as SDPA's dropout_p does, and to the output"""
    sd, x = weights(rng, C), normal(rng, B, BS, C)
    call = f"{ctor(C, H, BS, P, False)}.train()(x)"
    case = case_text(x, extra="train mode; every torch call recorded")
    m = build(learner, device, sd, flash=False, dropout=P)
    m.train()
    forward(learner, m, normal(rng, B, BS, C))   # first call: lets lazy imports happen before recording
    with learner.recording() as ops:
        forward(learner, m, x)
    expect.that(bool(dropouts(ops, P, (BS, BS))), "In train mode the manual path drops no attention weights: "
                f"the flash path's SDPA drops them with dropout_p={P}, so the two paths train different models.",
                call=call, case=case, got="no dropout call on a (..., T, T) tensor of weights recorded",
                expected=f"self.attn_dropout(att) on the softmaxed (B, n_head, {BS}, {BS}) weights, p={P}",
                diagnose=lambda: "manual-path-no-dropout")
    check_output_dropout(ops, call=call, case=case)
    check_untampered(learner, call=call, case=case)


def test_mask_is_buffer(learner, rng, device):
    """the causal mask is a buffer named "mask" (persistent or not): it moves with .to()"""
    sd = weights(rng, C)
    call = ctor(C, H, BS, 0.0, False)
    m = build(learner, device, sd, flash=False)   # .to(device=..., dtype=float64) happened here
    buffers = learner.module_info(m)["buffers"]
    register = 'self.register_buffer("mask", torch.ones(block_size, block_size, dtype=torch.bool).tril())'
    expect.that("mask" in buffers, "The module has no buffer named \"mask\". A plain tensor attribute is "
                "invisible to .to(): the mask stays on the CPU when the module moves to a GPU.",
                call=f"{call}: named_buffers()", got=", ".join(buffers) or "no buffers", expected=register,
                diagnose=lambda: "mask-not-buffer")
    shape, _, where = buffers["mask"]
    expect.that(list(shape[-2:]) == [BS, BS], "The mask buffer should cover block_size x block_size positions: "
                "forward slices it to T.", call=f"{call}: mask", got=f"shape {tuple(shape)}",
                expected=f"shape ({BS}, {BS}), or (1, 1, {BS}, {BS})")
    expect.that(where.split(":")[0] == device, "After .to(), the mask buffer is not on the module's device.",
                call=f"{call}.to({device!r}): mask", got=where, expected=device)
    check_untampered(learner, call=call)


# --- @cuda checks --------------------------------------------------------------------------------

def cuda_module(learner, rng, *, flash, n_embd=CUDA_C, n_head=CUDA_H, block_size=CUDA_T):
    """A learner module in bfloat16 on the GPU with injected weights, and those weights."""
    sd = weights(rng, n_embd, torch.bfloat16)
    return build(learner, "cuda", sd, flash=flash, n_head=n_head, block_size=block_size), sd


def check_bf16(got, sd, x, *, flash, bugs, kata, call, case, n_head=CUDA_H, block_size=CUDA_T):
    """got (bfloat16, on the GPU) is within bfloat16 rounding of the float64 reference computed from
    the same bfloat16-rounded weights and input."""
    tol = kata.tolerance("bfloat16")

    def compute(impl):
        return trusted(impl.CausalSelfAttention, sd, x.cpu(), flash=flash, n_head=n_head, block_size=block_size)

    expect.array(got, compute(bugs.reference), call=call, case=case, device="cuda", what="the output",
                 against="the float64 reference", diagnose=lambda: bugs.match(got, compute, **tol), **tol)


@pytest.mark.cuda
def test_flash_eligible_bf16(learner, bugs, kata, rng):
    """bfloat16 on CUDA: the flash path's SDPA call runs under sdpa_kernel(SDPBackend.FLASH_ATTENTION)"""
    m, sd = cuda_module(learner, rng, flash=True)
    # A first call lets lazy imports happen before recording.
    forward(learner, m, normal(rng, B, CUDA_T, CUDA_C).to(torch.bfloat16))
    x = normal(rng, B, CUDA_T, CUDA_C).to(torch.bfloat16)   # fresh: no earlier call saw it, so memoised outputs cannot skip the ops
    call = ctor(CUDA_C, CUDA_H, CUDA_T, 0.0, True) + ".to('cuda', torch.bfloat16)(x)"
    case = case_text(x, CUDA_H, CUDA_T, "eval mode; head_dim 64")
    with learner.recording() as ops:
        got = forward(learner, m, x)
    calls = sdpa_calls(ops)
    expect.that(len(calls) == 1, "The flash path must call F.scaled_dot_product_attention once per forward.",
                call=call, case=case, got=f"{len(calls)} SDPA calls", expected="1",
                diagnose=lambda: "sdpa-not-used" if not calls else None)
    sdpa = calls[0]
    tensors = [sdpa.get(name) for name in ("query", "key", "value")]
    expect.that(all(isinstance(t, dict) and t.get("dtype") == "torch.bfloat16" and str(t.get("device")).startswith("cuda")
                    for t in tensors), "SDPA must get q, k and v in bfloat16 on the GPU: FlashAttention takes "
                "half precision only.", call=call, case=case,
                got=", ".join(f"{n} {tensor_text(t)}" for n, t in zip("qkv", tensors)),
                expected="q, k, v: torch.bfloat16 on cuda")
    expect.that(sdpa["attn_mask"] is None, "The flash path passes a mask tensor to SDPA: FlashAttention on CUDA takes "
                "no mask tensor, so PyTorch falls back to a slower kernel that cannot skip the masked blocks.",
                call=call, case=case, got=sdpa_text(sdpa),
                expected="attn_mask=None, is_causal=True", diagnose=lambda: "sdpa-with-explicit-mask")
    refusal = flash_refusal(sdpa, "cuda")
    expect.that(refusal is None, "Under sdpa_kernel(SDPBackend.FLASH_ATTENTION), PyTorch refuses the flash path's "
                "SDPA call: it would run a slower kernel.", call=call, case=case,
                got=f"{sdpa_text(sdpa)} with q {tensor_text(tensors[0])}: {refusal}",
                expected="a call FlashAttention takes: 4-D q, k, v in bfloat16 with the same head_dim (at most 256), "
                "is_causal=True, no mask")
    check_bf16(got, sd, x, flash=True, bugs=bugs, kata=kata, call=call, case=case)
    check_untampered(learner, call=call, case=case)


@pytest.mark.cuda
def test_bf16_close_to_float64(learner, bugs, kata, rng):
    """bfloat16 on CUDA: both paths are within bfloat16 rounding of a float64 reference"""
    x = normal(rng, B, CUDA_T, CUDA_C).to(torch.bfloat16)
    for flash in (True, False):
        m, sd = cuda_module(learner, rng, flash=flash)
        call = ctor(CUDA_C, CUDA_H, CUDA_T, 0.0, flash) + ".to('cuda', torch.bfloat16)(x)"
        case = case_text(x, CUDA_H, CUDA_T, "eval mode; the reference is float64 from the same bfloat16 values")
        check_bf16(forward(learner, m, x), sd, x, flash=flash, bugs=bugs, kata=kata, call=call, case=case)


def judge_benchmark(flash, manual, *, case):
    """learner.measure's results for the two paths: the flash path's peak memory at most 1/20 of the
    manual path's, and its time at most 1/3."""
    expect.that(None not in (flash["peak_bytes"], manual["peak_bytes"]), "The peak CUDA memory could not be measured.",
                call="learner.measure(module, x)", case=case, got=f"{flash['peak_bytes']}, {manual['peak_bytes']}",
                expected="bytes")
    expect.that(flash["peak_bytes"] * MEMORY_RATIO <= manual["peak_bytes"],
                f"The flash path does not save memory: it should need at most 1/{MEMORY_RATIO} of the manual path's "
                "peak, since it never materialises the (B, H, T, T) scores.", call="learner.measure(module, x)",
                case=case, got=f"flash {flash['peak_bytes'] / 2**20:,.1f} MiB, manual {manual['peak_bytes'] / 2**20:,.1f} MiB",
                expected=f"flash <= manual / {MEMORY_RATIO}")
    expect.that(flash["seconds"] * SPEEDUP <= manual["seconds"],
                f"The flash path is not at least {SPEEDUP}x faster than the manual path.",
                call="learner.measure(module, x)", case=case,
                got=f"flash {flash['seconds'] * 1e3:.2f} ms, manual {manual['seconds'] * 1e3:.2f} ms per call",
                expected=f"flash <= manual / {SPEEDUP}")
    # The figures themselves, on a pass too: what the kit quotes is what this check measured.
    less = f"{manual['peak_bytes'] / flash['peak_bytes']:.0f}x less memory" if flash["peak_bytes"] else "no memory"
    faster = (f"{manual['seconds'] / flash['seconds']:.1f}x faster" if flash["seconds"]
              else "faster than the clock tells apart")
    expect.note("measured", f"measured: flash path {flash['peak_bytes'] / 2**20:,.1f} MiB peak, "
                f"{flash['seconds'] * 1e3:.2f} ms per call; manual path {manual['peak_bytes'] / 2**20:,.1f} MiB, "
                f"{manual['seconds'] * 1e3:.2f} ms: {less}, {faster}")


@pytest.mark.cuda
def test_flash_beats_manual(learner, bugs, kata, rng):
    """B=4, H=16, head_dim=64, T=4096, bfloat16: the flash path takes <= 1/20 of the manual path's peak memory and is >= 3x faster"""
    n_embd = BENCH_H * 64
    x = torch.from_numpy(rng.standard_normal((BENCH_B, BENCH_T, n_embd), dtype=np.float32)).to(torch.bfloat16)
    case = case_text(x, BENCH_H, BENCH_T, f"eval mode; TF32 off; learner.measure: one warm-up call, then {REPEATS} timed "
                     "(more if they take under 50 ms)")
    measured = {}
    for flash in (True, False):
        m, sd = cuda_module(learner, rng, flash=flash, n_embd=n_embd, n_head=BENCH_H, block_size=BENCH_T)
        call = ctor(n_embd, BENCH_H, BENCH_T, 0.0, flash) + ".to('cuda', torch.bfloat16)(x)"
        # The point is for the right function at this size too: causal attention makes the first
        # PREFIX outputs of sequence 0 a function of its first PREFIX tokens alone.
        got = forward(learner, m, x)
        expect.form(got, torch.Tensor, x.shape, dtype=x.dtype, what="the output", device="cuda", call=call,
                    case=case)
        check_bf16(got[:1, :PREFIX], sd, x[:1, :PREFIX], flash=flash, bugs=bugs, kata=kata, call=f"{call}[:1, :{PREFIX}]",
                   case=case, n_head=BENCH_H, block_size=BENCH_T)
        measured[flash] = learner.measure(m, x, repeats=REPEATS)
    judge_benchmark(measured[True], measured[False], case=case)
    check_untampered(learner, call="learner.measure(module, x)", case=case)
