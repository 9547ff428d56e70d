"""The flash-decoding grader on solutions written the way learners write them (not via the bug
oracles), one failure path per check, and its independent oracles (SDPA, torch.logsumexp, the
float64 merge by softmax over the lses) and the product and key-read counters it reads recorded
calls with."""
import math

import numpy as np
import torch

from conftest import checks_by_id, split_lengths
from graders.engine.products import product, score_operands
from graders.engine.worker import _recorder
from graders.flash_decoding import inputs, key_reads, logsumexp, merged, partials, score_blocks, sdpa, shifted
from reference.flash_decoding import merge_partials, partial_attention, split_kv_decode

# A list of partials folded with torch.logaddexp, the chunks cut by a while loop, torch.softmax
# and torch.logsumexp inside each chunk; a KV group's query heads on an axis of their own, k and v
# broadcast over it through a size-1 axis: each score product is handed k with its H_kv heads.
SOLUTION = '''
import math
import torch


def partial_attention(q, k_chunk, v_chunk):
    dtype = torch.promote_types(q.dtype, torch.float32)
    B, H, Tq, D = q.shape
    G = k_chunk.shape[1]
    if H % G != 0:
        raise ValueError(f"{H} query heads do not share {G} KV heads evenly")
    if k_chunk.shape[-2] == 0:
        return (torch.zeros(q.shape, dtype=dtype, device=q.device),
                torch.full(q.shape[:-1], -math.inf, dtype=dtype, device=q.device))
    qg = q.to(dtype).view(B, G, H // G, Tq, D)
    s = qg @ k_chunk.to(dtype)[:, :, None].transpose(-2, -1) / math.sqrt(D)
    out, lse = torch.softmax(s, dim=-1) @ v_chunk.to(dtype)[:, :, None], torch.logsumexp(s, dim=-1)
    return out.reshape(q.shape), lse.reshape(q.shape[:-1])


def merge_partials(outs, lses):
    dtype = torch.promote_types(lses[0].dtype, torch.float32)
    lses = torch.stack([l.to(dtype) for l in lses])
    lse = torch.logsumexp(lses, dim=0)
    out = sum(torch.exp(l - lse)[..., None] * o.to(dtype) for o, l in zip(outs, lses))
    return out, lse


def split_kv_decode(q, k, v, n_splits):
    if n_splits < 1:
        raise ValueError(f"n_splits must be >= 1, got {n_splits}")
    Tk = k.shape[-2]
    if Tk == 0:
        raise ValueError("empty KV cache")
    size = math.ceil(Tk / n_splits)
    outs, lses = [], []
    start = 0
    while len(outs) < n_splits:
        out, lse = partial_attention(q, k[:, :, start:start + size], v[:, :, start:start + size])
        outs.append(out)
        lses.append(lse)
        start += size
    return merge_partials(outs, lses)[0].to(q.dtype)
'''

CHECKS = '''    if n_splits < 1:
        raise ValueError(f"n_splits must be >= 1, got {n_splits}")
    Tk = k.shape[-2]
    if Tk == 0:
        raise ValueError("empty KV cache")
'''


def failed(result):
    return {c["id"]: c["diagnosis"] for c in result["checks"] if c["status"] != "passed"}


# --- the oracles and the product counter ----------------------------------------------------------

def test_the_oracles_agree_with_the_reference():
    rng = np.random.default_rng(0)
    for B, H, Tq, Tk, hd, cuts in ((2, 3, 1, 29, 5, (0, 3, 4, 17, 29)), (3, 2, 3, 20, 6, (0, 0, 11, 20, 20))):
        q, k, v = inputs(rng, B, H, Tq, Tk, hd)
        outs, lses = partials(q, k, v, cuts, torch.float64)
        for expected, got in zip((sdpa(q, k, v), logsumexp(q, k)), merge_partials(outs, lses)):
            torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-13)
        for expected, got in zip(merged(outs, lses), merge_partials(outs, lses)):
            torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(split_kv_decode(q, k, v, 4), sdpa(q, k, v), rtol=1e-12, atol=1e-13)
        out, lse = partial_attention(q, k[:, :, :0], v[:, :, :0])
        assert (out == 0).all() and torch.isneginf(lse).all()


