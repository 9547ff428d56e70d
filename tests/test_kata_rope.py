"""What is specific to the rope kata: the facts its README teaches, the grader's independent oracle,
correct solutions written in other idioms than the reference, and each check's failure path on
files written the way learners write them (not via the bug oracles)."""
import numpy as np
import pytest
import torch

from conftest import checks_by_id
from graders.engine.manifest import find
from graders.rope import trusted, weights
from reference.rope import RoPEAttention, apply_rope, rope_cache
from reference.rope_bugs import Half, apply_rope_half
from reference.rope_expected import rotate_complex, sdpa_rope

# Angles computed on the fly in forward from an inv_freq buffer, in x's dtype; pairs rotated with
# index arithmetic on a (..., hd/2, 2) view; the mask with torch.where and -1e9.
SOLUTION = '''
import math
import torch
import torch.nn as nn


def rope_cache(T, head_dim, base=10000.0, dtype=torch.float32):
    if head_dim % 2:
        raise ValueError(f"head_dim={head_dim} is odd")
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(T, dtype=torch.float64).unsqueeze(1) * inv_freq.unsqueeze(0)
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


def apply_rope(x, cos, sin, positions):
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    a, b = pairs[..., 0], pairs[..., 1]
    c, s = cos[positions].to(x.dtype), sin[positions].to(x.dtype)
    out = torch.empty_like(pairs)
    out[..., 0] = a * c - b * s
    out[..., 1] = a * s + b * c
    return out.reshape(x.shape)


class RoPEAttention(nn.Module):
    def __init__(self, d_model, n_heads, max_len=2048, base=10000.0):
        super().__init__()
        if d_model % n_heads or (d_model // n_heads) % 2:
            raise ValueError("n_heads must divide d_model into an even head_dim")
        self.H, self.hd = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        self.base = base

    def forward(self, x, past_kv=None):
        B, T, C = x.shape
        start = past_kv[0].size(2) if past_kv is not None else 0
        pos = torch.arange(start, start + T, device=x.device)
        cos, sin = rope_cache(start + T, self.hd, self.base, dtype=x.dtype)
        cos, sin = cos.to(x.device), sin.to(x.device)
        heads = lambda t: t.reshape(B, T, self.H, self.hd).permute(0, 2, 1, 3)
        q = apply_rope(heads(self.q_proj(x)), cos, sin, pos)
        k = apply_rope(heads(self.k_proj(x)), cos, sin, pos)
        v = heads(self.v_proj(x))
        if past_kv is not None:
            k = torch.cat((past_kv[0], k), dim=2)
            v = torch.cat((past_kv[1], v), dim=2)
        scores = q @ k.transpose(2, 3) / math.sqrt(self.hd)
        visible = pos[:, None] >= torch.arange(start + T, device=x.device)[None, :]
        scores = torch.where(visible, scores, torch.tensor(-1e9, dtype=x.dtype, device=x.device))
        y = scores.softmax(dim=-1) @ v
        return self.o_proj(y.permute(0, 2, 1, 3).reshape(B, T, C)), (k, v)
'''

APPLY = SOLUTION[SOLUTION.index("def apply_rope"):SOLUTION.index("class RoPEAttention")]


def with_apply(body):
    """SOLUTION with apply_rope's body replaced (the module uses it too)."""
    return SOLUTION.replace(APPLY, "def apply_rope(x, cos, sin, positions):\n" + body + "\n\n")


def failed(result):
    return {c["id"] for c in result["checks"] if c["status"] != "passed"}


# --- the facts the README teaches, and the grader's own oracle ---------------------------------

def test_the_score_depends_on_the_offset_only():
    cos, sin = rope_cache(5000, 16, dtype=torch.float64)
    # a fixed draw: the last assertion holds for almost every q and k, not for all (-2.1462 against
    # -2.1472 was seen), and a test gives the same answer at every run
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 1, 1, 16, dtype=torch.float64, generator=g)   # (1, 1, 1, 16) each
    rot = lambda t, p: apply_rope(t, cos, sin, torch.tensor([p]))
    for offset in (0, 3, 40):
        dots = [float((rot(q, n + offset) * rot(k, n)).sum()) for n in (0, 7, 1000, 4900)]
        assert dots == pytest.approx([dots[0]] * 4, rel=1e-10, abs=1e-12)
    assert (rot(q, 3) * rot(k, 0)).sum() != pytest.approx(float((rot(q, 0) * rot(k, 3)).sum()), rel=1e-3)


