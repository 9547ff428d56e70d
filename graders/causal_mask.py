"""Grader of the causal-mask kata (katas/causal-mask/README.md)."""
import numpy as np
import torch
import torch.nn.functional as F

from graders.engine import expect
from graders.engine.structure import banned_used, check_untampered

B, H, D, DV = 2, 3, 4, 10   # H != head_dim, and v's width differs from q/k's and from every T used


def randn(rng, *shape, dtype=torch.float64):
    return torch.from_numpy(rng.standard_normal(shape)).to(dtype)


def qkv(rng, batch, tq, tk, dtype=torch.float64):
    return randn(rng, *batch, tq, D, dtype=dtype), randn(rng, *batch, tk, D, dtype=dtype), \
        randn(rng, *batch, tk, DV, dtype=dtype)


def mask_call(tq, tk) -> str:
    return f"causal_mask({tq})" if tq == tk else f"causal_mask({tq}, {tk})"


def tensors_case(q, k, v, mask=None, about="") -> str:
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, {str(q.dtype)[6:]} standard normal"
    mask_text = "" if mask is None else f"; mask {tuple(mask.shape)}"
    return shapes + mask_text + (f"; {about}" if about else "")


def grid(mask, rows: str) -> str:
    """A small bool mask drawn as 1s (may attend) and 0s, the way one draws it on a whiteboard."""
    lines = mask.to("cpu").reshape(-1, mask.shape[-1]).int().tolist()
    return f"bool{list(mask.shape)}, {rows}, 1 = may attend:" + "".join("\n    " + " ".join(map(str, line))
                                                                      for line in lines)


def queries(n: int) -> str:
    return f"{n} query" if n == 1 else f"{n} queries"


def check_mask(got, expected, *, call, case, diagnose, device=None, rows="one row per query"):
    expect.bool_mask(got, tuple(expected.shape), call=call, case=case, device=device)
    wrong = got.to("cpu") != expected
    first = ", ".join(str(int(i)) for i in torch.nonzero(wrong)[0]) if wrong.any() else ""
    expect.that(not wrong.any(), f"The mask is wrong at {int(wrong.sum())} of {wrong.numel()} positions "
                f"(first at [{first}]).", call=call, case=case,
                got=grid(got, rows), expected=grid(expected, rows), diagnose=diagnose)


def tolerances(kata, dtype):
    """(tol, loose): the tolerance of the inputs' dtype, and the float32 one under which code that
    computes in float32 inside (Llama's ``softmax(scores.float()).type_as(q)``) is still right."""
    return kata.tolerance(dtype), kata.tolerance("float32")


def pair_form(result, *, call, case):
    """``result`` is a pair ``(out, weights)``: what every check of masked_attention needs first."""
    expect.type_of(result, tuple, call=call, case=case)
    expect.that(len(result) == 2, "masked_attention must return a pair (out, weights).", call=call, case=case,
                got=f"a tuple of {len(result)}", expected="(out, weights)")


def check_attention(result, expected, *, call, case, tol, loose, device, diagnose=None):
    """``result`` is ``(out, weights)`` and equals ``expected``, the output first; within ``loose``
    (float32 rounding) it passes with the float32-inside note: these checks are about semantics."""
    pair_form(result, call=call, case=case)
    for got, want, what in zip(result, expected, ("the output", "the weights")):
        expect.array(got, want, call=call, case=case, what=what, device=device, diagnose=diagnose, **tol,
                     float32_inside=loose)


def diagnose_attention(bugs, result, q, k, v, mask, loose):
    """The bug oracle whose output is ``result``; failing that, mask-inverted when ``result`` is
    attention under ``~mask``: masked_attention reads True as "masked out", as nn.MultiheadAttention does.
    Matched within ``loose`` (float32 rounding), so that a bug written with a float32 softmax is named too."""
    code = bugs.match(result, lambda impl: impl.masked_attention(q, k, v, mask), **loose)
    if code is None and mask is not None and expect.same(result, bugs.reference.masked_attention(q, k, v, ~mask),
                                                         **loose):
        return "mask-inverted"
    return code


