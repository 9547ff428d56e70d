"""The kv-cache grader on solutions written the way learners write them (not via the bug oracles),
one failure path per check, and its independent oracle: F.scaled_dot_product_attention(is_causal=True,
enable_gqa=True) on the whole sequence, which decoding with a cache must reproduce."""
import numpy as np
import torch

from conftest import checks_by_id
from graders.engine import expect
from graders.engine.manifest import find
from graders.kv_cache import CONFIGS, cache_trace, kv_of, normal, sdpa_causal, trusted, weights
from reference.kv_cache import GroupedQueryAttention, KVCache

# A preallocated buffer grown by doubling, positions compared for the mask, query heads grouped
# with a view instead of a repeat.
SOLUTION = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class KVCache:
    def __init__(self):
        self.k = self.v = None
        self.pos = 0

    def append(self, k, v):
        t = k.shape[2]
        if self.k is None or self.pos + t > self.k.shape[2]:
            size = max(16, 2 * (self.pos + t))
            k_buf = k.new_zeros(k.shape[0], k.shape[1], size, k.shape[3])
            v_buf = v.new_zeros(v.shape[0], v.shape[1], size, v.shape[3])
            if self.k is not None:
                k_buf[:, :, :self.pos] = self.k[:, :, :self.pos]
                v_buf[:, :, :self.pos] = self.v[:, :, :self.pos]
            self.k, self.v = k_buf, v_buf
        self.k[:, :, self.pos:self.pos + t] = k
        self.v[:, :, self.pos:self.pos + t] = v
        self.pos += t
        return self.k[:, :, :self.pos], self.v[:, :, :self.pos]

    def reset(self):
        self.pos = 0

    def __len__(self):
        return self.pos


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"bad sizes: d_model={d_model}, n_heads={n_heads}, n_kv_heads={n_kv_heads}")
        self.h, self.h_kv, self.hd = n_heads, n_kv_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, cache=None, start_pos=0):
        held = len(cache) if cache is not None else 0
        if start_pos != held:
            raise ValueError(f"start_pos={start_pos} but len(cache)={held}")
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.h_kv, self.h // self.h_kv, self.hd).permute(0, 2, 3, 1, 4)
        k = self.k_proj(x).view(B, T, self.h_kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.h_kv, self.hd).transpose(1, 2)
        if cache is not None:
            k, v = cache.append(k, v)
        Tk = k.shape[2]
        att = q @ k.unsqueeze(2).transpose(-2, -1) / math.sqrt(self.hd)
        query_pos = start_pos + torch.arange(T, device=x.device)
        allowed = torch.arange(Tk, device=x.device)[None, :] <= query_pos[:, None]
        att = att.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        y = (att @ v.unsqueeze(2)).reshape(B, self.h, T, self.hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))
'''

# nanoGPT's causal buffer, sliced bottom-right (rows Tk - T .. Tk), Hugging Face's repeat_kv and a
# (k, v) tuple for the cache.
NANOGPT = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class KVCache:
    def __init__(self):
        self.kv = None

    def append(self, k, v):
        if self.kv is not None:
            k = torch.cat((self.kv[0], k), dim=2)
            v = torch.cat((self.kv[1], v), dim=2)
        self.kv = (k, v)
        return k, v

    def reset(self):
        self.kv = None

    def __len__(self):
        return 0 if self.kv is None else self.kv[0].size(2)


def repeat_kv(x, n_rep):
    B, H, T, hd = x.shape
    return x[:, :, None, :, :].expand(B, H, n_rep, T, hd).reshape(B, H * n_rep, T, hd)


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, block_size=64):
        super().__init__()
        assert d_model % n_heads == 0 and n_heads % n_kv_heads == 0
        self.n_head, self.n_kv_head, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x, cache=None, start_pos=0):
        assert start_pos == (0 if cache is None else len(cache)), f"start_pos {start_pos} != cached {0 if cache is None else len(cache)}"
        B, T, C = x.size()
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        if cache is not None:
            k, v = cache.append(k, v)
        Tk = k.size(2)
        k, v = repeat_kv(k, self.n_head // self.n_kv_head), repeat_kv(v, self.n_head // self.n_kv_head)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, Tk - T:Tk, :Tk] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        return self.o_proj(y.transpose(1, 2).contiguous().view(B, T, C))
'''


