"""The cross-attention grader on solutions written the way learners write them (not via the bug
oracles), one failure path per check, and its independent oracle: nn.MultiheadAttention with kdim
and vdim, both weight layouts, its masks converted."""
import numpy as np
import torch

from conftest import checks_by_id
from graders.cross_attention import (DEFAULTS, LONG_QUERIES, WIDTHS, inputs, padding, pattern, torch_mha, trusted,
                                     weights, widths)
from reference.cross_attention import MultiHeadAttention

# nanoGPT's flat style with the Annotated Transformer's separate projections: `kdim or d_model`,
# -inf fills, one masked_fill per mask.
SOLUTION = '''
import math
import torch
import torch.nn as nn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, kdim=None, vdim=None):
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.h, self.d_k = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(kdim or d_model, d_model)
        self.v_proj = nn.Linear(vdim or d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None):
        B, Tq, C = query.shape
        Tk = key.shape[1]
        q = self.q_proj(query).view(B, Tq, self.h, self.d_k).transpose(1, 2)
        k = self.k_proj(key).view(B, Tk, self.h, self.d_k).transpose(1, 2)
        v = self.v_proj(value).view(B, Tk, self.h, self.d_k).transpose(1, 2)
        att = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if key_padding_mask is not None:
            att = att.masked_fill(~key_padding_mask.view(B, 1, 1, Tk), float("-inf"))
        if attn_mask is not None:
            if attn_mask.dim() == 3:
                attn_mask = attn_mask.unsqueeze(1)
            att = att.masked_fill(attn_mask.logical_not(), float("-inf"))
        att = att.softmax(dim=-1)
        return self.out_proj((att @ v).transpose(1, 2).reshape(B, Tq, C)), att
'''

# Hugging Face BART's cross-attention: k_proj/v_proj on the encoder's states, one additive mask
# filled with finfo(dtype).min, the softmax in float32 and cast back.
HF_BART = '''
import torch
from torch import nn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, kdim=None, vdim=None):
        super().__init__()
        self.embed_dim, self.num_heads = d_model, n_heads
        self.head_dim = d_model // n_heads
        if self.head_dim * n_heads != d_model:
            raise ValueError(f"embed_dim must be divisible by num_heads (got {d_model} and {n_heads})")
        self.scaling = self.head_dim ** -0.5
        self.k_proj = nn.Linear(kdim if kdim is not None else d_model, d_model, bias=True)
        self.v_proj = nn.Linear(vdim if vdim is not None else d_model, d_model, bias=True)
        self.q_proj = nn.Linear(d_model, d_model, bias=True)
        self.out_proj = nn.Linear(d_model, d_model, bias=True)

    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None):
        bsz, tgt_len, _ = query.size()
        src_len = key.size(1)
        q_input_shape = (bsz, tgt_len, -1, self.head_dim)
        kv_input_shape = (bsz, src_len, -1, self.head_dim)
        query_states = self.q_proj(query).view(q_input_shape).transpose(1, 2)
        key_states = self.k_proj(key).view(kv_input_shape).transpose(1, 2)
        value_states = self.v_proj(value).view(kv_input_shape).transpose(1, 2)
        attention_mask = torch.zeros(bsz, 1, tgt_len, src_len, dtype=query.dtype, device=query.device)
        min_value = torch.finfo(query.dtype).min
        if key_padding_mask is not None:
            attention_mask = attention_mask.masked_fill(~key_padding_mask[:, None, None, :], min_value)
        if attn_mask is not None:
            allowed = attn_mask if attn_mask.dim() == 2 else attn_mask[:, None, :, :]
            attention_mask = attention_mask.masked_fill(~allowed, min_value)
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) * self.scaling
        attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).reshape(bsz, tgt_len, -1).contiguous()
        return self.out_proj(attn_output), attn_weights
'''


def failed(result):
    return {c["id"]: c["diagnosis"] for c in result["checks"] if c["status"] != "passed"}