def test_the_two_pairings_differ_by_a_fixed_permutation_of_the_head_dimensions():
    # Hugging Face's conversion permutes W_q and W_k's rows (evens first, then odds): rotate_half on
    # the permuted dimensions is the interleaved rotation, permuted.
    hd, T = 16, 7
    perm = torch.cat([torch.arange(0, hd, 2), torch.arange(1, hd, 2)])
    cos, sin = rope_cache(50, hd, dtype=torch.float64)
    x, positions = torch.randn(2, 3, T, hd, dtype=torch.float64), torch.tensor([3, 9, 0, 41, 8, 8, 12])
    torch.testing.assert_close(apply_rope_half(x[..., perm], cos, sin, positions),
                               apply_rope(x, cos, sin, positions)[..., perm])
    # ... so a whole model converts: the HF-layout module with permuted W_q, W_k rows equals the reference.
    d, H = 32, 2
    sd = weights(np.random.default_rng(0), d)
    rows = torch.cat([h * hd + perm for h in range(H)])
    hf = {**sd, "q_proj.weight": sd["q_proj.weight"][rows], "k_proj.weight": sd["k_proj.weight"][rows]}
    x = torch.randn(2, 6, d, dtype=torch.float64)
    torch.testing.assert_close(trusted(Half, hf, H, x)[0], trusted(RoPEAttention, sd, H, x)[0])
    assert not torch.allclose(trusted(Half, sd, H, x)[0], trusted(RoPEAttention, sd, H, x)[0])


def test_the_complex_oracle_agrees_with_the_reference():
    rng = np.random.default_rng(0)
    for base in (None, 100.0, 500000.0):
        d, H = 24, 3
        sd, x = weights(rng, d), torch.from_numpy(rng.standard_normal((2, 7, d)))
        kwargs = {} if base is None else {"base": base}
        torch.testing.assert_close(sdpa_rope(sd, H, x, base), trusted(RoPEAttention, sd, H, x, **kwargs)[0],
                                   rtol=1e-12, atol=1e-13)
    cos, sin = rope_cache(100, 12, dtype=torch.float64)
    t, positions = torch.randn(2, 2, 5, 12, dtype=torch.float64), torch.tensor([99, 0, 5, 5, 50])
    torch.testing.assert_close(rotate_complex(t, positions, 10000.0), apply_rope(t, cos, sin, positions))


