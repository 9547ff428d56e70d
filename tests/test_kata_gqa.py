"""The gqa grader on solutions written the way learners write them (not via the bug oracles), and
its independent oracles: F.scaled_dot_product_attention(enable_gqa=True) and nn.MultiheadAttention."""
import numpy as np
import torch

from conftest import checks_by_id
from graders.engine import expect
from graders.engine.manifest import find
from graders.gqa import CONFIGS, normal, sdpa_gqa, torch_mha, trusted, weights
from reference.gqa import GroupedQueryAttention

SOLUTION = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


def repeat_kv(x, n_rep):
    return torch.repeat_interleave(x, n_rep, dim=1)


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        assert n_heads % n_kv_heads == 0, "n_heads must be divisible by n_kv_heads"
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        self.register_buffer("mask", torch.ones(64, 64, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x, causal=True):
        B, T, C = x.shape
        q = self.q_proj(x).reshape(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).reshape(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).reshape(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        n_rep = self.n_heads // self.n_kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        att = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if causal:
            att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))
'''

# K and V sized as in multi-head attention, and no divisibility checks: what a learner who starts
# from an MHA module writes.
MHA_SIZED = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


def repeat_kv(x, n_rep):
    return x[:, :, None].expand(-1, -1, n_rep, -1, -1).flatten(1, 2)


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, causal=True):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        att = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if causal:
            att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))
'''


def test_library_oracles_agree_with_the_reference():
    rng = np.random.default_rng(0)
    B, T, d, H, Hkv = CONFIGS[0]
    x = normal(rng, B, T, d)
    for n_kv in (Hkv, 1, H):
        sd = weights(rng, d, H, n_kv)
        for causal in (False, True):
            got = trusted(GroupedQueryAttention, sd, H, n_kv, x, causal)
            torch.testing.assert_close(got, sdpa_gqa(sd, H, n_kv, x, causal), rtol=1e-12, atol=1e-14)
            if n_kv == H:
                torch.testing.assert_close(got, torch_mha(sd, H, x, causal), rtol=1e-12, atol=1e-14)


def test_a_different_correct_solution_passes(grade_source):
    result = grade_source("gqa", SOLUTION, seed=5)
    assert result["status"] == "passed", [c["message"] for c in result["checks"] if c["status"] != "passed"]


def test_tiled_repeat_is_named_in_repeat_kv_and_in_forward(grade_source):
    result = grade_source("gqa", SOLUTION.replace("torch.repeat_interleave(x, n_rep, dim=1)", "x.repeat(1, n_rep, 1, 1)"))
    checks = checks_by_id(result)
    assert "output heads [kv0, kv1, kv0, kv1, kv0, kv1]" in checks["repeat-kv-interleaves"]["message"]
    for check in ("repeat-kv-interleaves", "matches-sdpa-gqa", "causal-ignores-future"):
        assert checks[check]["diagnosis"] == "kv-repeat-tiled", check
    assert "the first token may attend only to itself" in checks["causal-ignores-future"]["message"]
    assert checks["banned-api"]["status"] == "passed"   # it judges only what the module calls
    assert checks["mqa-single-kv-head"]["status"] == "passed"   # one KV head: tiling and interleaving agree
    assert result["diagnoses"] == ["kv-repeat-tiled"]


def test_mha_sized_kv_projections_are_refused_before_injection(grade_source):
    result = grade_source("gqa", MHA_SIZED)
    checks = checks_by_id(result)
    assert "2,304" in checks["parameter-count"]["message"] and "1,536" in checks["parameter-count"]["message"]
    assert "k_proj.weight (8, 24)" in checks["matches-sdpa-gqa"]["message"]
    for check in ("parameter-count", "matches-sdpa-gqa", "mqa-single-kv-head", "causal-ignores-future"):
        assert checks[check]["diagnosis"] == "kv-proj-wrong-size", check
    assert checks["equals-mha-when-kv-equals-heads"]["status"] == "passed"
    assert checks["repeat-kv-interleaves"]["status"] == "passed"
    assert "yet a module was built" in checks["rejects-bad-divisibility"]["message"]
    assert result["diagnoses"] == ["kv-proj-wrong-size"]


def test_scale_by_d_model(grade_source):
    result = grade_source("gqa", SOLUTION.replace("math.sqrt(self.head_dim)", "math.sqrt(C)"))
    checks = checks_by_id(result)
    for check in ("matches-sdpa-gqa", "equals-mha-when-kv-equals-heads", "mqa-single-kv-head"):
        assert checks[check]["diagnosis"] == "scale-by-d-model", check
    for check in ("causal-ignores-future", "banned-api"):   # properties a wrong scale keeps
        assert checks[check]["status"] == "passed", check
    assert result["diagnoses"] == ["scale-by-d-model"]