def failed(result) -> list[str]:
    return [c["id"] for c in result["checks"] if c["status"] != "passed"]


def test_the_library_oracle_agrees_with_the_reference_decoding():
    rng = np.random.default_rng(0)
    B, d, H, Hkv = CONFIGS[0]
    for n_kv in (Hkv, 1, H):
        sd, x = weights(rng, d, H, n_kv), normal(rng, B, 9, d)
        full = sdpa_causal(sd, H, n_kv, x)
        for chunks in (None, (1,) * 9, (4, 3, 1, 1), (2, 7)):
            got = trusted(GroupedQueryAttention, KVCache, sd, H, n_kv, (x,), (chunks,))[0]
            torch.testing.assert_close(got, full, rtol=1e-12, atol=1e-14)


def test_the_cache_trace_counts_and_copies():
    rng = np.random.default_rng(1)
    k, v = normal(rng, 2, 3, 4, 5), normal(rng, 2, 3, 1, 5)
    trace = cache_trace(KVCache, [("append", k, k), ("append", v, v), ("reset",), ("append", v, v)])
    assert [entry if type(entry) is int else entry[2] for entry in trace] == [4, 5, 0, 1]
    assert torch.equal(trace[1][0], torch.cat([k, v], dim=2)) and torch.equal(trace[3][0], v)


def test_kv_of_is_what_the_reference_caches():
    rng = np.random.default_rng(2)
    B, d, H, Hkv = CONFIGS[1]
    sd, x = weights(rng, d, H, Hkv), normal(rng, B, 6, d)
    m, cache = GroupedQueryAttention(d, H, Hkv).double(), KVCache()
    m.load_state_dict(sd)
    with torch.no_grad():
        m(x, cache=cache)
    for held, want in zip((cache.k, cache.v), kv_of(sd, H, Hkv, x)):
        torch.testing.assert_close(held, want, rtol=1e-12, atol=1e-14)


def test_different_correct_solutions_pass(grade_source):
    for source, seed in ((SOLUTION, 5), (NANOGPT, 2)):
        result = grade_source("kv-cache", source, seed=seed)
        assert result["score"] == result["max_score"], failed(result)


def test_a_float32_softmax_inside_gets_full_marks_with_a_note(grade_source):
    source = NANOGPT.replace("att = F.softmax(att, dim=-1)", "att = F.softmax(att.float(), dim=-1).type_as(q)")
    assert source != NANOGPT
    result = grade_source("kv-cache", source, seed=3)
    assert result["score"] == result["max_score"], failed(result)
    checks = checks_by_id(result)
    assert "float32-inside" in str(checks["full-forward-matches-sdpa"]["notes"])
    # Decoding is compared with the same module's full forward, float32 inside as well: a note
    # comes there only where the two orders of summation round apart, which depends on the CPU's
    # kernels (none do on some machines), so only its pass is asserted.
    assert checks["chunked-prefill-bottom-right"]["status"] == "passed"


def test_llamas_time_axis_concatenates_the_heads(grade_source):
    """cache-grows-by-t: dim=1 is time in Llama's (B, T, H, hd) cache, the heads in this kata's layout."""
    source = NANOGPT.replace("torch.cat((self.kv[0], k), dim=2)", "torch.cat((self.kv[0], k), dim=1)") \
                    .replace("torch.cat((self.kv[1], v), dim=2)", "torch.cat((self.kv[1], v), dim=1)")
    checks = checks_by_id(grade_source("kv-cache", source))
    check = checks["cache-grows-by-t"]
    assert check["diagnosis"] == "concat-wrong-dim"
    assert "its KV heads (2 -> 4) axis changed, where only time (axis 2) may grow" in check["message"]
    assert "shape (3, 2, 4, 5)" in check["message"]
    for check in ("parameter-count", "full-forward-matches-sdpa", "banned-api"):
        assert checks[check]["status"] == "passed", check


