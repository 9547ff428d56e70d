"""What is specific to the positional-encoding kata: the facts its README teaches, correct solutions
written in other idioms than the reference, and each check's failure path on files written the way
learners write them (not via the bug oracles)."""
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import checks_by_id
from graders.engine.manifest import find
from graders.positional_encoding import attend
from reference.positional_encoding import alibi_bias, alibi_slopes, shift_matrix, sinusoidal

KATA = find("positional-encoding")
REFERENCE = KATA.reference_path.read_text()

# Complex numbers, as RoPE code writes rotations: pair i of position p is e^{i·p·ω_i}, and a shift
# by k multiplies it by e^{i·k·ω_i}; the ALiBi bias from tril and a cumulative sum.
POLAR = '''
import math
import torch


def frequencies(d):
    if d % 2:
        raise ValueError(f"d={d} is odd")
    return torch.pow(10000.0, -torch.arange(0, d, 2, dtype=torch.float64) / d)


def sinusoidal(T, d):
    angle = torch.outer(torch.arange(T, dtype=torch.float64), frequencies(d))
    z = torch.polar(torch.ones_like(angle), angle)
    return torch.view_as_real(z).flip(-1).reshape(T, d).float()   # (cos, sin) -> (sin, cos)


def shift_matrix(k, d):
    z = torch.polar(torch.ones(d // 2, dtype=torch.float64), k * frequencies(d))
    c, s = z.real, z.imag
    m = torch.zeros(d, d, dtype=torch.float64)
    m[range(0, d, 2), range(0, d, 2)] = c
    m[range(0, d, 2), range(1, d, 2)] = s
    m[range(1, d, 2), range(0, d, 2)] = -s
    m[range(1, d, 2), range(1, d, 2)] = c
    return m.float()


def alibi_slopes(n_heads):
    n = 1 << (n_heads.bit_length() - 1)
    slopes = [2 ** (-8 * i / n) for i in range(1, n + 1)]
    slopes += [2 ** (-8 * i / (2 * n)) for i in range(1, 2 * n + 1, 2)][: n_heads - n]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(n_heads, T):
    steps = torch.ones(T, T).tril(-1).cumsum(0)   # steps[i, j] = i - j below the diagonal
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    bias = -alibi_slopes(n_heads)[:, None, None] * steps
    return torch.where(allowed, bias, torch.tensor(-math.inf))
'''

# Plain Python lists and math, one number at a time, turned into tensors at the end.
LISTS = '''
import math
import torch


def sinusoidal(T, d):
    assert d % 2 == 0, "d must be even"
    rows = []
    for p in range(T):
        row = []
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            row += [math.sin(angle), math.cos(angle)]
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float32).reshape(T, d)


def shift_matrix(k, d):
    assert d % 2 == 0, "d must be even"
    m = [[0.0] * d for _ in range(d)]
    for i in range(d // 2):
        a = k / 10000 ** (2 * i / d)
        m[2 * i][2 * i], m[2 * i][2 * i + 1] = math.cos(a), math.sin(a)
        m[2 * i + 1][2 * i], m[2 * i + 1][2 * i + 1] = -math.sin(a), math.cos(a)
    return torch.tensor(m, dtype=torch.float32)


def alibi_slopes(n_heads):
    n = 2 ** math.floor(math.log2(n_heads))
    slopes = [2 ** (-8 * (i + 1) / n) for i in range(n)]
    extra = [2 ** (-8 * (i + 1) / (2 * n)) for i in range(2 * n)][0::2]
    return torch.tensor(slopes + extra[: n_heads - n])


def alibi_bias(n_heads, T):
    slopes = alibi_slopes(n_heads).tolist()
    return torch.tensor([[[-s * (i - j) if j <= i else -math.inf for j in range(T)] for i in range(T)] for s in slopes])
'''


def failed(result):
    return {c["id"] for c in result["checks"] if c["status"] != "passed"}


# --- the facts the README teaches --------------------------------------------------------------

def test_the_shift_is_one_matrix_for_every_position_and_both_directions():
    pe = sinusoidal(300, 24).double()
    for k in (1, 7, -7, 150, -299):
        p = torch.arange(max(0, -k), min(300, 300 - k))
        torch.testing.assert_close(pe[p] @ shift_matrix(k, 24).double().T, pe[p + k], rtol=0, atol=2e-6)
    back_and_forth = shift_matrix(5, 8).double() @ shift_matrix(-5, 8).double()
    torch.testing.assert_close(back_and_forth, torch.eye(8, dtype=torch.float64), rtol=0, atol=1e-6)


