"""Broken and hostile learner files: each gets `failed` or `error` with a clear sentence, within
the time limit, and the learner's file is left unchanged (the grade_source fixture asserts it)."""
import time

import pytest

from conftest import checks_by_id

FAST = {"timeout_s": 1.5, "import_timeout_s": 1.5}
SOFTMAX_OK = """
import numpy as np

def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)
"""


def messages(result):
    return "\n".join(c["message"] for c in result["checks"])


def test_syntax_error_is_an_error_naming_the_line(grade_source):
    result = grade_source("softmax", "import numpy as np\n\ndef softmax(x, axis=-1)\n    return x\n")
    assert result["status"] == "error"
    assert result["score"] == 0
    assert all(c["status"] == "error" for c in result["checks"])
    assert "SyntaxError" in messages(result) and "line 3" in messages(result)


def test_missing_function_is_named(grade_source):
    result = grade_source("softmax", "def soft_max(x, axis=-1):\n    return x\n")
    assert result["status"] == "failed"
    assert "Your file has no 'softmax'" in checks_by_id(result)["matches-reference"]["message"]


def test_wrong_return_type(grade_source):
    result = grade_source("softmax", "def softmax(x, axis=-1):\n    return x.tolist()\n")
    assert result["status"] == "failed"
    message = checks_by_id(result)["matches-reference"]["message"]
    assert "wrong type" in message and "expected: numpy.ndarray" in message


def test_nan_output(grade_source):
    result = grade_source("softmax", "import numpy as np\ndef softmax(x, axis=-1):\n    return np.full_like(x, np.nan)\n")
    assert result["status"] == "failed"
    assert "NaN where finite values were expected" in checks_by_id(result)["matches-reference"]["message"]


def test_exception_shows_type_message_and_line(grade_source):
    result = grade_source("softmax", "def softmax(x, axis=-1):\n    y = 1\n    raise ValueError('boom')\n")
    message = checks_by_id(result)["matches-reference"]["message"]
    assert result["status"] == "failed"
    assert "raised ValueError: boom" in message and "line 3, in softmax: raise ValueError('boom')" in message


def test_os_exit_at_import(grade_source):
    result = grade_source("softmax", "import os\nos._exit(0)\n")
    assert result["status"] == "error"
    assert "exited with status 0" in messages(result)


def test_sys_exit_at_import(grade_source):
    result = grade_source("softmax", "import sys\nsys.exit(0)\n")
    assert result["status"] == "error"
    assert "called sys.exit(0)" in messages(result)


def test_os_exit_inside_a_call_fails_that_check_and_the_run_completes(grade_source):
    result = grade_source("softmax", SOFTMAX_OK + "\n_real = softmax\ndef softmax(x, axis=-1):\n"
                                                  "    import os\n    if x.ndim == 1:\n        os._exit(3)\n"
                                                  "    return _real(x, axis)\n")
    check = checks_by_id(result)["matches-reference"]
    assert check["status"] == "error" and "exited with status 3" in check["message"]
    assert checks_by_id(result)["stable-for-large-logits"]["status"] == "passed"   # a fresh sandbox went on (2-D inputs)


def test_endless_loop_at_import_times_out(grade_source):
    started = time.monotonic()
    result = grade_source("softmax", "while True:\n    pass\n", **FAST)
    assert result["status"] == "error"
    assert "did not finish within 1.5 s" in messages(result)
    assert time.monotonic() - started < 15


def test_endless_loop_in_a_call_times_out_and_stops_after_two(grade_source):
    started = time.monotonic()
    result = grade_source("softmax", "def softmax(x, axis=-1):\n    while True:\n        pass\n", **FAST)
    assert result["status"] == "failed" or result["status"] == "error"
    statuses = [c["status"] for c in result["checks"]]
    assert statuses.count("error") == len(statuses)
    assert "did not finish within 1.5 s" in messages(result)
    assert "earlier calls timed out" in messages(result)
    assert time.monotonic() - started < 20


def test_hundred_megabytes_of_prints(grade_source):
    started = time.monotonic()
    source = "for _ in range(1_000_000):\n    print('x' * 99)\n" + "def softmax(x, axis=-1):\n    raise NotImplementedError\n"
    result = grade_source("softmax", source)
    assert result["status"] == "not-started"
    assert time.monotonic() - started < 30


