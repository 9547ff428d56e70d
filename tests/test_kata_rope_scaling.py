"""What is specific to the rope-scaling kata: the facts its README teaches, the grader's
independent expectations, and each check's failure path on files written the way learners write
them (not via the bug oracles), and the plot's data."""
import math

import numpy as np
import pytest
import torch

from conftest import checks_by_id
from graders.engine.manifest import find
from graders.practice import plots
from reference import rope_scaling as R
from reference import rope_scaling_expected as E

REFERENCE = find("rope-scaling").reference_path.read_text()


def replaced(old, new):
    source = REFERENCE.replace(old, new)
    assert source != REFERENCE, old
    return source


def failed(result):
    return {c["id"] for c in result["checks"] if c["status"] != "passed"}


# --- the facts the README teaches, and the grader's own expectations ---------------------------

def test_llama_31_keeps_29_pairs_blends_6_and_divides_29():
    theta = R.rope_inv_freq(128, 500000.0)
    ratio = R.llama3_inv_freq(128, 500000.0, 8.0, 8192) / theta
    assert int((ratio == 1).sum()) == 29 and int((ratio == 1 / 8).sum()) == 29
    assert ((ratio > 1 / 8) & (ratio < 1)).sum() == 6
    wavelength = 2 * math.pi / theta
    assert (ratio[wavelength < 2048] == 1).all() and (ratio[wavelength > 8192] == 1 / 8).all()


def test_ntk_keeps_pair_0_and_divides_the_last_by_exactly_the_factor():
    for hd, base, s in ((128, 10000.0, 8.0), (64, 500000.0, 4.0)):
        ratio = R.ntk_inv_freq(hd, base, s) / R.rope_inv_freq(hd, base)
        assert ratio[0] == 1 and ratio[-1] == pytest.approx(1 / s, rel=1e-12)
        assert (ratio[1:] < ratio[:-1]).all()


def test_yarn_keeps_pairs_above_beta_fast_turns_and_divides_those_below_beta_slow():
    hd, base, s, L = 128, 10000.0, 16.0, 4096
    theta = R.rope_inv_freq(hd, base)
    ratio = R.yarn_inv_freq(hd, base, s, L) / theta
    turns = L * theta / (2 * math.pi)
    assert (ratio[turns > 32] == 1).all() and torch.allclose(ratio[turns < 1], torch.full_like(ratio[turns < 1], 1 / s))
    assert R.yarn_attention_factor(16.0) == pytest.approx(0.1 * math.log(16) + 1)
    assert R.yarn_attention_factor(1.0) == 1.0


def test_the_expectations_agree_with_the_reference():
    for hd, base, s, L in ((128, 10000.0, 16.0, 4096), (64, 1e6, 40.0, 32768), (16, 500.0, 3.0, 64)):
        torch.testing.assert_close(E.yarn(hd, base, s, L), R.yarn_inv_freq(hd, base, s, L), rtol=1e-13, atol=0)
        torch.testing.assert_close(E.apply_scaling(hd, base, s, L), R.llama3_inv_freq(hd, base, s, L),
                                   rtol=1e-13, atol=0)
    positions = torch.tensor([0, 5, 4097, 70])
    for scaling in ({"rope_type": "linear", "factor": 4.0}, {"rope_type": "ntk", "factor": 2.0}, None):
        for got, want in zip(R.scaled_rope(positions, 16, 10000.0, scaling, torch.float64),
                             E.cos_sin(positions, 16, 10000.0, scaling, torch.float64)):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    q, k, v = (torch.randn(2, 2, 5, 8, dtype=torch.float64) for _ in range(3))
    cos, sin = R.scaled_rope(torch.arange(100, 105), 8, dtype=torch.float64)
    torch.testing.assert_close(R.rope_attention(q, k, v, cos, sin, 1.3), E.attention(q, k, v, cos, sin, 1.3))


def test_folding_the_factor_into_cos_and_sin_is_the_same_attention():
    """The README's and a follow-up's claim: Hugging Face's attention_scaling on cos and sin."""
    q, k, v = (torch.randn(1, 2, 6, 8, dtype=torch.float64) for _ in range(3))
    cos, sin = R.scaled_rope(torch.arange(6), 8, dtype=torch.float64)
    m = R.yarn_attention_factor(32.0)
    torch.testing.assert_close(R.rope_attention(q, k, v, cos * m, sin * m), R.rope_attention(q, k, v, cos, sin, m))


