"""The roofline grader on solutions written the way learners write them (not via the bug oracles),
and the facts it relies on: the textbook numbers and FlopCounterMode's counts."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from conftest import checks_by_id
from graders.engine.manifest import find
from graders.practice import hints, plots
from graders.roofline import TEXTBOOK, attention, close, counted, ratio, tie, training_flops, wrong_bound
from reference import roofline as ref

SOLUTION = '''
SIZES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2,
         "fp8": 1, "float8": 1, "int8": 1, "int4": 0.5}


def dtype_bytes(dtype):
    if dtype not in SIZES:
        raise ValueError(f"unknown dtype {dtype}")
    return SIZES[dtype]


def decode_step(params, kv_bytes_per_token, T, B, hbm_bytes_per_s, flops_per_s, bytes_per_param=2):
    nbytes = params * bytes_per_param + B * T * kv_bytes_per_token
    flops = 2 * params * B
    t_mem, t_flop = nbytes / hbm_bytes_per_s, flops / flops_per_s
    return (t_flop, "compute") if t_flop > t_mem else (t_mem, "memory")


def attention_decode_intensity(n_heads, n_kv_heads, T, B, bytes_per_element=2):
    return 4 * n_heads * T * B / (2 * n_kv_heads * T * B * bytes_per_element)


def decode_intensity(B, T, n_heads, n_kv_heads, bytes_per_param=2, bytes_per_element=2):
    return 2 * B / bytes_per_param, attention_decode_intensity(n_heads, n_kv_heads, T, B, bytes_per_element)


def prefill_intensity(B, T, n_heads, n_kv_heads, bytes_per_param=2, bytes_per_element=2):
    flops = 4 * B * n_heads * T * T
    moved = 2 * B * T * (n_heads + n_kv_heads) * bytes_per_element
    return 2 * B * T / bytes_per_param, flops / moved


def crossover_batch(flops_per_s, hbm_bytes_per_s, bytes_per_param=2):
    return flops_per_s * bytes_per_param / (2 * hbm_bytes_per_s)


def train_flops_per_token(N, L, T, d):
    return 6 * N + 12 * L * T * d


def mfu(tokens_per_s, N, L, T, d, peak_flops_per_s):
    return tokens_per_s * train_flops_per_token(N, L, T, d) / peak_flops_per_s
'''


def failed(result):
    return [c["id"] for c in result["checks"] if c["status"] == "failed"]


def test_textbook_answers_are_the_references():
    for name, args, answer, case in TEXTBOOK:
        assert close(getattr(ref, name)(*args), answer), (name, args, case)


def test_the_palm_case_gives_the_papers_mfu():
    # PaLM (Chowdhery et al., 2022), Appendix B: 238.3K tokens/s on 6,144 TPU v4 chips of 275 TFLOP/s
    # is an MFU of 45.7 % without self-attention and 46.2 % with it, counting 6N + 12·L·H·Q·T with
    # N = 540·10⁹ (its total count), L = 118, T = 2,048 and H·Q = 48 heads × 256 (Table 1).
    N, L, T, d = next(args for name, args, _, case in TEXTBOOK if "PaLM" in case)
    peak = 6144 * 275e12
    assert (N, L, T) == (540 * 10**9, 118, 2048)
    assert round(100 * ref.mfu(238.3e3, N, L, T, 0, peak), 1) == 45.7
    assert round(100 * ref.mfu(238.3e3, N, L, T, d, peak), 1) == 46.2
    # head_dim taken as d_model / n_heads = 384 gives d_model, 48 × 384, which the paper does not count with
    assert round(100 * ref.mfu(238.3e3, N, L, T, 48 * 384, peak), 1) == 46.5


def test_decode_attention_does_2_flops_per_byte_element_for_each_query_row_sharing_it():
    # The rule the follow-ups state for decode attention: FLOPs per byte ≈ 2 × (query rows that use each cached
    # number) / bytes per element, whatever the batch. Counted in bf16.
    B, T, hd = 2, 64, 8
    for H, Hkv, k in [(8, 8, 1), (8, 2, 1), (8, 2, 4)]:   # MHA; GQA, n_rep = 4; GQA with 4 query tokens each
        q = torch.zeros(B, H, k, hd, dtype=torch.bfloat16)   # (B, H, k, hd)
        kv = torch.zeros(B, Hkv, T, hd, dtype=torch.bfloat16)   # (B, H_kv, T, hd)
        flops, _ = counted(attention, q, kv, kv)
        assert flops / (2 * kv.nbytes) == 2 * (H // Hkv) * k / 2 == k * ref.attention_decode_intensity(H, Hkv, T, B)
    # Absorbed MLA (DeepSeek-V3): 128 query heads use one cached 576-number latent as their key and its
    # first 512 numbers as their value.
    q = torch.zeros(B, 128, 1, 576, dtype=torch.bfloat16)   # (B, H, 1, 576)
    latent = torch.zeros(B, 1, T, 576, dtype=torch.bfloat16)   # (B, 1, T, 576)
    flops, _ = counted(attention, q, latent, latent[..., :512])
    assert round(flops / latent.nbytes) == 242   # 2 · 128 · (576 + 512) / (576 · 2)
    assert round(flops / latent.numel()) == 484   # an fp8 cache, 1 byte per number


def test_reference_intensities_equal_the_flop_counter():
    rng = np.random.default_rng(0)
    for H, Hkv, T, B in [(8, 2, 37, 3), (4, 4, 16, 1), (6, 1, 9, 5)]:
        q = torch.from_numpy(rng.standard_normal((B, H, 1, 8)))   # (B, H, 1, hd)
        k, v = (torch.from_numpy(rng.standard_normal((B, Hkv, T, 8))) for _ in "kv")   # (B, H_kv, T, hd)
        flops, _ = counted(attention, q, k, v)
        assert close(ref.attention_decode_intensity(H, Hkv, T, B, 8), flops / (k.nbytes + v.nbytes))
        q = torch.from_numpy(rng.standard_normal((B, H, T, 8)))   # (B, H, T, hd)
        flops, out = counted(attention, q, k, v)
        moved = q.nbytes + k.nbytes + v.nbytes + out.nbytes
        assert close(ref.prefill_intensity(B, T, H, Hkv, 2, 8)[1], flops / moved)


def test_reference_training_flops_equal_the_flop_counter():
    rng = np.random.default_rng(0)
    for L, T, d, H in [(3, 24, 32, 4), (2, 10, 48, 6)]:
        per_token, N = training_flops(rng, L, T, d, H)
        assert N == 12 * L * d * d
        assert ref.train_flops_per_token(N, L, T, d) == per_token


def test_the_fused_cpu_sdpa_kernel_counts_no_flops():
    # Why the grader writes attention out: a count of 0 would make every intensity 0.
    q = k = v = torch.randn(2, 4, 7, 12)
    with FlopCounterMode(display=False) as counter:
        F.scaled_dot_product_attention(q, k, v)
    assert counter.get_total_flops() == 0


def test_a_different_correct_solution_passes(grade_source):
    result = grade_source("roofline", SOLUTION, seed=5)
    assert result["status"] == "passed", [c["message"] for c in result["checks"] if c["status"] != "passed"]


def test_forgetting_the_cache_is_diagnosed(grade_source):
    result = grade_source("roofline", SOLUTION.replace("nbytes = params * bytes_per_param + B * T * kv_bytes_per_token",
                                                       "nbytes = params * bytes_per_param"))
    checks = checks_by_id(result)
    assert checks["decode-step-time"]["diagnosis"] == "kv-read-forgotten"
    assert "decode-step-time" in failed(result) and "weight-intensity" not in failed(result)


def test_one_token_for_the_cache_is_diagnosed(grade_source):
    result = grade_source("roofline", SOLUTION.replace("B * T * kv_bytes_per_token", "B * kv_bytes_per_token"))
    assert checks_by_id(result)["decode-step-time"]["diagnosis"] == "kv-one-token-for-cache"


def test_a_tie_called_compute_fails_only_the_bound(grade_source):
    result = grade_source("roofline", SOLUTION.replace("if t_flop > t_mem", "if t_flop >= t_mem"))
    assert failed(result) == ["decode-step-bound"]
    message = checks_by_id(result)["decode-step-bound"]["message"]
    assert "exactly as long" in message and "a tie" in message, message


def test_batching_attention_like_the_weights_is_diagnosed(grade_source):
    result = grade_source("roofline", SOLUTION.replace("/ (2 * n_kv_heads * T * B * bytes_per_element)",
                                                       "/ (2 * n_kv_heads * T * bytes_per_element)"))
    assert checks_by_id(result)["attention-decode-intensity"]["diagnosis"] == "batch-raises-attention-intensity"


def test_2n_is_diagnosed_and_mfu_follows_from_it(grade_source):
    result = grade_source("roofline", SOLUTION.replace("return 6 * N + 12", "return 2 * N + 12"))
    checks = checks_by_id(result)
    assert checks["train-flops-per-token"]["diagnosis"] == "train-2n"
    assert checks["mfu"].get("same_cause_as") == "train-flops-per-token"


@pytest.mark.parametrize("count", ["6 * N + 6 * L * T * d", "3 * (2 * N + 2 * L * T * d)"])
def test_attention_counted_once_is_diagnosed(grade_source, count):
    # One attention matmul of 2·T·d where Q @ Kᵀ and weights @ V are two: 17/18 of FlopCounterMode's count here.
    result = grade_source("roofline", SOLUTION.replace("return 6 * N + 12 * L * T * d", f"return {count}"))
    checks = checks_by_id(result)
    for check in ("textbook-answers", "train-flops-per-token"):
        assert checks[check]["diagnosis"] == "attention-flops-once", check
    assert checks["mfu"].get("same_cause_as") == "train-flops-per-token"
    assert result["diagnoses"] == ["attention-flops-once"]
    kata = find("roofline")   # the first hint is the one on attention's two matmuls, not task 1's
    choice = hints.choose(kata, set(), hints.failed_checks(result))
    assert "2 * T * d each" in kata.hints[choice.index].text


@pytest.mark.parametrize("count", ["3.0 * (2 * N + 4 * L * T * d)", "(6 * N + 12 * L * T * d) / 1"])
def test_a_float_count_is_refused(grade_source, count):
    # The README asks for an int compared exactly: a float holds a count exactly only below 2**53.
    result = grade_source("roofline", SOLUTION.replace("return 6 * N + 12 * L * T * d", f"return {count}"))
    assert failed(result) == ["textbook-answers", "train-flops-per-token"]
    message = checks_by_id(result)["train-flops-per-token"]["message"]
    assert "Return an int" in message and "float" in message


def test_a_crossover_rounded_up_says_how_far_off_not_a_ratio_of_1(grade_source):
    exact = "flops_per_s * bytes_per_param / (2 * hbm_bytes_per_s)"
    source = "import math\n" + SOLUTION.replace(f"return {exact}", f"return math.ceil({exact})")
    result = grade_source("roofline", source)
    assert failed(result) == ["textbook-answers", "crossover-batch"]
    for check in ("textbook-answers", "crossover-batch"):
        message = checks_by_id(result)[check]["message"]
        assert "296" in message and "times the right answer" not in message, message
        assert "0.26 % above" in message and "rounded" in message, message


def test_how_far_off_is_said_in_words_that_point_at_the_slip():
    assert ratio(235_008, 248_832) == " (17/18 of the right answer)"
    assert ratio(3 * 295.22, 295.22) == " (3 times the right answer)"
    assert ratio(1.012, 1.0) == " (1.2 % above the right answer)"
    assert ratio(295, 295.2238805970149) == (" (0.076 % below the right answer: 295.224 rounded down to a whole "
                                             "number, where the answer is not rounded)")


def test_a_wrong_bound_says_which_time_is_longer_or_that_they_tie():
    # The hidden check's crossover batch ties when the crossover is a whole number: it says so there too.
    tied, above = (10**9, 1000, 0, 100, 10, 1000, 2), (10**9, 1000, 0, 101, 10, 1000, 2)
    assert "exactly as long here, 2e+08 s each: a tie, which is \"memory\"" in tie(tied)
    assert tie(tied) in wrong_bound(tied)
    assert tie(above) == "" and "the FLOPs take longer than the bytes" in wrong_bound(above)
    assert tie((7_000_000_000, 524_288, 4096, 1, 3.35e12, 989e12)) == ""   # bytes_per_param left to its default


def test_int4_as_four_bytes_is_diagnosed(grade_source):
    result = grade_source("roofline", SOLUTION.replace('"int4": 0.5', '"int4": 4'))
    assert checks_by_id(result)["dtype-bytes"]["diagnosis"] == "bits-for-bytes"


def test_an_unknown_dtype_must_raise(grade_source):
    result = grade_source("roofline", SOLUTION.replace('raise ValueError(f"unknown dtype {dtype}")', "return 2"))
    assert failed(result) == ["dtype-bytes"]
    assert "must raise ValueError" in checks_by_id(result)["dtype-bytes"]["message"]


def test_a_step_that_returns_only_seconds_is_told_the_form(grade_source):
    result = grade_source("roofline", SOLUTION.replace('return (t_flop, "compute") if t_flop > t_mem else (t_mem, "memory")',
                                                       "return max(t_flop, t_mem)"))
    assert "returns a pair (seconds, bound)" in checks_by_id(result)["decode-step-time"]["message"]


def roofline_plot(tmp_path, zygotes, source):
    kata = find("roofline")
    path = tmp_path / kata.learner_file
    path.write_text(source, encoding="utf-8")
    return plots.compute(kata, "roofline", path, seed=0, device="cpu", zygote=zygotes(kata.framework))


def test_the_plot_shows_decode_weights_climbing_and_its_attention_flat(tmp_path, zygotes):
    data = roofline_plot(tmp_path, zygotes, SOLUTION)
    by = {(p["phase"], p["part"], p["B"]): p["intensity"] for p in data["points"]}
    for B in plots.ROOF_DECODE_B:
        assert by["decode", "weights", B] == pytest.approx(B)   # bf16: 2 FLOPs per 2-byte weight per sequence
        assert by["decode", "attention", B] == pytest.approx(2 * 32 / 8 / 2)   # n_rep = 4, whatever B
    for B in plots.ROOF_PREFILL_B:
        assert by["prefill", "weights", B] == pytest.approx(B * plots.ROOF_T)
    assert data["crossover"] == pytest.approx(989 / 3.35 / 1)   # bf16 weights: peak · 2 / (2 · bandwidth)
    empty, *cached = data["steps"]
    assert empty["T"] == 0
    assert [s["bound"] for s in empty["series"]] == ["compute" if B > data["crossover"] else "memory"
                                                      for B in data["step_B"]]
    assert empty["series"][0]["tokens_per_s"] == pytest.approx(3.35e12 / 16e9)   # one sequence: the weights' bytes
    assert all(s["bound"] == "memory" for c in cached for s in c["series"])   # each sequence reads its own cache


def test_the_plot_tells_a_wrong_form_and_writes_nothing(tmp_path, zygotes):
    source = SOLUTION.replace("return 2 * B / bytes_per_param, attention_decode_intensity(",
                              "return 2 * B / bytes_per_param + attention_decode_intensity(")
    with pytest.raises(plots.PlotFailed, match="must return a pair"):
        roofline_plot(tmp_path, zygotes, source)
