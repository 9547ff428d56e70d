"""Grader of the triton-softmax kata (katas/triton-softmax/README.md)."""
import pytest
import torch

from graders.engine import expect, kernels

LENGTHS = [(3, 5), (2, 33)]   # row lengths no power of two: BLOCK 8 pads 3 lanes, BLOCK 64 pads 31
STRIDED = (3, 5, 8)   # R, C and the row stride: a slice x[:, :5] of rows 8 wide


def judge(learner, bugs, kata, x, case):
    """softmax(x) equals the reference's, to the tolerance of x's dtype and magnitude: a kernel
    may round x once more than the reference (exp2 of x * log2(e) rounds the product)."""
    got = learner.softmax(x)
    tol = kata.tolerance(x.dtype, expect.magnitude(x))
    expect.array(got, bugs.reference.softmax(x), call="softmax(x)", case=case, **tol, axes=("row", "column"),
                 diagnose=lambda: bugs.match(got, lambda impl: impl.softmax(x), **tol))


def normal(rng, shape, dtype=torch.float32):
    return torch.from_numpy(rng.standard_normal(shape)).to(dtype)


def strided(rng, R, C, stride, gap=8.0):
    """x[:, :C] of rows ``stride`` wide, as the storage it spans: (R - 1) * stride + C elements,
    what the learner's sandbox receives. The gaps hold values near ``gap``, far above the row's,
    so that a kernel that reads them gives weights visibly wrong."""
    flat = torch.from_numpy(rng.normal(gap, 1.0, (R - 1) * stride + C)).float()   # ((R - 1) * stride + C,)
    x = flat.as_strided((R, C), (stride, 1))   # (R, C) a view: its rows start `stride` apart
    x.copy_(normal(rng, (R, C)))
    return x


def test_matches_torch_softmax(learner, bugs, kata, rng):
    """equals torch.softmax on rows whose length is no power of two"""
    for shape in LENGTHS:
        judge(learner, bugs, kata, normal(rng, shape), f"x: float32 {shape}, standard normal")


def test_float16_rows(learner, bugs, kata, rng):
    """float16 in, float16 out"""
    judge(learner, bugs, kata, normal(rng, (3, 10), torch.float16), "x: float16 (3, 10), standard normal")


def test_large_values(learner, bugs, kata, rng):
    """exact on rows of values near 1000, near -1000, and spread over hundreds"""
    # exp(1000) overflows float32 and exp(-1000) underflows it, and a row spread over hundreds
    # overflows exp(x - c) for any c but its max. Rows of 8, no padding: this check is about the
    # max alone (padding filled with 0 would win the max of a row near -1000, as a missing max
    # does, and the two would look alike).
    shift = torch.tensor([1000.0, -1000.0, 0.0]).repeat_interleave(2)[:, None]   # (6, 1)
    scale = torch.tensor([1.0, 1.0, 100.0]).repeat_interleave(2)[:, None]   # (6, 1)
    judge(learner, bugs, kata, normal(rng, (6, 8)) * scale + shift,
          "x: float32 (6, 8), standard normal: rows 0-1 + 1000, rows 2-3 - 1000, rows 4-5 × 100")


def test_fully_masked_rows(learner, bugs, kata, rng):
    """a row of all -inf gives zeros; an -inf entry gets weight 0"""
    x = normal(rng, (4, 6))
    x[1] = float("-inf")
    x[3, [0, 4]] = float("-inf")
    judge(learner, bugs, kata, x, "x: float32 (4, 6), row 1 all -inf, row 3 -inf at columns 0 and 4")


def test_strided_rows(learner, bugs, kata, rng):
    """reads rows through their stride: a slice of a wider tensor"""
    R, C, stride = STRIDED
    judge(learner, bugs, kata, strided(rng, R, C, stride),
          f"x: float32 ({R}, {C}) with row stride {stride}, x = base[:, :{C}] of base ({R}, {stride})")


def test_one_program_per_row(learner, bugs, kata, rng):
    """one program per row, no lane past the end of a tensor, and the launcher computes nothing"""
    x = normal(rng, (5, 6))
    call, case = "softmax(x)", "x: float32 (5, 6), standard normal"
    with learner.recording() as ops:
        got = learner.softmax(x)
    expect.form(got, torch.Tensor, x.shape, call=call, case=case)
    # The last row's padding lanes lie past the end of x and of the output: only a mask keeps them
    # out. (A store's spill into the next row is written over by that row's program here, where
    # programs run one after another; on a GPU they race.)
    read, written = kernels.outside(ops, "load"), kernels.outside(ops, "store")
    expect.that(read == 0 and written == 0, "Your kernel reaches lanes past the end of its tensors: a load or a "
                "store without a mask (or with one that lets the padding through) reads or writes whatever memory "
                "follows the last row.",
                call=call, case=case, got=f"{read} lanes read and {written} written outside the tensors",
                expected="0 and 0", diagnose=lambda: "mask-missing")
    grids = [launch["grid"] for launch in kernels.launches(ops)]
    idle = sum(not program["loads"] for launch in kernels.launches(ops) for program in launch["programs"])
    expect.that(all(grid == [5, 1, 1] for grid in grids) and not idle,
                "Your kernels do not run one program per row: launch a grid of (R,), each program loading its row.",
                call=call, case=case, got=f"grids {grids}, {idle} programs that load nothing",
                expected="every launch a grid of [5, 1, 1], each program loading its row")
    kernels.check_kernels_compute(learner, ops, call=call, case=case, code="launcher-computes")


@pytest.mark.cuda
def test_compiled_on_cuda(learner, bugs, kata, rng):
    """on a GPU: the kernel Triton compiles gives the interpreter's weights"""
    x = normal(rng, (64, 1000))   # (R, C): BLOCK 1024, 24 lanes of padding per row
    with learner.compiled() as gpu:
        got = gpu.softmax(x)
    tol = kata.tolerance(x.dtype, expect.magnitude(x))
    expect.array(got, bugs.reference.softmax(x).cuda(), call="softmax(x), compiled", device="cuda",
                 case="x: float32 (64, 1000) on cuda, standard normal", **tol, axes=("row", "column"))