# --- correct solutions the grader must not refuse -----------------------------------------------

def test_the_papers_ramp_in_turns_passes_the_bands_and_loses_only_the_yarn_values(grade_source):
    """The README's claim: YaRN's γ(r), linear in the turns r, keeps the bands; the values are the code's."""
    source = REFERENCE + '''

def yarn_inv_freq(head_dim, base, factor, original_max_len, beta_fast=32.0, beta_slow=1.0):
    theta = rope_inv_freq(head_dim, base)
    r = original_max_len * theta / (2 * math.pi)
    gamma = ((r - beta_slow) / (beta_fast - beta_slow)).clamp(0, 1)
    return (1 - gamma) * theta / factor + gamma * theta
'''
    result = grade_source("rope-scaling", source)
    assert failed(result) == {"yarn-inv-freq-values", "scaled-rope-cos-sin", "yarn-at-fresh-configurations"}
    assert result["diagnoses"] == []


# --- each check's failure path ------------------------------------------------------------------

MISTAKES = {
    "scale-on-positions-and-frequencies": (
        "    # The positions are not scaled: each method's scaling lives in its frequencies alone.\n",
        "    if kind != 'default':\n        positions = positions / s['factor']\n"),
    "yarn-ramp-reversed": (
        "    return theta * (1 - ramp) + theta / factor * ramp   #",
        "    return theta * ramp + theta / factor * (1 - ramp)   #"),
    "temperature-on-values": (
        "    att = (q @ k.transpose(-2, -1)) * (attention_factor ** 2 / math.sqrt(hd))",
        "    v = v * attention_factor ** 2\n    att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)"),
    "llama3-bounds-swapped": (
        "    short = wavelength < original_max_len / high_freq_factor",
        "    short = wavelength < original_max_len / low_freq_factor"),
}


@pytest.mark.parametrize("code", MISTAKES)
def test_each_mistake_gets_its_diagnosis(grade_source, code):
    result = grade_source("rope-scaling", replaced(*MISTAKES[code]))
    assert result["status"] == "failed"
    assert result["diagnoses"] == [code]


def test_rotate_half_where_pairs_are_interleaved_is_named_as_in_the_rope_kata(grade_source):
    """Hugging Face's rotate_half with the angles repeated over the two halves: correct RoPE in the
    other layout, the shared mistake rope-half-vs-interleaved."""
    source = replaced("""    x0, x1 = x[..., 0::2], x[..., 1::2]   # (B, H, T, hd/2) each
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)   # (B, H, T, hd)""",
                      """    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin""")
    for seed in (1, 2, 3):
        result = grade_source("rope-scaling", source, seed=seed)
        assert failed(result) == {"rope-attention-values", "rope-attention-at-fresh-shapes"}
        assert checks_by_id(result)["rope-attention-values"]["diagnosis"] == "rope-half-vs-interleaved"
        assert result["diagnoses"] == ["rope-half-vs-interleaved"]


def test_the_attention_factor_once_on_the_logits_fails_the_temperature_without_a_diagnosis(grade_source):
    source = replaced("* (attention_factor ** 2 / math.sqrt(hd))", "* (attention_factor / math.sqrt(hd))")
    result = grade_source("rope-scaling", source)
    assert failed(result) == {"rope-attention-values", "temperature-scales-the-logits",
                              "rope-attention-at-fresh-shapes"}
    checks = checks_by_id(result)
    # no mistake named in either: the later check keeps its own report, not a guessed cause
    assert "same_cause_as" not in checks["temperature-scales-the-logits"]
    assert "also failed: `rope-attention-values`" in checks["temperature-scales-the-logits"]["message"]
    assert result["diagnoses"] == []


def test_float32_frequencies_and_a_tensor_factor_are_refused_with_the_reason(grade_source):
    source = replaced("return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)",
                      "return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)")
    check = checks_by_id(grade_source("rope-scaling", source))["rope-inv-freq-values"]
    assert check["status"] == "failed" and "dtype" in check["message"]
    source = replaced("return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0",
                      "return torch.tensor(0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)")
    check = checks_by_id(grade_source("rope-scaling", source))["yarn-attention-factor-values"]
    assert check["status"] == "failed" and "Python float" in check["message"]


