"""The flash-tiling grader on solutions written the way learners write them (not via the bug
oracles), one failure path per check, its independent oracles (SDPA with the bottom-right mask,
torch.logsumexp) and the tile counter it reads recorded products with."""
import numpy as np
import pytest
import torch

from conftest import checks_by_id
from graders.engine.worker import _recorder
from graders.engine.products import product
from graders.flash_tiling import SKIP_CASES, inputs, logsumexp, score_entries, sdpa, tiles_needed, trusted_entries
from reference.flash_tiling import flash_attention

# torch.split into tiles and zip over them, einsum for both products, the running statistics
# kept with keepdim, the mask from torch.triu with a diagonal offset.
SPLIT = '''
import math
import torch


def flash_attention(q, k, v, block_q=64, block_k=64, causal=False):
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be positive, got {block_q} and {block_k}")
    Tq, Tk = q.shape[-2], k.shape[-2]
    if causal and Tq > Tk:
        raise ValueError(f"causal attention needs Tq <= Tk, got {Tq} > {Tk}")
    offset = Tk - Tq
    outs, lses = [], []
    for i, q_blk in enumerate(torch.split(q / math.sqrt(q.shape[-1]), block_q, dim=-2)):
        i0 = i * block_q
        last = offset + i0 + q_blk.shape[-2] - 1
        m = torch.full(q_blk.shape[:-1] + (1,), -math.inf, dtype=q.dtype, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros_like(q_blk)
        for j, (k_blk, v_blk) in enumerate(zip(torch.split(k, block_k, dim=-2), torch.split(v, block_k, dim=-2))):
            j0 = j * block_k
            if causal and j0 > last:
                break
            s = torch.einsum("...qd,...kd->...qk", q_blk, k_blk)
            if causal:
                hidden = torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).triu(offset + i0 - j0 + 1)
                s = s.masked_fill(hidden, -math.inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            r = torch.exp(m - m_new)
            l = r * l + p.sum(-1, keepdim=True)
            acc = r * acc + torch.einsum("...qk,...kd->...qd", p, v_blk)
            m = m_new
        outs.append(acc / l)
        lses.append((m + torch.log(l)).squeeze(-1))
    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)
'''

# One query row at a time against key tiles (block_q unused): the statistics are (B, H) tensors.
ROWS = '''
import math
import torch


def flash_attention(q, k, v, block_q=64, block_k=64, causal=False):
    assert block_q >= 1 and block_k >= 1, "block_q and block_k must be >= 1"
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    assert not causal or Tq <= Tk, "causal attention with more queries than keys"
    out = torch.zeros_like(q)
    lse = torch.zeros(B, H, Tq, dtype=q.dtype, device=q.device)
    for i in range(Tq):
        qi = q[:, :, i:i + 1] * D ** -0.5
        end = Tk - Tq + i + 1 if causal else Tk
        m = torch.full((B, H, 1), -math.inf, dtype=q.dtype, device=q.device)
        l = torch.zeros(B, H, 1, dtype=q.dtype, device=q.device)
        o = torch.zeros(B, H, 1, D, dtype=q.dtype, device=q.device)
        for j in range(0, end, block_k):
            s = torch.matmul(qi, k[:, :, j:min(j + block_k, end)].transpose(2, 3))
            m2 = torch.maximum(m, s.max(-1).values)
            p = torch.exp(s - m2[..., None])
            l = torch.exp(m - m2) * l + p.sum(-1)
            o = torch.exp(m - m2)[..., None] * o + torch.matmul(p, v[:, :, j:min(j + block_k, end)])
            m = m2
        out[:, :, i:i + 1] = o / l[..., None]
        lse[:, :, i] = (m + torch.log(l))[..., 0]
    return out, lse
'''


