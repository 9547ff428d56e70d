"""What is specific to the causal-mask kata: the facts its README teaches, and the diagnoses and
messages for mistakes that have no bug oracle of their own."""
import torch
import torch.nn.functional as F

from conftest import checks_by_id
from graders.engine.manifest import find
from reference.causal_mask import causal_mask, masked_attention, padding_mask

REFERENCE = find("causal-mask").reference_path.read_text()


def test_sdpa_is_causal_is_top_left_where_the_kata_is_bottom_right():
    q, k, v = torch.randn(2, 5, 4, dtype=torch.float64), torch.randn(2, 9, 4, dtype=torch.float64), \
        torch.randn(2, 9, 3, dtype=torch.float64)
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(top_left, F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 9).tril().bool()))
    assert not torch.allclose(top_left, masked_attention(q, k, v, causal_mask(5, 9))[0])


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


def test_large_negative_instead_of_minus_inf_fails_only_fully_masked_rows(grade_source):
    source = REFERENCE + (
        "def masked_attention(q, k, v, mask=None):\n"
        "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))\n"
        "    if mask is not None:\n"
        "        scores = scores.masked_fill(~mask, -1e9)\n"
        "    weights = torch.softmax(scores, dim=-1)\n"
        "    return weights @ v, weights\n")
    result = grade_source("causal-mask", source)
    failed = [c["id"] for c in result["checks"] if c["status"] != "passed"]
    assert failed == ["fully-masked-rows-are-zero"]
    assert "must be all zero" in checks_by_id(result)["fully-masked-rows-are-zero"]["message"]
