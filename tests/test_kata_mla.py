"""The mla grader on solutions written the way learners write them (not via the bug oracles), one
failure path per check, and its independent expectation: every head's explicit keys and values
through F.scaled_dot_product_attention, which the latent cache and the absorbed path must reproduce."""
import numpy as np
import pytest
import torch

from conftest import checks_by_id
from graders.engine import expect
from graders.engine.manifest import find
from graders.mla import CONFIGS, P_ABSORBED, cache_diagnosis, normal, per_head_cached, per_head_widths, trusted, \
    weights
from reference.mla import MultiHeadLatentAttention, kv_cache_bytes_per_token, mla_cache_bytes_per_token
from reference.mla_bugs import CachesExpandedRopeKey, CachesRopeKeyPerHeadFirst, CachesUpProjectedKeys, \
    CachesUpProjectedNope, CachesWkvBOutput
from reference.mla_expected import keys_and_values, latent, sdpa_mla

# Heads first, (B, H, T, dim), with matmul and an additive mask; RoPE on a (..., dim/2, 2) view.
SOLUTION = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


def mla_cache_bytes_per_token(kv_lora_rank, qk_rope_dim, n_layers=1, dtype_bytes=2):
    return (kv_lora_rank + qk_rope_dim) * n_layers * dtype_bytes


def kv_cache_bytes_per_token(n_kv_heads, head_dim, n_layers=1, dtype_bytes=2):
    return 2 * n_kv_heads * head_dim * n_layers * dtype_bytes


