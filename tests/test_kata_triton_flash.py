"""What is specific to the triton-flash kata: the facts its README teaches, tested on the installed
torch and Triton's interpreter (exp2 with log2(e) folded in, the tutorial's base-2 lse, the causal
key-block counts, the float16 accumulator that overflows), and its failure paths on a learner's file."""
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import checks_by_id
from graders.triton_flash import HALF_CASE, HALF_FLAT, HALF_OFFSET, VISIT_CASES, truth
from reference.triton_flash import flash_attention
from reference.triton_flash_bugs import accumulator_in_half, exp2_of_natural_scores, every_key_block
from reference.triton_flash_expected import grid, key_blocks

ZOO = Path(__file__).parent / "zoo" / "triton-flash"
REFERENCE = (Path(__file__).parent.parent / "reference" / "triton_flash.py").read_text()


def scores(q, k, causal):
    """The scaled scores in float64, masked to -inf above the diagonal when causal."""
    T = q.size(-2)
    s = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.size(-1))   # (B, H, T, T)
    return s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")) if causal else s


def test_exp2_of_scores_times_log2e_is_exp_and_the_base2_lse_converts_back():
    s = torch.randn(4, 9, dtype=torch.float64) * 3
    assert torch.allclose(torch.exp2(s * 1.44269504), torch.exp(s), rtol=1e-8)
    m2 = (s * math.log2(math.e)).amax(-1)
    base2 = m2 + torch.log2(torch.exp2(s * math.log2(math.e) - m2[:, None]).sum(-1))   # the tutorial's M
    assert torch.allclose(base2 * math.log(2), torch.logsumexp(s, -1), rtol=1e-12)


def test_exp2_of_natural_scores_is_the_softmax_of_the_scores_times_ln2():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 16) for _ in range(3))
    out, _ = exp2_of_natural_scores(q, k, v)
    expected = torch.softmax(scores(q, k, False) * math.log(2), -1) @ v.double()
    assert torch.allclose(out.double(), expected, atol=1e-5)
    assert not torch.allclose(out, flash_attention(q, k, v)[0], atol=1e-2)


def test_the_causal_key_blocks_are_half_the_work_and_skipping_them_changes_nothing():
    n = 8
    assert sum(key_blocks(16 * n, 16, 16, True)) == n * (n + 1) // 2
    assert sum(key_blocks(16 * n, 16, 16, False)) == n * n
    assert key_blocks(40, 16, 16, True) == [1, 2, 3] and key_blocks(40, 32, 16, True) == [2, 3]
    assert grid(2, 3, 40, 16) == [3, 6, 1]
    torch.manual_seed(1)
    q, k, v = (torch.randn(*VISIT_CASES[0][:4]) for _ in range(3))
    skipped, every = flash_attention(q, k, v, causal=True), every_key_block(q, k, v, causal=True)
    assert torch.equal(skipped[0], every[0]) and torch.equal(skipped[1], every[1])


def test_the_reference_matches_sdpa_and_logsumexp_in_float32_and_float16():
    torch.manual_seed(2)
    for dtype, atol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
        for causal in (False, True):
            q, k, v = (torch.randn(2, 2, 37, 32).to(dtype) for _ in range(3))
            out, lse = flash_attention(q, k, v, causal=causal, BLOCK_M=32, BLOCK_N=16)
            assert out.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (2, 2, 37)
            assert torch.allclose(out.double(), truth(q, k, v, causal).double(), atol=atol, rtol=atol)
            assert torch.allclose(lse.double(), torch.logsumexp(scores(q, k, causal), -1), atol=1e-5)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")   # the float16 accumulator, on purpose
def test_a_float16_accumulator_overflows_where_a_float32_one_does_not():
    """The float16 check's second case: flat scores, values near 2,000, 40 keys."""
    B, H, T, D, bm, bn = HALF_CASE
    torch.manual_seed(3)
    q, k = ((torch.randn(B, H, T, D) * HALF_FLAT).half() for _ in range(2))
    v = (torch.randn(B, H, T, D) + HALF_OFFSET).half()
    s = scores(q, k, True)
    p = torch.exp(s - s.amax(-1, keepdim=True))   # (B, H, T, T) what acc sums, before the division
    assert (p @ v.double()).abs().max() > torch.finfo(torch.float16).max   # 65,504
    assert torch.tensor(T * HALF_OFFSET).half().isinf()
    good, bad = flash_attention(q, k, v, causal=True)[0], accumulator_in_half(q, k, v, causal=True)[0]
    assert good.isfinite().all() and bad.isinf().any()
    assert torch.allclose(good.double(), truth(q, k, v, True).double(), rtol=2e-3, atol=4.0)


