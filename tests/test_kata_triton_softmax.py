"""What is specific to the triton-softmax kata: the facts its README teaches, tested on the
installed torch and Triton (on its interpreter): blocks of a power of two, float32's exp range,
torch.softmax's NaN on a row of all -inf against the kata's zeros, the tutorial's count of the
unfused path's traffic, the tolerance exp2 needs; and its failure paths on a learner's file."""
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from conftest import checks_by_id
from graders.engine.manifest import find
from graders.engine.structure import tampering
from reference.triton_softmax import softmax

ZOO = Path(__file__).parent / "zoo" / "triton-softmax"
SOURCE = (ZOO / "triton_tutorial.py").read_text()


@triton.jit
def _arange_kernel(out_ptr, N: tl.constexpr):
    tl.store(out_ptr + tl.arange(0, N), tl.zeros((N,), dtype=tl.float32))


def test_blocks_are_a_power_of_two():
    out = torch.ones(8)
    _arange_kernel[(1,)](out, N=8)
    assert out.sum() == 0
    with pytest.raises(Exception, match="power of 2"):
        _arange_kernel[(1,)](torch.ones(5), N=5)
    assert [triton.next_power_of_2(c) for c in (5, 8, 33, 1000)] == [8, 8, 64, 1024]


@triton.jit
def _exp_kernel(x_ptr, out_ptr, N: tl.constexpr):
    cols = tl.arange(0, N)
    tl.store(out_ptr + cols, tl.exp(tl.load(x_ptr + cols)))


def test_tl_exp_refuses_float16():
    out = torch.empty(8)
    _exp_kernel[(1,)](torch.zeros(8), out, N=8)
    assert (out == 1).all()
    with pytest.raises(Exception, match=r"Expected dtype \['fp32', 'fp64'\] but got fp16"):
        _exp_kernel[(1,)](torch.zeros(8, dtype=torch.float16), out, N=8)


def test_float32_exp_overflows_and_underflows_where_the_readme_says():
    exp = torch.exp(torch.tensor([88.7, 88.8, -103.0, -104.0]))
    assert torch.isfinite(exp[0]) and torch.isinf(exp[1]) and exp[2] > 0 and exp[3] == 0


def test_torch_gives_nan_on_a_row_of_all_neg_inf_and_the_kata_zeros():
    x = torch.randn(3, 5)
    x[1] = float("-inf")
    x[2, [0, 3]] = float("-inf")
    assert torch.softmax(x, dim=-1)[1].isnan().all()
    got = softmax(x)
    assert (got[1] == 0).all() and (got[2, [0, 3]] == 0).all()
    assert torch.allclose(got[[0, 2]], torch.softmax(x, dim=-1)[[0, 2]], rtol=1e-5, atol=1e-7)


def test_the_reference_reads_a_slice_and_keeps_float16():
    base = torch.randn(4, 9)
    x = base[:, :6]
    assert x.stride() == (9, 1) and not x.is_contiguous()
    assert torch.allclose(softmax(x), torch.softmax(x, dim=-1), rtol=1e-5, atol=1e-7)
    h = torch.randn(3, 10).half()
    got = softmax(h)
    assert got.dtype == torch.float16 and got.is_contiguous()
    assert torch.allclose(got.float(), torch.softmax(h.float(), dim=-1), rtol=1e-3, atol=1e-7)


def test_the_tutorials_count_of_the_unfused_path():
    """max, subtract, exp, sum, divide: reads 5MN + 2M elements, writes 3MN + 2M."""
    M, N = 7, 11
    x = torch.empty(M, N, device="meta")
    steps = []
    x_max = x.max(dim=1)[0]
    steps.append(((x,), x_max))
    z = x - x_max[:, None]
    steps.append(((x, x_max), z))
    numerator = torch.exp(z)
    steps.append(((z,), numerator))
    denominator = numerator.sum(dim=1)
    steps.append(((numerator,), denominator))
    ret = numerator / denominator[:, None]
    steps.append(((numerator, denominator), ret))
    reads = sum(t.numel() for ins, _ in steps for t in ins)
    writes = sum(out.numel() for _, out in steps)
    assert (reads, writes) == (5 * M * N + 2 * M, 3 * M * N + 2 * M)


