"""The attention-backward grader on solutions written the way learners write them (not via the bug
oracles), one failure path per check, and its oracles: autograd of F.scaled_dot_product_attention,
central differences and the explicit softmax Jacobian, each against the others and the reference."""
import numpy as np
import pytest
import torch

from conftest import checks_by_id
from graders.attention_backward import (FUTURE, SQUARE, TALL, VALUE_WIDTH, WIDE, autograd_grads,
                                        central_differences, inputs, probabilities)
from graders.engine.manifest import find
from graders.engine.structure import banned_used
from reference.attention_backward import attention_backward, softmax_backward
from reference.attention_backward_expected import jacobian_product

HIDDEN = {"fresh-inputs", "gradients-sum-to-zero"}

# Karpathy's "backprop ninja" style (makemore part 4): the softmax written out with its max, counts
# and their sum, every tensor's gradient named after it; `.mT`; rows with no key kept finite by
# hand (a -inf max replaced by 0, the sum clamped) instead of a masked_fill after the softmax.
SOLUTION = '''
import torch


def softmax_backward(p, dp):
    return p * dp - p * (p * dp).sum(-1, keepdim=True)


def attention_backward(q, k, v, do, scale=None, causal=False):
    if scale is None:
        scale = q.shape[-1] ** -0.5
    Tq, Tk = q.shape[-2], k.shape[-2]
    att = q @ k.mT * scale
    if causal:
        keep = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(diagonal=Tk - Tq)
        att = att.masked_fill(keep.logical_not(), -float("inf"))
    att_max = att.amax(-1, keepdim=True)
    att_max = torch.where(torch.isinf(att_max), torch.zeros_like(att_max), att_max)
    counts = (att - att_max).exp()
    counts_sum = counts.sum(-1, keepdim=True)
    probs = counts / counts_sum.clamp_min(torch.finfo(q.dtype).tiny)
    dv = probs.mT @ do
    dprobs = do @ v.mT
    datt = softmax_backward(probs, dprobs)
    dq = datt @ k * scale
    dk = datt.mT @ q * scale
    return dq, dk, dv
'''

# One query at a time, as a derivation on paper reads: the row's Jacobian built explicitly
# (torch.outer), the keys a causal query sees sliced off, gradients accumulated into zeros.
ROW_BY_ROW = '''
import math
import torch


def softmax_backward(p, dp):
    flat_p, flat_dp = p.reshape(-1, p.shape[-1]), dp.reshape(-1, p.shape[-1])
    rows = [(torch.diag(r) - torch.outer(r, r)) @ g for r, g in zip(flat_p, flat_dp)]
    return torch.stack(rows).reshape(p.shape)


def attention_backward(q, k, v, do, scale=None, causal=False):
    scale = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    Tq, Tk = q.shape[-2], k.shape[-2]
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for i in range(Tq):
        n = Tk if not causal else max(0, min(Tk, Tk - Tq + i + 1))
        if n == 0:
            continue   # a query before every key reads nothing
        s = q[..., i, :].unsqueeze(-2) @ k[..., :n, :].transpose(-1, -2) * scale   # (B, H, 1, n)
        p = torch.softmax(s, dim=-1)
        dv[..., :n, :] += p.transpose(-1, -2) @ do[..., i, :].unsqueeze(-2)
        ds = softmax_backward(p, do[..., i, :].unsqueeze(-2) @ v[..., :n, :].transpose(-1, -2))
        dq[..., i, :] = (ds @ k[..., :n, :]).squeeze(-2) * scale
        dk[..., :n, :] += ds.transpose(-1, -2) @ q[..., i, :].unsqueeze(-2) * scale
    return dq, dk, dv
'''


def failed(result):
    return {c["id"]: c["diagnosis"] for c in result["checks"] if c["status"] != "passed"}


def failed_public(result):
    return {cid: code for cid, code in failed(result).items() if cid not in HIDDEN}


