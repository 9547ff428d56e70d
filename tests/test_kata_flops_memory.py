"""The flops-memory grader on solutions written the way learners write them (not via the bug
oracles), and the facts it relies on: the textbook numbers, FlopCounterMode, module numel."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from conftest import checks_by_id
from graders.flops_memory import (CUDA_CASES, FLOP_CONFIGS, KV_CONFIGS, PARAM_CONFIGS, TEXTBOOK, counted_flops,
                                  module_params, scores_peak)
from reference import flops_memory as ref

SOLUTION = '''
import math


def attention_params(d_model, n_heads, n_kv_heads=None, bias=False):
    kv_heads = n_kv_heads if n_kv_heads is not None else n_heads
    hd = d_model // n_heads
    q = o = d_model * d_model + (d_model if bias else 0)
    k = v = d_model * kv_heads * hd + (kv_heads * hd if bias else 0)
    return q + k + v + o


def attention_flops(batch, seq_len, d_model, n_heads, n_kv_heads=None):
    kv_heads = n_kv_heads if n_kv_heads is not None else n_heads
    hd = d_model // n_heads
    tokens = batch * seq_len
    proj = 2 * tokens * d_model * d_model * 2 + 2 * tokens * d_model * kv_heads * hd * 2
    attn = 2 * batch * n_heads * seq_len * hd * seq_len * 2
    return proj + attn


def attention_scores_bytes(batch, n_heads, seq_len, bytes_per_element=4):
    return batch * n_heads * seq_len * seq_len * bytes_per_element


def kv_cache_bytes(batch, seq_len, n_layers, n_kv_heads, head_dim, bytes_per_element=2):
    return 2 * n_layers * batch * n_kv_heads * seq_len * head_dim * bytes_per_element


def max_seq_len(memory_bytes, batch, n_heads, bytes_per_element=2):
    t = 0
    while batch * n_heads * (t + 1) ** 2 * bytes_per_element <= memory_bytes:
        t += 1
    return t
'''


def failed(result):
    return [c["id"] for c in result["checks"] if c["status"] == "failed"]


def test_textbook_answers_are_the_references():
    for name, args, kwargs, answer, _ in TEXTBOOK:
        assert getattr(ref, name)(*args, **kwargs) == answer, (name, args, kwargs)


def test_reference_flops_equal_the_flop_counter():
    rng = np.random.default_rng(0)
    for B, T, d, H, n_kv in FLOP_CONFIGS:
        assert ref.attention_flops(B, T, d, H, n_kv) == counted_flops(rng, B, T, d, H, n_kv)[0]


def test_reference_params_equal_module_numel_with_and_without_bias():
    for d, H, n_kv in PARAM_CONFIGS:
        for bias in (False, True):
            assert ref.attention_params(d, H, n_kv, bias) == module_params(d, H, n_kv, bias)[0]


def test_configs_keep_the_bug_ratios_apart():
    # Only QKᵀ and AV is T / (T + d + kv_dim) of the answer: never the 1/2 of counting MACs.
    for B, T, d, H, n_kv in FLOP_CONFIGS:
        assert 2 * 4 * B * T * T * d != ref.attention_flops(B, T, d, H, n_kv)
    # Forgetting the layers is 1/n_layers of the answer: never the 1/2 of forgetting V.
    assert all(L not in (1, 2) for _, _, L, *_ in KV_CONFIGS)


def test_the_fused_cpu_sdpa_kernel_counts_no_flops():
    # Why the grader's layer runs SDPA on the math backend: a count of 0 would pass nothing.
    q = k = v = torch.randn(2, 4, 7, 12)
    with FlopCounterMode(display=False) as counter:
        F.scaled_dot_product_attention(q, k, v)
    assert counter.get_total_flops() == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_measured_peak_of_the_scores_is_their_size():
    for B, H, T, hd, dtype in CUDA_CASES:
        q, k = (torch.randn(B, H, T, hd, device="cuda", dtype=dtype) for _ in "qk")
        assert scores_peak(q, k) == ref.attention_scores_bytes(B, H, T, q.element_size())


def test_a_different_correct_solution_passes_and_the_cuda_check_says_why_it_skips(grade_source):
    result = grade_source("flops-memory", SOLUTION, seed=5)
    assert result["status"] == "passed", [c["message"] for c in result["checks"] if c["status"] != "passed"]
    cuda = checks_by_id(result)["scores-bytes-measured-on-cuda"]
    if not torch.cuda.is_available():
        assert cuda["status"] == "skipped" and "needs a CUDA device" in cuda["message"]
        assert result["max_score"] == 11


def test_an_integral_float_count_passes_with_a_note(grade_source):
    # `/` that divides exactly: GPT-2 small's 2359296.0 parameters, the exact integer as a float.
    result = grade_source("flops-memory", SOLUTION.replace("hd = d_model // n_heads\n    q = o",
                                                           "hd = d_model / n_heads\n    q = o"))
    checks = checks_by_id(result)
    assert result["status"] == "passed" and result["score"] == result["max_score"]
    for check in ("textbook-answers", "params-match-torch-modules"):
        assert checks[check]["notes"] == ["integral-float"]
    assert "attention_params(768, 12) answered the float 2359296.0" in checks["textbook-answers"]["message"]
    assert "notes" not in checks["kv-cache-bytes-values"]
    assert result["notes"] == ["integral-float"]


def test_a_non_integral_float_is_refused_and_a_wrong_integral_float_diagnosed(grade_source):
    loop = ("    t = 0\n    while batch * n_heads * (t + 1) ** 2 * bytes_per_element <= memory_bytes:\n"
            "        t += 1\n    return t")
    source = SOLUTION.replace(loop, "    return math.sqrt(memory_bytes / (batch * n_heads * bytes_per_element))")
    source = source.replace("return 2 * n_layers * batch", "return 2 * batch").replace(
        "* head_dim * bytes_per_element", "* head_dim * bytes_per_element / 1")
    result = grade_source("flops-memory", source)
    checks = checks_by_id(result)
    # Exactly full cases give 4096.0, a whole number; one byte short gives a fraction: refused.
    message = checks["max-seq-len-fits"]["message"]
    assert "Return a Python int" in message and "one byte short of T = 777" in message and "(float)" in message
    assert checks["max-seq-len-fits"]["diagnosis"] is None
    assert checks["kv-cache-bytes-values"]["diagnosis"] == "kv-cache-missing-layers"
    assert "Wrong number of bytes for the KV cache" in checks["kv-cache-bytes-values"]["message"]


def test_numpy_integers_are_refused(grade_source):
    source = "import numpy as np\n" + SOLUTION.replace(
        "return batch * n_heads * seq_len * seq_len * bytes_per_element",
        "return np.prod([batch, n_heads, seq_len, seq_len, bytes_per_element])")
    checks = checks_by_id(grade_source("flops-memory", source))
    assert "Return a Python int" in checks["scores-bytes-values"]["message"]
    assert "(int64)" in checks["scores-bytes-values"]["message"]


def test_gqa_ignored_in_the_flops_fails_only_the_flop_counter_check(grade_source):
    result = grade_source("flops-memory", SOLUTION.replace("d_model * kv_heads * hd * 2", "d_model * d_model * 2"))
    message = checks_by_id(result)["flops-match-flop-counter"]["message"]
    assert failed(result) == ["flops-match-flop-counter"]
    assert "K/V heads" in message and "counted by FlopCounterMode" in message and "aten.bmm" in message


def test_gqa_ignored_in_the_params_is_diagnosed(grade_source):
    result = grade_source("flops-memory", SOLUTION.replace("kv_heads * hd + (kv_heads * hd if bias else 0)",
                                                           "d_model + (d_model if bias else 0)"))
    assert failed(result) == ["textbook-answers", "params-match-torch-modules"]
    assert result["diagnoses"] == ["params-ignores-kv-heads"]
    assert "Llama-2-70B" in checks_by_id(result)["textbook-answers"]["message"]


def test_scores_ignoring_bytes_per_element(grade_source):
    result = grade_source("flops-memory", SOLUTION.replace("seq_len * seq_len * bytes_per_element",
                                                           "seq_len * seq_len * 4"))
    message = checks_by_id(result)["scores-bytes-values"]["message"]
    assert "Wrong number of bytes for the scores" in message and "(2 times the right answer)" in message
    assert failed(result) == ["textbook-answers", "scores-bytes-values"]


def test_kv_cache_of_one_layer_is_diagnosed(grade_source):
    result = grade_source("flops-memory", SOLUTION.replace("2 * n_layers * batch", "2 * batch"))
    checks = checks_by_id(result)
    assert failed(result) == ["textbook-answers", "kv-cache-bytes-values"]
    assert checks["kv-cache-bytes-values"]["diagnosis"] == "kv-cache-missing-layers"
    assert "(1/3 of the right answer)" in checks["kv-cache-bytes-values"]["message"]


def test_a_rounded_up_square_root_returns_a_t_that_does_not_fit(grade_source):
    loop = ("    t = 0\n    while batch * n_heads * (t + 1) ** 2 * bytes_per_element <= memory_bytes:\n"
            "        t += 1\n    return t")
    source = SOLUTION.replace(loop,
                              "    return math.ceil(math.sqrt(memory_bytes / (batch * n_heads * bytes_per_element)))")
    check = checks_by_id(grade_source("flops-memory", source))["max-seq-len-fits"]
    assert check["diagnosis"] == "max-seq-len-off-by-one"
    assert "do not fit" in check["message"] and "one byte short of T = 777" in check["message"]


def test_a_strict_comparison_misses_scores_that_fill_the_memory_exactly(grade_source):
    result = grade_source("flops-memory", SOLUTION.replace("** 2 * bytes_per_element <= memory_bytes",
                                                           "** 2 * bytes_per_element < memory_bytes"))
    check = checks_by_id(result)["max-seq-len-fits"]
    assert failed(result) == ["textbook-answers", "max-seq-len-fits"]
    assert check["diagnosis"] == "max-seq-len-off-by-one"
    assert "T + 1 fits too" in check["message"] and "exactly full" in check["message"]