# The reference's loops as while loops, and no argument checks: with block_q = 0 the query loop
# never moves on (range() would have raised ValueError by itself).
WHILE = '''
import math
import torch


def flash_attention(q, k, v, block_q=64, block_k=64, causal=False):
    B, H, Tq, hd = q.shape
    Tk = k.shape[-2]
    offset = Tk - Tq
    out, lse = torch.empty_like(q), q.new_empty(B, H, Tq)
    i0 = 0
    while i0 < Tq:
        i1 = min(i0 + block_q, Tq)
        qi = q[:, :, i0:i1] / math.sqrt(hd)
        m = q.new_full((B, H, i1 - i0), -math.inf)
        l, acc = q.new_zeros(B, H, i1 - i0), q.new_zeros(B, H, i1 - i0, hd)
        end = offset + i1 if causal else Tk
        j0 = 0
        while j0 < end:
            j1 = min(j0 + block_k, Tk)
            s = qi @ k[:, :, j0:j1].transpose(-2, -1)
            if causal:
                rows = offset + torch.arange(i0, i1)
                s = s.masked_fill(torch.arange(j0, j1)[None, :] > rows[:, None], -math.inf)
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[..., None])
            alpha = torch.exp(m - m_new)
            l = alpha * l + p.sum(-1)
            acc = alpha[..., None] * acc + p @ v[:, :, j0:j1]
            m = m_new
            j0 = j1
        out[:, :, i0:i1] = acc / l[..., None]
        lse[:, :, i0:i1] = m + torch.log(l)
        i0 = i1
    return out, lse
'''


def failed(result):
    return {c["id"]: c["diagnosis"] for c in result["checks"] if c["status"] != "passed"}


# --- the oracles and the tile counter -----------------------------------------------------------

def test_the_oracles_agree_with_the_reference_causal_and_not():
    rng = np.random.default_rng(0)
    for B, H, Tq, Tk, hd, causal in ((2, 3, 13, 29, 6, True), (3, 2, 25, 11, 5, False), (2, 3, 16, 16, 8, True)):
        q, k, v = inputs(rng, B, H, Tq, Tk, hd)
        out, lse = flash_attention(q, k, v, block_q=5, block_k=7, causal=causal)
        torch.testing.assert_close(out, sdpa(q, k, v, causal), rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(lse, logsumexp(q, k, causal), rtol=1e-12, atol=1e-13)


def test_causal_skips_ten_of_sixteen_tiles_at_t_64_blocks_16():
    assert tiles_needed(64, 64, 16, 16) == 10 * 16 * 16
    q, k, v = inputs(np.random.default_rng(1), *SKIP_CASES[0][:5])
    assert trusted_entries(flash_attention, q, k, v, 16, 16, True) == 2 * 3 * 10 * 16 * 16
    assert trusted_entries(flash_attention, q, k, v, 16, 16, False) == 2 * 3 * 16 * 16 * 16


def test_products_are_read_from_every_form_a_learner_writes():
    q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8)
    ops = []
    with _recorder()(ops):
        q @ k.transpose(-2, -1)
        torch.matmul(q, k.mT)
        torch.einsum("bhqd,bhkd->bhqk", q, k)
        torch.einsum("...qd,...kd->...qk", [q, k])
        torch.bmm(q.flatten(0, 1), k.flatten(0, 1).transpose(1, 2))
        torch.nn.functional.linear(q[0, 0], k[0, 0])
        q[0, 0, 0] @ k[0, 0].T
    found = [product(op) for op in ops if product(op) is not None]
    assert found == [(8, (2, 3, 5, 7))] * 4 + [(8, (6, 5, 7)), (8, (5, 7)), (8, (1, 7))]
    assert score_entries(ops, 8) == 4 * 210 + 210 + 35 + 7
    assert score_entries(ops, 7) == 0   # no product contracts 7: the PV products of a tiling would not count


# --- correct solutions in other idioms ---------------------------------------------------------

@pytest.mark.parametrize("source", [SPLIT, ROWS], ids=["split", "rows"])
def test_different_correct_solutions_pass(grade_source, source):
    result = grade_source("flash-tiling", source, seed=5)
    assert result["score"] == result["max_score"], failed(result)


# --- one failure path per check ----------------------------------------------------------------

