"""Follow-up questions and their grading, and spaced repetition over the history. (That every
kata's bank holds both kinds, each asked and graded as written, is a content rule, `followups`:
test_content.py.)"""
import json
import random
import re
from datetime import date, datetime, timedelta

import pytest
from click.testing import CliRunner

import cli
from graders.engine import manifest, questions
from graders.engine.questions import QuestionError, parse, parse_answer
from graders.practice.history import History, progress, suggestions

def test_choice_questions_shuffle_and_grade_by_letter():
    q = manifest.find("softmax").followups[0]
    orders = {q.draw(random.Random(seed), "softmax").order for seed in range(12)}
    assert len(orders) > 1
    for order in orders:
        asked = questions.Asked("softmax", q, {}, order)
        right_letter = asked.expected
        assert asked.choices[ord(right_letter) - ord("a")] == q.options[q.answer - 1]
        assert asked.grade(right_letter.upper() + ")")[0]
        right, verdict = asked.grade(next(c for c in "abcd" if c != right_letter))
        assert not right and verdict.startswith(f"The answer is {right_letter})") and q.explain in verdict


@pytest.mark.parametrize("text, value", [
    ("4294967296", 4294967296), ("4,294,967,296", 4294967296), ("4_294_967_296 bytes", 4294967296),
    ("4 GiB", 4 * 2**30), ("4GiB", 4 * 2**30), ("4.3 GB", 4.3e9), ("12M", 12e6), ("2^32", 2**32),
    ("2 * 16 * 4096**2", 2 * 16 * 4096**2), ("1.5e3 FLOPs", 1500.0), ("125 keys", 125), ("3 KB", 3000), ("-0.25", -0.25), ("sqrt(64)", 8.0),
])
def test_numeric_answers_accept_how_people_write_numbers(text, value):
    assert parse_answer(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "bytes", "abc", "__import__('os')", "(1).real", "[1]", "2**10**10",
                                  "open('x')", "1/0", "inf"])
def test_the_evaluator_computes_arithmetic_and_nothing_else(text):
    with pytest.raises(ValueError):
        parse_answer(text)


def test_a_broken_question_fails_when_the_manifest_loads():
    base = {"id": "q", "kind": "numeric", "question": "T = {T}?", "explain": "x", "params": {"T": [1, 2]}}
    with pytest.raises(QuestionError, match="not allowed"):
        parse({**base, "answer": "T * __import__('os').getpid()"}, "#1")
    with pytest.raises(QuestionError, match=r"with \{'T': 1\}: 'U'"):
        parse({**base, "answer": "T", "question": "{U}?"}, "#1")
    with pytest.raises(QuestionError, match=r"with \{'T': 1\}: 'U'"):   # a mistake's explain is formatted too
        parse({**base, "answer": "T", "mistakes": [{"answer": "T + 1", "explain": "Not {U}."}]}, "#1")
    with pytest.raises(QuestionError, match="gives the right answer"):
        parse({**base, "answer": "T * 2", "mistakes": [{"answer": "T + T", "explain": "no"}]}, "#1")
    with pytest.raises(QuestionError, match="unknown key 'options'"):
        parse({**base, "answer": "T", "options": ["a", "b"]}, "#1")
    with pytest.raises(QuestionError, match="1-based number"):
        parse({"id": "c", "kind": "choice", "question": "?", "explain": "x", "options": ["a", "b"], "answer": 3}, "#1")


PLACEHOLDER = re.compile(r"\{(answer|[A-Za-z_]\w*)(:[^{}]*)?\}")


def test_no_verdict_of_any_follow_up_keeps_an_unfilled_placeholder():
    # Every numeric question of every kata, at every combination of its parameters, answered right,
    # with each listed mistake and with a number no mistake gives: the text shown has no {B} or {T:,} left.
    for kata in manifest.katas():
        for q in kata.followups:
            if q.kind != "numeric":
                continue
            for values in questions._combinations(q.params):
                asked = questions.Asked(kata.slug, q, values, ())
                answers = [str(asked.expected), "-12345"] + [repr(questions.evaluate(wrong, values))
                                                             for wrong, _ in q.mistakes]
                for text in [asked.text] + [asked.grade(answer)[1] for answer in answers]:
                    assert not PLACEHOLDER.search(text), (kata.slug, q.id, values, text)


def _checks(*rows):
    """Check entries as `kata check` appends them: (days ago, kata, status, file content)."""
    today = datetime.now().astimezone()
    return [{"type": "check", "time": (today - timedelta(days=ago)).isoformat(timespec="seconds"), "kata": kata,
             "status": status, "score": 1.0 if status == "passed" else 0.0, "max_score": 1.0, "sha256": sha}
            for ago, kata, status, sha in rows]


def test_next_continues_the_track_then_puts_failures_then_unfinished_then_due_reviews_then_new_katas():
    katas = manifest.katas()
    checks = _checks(
        (9, "softmax", "passed", "s1"),          # box 1 nine days ago: due
        (5, "split-heads", "passed", "h1"),
        (4, "split-heads", "passed", "h2"),      # new code on a new day: box 2, due in 2 days: due
        (1, "gqa", "passed", "g1"),              # box 1 yesterday: due today
        (0.0003, "causal-mask", "failed", "c1"),
        (0.0002, "mha", "passed", "m1"),
        (0.0001, "mha", "failed", "m2"),          # failed today, most recently
        (0, "causal-mask", "not-started", "c0"),  # not-started runs do not count
        (0, "flops-memory", "passed", "f1"),     # passed today: not due
    )
    ranked = suggestions(katas, checks, started={"causal-mask", "mha", "scaling-variance"})
    order = [(s.kata.slug, s.reason.split(",")[0].split(" (")[0].split(":")[0]) for s in ranked]
    assert order[0] == ("sdpa-swap", "continues the seed track")   # after flops-memory, the last kata checked
    assert order[1:3] == [("mha", "failed today"), ("causal-mask", "failed today")]
    assert order[3] == ("scaling-variance", "started")
    assert [slug for slug, _ in order[4:7]] == ["softmax", "split-heads", "gqa"]   # most overdue first
    new = [k.slug for k in katas if k.slug not in {slug for slug, _ in order[:7]} | {"flops-memory"}]
    assert [slug for slug, _ in order[7:-1]] == new   # not started, along the tracks
    assert order[-1][0] == "flops-memory" and len(ranked) == len(katas)
    assert ranked[7].command == "kata start mha-by-loop" and ranked[4].command == "kata interview --katas softmax"