def test_torch_oracle_agrees_with_the_reference_in_both_layouts_and_with_every_mask():
    rng = np.random.default_rng(0)
    for cfg in (DEFAULTS, WIDTHS, LONG_QUERIES):
        B, Tq, Tk, _, H, _, _ = cfg
        d, kdim, vdim = widths(cfg)
        sd, (q, k, v) = weights(rng, d, kdim, vdim), inputs(rng, B, Tq, Tk, d, kdim, vdim)
        for kpm, attn in ((None, None), (padding(rng, B, Tk), None), (None, pattern(rng, Tq=Tq, Tk=Tk)),
                          (padding(rng, B, Tk), pattern(rng, B, Tq=Tq, Tk=Tk))):
            got = trusted(MultiHeadAttention, sd, H, q, k, v, kpm, attn, defaults=cfg[5] is None)
            for mine, theirs in zip(got, torch_mha(sd, H, q, k, v, kpm, attn)):
                torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-14)


def test_different_correct_solutions_pass(grade_source):
    for source in (SOLUTION, HF_BART):
        result = grade_source("cross-attention", source, seed=5)
        assert result["score"] == result["max_score"], failed(result)


def test_a_float32_softmax_inside_passes_with_a_note(grade_source):
    result = grade_source("cross-attention", HF_BART)
    noted = {c["id"] for c in result["checks"] if "float32-inside" in c.get("notes", [])}
    assert {"matches-torch-mha", "self-attention-special-case"} <= noted


def test_an_empty_extra_parameter_fails_state_dict_keys_only(grade_source):
    # nn.MultiheadAttention's bias_k slot, filled: no parameter count changes, the names do.
    source = SOLUTION.replace("self.out_proj = nn.Linear(d_model, d_model)", "self.out_proj = nn.Linear(d_model, "
                              "d_model)\n        self.bias_k = nn.Parameter(torch.empty(0))")
    result = grade_source("cross-attention", source)
    assert failed(result) == {"state-dict-keys": None}
    assert "bias_k" in checks_by_id(result)["state-dict-keys"]["message"]


def test_ignored_kdim_fails_the_count_and_cannot_take_the_weights(grade_source):
    source = SOLUTION.replace("nn.Linear(kdim or d_model, d_model)", "nn.Linear(d_model, d_model)").replace(
        "nn.Linear(vdim or d_model, d_model)", "nn.Linear(d_model, d_model)")
    result = grade_source("cross-attention", source)
    assert failed(result) == {"state-dict-keys": "kdim-ignored", "parameter-count": "kdim-ignored",
                              "matches-torch-mha": "kdim-ignored"}
    assert "2·20² + 20·11 + 20·7 + 4·20 = 1,240" in checks_by_id(result)["parameter-count"]["message"]
    assert "k_proj.weight: (20, 20)" in checks_by_id(result)["matches-torch-mha"]["message"]


def test_an_attn_mask_read_as_nn_multiheadattention_reads_it_fails_only_the_values(grade_source):
    source = SOLUTION.replace("att.masked_fill(attn_mask.logical_not(), float(\"-inf\"))",
                              "att.masked_fill(attn_mask, float(\"-inf\"))")
    result = grade_source("cross-attention", source)
    assert failed(result) == {"matches-torch-mha": "attn-mask-inverted"}


def test_scale_by_d_model_is_named(grade_source):
    result = grade_source("cross-attention", SOLUTION.replace("math.sqrt(self.d_k)", "math.sqrt(C)"))
    assert failed(result) == {"matches-torch-mha": "scale-by-d-model", "self-attention-special-case": None}
    assert checks_by_id(result)["self-attention-special-case"]["same_cause_as"] == "matches-torch-mha"


def test_squeezed_weights_fail_only_on_a_single_query(grade_source):
    # Harmless until one decoding step: (B, H, 1, Tk) squeezed to (B, H, Tk).
    source = SOLUTION.replace("reshape(B, Tq, C)), att", "reshape(B, Tq, C)), att.squeeze()")
    result = grade_source("cross-attention", source)
    assert failed(result) == {"cross-shapes": None}
    assert "shape (3, 3, 7)" in checks_by_id(result)["cross-shapes"]["message"]