def test_each_failure_path(grade_source):
    """One wrong file per check, as a learner writes it: the checks it fails, with their diagnoses."""
    cases = {
        # float32 in, float64 out: only the checks with a float32 case see it
        "matches-sdpa": (SPLIT.replace("    outs, lses = [], []\n",
                                       "    outs, lses = [], []\n    q, k, v = q.double(), k.double(), v.double()\n"),
                         {"matches-sdpa": None, "huge-logits-stay-finite": None}),
        # lse kept with keepdim: (B, H, Tq, 1)
        "lse-matches-logsumexp": (SPLIT.replace("lses.append((m + torch.log(l)).squeeze(-1))",
                                                "lses.append(m + torch.log(l))").replace(
                                  "torch.cat(lses, dim=-1)", "torch.cat(lses, dim=-2)"),
                                  {"lse-matches-logsumexp": None, "huge-logits-stay-finite": None,
                                   "fresh-shapes-match-sdpa": None, "causal-ignores-future": None}),
        # a key block longer than the keys refused, though it is one ragged tile
        "same-for-every-tile-size": (SPLIT.replace("    offset = Tk - Tq\n", "    offset = Tk - Tq\n    assert block_k <= Tk, "
                                                   "'a key block longer than the keys'\n"),
                                     {"same-for-every-tile-size": None}),
        # no running max: exp(s) itself, fine until the scores reach 89 (float32) or 710 (float64)
        "huge-logits-stay-finite": (SPLIT.replace("m_new = torch.maximum(m, s.amax(-1, keepdim=True))",
                                                  "m_new = torch.zeros_like(m)").replace(
                                    "m = torch.full(q_blk.shape[:-1] + (1,), -math.inf", "m = torch.full(q_blk.shape[:-1] "
                                    "+ (1,), 0.0"), {"huge-logits-stay-finite": None}),
        # every key block computed and masked, none skipped: right values, a quarter too many tiles
        "causal-skips-blocks-above-the-diagonal": (SPLIT.replace("            if causal and j0 > last:\n                "
                                                                 "break\n", ""),
                                                   {"causal-skips-blocks-above-the-diagonal": None}),
        # one whole (Tq, Tk) mask built up front, sliced per tile
        "never-builds-the-full-scores": (SPLIT.replace(
            "    offset = Tk - Tq\n", "    offset = Tk - Tq\n    full = torch.ones(Tq, Tk, dtype=torch.bool, "
            "device=q.device).tril(offset)\n").replace(
            "                hidden = torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).triu(offset + i0 - j0 + 1)",
            "                hidden = ~full[i0:i0 + s.shape[-2], j0:j0 + s.shape[-1]]"),
            {"never-builds-the-full-scores": None}),
        # no argument checks: range(0, T, -4) is empty and NaN comes back
        "rejects-bad-arguments": (SPLIT.replace('''    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be positive, got {block_q} and {block_k}")
''', "").replace('''    if causal and Tq > Tk:
        raise ValueError(f"causal attention needs Tq <= Tk, got {Tq} > {Tk}")
''', ""), {"rejects-bad-arguments": None}),
    }
    for check, (source, expected) in cases.items():
        result = grade_source("flash-tiling", source)
        assert failed(result) == expected, (check, failed(result))


def test_a_top_left_causal_mask_is_named_where_tq_differs_from_tk(grade_source):
    # SDPA's is_causal convention: query i sees keys 0..i, whatever Tk is, in the mask and in the skip.
    source = SPLIT.replace("    offset = Tk - Tq\n", "    offset = 0\n")
    got = failed(grade_source("flash-tiling", source))
    assert {"causal-matches", "lse-matches-logsumexp", "causal-skips-blocks-above-the-diagonal"} <= set(got)
    assert "matches-sdpa" not in got   # not causal
    # It computes as many tiles as a loop that stops before the diagonal block, with a top-left
    # mask's values: that is what the count check names too, never causal-block-skip-off-by-one.
    assert set(got.values()) == {"mask-top-left-aligned"}
    # Masked from the query's own index inside tiles that stop at the bottom-right diagonal: the same
    # values from the right tiles, so the count checks pass.
    source = SPLIT.replace(".triu(offset + i0 - j0 + 1)", ".triu(i0 - j0 + 1)")
    got = failed(grade_source("flash-tiling", source))
    assert {"causal-matches", "lse-matches-logsumexp"} <= set(got)
    assert not {"matches-sdpa", "causal-skips-blocks-above-the-diagonal", "never-builds-the-full-scores"} & set(got)
    assert set(got.values()) == {"mask-top-left-aligned"}