def test_a_review_needs_new_code_and_a_failure_resets_it():
    katas = manifest.katas()
    same_file = progress(katas, _checks((6, "softmax", "passed", "a"), (3, "softmax", "passed", "a"),
                                        (0, "softmax", "passed", "a")))["softmax"]
    assert same_file.box == 1 and same_file.interval_days == 1
    fresh = progress(katas, _checks((6, "softmax", "passed", "a"), (3, "softmax", "passed", "b"),
                                    (2, "softmax", "passed", "c"), (2, "softmax", "passed", "d")))["softmax"]
    assert fresh.box == 3 and fresh.due == (datetime.now() - timedelta(days=2)).date() + timedelta(days=4)
    reset = progress(katas, _checks((6, "softmax", "passed", "a"), (3, "softmax", "passed", "b"),
                                    (1, "softmax", "error", "c"), (0, "softmax", "passed", "a")))["softmax"]
    assert reset.box == 1 and reset.checks == 4 and reset.due == date.today() + timedelta(days=1)


def test_history_survives_a_torn_line_and_the_cli_reads_it(kata_cmd):
    ws = kata_cmd.workspace
    assert kata_cmd("start", "softmax").returncode == 0
    (ws / "softmax.py").write_text((manifest.ROOT / "reference" / "softmax.py").read_text())
    assert kata_cmd("check", "softmax").returncode == 0
    path = ws / ".kata" / "history.jsonl"
    with open(path, "a") as f:
        f.write('{"type": "check", "time": "2026-')     # a crash mid-write
    History(path).append({"type": "check", "kata": "split-heads", "status": "failed", "score": 2.0,
                          "max_score": 9.0, "sha256": "x"})
    shown = kata_cmd("history")
    assert shown.returncode == 0
    assert "1 unreadable line(s)" in shown.stderr
    assert re.search(r"softmax\s+1 check\(s\)\s+best 10/10 .*\(passed\)\s+review due", shown.stdout)
    assert re.search(r"split-heads\s+1 check\(s\)\s+best 2/\d+ .*not passed yet", shown.stdout)
    entries = [json.loads(line) for line in kata_cmd("history", "--json").stdout.splitlines()]
    assert [e["kata"] for e in entries] == ["softmax", "split-heads"]
    assert entries[0]["status"] == "passed" and len(entries[0]["sha256"]) == 64
    suggested = kata_cmd("next", "-n", "2").stdout
    # split-heads, checked last, first; then the seed track goes on after it.
    assert re.match(r"1\. split-heads: failed today .*, then go on along the seed track\n   kata check split-heads\n"
                    r"2\. mha: not started yet", suggested), suggested


def test_an_empty_history_says_how_to_start(tmp_path):
    result = CliRunner().invoke(cli.main, ["history", "-w", str(tmp_path)])
    assert result.exit_code == 0 and "No history yet" in result.output
    first = CliRunner().invoke(cli.main, ["next", "-n", "1", "-w", str(tmp_path)]).output
    assert first.startswith("1. softmax: not started yet")


def _counted_flops(fn, *args):
    """FLOPs torch.utils.flop_counter counts in ``fn(*args)``; on meta tensors it needs shapes only."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def _rolling_cache_bytes(W, B, T, layers=32, heads=8, head_dim=128):
    """Bytes the sliding-window reference's RollingKVCache holds after T fp16 tokens (meta tensors), times the layers."""
    import torch

    from reference import sliding_window

    cache = sliding_window.RollingKVCache(W)
    kv = torch.empty(B, heads, T, head_dim, dtype=torch.float16, device="meta")
    cache.append(kv, kv)
    return layers * (cache.k.nbytes + cache.v.nbytes)


def _receptive_field(W, L):
    """Input positions the last of L·W + 1 tokens reaches through L layers of the reference's mask."""
    from reference import sliding_window

    T = L * W + 1
    mask = sliding_window.sliding_window_mask(T, T, W).double()   # (T, T)
    reach = mask[-1:]   # (1, T): what the last token's first layer sees
    for _ in range(L - 1):
        reach = reach @ mask
    return int((reach > 0).sum())


def _flash_score_tiles(flash_tiling, B, H, T, b, causal):
    """(score tiles per (batch, head), elements of the largest one) of the flash-tiling reference,
    from the matrix products it runs on meta (B, H, T, 8) tensors with blocks of b."""
    import math

    import torch

    from graders.engine.worker import _recorder
    from graders.engine.products import score_tiles

    q, ops = torch.empty(B, H, T, 8, device="meta"), []
    with _recorder()(ops):
        flash_tiling.flash_attention(q, q, q, block_q=b, block_k=b, causal=causal)
    tiles = [math.prod(shape) for shape in score_tiles(ops, 8)]
    return sum(tiles) // (B * H * b * b), max(tiles)


def _kv_cache_bytes(kv_cache, n_heads, n_kv_heads, B=1, tokens=1, head_dim=8, dtype=None):
    """Bytes of the keys and values the kv-cache reference's KVCache holds after its module has
    seen ``tokens`` tokens (meta tensors: shapes only)."""
    import torch

    dtype = dtype or torch.float32
    cache = kv_cache.KVCache()
    m = kv_cache.GroupedQueryAttention(n_heads * head_dim, n_heads, n_kv_heads).to(device="meta", dtype=dtype)
    m(torch.empty(B, tokens, n_heads * head_dim, device="meta", dtype=dtype), cache=cache)
    return cache.k.nbytes + cache.v.nbytes


def _cat_copy_bytes(kv_cache, P, N, n_kv_heads, head_dim):
    """Bytes the kv-cache reference's KVCache.append writes (its torch.cat outputs) over N one-token
    appends after a prefill of P tokens, bf16, batch 1 (meta tensors: shapes only)."""
    import torch

    cache = kv_cache.KVCache()
    cache.append(*[torch.empty(1, n_kv_heads, P, head_dim, dtype=torch.bfloat16, device="meta")] * 2)
    token = torch.empty(1, n_kv_heads, 1, head_dim, dtype=torch.bfloat16, device="meta")
    written = 0
    for _ in range(N):
        k, v = cache.append(token, token)   # each append returns the new, concatenated tensors
        written += k.nbytes + v.nbytes
    return written


def _interleaved_cache_bytes(kv_cache, N, W, T):
    """KV bytes of one sequence of T fp16 tokens in N layers, one full layer (the kv-cache
    reference's KVCache) after every 5 sliding-window layers (the sliding-window reference's
    RollingKVCache), 8 KV heads of head_dim 128."""
    import torch

    full = N // 6
    window = _rolling_cache_bytes(W, 1, T, layers=N - full, heads=8, head_dim=128)
    return window + full * _kv_cache_bytes(kv_cache, 8, 8, 1, T, 128, torch.float16)


