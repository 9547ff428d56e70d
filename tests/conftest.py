import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graders.engine import bwrap
from graders.engine.manifest import find
from graders.engine.runner import grade

KATA = Path(sys.executable).with_name("kata")   # the installed console script
# Grading a class, and the containment tests, need bubblewrap: .ci/run installs it.
needs_bwrap = pytest.mark.skipif(bwrap.problem() is not None,
                                 reason=f"{bwrap.problem()}: grading runs only in its sandbox")


@pytest.fixture(autouse=True, scope="session")
def private_state(tmp_path_factory):
    """`kata release` remembers released seeds in the user's state folder (and `kata grade`
    refuses them): the tests keep theirs apart from the user's."""
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))


@pytest.fixture
def grade_source(tmp_path):
    """Grade a learner file written from ``source``; ``limits`` override the manifest's
    timeouts (tests of endless loops should not wait 10 s a check). Returns (result, path)."""

    def run(slug, source, *, seed=1, file_name=None, **limits):
        kata = dataclasses.replace(find(slug), **limits)
        path = tmp_path / (file_name or kata.learner_file)
        path.write_text(source, encoding="utf-8")
        before = path.read_bytes()
        result = grade(kata, path, seed=seed, hidden_seed=seed, device="cpu")   # reproducible, hidden checks too
        assert path.read_bytes() == before, "grading changed the learner's file"
        return result

    return run


@pytest.fixture
def kata_cmd(tmp_path):
    """Run the installed `kata` command in a subprocess, in an empty workspace."""
    workspace = tmp_path / "ws"
    workspace.mkdir()

    def run(*args, input=None, timeout=300):
        env = {**os.environ, "KATA_WORKSPACE": str(workspace), "NO_COLOR": "1"}
        return subprocess.run([str(KATA), *args], capture_output=True, text=True, input=input,
                              env=env, cwd=workspace, timeout=timeout)

    run.workspace = workspace
    return run


def checks_by_id(result):
    return {c["id"]: c for c in result["checks"]}