def test_a_position_that_does_not_move_is_named(grade_source):
    """cache-grows-by-t: the preallocated buffer's `self.pos += t` forgotten; every append overwrites."""
    source = SOLUTION.replace("        self.pos += t\n", "")
    result = grade_source("kv-cache", source)
    check = checks_by_id(result)["cache-grows-by-t"]
    assert check["diagnosis"] == "position-not-advanced"
    assert "k_all holds 0 tokens, but 2 were appended since the cache was empty" in check["message"]
    assert "position-not-advanced" in result["diagnoses"]


def test_a_position_moved_on_by_one_is_named(grade_source):
    """cache-grows-by-t: Llama's buffer moved on by one token per append, `pos += 1`: a prefill of t
    tokens counts as one, and every check that decodes through the cache fails by it too."""
    source = SOLUTION.replace("        self.pos += t\n", "        self.pos += 1\n")
    assert source != SOLUTION
    result = grade_source("kv-cache", source)
    checks = checks_by_id(result)
    check = checks["cache-grows-by-t"]
    assert check["diagnosis"] == "position-not-advanced"
    assert "k_all holds 1 tokens, but 2 were appended since the cache was empty" in check["message"]
    for check in ("reset-starts-a-new-sequence", "chunked-prefill-bottom-right", "cache-holds-kv-heads",
                  "rejects-mismatched-start-pos", "decodes-any-chunk-schedule", "two-layers-keep-separate-caches"):
        assert checks[check]["same_cause_as"] == "cache-grows-by-t", check
    assert checks["decode-equals-full-forward"]["status"] == "passed"   # one token at a time: 1 is t
    assert result["diagnoses"] == ["position-not-advanced"]


def test_a_convention_error_is_charged_once(grade_source):
    """Unscaled scores: the full forward is wrong, and decoding, which is wrong the same way, agrees
    with it. The checks of decoding compare the module with itself, so only the full forward fails."""
    source = NANOGPT.replace(" * (1.0 / math.sqrt(k.size(-1)))", "")
    assert source != NANOGPT
    result = grade_source("kv-cache", source)
    assert failed(result) == ["full-forward-matches-sdpa"]
    assert result["diagnoses"] == ["no-scaling"]


def test_a_mask_one_diagonal_too_wide_is_named(grade_source):
    """tril(start_pos + 1): every query but the last of a chunk (or of the full forward) sees the
    token after it; one decoded token has no key after it."""
    source = SOLUTION.replace("allowed = torch.arange(Tk, device=x.device)[None, :] <= query_pos[:, None]",
                              "allowed = torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril(start_pos + 1)")
    assert source != SOLUTION
    result = grade_source("kv-cache", source)
    checks = checks_by_id(result)
    for check in ("full-forward-matches-sdpa", "chunked-prefill-bottom-right"):
        assert checks[check]["diagnosis"] == "causal-mask-off-by-one", check
    assert "differ from m(x), the same module's full forward" in checks["chunked-prefill-bottom-right"]["message"]
    for check in ("decode-equals-full-forward", "reset-starts-a-new-sequence", "cache-grows-by-t"):
        assert checks[check]["status"] == "passed", check
    assert result["diagnoses"] == ["causal-mask-off-by-one"]


def test_llamas_first_square_mask_is_named_where_a_chunk_follows_the_cache(grade_source):
    """Llama's original code: the chunk's mask (T, T), no columns for the cached keys. A prefill and
    single tokens work; a chunk after cached tokens fails to broadcast against its (T, Tk) scores."""
    source = SOLUTION.replace("allowed = torch.arange(Tk, device=x.device)[None, :] <= query_pos[:, None]",
                              "allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril(start_pos)")
    assert source != SOLUTION
    result = grade_source("kv-cache", source)
    checks = checks_by_id(result)
    check = checks["chunked-prefill-bottom-right"]
    assert check["diagnosis"] == "square-chunk-mask"
    assert "must match the size of tensor b" in check["message"] and "start_pos=4" in check["message"]
    for check in ("full-forward-matches-sdpa", "decode-equals-full-forward", "reset-starts-a-new-sequence"):
        assert checks[check]["status"] == "passed", check
    assert result["diagnoses"] == ["square-chunk-mask"]


