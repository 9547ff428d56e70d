"""The mha-by-loop grader on loops written the way learners write them: each check shown failing
with its message or diagnosis, and the recorder's reading of per-head and all-head matmuls."""
import numpy as np
import torch

from conftest import checks_by_id
from graders.engine.manifest import find
from graders.mha_by_loop import CONFIGS, attention_product, forward, transposed, weights
from reference.mha_by_loop_bugs import mha_by_loop_no_transpose
from reference.mha_by_loop import CausalSelfAttention

STUB = find("mha-by-loop").stub_path.read_text(encoding="utf-8")
TODO = '''    # loop over range(mha.n_head); head i uses channels i*mha.head_dim to (i+1)*mha.head_dim
    raise NotImplementedError("write mha_by_loop")
'''
# A learner's loop: the module's own projections, per-head slices of their outputs.
LOOP = '''    B, T, C = x.shape
    hd = mha.head_dim
    q, k, v = mha.qkv(x).split(C, dim=-1)
    mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    outs = []
    for i in range(mha.n_head):
        s = slice(i * hd, (i + 1) * hd)
        att = q[:, :, s] @ k[:, :, s].transpose(1, 2) / math.sqrt(hd)
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        outs.append(att @ v[:, :, s])
    return mha.proj(torch.cat(outs, dim=-1))
'''


def learner_file(body, *, replace=()):
    """The stub with ``body`` as mha_by_loop's body, and (old, new) edits applied to the result."""
    source = STUB.replace(TODO, body)
    for old, new in replace:
        assert old in source, old
        source = source.replace(old, new)
    return source


def op(name, *shapes):
    return {"kind": "function", "name": name, "module": "torch",
            "args": [{"shape": list(s), "dtype": "torch.float64", "device": "cpu"} for s in shapes], "kwargs": {}}


def test_the_recorder_reading_tells_one_head_from_all_heads():
    B, T, C, H = CONFIGS[0]
    hd = C // H
    assert attention_product(op("matmul", (B, T, hd), (B, hd, T)), B, T, H, hd) == "one head"
    assert attention_product(op("mul", (B, T, 1, hd), (B, 1, T, hd)), B, T, H, hd) == "one head"
    assert attention_product(op("matmul", (B, H, T, hd), (B, H, hd, T)), B, T, H, hd) == "all heads"
    assert attention_product(op("bmm", (B * H, T, T), (B * H, T, hd)), B, T, H, hd) == "all heads"
    einsum = {**op("einsum", (B, T, H, hd), (B, T, H, hd)), "args": ["bthd,bshd->bhts"] + op(
        "einsum", (B, T, H, hd), (B, T, H, hd))["args"]}
    assert attention_product(einsum, B, T, H, hd) == "all heads"
    assert attention_product(op("matmul", (B, T, C), (C, C)), B, T, H, hd) is None   # a projection
    assert attention_product(op("mul", (B, T, H, hd), ()), B, T, H, hd) is None   # scaling a view is no product


def test_forgetting_the_transpose_is_the_module_on_transposed_weights():
    rng = np.random.default_rng(0)
    B, T, C, H = CONFIGS[0]
    sd, x = weights(rng, C), torch.from_numpy(rng.standard_normal((B, T, C)))
    m = CausalSelfAttention(C, H, 16).double().eval()
    m.load_state_dict(sd)
    with torch.no_grad():
        torch.testing.assert_close(mha_by_loop_no_transpose(m, x), forward(CausalSelfAttention, transposed(sd, True, False), H, x))


def test_another_correct_loop_passes(grade_source):
    # Per-head weight rows through F.linear, the module's mask buffer, scores as a broadcast product.
    body = '''    B, T, C = x.shape
    hd = mha.head_dim
    W_q, W_k, W_v = mha.qkv.weight.split(C)
    heads = []
    for i in range(mha.n_head):
        rows = slice(i * hd, (i + 1) * hd)
        q, k, v = F.linear(x, W_q[rows]), F.linear(x, W_k[rows]), F.linear(x, W_v[rows])
        att = (q[:, :, None, :] * k[:, None, :, :]).sum(-1) * hd ** -0.5
        att = att.masked_fill(~mha.mask[:T, :T], float("-inf")).softmax(dim=-1)
        heads.append(torch.einsum("bts,bsd->btd", att, v))
    return F.linear(torch.cat(heads, dim=-1), mha.proj.weight)
'''
    result = grade_source("mha-by-loop", learner_file(body), seed=4)
    assert result["status"] == "passed", [c["message"] for c in result["checks"] if c["status"] != "passed"]