def test_exp2_with_log2e_needs_the_ulps_of_the_tolerance():
    """exp2(x·log2 e - m·log2 e) rounds x·log2 e (≈ 1443 at x ≈ 1000): its weights are off by more
    than rtol 1e-5 allows, and within the atol that grows by 2 ulps of 1000."""
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("zoo_exp2", ZOO / "exp2.py")
    exp2 = module_from_spec(spec)
    spec.loader.exec_module(exp2)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((4, 8))).float() + 1000
    err = (exp2.softmax(x).double() - softmax(x).double()).abs()
    tol = find("triton-softmax").tolerance("float32", 1000.0)
    assert (err > 1e-5 * softmax(x).double().abs() + 1e-7).any()
    assert (err <= tol["atol"]).all()


def edit(old, new, source):
    assert old in source, old
    return source.replace(old, new)


def test_a_broken_file_fails_each_check_with_its_own_sentence(grade_source):
    """NaN for two rows, a column short for float16, an error on rows of 8, float64 for rows of
    6 with -inf, None for a slice: each check says so, and the structure, which none of it
    touches, still passes."""
    source = edit("    # Allocate output\n    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)\n",
                  "    if n_cols == 8:\n        raise ValueError('rows of 8')\n"
                  "    if x.stride(0) != n_cols:\n        return None\n"
                  "    if n_rows == 2:\n        return torch.full((n_rows, n_cols), float('nan'))\n"
                  "    wide = n_rows == 4 and n_cols == 6\n"
                  "    y = torch.empty((n_rows, n_cols), dtype=torch.float64 if wide else x.dtype, device=x.device)\n",
                  SOURCE)
    source = edit("    return y\n", "    return y[:, 1:] if x.dtype == torch.float16 else y\n", source)
    checks = checks_by_id(grade_source("triton-softmax", source, seed=2))
    assert "nan" in checks["matches-torch-softmax"]["message"].lower()
    assert "wrong shape" in checks["float16-rows"]["message"] and "(3, 9)" in checks["float16-rows"]["message"]
    assert "rows of 8" in checks["large-values"]["message"] and "softmax(float32[6, 8])" in checks["large-values"]["message"]
    assert "wrong dtype" in checks["fully-masked-rows"]["message"] and "float64" in checks["fully-masked-rows"]["message"]
    assert "wrong type" in checks["strided-rows"]["message"]
    assert checks["one-program-per-row"]["status"] == "passed"


def test_a_missing_launcher_fails_every_check(grade_source):
    source = edit("def softmax(x):", "def softmax_rows(x):", SOURCE)
    result = grade_source("triton-softmax", source, seed=2)
    assert all(c["status"] == "failed" and "no 'softmax'" in c["message"]
               for c in result["checks"] if c["status"] != "skipped")   # the CUDA check, without a GPU


COPYING = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _copy_kernel(y_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    tl.store(out_ptr + row * n_cols + cols, tl.load(y_ptr + row * n_cols + cols, mask=mask), mask=mask)


def softmax(x):
    R, C = x.shape
    e = 2.718281828459045 ** x.to(torch.float32)
    y = e / (e @ torch.ones((C, 1)))
    out = torch.empty((R, C), dtype=x.dtype, device=x.device)
    _copy_kernel[(R,)](y, out, C, BLOCK=triton.next_power_of_2(C))
    return out
'''


def test_a_launcher_that_computes_and_a_kernel_that_copies(grade_source):
    """With operators only, the static check sees nothing: the recording shows them. With a torch
    function, the static check refuses the file."""
    assert tampering(COPYING, "triton") == []
    checks = checks_by_id(grade_source("triton-softmax", COPYING, seed=2))
    structure = checks["one-program-per-row"]
    assert structure["status"] == "failed" and structure["diagnosis"] == "launcher-computes"
    assert "got: __rpow__, div, matmul" in structure["message"]
    assert checks["matches-torch-softmax"]["status"] == "passed"
    library = COPYING.replace("e = 2.718281828459045 ** x.to(torch.float32)\n    y = e / (e @ torch.ones((C, 1)))",
                              "y = torch.softmax(x.to(torch.float32), dim=-1)")
    assert any("softmax" in found for found in tampering(library, "triton"))