def test_a_broadcast_error_is_square_chunk_mask_only_between_the_chunk_and_the_keys():
    from graders.engine.failures import LearnerRaised
    from graders.kv_cache import square_mask_raised

    def raised(message):
        return LearnerRaised(message, type_name="RuntimeError")

    said = "The size of tensor a (7) must match the size of tensor b (3) at non-singleton dimension 3"
    assert square_mask_raised(raised(said), 3, 7)
    assert square_mask_raised(raised(said.replace("(7)", "(x)").replace("(3)", "(7)").replace("(x)", "(3)")), 3, 7)
    assert not square_mask_raised(raised(said), 3, 8)   # other sizes: not this chunk against its keys
    assert not square_mask_raised(raised(said), 7, 7)   # no cached keys: no column is missing
    assert not square_mask_raised(LearnerRaised(said, type_name="ValueError"), 3, 7)


def test_a_reset_that_keeps_the_tokens_fails_only_the_reset_check(grade_source):
    source = NANOGPT.replace("    def reset(self):\n        self.kv = None", "    def reset(self):\n        kv = None")
    assert source != NANOGPT
    result = grade_source("kv-cache", source)
    check = checks_by_id(result)["reset-starts-a-new-sequence"]
    assert check["diagnosis"] == "cache-not-reset"
    assert "After reset() the cache must be empty" in check["message"] and "len(cache) == 4" in check["message"]
    assert failed(result) == ["reset-starts-a-new-sequence"]


def test_a_parameter_for_the_mask_fails_only_the_parameter_count(grade_source):
    """A causal mask held as an nn.Parameter instead of a buffer: right outputs, 4,096 parameters too many."""
    source = NANOGPT.replace(
        'self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))',
        'self.bias = nn.Parameter(torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size), '
        'requires_grad=False)')
    assert source != NANOGPT
    result = grade_source("kv-cache", source)
    message = checks_by_id(result)["parameter-count"]["message"]
    assert "5,632: bias (1, 1, 64, 64), q_proj.weight (24, 24)" in message and "= 1,536" in message
    assert failed(result) == ["parameter-count"]


def test_no_mask_without_a_cache_fails_only_the_full_forward(grade_source):
    """A learner who thinks the causal mask is for decoding only: the full forward sees the future."""
    source = SOLUTION.replace('att = att.masked_fill(~allowed, float("-inf")).softmax(dim=-1)',
                              'att = (att if cache is None else att.masked_fill(~allowed, float("-inf")))'
                              '.softmax(dim=-1)')
    assert source != SOLUTION
    result = grade_source("kv-cache", source)
    assert "differ from F.scaled_dot_product_attention" in checks_by_id(result)["full-forward-matches-sdpa"]["message"]
    assert failed(result) == ["full-forward-matches-sdpa"]


def test_a_top_left_mask_is_named_when_decoding(grade_source):
    source = NANOGPT.replace("self.bias[:, :, Tk - T:Tk, :Tk]", "self.bias[:, :, :T, :Tk]")
    assert source != NANOGPT
    result = grade_source("kv-cache", source)
    checks = checks_by_id(result)
    assert checks["decode-equals-full-forward"]["diagnosis"] == "mask-top-left-aligned"
    # The chunks and any schedule fail by the same mask: said once, where single tokens fail first.
    for check in ("chunked-prefill-bottom-right", "decodes-any-chunk-schedule"):
        assert checks[check]["same_cause_as"] == "decode-equals-full-forward", check
    # Without a cache T == Tk: both alignments agree.
    for check in ("full-forward-matches-sdpa", "cache-grows-by-t", "cache-holds-kv-heads", "banned-api"):
        assert checks[check]["status"] == "passed", check
    assert result["diagnoses"] == ["mask-top-left-aligned"]


def test_no_mask_for_one_token_and_top_left_for_a_chunk_fails_only_on_chunks(grade_source):
    """Llama skips the mask for a single token (right); a chunk's mask built top-left is not."""
    source = SOLUTION.replace("query_pos = start_pos + torch.arange(T, device=x.device)",
                              "query_pos = torch.arange(T, device=x.device) + (start_pos if T == 1 else 0)")
    assert source != SOLUTION
    result = grade_source("kv-cache", source)
    checks = checks_by_id(result)
    assert checks["chunked-prefill-bottom-right"]["diagnosis"] == "mask-top-left-aligned"
    assert checks["decode-equals-full-forward"]["status"] == "passed"
    assert checks["reset-starts-a-new-sequence"]["status"] == "passed"   # chunks of 3 and 2 from an empty cache