def test_prints_in_calls_are_capped_and_shown(grade_source):
    source = "import numpy as np\ndef softmax(x, axis=-1):\n    print('y' * 10_000_000)\n    return np.zeros_like(x)\n"
    result = grade_source("softmax", source)
    check = checks_by_id(result)["matches-reference"]
    assert check["status"] == "failed"
    assert len(check["output"]) < 20_000 and "more characters of output were dropped" in check["output"]


def test_patched_allclose_and_pytest_do_not_help(grade_source):
    source = ("import numpy as np, sys\nnp.allclose = lambda *a, **k: True\nnp.isclose = lambda a, b, **k: np.ones(np.shape(a), bool)\n"
              "np.testing.assert_allclose = lambda *a, **k: None\n"
              "def softmax(x, axis=-1):\n    return np.zeros_like(x)\n")
    result = grade_source("softmax", source)
    assert result["status"] == "failed"
    assert checks_by_id(result)["matches-reference"]["status"] == "failed"


def test_object_whose_eq_is_always_true(grade_source):
    source = ("class Liar:\n    def __eq__(self, other):\n        return True\n    __ne__ = lambda s, o: False\n"
              "    shape = property(lambda s: (3, 5))\n"
              "def softmax(x, axis=-1):\n    return Liar()\n")
    result = grade_source("softmax", source)
    assert result["status"] == "failed"
    assert result["score"] == 0
    assert "wrong type" in checks_by_id(result)["matches-reference"]["message"]


def test_ndarray_subclass_is_refused(grade_source):
    source = ("import numpy as np\nclass Sly(np.ndarray):\n    def __eq__(self, other):\n        return True\n"
              + SOFTMAX_OK.replace("return e / np.sum(e, axis=axis, keepdims=True)",
                                   "return (e / np.sum(e, axis=axis, keepdims=True)).view(Sly)"))
    result = grade_source("softmax", source)
    assert checks_by_id(result)["matches-reference"]["status"] == "failed"
    assert "wrong type" in checks_by_id(result)["matches-reference"]["message"]


@pytest.mark.serial   # a memory cap, judged with no other test's memory beside it
def test_memory_hog_is_stopped(grade_source):
    source = "import numpy as np\ndef softmax(x, axis=-1):\n    return np.ones(10**10)\n"
    result = grade_source("softmax", source, memory_mb=1024)
    check = checks_by_id(result)["matches-reference"]
    assert check["status"] in ("failed", "error")
    assert "MemoryError" in check["message"] or "memory" in check["message"]


def test_writing_files_and_conftest_changes_nothing(grade_source, tmp_path):
    source = ("import os\nopen('conftest.py', 'w').write('def pytest_runtest_makereport(): pass')\n"
              "open('results.json', 'w').write('{\"score\": 10}')\nopen(__file__, 'w').write('')\n"
              "def softmax(x, axis=-1):\n    raise NotImplementedError\n")
    result = grade_source("softmax", source)
    assert result["status"] == "not-started"
    assert not (tmp_path / "conftest.py").exists() and not (tmp_path / "results.json").exists()


def test_sandbox_does_not_see_the_graders_environment(grade_source, monkeypatch):
    monkeypatch.setenv("KATA_SECRET_FOR_TEST", "leak")
    source = ("import os, numpy as np\n" + SOFTMAX_OK.replace("def softmax(x, axis=-1):",
              "def softmax(x, axis=-1):\n    if 'KATA_SECRET_FOR_TEST' in os.environ: return np.zeros_like(x)"))
    result = grade_source("softmax", source)
    # Every check that computes passes (os, no module softmax lists, costs the structure check).
    assert {c["id"] for c in result["checks"] if c["status"] != "passed"} == {"banned-api"}


@pytest.mark.parametrize("source", ["", "x = 1\n", "def softmax(:\n"])
def test_every_result_is_complete(grade_source, source):
    result = grade_source("softmax", source)
    assert [c["id"] for c in result["checks"]] == list(__import__("graders.engine.manifest", fromlist=["find"]).find("softmax").checks)
    assert result["status"] in ("failed", "error")