def _gqa_decode_intensity(H, Hkv, hd, T):
    """FLOPs per byte of K and V for one decoded query per sequence: counted independently, the
    scores q @ k^T and the weighted sum p @ v for every query head, over a bf16 cache of Hkv heads."""
    flops = H * (2 * T * hd + 2 * T * hd)   # (1, hd) @ (hd, T) and (1, T) @ (T, hd), each query head
    bytes_read = 2 * Hkv * T * hd * 2        # K and V, Hkv heads, 2 bytes per bf16 element
    return flops / bytes_read


def _decoupled_attention_params(D, H, Hkv, hd):
    """Parameters of four bias-free projections with head_dim set on its own (meta Linear layers):
    W_q d -> H·hd, W_k and W_v d -> Hkv·hd, W_o H·hd -> d."""
    import torch

    layers = [torch.nn.Linear(D, H * hd, bias=False, device="meta"),
              torch.nn.Linear(D, Hkv * hd, bias=False, device="meta"),
              torch.nn.Linear(D, Hkv * hd, bias=False, device="meta"),
              torch.nn.Linear(H * hd, D, bias=False, device="meta")]
    return sum(p.numel() for layer in layers for p in layer.parameters())


def _decode_step_ms(N, kv, bw):
    """Bandwidth bound of one decode step: N·10⁹ bf16 weights (bytes of a meta tensor) and kv·10⁹
    bytes of cache, read once at bw TB/s, in milliseconds."""
    import torch

    weight_bytes = torch.empty(N * 10**9, dtype=torch.bfloat16, device="meta").nbytes
    return (weight_bytes + kv * 10**9) / (bw * 10**12) * 1000


def _weight_crossover_batch(fm, P, bw, b):
    """The batch B at which a decode step's weight matmuls take as long on the arithmetic
    (2 FLOPs per weight and token at P TFLOP/s) as on the bytes (b per weight at bw TB/s);
    the weights of the flops-memory reference's Llama-2-70B layer, though their count cancels."""
    N = fm.attention_params(8192, 64, 8)
    seconds_per_unit_batch = 2 * N / (P * 10**12)     # compute time per sequence in the batch
    memory_seconds = N * b / (bw * 10**12)              # one read of the weights
    return memory_seconds / seconds_per_unit_batch


def _training_flops_per_token(fm, L, d, T):
    """6N + 3 × (forward score-matmul FLOPs per token), with N = L·(attention 4·d² from the
    reference + an MLP of 8·d²) and the score matmuls from the reference's attention_flops
    (batch 1, minus its four projections), per token."""
    H = d // 128
    N = L * (fm.attention_params(d, H) + 2 * d * 4 * d)
    scores_forward = fm.attention_flops(1, T, d, H) - 4 * 2 * T * d * d
    return 6 * N + 3 * L * scores_forward // T


def _flash_forward_flops(flash_tiling, B, H, T, hd):
    """FLOPs FlopCounterMode counts in the flash-tiling reference's forward, one tile (meta tensors)."""
    import torch

    q = torch.empty(B, H, T, hd, device="meta")
    return _counted_flops(lambda: flash_tiling.flash_attention(q, q, q, block_q=T, block_k=T))


def _cross_cache_bytes(cross_attention, B, Tk, d, n_heads=8):
    """Bytes of the keys and values a decoder layer caches for cross-attention: k_proj and v_proj of the
    source, from the reference module on meta tensors in bf16 (the generated tokens never enter them)."""
    import torch
    m = cross_attention.MultiHeadAttention(d, n_heads).to(device="meta", dtype=torch.bfloat16)
    source = torch.empty(B, Tk, d, device="meta", dtype=torch.bfloat16)
    return m.k_proj(source).nbytes + m.v_proj(source).nbytes


def _roofline_answers():
    """The roofline kata's numeric questions from its reference: decode attention's FLOPs per byte at
    any T and batch, and a decode step on an H100's bf16 peak, whose bytes decide it (its bound says so);
    the experts' crossover batch, from the reference's crossover per expert; a tensor-parallel layer's
    all-reduces against its matmuls, timed by the reference's decode_step on the GPU's share of the
    weights; and the activations a GPT layer keeps, as autograd saves them on meta tensors."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from reference import roofline

    H100 = {"hbm_bytes_per_s": 3.35e12, "flops_per_s": 989e12}   # bf16 peak
    NVLINK = 450e9   # H100 NVLink, bytes/s each way per GPU

    def step_ms(p):
        seconds, bound = roofline.decode_step(p["N"] * 10**9, p["kvt"] * 2**20, p["T"], p["B"], p["bw"] * 10**12,
                                              989e12, roofline.dtype_bytes("bf16"))
        assert bound == "memory", p
        return seconds * 1000

    def all_reduce_over_matmul(p, d, tokens=65_536):
        # A forward of `tokens` tokens through the GPU's 12·d²/p weights is a decode step of that batch
        # with no cache: 2 FLOPs per weight per token, the weights read once. The tokens cancel.
        matmul_s, bound = roofline.decode_step(12 * d**2 // p, 0, 0, tokens, **H100)
        assert bound == "compute", (p, d)
        activation = torch.empty(tokens, d, dtype=torch.bfloat16, device="meta")   # (tokens, d)
        ring = 2 * (p - 1) / p * activation.nbytes   # a reduce-scatter and an all-gather, (p - 1)/p each
        return 2 * ring / NVLINK / matmul_s   # two all-reduces: after attention, after the MLP

    def activation_bytes(s, b, h, a):
        """Bytes autograd keeps for the backward of a GPT-2 layer in bf16 (Korthikanti et al.'s layer)."""
        def dropout(x):   # p = 0.1, its mask kept as 1 byte per element (meta tensors hold no values to draw)
            return x * torch.empty_like(x, dtype=torch.bool) / 0.9

        class Layer(nn.Module):
            def __init__(self):
                super().__init__()
                self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
                self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
                self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

            def forward(self, x):
                q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, a, h // a).permute(2, 0, 3, 1, 4)   # (b, a, s, h/a) each
                weights = dropout(torch.softmax(q @ k.transpose(-2, -1) / (h // a) ** 0.5, dim=-1))   # (b, a, s, s)
                x = x + dropout(self.proj((weights @ v).transpose(1, 2).reshape(b, s, h)))   # (b, s, h)
                return x + dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))))   # (b, s, h)

        with torch.device("meta"):
            layer = Layer().to(torch.bfloat16)
            x = torch.empty(b, s, h, dtype=torch.bfloat16, requires_grad=True)   # (b, s, h)
        params = set(layer.parameters())
        kept = []

        def keep(t):
            # Not the weights (nor their transposes), nor the LayerNorms' (b, s, 1) means and 1/stds,
            # which the paper leaves out: 4·s·b numbers against 34·s·b·h bytes.
            if (t if t._base is None else t._base) not in params and t.shape[-1] != 1:
                kept.append(t.nbytes)
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            layer(x)
        return sum(kept)

    return {
        ("roofline", "gqa-decode-flops-per-byte"): lambda p: roofline.attention_decode_intensity(
            p["H"], p["Hkv"], 4096, 8, p["b"]),
        ("roofline", "decode-step-from-kv-per-token"): step_ms,
        ("roofline", "mfu-of-a-run"): lambda p: roofline.mfu(p["tps"], p["N"] * 10**9, p["L"], p["T"], p["d"],
                                                            p["P"] * 10**15),
        ("roofline", "activation-bytes-per-layer"): lambda p: activation_bytes(p["s"], p["b"], p["h"], p["a"]),
        # Each expert multiplies its weights by the B·k/E tokens routed to it: the crossover holds per expert.
        ("roofline", "moe-decode-crossover"): lambda p: roofline.crossover_batch(
            H100["flops_per_s"], H100["hbm_bytes_per_s"], p["b"]) * p["E"] / p["k"],
        ("roofline", "tp-all-reduce-over-matmul"): lambda p: all_reduce_over_matmul(p["p"], p["d"]),
    }