def test_a_cache_of_the_repeated_heads_fails_only_the_cache_check(grade_source):
    source = NANOGPT.replace('''        if cache is not None:
            k, v = cache.append(k, v)
        Tk = k.size(2)
        k, v = repeat_kv(k, self.n_head // self.n_kv_head), repeat_kv(v, self.n_head // self.n_kv_head)
''', '''        k, v = repeat_kv(k, self.n_head // self.n_kv_head), repeat_kv(v, self.n_head // self.n_kv_head)
        if cache is not None:
            k, v = cache.append(k, v)
        Tk = k.size(2)
''')
    assert source != NANOGPT
    result = grade_source("kv-cache", source)
    check = checks_by_id(result)["cache-holds-kv-heads"]
    assert check["diagnosis"] == "cache-stores-repeated-kv"
    assert "refuses keys of n_kv_heads = 2 heads" in check["message"]
    assert "Expected size 6 but got size 2" in check["message"]
    assert failed(result) == ["cache-holds-kv-heads"]
    assert result["diagnoses"] == ["cache-stores-repeated-kv"]


def test_a_module_that_ignores_the_cache_it_is_given(grade_source):
    """cache-holds-kv-heads: a module keeping its own cache leaves the caller's empty."""
    source = SOLUTION.replace("        if cache is not None:\n            k, v = cache.append(k, v)\n",
                              "        if cache is not None:\n            k, v = self.own.append(k, v)\n") \
                     .replace("        self.o_proj = nn.Linear(d_model, d_model, bias=False)\n",
                              "        self.o_proj = nn.Linear(d_model, d_model, bias=False)\n        self.own = KVCache()\n") \
                     .replace("held = len(cache) if", "held = len(self.own) if")
    checks = checks_by_id(grade_source("kv-cache", source))
    message = checks["cache-holds-kv-heads"]["message"]
    assert "the module must append each call's keys and values to the cache it is given" in message
    assert "len(cache) == 0" in message


def test_start_pos_unchecked_fails_only_the_start_pos_check(grade_source):
    source = SOLUTION.replace('''        if start_pos != held:
            raise ValueError(f"start_pos={start_pos} but len(cache)={held}")
''', "")
    result = grade_source("kv-cache", source)
    message = checks_by_id(result)["rejects-mismatched-start-pos"]["message"]
    assert "so start_pos=2 cannot be right, yet the module returned an output" in message
    assert failed(result) == ["rejects-mismatched-start-pos"]


def test_start_pos_checked_after_the_append_leaves_a_changed_cache(grade_source):
    source = SOLUTION.replace('''        held = len(cache) if cache is not None else 0
        if start_pos != held:
            raise ValueError(f"start_pos={start_pos} but len(cache)={held}")
''', "").replace('''            k, v = cache.append(k, v)
''', '''            k, v = cache.append(k, v)
            if start_pos != len(cache) - T:
                raise ValueError(f"start_pos={start_pos} but len(cache)={len(cache) - T}")
        elif start_pos:
            raise ValueError(f"start_pos={start_pos} without a cache")
''')
    result = grade_source("kv-cache", source)
    message = checks_by_id(result)["rejects-mismatched-start-pos"]["message"]
    assert "A rejected call changed the cache: check start_pos before appending anything." in message
    assert "len(cache) == 6" in message
    assert failed(result) == ["rejects-mismatched-start-pos"]


def test_a_bare_assert_must_say_which_numbers_disagree(grade_source):
    source = NANOGPT.replace(', f"start_pos {start_pos} != cached {0 if cache is None else len(cache)}"', "")
    assert source != NANOGPT
    message = checks_by_id(grade_source("kv-cache", source))["rejects-mismatched-start-pos"]["message"]
    assert "its message does not say which numbers disagree" in message