def test_dot_products_are_a_sum_of_cosines_of_the_offset():
    d, pe = 32, sinusoidal(120, 32).double()
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    for k in (0, 1, 5, 40):
        dots = (pe[: 120 - k] * pe[k:]).sum(-1)
        torch.testing.assert_close(dots, torch.cos(k * omega).sum().expand_as(dots), rtol=0, atol=1e-4)


def test_slopes_are_the_papers_get_slopes():
    def get_slopes(n):   # verbatim from the ALiBi repository
        def get_slopes_power_of_2(n):
            start = (2**(-2**-(math.log2(n) - 3)))
            return [start * start**i for i in range(n)]
        if math.log2(n).is_integer():
            return get_slopes_power_of_2(n)
        closest = 2**math.floor(math.log2(n))
        return get_slopes_power_of_2(closest) + get_slopes(2 * closest)[0::2][:n - closest]

    for n in range(1, 130):
        torch.testing.assert_close(alibi_slopes(n), torch.tensor(get_slopes(n), dtype=torch.float32), rtol=2e-7, atol=0)
    assert alibi_slopes(12)[8:].tolist() == pytest.approx([2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5], rel=1e-7)


def test_the_attention_oracle_adds_the_bias_to_the_scaled_scores():
    q, k, v = (torch.randn(2, 6, 7, 4, dtype=torch.float64) for _ in range(3))
    bias = alibi_bias(6, 7)
    manual = torch.softmax(q @ k.transpose(-2, -1) / 2 + bias.double(), dim=-1) @ v
    torch.testing.assert_close(attend(q, k, v, bias), manual)
    # A constant per query row changes nothing: BLOOM's slope·j gives ALiBi's attention.
    future = torch.zeros(7, 7).masked_fill(bias[0].isinf(), -math.inf)
    bloom = alibi_slopes(6)[:, None, None] * torch.arange(7.0) + future
    torch.testing.assert_close(attend(q, k, v, bloom), manual)
    assert not torch.allclose(F.scaled_dot_product_attention(q, k, v, is_causal=True), manual)


# --- correct solutions in other idioms ---------------------------------------------------------

@pytest.mark.parametrize("source", [POLAR, LISTS], ids=["polar", "lists"])
def test_a_different_correct_solution_gets_full_marks(grade_source, source):
    for seed in (1, 2):
        result = grade_source("positional-encoding", source, seed=seed)
        lost = [c["message"] for c in result["checks"] if c["status"] != "passed"]
        assert result["score"] == result["max_score"] == 15, lost


# --- each check's failure path -----------------------------------------------------------------

def test_positions_counted_from_one_fail_only_the_table_values(grade_source):
    # A shift from p to p + k does not care where counting starts: the properties hold, the values do not.
    result = grade_source("positional-encoding", REFERENCE.replace(
        "angle = torch.arange(T, dtype=torch.float64)", "angle = torch.arange(1, T + 1, dtype=torch.float64)"))
    assert failed(result) == {"sinusoidal-values"}
    check = checks_by_id(result)["sinusoidal-values"]
    assert "call: sinusoidal(64, 16)" in check["message"] and "row [0, :8] = [0.8415" in check["message"]
    assert check["diagnosis"] == "position-off-by-one" and result["diagnoses"] == ["position-off-by-one"]


def test_fairseqs_padding_offset_is_position_offset(grade_source):
    # make_positions numbers tokens from padding_idx + 1: with padding_idx = 1, row p is position p + 2.
    result = grade_source("positional-encoding", REFERENCE.replace(
        "angle = torch.arange(T, dtype=torch.float64)", "angle = (torch.arange(T, dtype=torch.float64) + 1 + 1)"))
    assert failed(result) == {"sinusoidal-values"}
    assert result["diagnoses"] == ["position-offset"]
    # An offset the kata does not name (a padding_idx of 3) is no diagnosis: no oracle is that table.
    result = grade_source("positional-encoding", REFERENCE.replace(
        "angle = torch.arange(T, dtype=torch.float64)", "angle = (torch.arange(T, dtype=torch.float64) + 3 + 1)"))
    assert failed(result) == {"sinusoidal-values"} and result["diagnoses"] == []


