"""Known triton-softmax bugs: each a launcher and its own kernel, the reference with exactly that
mistake. They run on Triton's interpreter with the grader's hooks, so that a lane read outside
every tensor gives what it gives in the learner's sandbox."""
import torch
import triton
import triton.language as tl

from reference.triton_softmax import _softmax_kernel


def _launch(kernel, x, row_stride=None):
    """The reference's launcher around another kernel (and, where given, another row stride)."""
    R, C = x.shape
    out = torch.empty((R, C), dtype=x.dtype, device=x.device)   # (R, C)
    stride = x.stride(0) if row_stride is None else row_stride
    kernel[(R,)](x, out, stride, out.stride(0), C, BLOCK=triton.next_power_of_2(C))
    return out


@triton.jit
def _load_unmasked(x_ptr, out_ptr, x_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols).to(tl.float32)   # no mask: lanes n_cols.. read the next row
    row_max = tl.max(x, axis=0)
    row_max = tl.where(row_max == -float("inf"), 0.0, row_max)
    num = tl.exp(x - row_max)
    den = tl.sum(num, axis=0)
    den = tl.where(den == 0.0, 1.0, den)
    tl.store(out_ptr + row * out_row_stride + cols, num / den, mask=mask)


@triton.jit
def _nothing_masked(x_ptr, out_ptr, x_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * x_row_stride + cols).to(tl.float32)   # no mask on the load, nor on the store
    row_max = tl.max(x, axis=0)
    row_max = tl.where(row_max == -float("inf"), 0.0, row_max)
    num = tl.exp(x - row_max)
    den = tl.sum(num, axis=0)
    den = tl.where(den == 0.0, 1.0, den)
    tl.store(out_ptr + row * out_row_stride + cols, num / den)   # the next program writes its row over the spill


@triton.jit
def _no_max(x_ptr, out_ptr, x_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    num = tl.exp(x)   # no max subtracted: exp(1000) is inf in float32, exp(-1000) is 0
    den = tl.sum(num, axis=0)
    den = tl.where(den == 0.0, 1.0, den)
    tl.store(out_ptr + row * out_row_stride + cols, num / den, mask=mask)


@triton.jit
def _no_max_exp2(x_ptr, out_ptr, x_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    num = tl.exp2(x * 1.4426950408889634)   # exp(x) as exp2(x * log2(e)), still with no max subtracted
    den = tl.sum(num, axis=0)
    den = tl.where(den == 0.0, 1.0, den)
    tl.store(out_ptr + row * out_row_stride + cols, num / den, mask=mask)


@triton.jit
def _other_zero(x_ptr, out_ptr, x_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)   # padding 0, not -inf
    row_max = tl.max(x, axis=0)
    row_max = tl.where(row_max == -float("inf"), 0.0, row_max)
    num = tl.exp(x - row_max)   # each padding lane adds exp(0 - max) to the sum
    den = tl.sum(num, axis=0)
    den = tl.where(den == 0.0, 1.0, den)
    tl.store(out_ptr + row * out_row_stride + cols, num / den, mask=mask)


@triton.jit
def _other_missing(x_ptr, out_ptr, x_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask).to(tl.float32)   # no other: padding lanes undefined, 0 here
    row_max = tl.max(x, axis=0)
    row_max = tl.where(row_max == -float("inf"), 0.0, row_max)
    num = tl.exp(x - row_max)
    den = tl.sum(num, axis=0)
    den = tl.where(den == 0.0, 1.0, den)
    tl.store(out_ptr + row * out_row_stride + cols, num / den, mask=mask)


@triton.jit
def _row_length_as_stride(x_ptr, out_ptr, x_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf")).to(tl.float32)   # rows assumed packed
    row_max = tl.max(x, axis=0)
    row_max = tl.where(row_max == -float("inf"), 0.0, row_max)
    num = tl.exp(x - row_max)
    den = tl.sum(num, axis=0)
    den = tl.where(den == 0.0, 1.0, den)
    tl.store(out_ptr + row * out_row_stride + cols, num / den, mask=mask)


@triton.jit
def _unguarded(x_ptr, out_ptr, x_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    num = tl.exp(x - tl.max(x, axis=0))   # the tutorial's kernel: a row of all -inf gives -inf - (-inf) = NaN
    tl.store(out_ptr + row * out_row_stride + cols, num / tl.sum(num, axis=0), mask=mask)


@triton.jit
def _sum_unguarded(x_ptr, out_ptr, x_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    row_max = tl.max(x, axis=0)
    row_max = tl.where(row_max == -float("inf"), 0.0, row_max)
    num = tl.exp(x - row_max)
    tl.store(out_ptr + row * out_row_stride + cols, num / tl.sum(num, axis=0), mask=mask)   # 0 / 0 on such a row


@triton.jit
def _row_max_kernel(x_ptr, max_ptr, x_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
    row_max = tl.max(x, axis=0)
    tl.store(max_ptr + row, tl.where(row_max == -float("inf"), 0.0, row_max))


@triton.jit
def _normalise_kernel(p_ptr, out_ptr, out_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    num = tl.load(p_ptr + row * n_cols + cols, mask=mask, other=0.0)
    den = tl.sum(num, axis=0)
    den = tl.where(den == 0.0, 1.0, den)
    tl.store(out_ptr + row * out_row_stride + cols, num / den, mask=mask)


def softmax_load_unmasked(x):
    return _launch(_load_unmasked, x)


def softmax_nothing_masked(x):
    return _launch(_nothing_masked, x)


def softmax_no_max(x):
    return _launch(_no_max, x)


def softmax_no_max_exp2(x):
    return _launch(_no_max_exp2, x)


def softmax_other_zero(x):
    return _launch(_other_zero, x)


def softmax_other_missing(x):
    return _launch(_other_missing, x)


def softmax_row_length_in_kernel(x):
    return _launch(_row_length_as_stride, x)


def softmax_row_length_passed(x):
    return _launch(_softmax_kernel, x, row_stride=x.shape[1])   # the row length where the row stride is due


def softmax_unguarded(x):
    return _launch(_unguarded, x)


def softmax_sum_unguarded(x):
    return _launch(_sum_unguarded, x)


def softmax_exponent_in_launcher(x):
    R, C = x.shape
    BLOCK = triton.next_power_of_2(C)
    row_max = torch.empty((R,), dtype=torch.float32, device=x.device)   # (R,)
    _row_max_kernel[(R,)](x, row_max, x.stride(0), C, BLOCK=BLOCK)
    p = 2.718281828459045 ** (x.to(torch.float32) - row_max[:, None])   # (R, C) torch computes the exponentials
    out = torch.empty((R, C), dtype=x.dtype, device=x.device)   # (R, C)
    _normalise_kernel[(R,)](p, out, out.stride(0), C, BLOCK=BLOCK)
    return out


BUGS = {
    "mask-missing": [{"softmax": softmax_load_unmasked}, {"softmax": softmax_nothing_masked}],
    "no-max-subtraction": [{"softmax": softmax_no_max}, {"softmax": softmax_no_max_exp2}],
    "other-not-neg-inf": [{"softmax": softmax_other_zero}, {"softmax": softmax_other_missing}],
    "row-stride-assumed": [{"softmax": softmax_row_length_in_kernel}, {"softmax": softmax_row_length_passed}],
    "nan-on-fully-masked-row": [{"softmax": softmax_unguarded}, {"softmax": softmax_sum_unguarded}],
    "launcher-computes": {"softmax": softmax_exponent_in_launcher},
}