def test_sdpa_with_a_bottom_right_mask_fails_only_the_banned_api_check(grade_source):
    source = NANOGPT.replace('''        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, Tk - T:Tk, :Tk] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
''', '''        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias[0, 0, Tk - T:Tk, :Tk].bool())
''')
    assert source != NANOGPT
    result = grade_source("kv-cache", source)
    check = checks_by_id(result)["banned-api"]
    assert check["diagnosis"] == "banned-api" and "torch.nn.functional.scaled_dot_product_attention" in check["message"]
    assert failed(result) == ["banned-api"]


def test_a_buffer_sized_for_the_public_checks_fails_a_longer_hidden_schedule(grade_source):
    """decodes-any-chunk-schedule: a buffer of 10 tokens holds every public sequence, not the hidden ones,
    which are longer: a chunk written past its end does not fit."""
    source = SOLUTION.replace('''        if self.k is None or self.pos + t > self.k.shape[2]:
            size = max(16, 2 * (self.pos + t))
''', '''        if self.k is None:
            size = 10
''')
    assert source != SOLUTION
    result = grade_source("kv-cache", source, seed=4)
    assert failed(result) == ["decodes-any-chunk-schedule"]
    message = checks_by_id(result)["decodes-any-chunk-schedule"]["message"]
    assert "cache=kv_cache.KVCache, start_pos=9) raised RuntimeError" in message


def test_caches_sharing_class_attributes_fail_only_with_two_layers(grade_source):
    """two-layers-keep-separate-caches: lists held by the class, not the instance, are one cache for all."""
    # The solution's own KVCache, from its class line up to the next class.
    first = SOLUTION.index("class KVCache:")
    own = SOLUTION[first:SOLUTION.index("\n\n\nclass ", first) + 1]
    source = SOLUTION.replace(own, '''class KVCache:
    keys, values = [], []   # on the class: every cache shares them

    def __init__(self):
        self.reset()

    def append(self, k, v):
        self.keys.append(k)
        self.values.append(v)
        return torch.cat(self.keys, dim=2), torch.cat(self.values, dim=2)

    def reset(self):
        self.keys.clear()
        self.values.clear()

    def __len__(self):
        return sum(k.shape[2] for k in self.keys)
''')
    assert source != SOLUTION
    result = grade_source("kv-cache", source)
    assert failed(result) == ["two-layers-keep-separate-caches"]


def test_a_cache_without_len_says_so(grade_source):
    source = NANOGPT.replace('''    def __len__(self):
        return 0 if self.kv is None else self.kv[0].size(2)
''', "").replace("len(cache)", "(0 if cache.kv is None else cache.kv[0].size(2))")
    assert "__len__" not in source
    message = checks_by_id(grade_source("kv-cache", source))["cache-grows-by-t"]["message"]
    assert "Your file has no 'KVCache.__len__'" in message


def test_a_len_that_raises_is_reported_as_len_cache(grade_source):
    source = NANOGPT.replace("return 0 if self.kv is None else self.kv[0].size(2)", "return self.kv[0].size(2)")
    message = checks_by_id(grade_source("kv-cache", source))["reset-starts-a-new-sequence"]["message"]
    assert message.startswith("len(cache) raised TypeError: 'NoneType' object is not subscriptable"), message


def test_a_float32_softmax_is_off_by_more_than_the_float64_tolerance():
    """The float32-inside tolerance is what lets Llama's habit pass: float64's alone refuses it."""
    class Float32Softmax(GroupedQueryAttention):
        def forward(self, x, cache=None, start_pos=0):
            B, T, C = x.shape
            q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
            k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
            v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
            if cache is not None:
                k, v = cache.append(k, v)
            Tk = k.shape[2]
            k, v = k.repeat_interleave(self.n_rep, 1), v.repeat_interleave(self.n_rep, 1)
            att = (q @ k.transpose(-2, -1) * self.scale).masked_fill(
                ~torch.ones(T, Tk, dtype=torch.bool).tril(Tk - T), float("-inf"))
            att = torch.softmax(att.float(), dim=-1).type_as(q)
            return self.o_proj((att @ v).transpose(1, 2).reshape(B, T, C))

    rng = np.random.default_rng(1)
    B, d, H, Hkv = CONFIGS[0]
    sd, x = weights(rng, d, H, Hkv), normal(rng, B, 7, d)
    got = trusted(Float32Softmax, KVCache, sd, H, Hkv, (x,), ((1,) * 7,))[0]
    kata = find("kv-cache")
    assert expect.mismatch(got, sdpa_causal(sd, H, Hkv, x), **kata.tolerance("float64")) is not None
    assert expect.mismatch(got, sdpa_causal(sd, H, Hkv, x), **kata.tolerance("float32")) is None