def test_the_oracles_agree_with_each_other_and_the_reference():
    rng = np.random.default_rng(0)
    for cfg in (SQUARE, WIDE, TALL, VALUE_WIDTH, FUTURE):
        q, k, v, do = inputs(rng, cfg)
        for scale, causal in ((None, False), (0.3, False), (None, True), (1.7, True)):
            expected = autograd_grads(q, k, v, do, scale, causal)
            for mine, theirs in zip(attention_backward(q, k, v, do, scale, causal), expected):
                torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-14)
            for numeric, theirs in zip(central_differences(q, k, v, do, scale, causal), expected):
                torch.testing.assert_close(numeric, theirs, rtol=0, atol=1e-8)
    p, dp = probabilities(rng, 2, 3, 5, 7), torch.from_numpy(rng.standard_normal((2, 3, 5, 7)))
    s = p.log().requires_grad_()   # softmax(log p) = p: autograd's softmax backward at these weights
    (ds,) = torch.autograd.grad(torch.softmax(s, dim=-1), s, dp)
    torch.testing.assert_close(jacobian_product(p, dp), ds, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(softmax_backward(p, dp), ds, rtol=1e-12, atol=1e-14)


def test_queries_without_a_key_get_zero_gradients_from_every_oracle():
    q, k, v, do = inputs(np.random.default_rng(1), TALL)
    early = TALL[2] - TALL[3]
    for grads in (autograd_grads(q, k, v, do, causal=True), attention_backward(q, k, v, do, causal=True)):
        assert torch.equal(grads[0][..., :early, :], torch.zeros_like(grads[0][..., :early, :]))
        assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("source", [
    "from torch.autograd import grad",
    "import torch.autograd.functional as AF\nAF.vjp",
    "from torch.func import vjp",
    "import torch\ntorch.autograd.grad",
    "from torch import autograd",
    "import torch\ntorch.ops.aten._softmax_backward_data",
    "from torch.ops import aten",
    "import functorch",
])
def test_every_spelling_of_autograd_is_banned_by_the_source_scan(source):
    assert banned_used(source, [], find("attention-backward").banned)


def test_different_correct_solutions_pass(grade_source):
    for source in (SOLUTION, ROW_BY_ROW):
        for seed in (1, 5):
            result = grade_source("attention-backward", source, seed=seed)
            assert result["score"] == result["max_score"], failed(result)


def test_a_float32_computation_inside_passes_with_a_note(grade_source):
    source = SOLUTION.replace("    if scale is None:", "    dtype = q.dtype\n    q, k, v, do = q.float(), k.float(), "
                              "v.float(), do.float()\n    if scale is None:").replace(
        "    return dq, dk, dv", "    return dq.to(dtype), dk.to(dtype), dv.to(dtype)")
    result = grade_source("attention-backward", source)
    assert result["score"] == result["max_score"], failed(result)
    noted = {c["id"] for c in result["checks"] if "float32-inside" in c.get("notes", [])}
    assert {"matches-autograd", "causal-matches", "custom-scale"} <= noted


def test_a_softmax_backward_that_returns_float64_fails_only_its_values(grade_source):
    # Computed in float64 "for accuracy" and never cast back: only the float32 case shows it.
    source = SOLUTION.replace("    return p * dp - p * (p * dp).sum(-1, keepdim=True)",
                              "    p, dp = p.double(), dp.double()\n    return p * dp - p * (p * dp).sum(-1, keepdim=True)")
    source = source.replace("datt = softmax_backward(probs, dprobs)",
                            "datt = probs * (dprobs - (probs * dprobs).sum(-1, keepdim=True))")
    result = grade_source("attention-backward", source)
    assert failed(result) == {"softmax-backward-values": None}
    assert "wrong dtype" in checks_by_id(result)["softmax-backward-values"]["message"]


def test_the_diagonal_of_the_jacobian_is_named(grade_source):
    source = SOLUTION.replace("return p * dp - p * (p * dp).sum(-1, keepdim=True)", "return p * (1 - p) * dp")
    result = grade_source("attention-backward", source)
    assert set(failed(result).values()) == {"softmax-jacobian-diag-only"}
    assert {"softmax-backward-values", "matches-autograd", "gradcheck", "gradients-sum-to-zero"} <= set(failed(result))


def test_gradients_returned_in_float64_fail_only_the_float32_case(grade_source):
    source = SOLUTION.replace("    if scale is None:", "    q, k, v, do = q.double(), k.double(), v.double(), "
                              "do.double()\n    if scale is None:")
    result = grade_source("attention-backward", source)
    assert failed(result) == {"matches-autograd": None}
    assert "torch.float32" in checks_by_id(result)["matches-autograd"]["message"]


def test_a_scale_from_the_value_width_fails_gradcheck(grade_source):
    # Right wherever dv == hd: only gradcheck's v is wider than q (and the hidden shapes').
    result = grade_source("attention-backward", SOLUTION.replace("q.shape[-1] ** -0.5", "v.shape[-1] ** -0.5"))
    assert failed_public(result) == {"gradcheck": None}
    assert "central differences" in checks_by_id(result)["gradcheck"]["message"]


def test_an_ignored_scale_argument_fails_only_custom_scale(grade_source):
    result = grade_source("attention-backward", SOLUTION.replace("    if scale is None:\n", "    if True:\n"))
    assert failed_public(result) == {"custom-scale": None}
    assert "scale=0.3 given" in checks_by_id(result)["custom-scale"]["message"]


def test_the_scale_missing_from_dq_is_named(grade_source):
    result = grade_source("attention-backward", SOLUTION.replace("dq = datt @ k * scale", "dq = datt @ k"))
    assert failed(result)["matches-autograd"] == "missing-scale-in-grad"
    assert result["diagnoses"] == ["missing-scale-in-grad"]


def test_the_scale_missing_from_dk_alone_is_named(grade_source):
    result = grade_source("attention-backward", SOLUTION.replace("dk = datt.mT @ q * scale", "dk = datt.mT @ q"))
    assert failed(result)["matches-autograd"] == "missing-scale-in-grad"
    assert result["diagnoses"] == ["missing-scale-in-grad"]


def test_dk_and_dq_returned_swapped_are_named_by_values_and_by_shape(grade_source):
    result = grade_source("attention-backward", SOLUTION.replace("return dq, dk, dv", "return dk, dq, dv"))
    checks = checks_by_id(result)
    assert checks["matches-autograd"]["diagnosis"] == "dk-dq-swapped"   # Tq == Tk first: the values
    assert checks["causal-matches"]["diagnosis"] == "dk-dq-swapped"
    assert "wrong shape" in checks["custom-scale"]["message"]   # Tq < Tk: dq has dk's shape
    assert checks["custom-scale"]["diagnosis"] == "dk-dq-swapped"


def test_a_finite_fill_fails_only_the_queries_without_a_key(grade_source):
    # The -1e9 of the Annotated Transformer, no clean-up: rows without a key come out uniform.
    source = SOLUTION.replace('-float("inf")', "-1e9").replace(
        "    att_max = torch.where(torch.isinf(att_max), torch.zeros_like(att_max), att_max)\n", "")
    result = grade_source("attention-backward", source)
    assert failed_public(result) == {"causal-matches": None}
    assert "precede every key" in checks_by_id(result)["causal-matches"]["message"]


def test_nan_rows_and_a_top_left_mask_are_named(grade_source):
    nan_rows = SOLUTION.replace(
        "    att_max = torch.where(torch.isinf(att_max), torch.zeros_like(att_max), att_max)\n", "")
    result = grade_source("attention-backward", nan_rows)
    assert failed_public(result) == {"causal-matches": "nan-on-fully-masked-row"}
    top_left = SOLUTION.replace("tril(diagonal=Tk - Tq)", "tril()")
    result = grade_source("attention-backward", top_left)
    assert failed_public(result) == {"causal-matches": "mask-top-left-aligned"}


def test_an_unmasked_softmax_in_ds_leaks_into_the_future(grade_source):
    source = SOLUTION.replace("    dprobs = do @ v.mT\n", "    dprobs = do @ v.mT\n    probs = torch.softmax(q @ k.mT * "
                              "scale, dim=-1)\n")
    result = grade_source("attention-backward", source)
    checks = checks_by_id(result)
    assert checks["causal-no-grad-from-future"]["diagnosis"] == "causal-grad-leak"
    assert "keys 3..6" in checks["causal-no-grad-from-future"]["message"]
    assert failed_public(result) == {"causal-matches": "causal-grad-leak", "causal-no-grad-from-future": "causal-grad-leak"}


def test_an_unmasked_softmax_in_dv_alone_leaks_into_the_future(grade_source):
    # ds, dq and dk from the masked weights, dv from the plain softmax: only dv and the values leak.
    source = SOLUTION.replace("    dv = probs.mT @ do\n", "    dv = torch.softmax(q @ k.mT * scale, dim=-1).mT @ do\n")
    result = grade_source("attention-backward", source)
    checks = checks_by_id(result)
    assert "dv of keys 3..6" in checks["causal-no-grad-from-future"]["message"]
    assert failed_public(result) == {"causal-matches": "causal-grad-leak", "causal-no-grad-from-future": "causal-grad-leak"}


@pytest.mark.parametrize("change", [
    ("import torch\n", "import torch\nfrom torch.func import vjp\n"),
    ("    return dq, dk, dv", "    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))\n"
                            "    with torch.enable_grad():\n"
                            "        s = q @ k.mT * scale\n"
                            "        if causal:\n"
                            "            s = s.masked_fill(keep.logical_not(), -float('inf'))\n"
                            "        out = torch.nan_to_num(torch.softmax(s, -1)) @ v\n"
                            "        out.backward(do)\n"
                            "    return q.grad, k.grad, v.grad"),
    ("    return p * dp - p * (p * dp).sum(-1, keepdim=True)",
     "    return torch._softmax_backward_data(dp, p, -1, p.dtype)"),
])
def test_autograd_or_a_library_backward_fails_only_the_banned_check(grade_source, change):
    result = grade_source("attention-backward", SOLUTION.replace(*change))
    assert failed(result) == {"banned-api": "banned-api"}


def test_introspection_is_tampering(grade_source):
    result = grade_source("attention-backward", "import inspect\n" + SOLUTION)
    assert failed(result) == {"banned-api": "tampering"}


def test_a_solution_tuned_to_the_public_head_widths_fails_the_fresh_inputs(grade_source):
    source = SOLUTION.replace("scale = q.shape[-1] ** -0.5", "scale = {3: 3 ** -0.5, 4: 0.5}[q.shape[-1]]")
    result = grade_source("attention-backward", source)   # the hidden head widths are 8 and 6
    assert failed(result) == {"fresh-inputs": None, "gradients-sum-to-zero": None}
    assert "KeyError" in checks_by_id(result)["fresh-inputs"]["message"]
