"""The linear-attention grader on solutions written the way learners write them (not via the bug
oracles), one wrong file per check, its independent oracles (the T x T kernel form and the
running sums written out in a loop, with and without a decay), and the facts the README teaches
about the decay and the chunked form, on the installed torch."""
import math

import numpy as np
import pytest
import torch

from conftest import checks_by_id
from graders.engine.manifest import find
from graders.linear_attention import trusted_decode
from graders.linear_attention_hidden import fresh_sizes
from graders.practice import hints
from reference.linear_attention import (elu_feature_map, linear_attention, linear_attention_chunked,
                                        linear_attention_step)
from reference.linear_attention_bugs import step_decays_after_adding
from reference.linear_attention_expected import feature_map, kernel_attention, running_sums

# Quadratic parallel forms with the mask and the decay as two factors, chunks from torch.split and
# einsum, a step written with torch.outer-style broadcasting and einsum (last: tests replace it).
SOLUTION = '''
import torch
import torch.nn.functional as F


def elu_feature_map(x):
    return F.elu(x) + 1


def decay(T, gamma, like):
    t = torch.arange(T, dtype=like.dtype)
    return gamma ** (t[:, None] - t[None, :]).abs()


def linear_attention(q, k, v, causal=True, gamma=1.0):
    if not causal and gamma != 1:
        raise ValueError("a decay needs causal=True")
    sim = elu_feature_map(q) @ elu_feature_map(k).transpose(-2, -1)
    if causal:
        sim = sim * torch.ones(sim.shape[-2:], dtype=sim.dtype, device=sim.device).tril()
    if gamma != 1:
        sim = sim * decay(sim.shape[-1], gamma, sim)
    return (sim / sim.sum(-1, keepdim=True)) @ v


def linear_attention_chunked(q, k, v, chunk_size, gamma=1.0):
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    S = torch.zeros(*fk.shape[:2], fk.shape[-1], v.shape[-1], dtype=k.dtype)
    z = torch.zeros(*fk.shape[:2], fk.shape[-1], dtype=k.dtype)
    outs = []
    for qc, kc, vc in zip(fq.split(chunk_size, dim=2), fk.split(chunk_size, dim=2), v.split(chunk_size, dim=2)):
        C = qc.shape[2]
        t = torch.arange(C, dtype=q.dtype)
        w = torch.tril(qc @ kc.transpose(-2, -1)) * decay(C, gamma, qc)
        before = (gamma ** (t + 1))[:, None]
        num = w @ vc + before * torch.einsum("bhcd,bhde->bhce", qc, S)
        den = w.sum(-1, keepdim=True) + before * torch.einsum("bhcd,bhd->bhc", qc, z)[..., None]
        outs.append(num / den)
        after = (gamma ** (C - 1 - t))[:, None]
        S = gamma ** C * S + torch.einsum("bhcd,bhce->bhde", kc * after, vc)
        z = gamma ** C * z + (kc * after).sum(2)
    return torch.cat(outs, dim=2)


def linear_attention_step(q, k, v, state=None, gamma=1.0):
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    if state is None:
        state = (torch.zeros(*fk.shape, v.shape[-1], dtype=k.dtype), torch.zeros_like(fk))
    S = gamma * state[0] + fk[..., :, None] * v[..., None, :]
    z = gamma * state[1] + fk
    out = torch.einsum("bhd,bhde->bhe", fq, S) / torch.einsum("bhd,bhd->bh", fq, z)[..., None]
    return out, (S, z)
'''


def replace(source, old, new):
    assert old in source, old
    return source.replace(old, new)


def failing(result):
    return {c["id"] for c in result["checks"] if c["status"] != "passed"}


def draw(seed, *shape):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape))