# gpt-fast's cache: a buffer allocated at the first append, written through an index of
# positions that update() moves on before it writes (the caller's input_pos), and read up to it.
GPT_FAST = SOLUTION.replace('''        t = k.shape[2]
        if self.k is None or self.pos + t > self.k.shape[2]:''', '''        t = k.shape[2]
        input_pos = torch.arange(self.pos, self.pos + t, device=k.device)
        if self.k is None or self.pos + t > self.k.shape[2]:''').replace('''        self.k[:, :, self.pos:self.pos + t] = k
        self.v[:, :, self.pos:self.pos + t] = v
        self.pos += t
''', '''        self.pos += t
        self.k[:, :, input_pos] = k
        self.v[:, :, input_pos] = v
''')


def test_repeated_heads_written_into_a_preallocated_cache_are_named(grade_source):
    """GPT_FAST with the heads repeated before the write: the buffer holds n_heads heads. The
    grader's token of n_kv_heads heads fails to broadcast into it, after the position has moved:
    the cache the module filled cannot be read again, so a fresh one is filled to name the bug."""
    assert GPT_FAST.count("input_pos") == 3
    source = GPT_FAST.replace('''        k = self.k_proj(x).view(B, T, self.h_kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.h_kv, self.hd).transpose(1, 2)
        if cache is not None:
            k, v = cache.append(k, v)
        Tk = k.shape[2]
        att = q @ k.unsqueeze(2).transpose(-2, -1) / math.sqrt(self.hd)
''', '''        k = self.k_proj(x).view(B, T, self.h_kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.h_kv, self.hd).transpose(1, 2)
        k, v = k.repeat_interleave(self.h // self.h_kv, 1), v.repeat_interleave(self.h // self.h_kv, 1)
        if cache is not None:
            k, v = cache.append(k, v)   # (B, H, Tk, hd): the repeated heads
        Tk = k.shape[2]
        k = k.view(B, self.h_kv, self.h // self.h_kv, Tk, self.hd)[:, :, :1]   # one copy per group
        v = v.view(B, self.h_kv, self.h // self.h_kv, Tk, self.hd)[:, :, :1]
        att = q @ k.transpose(-2, -1) / math.sqrt(self.hd)
''').replace("y = (att @ v.unsqueeze(2))", "y = (att @ v)")
    assert source.count("repeat_interleave") == 2
    result = grade_source("kv-cache", source)
    check = checks_by_id(result)["cache-holds-kv-heads"]
    assert check["diagnosis"] == "cache-stores-repeated-kv", check["message"]
    assert failed(result) == ["cache-holds-kv-heads"]
    assert result["diagnoses"] == ["cache-stores-repeated-kv"]


def test_kv_heads_tiled_instead_of_interleaved_are_named_as_in_the_gqa_kata(grade_source):
    """`.repeat(1, n_rep, 1, 1)` on the cached (B, n_kv_heads, Tk, hd): query head j reads KV head
    j % n_kv_heads, the shared mistake kv-repeat-tiled, at every seed (the configurations' groups
    of 3 over 2 KV heads show it by construction)."""
    reference = find("kv-cache").reference_path.read_text()
    source = reference.replace("repeat_interleave(self.n_rep, dim=1)", "repeat(1, self.n_rep, 1, 1)")
    assert source.count("repeat(1, self.n_rep, 1, 1)") == 2
    for seed in (1, 2, 3):
        result = grade_source("kv-cache", source, seed=seed)
        assert checks_by_id(result)["full-forward-matches-sdpa"]["diagnosis"] == "kv-repeat-tiled"
        assert result["diagnoses"] == ["kv-repeat-tiled"]
