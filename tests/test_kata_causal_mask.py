"""What is specific to the causal-mask kata: the facts its README teaches, and the diagnoses and
messages for mistakes that have no bug oracle of their own."""
import torch
import torch.nn.functional as F

from conftest import checks_by_id
from graders.causal_mask import tolerances
from graders.engine import expect
from graders.engine.manifest import find
from reference.causal_mask import causal_mask, masked_attention, padding_mask

REFERENCE = find("causal-mask").reference_path.read_text()


def test_sdpa_is_causal_is_top_left_where_the_kata_is_bottom_right():
    q, k, v = torch.randn(2, 5, 4, dtype=torch.float64), torch.randn(2, 9, 4, dtype=torch.float64), \
        torch.randn(2, 9, 3, dtype=torch.float64)
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(top_left, F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 9).tril().bool()))
    assert not torch.allclose(top_left, masked_attention(q, k, v, causal_mask(5, 9))[0])


def test_sdpa_causal_lower_right_is_the_kata_mask():
    """The README names causal_lower_right as SDPA's bottom-right mask: it is causal_mask, shape for shape."""
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left

    q, k, v = torch.randn(2, 5, 4, dtype=torch.float64), torch.randn(2, 9, 4, dtype=torch.float64), \
        torch.randn(2, 9, 3, dtype=torch.float64)
    for n_queries, n_keys in ((5, 9), (1, 6), (4, 4)):
        assert torch.equal(causal_lower_right(n_queries, n_keys)._materialize(), causal_mask(n_queries, n_keys))
        assert torch.equal(causal_upper_left(n_queries, n_keys)._materialize(),
                           torch.ones(n_queries, n_keys, dtype=torch.bool).tril())
    assert torch.allclose(F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(5, 9)),
                          masked_attention(q, k, v, causal_mask(5, 9))[0])


def test_is_causal_with_an_attn_mask_raises_or_applies_both():
    """The README's warning: this torch either refuses is_causal=True with an attn_mask, as its
    documentation says, or silently applies both masks; it never applies one of them alone."""
    q, k, v = torch.randn(1, 4, 3, dtype=torch.float64), torch.randn(1, 6, 3, dtype=torch.float64), \
        torch.randn(1, 6, 2, dtype=torch.float64)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[:, 1] = False   # every query keeps key 0 under both masks: no empty row
    try:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    except RuntimeError:
        return
    both = mask & torch.ones(4, 6, dtype=torch.bool).tril()
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, attn_mask=both))
    for one in (mask, torch.ones(4, 6, dtype=torch.bool).tril()):
        assert not torch.allclose(out, F.scaled_dot_product_attention(q, k, v, attn_mask=one))


def test_reference_equals_sdpa_with_an_explicit_mask():
    q, k, v = torch.randn(2, 3, 4, 8, dtype=torch.float64), torch.randn(2, 3, 7, 8, dtype=torch.float64), \
        torch.randn(2, 3, 7, 5, dtype=torch.float64)
    mask = causal_mask(4, 7) & padding_mask(torch.tensor([7, 2]), 7)
    out, weights = masked_attention(q, k, v, mask)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3, 4, dtype=torch.float64))


def test_attention_reading_the_mha_convention_is_diagnosed_mask_inverted(grade_source):
    source = REFERENCE + (
        "def masked_attention(q, k, v, mask=None):\n"
        "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))\n"
        "    if mask is not None:\n"
        "        scores = scores.masked_fill(mask, float('-inf'))\n"
        "    weights = torch.softmax(scores, dim=-1)\n"
        "    if mask is not None:\n"
        "        weights = weights.masked_fill(mask.all(dim=-1, keepdim=True), 0.0)\n"
        "    return weights @ v, weights\n")
    result = grade_source("causal-mask", source)
    assert checks_by_id(result)["matches-sdpa-and-reference"]["diagnosis"] == "mask-inverted"
    assert result["diagnoses"] == ["mask-inverted"]


def test_a_float_mask_is_refused_with_the_reason(grade_source):
    source = REFERENCE + (
        "def causal_mask(n_queries, n_keys=None, device=None):\n"
        "    n_keys = n_queries if n_keys is None else n_keys\n"
        "    return torch.ones(n_queries, n_keys, device=device).tril(n_keys - n_queries)\n")
    result = grade_source("causal-mask", source)
    message = checks_by_id(result)["masks-are-bool"]["message"]
    assert "added to the scores" in message and "got: torch.float32" in message
    assert checks_by_id(result)["padding-mask-values"]["status"] == "passed"