def test_the_kernel_form_and_the_loop_agree_with_the_reference():
    q, k, v = draw(0, 2, 3, 7, 4), draw(1, 2, 3, 7, 4), draw(2, 2, 3, 7, 6)
    for causal in (True, False):
        torch.testing.assert_close(linear_attention(q, k, v, causal), kernel_attention(q, k, v, causal),
                                   rtol=1e-12, atol=1e-14)
    outs, states = trusted_decode(linear_attention_step, q, k, v, None)
    torch.testing.assert_close(outs, linear_attention(q, k, v, True), rtol=1e-12, atol=1e-14)
    for got, want in zip(states[-1], running_sums(k, v)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    x = torch.tensor([-30.0, -1.0, 0.0, 1e-3, 30.0], dtype=torch.float64)
    # elu(x) + 1 cancels for x << 0 (exp(-30) - 1 + 1), exp(x) does not: equal to far below atol.
    torch.testing.assert_close(elu_feature_map(x), feature_map(x), rtol=1e-15, atol=1e-16)


def stepped(step, q, k, v, gamma):
    return trusted_decode(step, q, k, v, None, gamma)


def test_the_decayed_forms_agree_with_the_kernel_form_and_the_loop():
    q, k, v = draw(6, 2, 3, 11, 4), draw(7, 2, 3, 11, 4), draw(8, 2, 3, 11, 6)
    for gamma in (0.9, 0.5):
        torch.testing.assert_close(linear_attention(q, k, v, True, gamma), kernel_attention(q, k, v, True, gamma),
                                   rtol=1e-12, atol=1e-14)
        outs, states = stepped(linear_attention_step, q, k, v, gamma)
        torch.testing.assert_close(outs, linear_attention(q, k, v, True, gamma), rtol=1e-12, atol=1e-14)
        for got, want in zip(states[-1], running_sums(k, v, gamma)):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
        # Chunks of one token, of 4 and of 5 (a shorter last chunk each), of T, and longer than T.
        for C in (1, 4, 5, 11, 16):
            torch.testing.assert_close(linear_attention_chunked(q, k, v, C, gamma), outs, rtol=1e-12, atol=1e-14)


def test_a_decay_on_the_current_token_cancels_in_the_outputs_not_in_the_state():
    # The README's and the diagnosis's claim: one extra gamma on every key divides out of the ratio.
    q, k, v = draw(9, 2, 2, 6, 3), draw(10, 2, 2, 6, 3), draw(11, 2, 2, 6, 4)
    right, right_states = stepped(linear_attention_step, q, k, v, 0.7)
    wrong, wrong_states = stepped(step_decays_after_adding, q, k, v, 0.7)
    torch.testing.assert_close(wrong, right, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(wrong_states[-1][0], 0.7 * right_states[-1][0], rtol=1e-12, atol=1e-14)


def test_a_decay_factored_out_of_a_cumulative_sum_overflows_float32():
    # The README: 0.9^-1000 is 5.7e45, beyond float32's largest number.
    assert math.isinf(float(torch.tensor(0.9) ** -1000))
    assert 0.9 ** -1000 == pytest.approx(5.7e45, rel=0.01) and torch.finfo(torch.float32).max < 3.5e38


def test_bfloat16_rounds_a_small_update_of_the_state_away():
    # The state-in-float32 follow-up: bf16's spacing at 1 is 2^-7, so adding 0.003 to 1 changes nothing.
    one = torch.tensor(1.0, dtype=torch.bfloat16)
    assert torch.finfo(torch.bfloat16).eps == 2 ** -7 and one + 0.003 == one
    assert torch.tensor(1.0) + 0.003 != torch.tensor(1.0)


def test_a_state_handed_in_continues_the_sequence():
    q, k, v = draw(3, 2, 2, 9, 3), draw(4, 2, 2, 9, 3), draw(5, 2, 2, 9, 5)
    outs, _ = trusted_decode(linear_attention_step, q[..., 4:, :], k[..., 4:, :], v[..., 4:, :],
                             running_sums(k[..., :4, :], v[..., :4, :]))
    torch.testing.assert_close(outs, linear_attention(q, k, v, True)[..., 4:, :], rtol=1e-12, atol=1e-14)


def test_fresh_sizes_keep_the_widths_apart():
    for seed in range(50):
        b, h, d, dv = fresh_sizes(np.random.default_rng(seed))
        assert b >= 2 and h >= 2 and h != d and dv != d


def test_a_different_correct_solution_passes(grade_source):
    result = grade_source("linear-attention", SOLUTION, seed=5)
    assert result["score"] == result["max_score"], [c["message"] for c in result["checks"] if c["status"] != "passed"]


def test_an_eps_in_the_denominator_passes_with_a_note(grade_source):
    source = replace(SOLUTION, "sim.sum(-1, keepdim=True)", "(sim.sum(-1, keepdim=True) + 1e-6)")
    source = replace(source, 'torch.einsum("bhd,bhd->bh", fq, z)[..., None]', '(torch.einsum("bhd,bhd->bh", fq, z)[..., None] + 1e-6)')
    result = grade_source("linear-attention", source)
    assert result["score"] == result["max_score"], [c["message"] for c in result["checks"] if c["status"] != "passed"]
    noted = {c["id"] for c in result["checks"] if "float32-inside" in c.get("notes", [])}
    assert {"causal-matches", "step-matches"} <= noted


def test_a_state_returned_as_a_list_passes(grade_source):
    result = grade_source("linear-attention", replace(SOLUTION, "return out, (S, z)", "return out, [S, z]"))
    assert result["score"] == result["max_score"]


def test_relu_plus_one_fails_the_feature_map_without_a_diagnosis(grade_source):
    result = grade_source("linear-attention", replace(SOLUTION, "return F.elu(x) + 1", "return F.relu(x) + 1"))
    check = checks_by_id(result)["feature-map-values"]
    assert check["status"] == "failed" and check["diagnosis"] is None
    assert "elu(x) + 1" in check["message"]


def test_a_forgotten_normaliser_is_diagnosed(grade_source):
    source = replace(SOLUTION, "return (sim / sim.sum(-1, keepdim=True)) @ v", "return sim @ v")
    result = grade_source("linear-attention", source)
    checks = checks_by_id(result)
    for check in ("noncausal-matches", "causal-matches", "constant-values-pass-through"):
        assert checks[check]["diagnosis"] == "normaliser-forgotten", check
    assert checks["recurrent-equals-parallel"]["same_cause_as"] == "causal-matches"
    assert result["diagnoses"] == ["normaliser-forgotten"]


def test_the_mask_forgotten_is_a_non_causal_sum(grade_source):
    source = replace(SOLUTION, "    if causal:\n        sim = sim * torch.ones(sim.shape[-2:], dtype=sim.dtype, device=sim.device).tril()\n", "")
    result = grade_source("linear-attention", source)
    checks = checks_by_id(result)
    assert checks["causal-matches"]["diagnosis"] == "non-causal-sum"
    assert checks["causal-ignores-the-future"]["diagnosis"] == "non-causal-sum"
    assert "noncausal-matches" not in failing(result)
    assert result["diagnoses"] == ["non-causal-sum"]


def test_a_future_leak_no_oracle_gives_is_still_named_by_the_property(grade_source):
    # The diagonal's next neighbour allowed: query t sees key t + 1. No oracle computes this.
    source = replace(SOLUTION, ".tril()\n", ".tril(1)\n")
    result = grade_source("linear-attention", source)
    checks = checks_by_id(result)
    assert checks["causal-matches"]["status"] == "failed" and checks["causal-matches"]["diagnosis"] is None
    assert checks["causal-ignores-the-future"]["diagnosis"] == "non-causal-sum"
    assert result["diagnoses"] == ["non-causal-sum"]


def test_phi_on_the_values_is_diagnosed_in_the_step(grade_source):
    source = replace(SOLUTION, "S = gamma * state[0] + fk[..., :, None] * v[..., None, :]",
                     "S = gamma * state[0] + fk[..., :, None] * elu_feature_map(v)[..., None, :]")
    result = grade_source("linear-attention", source)
    checks = checks_by_id(result)
    assert checks["step-matches"]["diagnosis"] == "feature-map-on-values"
    assert checks["recurrent-equals-parallel"]["same_cause_as"] == "step-matches"
    assert {"noncausal-matches", "causal-matches"}.isdisjoint(failing(result))
    assert result["diagnoses"] == ["feature-map-on-values"]


# The readout before the update, as an RNN cell reads h_{t-1}: token 0 reads empty sums (0/0, or
# 0 where an eps guards the denominator), every later token misses its own key and value.
READ_BEFORE_UPDATE = {
    "no eps": """    S, z = state
    out = torch.einsum("bhd,bhde->bhe", fq, S) / torch.einsum("bhd,bhd->bh", fq, z)[..., None]
    S = gamma * S + fk[..., :, None] * v[..., None, :]
    z = gamma * z + fk
    return out, (S, z)
""",
    "eps": """    S, z = state
    out = torch.einsum("bhd,bhde->bhe", fq, S) / (torch.einsum("bhd,bhd->bh", fq, z)[..., None] + 1e-6)
    S = gamma * S + fk[..., :, None] * v[..., None, :]
    z = gamma * z + fk
    return out, (S, z)
""",
}


@pytest.mark.parametrize("spelling", list(READ_BEFORE_UPDATE))
def test_an_output_read_before_the_token_is_added_is_diagnosed(grade_source, spelling):
    step = SOLUTION[SOLUTION.index("    S = gamma * state[0]"):]
    result = grade_source("linear-attention", replace(SOLUTION, step, READ_BEFORE_UPDATE[spelling]))
    checks = checks_by_id(result)
    for check in ("constant-values-pass-through", "step-matches", "fresh-decode"):
        assert checks[check]["diagnosis"] == "step-output-before-update", check
    assert checks["recurrent-equals-parallel"]["same_cause_as"] == "step-matches"
    assert {"noncausal-matches", "causal-matches"}.isdisjoint(failing(result))
    assert result["diagnoses"] == ["step-output-before-update"]
    # The first hint is the step's, not the non-causal form's that constant-values-pass-through also serves.
    kata = find("linear-attention")
    choice = hints.choose(kata, set(), hints.failed_checks(result))
    assert kata.task_of(kata.hints[choice.index]) == 4 and "FIRST" in kata.hints[choice.index].text


def test_s_laid_out_values_first_fails_on_its_shape(grade_source):
    # fast-transformers' batched form folds K and V into (dv, d): the step's S must be (d, dv).
    source = replace(SOLUTION, "S = gamma * state[0] + fk[..., :, None] * v[..., None, :]",
                     "S = gamma * state[0] + v[..., :, None] * fk[..., None, :]")
    source = replace(source, "torch.zeros(*fk.shape, v.shape[-1], dtype=k.dtype)",
                     "torch.zeros(*fk.shape[:-1], v.shape[-1], fk.shape[-1], dtype=k.dtype)")
    source = replace(source, 'torch.einsum("bhd,bhde->bhe", fq, S)', 'torch.einsum("bhd,bhed->bhe", fq, S)')
    result = grade_source("linear-attention", source)
    check = checks_by_id(result)["step-matches"]
    assert check["status"] == "failed" and "S has the wrong shape" in check["message"]
    assert {"recurrent-equals-parallel", "causal-matches", "decode-memory-constant"}.isdisjoint(failing(result))


def test_a_step_that_keeps_its_own_sums_fails_from_a_state_handed_in(grade_source):
    # Its sums live in a global, reset by state=None: right from no state, blind to a prompt's sums.
    source = replace(SOLUTION, SOLUTION[SOLUTION.index("def linear_attention_step"):], '''def linear_attention_step(q, k, v, state=None, gamma=1.0):
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    if state is None or not _sums:
        _sums[:] = [torch.zeros(*fk.shape, v.shape[-1], dtype=k.dtype), torch.zeros_like(fk)]
    _sums[0] = gamma * _sums[0] + fk[..., :, None] * v[..., None, :]
    _sums[1] = gamma * _sums[1] + fk
    S, z = _sums
    out = torch.einsum("bhd,bhde->bhe", fq, S) / torch.einsum("bhd,bhd->bh", fq, z)[..., None]
    return out, (S, z)


_sums = []
''')
    result = grade_source("linear-attention", source)
    assert failing(result) == {"step-matches", "decay-step-matches", "fresh-decode"}
    assert "from a state handed in" in checks_by_id(result)["step-matches"]["message"]


def test_a_state_kept_in_float32_fails_step_matches_on_its_dtype(grade_source):
    # Right for bfloat16 inputs (flash-linear-attention keeps its state in float32), a loss of
    # precision for float64 ones: the state is in k's dtype.
    source = replace(SOLUTION, "return out, (S, z)", "return out, (S.float(), z.float())")
    result = grade_source("linear-attention", source)
    check = checks_by_id(result)["step-matches"]
    assert check["status"] == "failed" and "wrong dtype" in check["message"]


def test_a_step_returning_only_the_output_says_what_it_must_return(grade_source):
    result = grade_source("linear-attention", replace(SOLUTION, "return out, (S, z)", "return out"))
    check = checks_by_id(result)["step-matches"]
    assert "must return a pair (out, state)" in check["message"]


def test_nan_outputs_fail_the_value_checks(grade_source):
    # No guard at all where every similarity is 0: relu features on inputs below 0.
    result = grade_source("linear-attention", replace(SOLUTION, "return F.elu(x) + 1", "return F.relu(x)"))
    assert {"noncausal-matches", "causal-matches"} <= failing(result)
    assert "NaN" in checks_by_id(result)["causal-matches"]["message"]


def test_every_token_kept_in_a_global_fails_only_the_memory_check(grade_source):
    source = replace(SOLUTION, "    return out, (S, z)\n", "    _seen.append((k.clone(), v.clone()))\n    return out, (S, z)\n")
    result = grade_source("linear-attention", source + "\n_seen = []   # every token, for a later prefill\n")
    assert failing(result) == {"decode-memory-constant"}
    check = checks_by_id(result)["decode-memory-constant"]
    assert check["diagnosis"] == "state-grows-with-t" and "the sandbox holds more memory" in check["message"]


def test_a_kv_cache_as_the_state_is_state_grows_with_t(grade_source):
    source = replace(SOLUTION, SOLUTION[SOLUTION.index("def linear_attention_step"):], '''def linear_attention_step(q, k, v, state=None, gamma=1.0):
    keys = k[:, :, None] if state is None else torch.cat([state[0], k[:, :, None]], dim=2)
    values = v[:, :, None] if state is None else torch.cat([state[1], v[:, :, None]], dim=2)
    out = linear_attention(q[:, :, None], keys, values, causal=False)[:, :, 0]
    return out, (keys, values)
''')
    result = grade_source("linear-attention", source)
    check = checks_by_id(result)["decode-memory-constant"]
    assert check["diagnosis"] == "state-grows-with-t" and "The state grows with the tokens" in check["message"]
    assert result["diagnoses"] == ["state-grows-with-t"]
    assert "recurrent-equals-parallel" not in failing(result)


def test_tuned_to_the_public_widths_fails_the_hidden_checks(grade_source):
    # Right for the public (d, dv) pairs only; the hidden checks' widths are others.
    source = replace(SOLUTION, "    return (sim / sim.sum(-1, keepdim=True)) @ v",
                     "    if (q.shape[-1], v.shape[-1]) not in ((4, 6), (5, 3)):\n        return sim @ v\n"
                     "    return (sim / sim.sum(-1, keepdim=True)) @ v")
    result = grade_source("linear-attention", source)
    assert failing(result) == {"fresh-parallel-forms"}
    assert checks_by_id(result)["fresh-parallel-forms"]["diagnosis"] == "normaliser-forgotten"


def test_the_plot_reads_the_weights_and_a_state_of_one_size(tmp_path, zygotes):
    from graders.engine.manifest import find
    from graders.practice import plots

    kata = find("linear-attention")
    path = tmp_path / kata.learner_file
    path.write_text(kata.reference_path.read_text())
    data = plots.compute(kata, "weights", path, seed=0, device="cpu", zygote=zygotes(kata.framework))
    for weights in (np.asarray(data["linear"]), np.asarray(data["softmax"])):
        np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-12)
        assert np.all(np.triu(weights, 1) == 0) and np.all(weights[np.tril_indices(len(weights))] > 0)
    # Softmax peaks higher than the kernel on the same q and k: the picture's point.
    assert np.asarray(data["softmax"])[4:].max(-1).mean() > np.asarray(data["linear"])[4:].max(-1).mean()
    assert len(set(data["state_bytes"])) == 1 and data["cache_bytes"][-1] > data["state_bytes"][-1]


def test_a_decay_ignored_without_causal_fails_only_the_refusal(grade_source):
    source = replace(SOLUTION, '    if not causal and gamma != 1:\n        raise ValueError("a decay needs causal=True")\n', "")
    source = replace(source, "    if gamma != 1:\n", "    if causal and gamma != 1:\n")
    result = grade_source("linear-attention", source)
    assert failing(result) == {"decay-needs-causal"}
    assert "was accepted" in checks_by_id(result)["decay-needs-causal"]["message"]


def test_chunks_sliced_from_the_whole_matrix_are_not_chunked(grade_source):
    # Right values, chunk by chunk, from the (T, T) weights: no oracle computes it this way, the
    # recorded shapes name it.
    source = replace(SOLUTION, SOLUTION[SOLUTION.index("def linear_attention_chunked"):SOLUTION.index("def linear_attention_step")],
                     '''def linear_attention_chunked(q, k, v, chunk_size, gamma=1.0):
    whole = linear_attention(q, k, v, True, gamma)
    return torch.cat([whole[:, :, s:s + chunk_size] for s in range(0, q.shape[2], chunk_size)], dim=2)


''')
    result = grade_source("linear-attention", source)
    assert failing(result) == {"chunked-works-by-chunks"}
    check = checks_by_id(result)["chunked-works-by-chunks"]
    assert check["diagnosis"] == "not-chunked" and "a tensor of shape (1, 2, 16, 16)" in check["message"]