def test_fairseqs_whole_table_is_interleave_vs_concat(grade_source):
    # get_embedding as published: halves, and log(10000) / (half_dim - 1).
    source = POLAR.replace(
        "    angle = torch.outer(torch.arange(T, dtype=torch.float64), frequencies(d))\n"
        "    z = torch.polar(torch.ones_like(angle), angle)\n"
        "    return torch.view_as_real(z).flip(-1).reshape(T, d).float()   # (cos, sin) -> (sin, cos)\n",
        "    half = frequencies(d).numel()   # refuses an odd d\n"
        "    omega = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000) / (half - 1)))\n"
        "    angle = torch.arange(T, dtype=torch.float)[:, None] * omega[None, :]\n"
        "    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)\n")
    assert source != POLAR
    result = grade_source("positional-encoding", source)
    assert failed(result) == {"sinusoidal-values", "shift-identity"}
    assert checks_by_id(result)["sinusoidal-values"]["diagnosis"] == "interleave-vs-concat"
    assert result["diagnoses"] == ["interleave-vs-concat"]


def test_a_missing_odd_check_fails_only_rejects_odd_d(grade_source):
    # The Annotated Transformer without a check: d = 7 fails inside, on a shape mismatch.
    source = POLAR.replace('        raise ValueError(f"d={d} is odd")\n', "        pass\n")
    result = grade_source("positional-encoding", source)
    assert failed(result) == {"rejects-odd-d"}
    assert "failed somewhere inside instead of being refused" in checks_by_id(result)["rejects-odd-d"]["message"]
    # An einsum table for d = 7 has 4 pairs, 8 columns: no error at all.
    einsum = source + (
        "def sinusoidal(T, d):\n"
        "    inv_freq = 1 / 10000 ** (torch.arange(0, d, 2) / d)\n"
        "    freqs = torch.einsum('p,i->pi', torch.arange(T, dtype=torch.float32), inv_freq)\n"
        "    return torch.stack((freqs.sin(), freqs.cos()), -1).flatten(1)\n")
    message = checks_by_id(grade_source("positional-encoding", einsum))["rejects-odd-d"]["message"]
    assert "yet a result came back" in message and "float32[4, 8]" in message


def test_a_float64_shift_matrix_fails_only_its_values(grade_source):
    result = grade_source("positional-encoding", POLAR.replace("    return m.float()\n", "    return m\n"))
    assert failed(result) == {"shift-matrix-values"}
    assert "M_k has the wrong dtype" in checks_by_id(result)["shift-matrix-values"]["message"]


def test_the_textbook_rotation_is_shift_matrix_transposed(grade_source):
    source = POLAR.replace("m[range(0, d, 2), range(1, d, 2)] = s", "m[range(0, d, 2), range(1, d, 2)] = -s").replace(
        "m[range(1, d, 2), range(0, d, 2)] = -s", "m[range(1, d, 2), range(0, d, 2)] = s")
    result = grade_source("positional-encoding", source)
    assert failed(result) == {"shift-matrix-values", "shift-identity"}
    assert {checks_by_id(result)[c]["diagnosis"] for c in failed(result)} == {"shift-matrix-transposed"}


def test_the_papers_list_of_slopes_fails_only_alibi_slopes(grade_source):
    # The repository's get_slopes returns a Python list; the bias built from it is right.
    result = grade_source("positional-encoding", LISTS.replace(
        "    return torch.tensor(slopes + extra[: n_heads - n])\n", "    return slopes + extra[: n_heads - n]\n").replace(
        "slopes = alibi_slopes(n_heads).tolist()", "slopes = alibi_slopes(n_heads)"))
    assert failed(result) == {"alibi-slopes"}
    assert "got: [0.5, 0.25, 0.125, 0.0625, …]" in checks_by_id(result)["alibi-slopes"]["message"]


def test_power_of_two_slopes_are_named_where_the_head_count_is_not_one(grade_source):
    source = LISTS.replace("n = 2 ** math.floor(math.log2(n_heads))", "n = n_heads")
    result = grade_source("positional-encoding", source)
    assert failed(result) == {"alibi-slopes", "alibi-bias-values", "attention-with-alibi-bias"}
    assert result["diagnoses"] == ["alibi-slope-power-of-two-only"]
    assert "call: alibi_slopes(12)" in checks_by_id(result)["alibi-slopes"]["message"]


def test_blooms_key_position_bias_fails_only_its_values(grade_source):
    source = POLAR.replace("bias = -alibi_slopes(n_heads)[:, None, None] * steps",
                           "bias = alibi_slopes(n_heads)[:, None, None] * torch.arange(T)")
    result = grade_source("positional-encoding", source)
    assert failed(result) == {"alibi-bias-values"}
    assert checks_by_id(result)["alibi-bias-values"]["diagnosis"] == "alibi-absolute-positions"


