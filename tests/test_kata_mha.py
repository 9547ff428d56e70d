"""The mha grader on solutions written the way learners write them (not via the bug oracles), and
its independent oracle: nn.MultiheadAttention with the mask convention converted."""
import numpy as np
import torch

from conftest import checks_by_id
from graders.mha import CONFIGS, normal, torch_mha, trusted, weights
from reference.mha import MultiHeadSelfAttention

SOLUTION = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.n_head, self.n_embd = n_heads, d_model
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, causal=False):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.qkv_proj(x).split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
        if causal:
            blocked = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)
            att = att.masked_fill(blocked, -1e9)
        att = self.drop(F.softmax(att, dim=-1))
        return self.out_proj((att @ v).transpose(1, 2).reshape(B, T, C)), att
'''


def test_torch_oracle_agrees_with_the_reference_causal_and_not():
    rng = np.random.default_rng(0)
    B, T, d, H = CONFIGS[0]
    sd, x = weights(rng, d), normal(rng, B, T, d)
    for causal in (False, True):
        for got, expected in zip(trusted(MultiHeadSelfAttention, sd, H, x, causal), torch_mha(sd, H, x, causal)):
            torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)


def test_a_different_correct_solution_passes(grade_source):
    result = grade_source("mha", SOLUTION, seed=5)
    assert result["status"] == "passed", [c["message"] for c in result["checks"] if c["status"] != "passed"]


def test_scale_by_d_model_and_a_mask_buffer(grade_source):
    source = SOLUTION.replace("math.sqrt(q.size(-1))", "math.sqrt(C)").replace(
        "self.drop = nn.Dropout(dropout)",
        "self.drop = nn.Dropout(dropout)\n        self.register_buffer('bias', torch.ones(64, 64).tril())")
    checks = checks_by_id(grade_source("mha", source))
    assert checks["matches-torch-mha"]["diagnosis"] == "scale-by-d-model"
    # nanoGPT's mask buffer costs nothing, and the property checks keep their points: the values lose them.
    assert [c for c, v in checks.items() if v["status"] != "passed"] == ["matches-torch-mha"]


def test_a_persistent_mask_buffer_gets_full_marks(grade_source):
    source = SOLUTION.replace(
        "self.drop = nn.Dropout(dropout)",
        "self.drop = nn.Dropout(dropout)\n        self.register_buffer('bias', torch.ones(64, 64).tril().view(1, 1, 64, 64))")
    source = source.replace("blocked = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)",
                            "blocked = self.bias[:, :, :T, :T] == 0")
    result = grade_source("mha", source)
    assert result["score"] == result["max_score"], [c["message"] for c in result["checks"] if c["status"] != "passed"]


def test_an_extra_parameter_fails_state_dict_keys(grade_source):
    source = SOLUTION.replace("self.drop = nn.Dropout(dropout)",
                              "self.drop = nn.Dropout(dropout)\n        self.gain = nn.Parameter(torch.ones(()))")
    check = checks_by_id(grade_source("mha", source))["state-dict-keys"]
    assert "parameters are not the kata's" in check["message"] and "gain" in check["message"]


def test_softmax_in_float32_inside_passes_with_a_note(grade_source):
    result = grade_source("mha", SOLUTION.replace("F.softmax(att, dim=-1)", "F.softmax(att.float(), dim=-1).type_as(q)"))
    assert result["score"] == result["max_score"], [c["message"] for c in result["checks"] if c["status"] != "passed"]
    noted = {c["id"] for c in result["checks"] if "float32-inside" in c.get("notes", [])}
    assert {"matches-torch-mha", "weights-sum-to-one"} <= noted


def test_inverted_mask_filled_with_a_large_negative_is_still_named(grade_source):
    # -1e9 instead of -inf: the row left without keys is uniform, not NaN, so no oracle matches it.
    source = SOLUTION.replace("att.masked_fill(blocked, -1e9)", "att.masked_fill(~blocked, -1e9)")
    result = grade_source("mha", source)
    assert checks_by_id(result)["causal-ignores-future"]["diagnosis"] == "mask-inverted"
    assert result["diagnoses"] == ["mask-inverted"]


def test_softmax_over_the_heads_is_wrong_dim(grade_source):
    result = grade_source("mha", SOLUTION.replace("F.softmax(att, dim=-1)", "F.softmax(att, dim=1)"))
    assert checks_by_id(result)["weights-sum-to-one"]["diagnosis"] == "softmax-wrong-dim"


def test_weights_returned_before_dropout_fail_the_train_check(grade_source):
    source = SOLUTION.replace("att = self.drop(F.softmax(att, dim=-1))\n",
                              "att = F.softmax(att, dim=-1)\n        w = att\n        att = self.drop(att)\n")
    source = source.replace("reshape(B, T, C)), att", "reshape(B, T, C)), w")
    result = grade_source("mha", source)
    checks = checks_by_id(result)
    assert checks["train-drops-weights"]["diagnosis"] == "weights-before-dropout"
    assert "0.0% of the weights set to 0" in checks["train-drops-weights"]["message"]
    assert checks["matches-torch-mha"]["status"] == "passed"
    assert result["diagnoses"] == ["weights-before-dropout"]


def test_missing_divisibility_check_and_wrong_exception(grade_source):
    checks = checks_by_id(grade_source("mha", SOLUTION.replace(
        'assert d_model % n_heads == 0, "d_model must be divisible by n_heads"', "")))
    assert "yet a module was built" in checks["rejects-indivisible-heads"]["message"]
    checks = checks_by_id(grade_source("mha", SOLUTION.replace(
        'assert d_model % n_heads == 0, "d_model must be divisible by n_heads"',
        "if d_model % n_heads:\n            raise RuntimeError('bad heads')")))
    assert "got: RuntimeError: bad heads" in checks["rejects-indivisible-heads"]["message"]


def test_a_wrong_head_split_is_reported_by_the_value_checks_not_by_the_train_check(grade_source):
    # A straight reshape to (B, n_heads, T, head_dim): its weights are dropped as dropout=0.25 drops
    # them and applied to V the module's own way. train-drops-weights judges that, so it passes:
    # the split is the value checks' finding, named there, not "return the weights after dropout".
    source = SOLUTION.replace("t.view(B, T, self.n_head, -1).transpose(1, 2)", "t.reshape(B, self.n_head, T, -1)")
    result = grade_source("mha", source)
    checks = checks_by_id(result)
    assert checks["matches-torch-mha"]["diagnosis"] == "view-without-transpose"
    assert checks["train-drops-weights"]["status"] == "passed"
    assert result["diagnoses"] == ["view-without-transpose"]


def test_weights_dropped_apart_from_those_applied_to_v_fail_the_train_check(grade_source):
    # Two dropout draws: the weights returned are dropped as they should be, but V is multiplied
    # by another draw.
    source = SOLUTION.replace("return self.out_proj((att @ v)", "return self.out_proj((self.drop(w) @ v)")
    source = source.replace("att = self.drop(F.softmax(att, dim=-1))\n",
                            "w = F.softmax(att, dim=-1)\n        att = self.drop(w)\n")
    result = grade_source("mha", source)
    checks = checks_by_id(result)
    assert checks["train-drops-weights"]["status"] == "failed"
    assert "the output is not the returned weights applied to V" in checks["train-drops-weights"]["message"]
    assert [c for c, v in checks.items() if v["status"] != "passed"] == ["train-drops-weights"]