def test_every_zoo_solution_matches_sdpa_in_process():
    """The zoo's correct solutions, imported here on the interpreter, on a case of each kind."""
    import importlib.util

    torch.manual_seed(4)
    q, k, v = (torch.randn(2, 1, 21, 32) for _ in range(3))
    for path in sorted(p for p in ZOO.glob("*.py") if "__" not in p.stem):
        spec = importlib.util.spec_from_file_location(f"zoo_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for causal in (False, True):
            out, lse = module.flash_attention(q, k, v, causal=causal, BLOCK_M=32, BLOCK_N=16)
            expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
            assert torch.allclose(out.double(), expected, atol=1e-5), path.stem
            assert torch.allclose(lse.double(), torch.logsumexp(scores(q, k, causal), -1), atol=1e-5), path.stem


def edit(old, new, source):
    assert old in source, old
    return source.replace(old, new)


def test_a_broken_file_fails_each_check_with_its_own_sentence(grade_source):
    """None for float16 inputs, a raise for T = 37, a float64 lse for T = 21, NaN for the
    non-causal T = 40: each check says what it met; the recorded ones, on calls the edits spare,
    pass."""
    source = edit("    B, H, T, D = q.shape\n",
                  "    B, H, T, D = q.shape\n"
                  "    if q.dtype == torch.float16:\n        return None\n"
                  "    if T == 37:\n        raise ValueError('no')\n", REFERENCE)
    source = edit("    return out, lse\n",
                  "    if T == 21:\n        return out, lse.to(torch.float64)\n"
                  "    if T == 40 and not causal:\n        return out * float('nan'), lse\n"
                  "    return out, lse\n", source)
    checks = checks_by_id(grade_source("triton-flash", source, seed=2))
    assert "pair" in checks["float16-accumulates-in-float32"]["message"]
    assert "raised ValueError" in checks["causal-matches-sdpa"]["message"]
    assert "BLOCK_M=32" in checks["causal-matches-sdpa"]["message"]
    assert "dtype" in checks["lse-matches-logsumexp"]["message"]
    assert "nan" in checks["matches-sdpa"]["message"].lower()
    for passed in ("causal-skips-blocks-above-the-diagonal", "kernels-compute"):
        assert checks[passed]["status"] == "passed", checks[passed]["message"]


def test_a_launcher_computing_with_torch_operators_loses_only_the_kernel_checks(grade_source):
    """q @ kᵀ and p @ v in the launcher (operators: the static check cannot see them), a kernel for
    the softmax rows: the values are right, the recording says who computed them."""
    result = grade_source("triton-flash", (ZOO / "plain_exp__launcher-computes.py").read_text(), seed=2)
    checks = checks_by_id(result)
    assert checks["kernels-compute"]["diagnosis"] == "launcher-computes"
    assert "matmul" in checks["kernels-compute"]["message"]
    assert checks["matches-sdpa"]["status"] == checks["lse-matches-logsumexp"]["status"] == "passed"
    assert checks["causal-skips-blocks-above-the-diagonal"]["status"] == "failed"   # a grid of B·H·T rows


def test_interpreter_data_is_tampering_and_a_missing_function_fails_everything(grade_source):
    """``.data`` in a launcher is refused by the static check (its values are right); a file
    without flash_attention fails every check, naming it."""
    source = edit("    return out, lse\n", "    return out, lse.data\n", REFERENCE)
    checks = checks_by_id(grade_source("triton-flash", source, seed=2))
    assert checks["kernels-compute"]["diagnosis"] == "tampering"
    assert checks["matches-sdpa"]["status"] == "passed"
    missing = grade_source("triton-flash", edit("def flash_attention(", "def attention(", REFERENCE), seed=2)
    assert missing["score"] == 0
    assert all("flash_attention" in c["message"] for c in missing["checks"]
               if c["status"] != "skipped")   # the CUDA check, without a GPU


def test_the_reference_loads_what_the_grid_and_key_block_counts_say():
    """The reference's launch recorded on the interpreter, as the grader sees a learner's: its grid,
    each causal program's loads of k (the key-block counts), and the lanes of q, k and v it reads
    without a cache: q once, k and v once per query block (the kv-bytes-read follow-up)."""
    from graders.engine import manifest

    tracer = manifest.interpret_triton()
    B, H, T, D, bm, bn = 1, 2, 40, 16, 16, 16
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    for causal in (True, False):
        tracer.ops = ops = []
        try:
            flash_attention(q, k, v, causal=causal, BLOCK_M=bm, BLOCK_N=bn)
        finally:
            tracer.ops = None
        (launch,) = ops
        assert launch["grid"] == grid(B, H, T, bm)
        loads = [launch["programs"][m * B * H]["loads"]["K"] for m in range(launch["grid"][0])]
        assert loads == key_blocks(T, bm, bn, causal)
    # Non-causal: every lane of q read once, of k and v once per query block (the padded rows of the last
    # key block are masked off: no lane past T is read).
    reads = launch["reads"]
    assert reads["Q"]["lanes"] == B * H * T * D and reads["Q"]["most"] == 1
    for name in ("K", "V"):
        assert reads[name]["lanes"] == grid(B, H, T, bm)[0] * B * H * T * D and reads[name]["distinct"] == k.numel()