def test_calling_the_module_is_not_a_loop(grade_source):
    result = grade_source("mha-by-loop", learner_file(LOOP.replace(
        "    return mha.proj(torch.cat(outs, dim=-1))", "    return mha(x)")))
    checks = checks_by_id(result)
    assert checks["per-head-loop"]["diagnosis"] == "not-a-loop"
    assert "calls the module itself" in checks["per-head-loop"]["message"]
    assert checks["matches-module"]["status"] == "passed"
    assert result["diagnoses"] == ["not-a-loop"]


def test_calling_forward_computes_all_heads_at_once(grade_source):
    checks = checks_by_id(grade_source("mha-by-loop", learner_file(LOOP.replace(
        "    return mha.proj(torch.cat(outs, dim=-1))", "    return mha.forward(x)"))))
    message = checks["per-head-loop"]["message"]
    assert checks["per-head-loop"]["diagnosis"] == "not-a-loop"
    assert "all 4 heads at once" in message and "got: matmul((2, 4, 5, 6), (2, 4, 6, 5))" in message


def test_sdpa_per_head_is_not_allowed(grade_source):
    checks = checks_by_id(grade_source("mha-by-loop", learner_file(LOOP, replace=[(
        '''        att = q[:, :, s] @ k[:, :, s].transpose(1, 2) / math.sqrt(hd)
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        outs.append(att @ v[:, :, s])''',
        "        outs.append(F.scaled_dot_product_attention(q[:, :, s], k[:, :, s], v[:, :, s], is_causal=True))")])))
    assert checks["per-head-loop"]["diagnosis"] == "not-a-loop"
    assert "got: torch.nn.functional.scaled_dot_product_attention" in checks["per-head-loop"]["message"]


def test_broadcast_products_of_all_heads_are_not_a_loop(grade_source):
    body = '''    B, T, C = x.shape
    q, k, v = (t.view(B, T, mha.n_head, mha.head_dim) for t in mha.qkv(x).split(C, dim=-1))
    att = (q[:, :, None] * k[:, None]).sum(-1) / math.sqrt(mha.head_dim)   # (B, T, T, H)
    mask = torch.ones(T, T, dtype=torch.bool).tril()[:, :, None]
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=2)
    y = (att[..., None] * v[:, None]).sum(2)   # (B, T, H, hd)
    return mha.proj(y.reshape(B, T, C))
'''
    checks = checks_by_id(grade_source("mha-by-loop", learner_file(body)))
    assert checks["matches-module"]["status"] == "passed"
    assert checks["per-head-loop"]["diagnosis"] == "not-a-loop"
    assert "saw 0 products of a single head's tensors" in checks["per-head-loop"]["message"]


def test_slicing_the_fused_weight_along_columns_says_where_q_k_v_are(grade_source):
    body = LOOP.replace("    q, k, v = mha.qkv(x).split(C, dim=-1)\n",
                        "    W_q, W_k, W_v = mha.qkv.weight.chunk(3, dim=1)\n"
                        "    q, k, v = x @ W_q.T, x @ W_k.T, x @ W_v.T\n")
    result = grade_source("mha-by-loop", learner_file(body))
    message = checks_by_id(result)["matches-module"]["message"]
    assert "dim 0 holds Q, K and V stacked: rows 0..23 are W_q, 24..47 W_k, 48..71 W_v" in message
    assert "mat1 and mat2 shapes cannot be multiplied" in message
    assert result["score"] == 0


def test_a_transpose_forgotten_on_proj_only_is_named(grade_source):
    result = grade_source("mha-by-loop", learner_file(LOOP.replace(
        "    return mha.proj(torch.cat(outs, dim=-1))", "    return torch.cat(outs, dim=-1) @ mha.proj.weight")))
    assert checks_by_id(result)["matches-module"]["diagnosis"] == "missing-weight-transpose"
    assert result["diagnoses"] == ["missing-weight-transpose"]


def test_editing_the_weights_in_place_fails_only_the_no_grad_check(grade_source):
    # Folds the scale into W_q through .data: right the first time, wrong on every later call.
    body = LOOP.replace("    q, k, v = mha.qkv(x).split(C, dim=-1)\n",
                        "    mha.qkv.weight.data[:C] /= math.sqrt(hd)\n    q, k, v = mha.qkv(x).split(C, dim=-1)\n")
    body = body.replace(" / math.sqrt(hd)\n", "\n")
    checks = checks_by_id(grade_source("mha-by-loop", learner_file(body)))
    assert "changed the module's weights: qkv.weight differs" in checks["eval-no-grad-safe"]["message"]
    assert [c for c, v in checks.items() if v["status"] != "passed"] == ["eval-no-grad-safe"]