def _doc_masking_answers():
    """The doc-masking kata's numeric questions from its reference: the last token's position in a
    packed row of three documents, the pairs one document's prefix-LM mask allows, and the tokens
    whose next token is in their own document."""
    import torch

    from reference import doc_masking

    next_in_same_document = lambda ids: ids[1:] == ids[:-1]   # (T - 1,): token t + 1 in token t's document

    return {
        ("doc-masking", "last-position-id"): lambda p: int(doc_masking.position_ids(
            torch.tensor([0, p["a"], p["a"] + p["b"], p["a"] + p["b"] + p["c"]]))[-1]),
        ("doc-masking", "prefix-lm-pairs"): lambda p: int(doc_masking.prefix_lm_mask(
            torch.tensor([0, p["n"]]), torch.tensor([p["p"]])).sum()),
        # A token has a target when the next token of the row is in its own document.
        ("doc-masking", "packed-loss-targets"): lambda p: int(next_in_same_document(doc_masking.document_ids(
            torch.tensor([0, p["a"], p["a"] + p["b"], p["a"] + p["b"] + p["c"]]))).sum()),
    }


def _agrees_with_the_reference():
    """Numeric questions whose answer a reference function computes too: (kata, id) -> params -> value."""
    import torch

    from reference import (attention_backward, causal_mask, cross_attention, flash_tiling, flops_memory, kv_cache, rope,
                           scaling_variance, sliding_window, split_heads)

    fm = flops_memory

    def rope_theta(hd, base, i):
        """θ_i from the rope reference's float64 cache: the angle of pair i at position 1 (θ_i <= 1 < π)."""
        cos, sin = rope.rope_cache(2, hd, base, dtype=torch.float64)
        return float(torch.atan2(sin[1, i], cos[1, i]))

    return {
        ("scaling-variance", "unscaled-std"): lambda p: scaling_variance.score_std(p["d"], "none"),
        ("scaling-variance", "linear-scale-std"): lambda p: scaling_variance.score_std(p["d"], "linear"),
        ("causal-mask", "allowed-pairs"): lambda p: int(causal_mask.causal_mask(p["T"]).sum()),
        ("causal-mask", "first-query-keys"): lambda p: int(causal_mask.causal_mask(p["q"], p["k"])[0].sum()),
        ("causal-mask", "mask-bytes"): lambda p: causal_mask.causal_mask(p["T"], device="meta").nbytes,
        ("split-heads", "head-channel"): lambda p: int(split_heads.split_heads(
            torch.arange(p["C"]).expand(1, 1, p["C"]), p["H"])[0, p["h"], 0, p["j"]]),
        ("split-heads", "head-stride"): lambda p: split_heads.split_heads(
            torch.empty(2, p["T"], p["C"], device="meta"), p["H"]).stride(1),
        ("mha", "param-count"): lambda p: fm.attention_params(p["d"], p["H"], bias=True),
        ("mha", "layer-flops"): lambda p: fm.attention_flops(p["B"], p["T"], p["d"], p["H"]),
        ("mha", "weights-bytes"): lambda p: fm.attention_scores_bytes(p["B"], p["H"], p["T"], bytes_per_element=4),
        # The attention part only: the four projections are 2·B·T·C² FLOPs each.
        ("mha-by-loop", "all-heads-flops"): lambda p: (fm.attention_flops(p["B"], p["T"], p["C"], p["H"])
                                                       - 4 * 2 * p["B"] * p["T"] * p["C"] ** 2),
        ("gqa", "kv-cache-bytes"): lambda p: fm.kv_cache_bytes(p["B"], p["T"], p["L"], p["Hkv"], p["hd"], 2),
        ("gqa", "gqa-params"): lambda p: fm.attention_params(p["D"], p["H"], p["Hkv"]),
        ("flops-memory", "score-bytes"): lambda p: fm.attention_scores_bytes(p["B"], p["H"], p["T"], 2),
        ("flops-memory", "attention-flops"): lambda p: fm.attention_flops(p["B"], p["T"], p["D"], p["H"]),
        ("flops-memory", "max-seq-len"): lambda p: fm.max_seq_len(p["M"] * 2**30, p["B"], p["H"], 2),
        ("kv-cache", "cache-bytes"): lambda p: _kv_cache_bytes(kv_cache, p["Hkv"], p["Hkv"], p["B"], p["t"], p["hd"],
                                                              torch.bfloat16),
        ("kv-cache", "gqa-cache-ratio"): lambda p: (_kv_cache_bytes(kv_cache, p["H"], p["H"])
                                                    / _kv_cache_bytes(kv_cache, p["H"], p["Hkv"])),
        ("kv-cache", "tokens-that-fit"): lambda p: p["M"] * 2**30 // (
            p["L"] * _kv_cache_bytes(kv_cache, p["Hkv"], p["Hkv"], p["B"], 1, p["hd"], torch.bfloat16)),
        ("sliding-window", "allowed-pairs"): lambda p: int(sliding_window.sliding_window_mask(p["T"], p["T"], p["W"]).sum()),
        ("sliding-window", "receptive-field"): lambda p: _receptive_field(p["W"], p["L"]),
        ("sliding-window", "rolling-cache-bytes"): lambda p: _rolling_cache_bytes(p["W"], p["B"], p["T"]),
        ("rope", "pair-angle"): lambda p: p["p"] * rope_theta(p["hd"], p["base"], p["i"]),
        ("rope", "pair-wavelength"): lambda p: 2 * torch.pi / rope_theta(p["hd"], p["base"], p["i"]),
        ("rope", "cache-bytes"): lambda p: sum(t.nbytes for t in rope.rope_cache(p["T"], p["hd"])),
        ("attention-backward", "backward-flops"): lambda p: _counted_flops(attention_backward.attention_backward, *[
            torch.empty(p["B"], p["H"], p["T"], p["hd"], device="meta")] * 4),
        # dS is shaped like P, the (B, H, T, T) weights saved for the backward.
        ("attention-backward", "saved-weights-bytes"): lambda p: attention_backward.softmax_backward(*[
            torch.empty(p["B"], p["H"], p["T"], p["T"], dtype=torch.bfloat16, device="meta")] * 2).nbytes,
        # Counted from the products the reference records on meta tensors (head_dim 8: only the scores contract it).
        ("flash-tiling", "causal-tiles"): lambda p: _flash_score_tiles(flash_tiling, 1, 1, p["T"], p["b"], True)[0],
        ("flash-tiling", "tile-bytes"): lambda p: _flash_score_tiles(flash_tiling, p["B"], p["H"], p["T"], p["b"],
                                                                      False)[1] * 4,
        # A document mask for a packed row: block-diagonal, one reference causal mask per document.
        ("causal-mask", "document-mask-pairs"): lambda p: int(torch.block_diag(
            *[causal_mask.causal_mask(n) for n in (p["a"], p["b"], p["c"])]).sum()),
        ("sliding-window", "interleaved-cache-bytes"): lambda p: _interleaved_cache_bytes(kv_cache, p["N"], p["W"], p["T"]),
        ("kv-cache", "cat-copy-bytes"): lambda p: _cat_copy_bytes(kv_cache, p["P"], p["N"], p["Hkv"], p["hd"]),
        ("kv-cache", "paged-blocks"): lambda p: -(-p["t"] // p["b"]),   # integer ceiling, no float
        ("gqa", "decode-intensity"): lambda p: _gqa_decode_intensity(p["H"], p["Hkv"], p["hd"], p["T"]),
        ("flops-memory", "decoupled-head-dim-params"): lambda p: _decoupled_attention_params(p["D"], p["H"], p["Hkv"], p["hd"]),
        ("flops-memory", "decode-step-time"): lambda p: _decode_step_ms(p["N"], p["kv"], p["bw"]),
        ("flops-memory", "decode-crossover-batch"): lambda p: _weight_crossover_batch(fm, p["P"], p["bw"], p["b"]),
        ("flops-memory", "training-flops-per-token"): lambda p: _training_flops_per_token(fm, p["L"], p["d"], p["T"]),
        ("rope", "pi-angle"): lambda p: p["p"] / p["s"] * rope_theta(p["hd"], 10000, p["i"]),
        # Forward (the flash-tiling reference, one tile) plus the backward the reference counts.
        ("attention-backward", "train-matmul-flops"): lambda p: (
            _flash_forward_flops(flash_tiling, p["B"], p["H"], p["T"], p["hd"])
            + _counted_flops(attention_backward.attention_backward, *[
                torch.empty(p["B"], p["H"], p["T"], p["hd"], device="meta")] * 4)),
        # The source's k_proj and v_proj: the generated tokens never enter them.
        ("cross-attention", "cross-cache-bytes"): lambda p: _cross_cache_bytes(cross_attention, p["B"], p["Tk"], p["d"]),
        **_roofline_answers(),
        **_doc_masking_answers(),
        **_flash_decoding_answers(),
        **_paged_kv_answers(),
        **_mla_answers(),
        **_linear_attention_answers(),
        **_rope_scaling_answers(),
        **_tp_attention_answers(),
        **_ring_attention_answers(),
        **_spec_decode_answers(),
        **_prefix_cache_answers(),
        **_kv_quant_answers(),
        **_triton_softmax_answers(),
        **_triton_flash_answers(),
        **_triton_paged_decode_answers(),
    }