def test_keys_and_values_from_the_query_are_named(grade_source):
    source = SOLUTION.replace("self.k_proj(key).view(B, Tk", "self.k_proj(query).view(B, Tq").replace(
        "self.v_proj(value).view(B, Tk", "self.v_proj(query).view(B, Tq")
    result = grade_source("cross-attention", source)
    checks = checks_by_id(result)
    assert checks["matches-torch-mha"]["diagnosis"] == "kv-from-query"
    assert checks["cross-shapes"]["same_cause_as"] == "matches-torch-mha"   # the same (Tq, Tq) weights
    assert checks["cost-linear-in-tk"]["diagnosis"] == "kv-from-query"
    assert checks["self-attention-special-case"]["status"] == "passed"   # key = query: the bug cannot show


def test_a_penalty_instead_of_a_mask_fails_only_the_padding_check(grade_source):
    # -100 on the padded scores: e^-100 is far below every value tolerance, yet not 0.
    source = SOLUTION.replace("att = att.masked_fill(~key_padding_mask.view(B, 1, 1, Tk), float(\"-inf\"))",
                              "att = att - 100.0 * (~key_padding_mask).view(B, 1, 1, Tk)")
    result = grade_source("cross-attention", source)
    assert failed(result) == {"padding-keys-get-zero": None}
    assert "weights on padded keys are not 0" in checks_by_id(result)["padding-keys-get-zero"]["message"]


def test_padding_along_the_queries_is_named_even_filled_with_a_large_negative(grade_source):
    # The Annotated Transformer's -1e9: rows of padded queries come out uniform, not NaN, so no
    # oracle matches them; the zeros' pattern names the bug.
    source = SOLUTION.replace("att.masked_fill(~key_padding_mask.view(B, 1, 1, Tk), float(\"-inf\"))",
                              "att.masked_fill(key_padding_mask.view(B, 1, Tk, 1) == 0, -1e9)")
    result = grade_source("cross-attention", source)
    checks = checks_by_id(result)
    # matches-torch-mha fails unnamed (the mask does not broadcast where Tq != Tk): the padding
    # check, which builds on cross-shapes alone, names the bug.
    assert checks["matches-torch-mha"]["diagnosis"] is None
    assert checks["padding-keys-get-zero"]["diagnosis"] == "padding-on-queries"
    # matches-torch-mha names no mistake, so the later check keeps its own diagnosis
    assert checks["self-attention-special-case"]["diagnosis"] == "padding-on-queries"
    assert result["diagnoses"] == ["padding-on-queries"]


def test_an_inverted_padding_mask_is_named(grade_source):
    source = SOLUTION.replace("~key_padding_mask.view(B, 1, 1, Tk)", "key_padding_mask.view(B, 1, 1, Tk)")
    result = grade_source("cross-attention", source)
    assert failed(result) == {"matches-torch-mha": "padding-mask-inverted",
                              "padding-keys-get-zero": "padding-mask-inverted",
                              "self-attention-special-case": None}


def test_equal_lengths_taken_for_decoder_self_attention_fail_only_the_self_attention_check(grade_source):
    source = SOLUTION.replace("        att = att.softmax(dim=-1)", '''\
        if Tq == Tk:   # equal lengths: must be the decoder's self-attention
            att = att.masked_fill(torch.ones(Tq, Tk, dtype=torch.bool, device=att.device).triu(1), float("-inf"))
        att = att.softmax(dim=-1)''')
    result = grade_source("cross-attention", source)
    assert failed(result) == {"self-attention-special-case": "causal-in-cross"}


def test_a_causal_mask_in_cross_attention_is_named(grade_source):
    source = SOLUTION.replace("        att = att.softmax(dim=-1)", '''\
        causal = torch.tril(torch.ones(Tq, Tk, device=att.device))
        att = att.masked_fill(causal == 0, -1e9)
        att = att.softmax(dim=-1)''')
    result = grade_source("cross-attention", source)
    checks = checks_by_id(result)
    assert checks["matches-torch-mha"]["diagnosis"] == "causal-in-cross"
    assert checks["no-causal-by-default"]["same_cause_as"] == "matches-torch-mha"
    assert result["diagnoses"] == ["causal-in-cross"]


