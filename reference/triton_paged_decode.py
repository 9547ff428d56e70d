"""Reference of the triton-paged-decode kata. TODO(kata new) where the idea comes from, with its source."""
import torch
import triton
import triton.language as tl


@triton.jit
def _example_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)   # this program's block of elements
    mask = offs < n   # the last block runs past the end
    tl.store(out_ptr + offs, 2 * tl.load(x_ptr + offs, mask=mask), mask=mask)


def example(x: torch.Tensor) -> torch.Tensor:
    """TODO(kata new) what the learner writes, in one sentence; what it takes and returns."""
    x = x.contiguous()
    out = torch.empty_like(x)
    _example_kernel[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), BLOCK=128)
    return out
