"""What is specific to the split-heads kata: the facts its README teaches, and every check of its
grader failing on a realistic wrong file, with the message or diagnosis a learner should read."""
import pytest
import torch

from conftest import checks_by_id
from graders.engine.manifest import find
from reference.split_heads import merge_heads, split_heads

REFERENCE = find("split-heads").reference_path.read_text()


def failed(result):
    return [c["id"] for c in result["checks"] if c["status"] != "passed"]


def test_split_is_a_free_view_and_merge_of_att_v_must_copy():
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    heads = split_heads(x, 3)   # (B, H, T, hd)
    assert heads.data_ptr() == x.data_ptr() and not heads.is_contiguous()
    y = heads.contiguous()   # what att @ v returns: a fresh contiguous (B, H, T, hd) tensor
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        y.transpose(1, 2).view(2, 5, 12)
    assert torch.equal(merge_heads(y), x)


def test_view_without_transpose_has_the_right_shape_and_wrong_values():
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    wrong = x.view(2, 3, 5, 4)
    assert wrong.shape == split_heads(x, 3).shape
    assert not torch.equal(wrong, split_heads(x, 3))


def test_reference_names_c_and_h_when_they_do_not_divide():
    with pytest.raises(ValueError, match=r"C = 10 .* n_heads = 4"):
        split_heads(torch.zeros(2, 5, 10), 4)


def test_heads_forgotten_before_time_fail_shapes_and_say_which_shape(grade_source):
    source = REFERENCE + (
        "def split_heads(x, n_heads):\n"
        "    B, T, C = x.shape\n"
        "    return x.view(B, T, n_heads, C // n_heads)\n")
    result = grade_source("split-heads", source)
    message = checks_by_id(result)["shapes"]["message"]
    assert "wrong shape" in message and "got: shape (2, 5, 3, 4)" in message and "(B, H, T, hd)" in message
    assert failed(result) == ["shapes", "split-values", "roundtrip", "rejects-indivisible-heads"]


def test_a_split_that_computes_instead_of_moving_values_fails_shapes(grade_source):
    source = REFERENCE + (
        "def split_heads(x, n_heads):\n"
        "    B, T, C = x.shape\n"
        "    if C % n_heads:\n"
        "        raise ValueError(f'C = {C}, n_heads = {n_heads}')\n"
        "    return torch.zeros(B, n_heads, T, C // n_heads, dtype=x.dtype)\n")
    result = grade_source("split-heads", source)
    assert "does not hold the input's values" in checks_by_id(result)["shapes"]["message"]
    assert result["diagnoses"] == []


def test_a_merge_that_changes_the_dtype_fails_shapes_and_the_values(grade_source):
    source = REFERENCE + (
        "def merge_heads(x):\n"
        "    B, H, T, hd = x.shape\n"
        "    return x.transpose(1, 2).reshape(B, T, H * hd).float()\n")
    result = grade_source("split-heads", source)
    message = checks_by_id(result)["shapes"]["message"]
    assert "wrong dtype" in message and "got: torch.float32" in message
    assert failed(result) == ["shapes", "merge-contiguous", "merge-non-contiguous", "roundtrip"]


def test_channels_split_hd_major_fail_the_values_without_a_diagnosis(grade_source):
    source = REFERENCE + (
        "def split_heads(x, n_heads):\n"
        "    B, T, C = x.shape\n"
        "    if C % n_heads:\n"
        "        raise ValueError(f'C = {C} is not divisible by n_heads = {n_heads}')\n"
        "    return x.view(B, T, C // n_heads, n_heads).permute(0, 3, 1, 2)\n")
    result = grade_source("split-heads", source)
    check = checks_by_id(result)["split-values"]
    assert "differ from x[b, t, h*hd:(h+1)*hd]" in check["message"] and check["diagnosis"] is None
    assert checks_by_id(result)["shapes"]["status"] == "passed"


def test_transpose_then_view_is_diagnosed_on_the_output_of_att_v(grade_source):
    source = REFERENCE + (
        "def merge_heads(x):\n"
        "    B, H, T, hd = x.shape\n"
        "    return x.transpose(1, 2).view(B, T, H * hd)\n")
    result = grade_source("split-heads", source)
    check = checks_by_id(result)["merge-contiguous"]
    assert check["diagnosis"] == "merge-needs-contiguous"
    assert "view size is not compatible" in check["message"] and "as att @ v returns it" in check["message"]
    assert f"line {REFERENCE.count(chr(10)) + 3}, in merge_heads" in check["message"]   # the return line
    assert result["diagnoses"] == ["merge-needs-contiguous"]