def test_square_mask_is_tril(learner, bugs, kata):
    """a square mask is the lower triangle, diagonal included"""
    tol = kata.tolerance("float64")
    for t in (5, 8, 1):   # 1 last: there an inverted mask and a missing diagonal look the same
        for args in ((t,), (t, t)):
            got = learner.causal_mask(*args)
            check_mask(got, bugs.expected.lower_triangle(t), call=f"causal_mask({', '.join(map(str, args))})",
                       case=f"{queries(t)} and keys: query i sees keys 0..i",
                       diagnose=lambda: bugs.match(got, lambda impl: impl.causal_mask(*args), **tol))


def test_rectangular_masks_bottom_right(learner, bugs, kata):
    """rectangular masks are bottom-right aligned (the queries are the last tokens, as with a KV cache)"""
    tol = kata.tolerance("float64")
    for tq, tk in ((1, 6), (3, 7), (5, 9), (7, 5)):
        expected = bugs.expected.bottom_right(tq, tk)   # (Tq, Tk)
        offset = f"i + {tk - tq}" if tk >= tq else f"i - {tq - tk}"
        case = f"{queries(tq)}, {tk} keys: query i sits at position {offset} and sees the keys at or before it"
        if tq > tk:
            case += f" (the first {tq - tk} precede every key and see none)"
        got = learner.causal_mask(tq, tk)
        check_mask(got, expected, call=mask_call(tq, tk), case=case,
                   diagnose=lambda: bugs.match(got, lambda impl: impl.causal_mask(tq, tk), **tol))


def test_masks_are_bool(learner):
    """causal_mask and padding_mask return bool tensors"""
    lengths = torch.tensor([6, 2, 4])
    for call, make in (("causal_mask(5)", lambda: learner.causal_mask(5)),
                       ("causal_mask(3, 6)", lambda: learner.causal_mask(3, 6)),
                       ("padding_mask(lengths, 6)", lambda: learner.padding_mask(lengths, 6))):
        got = make()
        case = "lengths = tensor([6, 2, 4])" if call.startswith("padding") else None
        expect.type_of(got, torch.Tensor, call=call, case=case)
        expect.that(got.dtype == torch.bool, expect.FLOAT_MASK, call=call, case=case, got=str(got.dtype),
                    expected="torch.bool")


def test_device_honoured(learner, bugs, kata, device):
    """causal_mask builds the mask on the requested device (a meta tensor for device="meta")"""
    tol = kata.tolerance("float64")
    case = "a meta tensor has a shape and a dtype but no data: it shows where the mask was built"
    right = bugs.expected.bottom_right(4, 6)   # asked for on any device: a bundle built on a CPU records it
    for dev, text in (("meta", "'meta'"), (torch.device("meta"), "torch.device('meta')")):
        call = f"causal_mask(4, 6, device={text})"
        got = learner.causal_mask(4, 6, device=dev)
        expect.type_of(got, torch.Tensor, call=call, case=case)
        expect.that(got.device.type == "meta", "causal_mask ignored its `device` argument.", call=call, case=case,
                    got=f"a tensor on {got.device}", expected="a tensor on meta",
                    diagnose=lambda: bugs.match(got, lambda impl: impl.causal_mask(4, 6, device=dev), **tol))
        expect.that(tuple(got.shape) == (4, 6), "The mask has the wrong shape.", call=call, case=case,
                    got=f"shape {tuple(got.shape)}", expected="shape (4, 6)")
    if device == "cuda":
        got = learner.causal_mask(4, 6, device="cuda")
        check_mask(got, right, call="causal_mask(4, 6, device='cuda')", case="4 queries, 6 keys",
                   device="cuda", diagnose=lambda: bugs.match(got, lambda impl: impl.causal_mask(4, 6), **tol))


