"""Public and hidden checks: hidden checks live in the kata's hidden grader, draw their values from
a seed of their own (fresh per grading unless replayed), and say so in every result. (How the
checks split between the two files is a content rule: test_content.py.)"""
import json
import re
from pathlib import Path

import pytest

from graders.classroom.release import hidden_checks
from graders.engine.manifest import find
from graders.engine.runner import grade, grade_seeds

SCHEMA = json.loads((Path(__file__).parents[1] / "graders/engine/result.schema.json").read_text())

# Wrong everywhere (values, a banned API, a write into its input), so every check fails and keeps
# what the file printed: the inputs it was given.
ECHO = '''import numpy as np
import torch

def softmax(x, axis=-1):
    print(x.shape, repr(float(np.nansum(np.where(np.isinf(x), 0, x)))))
    torch.softmax(torch.zeros(1), 0)
    out = np.zeros_like(x)
    x *= 2
    return out
'''


@pytest.fixture
def echo_file(tmp_path):
    path = tmp_path / "softmax.py"
    path.write_text(ECHO)
    return path


def printed(result) -> dict:
    return {c["id"]: c.get("output") for c in result["checks"]}


def test_hidden_inputs_are_fresh_and_public_ones_replay(echo_file, zygotes):
    import jsonschema   # here, not at collection: it takes most of a second
    kata = find("softmax")
    first, second = (grade(kata, echo_file, seed=7, device="cpu", zygote=zygotes(kata.framework)) for _ in range(2))
    hidden = set(hidden_checks(kata))
    for result in (first, second):
        jsonschema.validate(result, SCHEMA)
        assert {c["id"]: c["visibility"] for c in result["checks"]} == \
            {cid: "hidden" if cid in hidden else "visible" for cid in kata.checks}
        assert all(c["status"] == "failed" and c["output"] for c in result["checks"])
    assert first["hidden_seed"] != second["hidden_seed"]
    for cid in kata.checks:
        assert (printed(first)[cid] == printed(second)[cid]) == (cid not in hidden), cid


def test_hidden_seed_replays_hidden_inputs(echo_file, zygotes):
    kata = find("softmax")
    first, second = (grade(kata, echo_file, seed=7, hidden_seed=11, device="cpu", zygote=zygotes(kata.framework))
                     for _ in range(2))
    assert first["hidden_seed"] == second["hidden_seed"] == 11
    assert printed(first) == printed(second)


def test_grading_at_several_seeds_is_a_grading_at_each(echo_file, zygotes):
    """grade_seeds, one pytest session for several seeds (how `kata lint --deep` grades a bug at
    each of its seeds), returns what a grading at each seed returns: the same inputs drawn, the
    same results."""
    kata = find("softmax")
    seeds = [3, 2**31 + 3]
    at_once = grade_seeds(kata, echo_file, seeds, device="cpu", zygote=zygotes(kata.framework))
    each = [grade(kata, echo_file, seed=seed, hidden_seed=seed, device="cpu", zygote=zygotes(kata.framework))
            for seed in seeds]
    untimed = lambda result: {**result, "duration_s": None, "checks": [{**c, "duration_s": None}
                                                                         for c in result["checks"]]}
    assert [untimed(r) for r in at_once] == [untimed(r) for r in each]
    assert printed(at_once[0]) != printed(at_once[1])


def test_kata_check_labels_hidden_checks_and_replays_them_with_seed(kata_cmd):
    (kata_cmd.workspace / "softmax.py").write_text(ECHO)
    runs = [kata_cmd("check", "softmax", "--json", "--seed", "5") for _ in range(2)]
    results = [json.loads(run.stdout) for run in runs]
    assert [r.returncode for r in runs] == [1, 1]
    assert results[0]["hidden_seed"] == results[1]["hidden_seed"] == 5
    assert printed(results[0]) == printed(results[1])
    shown = kata_cmd("check", "softmax", "--seed", "5").stdout
    assert re.search(r"sums-to-one +\[hidden\]", shown)
    assert not re.search(r"matches-reference +\[hidden\]", shown)