def test_a_merge_that_views_only_non_contiguous_inputs_fails_on_other_strides(grade_source):
    # Written for the two layouts its author had seen: att @ v, and (B, T, H, hd) memory.
    source = REFERENCE + (
        "def merge_heads(x):\n"
        "    B, H, T, hd = x.shape\n"
        "    if x.is_contiguous():\n"
        "        return x.transpose(1, 2).contiguous().view(B, T, H * hd)\n"
        "    return x.transpose(1, 2).view(B, T, H * hd)\n")
    result = grade_source("split-heads", source)
    assert failed(result) == ["merge-non-contiguous"]
    check = checks_by_id(result)["merge-non-contiguous"]
    assert check["diagnosis"] == "merge-needs-contiguous" and "stack" in check["message"]


def test_viewing_y_without_the_transpose_is_merge_without_transpose_on_any_strides(grade_source):
    source = REFERENCE + (
        "def merge_heads(x):\n"
        "    B, H, T, hd = x.shape\n"
        "    return x.view(B, T, H * hd)\n")
    result = grade_source("split-heads", source)
    assert checks_by_id(result)["merge-contiguous"]["diagnosis"] == "merge-without-transpose"
    non_contiguous = checks_by_id(result)["merge-non-contiguous"]
    assert "view size is not compatible" in non_contiguous["message"]
    assert non_contiguous["diagnosis"] == "merge-without-transpose"
    assert result["diagnoses"] == ["merge-without-transpose"]


def test_two_inverse_wrong_reshapes_pass_the_identity_but_not_the_per_head_scaling(grade_source):
    source = REFERENCE + (
        "def split_heads(x, n_heads):\n"
        "    B, T, C = x.shape\n"
        "    if C % n_heads:\n"
        "        raise ValueError(f'C = {C} is not divisible by n_heads = {n_heads}')\n"
        "    return x.reshape(B, n_heads, T, C // n_heads)\n"
        "def merge_heads(x):\n"
        "    B, H, T, hd = x.shape\n"
        "    return x.reshape(B, T, H * hd)\n")
    result = grade_source("split-heads", source)
    message = checks_by_id(result)["roundtrip"]["message"]
    assert "merge_heads(heads * (h + 1))" in message and "times h + 1" in message
    assert {"split-values", "merge-contiguous", "roundtrip"} <= set(failed(result))


@pytest.mark.parametrize("check, text, expected", [
    ("    if C % n_heads:\n        raise ValueError(f'bad width {C}')\n",
     "ValueError: bad width 10", "does not give both C and n_heads"),
    ("    assert C % n_heads == 0\n", "AssertionError with no message", "does not give both C and n_heads"),
    ("    x = x[..., :C - C % n_heads]\n", "tensor float64[2, 4, 5, 2]", "yet split_heads returned a value"),
])
def test_an_indivisible_width_must_raise_naming_both_numbers(grade_source, check, text, expected):
    source = REFERENCE + (
        "def split_heads(x, n_heads):\n"
        "    B, T, C = x.shape\n"
        + check +
        "    return x.reshape(B, T, n_heads, -1).transpose(1, 2)\n")
    result = grade_source("split-heads", source)
    assert failed(result) == ["rejects-indivisible-heads"]
    check = checks_by_id(result)["rejects-indivisible-heads"]
    assert expected in check["message"] and f"got: {text}" in check["message"]
    diagnosis = "missing-divisibility-check" if "returned" in expected else None
    assert check["diagnosis"] == diagnosis


def test_an_assert_naming_both_numbers_is_accepted(grade_source):
    source = REFERENCE + (
        "def split_heads(x, n_heads):\n"
        "    B, T, C = x.shape\n"
        "    assert C % n_heads == 0, f'd_model {C} must be a multiple of the head count {n_heads}'\n"
        "    return x.view(B, T, n_heads, C // n_heads).transpose(1, 2)\n")
    result = grade_source("split-heads", source)
    assert result["status"] == "passed"