def _triton_softmax_answers():
    """triton-softmax: the unfused path's bytes counted on meta tensors, each of its five kernels
    charged the tensors it reads and the one it writes; the padding lanes from the BLOCK the
    reference's launcher picks (triton.next_power_of_2); the occupancy as the tutorial's launcher
    computes it."""
    import torch
    import triton

    def unfused_bytes(R, C):
        x = torch.empty(R, C, device="meta")
        x_max = x.amax(dim=1)
        z = x - x_max[:, None]
        numerator = torch.exp(z)
        denominator = numerator.sum(dim=1)
        out = numerator / denominator[:, None]
        kernels = [((x,), x_max), ((x, x_max), z), ((z,), numerator), ((numerator,), denominator),
                   ((numerator, denominator), out)]
        return sum(t.nbytes for ins, written in kernels for t in (*ins, written))

    return {("triton-softmax", "unfused-bytes"): lambda p: unfused_bytes(p["R"], p["C"]),
            ("triton-softmax", "padding-lanes"): lambda p: p["R"] * (triton.next_power_of_2(p["C"]) - p["C"]),
            # the tutorial's NUM_SM * occupancy, occupancy = NUM_REGS // (n_regs * WARP_SIZE * num_warps),
            # on an H100 SXM: 132 SMs of 65,536 registers
            ("triton-softmax", "resident-programs"): lambda p: 132 * (65536 // (p["n_regs"] * 32 * p["num_warps"]))}


def _spec_decode_answers():
    """spec-decode: tokens per step from the reference's accept_greedy on a chain whose first k
    drafts the target agrees with (probability α^k (1 - α), or α^γ for all γ), and the nodes of a
    full tree counted from the reference's tree_positions."""
    import torch

    from reference import spec_decode as sd

    def emitted(g, k):
        """Tokens one step emits when the target agrees with the first k of g drafted tokens."""
        logits = torch.zeros(g + 1, 3)
        logits[torch.arange(g + 1), torch.tensor([1] * k + [2] * (g + 1 - k))] = 1.0   # 1: agree, 2: not
        path, _bonus = sd.accept_greedy([1] * g, [-1] + list(range(g - 1)), logits)
        return len(path) + 1

    def tokens_per_step(g, a):
        return sum((a ** k * (1 - a) if k < g else a ** g) * emitted(g, k) for k in range(g + 1))

    def full_tree_nodes(b, D):
        parents, level = [], [-1]
        for _ in range(D):   # each node of a level gets b children
            below = []
            for parent in level:
                below += range(len(parents), len(parents) + b)
                parents += [parent] * b
            level = below
        assert int(sd.tree_positions(parents, 0).max()) == D - 1
        return len(sd.tree_positions(parents, 0))

    return {
        ("spec-decode", "tokens-per-step"): lambda p: tokens_per_step(p["g"], p["a"]),
        ("spec-decode", "tree-nodes"): lambda p: full_tree_nodes(p["b"], p["D"]),
    }


def _tp_attention_answers():
    """tp-attention: the reference's own shards and module on meta tensors, rank 0."""
    from unittest import mock

    import torch

    from reference import tp_attention as tp

    def full(D, H, Hkv, hd):
        m = lambda *shape: torch.empty(*shape, dtype=torch.bfloat16, device="meta")
        return {"c_attn.weight": m((H + 2 * Hkv) * hd, D), "c_attn.bias": m((H + 2 * Hkv) * hd),
                "c_proj.weight": m(D, H * hd), "c_proj.bias": m(D)}

    def kv_cache_bytes(L, H, Hkv, hd, p):
        sd = full(8, H, Hkv, hd)
        rows, _ = tp.shard_qkv(sd["c_attn.weight"], sd["c_attn.bias"], H, Hkv, 0, p)
        return L * (rows.shape[0] - H // p * hd) * 2   # the rank's K and V rows, 2 bytes each, every layer

    def params(D, H, Hkv, p):
        return sum(t.numel() for t in tp.TensorParallelAttention(full(D, H, Hkv, D // H), H, Hkv, 0, p).parameters())

    def all_reduce_bytes(p, B, T, D):
        reduced = []
        with mock.patch.object(tp.dist, "all_reduce", lambda t: reduced.append(t.nbytes)):
            tp.TensorParallelAttention(full(D, 32, 8, D // 32), 32, 8, 0, p)(torch.empty(B, T, D, dtype=torch.bfloat16,
                                                                                         device="meta"))
        return 2 * (p - 1) * reduced[0] // p   # a ring: a reduce-scatter and an all-gather of (p - 1)/p each

    return {("tp-attention", "tp-kv-cache-per-gpu"): lambda p: kv_cache_bytes(p["L"], p["H"], p["Hkv"], p["hd"], p["p"]),
            ("tp-attention", "params-per-rank"): lambda p: params(p["D"], p["H"], p["Hkv"], p["p"]),
            ("tp-attention", "all-reduce-bytes"): lambda p: all_reduce_bytes(p["p"], p["B"], p["T"], p["D"])}


def _ring_attention_answers():
    """ring-attention: the reference's ring run rank by rank on meta tensors, its point-to-point
    calls answered by stand-ins that count what each rank sends, its score products recorded."""
    import math
    from types import SimpleNamespace
    from unittest import mock

    import torch

    from graders.engine.products import score_tiles
    from graders.engine.worker import _recorder
    from reference import ring_attention as ra

    def run(rank, world, T, H, hd, causal, ops=None):
        sent = []
        send = lambda t, peer: sent.append(t.nbytes) or SimpleNamespace(wait=lambda: None)
        recv = lambda t, peer: SimpleNamespace(wait=lambda: None)
        qkv = [torch.empty(1, H, T, hd, dtype=torch.bfloat16, device="meta") for _ in range(3)]
        with mock.patch.multiple(ra.dist, isend=send, irecv=recv, P2POp=lambda op, t, peer: (op, t, peer),
                                 batch_isend_irecv=lambda p2p: [op(t, peer) for op, t, peer in p2p]):
            if ops is None:
                ra.ring_attention(*qkv, causal, rank, world)
            else:
                with _recorder()(ops):
                    ra.ring_attention(*qkv, causal, rank, world)
        return sum(sent)

    def blocks(world, T=8, hd=3):   # head_dim 3: only the scores contract it
        total = 0
        for rank in range(world):
            ops = []
            run(rank, world, T, 1, hd, True, ops)
            total += sum(math.prod(tile) for tile in score_tiles(ops, hd)) // (T * T)
        return total

    return {("ring-attention", "ring-bytes-per-rank"): lambda p: run(0, p["N"], p["T"] // p["N"], p["Hkv"], p["hd"],
                                                                     False),
            ("ring-attention", "contiguous-causal-blocks"): lambda p: blocks(p["N"])}


def _rope_scaling_answers():
    """rope-scaling: counted on the reference's own frequencies, and its attention factor and NTK base."""
    from reference import rope_scaling as rs

    def kept_pairs(d, b, L, h):
        """Pairs whose Llama 3.1 frequency is RoPE's own (factor 8, low_freq_factor 1)."""
        return int((rs.llama3_inv_freq(d, b, 8.0, L, 1.0, h) == rs.rope_inv_freq(d, b)).sum())

    def ntk_base(b, d, s):
        """The base whose pair-1 frequency base'^(-2/d) is the reference's NTK pair 1."""
        return float(rs.ntk_inv_freq(d, b, s)[1]) ** (-d / 2)

    return {("rope-scaling", "llama3-kept-pairs"): lambda p: kept_pairs(p["d"], p["b"], p["L"], p["h"]),
            ("rope-scaling", "yarn-logit-scale"): lambda p: rs.yarn_attention_factor(p["s"]) ** 2,
            ("rope-scaling", "ntk-base"): lambda p: ntk_base(p["b"], p["d"], p["s"])}


def _linear_attention_answers():
    """linear-attention: the state (S, z) the reference's linear_attention_step returns, on meta
    tensors, and a key's weight in it, stepped with one-hot values."""
    import torch

    from reference import linear_attention as la

    def state(B, H, d):
        x = torch.empty(B, H, d, dtype=torch.float16, device="meta")
        return la.linear_attention_step(x, x, x)[1]

    def crossover(d):
        held = sum(t.numel() for t in state(1, 1, d))
        return next(t for t in range(1, held + 2) if t * (d + d) > held)   # a KV cache of t tokens, d = dv

    def half_life(h):
        """Tokens after key 0 until its weight in S falls below half: k = 0 makes phi(k) = 1, and the
        values are 1 for key 0 and 0 after it, so S holds key 0's weight alone."""
        gamma = 1 - 2 ** (-5 - h)   # RetNet's decay of head h
        zero, one = torch.zeros(1, 1, 1, dtype=torch.float64), torch.ones(1, 1, 1, dtype=torch.float64)
        _, (S, z) = la.linear_attention_step(zero, zero, one, None, gamma)
        n = 0
        while S.item() >= 0.5:
            _, (S, z) = la.linear_attention_step(zero, zero, zero, (S, z), gamma)
            n += 1
        return n

    return {("linear-attention", "state-bytes"): lambda p: sum(t.nbytes for t in state(p["B"], p["H"], p["d"])),
            ("linear-attention", "cache-crossover"): lambda p: crossover(p["d"]),
            ("linear-attention", "decay-half-life"): lambda p: half_life(p["h"])}


def _mla_answers():
    """mla: numbers per token read off the cache the reference module returns (on meta tensors), the
    FLOPs its absorbed decoding step spends per cached token, and the share of one KV head a rank of the
    tp-attention reference holds."""
    import torch

    from reference import mla
    from reference import tp_attention as tp

    def cached_numbers(r, rope):
        with torch.device("meta"):
            m = mla.MultiHeadLatentAttention(8, 1, r, 2, rope, 2)
            _, cache = m(torch.empty(1, 3, 8))
        return sum(t.numel() for t in cache) // 3

    def absorbed_flops_per_cached_token(H, r, rope):
        """FLOPs of an absorbed decoding step over a cache of 2 tokens minus one over 1: the new token's
        projections cancel, what grows with the cache stays."""
        with torch.device("meta"):
            m = mla.MultiHeadLatentAttention(8, H, r, 2, rope, 2)
            step = lambda t: _counted_flops(m, torch.empty(1, 1, 8), (torch.empty(1, t, r), torch.empty(1, t, rope)),
                                            True)
            return step(2) - step(1)

    def latent_share_per_rank(p):
        """The share of its one KV head a rank keeps when tp-attention's reference splits 128 query heads and
        1 KV head over p ranks: MLA's latent, read by every query head, is that one KV head."""
        hd, rows = 2, (128 + 2) * 2
        weight, bias = torch.empty(rows, 8, device="meta"), torch.empty(rows, device="meta")
        kept, _ = tp.shard_qkv(weight, bias, 128, 1, 0, p)
        return (kept.shape[0] - 128 // p * hd) / (2 * hd)   # the rank's K and V rows over the head's

    return {
        ("mla", "gqa-equivalent-groups"): lambda p: cached_numbers(p["r"], p["rope"]) / mla.kv_cache_bytes_per_token(
            1, p["hd"], 1, 1),
        ("mla", "mha-over-mla"): lambda p: mla.kv_cache_bytes_per_token(p["H"], p["hd"], 1, 1) / cached_numbers(
            p["r"], p["rope"]),
        ("mla", "cache-gib"): lambda p: p["B"] * p["t"] * p["L"] * cached_numbers(p["r"], p["rope"]) * 2 / 2**30,
        ("mla", "absorbed-decode-intensity"): lambda p: absorbed_flops_per_cached_token(p["H"], p["r"], p["rope"]) / (
            cached_numbers(p["r"], p["rope"]) * p["b"]),
        ("mla", "tp-replicates-latent"): lambda p: (p["B"] * p["t"] * p["L"] * cached_numbers(p["r"], p["rope"]) * 2
                                                    * latent_share_per_rank(p["p"]) / 2**30),
    }


def _paged_kv_answers():
    """paged-kv: blocks counted on the reference's own cache, built and read through its allocator."""
    import torch

    from reference import paged_kv

    def blocks_held(L, b):
        cache = paged_kv.PagedKVCache(-(-L // b), b, 1, 1)
        cache.append(0, torch.zeros(L, 1, 1), torch.zeros(L, 1, 1))
        return len(cache.block_table(0))

    def blocks_in_use(P, b, n):
        """A prompt of P tokens, forked so that n sequences hold it, then one token each."""
        cache = paged_kv.PagedKVCache(-(-P // b) + n + 1, b, 1, 1)
        cache.append(0, torch.zeros(P, 1, 1), torch.zeros(P, 1, 1))
        for i in range(1, n):
            cache.fork(0, i)
        for i in range(n):
            cache.append(i, torch.zeros(1, 1, 1), torch.zeros(1, 1, 1))
        return cache.allocator.num_blocks - cache.allocator.num_free()

    def prefix_hits(P, b):
        """vLLM's hash chain over two prompts that agree on their first P tokens: each full block
        hashed with its parent's hash, the new prompt's blocks looked up until the first miss."""
        def hashes(tokens):
            chain, parent = [], None
            for i in range(len(tokens) // b):   # full blocks only
                parent = hash((parent, tuple(tokens[i * b:(i + 1) * b])))
                chain.append(parent)
            return chain

        cached = set(hashes(list(range(P)) + [10**6] * (2 * b)))   # token P on differs
        new = hashes(list(range(P)) + [2 * 10**6] * (2 * b))
        return next((i for i, h in enumerate(new) if h not in cached), len(new))

    def gather_copy_bytes(L, Hkv, hd):
        """What the reference's gather writes and attention then reads again: its K and V, twice."""
        cache = paged_kv.PagedKVCache(-(-L // 16), 16, Hkv, hd, dtype=torch.bfloat16)
        cache.append(0, torch.zeros(L, Hkv, hd, dtype=torch.bfloat16), torch.zeros(L, Hkv, hd, dtype=torch.bfloat16))
        return 2 * sum(t.nbytes for t in cache.gather(0))

    return {
        ("paged-kv", "blocks-held"): lambda p: blocks_held(p["L"], p["b"]),
        ("paged-kv", "forked-samples-blocks"): lambda p: blocks_in_use(p["P"], p["b"], p["n"]),
        ("paged-kv", "prefix-cache-hits"): lambda p: prefix_hits(p["P"], p["b"]),
        ("paged-kv", "gather-copy-bytes"): lambda p: gather_copy_bytes(p["L"], p["Hkv"], p["hd"]),
    }


def _triton_paged_decode_answers():
    """triton-paged-decode: bytes of float16 keys and values counted on meta tensors of the cache's
    shape, and a sequence's blocks counted from its positions, as the kernel walks them."""
    import torch

    def kv_bytes(B, L):
        """Bytes of the keys and values of B sequences of L tokens, 8 KV heads of 128 channels."""
        return 2 * torch.empty(B, L, 8, 128, dtype=torch.float16, device="meta").nbytes

    def waste(L, bs):
        blocks = torch.unique(torch.arange(L) // bs).numel()   # the logical blocks positions 0 .. L-1 fall in
        return blocks * bs - L

    return {
        # one program per query head: each KV head's keys and values read once per query head, G times
        ("triton-paged-decode", "kv-bytes-per-query-head"): lambda p: p["G"] * kv_bytes(p["B"], p["L"]) / 2**20,
        ("triton-paged-decode", "last-block-waste"): lambda p: waste(p["L"], p["bs"]),
        # the gather reads the keys and values once and writes them once
        ("triton-paged-decode", "gather-extra-bytes"): lambda p: 2 * kv_bytes(p["B"], p["L"]) / 2**20,
    }


def _kv_quant_answers():
    """kv-quant: bytes counted on the reference's own cache (codes and scales as it stores them, on
    meta tensors), and the int8 step of its quantize."""
    import torch

    from reference import kv_quant

    def stored(B, Hkv, hd, T):
        """Bytes of codes and of scales the reference cache holds after one append of T tokens."""
        cache = kv_quant.QuantKVCache(torch.int8)
        cache.append(*[torch.empty(B, Hkv, T, hd, device="meta")] * 2)
        return (sum(t.nbytes for t in cache.k + cache.v), sum(t.nbytes for t in cache.k_scale + cache.v_scale))

    def ratio(Hkv, hd, G):
        """bf16 bytes per token over int8's, the keys' scales shared by a group of G tokens."""
        codes, scales = stored(1, Hkv, hd, G)
        return 2 * 2 * Hkv * hd / ((codes + scales) / G)

    return {("kv-quant", "int8-max-error"): lambda p: p["a"] / kv_quant.QMAX[torch.int8] / 2,
            ("kv-quant", "cache-ratio"): lambda p: ratio(p["Hkv"], p["hd"], p["G"]),
            ("kv-quant", "tokens-that-fit"): lambda p: p["M"] * 2**30 // (
                p["L"] * stored(p["B"], p["Hkv"], p["hd"], 1)[0])}


def _triton_flash_answers():
    """triton-flash: the programs of the grid, the key blocks a causal program loads and the bytes
    of q, k and v loaded, from the grader's expected launch (tests/test_kata_triton_flash.py checks
    it against the reference's recorded loads)."""
    from reference.triton_flash_expected import grid, key_blocks

    def launched(B, H, T, BM):
        x, y, z = grid(B, H, T, BM)
        return x * y * z

    return {("triton-flash", "grid-programs"): lambda p: launched(p["B"], p["H"], p["T"], p["BM"]),
            ("triton-flash", "waves"): lambda p: -(-launched(p["B"], p["H"], p["T"], 128) // p["S"]),
            ("triton-flash", "causal-key-blocks"): lambda p: key_blocks(p["T"], p["BM"], p["BN"], True)[p["m"]],
            # q once, k and v once per query block: 2 bytes an element in float16
            ("triton-flash", "kv-bytes-read"): lambda p: 2 * p["B"] * p["H"] * p["T"] * p["D"] * (
                1 + 2 * grid(p["B"], p["H"], p["T"], p["BM"])[0])}


def _flash_decoding_answers():
    """The empty splits the reference's split_kv_decode hands partial_attention, the weight its
    merge_partials gives out_1 (out_1 = 1 and out_2 = 0: the merged output is that weight), a
    base-2 lse's weight once multiplied by ln 2, and the splits that reach N blocks when each adds
    the tiles of scores of one split (one per sequence and KV head: the blocks a GPU runs)."""
    import math

    import torch

    from conftest import split_lengths
    from graders.engine.products import score_tiles
    from graders.engine.worker import _recorder
    from reference import flash_decoding as fd

    def weight(a, b):
        one = torch.ones(1, 1, 1, 1, dtype=torch.float64)
        out, _ = fd.merge_partials([one, 0 * one], [torch.full((1, 1, 1), a, dtype=torch.float64),
                                                    torch.full((1, 1, 1), b, dtype=torch.float64)])
        return float(out)

    def splits_to_fill(B, H, Hkv, N, hd=3):
        ops = []
        with _recorder()(ops):   # one split: its score tiles are the blocks each split adds
            fd.split_kv_decode(torch.zeros(B, H, 1, hd), torch.zeros(B, Hkv, 8, hd), torch.zeros(B, Hkv, 8, hd), 1)
        per_split = sum(math.prod(tile[:-2]) for tile in score_tiles(ops, hd))   # (B, Hkv, rows, Tc): B · Hkv
        return -(-N // per_split)

    return {("flash-decoding", "empty-splits"): lambda p: split_lengths(p["T"], p["n"]).count(0),
            ("flash-decoding", "merge-weight"): lambda p: weight(p["a"], p["b"]),
            ("flash-decoding", "lse-base-2"): lambda p: weight(p["a"] * math.log(2), p["b"]),
            ("flash-decoding", "splits-to-fill-sms"): lambda p: splits_to_fill(p["B"], p["H"], p["Hkv"], p["N"])}


def test_numeric_answers_agree_with_the_references_on_every_parameter_choice():
    from graders.engine.questions import _combinations

    checked = 0
    for (slug, ident), compute in _agrees_with_the_reference().items():
        q = next(q for q in manifest.find(slug).followups if q.id == ident)
        for params in _combinations(q.params):
            expected = questions.Asked(slug, q, params, ()).expected
            assert expected == pytest.approx(compute(params), rel=1e-12), (slug, ident, params)
            checked += 1
    assert checked > 200


def _prefix_cache_answers():
    """prefix-cache: hits counted by the reference's own cache, on prompts of distinct token ids."""
    from reference.prefix_cache import PrefixCache

    def cached_again(n, b):
        """A prompt of n tokens allocated, freed, and sent again: the tokens the cache gives back."""
        cache = PrefixCache(-(-n // b) + 1, b)
        cache.allocate("first", list(range(n)))
        cache.free("first")
        return cache.allocate("again", list(range(n)))[1]

    def computed(R, S, U, b):
        """R requests of the same S system tokens and U of their own, one after the other."""
        cache, total = PrefixCache(R * (-(-(S + U) // b)), b), 0
        for r in range(R):
            prompt = list(range(S)) + list(range(S + r * U, S + (r + 1) * U))
            total += S + U - cache.allocate(r, prompt)[1]
        return total

    return {("prefix-cache", "cached-tokens"): lambda p: cached_again(p["n"], p["b"]),
            ("prefix-cache", "prefill-saved"): lambda p: computed(p["R"], p["S"], p["U"], p["b"])}
