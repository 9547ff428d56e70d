"""Reference of the triton-softmax kata: a row-wise fused softmax, one Triton program per row.

The kernel of Triton's tutorial 02-fused-softmax (python/tutorials/02-fused-softmax.py in
triton-lang/triton), with one program per row instead of the tutorial's persistent programs, and
with FlashAttention's convention for a row of all -inf (csrc/flash_attn/src/softmax.h in
Dao-AILab/flash-attention): its weights are 0, not NaN.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, x_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    """One program per row: load the row (BLOCK lanes, masked past n_cols), write its softmax."""
    row = tl.program_id(0)   # one program per row: the whole row is this program's block
    cols = tl.arange(0, BLOCK)   # (BLOCK,) BLOCK is a power of two, so lanes n_cols.. are padding
    mask = cols < n_cols   # (BLOCK,)
    # -inf in the padding lanes: they never win the max, and exp(-inf - max) adds 0 to the sum
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf"))   # (BLOCK,)
    x = x.to(tl.float32)   # float16 rows are computed in float32: tl.exp takes nothing narrower
    row_max = tl.max(x, axis=0)   # () subtracted so that exp never overflows
    # A row of all -inf has max -inf, and -inf - (-inf) is NaN: shift it by 0 instead
    row_max = tl.where(row_max == -float("inf"), 0.0, row_max)   # ()
    num = tl.exp(x - row_max)   # (BLOCK,) in [0, 1]: the max's own lane gives exactly 1
    den = tl.sum(num, axis=0)   # () at least 1, or 0 for a row of all -inf
    den = tl.where(den == 0.0, 1.0, den)   # () so that a row of all -inf gives 0 / 1 = 0
    tl.store(out_ptr + row * out_row_stride + cols, num / den, mask=mask)   # cast to out's dtype


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension of a 2-D float32 or float16 tensor (R, C) whose last
    dimension is contiguous (any row stride), by one Triton program per row; returns a new
    contiguous tensor of x's shape and dtype. A row of all -inf gives zeros."""
    R, C = x.shape
    out = torch.empty((R, C), dtype=x.dtype, device=x.device)   # (R, C) contiguous
    # x is read in place, through its row stride: a slice of a wider tensor needs no copy
    _softmax_kernel[(R,)](x, out, x.stride(0), out.stride(0), C, BLOCK=triton.next_power_of_2(C))
    return out