def test_a_forgotten_mask_leaks_the_future(grade_source):
    source = SOLUTION.replace('''        if causal:
            att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
''', "")
    checks = checks_by_id(grade_source("gqa", source))
    assert "the future leaks into the past" in checks["causal-ignores-future"]["message"]
    assert checks["causal-ignores-future"]["diagnosis"] == "no-causal-mask"


def test_sdpa_with_enable_gqa_is_banned(grade_source):
    source = SOLUTION.replace('''        n_rep = self.n_heads // self.n_kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        att = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if causal:
            att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        y = F.softmax(att, dim=-1) @ v
''', '''        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
''')
    assert "enable_gqa" in source
    result = grade_source("gqa", source)
    checks = checks_by_id(result)
    assert checks["banned-api"]["diagnosis"] == "banned-api"
    assert "torch.nn.functional.scaled_dot_product_attention" in checks["banned-api"]["message"]
    assert checks["matches-sdpa-gqa"]["status"] == "passed"
    assert result["diagnoses"] == ["banned-api"]


def test_bad_groups_must_raise_value_or_assertion_error(grade_source):
    source = SOLUTION.replace('assert n_heads % n_kv_heads == 0, "n_heads must be divisible by n_kv_heads"',
                              "if n_heads % n_kv_heads:\n            raise RuntimeError('bad groups')")
    message = checks_by_id(grade_source("gqa", source))["rejects-bad-divisibility"]["message"]
    assert "cannot be split into 4 equal groups" in message and "RuntimeError: bad groups" in message


# Llama's habit (and Hugging Face's, with dtype=torch.float32): the softmax in float32, cast back.
FLOAT32_SOFTMAX = SOLUTION.replace("y = F.softmax(att, dim=-1) @ v", "y = F.softmax(att.float(), dim=-1).type_as(q) @ v")


def test_a_float32_softmax_inside_gets_full_marks_with_a_note(grade_source):
    assert FLOAT32_SOFTMAX != SOLUTION
    result = grade_source("gqa", FLOAT32_SOFTMAX, seed=2)
    assert result["score"] == result["max_score"], [c["message"] for c in result["checks"] if c["status"] != "passed"]
    for check in ("matches-sdpa-gqa", "equals-mha-when-kv-equals-heads", "mqa-single-kv-head"):
        assert "float32-inside" in str(checks_by_id(result)[check]["notes"]), check


def test_a_float32_softmax_is_off_by_more_than_the_float64_tolerance():
    """The float32-inside tolerance is what lets Llama's habit pass: float64's alone refuses it."""
    class Float32Softmax(GroupedQueryAttention):
        def forward(self, x, causal=True):
            B, T, C = x.shape
            q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
            k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
            v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
            k, v = k.repeat_interleave(self.n_rep, 1), v.repeat_interleave(self.n_rep, 1)
            att = torch.softmax((q @ k.transpose(-2, -1) * self.scale).float(), dim=-1).type_as(q)
            return self.o_proj((att @ v).transpose(1, 2).reshape(B, T, C))

    rng = np.random.default_rng(1)
    B, T, d, H, Hkv = CONFIGS[0]
    sd, x = weights(rng, d, H, Hkv), normal(rng, B, T, d)
    got = trusted(Float32Softmax, sd, H, Hkv, x, False)
    kata = find("gqa")
    assert expect.mismatch(got, sdpa_gqa(sd, H, Hkv, x, False), **kata.tolerance("float64")) is not None
    assert expect.mismatch(got, sdpa_gqa(sd, H, Hkv, x, False), **kata.tolerance("float32")) is None


def test_a_forward_whose_default_is_not_causal_is_caught(grade_source):
    source = SOLUTION.replace("def forward(self, x, causal=True):", "def forward(self, x, causal=False):")
    assert source != SOLUTION
    result = grade_source("gqa", source)
    check = checks_by_id(result)["causal-ignores-future"]
    assert "forward's default must be causal=True" in check["message"] and check["diagnosis"] == "no-causal-mask"
    assert [c["id"] for c in result["checks"] if c["status"] != "passed"] == ["causal-ignores-future"]


def test_the_texts_name_the_llama_2_models_that_use_gqa():
    """Llama 2 uses GQA only in its 70B model (7B and 13B are multi-head): no kata text says
    "Llama 2/3" again, and the gqa README says which sizes do what."""
    from graders.engine.manifest import ROOT

    texts = {p: p.read_text(encoding="utf-8") for p in [*ROOT.glob("katas/*/*"), *ROOT.glob("reference/*.py")]
             if p.is_file()}
    assert not [p.name for p, text in texts.items() if "Llama 2/3" in text or "Llama 2 and 3" in text]
    readme = texts[ROOT / "katas" / "gqa" / "README.md"]
    assert "Llama 2 70B" in readme and "7B and 13B models use plain\nmulti-head attention" in readme