def test_a_float32_cache_is_within_the_grown_tolerance_and_bugs_are_far_outside():
    # The manifest's claim: a cache built in float32 is off by < 0.6·eps·P; ulps = 4 leaves room.
    P, hd = 4096, 64
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
    angles = torch.outer(torch.arange(P).float(), inv_freq)
    exact_cos, _ = rope_cache(P, hd, dtype=torch.float64)
    err = (angles.cos().double() - exact_cos).abs().max().item()
    assert err < 0.6 * 2 ** -23 * (P - 1)
    wrong = 10000.0 ** (-torch.arange(hd // 2, dtype=torch.float64) / hd)
    assert (torch.cos(10 * wrong[1]) - exact_cos[10, 1]).abs() > 0.5


# --- correct solutions in other idioms --------------------------------------------------------

def test_a_solution_computing_angles_in_forward_gets_full_marks(grade_source):
    result = grade_source("rope", SOLUTION, seed=5)
    assert result["score"] == result["max_score"], [c["message"] for c in result["checks"] if c["status"] != "passed"]


def test_a_loop_over_pairs_with_python_floats_gets_full_marks(grade_source):
    body = '''    out = x.clone()
    for t, p in enumerate(positions.tolist()):
        for i in range(x.shape[-1] // 2):
            c, s = float(cos[p, i]), float(sin[p, i])
            a, b = x[..., t, 2 * i], x[..., t, 2 * i + 1]
            out[..., t, 2 * i], out[..., t, 2 * i + 1] = a * c - b * s, a * s + b * c
    return out'''
    result = grade_source("rope", with_apply(body), seed=3)
    assert result["score"] == result["max_score"], [c["message"] for c in result["checks"] if c["status"] != "passed"]


# --- each check's failure path ------------------------------------------------------------------

def test_a_cache_that_ignores_dtype_fails_only_the_cache_values(grade_source):
    source = SOLUTION.replace("return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)",
                              "return torch.cos(angles).float(), torch.sin(angles).float()")
    result = grade_source("rope", source)
    assert failed(result) == {"rope-cache-values"}
    assert "wrong dtype" in checks_by_id(result)["rope-cache-values"]["message"]


def test_hugging_faces_doubled_cache_is_named(grade_source):
    source = SOLUTION.replace("return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)",
                              "emb = torch.cat((angles, angles), dim=-1)\n"
                              "    return torch.cos(emb).to(dtype), torch.sin(emb).to(dtype)")
    source = source.replace("cos, sin = rope_cache(start + T, self.hd, self.base, dtype=x.dtype)",
                            "cos, sin = rope_cache(start + T, self.hd, self.base, dtype=x.dtype)\n"
                            "        cos, sin = cos[:, : self.hd // 2], sin[:, : self.hd // 2]")
    check = checks_by_id(grade_source("rope", source))["rope-cache-values"]
    assert check["diagnosis"] == "rope-half-vs-interleaved" and "wrong shape" in check["message"]


def test_a_missing_odd_check_fails_only_rejects_odd_head_dim(grade_source):
    source = SOLUTION.replace('    if head_dim % 2:\n        raise ValueError(f"head_dim={head_dim} is odd")\n', "")
    source = source.replace("if d_model % n_heads or (d_model // n_heads) % 2:", "if d_model % n_heads:")
    result = grade_source("rope", source)
    assert failed(result) == {"rejects-odd-head-dim"}
    assert "yet a result came back" in checks_by_id(result)["rejects-odd-head-dim"]["message"]


def test_rotating_in_place_fails_apply_rope_alone(grade_source):
    body = '''    c, s = cos[positions].to(x.dtype), sin[positions].to(x.dtype)
    a, b = x[..., 0::2].clone(), x[..., 1::2].clone()
    x[..., 0::2] = a * c - b * s
    x[..., 1::2] = a * s + b * c
    return x'''
    result = grade_source("rope", with_apply(body))
    assert failed(result) == {"apply-rope-matches-at-arbitrary-positions"}
    check = checks_by_id(result)["apply-rope-matches-at-arbitrary-positions"]
    assert "changed its input x in place" in check["message"]


def test_rows_sliced_from_the_first_position_fail_at_scattered_positions(grade_source):
    body = '''    T, p0 = x.shape[-2], int(positions[0])
    c, s = cos[p0:p0 + T].to(x.dtype), sin[p0:p0 + T].to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)'''
    checks = checks_by_id(grade_source("rope", with_apply(body)))
    assert checks["apply-rope-matches-at-arbitrary-positions"]["status"] == "failed"
    assert checks["decode-with-cache-equals-full"]["status"] == "passed"   # a run of positions is right


def test_rotate_half_fails_the_norms_of_the_kits_pairs(grade_source):
    body = '''    c = torch.cat([cos[positions]] * 2, dim=-1).to(x.dtype)
    s = torch.cat([sin[positions]] * 2, dim=-1).to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * c + torch.cat([-x2, x1], dim=-1) * s'''
    checks = checks_by_id(grade_source("rope", with_apply(body)))
    assert checks["preserves-norms"]["diagnosis"] == "rope-half-vs-interleaved"
    assert checks["dot-product-depends-on-offset"]["status"] == "passed"   # it is a rotation, of other pairs


def test_a_sum_instead_of_a_rotation_fails_the_norms(grade_source):
    body = '''    c, s = cos[positions].to(x.dtype), sin[positions].to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c + b * s, a * s + b * c], dim=-1).flatten(-2)'''
    check = checks_by_id(grade_source("rope", with_apply(body)))["preserves-norms"]
    assert check["status"] == "failed" and "length of each pair" in check["message"]


def test_rotate_half_on_interleaved_angles_is_no_rotation(grade_source):
    body = '''    c = cos[positions].repeat_interleave(2, dim=-1).to(x.dtype)
    s = sin[positions].repeat_interleave(2, dim=-1).to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * c + torch.cat([-x2, x1], dim=-1) * s'''
    checks = checks_by_id(grade_source("rope", with_apply(body)))
    assert checks["dot-product-depends-on-offset"]["diagnosis"] == "rope-half-vs-interleaved"
    assert "changes with where the pair sits" in checks["dot-product-depends-on-offset"]["message"]


def test_positions_ignored_gives_a_flat_dot_product(grade_source):
    body = '''    T = x.shape[-2]
    c, s = cos[:T].to(x.dtype), sin[:T].to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)'''
    result = grade_source("rope", with_apply(body))
    checks = checks_by_id(result)
    assert checks["dot-product-depends-on-offset"]["diagnosis"] == "rope-positions-ignored"
    assert checks["decode-with-cache-equals-full"]["diagnosis"] == "rope-positions-ignored"
    assert result["diagnoses"] == ["rope-positions-ignored"]


def test_angles_as_a_frozen_parameter_fail_only_parameters(grade_source):
    source = SOLUTION.replace("        self.base = base\n",
                              "        self.base = base\n        self.theta = nn.Parameter(torch.ones(self.hd // 2), "
                              "requires_grad=False)\n")
    result = grade_source("rope", source)
    assert failed(result) == {"parameters"}
    assert "theta" in checks_by_id(result)["parameters"]["message"]


def test_a_hard_coded_base_fails_only_matches_reference(grade_source):
    result = grade_source("rope", SOLUTION.replace("self.base = base", "self.base = 10000.0"))
    assert failed(result) == {"matches-reference"}
    assert "base=100" in checks_by_id(result)["matches-reference"]["message"]


def test_rotated_values_are_named(grade_source):
    source = SOLUTION.replace("v = heads(self.v_proj(x))", "v = apply_rope(heads(self.v_proj(x)), cos, sin, pos)")
    result = grade_source("rope", source)
    checks = checks_by_id(result)
    assert checks["rotates-q-and-k-only"]["diagnosis"] == "rope-on-values"
    assert result["diagnoses"] == ["rope-on-values"]


def test_keys_left_unrotated_fail_rotates_q_and_k_only(grade_source):
    source = SOLUTION.replace("k = apply_rope(heads(self.k_proj(x)), cos, sin, pos)", "k = heads(self.k_proj(x))")
    assert source != SOLUTION
    check = checks_by_id(grade_source("rope", source))["rotates-q-and-k-only"]
    assert check["status"] == "failed" and "The cached k is not rotated" in check["message"]


def test_a_top_left_mask_fails_only_the_cache_checks(grade_source):
    source = SOLUTION.replace("visible = pos[:, None] >= torch.arange(start + T, device=x.device)[None, :]",
                              "visible = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril()")
    result = grade_source("rope", source)
    assert failed(result) == {"decode-with-cache-equals-full", "decode-in-fresh-chunks"}
    assert "chunks [4, 1, 2, 1, 1]" in checks_by_id(result)["decode-with-cache-equals-full"]["message"]


def test_a_module_that_restarts_positions_is_named(grade_source):
    source = SOLUTION.replace("pos = torch.arange(start, start + T, device=x.device)",
                              "pos = torch.arange(T, device=x.device)")
    source = source.replace("visible = pos[:, None] >= torch.arange(start + T, device=x.device)[None, :]",
                            "visible = (pos[:, None] + start) >= torch.arange(start + T, device=x.device)[None, :]")
    result = grade_source("rope", source)
    assert failed(result) == {"decode-with-cache-equals-full", "decode-in-fresh-chunks"}
    assert result["diagnoses"] == ["rope-positions-ignored"]
    # The hidden check is a fresh draw of the visible one's property: one cause, said once.
    hidden = checks_by_id(result)["decode-in-fresh-chunks"]
    assert hidden["same_cause_as"] == "decode-with-cache-equals-full" and hidden["diagnosis"] is None


def test_positions_counted_from_one_hide_in_the_output_and_show_in_the_cached_keys(grade_source):
    # q and k shifted alike: q·k, and so the output, is unchanged; the key at position 0 is turned.
    reference = find("rope").reference_path.read_text()
    source = reference.replace("positions = torch.arange(past, past + T, device=x.device)",
                               "positions = torch.arange(past + 1, past + T + 1, device=x.device)")
    assert source != reference
    result = grade_source("rope", source)
    assert failed(result) == {"matches-reference", "rotates-q-and-k-only"}
    assert "the cached k" in checks_by_id(result)["matches-reference"]["message"]
    assert result["diagnoses"] == ["position-off-by-one"]


def test_sdpa_is_banned(grade_source):
    source = SOLUTION.replace("import torch.nn as nn", "import torch.nn as nn\nimport torch.nn.functional as F")
    source = source.replace("        y = scores.softmax(dim=-1) @ v\n",
                            "        y = F.scaled_dot_product_attention(q, k, v, attn_mask=visible)\n")
    result = grade_source("rope", source)
    assert failed(result) == {"banned-api"}
    assert checks_by_id(result)["banned-api"]["diagnosis"] == "banned-api"


def test_a_wrong_exponent_is_named_and_a_wrong_rotation_fails_the_hidden_check(grade_source):
    # i/head_dim in a cache the module builds itself: every check that reads its angles fails.
    source = SOLUTION.replace("inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)",
                              "inv_freq = base ** (-torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)")
    result = grade_source("rope", source)
    checks = checks_by_id(result)
    assert checks["rope-cache-values"]["diagnosis"] == "rope-base-exponent"
    assert checks["matches-reference"]["diagnosis"] == "rope-base-exponent"
    assert checks["apply-rope-at-fresh-positions"]["status"] == "passed"   # it is handed the reference's cache
    # Its chunks equal its own forward: the decode checks judge the cache, not the angles again.
    assert checks["decode-with-cache-equals-full"]["status"] == checks["decode-in-fresh-chunks"]["status"] == "passed"
    assert checks["rotates-q-and-k-only"]["status"] == "passed"
    body = '''    c, s = cos[positions].to(x.dtype), sin[positions].to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, a * s - b * c], dim=-1).flatten(-2)'''
    assert checks_by_id(grade_source("rope", with_apply(body)))["apply-rope-at-fresh-positions"]["status"] == "failed"


def test_the_exponent_doubled_is_named(grade_source):
    # 2·(2i)/head_dim: the 2 of the paper's 2i/d written in again beside arange(0, head_dim, 2).
    source = SOLUTION.replace("inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)",
                              "inv_freq = base ** (-2 * torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)")
    result = grade_source("rope", source)
    assert checks_by_id(result)["rope-cache-values"]["diagnosis"] == "rope-base-exponent"
    assert result["diagnoses"] == ["rope-base-exponent"]


def test_the_other_pairing_is_charged_where_it_is_judged_not_by_the_decode_checks(grade_source):
    # rotate_half in a module that decodes consistently: its chunks equal its own full forward.
    body = '''    c = torch.cat([cos[positions]] * 2, dim=-1).to(x.dtype)
    s = torch.cat([sin[positions]] * 2, dim=-1).to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * c + torch.cat([-x2, x1], dim=-1) * s'''
    result = grade_source("rope", with_apply(body))
    checks = checks_by_id(result)
    assert checks["matches-reference"]["diagnosis"] == "rope-half-vs-interleaved"
    assert checks["decode-with-cache-equals-full"]["status"] == checks["decode-in-fresh-chunks"]["status"] == "passed"
    assert checks["rotates-q-and-k-only"]["status"] == "passed"   # its keys are rotated, by other pairs
    assert checks["apply-rope-at-fresh-positions"]["same_cause_as"] == "apply-rope-matches-at-arbitrary-positions"


def test_the_hints_float32_buffer_gets_full_marks_without_a_float32_note(grade_source):
    # rope_cache(max_len, head_dim, base) at its float32 default, in buffers, as the hint builds it:
    # the grader's .to(float64) keeps float32 values, which is no float32 computation of the learner's.
    reference = find("rope").reference_path.read_text()
    source = reference.replace("rope_cache(max_len, self.head_dim, base, dtype=torch.float64)",
                               "rope_cache(max_len, self.head_dim, base)")
    assert source != reference
    result = grade_source("rope", source)
    assert result["score"] == result["max_score"]
    assert [c["id"] for c in result["checks"] if c.get("notes")] == []
    # Angles computed in float32 in every forward (Hugging Face's float32 inv_freq) do get the note.
    float32 = SOLUTION.replace("cos, sin = rope_cache(start + T, self.hd, self.base, dtype=x.dtype)",
                               "cos, sin = rope_cache(start + T, self.hd, self.base)")
    float32 = float32.replace(
        "inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)\n"
        "    angles = torch.arange(T, dtype=torch.float64)",
        "inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)\n"
        "    angles = torch.arange(T, dtype=torch.float32)")
    checks = checks_by_id(grade_source("rope", float32))
    assert "float32-inside" in checks["matches-reference"]["notes"]
