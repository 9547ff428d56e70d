"""The sdpa-swap grader on solutions written the way learners write them (not via the bug oracles),
its reference against an oracle nobody here wrote, and the pieces of its @cuda checks that need
no GPU: reading recorded SDPA calls, replaying one under sdpa_kernel, judging measurements."""
import numpy as np
import pytest
import torch
import torch.nn as nn

from conftest import checks_by_id
from graders.engine import expect
from graders.engine.failures import CheckFailed
from graders.sdpa_swap import C, H, dropping_in_eval, flash_refusal, judge_benchmark, normal, sdpa_calls, trusted, weights
from reference.sdpa_swap import CausalSelfAttention

SOLUTION = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout=0.0, flash=True):
        super().__init__()
        assert n_embd % n_head == 0
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd, bias=False)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.n_embd, self.dropout, self.flash = n_head, n_embd, dropout, flash
        self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float('-inf'))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.proj(y))
'''
FLASH_CALL = ("F.scaled_dot_product_attention(q, k, v, attn_mask=None, "
              "dropout_p=self.dropout if self.training else 0, is_causal=True)")
MANUAL_MASK = "att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float('-inf'))"


def flash(call):
    return SOLUTION.replace(FLASH_CALL, call)


def test_reference_equals_torch_multihead_attention():
    """The reference's two paths against nn.MultiheadAttention given the same weights."""
    rng = np.random.default_rng(0)
    sd, x = weights(rng, C), normal(rng, 2, 7, C)
    with torch.no_grad():
        mha = nn.MultiheadAttention(C, H, bias=False, batch_first=True).double().eval()
        mha.load_state_dict({"in_proj_weight": sd["qkv.weight"], "out_proj.weight": sd["proj.weight"]})
        blocked = ~torch.ones(7, 7, dtype=torch.bool).tril()   # nn.MultiheadAttention: True = blocked
        expected, _ = mha(x, x, x, attn_mask=blocked, need_weights=False)
    for is_flash in (True, False):
        torch.testing.assert_close(trusted(CausalSelfAttention, sd, x, flash=is_flash), expected, rtol=1e-12, atol=1e-14)


def test_a_different_correct_solution_passes_and_cuda_checks_are_skipped(grade_source):
    result = grade_source("sdpa-swap", SOLUTION, seed=5)
    assert result["status"] == "passed", [c["message"] for c in result["checks"] if c["status"] != "passed"]
    assert result["score"] == result["max_score"] == 10
    skipped = {c["id"]: c["message"] for c in result["checks"] if c["status"] == "skipped"}
    assert set(skipped) == {"flash-eligible-bf16", "bf16-close-to-float64", "flash-beats-manual"}
    assert all("needs a CUDA device" in message for message in skipped.values())


def test_pre_scaled_q_is_double_scale(grade_source):
    source = flash("F.scaled_dot_product_attention(q * (1.0 / math.sqrt(k.size(-1))), k, v, "
                   "dropout_p=self.dropout if self.training else 0, is_causal=True)")
    result = grade_source("sdpa-swap", source)
    checks = checks_by_id(result)
    assert checks["matches-reference"]["diagnosis"] == "double-scale"
    assert "Values of the output differ" in checks["matches-reference"]["message"]
    assert checks["paths-agree"]["diagnosis"] == "double-scale"
    assert checks["flash-calls-sdpa"]["status"] == "passed"   # the call itself is right: the values say the rest
    assert checks["manual-path-avoids-sdpa"]["status"] == "passed"
    assert result["diagnoses"] == ["double-scale"]


def test_the_default_scale_passed_explicitly_gets_full_marks(grade_source):
    source = flash("F.scaled_dot_product_attention(q, k, v, is_causal=True, "
                   "dropout_p=self.dropout if self.training else 0, scale=k.size(-1) ** -0.5)")
    result = grade_source("sdpa-swap", source)
    assert result["score"] == result["max_score"], [c["message"] for c in result["checks"] if c["status"] != "passed"]


def test_a_scale_argument_that_scales_twice_is_double_scale(grade_source):
    source = flash("F.scaled_dot_product_attention(q, k, v, is_causal=True, "
                   "dropout_p=self.dropout if self.training else 0, scale=1 / k.size(-1))")
    checks = checks_by_id(grade_source("sdpa-swap", source))
    assert "a scale other than 1/sqrt(head_dim)" in checks["flash-calls-sdpa"]["message"]
    assert "scale=0.0833333" in checks["flash-calls-sdpa"]["message"]
    assert checks["flash-calls-sdpa"]["diagnosis"] == "double-scale"
    assert checks["matches-reference"]["diagnosis"] == "double-scale"


def test_explicit_default_scale_on_pre_scaled_q_loses_the_value_checks(grade_source):
    source = flash("F.scaled_dot_product_attention(q / math.sqrt(k.size(-1)), k, v, is_causal=True, "
                   "dropout_p=self.dropout if self.training else 0, scale=1 / math.sqrt(k.size(-1)))")
    checks = checks_by_id(grade_source("sdpa-swap", source))
    assert checks["flash-calls-sdpa"]["status"] == "passed"
    assert checks["matches-reference"]["diagnosis"] == "double-scale"


def test_sdpa_dropout_in_eval(grade_source):
    source = flash("F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout, is_causal=True)")
    checks = checks_by_id(grade_source("sdpa-swap", source))
    assert "In eval mode SDPA must get dropout_p=0" in checks["sdpa-dropout-follows-mode"]["message"]
    assert checks["sdpa-dropout-follows-mode"]["diagnosis"] == "dropout-in-eval"
    assert checks["eval-deterministic"]["diagnosis"] == "dropout-in-eval"
    assert checks["matches-reference"]["status"] == "passed"   # dropout=0.0 there


def test_sdpa_never_dropping_fails_in_train_mode(grade_source):
    source = flash("F.scaled_dot_product_attention(q, k, v, is_causal=True)")
    check = checks_by_id(grade_source("sdpa-swap", source))["sdpa-dropout-follows-mode"]
    assert "In train mode SDPA must get dropout_p=0.2" in check["message"]
    assert "dropout_p=0.0" in check["message"] and check["diagnosis"] is None


def test_manual_path_with_functional_dropout_drops_in_eval(grade_source):
    source = SOLUTION.replace("att = self.attn_dropout(att)", "att = F.dropout(att, self.dropout)")
    check = checks_by_id(grade_source("sdpa-swap", source))["eval-deterministic"]
    assert "flash=False" in check["message"] and check["diagnosis"] == "dropout-in-eval"


def test_positional_mask_tensor_is_sdpa_with_explicit_mask(grade_source):
    # attn_mask passed positionally: the recorded call's arguments are named before judging.
    source = flash("F.scaled_dot_product_attention(q, k, v, self.mask[:, :, :T, :T] != 0, "
                   "self.dropout if self.training else 0)")
    result = grade_source("sdpa-swap", source)
    check = checks_by_id(result)["flash-calls-sdpa"]
    assert "attn_mask=tensor bool[1, 1, 16, 16]" in check["message"]
    assert result["diagnoses"] == ["sdpa-with-explicit-mask"]


def test_flash_path_without_is_causal(grade_source):
    source = flash("F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0)")
    check = checks_by_id(grade_source("sdpa-swap", source))["flash-calls-sdpa"]
    assert "without is_causal=True" in check["message"]


def test_flash_flag_ignored_is_sdpa_not_used(grade_source):
    source = SOLUTION.replace("if self.flash:", "if False:")
    result = grade_source("sdpa-swap", source)
    checks = checks_by_id(result)
    assert "never calls F.scaled_dot_product_attention" in checks["flash-calls-sdpa"]["message"]
    assert checks["sdpa-dropout-follows-mode"]["diagnosis"] == "sdpa-not-used"
    assert result["diagnoses"] == ["sdpa-not-used"]


def test_manual_path_scaled_by_n_embd_is_paths_disagree(grade_source):
    result = grade_source("sdpa-swap", SOLUTION.replace("math.sqrt(k.size(-1))", "math.sqrt(C)"))
    checks = checks_by_id(result)
    assert "The two paths compute different functions" in checks["paths-agree"]["message"]
    assert checks["paths-agree"]["diagnosis"] == "paths-disagree"
    assert checks["manual-path-avoids-sdpa"]["status"] == "passed"   # it calls no SDPA: the values say the rest
    assert checks["flash-calls-sdpa"]["status"] == "passed"


def test_manual_path_calling_sdpa_fails(grade_source):
    result = grade_source("sdpa-swap", SOLUTION.replace("if self.flash:", "if True:"))
    checks = checks_by_id(result)
    assert "calls a fused attention" in checks["manual-path-avoids-sdpa"]["message"]
    assert "torch.nn.functional.scaled_dot_product_attention" in checks["manual-path-avoids-sdpa"]["message"]
    assert checks["paths-agree"]["status"] == "passed"


def test_mask_as_plain_attribute_or_not_persistent(grade_source):
    register = 'self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))'
    plain = SOLUTION.replace(register, "self.mask = torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)")
    result = grade_source("sdpa-swap", plain)
    assert 'no buffer named "mask"' in checks_by_id(result)["mask-is-buffer"]["message"]
    assert result["diagnoses"] == ["mask-not-buffer"] and result["score"] == 9
    hidden = SOLUTION.replace(register, register[:-1] + ", persistent=False)")
    result = grade_source("sdpa-swap", hidden)
    assert result["score"] == result["max_score"] and result["diagnoses"] == []


def test_a_buffer_registered_with_persistent_false_moves_with_to():
    """What mask-not-buffer's explanation says of buffers, held to PyTorch: every buffer moves with
    .to(), persistent or not; only a plain attribute stays behind."""
    from graders.engine.manifest import find

    m = nn.Module()
    m.register_buffer("mask", torch.ones(4, 4).tril(), persistent=False)
    m.plain = torch.ones(4, 4).tril()
    m.to(device="meta", dtype=torch.float64)
    assert (m.mask.device.type, m.mask.dtype) == ("meta", torch.float64) and "mask" not in m.state_dict()
    assert m.plain.device.type == "cpu"
    explain = find("sdpa-swap").diagnoses["mask-not-buffer"].explain
    assert "plain tensor attribute" in explain and "persistent=False ones too" in explain


def test_manual_path_without_attention_dropout_is_named(grade_source):
    result = grade_source("sdpa-swap", SOLUTION.replace("            att = self.attn_dropout(att)\n", ""))
    checks = checks_by_id(result)
    assert checks["manual-path-dropout"]["diagnosis"] == "manual-path-no-dropout"
    assert result["diagnoses"] == ["manual-path-no-dropout"] and result["score"] == 9


def test_softmax_in_float32_inside_passes_with_a_note(grade_source):
    result = grade_source("sdpa-swap", SOLUTION.replace("att = F.softmax(att, dim=-1)",
                                                        "att = F.softmax(att.float(), dim=-1).type_as(q)"))
    assert result["score"] == result["max_score"], [c["message"] for c in result["checks"] if c["status"] != "passed"]
    noted = {c["id"] for c in result["checks"] if "float32-inside" in c.get("notes", [])}
    assert {"matches-reference", "eval-deterministic"} <= noted


def test_unsliced_mask_fails_only_for_short_sequences(grade_source):
    result = grade_source("sdpa-swap", SOLUTION.replace(MANUAL_MASK, "att = att.masked_fill(self.mask == 0, float('-inf'))"))
    checks = checks_by_id(result)
    assert checks["short-sequence"]["status"] == "failed"
    assert "RuntimeError" in checks["short-sequence"]["message"]
    assert checks["matches-reference"]["status"] == "passed"   # T = block_size there


def test_biases_are_refused_with_the_expected_layers(grade_source):
    result = grade_source("sdpa-swap", SOLUTION.replace("bias=False", "bias=True"))
    message = checks_by_id(result)["matches-reference"]["message"]
    assert "qkv.bias" in message and "bias=False" in message


def test_recorded_sdpa_arguments_are_named_and_defaulted():
    q = {"shape": [2, 4, 7, 12], "dtype": "torch.float32", "device": "cpu"}
    ops = [{"kind": "function", "name": "linear", "args": [q], "kwargs": {}},
           {"kind": "function", "name": "scaled_dot_product_attention", "args": [q, q, q, None, 0.1, True], "kwargs": {}},
           {"kind": "function", "name": "scaled_dot_product_attention", "args": [q, q, q], "kwargs": {"scale": 0.5}}]
    first, second = sdpa_calls(ops)
    assert (first["attn_mask"], first["dropout_p"], first["is_causal"], first["scale"]) == (None, 0.1, True, None)
    assert (second["attn_mask"], second["dropout_p"], second["is_causal"], second["scale"]) == (None, 0.0, False, 0.5)
    assert len(dropping_in_eval(ops)) == 1
    eval_dropout = {"kind": "function", "name": "dropout", "args": [q], "kwargs": {"p": 0.2, "training": False}}
    default_dropout = {"kind": "function", "name": "dropout", "args": [q, 0.2], "kwargs": {}}
    assert dropping_in_eval([eval_dropout]) == [] and dropping_in_eval([default_dropout]) == [default_dropout]


def test_flash_replay_names_pytorchs_reason():
    # The @cuda check replays on the GPU; the CPU has a flash kernel too, with its own refusals.
    four_d = {"shape": [2, 4, 7, 64], "dtype": "torch.float32", "device": "cpu"}
    call = {"query": four_d, "key": four_d, "value": four_d, "attn_mask": None, "dropout_p": 0.0,
            "is_causal": True, "scale": None}
    assert flash_refusal(call, "cpu") is None
    three_d = {**four_d, "shape": [8, 7, 64]}
    assert "4 dimensional" in flash_refusal({**call, "query": three_d, "key": three_d, "value": three_d}, "cpu")
    huge = {**four_d, "shape": [4096, 4096, 4096, 64]}
    assert "more than this check uses" in flash_refusal({**call, "query": huge}, "cpu")
    assert "not a floating-point tensor" in flash_refusal({**call, "key": {**four_d, "dtype": "torch.int64"}}, "cpu")


def test_benchmark_judgement():
    fast = {"seconds": 0.001, "peak_bytes": 160 << 20}
    expect.NOTES.clear()
    judge_benchmark(fast, {"seconds": 0.005, "peak_bytes": 4300 << 20}, case="")
    # A pass shows what was measured: the figures a README may quote, with the command that printed them.
    assert expect.NOTES["measured"] == ("measured: flash path 160.0 MiB peak, 1.00 ms per call; manual path "
                                        "4,300.0 MiB, 5.00 ms: 27x less memory, 5.0x faster")
    expect.NOTES.clear()
    with pytest.raises(CheckFailed, match="does not save memory"):
        judge_benchmark(fast, {"seconds": 0.005, "peak_bytes": 2000 << 20}, case="")
    with pytest.raises(CheckFailed, match="not at least 3x faster"):
        judge_benchmark(fast, {"seconds": 0.002, "peak_bytes": 4300 << 20}, case="")
    with pytest.raises(CheckFailed, match="could not be measured"):
        judge_benchmark({"seconds": 0.001, "peak_bytes": None}, {"seconds": 0.005, "peak_bytes": None}, case="")
    # Calls faster than the clock can time (0 s per call) pass, and the figures still print.
    expect.NOTES.clear()
    judge_benchmark({"seconds": 0.0, "peak_bytes": 160 << 20}, {"seconds": 0.005, "peak_bytes": 4300 << 20}, case="")
    assert expect.NOTES["measured"].endswith("27x less memory, faster than the clock tells apart")
    expect.NOTES.clear()


def test_memoised_sdpa_on_the_manual_path_is_caught(grade_source):
    # The manual path runs SDPA once per input and weights, then returns the stored output: only a
    # recorded call on an input no earlier call saw shows the SDPA call.
    source = SOLUTION.replace("class CausalSelfAttention", "OUTPUTS = {}\n\n\nclass CausalSelfAttention").replace(
        "        if self.flash:",
        "        key = (x.detach().cpu().numpy().tobytes(), self.qkv.weight.detach().cpu().numpy().tobytes(), self.training)\n"
        "        if not self.flash and key in OUTPUTS:\n"
        "            return OUTPUTS[key].clone()\n"
        "        if True:").replace(
        "        return self.resid_dropout(self.proj(y))",
        "        OUTPUTS[key] = self.resid_dropout(self.proj(y))\n"
        "        return OUTPUTS[key]")
    result = grade_source("sdpa-swap", source)
    check = checks_by_id(result)["manual-path-avoids-sdpa"]
    assert "calls a fused attention" in check["message"] and check["score"] == 0
    assert checks_by_id(result)["paths-agree"]["status"] == "passed"


def test_mask_reported_by_lying_methods_is_not_a_buffer(grade_source):
    register = 'self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))'
    liar = SOLUTION.replace(register, "self.mask = torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)") + '''
    def named_buffers(self, *args, **kwargs):
        yield from super().named_buffers(*args, **kwargs)
        yield "mask", self.mask

    def state_dict(self, *args, **kwargs):
        return {**super().state_dict(*args, **kwargs), "mask": self.mask}
'''
    check = checks_by_id(grade_source("sdpa-swap", liar))["mask-is-buffer"]
    assert 'no buffer named "mask"' in check["message"] and check["diagnosis"] == "mask-not-buffer"


def test_sdpa_called_but_the_manual_scores_used_is_sdpa_not_used(grade_source):
    """The manual path dedented out of its else: SDPA is called once, as the recorded-call checks
    ask, and its output overwritten by the hand-written attention, whose (T, T) scores the fused
    kernel exists never to build."""
    source = SOLUTION.replace('''        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float('-inf'))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v
''', '''        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float('-inf'))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
''')
    source = source.replace("y = F.scaled_dot_product_attention(", "y_flash = F.scaled_dot_product_attention(")
    assert "y_flash" in source and "        else:\n            att" not in source
    result = grade_source("sdpa-swap", source)
    check = checks_by_id(result)["flash-calls-sdpa"]
    assert check["diagnosis"] == "sdpa-not-used", check["message"]
    assert "sdpa-not-used" in result["diagnoses"]