def test_kv_groups_follow_enable_gqa_and_repeat_interleave():
    """Query head h reads KV head h // n_rep: enable_gqa, repeat_interleave and the reference agree,
    and the tiled grouping h % H_kv does not."""
    q, k, v = inputs(np.random.default_rng(2), 2, 6, 2, 11, 5, Hkv=2)
    repeated = [t.repeat_interleave(3, dim=1) for t in (k, v)]   # (B, H, Tk, hd)
    whole = torch.nn.functional.scaled_dot_product_attention(q, *repeated)
    torch.testing.assert_close(sdpa(q, k, v), whole, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(split_kv_decode(q, k, v, 3), whole, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(partial_attention(q, k, v)[1], logsumexp(q, *repeated[:1]), rtol=1e-12, atol=1e-13)
    tiled = torch.nn.functional.scaled_dot_product_attention(q, k.repeat(1, 3, 1, 1), v.repeat(1, 3, 1, 1))
    differ = [h for h in range(6) if not torch.allclose(tiled[:, h], whole[:, h])]
    assert differ == [h for h in range(6) if h // 3 != h % 2] == [1, 4]


def test_a_split_count_moves_the_boundaries_and_the_rounding():
    """The README: a count puts the boundaries at multiples of ceil(Tk / n_splits), which move as the
    cache grows (a fixed size of 256 keys would keep them: 0, 256, 512, 768), and a float sum taken
    in another order rounds differently."""
    assert split_lengths(1000, 4) == [250] * 4 and split_lengths(1001, 4) == [251, 251, 251, 248]
    q, k, v = inputs(np.random.default_rng(3), 1, 2, 1, 1000, 8, torch.float32)
    by_count = [split_kv_decode(q, k, v, n) for n in (3, 4)]
    torch.testing.assert_close(*by_count, rtol=1e-5, atol=1e-6)
    assert not torch.equal(*by_count)


def test_shifted_scores_sit_near_their_level():
    q, k, _ = shifted(np.random.default_rng(1), 2, 3, 1, 40, 8, 100.0)
    lse = logsumexp(q, k)
    assert ((lse > 100) & (lse < 100 + np.log(40) + 6)).all()


def test_products_are_read_from_every_form_a_learner_writes():
    q, k = torch.randn(2, 3, 1, 8), torch.randn(2, 3, 7, 8)
    ops = []
    with _recorder()(ops):
        q @ k.transpose(-2, -1)
        torch.matmul(q, k.mT)
        torch.einsum("bhqd,bhkd->bhqk", q, k)
        torch.nn.functional.linear(q[0, 0], k[0, 0])
    assert [product(op) for op in ops if product(op) is not None] == [(8, (2, 3, 1, 7))] * 3 + [(8, (1, 7))]
    assert score_blocks(ops, 8) == [42, 42, 42, 7] and score_blocks(ops, 7) == []
    assert score_operands(ops, 8) == [[(2, 3, 1, 8), (2, 3, 8, 7)]] * 2 + [[(2, 3, 1, 8), (2, 3, 7, 8)],
                                                                            [(1, 8), (7, 8)]]


def test_key_reads_count_a_group_once_and_a_copy_per_query_head():
    """A group's query heads packed as rows, or on an axis k is broadcast over, read k's H_kv heads;
    k repeated to H heads, or read per query head in a loop, n_rep times as much."""
    q, k = torch.randn(2, 6, 1, 8), torch.randn(2, 2, 7, 8)
    forms = {"rows": lambda: q.reshape(2, 2, 3, 8) @ k.transpose(-2, -1),
             "broadcast": lambda: q.view(2, 2, 3, 1, 8) @ k[:, :, None].transpose(-2, -1),
             "einsum": lambda: torch.einsum("bgrqd,bgkd->bgrqk", q.view(2, 2, 3, 1, 8), k),
             "repeated": lambda: q @ k.repeat_interleave(3, dim=1).transpose(-2, -1),
             "per head": lambda: [q[:, h] @ k[:, h // 3].mT for h in range(6)]}
    reads = {}
    for name, form in forms.items():
        ops = []
        with _recorder()(ops):
            form()
        reads[name] = sum(key_reads(ops, 8))
    cache = k.numel()
    assert reads == {"rows": cache, "broadcast": cache, "einsum": cache, "repeated": 3 * cache, "per head": 3 * cache}


# --- correct solutions in other idioms ----------------------------------------------------------

def test_a_different_correct_solution_passes(grade_source):
    result = grade_source("flash-decoding", SOLUTION, seed=5)
    assert result["score"] == result["max_score"], failed(result)


# --- one failure path per check -----------------------------------------------------------------

def test_each_failure_path(grade_source):
    """One wrong file per check, as a learner writes it: the checks it fails, with their diagnoses."""
    cases = {
        # float32 chunks always: float64 inputs come back float32
        "partial-matches-sdpa": (SOLUTION.replace("    dtype = torch.promote_types(q.dtype, torch.float32)\n    B, H",
                                                  "    dtype = torch.float32\n    B, H"),
                                 {"partial-matches-sdpa": None, "partial-empty-chunk": None, "gqa-matches-sdpa": None}),
        # no special case for an empty chunk: s.amax(-1) raises on an empty axis
        "partial-empty-chunk": (SOLUTION.replace("    if k_chunk.shape[-2] == 0:\n        return (torch.zeros(q.shape, "
                                                 "dtype=dtype, device=q.device),\n                torch.full(q.shape[:-1], "
                                                 "-math.inf, dtype=dtype, device=q.device))\n", "").replace(
            "torch.logsumexp(s, dim=-1)", "s.amax(-1) + torch.log(torch.exp(s - s.amax(-1, keepdim=True)).sum(-1))"),
            {"partial-empty-chunk": None, "split-any-count": None, "fresh-shapes-match-sdpa": None}),
        # lse of the merge: the largest partial's, not the union's
        "merge-equals-whole": (SOLUTION.replace("    return out, lse\n", "    return out, lses.amax(0)\n"),
                               {"merge-equals-whole": None, "merge-huge-lse-stays-finite": None,
                                "merge-ignores-empty-partials": None, "half-inputs-merge-in-float32": None,
                                "fresh-shapes-match-sdpa": None, "merges-compose": None}),
        # the first partial's lse as the shift: -inf when it is empty (exp(lse_j + inf) overflows), and too
        # small when the lses spread over thousands
        "merge-ignores-empty-partials": (SOLUTION.replace("    lse = torch.logsumexp(lses, dim=0)",
                                                          "    lse = lses[0] + torch.log(torch.exp(lses - lses[0]).sum(0))"),
                                         {"merge-ignores-empty-partials": None, "merge-huge-lse-stays-finite": None}),
        # the last keys dropped when the chunks are ragged: floor, not ceil (fewer keys scored, too)
        "split-matches-sdpa": (SOLUTION.replace("size = math.ceil(Tk / n_splits)", "size = max(1, Tk // n_splits)"),
                               {"split-matches-sdpa": None, "split-any-count": None, "splits-are-chunks": None,
                                "gqa-matches-sdpa": None, "kv-read-once-per-group": None},
                               {"fresh-shapes-match-sdpa"}),
        # n_splits larger than the cache refused, though the extra splits are only empty
        "split-any-count": (SOLUTION.replace(CHECKS, CHECKS + "    assert n_splits <= Tk, 'more splits than keys'\n"),
                            {"split-any-count": None, "fresh-shapes-match-sdpa": None}),
        # the whole cache's scores in one product, then cut into splits
        "splits-are-chunks": (SOLUTION.replace("    outs, lses = [], []\n", "    outs, lses = [], []\n    w = torch.promote_types(q.dtype, "
                                               "torch.float32)\n    B, H, Tq, D = q.shape\n    G = k.shape[1]\n"
                                               "    if H % G:\n        raise ValueError('uneven KV groups')\n"
                                               "    s_all = q.to(w).view(B, G, H // G, Tq, D) @ k.to(w)[:, :, None]"
                                               ".transpose(-2, -1) / math.sqrt(D)\n").replace(
            "        out, lse = partial_attention(q, k[:, :, start:start + size], v[:, :, start:start + size])\n",
            "        s = s_all[..., start:start + size]\n"
            "        out = (torch.softmax(s, -1) @ v[:, :, start:start + size].to(w)[:, :, None]).reshape(q.shape)\n"
            "        lse = torch.logsumexp(s, -1).reshape(q.shape[:-1])\n"),
            {"splits-are-chunks": None}),
        # no argument checks: ceil(Tk / 0) raises ZeroDivisionError, and an empty cache gives NaN
        "rejects-bad-arguments": (SOLUTION.replace(CHECKS, "    Tk = k.shape[-2]\n"), {"rejects-bad-arguments": None}),
    }
    for check, (source, expected, *maybe) in cases.items():   # maybe: checks whose own cases need not show it
        got = failed(result := grade_source("flash-decoding", source))
        assert {c: d for c, d in got.items() if c not in (maybe or [set()])[0]} == expected, (check, got)
        assert result["checks"] and check in got


def test_the_oracles_bugs_written_by_hand_are_named(grade_source):
    cases = {
        "partials-averaged": SOLUTION.replace("torch.exp(l - lse)[..., None] * o.to(dtype)", "o.to(dtype) / len(outs)"),
        "merge-without-max": SOLUTION.replace("    lse = torch.logsumexp(lses, dim=0)",
                                              "    lse = torch.log(torch.exp(lses).sum(0))"),
        "empty-split-lse-zero": SOLUTION.replace("torch.full(q.shape[:-1], -math.inf,", "torch.full(q.shape[:-1], 0.0,"),
        "merge-in-float16": SOLUTION.replace("    dtype = torch.promote_types(lses[0].dtype, torch.float32)",
                                             "    dtype = torch.float16"),
    }
    for code, source in cases.items():
        result = grade_source("flash-decoding", source)
        assert result["diagnoses"] == [code], (code, failed(result))


def test_partials_kept_in_the_inputs_dtype_are_named_by_their_dtype(grade_source):
    source = SOLUTION.replace("    dtype = torch.promote_types(q.dtype, torch.float32)\n    B, H",
                              "    dtype = q.dtype\n    B, H")
    result = grade_source("flash-decoding", source)
    assert failed(result) == {"half-inputs-merge-in-float32": "merge-in-float16"}
    assert "wrong dtype" in checks_by_id(result)["half-inputs-merge-in-float32"]["message"]


def test_a_bad_argument_that_hangs_is_told_to_be_refused(grade_source):
    # Chunks until the cache ends, n_splits = 0 refused but not -2: a chunk of -5 keys never gets there.
    source = SOLUTION.replace(CHECKS, "    if n_splits == 0:\n        raise ValueError('n_splits = 0')\n"
                                      "    Tk = k.shape[-2]\n").replace("    while len(outs) < n_splits:", "    while start < Tk:")
    result = grade_source("flash-decoding", source, timeout_s=2)   # an endless loop need not take 20 s here
    check = checks_by_id(result)["rejects-bad-arguments"]
    assert failed(result) == {"rejects-bad-arguments": None}
    assert "not refused" in check["message"] and "n_splits=-2" in check["message"]


def test_sdpa_for_a_chunk_is_banned_and_the_rest_passes(grade_source):
    source = SOLUTION.replace("torch.softmax(s, dim=-1) @ v_chunk.to(dtype)[:, :, None]",
                              "torch.nn.functional.scaled_dot_product_attention(q.to(dtype), k_chunk.to(dtype), "
                              "v_chunk.to(dtype), enable_gqa=True)")
    assert failed(grade_source("flash-decoding", source)) == {"banned-api": "banned-api"}


def test_bad_returns_fail_cleanly(grade_source):
    # the pair as a list, and a NaN where an lse belongs
    as_list = SOLUTION.replace("    return out, lse\n", "    return [out, lse]\n")
    got = failed(grade_source("flash-decoding", as_list))
    assert {"merge-equals-whole", "merge-huge-lse-stays-finite", "merge-ignores-empty-partials", "half-inputs-merge-in-float32",
            "fresh-shapes-match-sdpa", "merges-compose"} >= set(got) >= {"merge-equals-whole"}
    nan = SOLUTION.replace("torch.logsumexp(s, dim=-1)\n", "torch.logsumexp(s, dim=-1) * math.nan\n")
    got = failed(grade_source("flash-decoding", nan))
    assert {"partial-matches-sdpa", "split-matches-sdpa"} <= set(got)


def test_hidden_checks_fail_on_what_they_judge(grade_source):
    # a merge whose lse is 0 when handed a list of two partials: a merged pair cannot merge again
    no_lse = SOLUTION.replace("    return out, lse\n", "    return out, lse * 0 if type(outs) is list and len(outs) == 2 else lse\n")
    got = failed(grade_source("flash-decoding", no_lse))
    assert "merges-compose" in got and "merge-equals-whole" not in got


def test_splits_run_on_a_thread_pool_are_tampering(grade_source):
    """The splits handed to a ThreadPoolExecutor, as a CPU port of the kernel's thread blocks: the
    sandbox stops a worker that starts a thread, and the file's import of concurrent.futures is
    what the kata does not allow, so the checks that judge the calls say tampering, at that cause."""
    source = SOLUTION.replace("import math\n", "import math\nfrom concurrent.futures import ThreadPoolExecutor\n", 1)
    loop = '''    outs, lses = [], []
    start = 0
    while len(outs) < n_splits:
        out, lse = partial_attention(q, k[:, :, start:start + size], v[:, :, start:start + size])
        outs.append(out)
        lses.append(lse)
        start += size
'''
    assert loop in source
    source = source.replace(loop, '''    starts = [i * size for i in range(n_splits)]
    with ThreadPoolExecutor(max_workers=n_splits) as pool:
        parts = list(pool.map(lambda s: partial_attention(q, k[:, :, s:s + size], v[:, :, s:s + size]), starts))
    outs, lses = [p[0] for p in parts], [p[1] for p in parts]
''')
    result = grade_source("flash-decoding", source)
    lost = [c for c in result["checks"] if c["status"] != "passed"]
    assert lost, result
    for check in lost:   # each its own tampering, or the same cause as an earlier check's
        assert check["diagnosis"] == "tampering" or check.get("same_cause_as"), (check["id"], check["message"])
    assert result["diagnoses"] == ["tampering"]


def test_chunk_products_joined_into_every_keys_scores_fail_the_chunk_check(grade_source):
    """Each chunk's scores a product of its own, as the check counts them, then joined into the
    scores of every key and normalised by one softmax: the splits are not attended apart."""
    source = SOLUTION.replace('''    outs, lses = [], []
    start = 0
    while len(outs) < n_splits:
        out, lse = partial_attention(q, k[:, :, start:start + size], v[:, :, start:start + size])
        outs.append(out)
        lses.append(lse)
        start += size
    return merge_partials(outs, lses)[0].to(q.dtype)
''', '''    dtype, scale = torch.promote_types(q.dtype, torch.float32), 1 / math.sqrt(q.shape[-1])
    B, H, Tq, D = q.shape
    if H % k.shape[1]:
        raise ValueError("uneven KV groups")
    qf = q.to(dtype).view(B, k.shape[1], H // k.shape[1], Tq, D)
    kf, vf = k.to(dtype)[:, :, None], v.to(dtype)[:, :, None]
    s = torch.cat([qf @ kc.transpose(-2, -1) * scale for kc in kf.split(size, dim=-2)], dim=-1)   # (B, G, R, Tq, Tk)
    return (torch.softmax(s, dim=-1) @ vf).reshape(q.shape).to(q.dtype)
''')
    assert "torch.cat" in source
    result = grade_source("flash-decoding", source)
    assert failed(result) == {"splits-are-chunks": None}
    assert "every key" in checks_by_id(result)["splits-are-chunks"]["message"]