def test_the_oracles_bugs_written_by_hand_are_named(grade_source):
    cases = {
        "missing-rescale": SPLIT.replace("l = r * l + p.sum(-1, keepdim=True)", "l = l + p.sum(-1, keepdim=True)"),
        "rescale-sum-only": SPLIT.replace("acc = r * acc + torch.einsum", "acc = acc + torch.einsum"),
        "normalise-per-block": SPLIT.replace("p = torch.exp(s - m_new)", "p = torch.softmax(s, dim=-1)").replace(
            "acc = r * acc + torch.einsum", "acc = acc + torch.einsum").replace(
            "outs.append(acc / l)", "outs.append(acc)"),
        "lse-not-returned": SPLIT.replace("(m + torch.log(l)).squeeze(-1)", "m.squeeze(-1)"),
        "lse-missing-max": SPLIT.replace("(m + torch.log(l)).squeeze(-1)", "torch.log(l).squeeze(-1)"),
        "causal-block-skip-off-by-one": SPLIT.replace("if causal and j0 > last:", "if causal and j0 + block_k > last + 1:"),
    }
    for code, source in cases.items():
        result = grade_source("flash-tiling", source)
        assert code in result["diagnoses"], (code, failed(result))


# FlashAttention-1 keeps the output normalised inside the loop: (l_old * r * acc + p v) / l_new.
FA1_UPDATE = ("            l = r * l + p.sum(-1, keepdim=True)\n"
              "            acc = r * acc + torch.einsum(\"...qk,...kd->...qd\", p, v_blk)\n")


def fa1(new_acc):
    """SPLIT with the output normalised inside the key loop by ``new_acc`` (l_old is the sum before
    this tile, l the sum after it), and not divided at the end."""
    assert FA1_UPDATE in SPLIT
    update = ("            l_old, l = l, r * l + p.sum(-1, keepdim=True)\n"
              f"            acc = {new_acc}\n")
    return SPLIT.replace(FA1_UPDATE, update).replace("outs.append(acc / l)", "outs.append(acc)")


def test_flash_attention_1s_in_loop_normalisation_passes_with_its_correction(grade_source):
    result = grade_source("flash-tiling", fa1('(r * l_old * acc + torch.einsum("...qk,...kd->...qd", p, v_blk)) / l'))
    assert result["score"] == result["max_score"], failed(result)


@pytest.mark.parametrize("new_acc", [
    '(r * acc + torch.einsum("...qk,...kd->...qd", p, v_blk)) / l',   # without l_old
    '(acc + torch.einsum("...qk,...kd->...qd", p, v_blk)) / l',   # without l_old * r: the whole correction
    'r * acc + torch.einsum("...qk,...kd->...qd", p, v_blk) / l',   # only the new tile divided, by the sum so far
    'acc + torch.einsum("...qk,...kd->...qd", p, v_blk) / l',   # out = out + p v_j / l_new: nothing corrected
], ids=["without-l-old", "without-the-correction", "new-tile-divided", "tile-added-over-l-new"])
def test_flash_attention_1s_in_loop_normalisation_without_its_correction_is_named(grade_source, new_acc):
    result = grade_source("flash-tiling", fa1(new_acc))
    got = failed(result)
    assert {"matches-sdpa", "same-for-every-tile-size"} <= set(got)
    assert result["diagnoses"] == ["normalise-per-block"], got


def test_a_bad_argument_that_hangs_is_told_to_be_refused(grade_source):
    result = grade_source("flash-tiling", WHILE, timeout_s=2)   # an endless loop need not take 20 s here
    assert failed(result) == {"rejects-bad-arguments": None}
    check = checks_by_id(result)["rejects-bad-arguments"]
    assert check["status"] == "failed"
    assert "not refused" in check["message"] and "raise ValueError" in check["message"]
    assert "block_q=0" in check["message"] and "did not finish within 2 s" in check["message"]   # the call, the cause


def test_sdpa_for_the_output_is_banned_and_the_rest_passes(grade_source):
    source = SPLIT.replace("    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)",
                           "    mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(offset) if causal else None\n"
                           "    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)\n"
                           "    return out, torch.cat(lses, dim=-1)")
    assert failed(grade_source("flash-tiling", source)) == {"banned-api": "banned-api",
                                                            "never-builds-the-full-scores": None}


def test_hidden_checks_fail_on_what_they_judge(grade_source):
    # The diagonal tiles left unmasked: later keys leak into earlier queries.
    leak = SPLIT.replace("            if causal:\n                hidden", "            if False:\n                hidden")
    got = failed(grade_source("flash-tiling", leak))
    assert "causal-ignores-future" in got and "fresh-shapes-match-sdpa" in got and "causal-matches" in got
