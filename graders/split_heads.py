"""Grader of the split-heads kata (katas/split-heads/README.md).

The expected values come from an independent oracle (slicing and concatenating the channel blocks
of each head, ``bugs.expected``), not from the reference's view and transpose.
"""

import torch

from graders.engine import expect
from graders.engine.failures import CheckFailed, LearnerRaised
from graders.engine.learner import describe_value

# (B, T, C, H): H != hd and T differs from both, so a head axis confused with time or channels
# changes the values (or the shape).
CASES = [(2, 5, 12, 3), (3, 7, 24, 4), (2, 6, 10, 2), (4, 8, 30, 5)]
# Each config in float64, and the first in float32 too: splitting heads must keep the dtype.
RUNS = [(*case, torch.float64) for case in CASES] + [(*CASES[0], torch.float32)]

# Non-contiguous (B, H, T, hd) inputs for merge_heads, by the order of their axes in memory.
LAYOUTS = [
    ((0, 2, 1, 3), "y.transpose(1, 2) of a contiguous (B, T, H, hd) tensor, the layout some fused attention kernels "
                   "return"),
    ((1, 0, 2, 3), "a (B, H, T, hd) view of a (H, B, T, hd) stack, as torch.stack(per_head_outputs).transpose(0, 1) "
                   "gives it"),
    ((0, 2, 3, 1), "a (B, H, T, hd) view of a (B, T, hd, H) tensor: heads innermost in memory"),
]

VIEW_ERROR = "view size is not compatible"
ANY_STRIDES = "merge_heads to accept a (B, H, T, hd) tensor whatever its strides"


def randn(rng, *shape, dtype=torch.float64):
    return torch.from_numpy(rng.standard_normal(shape)).to(dtype)


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def x_case(B, T, C, H, dtype) -> str:
    return f"x {dtype_name(dtype)} (B={B}, T={T}, C={C}) standard normal; H = {H} heads, so hd = {C // H}"


def y_case(B, T, C, H, dtype, layout="contiguous, as att @ v returns it") -> str:
    return f"y {dtype_name(dtype)} (B={B}, H={H}, T={T}, hd={C // H}) standard normal, {layout}"


def laid_out(rng, shape, order, dtype=torch.float64):
    """A standard normal tensor of logical ``shape`` whose axes lie in memory in ``order``."""
    base = randn(rng, *(shape[i] for i in order), dtype=dtype)
    return base.permute([order.index(i) for i in range(len(shape))])


def merge(learner, y, *, case, diagnose=lambda: "merge-needs-contiguous"):
    """learner.merge_heads(y), with a diagnosis on the "view size is not compatible" error."""
    try:
        return learner.merge_heads(y)
    except LearnerRaised as exc:
        if exc.type_name == "RuntimeError" and VIEW_ERROR in exc.message:
            exc.case, exc.expected, exc.diagnosis = case, ANY_STRIDES, diagnose()
        raise


def check_rearranged(got, source, shape, *, call, case, device, letters):
    """``got`` is a tensor of ``shape`` and of ``source``'s dtype, holding ``source``'s values, each once."""
    expect.type_of(got, torch.Tensor, call=call, case=case)
    expect.that(tuple(got.shape) == shape, "The result has the wrong shape.", call=call, case=case,
                got=f"shape {tuple(got.shape)}", expected=f"shape {shape} = {letters}")
    expect.that(got.dtype == source.dtype, "The result has the wrong dtype: splitting and merging heads only "
                "moves values, so the dtype stays.", call=call, case=case, got=str(got.dtype),
                expected=str(source.dtype))
    expect.that(got.device.type == device, "The result is on the wrong device.", call=call, case=case,
                got=str(got.device), expected=device)
    moved = torch.equal(got.to("cpu").flatten().sort().values, source.flatten().sort().values)
    expect.that(moved, "The result does not hold the input's values: splitting and merging heads only moves "
                "values around, it computes nothing.", call=call, case=case,
                got=f"{describe_value(got)}, not a rearrangement of the input",
                expected="the input's values, each exactly once, rearranged")