def apply_rope(x, positions):
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    angle = positions.double()[:, None] * theta
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    if x.dim() == 4:   # (B, T, H, d): one angle per token, for every head
        cos, sin = cos[:, None], sin[:, None]
    pairs = x.unflatten(-1, (d // 2, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, d_model, n_heads, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_dim):
        super().__init__()
        self.H, self.r, self.dn, self.dr, self.dv = n_heads, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_dim
        self.wq = nn.Linear(d_model, n_heads * (qk_nope_dim + qk_rope_dim), bias=False)
        self.wkv_a = nn.Linear(d_model, kv_lora_rank + qk_rope_dim, bias=False)
        self.wkv_b = nn.Linear(kv_lora_rank, n_heads * (qk_nope_dim + v_dim), bias=False)
        self.wo = nn.Linear(n_heads * v_dim, d_model, bias=False)

    def forward(self, x, cache=None, absorb=False):
        B, T, _ = x.shape
        past = 0 if cache is None else cache[0].shape[1]
        pos = torch.arange(past, past + T, device=x.device)
        q = self.wq(x).view(B, T, self.H, -1).transpose(1, 2)
        q_nope, q_rope = q[..., :self.dn], apply_rope(q[..., self.dn:].transpose(1, 2), pos).transpose(1, 2)
        c_kv, k_rope = self.wkv_a(x).split([self.r, self.dr], dim=-1)
        k_rope = apply_rope(k_rope, pos)
        if cache is not None:
            c_kv, k_rope = torch.cat([cache[0], c_kv], 1), torch.cat([cache[1], k_rope], 1)
        S = c_kv.shape[1]
        w = self.wkv_b.weight.view(self.H, self.dn + self.dv, self.r)
        rope_scores = q_rope @ k_rope[:, None].transpose(-1, -2)
        if absorb:
            scores = (q_nope @ w[:, :self.dn]) @ c_kv[:, None].transpose(-1, -2) + rope_scores
        else:
            kv = self.wkv_b(c_kv).view(B, S, self.H, -1).transpose(1, 2)
            k_nope, v = kv[..., :self.dn], kv[..., self.dn:]
            scores = q_nope @ k_nope.transpose(-1, -2) + rope_scores
        scores = scores / math.sqrt(self.dn + self.dr)
        mask = torch.full((T, S), float("-inf"), dtype=x.dtype, device=x.device).triu(past + 1)
        p = F.softmax(scores + mask, dim=-1)
        if absorb:
            o = (p @ c_kv[:, None]) @ w[:, self.dn:].transpose(-1, -2)
        else:
            o = p @ v
        return self.wo(o.transpose(1, 2).reshape(B, T, -1)), (c_kv, k_rope)
'''


def failed(result) -> list[str]:
    return [c["id"] for c in result["checks"] if c["status"] != "passed"]


def module(sd, H, dims, cls=MultiHeadLatentAttention):
    m = cls(sd["wq.weight"].shape[1], H, *dims).double()
    m.load_state_dict(sd)
    return m


def test_the_explicit_keys_agree_with_the_reference_on_every_path():
    rng = np.random.default_rng(0)
    for B, d, H, *dims in CONFIGS:
        sd, x = weights(rng, d, H, *dims), normal(rng, B, 9, d)
        full = sdpa_mla(sd, H, tuple(dims), x)
        for chunks in (None, (1,) * 9, (4, 3, 1, 1), (2, 7)):
            for absorb in (False, True):
                got = trusted(MultiHeadLatentAttention, sd, H, tuple(dims), x, chunks, absorb)[0]
                torch.testing.assert_close(got, full, rtol=1e-12, atol=1e-14)


def test_latent_is_what_the_reference_caches_and_smaller_than_the_keys():
    rng = np.random.default_rng(1)
    B, d, H, *dims = CONFIGS[0]
    r, nope, rope, v = dims
    sd, x = weights(rng, d, H, *dims), normal(rng, B, 6, d)
    with torch.no_grad():
        _, cache = module(sd, H, dims)(x)
    for held, want in zip(cache, latent(sd, x, r)):
        torch.testing.assert_close(held, want, rtol=1e-12, atol=1e-14)
    k, vals = keys_and_values(sd, H, tuple(dims), x)
    assert sum(t[0, 0].numel() for t in cache) == r + rope < (k[0, :, 0].numel() + vals[0, :, 0].numel())
    # a position 0 key is not turned: its rope part equals wkv_a's output there
    torch.testing.assert_close(cache[1][:, 0], (x @ sd["wkv_a.weight"].T)[:, 0, r:])


def test_the_cache_bytes_of_deepseek_v2():
    # DeepSeek-V2 (section 2.1.4): 576 numbers per token and layer, GQA with 2.25 groups of 128
    assert mla_cache_bytes_per_token(512, 64, 1, 1) == 576
    assert mla_cache_bytes_per_token(512, 64) / kv_cache_bytes_per_token(1, 128) == 2.25
    assert kv_cache_bytes_per_token(128, 128, 60, 2) // mla_cache_bytes_per_token(512, 64, 60, 2) == 56


def test_the_cache_diagnosis_reads_every_layout_of_the_bugs():
    rng = np.random.default_rng(2)
    B, d, H, *dims = CONFIGS[0]
    sd, x = weights(rng, d, H, *dims), normal(rng, B, 6, d)
    keys, values = keys_and_values(sd, H, tuple(dims), x)
    for cls, code in ((CachesExpandedRopeKey, "per-head-rope-key-cached"),
                      (CachesRopeKeyPerHeadFirst, "per-head-rope-key-cached"),
                      (CachesUpProjectedKeys, "cache-holds-up-projected-keys"),
                      (CachesUpProjectedNope, "cache-holds-up-projected-keys"),
                      (CachesWkvBOutput, "cache-holds-up-projected-keys"),
                      (MultiHeadLatentAttention, None)):
        with torch.no_grad():
            _, cache = module(sd, H, dims, cls)(x)
        assert cache_diagnosis(tuple(t.contiguous() for t in cache), keys, values, H, dims, B, 6) == code, cls


def test_per_head_tensors_of_the_cache_are_found_by_their_axes_however_made():
    B, d, H, r, nope, rope, v = CONFIGS[0]
    n, widths = P_ABSORBED + 1, per_head_widths(H, nope, rope, v)
    linear = {"name": "linear", "args": [{"shape": [B, n, r]}, {"shape": [27, r]}]}
    scores = {"name": "einsum", "args": ["bthc,bsc->bhts", {"shape": [B, 1, H, r]}, {"shape": [B, n, r]}]}
    out = {"name": "einsum", "args": ["bthc,hdc->bthd", {"shape": [B, 1, H, r]}, {"shape": [H, v, r]}]}
    flat = {"name": "mm", "args": [{"shape": [B * n, r]}, {"shape": [r, nope]}]}   # one head, batch and time flattened
    new = {"name": "linear", "args": [{"shape": [B, 1, r]}, {"shape": [27, r]}]}   # the new token's own keys
    summed = {"name": "sum", "args": [{"shape": [B, n, H, nope, r]}, -1]}   # a broadcast product, summed over r
    weights_ = {"name": "view", "args": [{"shape": [27, r]}, H, nope + v, r]}   # wkv_b's weight, no token axis
    assert all(not {n * k for k in (1, B, H, B * H)} & {B, H, d, r, rope, *widths} for n in range(n, n + 3))
    assert per_head_cached([linear, scores, out, flat, new, summed, weights_], B, H, n, widths) == [
        f"linear -> ({B}, {n}, 27)", f"mm -> ({B * n}, {nope})", f"({B}, {n}, {H}, {nope}, {r}) given to sum"]


def test_a_correct_solution_in_another_layout_passes(grade_source):
    result = grade_source("mla", SOLUTION, seed=4)
    assert result["score"] == result["max_score"], failed(result)


def test_a_float32_softmax_inside_gets_full_marks_with_a_note(grade_source):
    source = SOLUTION.replace("p = F.softmax(scores + mask, dim=-1)",
                              "p = F.softmax(scores + mask, dim=-1, dtype=torch.float32).type_as(x)")
    assert source != SOLUTION
    result = grade_source("mla", source, seed=3)
    assert result["score"] == result["max_score"], failed(result)
    assert "float32-inside" in str(checks_by_id(result)["full-forward-matches-reference"]["notes"])


def test_a_scale_without_the_rope_dims_is_charged_once(grade_source):
    """1/sqrt(qk_nope_dim): the full forward is wrong, and decoding and absorption, wrong the same
    way, agree with it: only the full forward fails."""
    source = SOLUTION.replace("math.sqrt(self.dn + self.dr)", "math.sqrt(self.dn)")
    assert source != SOLUTION
    assert failed(grade_source("mla", source)) == ["full-forward-matches-reference"]


def test_a_latent_scale_on_the_absorbed_path_fails_only_absorption(grade_source):
    """1/sqrt(kv_lora_rank + qk_rope_dim), the width of the absorbed dot product: the absorbed path
    disagrees with the naive one."""
    source = SOLUTION.replace("scores = scores / math.sqrt(self.dn + self.dr)",
                              "scores = scores / math.sqrt((self.r if absorb else self.dn) + self.dr)")
    assert source != SOLUTION
    result = grade_source("mla", source)
    checks = checks_by_id(result)
    assert failed(result) == ["absorbed-equals-naive", "absorbed-fresh-configs"]
    assert "your module's own m(x), without a cache or absorption" in checks["absorbed-equals-naive"]["message"]
    # no mistake is named, so "same cause" is not claimed: the later check says the earlier one failed too
    assert "same_cause_as" not in checks["absorbed-fresh-configs"]
    assert "`absorbed-equals-naive`" in checks["absorbed-fresh-configs"]["message"]


def test_rope_at_the_chunks_own_indices_fails_decoding(grade_source):
    """Each call rotates its tokens at 0..T-1, not at past..past+T-1: the full forward is right, the
    cache's keys are turned at the wrong positions; the absorbed checks say that decoding failed too."""
    source = SOLUTION.replace("pos = torch.arange(past, past + T, device=x.device)",
                              "pos = torch.arange(T, device=x.device)")
    assert source != SOLUTION
    result = grade_source("mla", source)
    checks = checks_by_id(result)
    assert "full-forward-matches-reference" not in failed(result)
    assert checks["decode-equals-full-forward"]["status"] == "failed"
    for check in ("absorbed-equals-naive", "decodes-fresh-configs", "absorbed-fresh-configs"):
        assert "same_cause_as" not in checks[check], check   # no mistake named: no "same cause" claimed
        assert "`decode-equals-full-forward`" in checks[check]["message"], check


def test_the_naive_path_for_absorb_is_named_by_its_products(grade_source):
    source = SOLUTION.replace("        if absorb:\n            scores", "        if False:\n            scores") \
                     .replace("        if absorb:\n            o =", "        if False:\n            o =")
    assert source != SOLUTION
    result = grade_source("mla", source)
    check = checks_by_id(result)["absorbed-never-up-projects-cache"]
    assert check["diagnosis"] == "absorbed-up-projects-cache"
    assert f"linear -> (2, {P_ABSORBED + 1}, 27)" in check["message"]
    assert failed(result) == ["absorbed-never-up-projects-cache"]


def test_a_cache_of_other_keys_is_reported_with_what_it_holds(grade_source):
    source = SOLUTION.replace("return self.wo(o.transpose(1, 2).reshape(B, T, -1)), (c_kv, k_rope)",
                              "return self.wo(o.transpose(1, 2).reshape(B, T, -1)), [c_kv, k_rope]") \
                     .replace("if cache is not None:\n            c_kv, k_rope",
                              "if cache is not None:\n            c_kv, k_rope")
    result = grade_source("mla", source)
    check = checks_by_id(result)["cache-holds-latent-and-shared-rope-key"]
    assert "The cache must be the pair (c_kv, k_rope)" in check["message"] and check["diagnosis"] is None
    assert failed(result) == ["cache-holds-latent-and-shared-rope-key"]


def test_an_absorbed_path_that_raises_fails_only_absorption(grade_source):
    source = SOLUTION.replace("        past = 0 if cache is None", "        if absorb:\n"
                              "            raise NotImplementedError('absorb')\n        past = 0 if cache is None")
    assert source != SOLUTION
    result = grade_source("mla", source)
    checks = checks_by_id(result)
    assert failed(result) == ["absorbed-equals-naive", "absorbed-never-up-projects-cache", "absorbed-fresh-configs"]
    assert "is not implemented yet" in checks["absorbed-never-up-projects-cache"]["message"]
    assert "absorb=True" in checks["absorbed-equals-naive"]["message"]


def test_a_float_output_in_float32_fails_the_float64_checks_on_dtype(grade_source):
    source = SOLUTION.replace("return self.wo(o.transpose(1, 2).reshape(B, T, -1)), (c_kv, k_rope)",
                              "return self.wo(o.transpose(1, 2).reshape(B, T, -1)).float(), (c_kv, k_rope)")
    assert source != SOLUTION
    check = checks_by_id(grade_source("mla", source))["full-forward-matches-reference"]
    assert "wrong dtype" in check["message"] and "torch.float32" in check["message"]


def test_a_byte_count_as_float_is_refused(grade_source):
    source = SOLUTION.replace("return (kv_lora_rank + qk_rope_dim) * n_layers * dtype_bytes",
                              "return (kv_lora_rank + qk_rope_dim) * n_layers * dtype_bytes / 1")
    assert source != SOLUTION
    result = grade_source("mla", source)
    assert failed(result) == ["cache-bytes-per-token"]
    assert "got: 69120.0" in checks_by_id(result)["cache-bytes-per-token"]["message"]


def test_a_nan_output_is_reported_as_nan():
    kata = find("mla")
    got = torch.full((2, 3), float("nan"), dtype=torch.float64)
    assert "NaN" in expect.mismatch(got, torch.zeros(2, 3, dtype=torch.float64), **kata.tolerance("float64"))


# Absorbed paths that up-project every cached latent at each step with no matrix product the
# recorder names: a broadcast multiply and a sum, and torch.tensordot. (B, S, H, dn): every cached key.
ABSORBED_SCORES = "scores = (q_nope @ w[:, :self.dn]) @ c_kv[:, None].transpose(-1, -2) + rope_scores"
UP_PROJECTED_ABSORBED = {
    "broadcast-and-sum": "k_nope = (c_kv[..., None, None, :] * w[:, :self.dn]).sum(-1)",
    "tensordot": "k_nope = torch.tensordot(c_kv, w[:, :self.dn], dims=([2], [2]))",
}


@pytest.mark.parametrize("spelling", UP_PROJECTED_ABSORBED)
def test_an_absorbed_path_that_up_projects_without_a_matrix_product_is_named(grade_source, spelling):
    source = SOLUTION.replace(ABSORBED_SCORES, f"{UP_PROJECTED_ABSORBED[spelling]}\n"
                              "            scores = q_nope @ k_nope.permute(0, 2, 3, 1) + rope_scores")
    assert source != SOLUTION
    result = grade_source("mla", source)
    assert failed(result) == ["absorbed-never-up-projects-cache"]
    assert checks_by_id(result)["absorbed-never-up-projects-cache"]["diagnosis"] == "absorbed-up-projects-cache"


def test_a_cache_of_wkv_b_outputs_is_named(grade_source):
    """wkv_b(c_kv) cached: every head's k_nope and value, H·(qk_nope_dim + v_dim) numbers per token."""
    source = SOLUTION.replace(
        "        if cache is not None:\n"
        "            c_kv, k_rope = torch.cat([cache[0], c_kv], 1), torch.cat([cache[1], k_rope], 1)",
        "        kv_flat = self.wkv_b(c_kv)\n"
        "        if cache is not None:\n"
        "            kv_flat, k_rope = torch.cat([cache[0], kv_flat], 1), torch.cat([cache[1], k_rope], 1)"
    ).replace("        S = c_kv.shape[1]", "        S = kv_flat.shape[1]") \
     .replace("        if absorb:\n            scores", "        if False:\n            scores") \
     .replace("        if absorb:\n            o =", "        if False:\n            o =") \
     .replace("kv = self.wkv_b(c_kv).view(B, S, self.H, -1)", "kv = kv_flat.view(B, S, self.H, -1)") \
     .replace("reshape(B, T, -1)), (c_kv, k_rope)", "reshape(B, T, -1)), (kv_flat, k_rope)")
    assert source.count("kv_flat") == 6
    checks = checks_by_id(grade_source("mla", source))
    assert checks["cache-holds-latent-and-shared-rope-key"]["diagnosis"] == "cache-holds-up-projected-keys"
    assert checks["absorbed-never-up-projects-cache"]["same_cause_as"] == "cache-holds-latent-and-shared-rope-key"


def test_rope_on_the_two_halves_is_named(grade_source):
    """Hugging Face's rotate_half pairing, (x[i], x[i + d/2]), where the kata's pairs are interleaved."""
    source = SOLUTION.replace("    pairs = x.unflatten(-1, (d // 2, 2))\n    a, b = pairs[..., 0], pairs[..., 1]\n"
                              "    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)",
                              "    a, b = x[..., :d // 2], x[..., d // 2:]\n"
                              "    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)")
    assert source != SOLUTION
    checks = checks_by_id(grade_source("mla", source))
    for check in ("full-forward-matches-reference", "cache-holds-latent-and-shared-rope-key"):
        assert checks[check]["diagnosis"] == "rope-half-vs-interleaved", check


def test_a_top_left_decode_mask_is_named_with_the_rows_it_changes(grade_source):
    """triu(1) without the cache's offset: query i sees keys 0..i, so a decoded token sees only key 0."""
    source = SOLUTION.replace(".triu(past + 1)", ".triu(1)")
    assert source != SOLUTION
    result = grade_source("mla", source)
    check = checks_by_id(result)["decode-equals-full-forward"]
    assert check["diagnosis"] == "mask-top-left-aligned"
    assert "(rows 0-4, the prefill, agree; rows 5-7, the decoded tokens, differ)" in check["message"], check["message"]