def test_weights_averaged_over_the_heads_are_named_once(grade_source):
    # nn.MultiheadAttention's default, average_attn_weights=True: right output, (B, Tq, Tk) weights.
    result = grade_source("cross-attention", SOLUTION.replace("reshape(B, Tq, C)), att", "reshape(B, Tq, C)), "
                                                              "att.mean(dim=1)"))
    checks = checks_by_id(result)
    assert failed(result) == {"matches-torch-mha": "heads-averaged", "cross-shapes": None,
                              "padding-keys-get-zero": None, "self-attention-special-case": None,
                              "no-causal-by-default": None}
    assert "shape (2, 5, 7)" in checks["matches-torch-mha"]["message"]
    assert {c: checks[c]["same_cause_as"] for c in failed(result) if c != "matches-torch-mha"} == {
        "cross-shapes": "matches-torch-mha", "padding-keys-get-zero": "cross-shapes",
        "self-attention-special-case": "matches-torch-mha", "no-causal-by-default": "matches-torch-mha"}
    assert result["diagnoses"] == ["heads-averaged"]


def test_weights_left_in_float32_fail_on_their_dtype_where_they_are_returned(grade_source):
    # fairseq's way: the softmax in float32, only the weights applied to V cast back; the
    # weights returned stay float32 for float64 input.
    source = HF_BART.replace(
        "attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)\n"
        "        attn_output = torch.matmul(attn_weights, value_states)",
        "attn_weights_float = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32)\n"
        "        attn_output = torch.matmul(attn_weights_float.to(query.dtype), value_states)")
    source = source.replace("return self.out_proj(attn_output), attn_weights",
                            "return self.out_proj(attn_output), attn_weights_float")
    result = grade_source("cross-attention", source)
    checks = checks_by_id(result)
    assert failed(result) == {"matches-torch-mha": None, "cross-shapes": None, "padding-keys-get-zero": None,
                              "self-attention-special-case": None, "no-causal-by-default": None}
    message = checks["matches-torch-mha"]["message"]
    assert message.startswith("The weights have the wrong dtype: forward returns the output and the weights in "
                              "the input's dtype, float64 here. A softmax computed in float32 inside is cast back")
    assert "got: float32" in message and "expected: float64" in message
    # no diagnosis to tie the later failures to this one: each says its own, and what it builds on
    assert not any(checks[c].get("same_cause_as") for c in failed(result))
    assert all("also failed: `" in checks[c]["message"] for c in failed(result) if c != "matches-torch-mha")


def test_one_self_attention_over_target_and_source_fails_only_the_cost_check(grade_source):
    # The prefix-LM way: scores of [target; source] against itself, then the target-to-source
    # block. The values are right; the cost grows with (Tq + Tk)².
    source = SOLUTION.replace("        att = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)", '''\
        both = torch.cat([q, k], dim=2)
        att = (both @ both.transpose(-2, -1))[:, :, :Tq, Tq:] / math.sqrt(self.d_k)''')
    result = grade_source("cross-attention", source)
    assert failed(result) == {"cost-linear-in-tk": None}
    assert "Something grows faster than the source" in checks_by_id(result)["cost-linear-in-tk"]["message"]


def test_missing_divisibility_check_and_wrong_exception(grade_source):
    result = grade_source("cross-attention", SOLUTION.replace(
        'assert d_model % n_heads == 0, "d_model must be divisible by n_heads"', ""))
    assert failed(result) == {"rejects-indivisible-heads": None}
    assert "yet a module was built" in checks_by_id(result)["rejects-indivisible-heads"]["message"]
    result = grade_source("cross-attention", SOLUTION.replace(
        'assert d_model % n_heads == 0, "d_model must be divisible by n_heads"',
        "if d_model % n_heads:\n            raise RuntimeError('bad heads')"))
    assert "got: RuntimeError: bad heads" in checks_by_id(result)["rejects-indivisible-heads"]["message"]


def test_sdpa_for_the_output_fails_only_the_banned_api_check(grade_source):
    # The weights by hand, the output from SDPA, under the mask of the weights that are not 0.
    source = SOLUTION.replace("import torch.nn as nn", "import torch.nn as nn\nimport torch.nn.functional as F")
    source = source.replace("return self.out_proj((att @ v)", "y = F.scaled_dot_product_attention(q, k, v, "
                            "attn_mask=att > 0)\n        return self.out_proj(y")
    result = grade_source("cross-attention", source)
    assert failed(result) == {"banned-api": "banned-api"}
