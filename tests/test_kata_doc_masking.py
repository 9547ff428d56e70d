"""What is specific to the doc-masking kata: the facts its README teaches, and the diagnoses and
messages for mistakes that have no bug oracle of their own, and the plot's data."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import checks_by_id
from graders.engine.manifest import find
from graders.practice import plots
from reference.doc_masking import document_ids, document_mask, packed_attention, position_ids, prefix_lm_mask

REFERENCE = find("doc-masking").reference_path.read_text()
ROW = torch.tensor([0, 3, 7, 8], dtype=torch.int32)


def test_the_readme_row():
    """The README's drawing of cu_seqlens = [0, 3, 7, 8] and prefix_lens = [2, 3, 1]."""
    assert document_ids(ROW).tolist() == [0, 0, 0, 1, 1, 1, 1, 2]
    assert position_ids(ROW).tolist() == [0, 1, 2, 0, 1, 2, 3, 0]
    assert torch.equal(document_mask(ROW), torch.block_diag(*[torch.ones(n, n, dtype=torch.bool).tril()
                                                               for n in (3, 4, 1)]))
    mask = prefix_lm_mask(ROW, torch.tensor([2, 3, 1]))
    assert mask[0, 1] and mask[3, 5] and not mask[2, 3] and not mask[6, 7] and not mask[3, 6]


def test_a_plain_causal_mask_leaks_across_documents():
    """The first follow-up's point: the causal mask over the row lets document 1 see document 0."""
    q, k, v = (torch.randn(2, 8, 4, dtype=torch.float64) for _ in range(3))
    leaky = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    alone = F.scaled_dot_product_attention(q[:, 3:7], k[:, 3:7], v[:, 3:7], is_causal=True)
    assert torch.allclose(packed_attention(q, k, v, ROW)[:, 3:7], alone)
    assert not torch.allclose(leaky[:, 3:7], alone)
    assert torch.allclose(leaky[:, :3], packed_attention(q, k, v, ROW)[:, :3])   # nothing before document 0


def test_rope_scores_do_not_see_a_shift_of_every_position():
    """rope-positions-not-reset: RoPE scores depend only on m - n, so positions not reset change
    nothing in one document's scores (up to rounding)."""
    from reference.rope import apply_rope, rope_cache

    q, k = torch.randn(1, 1, 5, 8, dtype=torch.float64), torch.randn(1, 1, 5, 8, dtype=torch.float64)
    cos, sin = rope_cache(64, 8, dtype=torch.float64)
    scores = [apply_rope(q, cos, sin, torch.arange(s, s + 5)) @ apply_rope(k, cos, sin, torch.arange(s, s + 5)).mT
              for s in (0, 37)]
    assert torch.allclose(scores[0], scores[1])


def test_searchsorted_without_right_is_the_boundary_bug():
    """The hint's claim: searchsorted needs right=True, or a document's first token goes to the one before."""
    tokens = torch.arange(8, dtype=torch.int32)
    assert torch.equal(torch.searchsorted(ROW[1:], tokens, right=True), document_ids(ROW))
    assert torch.searchsorted(ROW[1:], tokens)[3] == 0


def test_int32_positions_are_refused_with_the_dtype(grade_source):
    source = REFERENCE + (
        "def position_ids(cu_seqlens):\n"
        "    docs = document_ids(cu_seqlens)\n"
        "    return torch.arange(len(docs), dtype=torch.int32) - cu_seqlens[docs]\n")
    result = grade_source("doc-masking", source)
    check = checks_by_id(result)["position-ids-restart"]
    assert check["status"] == "failed" and "dtype" in check["message"]


def test_a_wrong_scale_still_keeps_documents_apart(grade_source):
    """The hidden check judges only its property: a packed attention with 1/d keeps its documents apart."""
    source = REFERENCE.replace("/ math.sqrt(q.size(-1))", "/ q.size(-1)")
    assert source != REFERENCE
    result = grade_source("doc-masking", source)
    checks = checks_by_id(result)
    assert checks["packed-equals-per-document"]["status"] == "failed"
    assert checks["other-documents-do-not-matter"]["status"] == "passed"


# One hand-written mistake per diagnosis, each in a single function of an otherwise right file.
MISTAKES = {
    "documents-see-each-other": (
        "def document_mask(cu_seqlens):\n"
        "    T = int(cu_seqlens[-1])\n"
        "    return torch.ones(T, T, dtype=torch.bool, device=cu_seqlens.device).tril()\n"),
    "positions-not-reset": (
        "def position_ids(cu_seqlens):\n"
        "    return torch.arange(int(cu_seqlens[-1]), device=cu_seqlens.device)\n"),
    "position-off-by-one": (
        "def position_ids(cu_seqlens):\n"
        "    docs = document_ids(cu_seqlens)\n"
        "    return torch.arange(1, len(docs) + 1, device=cu_seqlens.device) - cu_seqlens.long()[docs]\n"),
    "causal-over-prefix": (
        "def prefix_lm_mask(cu_seqlens, prefix_lens):\n"
        "    return document_mask(cu_seqlens)\n"),
    "boundary-off-by-one": (
        "def document_ids(cu_seqlens):\n"
        "    tokens = torch.arange(int(cu_seqlens[-1]), device=cu_seqlens.device)\n"
        "    return torch.searchsorted(cu_seqlens[1:].long(), tokens)\n"),
    "no-scaling": (
        "def packed_attention(q, k, v, cu_seqlens, prefix_lens=None):\n"
        "    mask = document_mask(cu_seqlens) if prefix_lens is None else prefix_lm_mask(cu_seqlens, prefix_lens)\n"
        "    scores = (q @ k.transpose(-2, -1)).masked_fill(~mask, float('-inf'))\n"
        "    return torch.softmax(scores, dim=-1) @ v\n"),
    "double-scale": (
        "def packed_attention(q, k, v, cu_seqlens, prefix_lens=None):\n"
        "    mask = document_mask(cu_seqlens) if prefix_lens is None else prefix_lm_mask(cu_seqlens, prefix_lens)\n"
        "    q = q / math.sqrt(q.size(-1))\n"
        "    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(~mask, float('-inf'))\n"
        "    return torch.softmax(scores, dim=-1) @ v\n"),
    "softmax-wrong-dim": (
        "def packed_attention(q, k, v, cu_seqlens, prefix_lens=None):\n"
        "    mask = document_mask(cu_seqlens) if prefix_lens is None else prefix_lm_mask(cu_seqlens, prefix_lens)\n"
        "    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(~mask, float('-inf'))\n"
        "    return torch.softmax(scores, dim=-2) @ v\n"),
    "banned-api": (
        "import torch.nn.functional as F\n"
        "def packed_attention(q, k, v, cu_seqlens, prefix_lens=None):\n"
        "    mask = document_mask(cu_seqlens) if prefix_lens is None else prefix_lm_mask(cu_seqlens, prefix_lens)\n"
        "    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)\n"),
    "tampering": "import inspect\n",
}


