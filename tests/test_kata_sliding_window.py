"""The sliding-window grader on solutions written the way learners write them (not via the bug
oracles), one wrong file per check, and its independent oracles: SDPA with the band as attn_mask,
SDPA's causal attention, and decoding through the reference cache."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import checks_by_id
from graders.sliding_window import MASKS, spans, trusted_decode, trusted_windows
from graders.sliding_window_hidden import fresh_chunks
from reference.sliding_window import RollingKVCache, sliding_window_attention, sliding_window_mask
from reference.sliding_window_expected import band

# A triu/tril difference mask, einsum attention and a shift-register cache that keeps the last
# window tokens oldest first (a view of the last concatenation): nothing like the reference.
SOLUTION = '''
import torch


def sliding_window_mask(Tq, Tk, window, device=None):
    if window < 1 or Tq > Tk:
        raise ValueError(f"need window >= 1 and Tq <= Tk, got Tq={Tq}, Tk={Tk}, window={window}")
    ones = torch.ones(Tq, Tk, dtype=torch.bool, device=device)
    return ones.tril(Tk - Tq) & ones.triu(Tk - Tq - window + 1)


def sliding_window_attention(q, k, v, window):
    att = torch.einsum("bhqd,bhkd->bhqk", q, k) * q.shape[-1] ** -0.5
    allowed = sliding_window_mask(q.shape[-2], k.shape[-2], window, device=q.device)
    att = att.masked_fill(~allowed, float("-inf"))
    return torch.einsum("bhqk,bhkd->bhqd", att.softmax(dim=-1), v)


class RollingKVCache:
    def __init__(self, window):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.k = self.v = None   # the last (at most) window tokens, oldest first
        self.n = 0

    def __len__(self):
        return self.n

    def append(self, k, v):
        if self.k is None:
            k_win, v_win = k, v
        else:
            start = max(self.k.shape[2] - (self.window - 1), 0)
            k_win = torch.cat([self.k[:, :, start:], k], dim=2)
            v_win = torch.cat([self.v[:, :, start:], v], dim=2)
        self.k, self.v = k_win[:, :, -self.window:], v_win[:, :, -self.window:]
        self.n += k.shape[2]
        return k_win, v_win
'''

LOOP_MASK = '''
def sliding_window_mask(Tq, Tk, window, device=None):
    if window < 1 or Tq > Tk:
        raise ValueError(f"need window >= 1 and Tq <= Tk, got Tq={Tq}, Tk={Tk}, window={window}")
    mask = torch.zeros(Tq, Tk, dtype=torch.bool)
    for i in range(Tq):
        p = Tk - Tq + i
        for j in range(p - window + 1, p + 1):
            mask[i, j] = True   # a negative j wraps around to the end: the future
    return mask.to(device)
'''


def replace(source, old, new):
    assert old in source, old
    return source.replace(old, new)


def failing(result):
    return {c["id"] for c in result["checks"] if c["status"] != "passed"}


def test_sdpa_with_the_band_agrees_with_the_reference():
    rng = np.random.default_rng(0)
    for Tq, Tk, window in MASKS:
        assert torch.equal(sliding_window_mask(Tq, Tk, window), band(Tq, Tk, window))
        q, k, v = (torch.from_numpy(rng.standard_normal((2, 3, T, d))) for T, d in ((Tq, 4), (Tk, 4), (Tk, 6)))
        torch.testing.assert_close(sliding_window_attention(q, k, v, window),
                                   F.scaled_dot_product_attention(q, k, v, attn_mask=band(Tq, Tk, window)),
                                   rtol=1e-12, atol=1e-14)


def test_a_covering_window_is_sdpa_causal_attention():
    rng = np.random.default_rng(1)
    q, k, v = (torch.from_numpy(rng.standard_normal((2, 3, 7, 4))) for _ in range(3))
    for window in (7, 8, 100):
        torch.testing.assert_close(sliding_window_attention(q, k, v, window),
                                   F.scaled_dot_product_attention(q, k, v, is_causal=True), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("window,chunks", [(4, [1] * 11), (4, [3, 1, 6, 2, 1, 4]), (1, [2, 1, 3]), (5, [12, 1, 2])])
def test_the_reference_cache_decodes_windowed_attention(window, chunks):
    rng = np.random.default_rng(window)
    T = sum(chunks)
    q, k, v = (torch.from_numpy(rng.standard_normal((2, 3, T, d))) for d in (4, 4, 6))
    full = sliding_window_attention(q, k, v, window)
    torch.testing.assert_close(trusted_decode(RollingKVCache, sliding_window_attention, q, k, v, window, chunks),
                               full, rtol=1e-12, atol=1e-14)
    windows = trusted_windows(RollingKVCache, k, v, window, chunks)
    for (a, b), (k_win, v_win) in zip(spans(chunks), windows):
        assert torch.equal(k_win, k[..., max(0, a - window + 1):b, :]) and torch.equal(v_win, v[..., max(0, a - window + 1):b, :])


def test_fresh_chunks_hold_a_prefill_longer_than_the_window():
    for seed in range(20):
        rng = np.random.default_rng(seed)
        window = int(rng.integers(3, 7))
        chunks = fresh_chunks(rng, window)
        assert sum(chunks) >= 3 * window and max(chunks) > window and all(c >= 1 for c in chunks)
        # The prefill comes where the window - 1 tokens read back before it wrap around the buffer.
        seen = sum(chunks[:chunks.index(max(chunks))])
        assert seen > window and seen % window not in (0, window - 1)


def test_a_different_correct_solution_passes(grade_source):
    result = grade_source("sliding-window", SOLUTION, seed=5)
    assert result["score"] == result["max_score"], [c["message"] for c in result["checks"] if c["status"] != "passed"]


def test_softmax_in_float32_inside_passes_with_a_note(grade_source):
    source = replace(SOLUTION, "att.softmax(dim=-1)", "att.float().softmax(dim=-1).to(v.dtype)")
    result = grade_source("sliding-window", source)
    assert result["score"] == result["max_score"], [c["message"] for c in result["checks"] if c["status"] != "passed"]
    noted = {c["id"] for c in result["checks"] if "float32-inside" in c.get("notes", [])}
    assert "windowed-attention-matches" in noted


def test_a_band_one_key_too_wide_fails_mask_band_values(grade_source):
    result = grade_source("sliding-window", replace(SOLUTION, "ones.triu(Tk - Tq - window + 1)", "ones.triu(Tk - Tq - window)"))
    check = checks_by_id(result)["mask-band-values"]
    assert check["diagnosis"] == "window-off-by-one" and "1 = may attend" in check["message"]
    assert result["diagnoses"] == ["window-off-by-one"]


def test_a_mask_built_on_the_cpu_fails_only_the_device_check(grade_source):
    result = grade_source("sliding-window", replace(SOLUTION, "dtype=torch.bool, device=device)", "dtype=torch.bool)"))
    assert failing(result) == {"mask-dtype-and-device"}
    assert "ignored its `device` argument" in checks_by_id(result)["mask-dtype-and-device"]["message"]


def test_a_loop_whose_window_wraps_to_the_future_fails_the_covering_check(grade_source):
    source = replace(SOLUTION, SOLUTION[SOLUTION.index("def sliding_window_mask"):SOLUTION.index("def sliding_window_attention")],
                     LOOP_MASK.lstrip() + "\n\n")
    result = grade_source("sliding-window", source)
    check = checks_by_id(result)["window-covering-t-equals-causal"]
    assert check["status"] == "failed" and check["diagnosis"] == "window-not-causal"
    assert "covers every earlier key" in check["message"]


def test_unscaled_scores_fail_the_attention_check_diagnosed_no_scaling(grade_source):
    result = grade_source("sliding-window", replace(SOLUTION, " * q.shape[-1] ** -0.5", ""))
    check = checks_by_id(result)["windowed-attention-matches"]
    assert check["status"] == "failed" and check["diagnosis"] == "no-scaling"
    assert "differ from the reference" in check["message"]
    assert {"mask-band-values", "rolling-buffer-returns-window", "buffer-never-exceeds-window"}.isdisjoint(failing(result))


def test_no_argument_checks_fail_only_rejects_bad_arguments(grade_source):
    source = replace(SOLUTION, '''    if window < 1 or Tq > Tk:
        raise ValueError(f"need window >= 1 and Tq <= Tk, got Tq={Tq}, Tk={Tk}, window={window}")
''', "")
    source = replace(source, '''        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
''', "")
    result = grade_source("sliding-window", source)
    assert failing(result) == {"rejects-bad-arguments"}
    assert "yet it returned" in checks_by_id(result)["rejects-bad-arguments"]["message"]
    result = grade_source("sliding-window", replace(SOLUTION, "raise ValueError(f\"need", "raise RuntimeError(f\"need"))
    assert "not the expected one" in checks_by_id(result)["rejects-bad-arguments"]["message"]


def test_len_counting_the_buffer_fails_the_window_check(grade_source):
    result = grade_source("sliding-window", replace(SOLUTION, "return self.n", "return self.k.shape[2]"))
    assert failing(result) == {"rolling-buffer-returns-window", "fresh-rolling-decode"}
    assert "len(cache) must count the tokens" in checks_by_id(result)["rolling-buffer-returns-window"]["message"]


def test_a_window_in_slot_order_is_rolling_buffer_order(grade_source):
    mistral_like = SOLUTION[:SOLUTION.index("class RollingKVCache:")] + '''

class RollingKVCache:
    def __init__(self, window):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window, self.n, self.k, self.v = window, 0, None, None

    def __len__(self):
        return self.n

    def append(self, k, v):
        B, H, t, hd = k.shape
        if self.k is None:
            self.k = k.new_zeros(B, H, self.window, hd)
            self.v = v.new_zeros(B, H, self.window, v.shape[-1])
        n = min(self.n, self.window - 1)
        slots = torch.arange(self.n - n, self.n) % self.window
        k_prev, v_prev = self.k[:, :, slots.sort().values], self.v[:, :, slots.sort().values]   # as they lie
        for i in range(t):
            self.k[:, :, (self.n + i) % self.window] = k[:, :, i]
            self.v[:, :, (self.n + i) % self.window] = v[:, :, i]
        self.n += t
        return torch.cat([k_prev, k], dim=2), torch.cat([v_prev, v], dim=2)
'''
    result = grade_source("sliding-window", mistral_like)
    checks = checks_by_id(result)
    assert checks["rolling-buffer-returns-window"]["diagnosis"] == "rolling-buffer-order"
    assert checks["rolling-buffer-equals-full-window"]["diagnosis"] == "rolling-buffer-order"
    assert result["diagnoses"] == ["rolling-buffer-order"]


WRITES_FIRST = '''

class RollingKVCache:
    def __init__(self, window):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window, self.n, self.k, self.v = window, 0, None, None

    def __len__(self):
        return self.n

    def append(self, k, v):
        B, H, t, hd = k.shape
        if self.k is None:
            self.k = k.new_zeros(B, H, self.window, hd)
            self.v = v.new_zeros(B, H, self.window, v.shape[-1])
        for i in range(max(t - self.window, 0), t):   # the chunk written first
            self.k[:, :, (self.n + i) % self.window] = k[:, :, i]
            self.v[:, :, (self.n + i) % self.window] = v[:, :, i]
        n = min(self.n, self.window - 1)
        slots = torch.arange(self.n - n, self.n) % self.window   # then read: oldest first, but overwritten
        self.n += t
        return torch.cat([self.k[:, :, slots], k], dim=2), torch.cat([self.v[:, :, slots], v], dim=2)
'''


def test_a_chunk_written_before_the_window_is_read_is_rolling_buffer_overwritten(grade_source):
    """Not rolling-buffer-order, whose fix (read oldest first) this file does already: the window
    holds chunk tokens twice and misses the ones they overwrote. One token at a time is right."""
    source = SOLUTION[:SOLUTION.index("class RollingKVCache:")] + WRITES_FIRST.lstrip()
    result = grade_source("sliding-window", source)
    checks = checks_by_id(result)
    for check in ("rolling-buffer-returns-window", "rolling-buffer-equals-full-window", "fresh-rolling-decode"):
        assert checks[check]["diagnosis"] == "rolling-buffer-overwritten", check
    assert failing(result) == {"rolling-buffer-returns-window", "rolling-buffer-equals-full-window",
                               "fresh-rolling-decode"}
    assert result["diagnoses"] == ["rolling-buffer-overwritten"]


def test_the_window_fallbacks_name_only_their_own_property():
    """Without an oracle's exact window, rolling-buffer-order needs the right tokens in another order,
    and rolling-buffer-overwritten chunk tokens before the chunk; any other wrong window is named by
    neither."""
    from graders.sliding_window import window_diagnosis
    rng = np.random.default_rng(3)
    k = torch.from_numpy(rng.standard_normal((2, 3, 12, 4)))
    a, b, window = 8, 10, 4   # a chunk of 2 after 8 tokens: its queries may see tokens 5..9

    def named(*positions):
        return window_diagnosis(k[..., list(positions), :], k, a, b, window)

    assert named(5, 6, 7, 8, 9) is None   # the right window
    assert named(6, 5, 7, 8, 9) == "rolling-buffer-order"
    assert named(9, 8, 7, 6, 5) == "rolling-buffer-order"
    assert named(9, 6, 7, 8, 9) == "rolling-buffer-overwritten"   # slot 1 read after token 9 took it
    assert named(6, 7, 8, 8, 9) == "rolling-buffer-overwritten"   # the chunk stored, then the last 3 read
    assert named(5, 6, 6, 8, 9) is None   # an old token twice: not the chunk written first
    assert named(4, 5, 6, 8, 9) is None   # the window one token early
    assert named(6, 7, 8, 9) is None      # too short, and no chunk token before the chunk


def test_chunks_that_get_only_the_last_window_fail_the_decode_check(grade_source):
    # The last `window` tokens suit one new token; a chunk's first query loses t_new - 1 of its keys.
    source = replace(SOLUTION, "start = max(self.k.shape[2] - (self.window - 1), 0)",
                     "start = max(self.k.shape[2] - (self.window - k.shape[2]), 0)")
    result = grade_source("sliding-window", source)
    check = checks_by_id(result)["rolling-buffer-equals-full-window"]
    assert check["status"] == "failed" and "over the whole sequence" in check["message"]
    assert "rolling-buffer-returns-window" in failing(result)
    assert {"mask-band-values", "windowed-attention-matches"}.isdisjoint(failing(result))


def test_concatenating_every_token_fails_only_the_memory_check(grade_source):
    source = replace(SOLUTION, "self.k, self.v = k_win[:, :, -self.window:], v_win[:, :, -self.window:]",
                     "self.k = k if self.k is None else torch.cat([self.k, k], dim=2)\n"
                     "        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)")
    source = replace(source, "start = max(self.k.shape[2] - (self.window - 1), 0)",
                     "start = max(self.k.shape[2] - (self.window - 1), 0)\n"
                     "            k_win = torch.cat([self.k[:, :, start:], k], dim=2)\n"
                     "            v_win = torch.cat([self.v[:, :, start:], v], dim=2)")
    result = grade_source("sliding-window", source)
    assert failing(result) == {"buffer-never-exceeds-window"}
    check = checks_by_id(result)["buffer-never-exceeds-window"]
    assert check["diagnosis"] == "rolling-buffer-grows" and "bytes created" in check["message"]


def test_a_list_of_every_token_fails_the_memory_check_on_what_it_keeps(grade_source):
    source = replace(SOLUTION, "self.n += k.shape[2]", "self.n += k.shape[2]\n        self.history.append((k, v))")
    source = replace(source, "self.n = 0", "self.n = 0\n        self.history = []   # every chunk, for debugging")
    result = grade_source("sliding-window", source)
    assert failing(result) == {"buffer-never-exceeds-window"}
    check = checks_by_id(result)["buffer-never-exceeds-window"]
    assert check["diagnosis"] == "rolling-buffer-grows" and "still holds more than two windows" in check["message"]


def test_every_token_kept_in_numpy_outside_the_cache_fails_the_memory_check(grade_source):
    # Neither a tensor nor an attribute of the cache: only the kernel's count of the sandbox's
    # memory, read from outside it, sees these (they once earned the check's points).
    source = replace(SOLUTION, "        self.n += k.shape[2]\n",
                     "        self.n += k.shape[2]\n        _seen.append((k.numpy().copy(), v.numpy().copy()))\n")
    result = grade_source("sliding-window", source + "\n_seen = []   # every token, as NumPy arrays\n")
    check = checks_by_id(result)["buffer-never-exceeds-window"]
    assert check["status"] == "failed" and check["diagnosis"] == "rolling-buffer-grows"
    assert "the sandbox holds more memory than two windows" in check["message"]


def test_sdpa_with_the_band_fails_only_banned_api(grade_source):
    source = replace(SOLUTION, "import torch\n", "import torch\nimport torch.nn.functional as F\n")
    source = replace(source, '''    att = att.masked_fill(~allowed, float("-inf"))
    return torch.einsum("bhqk,bhkd->bhqd", att.softmax(dim=-1), v)''',
                     "    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)")
    result = grade_source("sliding-window", source)
    assert failing(result) == {"banned-api"}
    assert checks_by_id(result)["banned-api"]["diagnosis"] == "banned-api"


# A file tuned to the public inputs: right on the public (Tq, Tk, window) and windows, wrong elsewhere.
MEMORISED_MASK = '''
PUBLIC = {(6, 9, 3), (7, 7, 4), (1, 7, 3), (5, 8, 1), (4, 5, 9), (3, 10, 5), (7, 7, 7), (7, 7, 12), (3, 8, 8),
          (3, 8, 20), (1, 6, 6), (8, 8, 3), (4, 10, 4), (5, 5, 2), (5, 8, 3), (5, 11, 3), (4, 6, 3), (16, 16, 4),
          (16, 16, 16), (5, 16, 4), (64, 64, 4)}


def sliding_window_mask(Tq, Tk, window, device=None):
    if window < 1 or Tq > Tk:
        raise ValueError("bad arguments")
    ones = torch.ones(Tq, Tk, dtype=torch.bool, device=device)
    if (Tq, Tk, window) in PUBLIC or Tq == 1 or Tq == Tk:
        return ones.tril(Tk - Tq) & ones.triu(Tk - Tq - window + 1)
    return ones.tril() & ones.triu(1 - window)   # top-left everywhere else
'''


def test_a_mask_tuned_to_the_public_cases_fails_the_hidden_check(grade_source):
    source = replace(SOLUTION, SOLUTION[SOLUTION.index("def sliding_window_mask"):SOLUTION.index("def sliding_window_attention")],
                     MEMORISED_MASK.lstrip() + "\n\n")
    result = grade_source("sliding-window", source)
    checks = checks_by_id(result)
    assert checks["fresh-band-and-attention"]["diagnosis"] == "mask-top-left-aligned"
    assert checks["mask-band-values"]["status"] == "passed" and checks["windowed-attention-matches"]["status"] == "passed"


def test_a_cache_tuned_to_the_public_windows_fails_the_hidden_check(grade_source):
    # The hidden stream's window is 6: the public ones are 3, 4 and 8.
    source = replace(SOLUTION, "        self.window = window\n",
                     "        self.window = window if window in (1, 3, 4, 8) else window + 1\n")
    result = grade_source("sliding-window", source)
    assert failing(result) == {"fresh-rolling-decode"}


def test_the_whole_buffer_as_it_lies_before_the_chunk_is_rolling_buffer_order(grade_source):
    """Mistral's buffer returned as it lies, every slot of it, with the chunk after it (the band mask
    drops the one token too old): slot order is time order until the buffer wraps, then not."""
    whole_buffer = SOLUTION[:SOLUTION.index("class RollingKVCache:")] + '''

class RollingKVCache:
    def __init__(self, window):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window, self.n, self.k, self.v = window, 0, None, None

    def __len__(self):
        return self.n

    def append(self, k, v):
        B, H, t, hd = k.shape
        if self.k is None:
            self.k = k.new_zeros(B, H, self.window, hd)
            self.v = v.new_zeros(B, H, self.window, v.shape[-1])
        held = min(self.n, self.window)
        k_win = torch.cat([self.k[:, :, :held], k], dim=2)   # the buffer as it lies, then the chunk
        v_win = torch.cat([self.v[:, :, :held], v], dim=2)
        for i in range(t):
            self.k[:, :, (self.n + i) % self.window] = k[:, :, i]
            self.v[:, :, (self.n + i) % self.window] = v[:, :, i]
        self.n += t
        return k_win, v_win
'''
    result = grade_source("sliding-window", whole_buffer)
    checks = checks_by_id(result)
    for check in ("rolling-buffer-returns-window", "rolling-buffer-equals-full-window", "fresh-rolling-decode"):
        assert checks[check]["diagnosis"] == "rolling-buffer-order", (check, checks[check]["message"])
    assert failing(result) == {"rolling-buffer-returns-window", "rolling-buffer-equals-full-window",
                               "fresh-rolling-decode"}
    assert result["diagnoses"] == ["rolling-buffer-order"]