LARGE_NEGATIVE = REFERENCE + (
    "def masked_attention(q, k, v, mask=None):\n"
    "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))\n"
    "    if mask is not None:\n"
    "        scores = scores.masked_fill(~mask, -1e9)\n"
    "    weights = torch.softmax(scores, dim=-1)\n"
    "    return weights @ v, weights\n")

# Llama's and Hugging Face's habit: the softmax in float32, cast back to the inputs' dtype.
FLOAT32_SOFTMAX = REFERENCE.replace("weights = torch.softmax(scores, dim=-1)",
                                    "weights = torch.softmax(scores.float(), dim=-1).type_as(q)")


def test_large_negative_instead_of_minus_inf_fails_only_fully_masked_rows(grade_source):
    result = grade_source("causal-mask", LARGE_NEGATIVE)
    failed = [c["id"] for c in result["checks"] if c["status"] != "passed"]
    assert failed == ["fully-masked-rows-are-zero"]
    check = checks_by_id(result)["fully-masked-rows-are-zero"]
    assert "must be all zero" in check["message"] and check["diagnosis"] == "masked-row-uniform"
    assert result["diagnoses"] == ["masked-row-uniform"]


def test_hugging_face_finfo_min_fill_is_masked_row_uniform(grade_source):
    source = LARGE_NEGATIVE.replace("-1e9", "torch.finfo(scores.dtype).min")
    result = grade_source("causal-mask", source, seed=3)
    assert [c["id"] for c in result["checks"] if c["status"] != "passed"] == ["fully-masked-rows-are-zero"]
    assert result["diagnoses"] == ["masked-row-uniform"]
    # With the softmax in float32 as well, float64's finfo.min rounds to -inf: the row is NaN, and named so.
    source = source.replace("torch.softmax(scores, dim=-1)",
                            "torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)")
    assert grade_source("causal-mask", source, seed=3)["diagnoses"] == ["nan-on-fully-masked-row"]


def test_a_float32_softmax_inside_gets_full_marks_with_a_note(grade_source):
    assert FLOAT32_SOFTMAX != REFERENCE
    for seed in (1, 2):
        result = grade_source("causal-mask", FLOAT32_SOFTMAX, seed=seed)
        assert result["score"] == result["max_score"], [c["message"] for c in result["checks"] if c["status"] != "passed"]
        notes = checks_by_id(result)["matches-sdpa-and-reference"]["notes"]
        assert "float32-inside" in str(notes)


def test_float64_tolerance_alone_refuses_a_float32_softmax():
    """Without the float32-inside tolerance the Llama habit would fail: the note is not for nothing."""
    q, k, v = (torch.randn(2, 3, 6, 4, dtype=torch.float64) for _ in range(3))
    mask = causal_mask(6)
    expected = masked_attention(q, k, v, mask)[0]
    scores = (q @ k.transpose(-2, -1) / 2).masked_fill(~mask, float("-inf"))
    got = torch.softmax(scores.float(), dim=-1).type_as(q) @ v
    tol, loose = tolerances(find("causal-mask"), q.dtype)
    assert expect.mismatch(got, expected, **tol) is not None
    assert expect.mismatch(got, expected, **loose) is None


def test_causality_and_banned_api_judge_only_their_property(grade_source):
    wrong_scale = REFERENCE.replace("/ math.sqrt(q.size(-1))", "/ q.size(-1)")
    assert wrong_scale != REFERENCE
    checks = checks_by_id(grade_source("causal-mask", wrong_scale))
    for check in ("future-perturbation-leaves-past-unchanged", "banned-api"):
        assert checks[check]["status"] == "passed", check
    assert checks["matches-sdpa-and-reference"]["status"] == "failed"


def test_a_leak_of_the_future_is_named(grade_source):
    source = REFERENCE + (
        "def causal_mask(n_queries, n_keys=None, device=None):\n"
        "    n_keys = n_queries if n_keys is None else n_keys\n"
        "    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).triu(n_keys - n_queries + 1)\n")
    check = checks_by_id(grade_source("causal-mask", source))["future-perturbation-leaves-past-unchanged"]
    assert "lets a query see the future" in check["message"] and check["diagnosis"] == "mask-inverted"


def test_an_output_that_ignores_its_inputs_earns_no_causality(grade_source):
    source = REFERENCE + (
        "def masked_attention(q, k, v, mask=None):\n"
        "    weights = torch.zeros(*q.shape[:-1], k.shape[-2], dtype=q.dtype)\n"
        "    return weights @ v, weights\n")
    check = checks_by_id(grade_source("causal-mask", source))["future-perturbation-leaves-past-unchanged"]
    assert check["status"] == "failed" and "does not depend on q, k and v" in check["message"]