def test_writing_the_result_into_x_is_refused(grade_source):
    checks = checks_by_id(grade_source("mha-by-loop", learner_file(LOOP.replace(
        "    return mha.proj(torch.cat(outs, dim=-1))", "    return x.copy_(mha.proj(torch.cat(outs, dim=-1)))"))))
    assert "modified its input x in place" in checks["eval-no-grad-safe"]["message"]


def test_numpy_on_x_fails_when_x_requires_grad(grade_source):
    checks = checks_by_id(grade_source("mha-by-loop", learner_file(LOOP.replace(
        "    B, T, C = x.shape\n", "    B, T, C = x.numpy().shape\n"))))
    message = checks["eval-no-grad-safe"]["message"]
    assert "fails when x requires grad" in message and "Can't call numpy() on Tensor that requires grad" in message
    assert checks["matches-module"]["status"] == "passed"


def test_edited_class_and_mode_switch_fail_their_own_checks(grade_source):
    source = learner_file(LOOP.replace("    B, T, C = x.shape\n", "    mha.train()\n    B, T, C = x.shape\n"),
                          replace=[("/ math.sqrt(self.head_dim)", "/ math.sqrt(C)")])
    checks = checks_by_id(grade_source("mha-by-loop", source))
    assert "do not modify the given CausalSelfAttention" in checks["given-class-unchanged"]["message"]
    assert "switched the caller's module to train mode" in checks["eval-no-grad-safe"]["message"]
    assert checks["matches-module"]["status"] == "passed"   # the expected values come from the original class


def test_a_class_without_the_injected_weights_is_told_not_to_modify_it(grade_source):
    source = learner_file(LOOP, replace=[("self.proj = nn.Linear(n_embd, n_embd, bias=False)",
                                          "self.proj = nn.Linear(n_embd, n_embd)")])
    result = grade_source("mha-by-loop", source)
    message = checks_by_id(result)["matches-module"]["message"]
    assert "do not modify the given CausalSelfAttention" in message and "proj.bias (24,)" in message


def test_an_upcast_result_fails_only_the_float32_check(grade_source):
    checks = checks_by_id(grade_source("mha-by-loop", learner_file(LOOP.replace(
        "    return mha.proj(torch.cat(outs, dim=-1))", "    return mha.proj(torch.cat(outs, dim=-1)).double()"))))
    message = checks["float32-matches-module"]["message"]
    assert "The output has the wrong dtype" in message and "got: torch.float64" in message
    assert [c for c, v in checks.items() if v["status"] != "passed"] == ["float32-matches-module"]


FUNCTION_ONLY = '''import math

import torch
import torch.nn.functional as F


def mha_by_loop(mha, x):
''' + LOOP


def test_a_file_holding_only_the_function_is_graded_with_the_given_class(grade_source):
    result = grade_source("mha-by-loop", FUNCTION_ONLY)
    assert result["score"] == result["max_score"], [c["message"] for c in result["checks"] if c["status"] != "passed"]


def test_a_file_holding_only_a_wrong_function_gets_its_diagnosis(grade_source):
    result = grade_source("mha-by-loop", FUNCTION_ONLY.replace("/ math.sqrt(hd)", "/ math.sqrt(C)"))
    checks = checks_by_id(result)
    assert checks["matches-module"]["diagnosis"] == "scale-by-d-model"
    assert checks["given-class-unchanged"]["status"] == "passed"


def test_a_true_loop_with_a_wrong_scale_keeps_the_property_checks(grade_source):
    result = grade_source("mha-by-loop", learner_file(LOOP.replace("/ math.sqrt(hd)", "/ math.sqrt(C)")))
    checks = checks_by_id(result)
    assert [c for c, v in checks.items() if v["status"] != "passed"] == ["matches-module", "float32-matches-module"]
    assert result["diagnoses"] == ["scale-by-d-model"]


def test_softmax_in_float32_inside_passes_with_a_note(grade_source):
    result = grade_source("mha-by-loop", learner_file(LOOP.replace(
        'att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)',
        'att = F.softmax(att.masked_fill(~mask, float("-inf")).float(), dim=-1).type_as(q)')))
    assert result["score"] == result["max_score"], [c["message"] for c in result["checks"] if c["status"] != "passed"]
    assert "float32-inside" in checks_by_id(result)["matches-module"]["notes"]


def test_a_given_class_whose_mask_was_made_persistent_is_changed(grade_source):
    source = learner_file(LOOP, replace=[(", persistent=False)", ")")])
    checks = checks_by_id(grade_source("mha-by-loop", source))
    assert "no longer holds the original layers and buffer" in checks["given-class-unchanged"]["message"]
    assert [c for c, v in checks.items() if v["status"] != "passed"] == ["given-class-unchanged"]