def test_padding_mask_values(learner, bugs, kata, case_rng, device):
    """padding_mask is True exactly at the first lengths[b] positions, shaped (B, 1, 1, max_len)"""
    tol = kata.tolerance("float64")
    for lengths, max_len in ((torch.tensor([5, 2, 7, 0]), 7), (torch.from_numpy(case_rng.integers(1, 9, size=3)), 8)):
        expected = bugs.expected.padding(lengths, max_len)   # (B, 1, 1, T)
        got = learner.padding_mask(lengths, max_len)
        check_mask(got, expected, call=f"padding_mask(lengths, {max_len})", device=device,
                   case=f"lengths = tensor({lengths.tolist()}), max_len = {max_len}", rows="one row per sequence",
                   diagnose=lambda: bugs.match(got, lambda impl: impl.padding_mask(lengths, max_len), **tol))


def test_matches_sdpa_and_reference(learner, bugs, kata, case_rng, rng, device):
    """masked_attention equals F.scaled_dot_product_attention (output) and the reference (weights)"""
    # Every query keeps a key and loses one, so attention under ~m is defined too (see diagnose_attention).
    # This case comes first, so that a masked_attention reading the mask inverted is diagnosed here.
    allowed = ((case_rng.random((B, 1, 5, 8)) < 0.5) & ~np.eye(5, 8, k=3, dtype=bool)) | np.eye(5, 8, dtype=bool)
    cases = [  # (batch axes, Tq, Tk, mask, mask as the call shows it, what the case is, dtype)
        ((B, H), 5, 8, torch.from_numpy(allowed), "m", "m: a random bool mask, the same for every head",
         torch.float64),
        ((B, H), 5, 5, bugs.reference.causal_mask(5), "causal_mask(5)", "causal self-attention", torch.float64),
        ((B, H), 6, 9, bugs.reference.causal_mask(6, 9), "causal_mask(6, 9)", "6 new queries after 3 cached keys",
         torch.float64),
        ((B, H), 7, 7, None, None, "no mask", torch.float64),
        ((B,), 6, 6, bugs.reference.causal_mask(6), "causal_mask(6)", "3-D inputs, no head axis", torch.float64),
        ((B, H), 7, 7, bugs.reference.padding_mask(torch.tensor([7, 4]), 7), "padding_mask(tensor([7, 4]), 7)",
         "sequence 1 is padded after 4 tokens", torch.float64),
        ((B, H), 5, 9, bugs.reference.causal_mask(5, 9), "causal_mask(5, 9)", "float32 inputs", torch.float32),
    ]
    for batch, tq, tk, mask, mask_text, about, dtype in cases:
        q, k, v = qkv(rng, batch, tq, tk, dtype)
        q64, k64, v64 = q.double(), k.double(), v.double()
        expected = (F.scaled_dot_product_attention(q64, k64, v64, attn_mask=mask).to(dtype),
                    bugs.reference.masked_attention(q64, k64, v64, mask)[1].to(dtype))
        if mask is None:
            call, result = "masked_attention(q, k, v)", learner.masked_attention(q, k, v)
        else:
            call, result = f"masked_attention(q, k, v, mask={mask_text})", learner.masked_attention(q, k, v, mask=mask)
        tol, loose = tolerances(kata, q.dtype)
        check_attention(result, expected, call=call, case=tensors_case(q, k, v, mask, about), tol=tol, loose=loose,
                        device=device, diagnose=lambda: diagnose_attention(bugs, result, q, k, v, mask, loose))


