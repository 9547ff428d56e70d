"""Liger-Kernel's single-block softmax (src/liger_kernel/ops/softmax.py,
_softmax_single_block_forward_kernel and _softmax_forward): one program per row, the row's
offsets in int64, its launcher making x contiguous first. With this kata's convention for a row
of all -inf (zeros) and float16 computed in float32."""
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_single_block_forward_kernel(
    Y_ptr,
    Y_row_stride,
    X_ptr,
    X_row_stride,
    n_cols,
    BLOCK_SIZE: tl.constexpr,
):
    row_id = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_SIZE)
    mask = offs < n_cols

    x = tl.load(X_ptr + row_id * X_row_stride + offs, mask=mask, other=-float("inf"), cache_modifier=".ca")
    x = x.to(tl.float32)
    m = tl.max(x, axis=0)
    m = tl.where(m == -float("inf"), 0.0, m)
    e = tl.exp(x - m)
    d = tl.sum(e, axis=0)
    d = tl.where(d == 0.0, 1.0, d)
    y = e / d
    tl.store(Y_ptr + row_id * Y_row_stride + offs, y, mask=mask, cache_modifier=".cs")


def softmax(x):
    n_rows, n_cols = x.shape
    x2d = x.contiguous()
    y2d = torch.empty_like(x2d)
    BLOCK_SIZE = triton.next_power_of_2(n_cols)
    _softmax_single_block_forward_kernel[(n_rows,)](y2d, y2d.stride(0), x2d, x2d.stride(0), n_cols,
                                                    BLOCK_SIZE=BLOCK_SIZE)
    return y2d