def test_a_silent_default_for_an_unknown_rope_type_fails_that_check_alone(grade_source):
    source = replaced('raise ValueError(f"unknown rope_type {kind!r}: expected default, linear, ntk, yarn or llama3")',
                      "inv_freq = rope_inv_freq(head_dim, base)")
    result = grade_source("rope-scaling", source)
    assert failed(result) == {"unknown-rope-type-refused"}
    assert "silent default" in checks_by_id(result)["unknown-rope-type-refused"]["message"]


LEGACY_KEY_READ = """    kind = s.get("rope_type", s.get("type"))
    if kind is None:
        raise ValueError(f"rope_scaling {s!r} names no method: give its rope_type (or the legacy key type)")
"""


def test_the_legacy_key_type_is_read_and_a_dict_naming_no_method_refused(grade_source):
    """DeepSeek-V3's entry says "type": "yarn": reading rope_type alone fails on it, and on a dict naming
    no method; falling back to plain RoPE there, as Hugging Face does, fails the refusal alone."""
    result = grade_source("rope-scaling", replaced(LEGACY_KEY_READ, '    kind = s["rope_type"]\n'))
    assert failed(result) == {"scaled-rope-cos-sin", "unknown-rope-type-refused"}
    checks = checks_by_id(result)
    assert "KeyError" in checks["scaled-rope-cos-sin"]["message"]
    assert "legacy" in checks["scaled-rope-cos-sin"]["message"]
    assert "without rope_type or type" in checks["unknown-rope-type-refused"]["message"]
    result = grade_source("rope-scaling", replaced(LEGACY_KEY_READ,
                                                   '    kind = s.get("rope_type", s.get("type", "default"))\n'))
    assert failed(result) == {"unknown-rope-type-refused"}
    assert "names no method came back" in checks_by_id(result)["unknown-rope-type-refused"]["message"]


def test_the_temperature_folded_into_cos_and_sin_fails_only_scaled_rope(grade_source):
    """Hugging Face's attention_scaling inside scaled_rope: the README asks for a pure rotation."""
    source = replaced("    return angle.cos().to(dtype), angle.sin().to(dtype)   # (T, hd/2) each",
                      "    m = yarn_attention_factor(s['factor']) if kind == 'yarn' else 1.0\n"
                      "    return (angle.cos() * m).to(dtype), (angle.sin() * m).to(dtype)")
    result = grade_source("rope-scaling", source)
    assert failed(result) == {"scaled-rope-cos-sin"}


def test_an_exception_and_a_nan_fail_their_checks_and_leave_the_others(grade_source):
    source = REFERENCE + "\ndef ntk_inv_freq(head_dim, base, factor):\n    raise RuntimeError('not yet')\n"
    checks = checks_by_id(grade_source("rope-scaling", source))
    ntk = checks["ntk-inv-freq-values"]
    assert ntk["status"] == "failed" and "RuntimeError" in ntk["message"]
    assert checks["yarn-inv-freq-values"]["status"] == "passed"
    assert checks["rope-attention-values"]["status"] == "passed"
    source = replaced("    return att @ v   # (B, H, T, hd)", "    return (att @ v) * float('nan')")
    check = checks_by_id(grade_source("rope-scaling", source))["rope-attention-values"]
    assert check["status"] == "failed" and "nan" in check["message"].lower()


def test_the_plot_shows_each_methods_frequencies(tmp_path, zygotes):
    kata = find("rope-scaling")
    learner_file = tmp_path / kata.learner_file
    learner_file.write_text(REFERENCE)
    data = plots.compute(kata, "frequencies", learner_file, seed=0, device="cpu", zygote=zygotes(kata.framework))
    curves = {c["label"]: np.asarray(c["freq"]) for c in data["curves"]}
    theta = curves["RoPE (unscaled)"]
    np.testing.assert_allclose(curves["Position Interpolation"], theta / 8)
    np.testing.assert_allclose(curves["Llama 3.1"], R.llama3_inv_freq(128, 500000.0, 8.0, 8192).numpy())
    assert curves["YaRN"][0] == theta[0] and curves["NTK-aware"][0] == theta[0]