def test_shapes(learner, device, rng):
    """split_heads gives (B, H, T, hd) and merge_heads (B, T, H * hd), holding the input's values"""
    for B, T, C, H, dtype in RUNS:
        x = randn(rng, B, T, C, dtype=dtype)
        got = learner.split_heads(x, H)
        check_rearranged(got, x, (B, H, T, C // H), call=f"split_heads(x, {H})", case=x_case(B, T, C, H, dtype),
                         device=device, letters="(B, H, T, hd)")
        y = randn(rng, B, H, T, C // H, dtype=dtype)
        case = y_case(B, T, C, H, dtype)
        got = merge(learner, y, case=case)
        check_rearranged(got, y, (B, T, C), call="merge_heads(y)", case=case, device=device, letters="(B, T, H * hd)")


def test_split_values(learner, bugs, kata, rng, device):
    """split_heads(x, H)[b, h, t] == x[b, t, h*hd:(h+1)*hd] for several (B, T, C, H)"""
    for B, T, C, H, dtype in RUNS:
        tol = kata.tolerance(dtype)
        x = randn(rng, B, T, C, dtype=dtype)
        got = learner.split_heads(x, H)
        expect.array(got, bugs.expected.split(x, H), call=f"split_heads(x, {H})", case=x_case(B, T, C, H, dtype),
                     device=device, what="split_heads(x, H)[b, h, t]", against="x[b, t, h*hd:(h+1)*hd]",
                     diagnose=lambda: bugs.match(got, lambda impl: impl.split_heads(x, H), **tol), **tol)


def test_merge_contiguous(learner, bugs, kata, rng, device):
    """merge_heads of a contiguous (B, H, T, hd) tensor, like att @ v, puts head h at channels h*hd:(h+1)*hd"""
    for B, T, C, H, dtype in RUNS:
        tol = kata.tolerance(dtype)
        y = randn(rng, B, H, T, C // H, dtype=dtype)
        case = y_case(B, T, C, H, dtype)
        got = merge(learner, y, case=case)
        expect.array(got, bugs.expected.merge(y), call="merge_heads(y)", case=case, device=device,
                     what="merge_heads(y)[b, t, h*hd:(h+1)*hd]", against="y[b, h, t]",
                     diagnose=lambda: bugs.match(got, lambda impl: impl.merge_heads(y), **tol), **tol)


def test_merge_non_contiguous(learner, bugs, kata, rng, device):
    """merge_heads of non-contiguous (B, H, T, hd) views, whatever their strides"""
    B, T, C, H = CASES[1]
    tol = kata.tolerance("float64")
    for order, layout in LAYOUTS:
        y = laid_out(rng, (B, H, T, C // H), order)
        case = y_case(B, T, C, H, torch.float64, layout)

        def diagnose_view_error():
            # A view on a strided input also fails when merge_heads forgets the transpose and views
            # y directly: what the same values, made contiguous, give says which of the two it is.
            try:
                flat = learner.merge_heads(y.contiguous())
            except CheckFailed:
                return "merge-needs-contiguous"
            return bugs.match(flat, lambda impl: impl.merge_heads(y.contiguous()), among=["merge-without-transpose"],
                              **tol) or "merge-needs-contiguous"

        got = merge(learner, y, case=case, diagnose=diagnose_view_error)
        expect.array(got, bugs.expected.merge(y), call="merge_heads(y)", case=case, device=device,
                     what="merge_heads(y)[b, t, h*hd:(h+1)*hd]", against="y[b, h, t]",
                     diagnose=lambda: bugs.match(got, lambda impl: impl.merge_heads(y), **tol), **tol)


def test_rejects_indivisible_heads(learner, bugs, kata, rng, device):
    """C % n_heads != 0 raises ValueError (or AssertionError) naming C and H, not view's RuntimeError"""
    tol = kata.tolerance("float64")
    B, T, C, H = CASES[0]
    x = randn(rng, B, T, C)
    got = learner.split_heads(x, H)   # a valid split works: only the indivisible ones may raise
    expect.array(got, bugs.expected.split(x, H), call=f"split_heads(x, {H})", case=x_case(B, T, C, H, torch.float64),
                 device=device, what="split_heads(x, H)[b, h, t]", against="x[b, t, h*hd:(h+1)*hd]",
                 diagnose=lambda: bugs.match(got, lambda impl: impl.split_heads(x, H), **tol), **tol)
    for B, T, C, H in ((2, 5, 10, 4), (3, 6, 12, 5)):
        x = randn(rng, B, T, C)
        call = f"split_heads(x, {H})"
        case = f"x float64 (B={B}, T={T}, C={C}); {H} heads cannot split {C} channels evenly ({C} % {H} = {C % H})"
        wanted = f"ValueError (or AssertionError) whose message names C = {C} and n_heads = {H}"
        expect.refused(lambda: learner.split_heads(x, H), call=call, case=case, expected=wanted, naming=(C, H),
                       raised="split_heads let the bad head count through and failed later: check C % n_heads "
                              "yourself and say which numbers do not fit.",
                       returned=f"{H} heads cannot split {C} channels, yet split_heads returned a value.",
                       unnamed="The error is the right kind, but its message does not give both C and n_heads: "
                               "whoever reads it must see which numbers do not fit.",
                       diagnose=lambda: "missing-divisibility-check")