def test_a_bias_buffer_too_short_fails_only_the_attention(grade_source):
    # nanoGPT's habit: a table built once for a maximum length, sliced; the attention needs T = 16.
    source = REFERENCE.replace(
        "    pos = torch.arange(T)   # (T,)\n", "    pos = torch.arange(min(T, 10))   # a buffer of 10 positions\n")
    result = grade_source("positional-encoding", source)
    assert failed(result) == {"attention-with-alibi-bias"}
    message = checks_by_id(result)["attention-with-alibi-bias"]["message"]
    assert "call: alibi_bias(8, 16)" in message and "shape (8, 10, 10)" in message


def test_a_rewarding_bias_is_alibi_sign_in_values_and_attention(grade_source):
    result = grade_source("positional-encoding", POLAR.replace("bias = -alibi_slopes", "bias = alibi_slopes"))
    assert failed(result) == {"alibi-bias-values", "attention-with-alibi-bias"}
    assert checks_by_id(result)["attention-with-alibi-bias"]["diagnosis"] == "alibi-sign"
    assert result["diagnoses"] == ["alibi-sign"]


def test_a_bias_without_its_mask_is_not_causal(grade_source):
    unmasked = "return -alibi_slopes(n_heads)[:, None, None] * (steps - steps.T)"
    result = grade_source("positional-encoding", POLAR.replace(
        "return torch.where(allowed, bias, torch.tensor(-math.inf))", unmasked))
    assert failed(result) == {"alibi-bias-values", "attention-with-alibi-bias"}
    assert result["diagnoses"] == ["alibi-not-causal"]


def test_sin_and_cos_swapped_break_the_shift_identity(grade_source):
    result = grade_source("positional-encoding", POLAR.replace(".flip(-1)", ""))
    assert failed(result) == {"sinusoidal-values", "shift-identity"}
    check = checks_by_id(result)["shift-identity"]
    assert check["diagnosis"] == "sin-cos-swapped" and "does not shift your table" in check["message"]


def test_a_shift_matching_its_own_wrong_table_keeps_the_identity(grade_source):
    # i/d instead of 2i/d in a shared frequency helper: the values are wrong, the shift still shifts.
    result = grade_source("positional-encoding", POLAR.replace("torch.arange(0, d, 2, dtype=torch.float64) / d",
                                                               "torch.arange(0, d // 2, dtype=torch.float64) / d"))
    assert failed(result) == {"sinusoidal-values", "shift-matrix-values"}
    assert result["diagnoses"] == ["frequency-exponent"]


def test_cos_columns_with_the_next_frequency_break_the_dot_products(grade_source):
    source = LISTS.replace("            row += [math.sin(angle), math.cos(angle)]\n",
                           "            row += [math.sin(angle), math.cos(p / 10000 ** ((2 * i + 1) / d))]\n")
    result = grade_source("positional-encoding", source)
    assert failed(result) == {"sinusoidal-values", "shift-identity", "dot-product-depends-on-offset"}
    check = checks_by_id(result)["dot-product-depends-on-offset"]
    assert check["diagnosis"] == "frequency-exponent" and "changes with p" in check["message"]


def test_a_table_that_ignores_the_position_earns_no_property(grade_source):
    # Every row the same: the identity and the offset-only dot product would hold for nothing.
    source = LISTS.replace("angle = p / 10000 ** (2 * i / d)", "angle = 1 / 10000 ** (2 * i / d)")
    checks = checks_by_id(grade_source("positional-encoding", source))
    assert "same vectors" in checks["shift-identity"]["message"]
    assert "same for every offset" in checks["dot-product-depends-on-offset"]["message"]


def test_hugging_faces_finfo_min_fill_is_the_causal_bias(grade_source):
    # Every public ALiBi on Hugging Face's masks fills torch.finfo(dtype).min, not -inf: both give
    # the hidden keys weight exactly 0.
    finfo = POLAR.replace("torch.tensor(-math.inf)", "torch.tensor(torch.finfo(torch.float32).min)")
    assert finfo != POLAR
    result = grade_source("positional-encoding", finfo)
    assert result["score"] == result["max_score"] == 15
    # ... and a mistake beside it is still named.
    result = grade_source("positional-encoding", finfo.replace("bias = -alibi_slopes", "bias = alibi_slopes"))
    assert failed(result) == {"alibi-bias-values", "attention-with-alibi-bias"}
    assert checks_by_id(result)["alibi-bias-values"]["diagnosis"] == "alibi-sign"
    # Another finite fill is a number, not a hidden key: refused, and shown as the learner wrote it.
    finite = POLAR.replace("torch.tensor(-math.inf)", "torch.tensor(-1e4)")
    message = checks_by_id(grade_source("positional-encoding", finite))["alibi-bias-values"]["message"]
    assert "-10000" in message