@pytest.mark.parametrize("code", MISTAKES)
def test_each_mistake_gets_its_diagnosis(grade_source, code):
    result = grade_source("doc-masking", REFERENCE + MISTAKES[code])
    assert result["status"] == "failed"
    assert result["diagnoses"] == [code]


def test_an_exception_fails_its_checks_and_leaves_the_others(grade_source):
    source = REFERENCE + "def prefix_lm_mask(cu_seqlens, prefix_lens):\n    raise ValueError('not yet')\n"
    checks = checks_by_id(grade_source("doc-masking", source))
    assert "ValueError" in checks["prefix-lm-mask-values"]["message"]
    assert checks["prefix-lm-mask-values"]["status"] == "failed"
    for passing in ("document-ids-values", "position-ids-restart", "document-mask-block-diagonal-causal",
                    "packed-equals-per-document"):
        assert checks[passing]["status"] == "passed", passing


def test_a_nan_output_is_refused(grade_source):
    source = REFERENCE.replace("return weights @ v   #", "return (weights @ v) * float('nan')   #")
    assert source != REFERENCE
    check = checks_by_id(grade_source("doc-masking", source))["packed-equals-per-document"]
    assert check["status"] == "failed" and "nan" in check["message"].lower()


def test_a_mask_with_a_batch_axis_and_a_float_mask_are_refused_with_the_reason(grade_source):
    batched = REFERENCE + ("_document_mask = document_mask\n"
                           "def document_mask(cu_seqlens):\n"
                           "    return _document_mask(cu_seqlens)[None]\n")
    check = checks_by_id(grade_source("doc-masking", batched))["document-mask-block-diagonal-causal"]
    assert check["status"] == "failed" and "shape" in check["message"]
    floats = REFERENCE.replace("return same_doc & causal   # (T, T)", "return (same_doc & causal).float()   # (T, T)")
    assert floats != REFERENCE
    check = checks_by_id(grade_source("doc-masking", floats))["masks-are-bool-on-device"]
    assert check["status"] == "failed" and "added to the scores" in check["message"]


def test_the_plot_shows_the_block_diagonal_masks_and_positions_that_restart(tmp_path, zygotes):
    kata = find("doc-masking")
    learner_file = tmp_path / kata.learner_file
    learner_file.write_text(REFERENCE)
    data = plots.compute(kata, "documents", learner_file, seed=0, device="cpu", zygote=zygotes(kata.framework))
    cu_seqlens = torch.tensor(data["cu_seqlens"])
    doc, prefix = (torch.from_numpy(np.asarray(panel["mask"])) for panel in data["panels"])
    assert torch.equal(doc, document_mask(cu_seqlens))
    assert torch.equal(prefix, prefix_lm_mask(cu_seqlens, torch.tensor(data["prefix_lens"])))
    assert (prefix & ~doc).any() and not (doc & ~prefix).any()   # the prefix only adds keys
    assert data["position_ids"] == position_ids(cu_seqlens).tolist()
    assert data["document_ids"] == document_ids(cu_seqlens).tolist()


def test_masks_built_on_wrong_document_ids_blame_the_ids(grade_source):
    """document_ids that mark each document's start and count the marks (Hugging Face's packing
    collators) lose the empty documents: every later document takes the id of the one before, and
    a prefix-LM mask that reads prefix_lens[ids] gets another document's prefix. The mask checks
    must say the ids are wrong, not name a mask bug whose mask happens to be the same."""
    source = REFERENCE + (
        "def document_ids(cu_seqlens):\n"
        "    T = int(cu_seqlens[-1])\n"
        "    starts = torch.zeros(T, dtype=torch.long, device=cu_seqlens.device)\n"
        "    starts[cu_seqlens[1:-1].long()] = 1\n"
        "    return starts.cumsum(0)\n")
    result = grade_source("doc-masking", source)
    checks = checks_by_id(result)
    assert checks["document-ids-values"]["status"] == "failed"
    check = checks["prefix-lm-mask-values"]
    assert check["status"] == "failed" and check["diagnosis"] is None
    assert "document_ids" in check["message"]
    assert "causal-over-prefix" not in result["diagnoses"]
