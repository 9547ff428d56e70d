"""Where a failed value check says the values differ (graders/engine/expect.py): the rows shown are
a window around the first wrong value, integers print as integers, a `where` line names the indices
of each axis that differ (by the axes' names where the grader gives them), and a small integer or
bool matrix is drawn as a grid. Judged by calling expect directly (no sandbox is needed to compare
two values), and once through `kata check`, as a learner reads it."""
import re

import numpy as np
import pytest
import torch

from graders.engine import expect
from graders.engine.failures import CheckFailed


def failure(got, expected, rtol=1e-7, atol=1e-12, **given) -> CheckFailed:
    with pytest.raises(CheckFailed) as info:
        expect.array(got, expected, call="f(x)", rtol=rtol, atol=atol, **given)
    return info.value


def shown(field: str) -> str:
    """The values an excerpt shows: what follows its `row [...] = `."""
    return field.split(" = ", 1)[1]


def test_the_rows_shown_are_a_window_around_the_first_wrong_value():
    # rope-scaling's display bug: a float64[64] wrong from index 21 on showed the first 8 values, alike.
    expected = 0.8 ** np.arange(64.0)
    got = expected.copy()
    got[21:] *= 1.5
    wrong = failure(got, expected)
    assert "; row [18:26] = [… " in wrong.got and "; row [18:26] = [… " in wrong.expected, wrong.text()
    assert wrong.got.endswith(" …]") and wrong.expected.endswith(" …]")
    assert shown(wrong.got).split()[:4] == shown(wrong.expected).split()[:4]   # 18, 19, 20 agree
    assert shown(wrong.got).split()[4] != shown(wrong.expected).split()[4]     # 21 differs
    # A window at the end of a long row is cut on the left only; a short row is shown whole.
    got = expected.copy()
    got[62] = 0.0
    assert "; row [56:] = [… " in failure(got, expected).got
    got, expected = np.zeros((2, 3, 4)), np.zeros((2, 3, 4))
    got[1, 2, 3] = 5.0
    assert failure(got, expected).got.endswith("; row [1, 2, :] = [0. 0. 0. 5.]")


def test_integers_print_as_integers():
    # doc-masking's nit: document ids printed as [0. 0. 0. 0. 1. 1. 1. 1.]
    expected = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    got = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1])
    wrong = failure(got, expected)
    assert wrong.got == "tensor int64[8] on cpu; row [:] = [0 0 0 1 1 1 1 1]", wrong.text()
    assert wrong.expected == "tensor int64[8] on cpu; row [:] = [0 0 0 0 1 1 1 1]"
    assert "at [3] (got 1, expected 0)" in wrong.message
    # A large integer keeps every digit, where float formatting would round it.
    wrong = failure(np.array([123456789], dtype=np.int32), np.array([123456788], dtype=np.int32), rtol=0, atol=0)
    assert "(got 123456789, expected 123456788)" in wrong.message, wrong.message
    wrong = failure(np.array([True, False, True]), np.array([True, True, True]))
    assert wrong.got.endswith("row [:] = [1 0 1]") and "(got 0, expected 1)" in wrong.message, wrong.text()


def test_the_where_line_names_the_indices_of_each_axis_that_differ():
    # paged-kv's GQA mistake: heads 1 and 2 wrong, heads 0 and 3 right; here in positions 5-7 only, too.
    expected = torch.randn(2, 4, 8, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    got = expected.clone()
    got[:, 1:3, 5:] += 1.0
    wrong = failure(got, expected)
    assert wrong.where == ("indices 1 and 2 of axis 1 (of 4) differ, 0 and 3 match; "
                           "indices 5–7 of axis 2 (of 8) differ, 0–4 match"), wrong.text()
    assert "\nwhere: indices 1 and 2 of axis 1" in wrong.text()
    named = failure(got, expected, axes=("batch", "head", "position", "channel"))
    assert named.where == "heads 1 and 2 (of 4) differ, 0 and 3 match; positions 5–7 (of 8) differ, 0–4 match"
    # One index is said in the singular; every index of an axis differing says nothing of it.
    got = expected.clone()
    got[1, :, 3] -= 1.0
    assert failure(got, expected, axes=("batch", "head", "position", "channel")).where == \
        "batch 1 (of 2) differs, 0 matches; position 3 (of 8) differs, 0–2 and 4–7 match"
    assert failure(expected + 1.0, expected).where is None


def test_a_small_integer_matrix_is_drawn_as_a_grid():
    # A block table: which physical block holds each sequence's logical block.
    expected = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    got = expected.clone()
    got[1, 2] = 7
    wrong = failure(got, expected)
    assert wrong.got.splitlines() == ["tensor int32[3, 4] on cpu:", "     0  1  2  3", "     4  5  7  7",
                                      "     8  9 10 11"], wrong.text()
    assert wrong.expected.splitlines()[2] == "     4  5  6  7"
    mask = np.tril(np.ones((5, 5), dtype=bool))
    assert failure(mask.T.copy(), mask).expected.splitlines()[1:] == [
        "    1 0 0 0 0", "    1 1 0 0 0", "    1 1 1 0 0", "    1 1 1 1 0", "    1 1 1 1 1"]
    # A large matrix, or a float one, is a row again.
    big = np.zeros((17, 4), dtype=np.int64)
    assert "; row [0, :] = [1 0 0 0]" in failure(big + np.eye(17, 4, dtype=np.int64), big).got
    assert "; row [1, :] = " in failure(np.eye(3), np.eye(3)[[0, 2, 1]]).got


SHIFTED_TAIL = """\
import numpy as np


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    out = e / e.sum(axis=axis, keepdims=True)
    tail = [slice(None)] * x.ndim
    tail[axis] = slice(5, None)
    out[tuple(tail)] *= 2   # a slip that only reaches index 5 on along the axis
    return out
"""


def test_kata_check_shows_the_window_and_the_where_line(kata_cmd):
    (kata_cmd.workspace / "softmax.py").write_text(SHIFTED_TAIL)
    run = kata_cmd("check", "softmax", "--seed", "3")
    assert run.returncode == 1
    assert "      where     indices 5–8 of axis 0 (of 9) differ, 0–4 match\n" in run.stdout, run.stdout
    got = re.search(r"\n      got       ndarray float64\[9\]; row \[1:\] = \[… (.*)\]\n", run.stdout)
    expected = re.search(r"\n      expected  ndarray float64\[9\]; row \[1:\] = \[… (.*)\]\n", run.stdout)
    assert got and expected, run.stdout
    assert got[1].split()[:4] == expected[1].split()[:4] and got[1].split()[4:] != expected[1].split()[4:]