def test_fully_masked_rows_are_zero(learner, bugs, kata, case_rng, rng, device):
    """a query with no allowed key gets zero weights and a zero output, never NaN"""
    allowed = (case_rng.random((B, 1, 5, 6)) < 0.5) | np.eye(5, 6, dtype=bool)
    allowed[0, 0, [0, 3]] = False
    allowed[1, 0, [1, 4]] = False
    cases = [  # (Tq, Tk, mask, mask as the call shows it, which rows have no allowed key)
        (5, 6, torch.from_numpy(allowed), "m", "m: a random bool mask in which queries 0 and 3 of sequence 0, "
                                               "and 1 and 4 of sequence 1,"),
        (7, 5, bugs.reference.causal_mask(7, 5), "causal_mask(7, 5)", "queries 0 and 1, which precede every key,"),
        (5, 5, bugs.reference.padding_mask(torch.tensor([4, 0]), 5), "padding_mask(tensor([4, 0]), 5)",
         "all queries of sequence 1, which is all padding,"),
    ]
    for tq, tk, mask, mask_text, empty in cases:
        q, k, v = qkv(rng, (B, H), tq, tk)
        tol, loose = tolerances(kata, q.dtype)
        result = learner.masked_attention(q, k, v, mask=mask)
        case = tensors_case(q, k, v, mask, f"{empty} have no allowed key: their weights and output must be all zero")
        check_attention(result, bugs.reference.masked_attention(q, k, v, mask), case=case, tol=tol, loose=loose,
                        device=device, call=f"masked_attention(q, k, v, mask={mask_text})",
                        diagnose=lambda: diagnose_attention(bugs, result, q, k, v, mask, loose))


def test_causal_and_padding_combined(learner, bugs, kata, rng, device):
    """causal AND padding: your two masks combined with & drive your masked_attention"""
    lengths = torch.tensor([7, 3])
    for tq, tk in ((7, 7), (2, 7)):
        causal_call, padding_call = f"causal_mask({tq}, {tk}, device=q.device)", f"padding_mask(lengths, {tk})"
        causal = learner.causal_mask(tq, tk, device=device)
        expect.bool_mask(causal, (tq, tk), call=causal_call, device=device)
        padding = learner.padding_mask(lengths, tk)
        expect.bool_mask(padding, (B, 1, 1, tk), call=padding_call, case=f"lengths = tensor({lengths.tolist()})",
                        device=device)
        q, k, v = qkv(rng, (B, H), tq, tk)
        tol, loose = tolerances(kata, q.dtype)
        mask = causal.cpu() & padding.cpu()   # (B, 1, Tq, Tk)
        result = learner.masked_attention(q, k, v, mask=mask)
        right = bugs.reference.causal_mask(tq, tk) & bugs.reference.padding_mask(lengths, tk)   # (B, 1, Tq, Tk)
        expected = bugs.reference.masked_attention(q, k, v, right)
        check_attention(
            result, expected, call=f"masked_attention(q, k, v, mask={causal_call} & {padding_call})",
            case=tensors_case(q, k, v, about=f"lengths = tensor({lengths.tolist()}), so sequence 1 is padding "
                                             f"from key 3 on; {tq} queries, the last {tq} tokens"),
            tol=tol, loose=loose, device=device,
            diagnose=lambda: bugs.match(result, lambda impl: impl.masked_attention(
                q, k, v, impl.causal_mask(tq, tk) & impl.padding_mask(lengths, tk)), **loose)
            or diagnose_attention(bugs, result, q, k, v, right, loose))


def test_banned_api(learner, bugs, kata, case_rng, rng):
    """no library attention: masks and attention written with tensor operations"""
    # Only this property: calls that complete without a library attention, whatever they return.
    mask = bugs.reference.causal_mask(5)   # (T, T)
    learner.masked_attention(*qkv(rng, (B, H), 5, 5), mask=mask)   # first call: lazy imports happen before recording
    q, k, v = qkv(rng, (B, H), 5, 5)   # fresh: no earlier call saw it, so memoised outputs cannot skip the ops
    with learner.recording() as ops:   # the masks too: 10 keys is a size no other call uses
        learner.causal_mask(5, 10)
        learner.padding_mask(torch.from_numpy(case_rng.integers(1, 11, size=B)), 10)
        learner.masked_attention(q, k, v, mask=mask)
    used = banned_used(learner.source, ops, kata.banned)
    call = "masked_attention(q, k, v, mask=causal_mask(5))"
    expect.that(not used, "Your code uses a library attention this kata forbids.", call=call,
                got=", ".join(used), expected="only tensor operations (matmul, masked_fill, softmax)",
                diagnose=lambda: "banned-api")
    check_untampered(learner, call=call)
