import dataclasses
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from graders.engine import bwrap
from graders.engine.manifest import ROOT, Kata, find
from graders.engine.runner import grade
from graders.engine.sandbox import Zygote

KATA = Path(sys.executable).with_name("kata")   # the installed console script
# The kit's own katas only: a course's folder of katas in the caller's environment is no part of the
# kit's tests (tests/test_course_kata.py gives its own with --katas-dir).
os.environ.pop("KATA_KATAS_DIR", None)
# The Triton katas' kernels run on Triton's interpreter in the tests' own process too (their
# references are imported here); set before anything imports Triton (see manifest.interpret_triton).
os.environ["TRITON_INTERPRET"] = "1"
# Grading a class, and the containment tests, need bubblewrap: .ci/run installs it.
needs_bwrap = pytest.mark.skipif(bwrap.problem() is not None,
                                 reason=f"{bwrap.problem()}: grading runs only in its sandbox")

# Containment is tried as the caller and, when the caller is root, as a normal user as well.
WHO = ["caller", "non-root"]
AS_ROOT = os.geteuid() == 0
OTHER_UID = 64123   # the non-root user the kit runs as when the tests run as root


def as_user(who: str) -> dict:
    """subprocess.run's arguments that run a command as ``who``; skips where that user cannot."""
    if who == "caller":
        return {}
    if not AS_ROOT:
        pytest.skip("the caller is the non-root user already")
    user = {"user": OTHER_UID, "group": OTHER_UID, "extra_groups": []}
    try:
        reached = subprocess.run([sys.executable, "-c", "import graders.engine.sandbox"], cwd=ROOT, **user,
                                 capture_output=True).returncode == 0
    except PermissionError:   # not even the interpreter
        reached = False
    if not reached:
        pytest.skip("another user cannot run this Python or read the checkout (.ci/run makes them reachable)")
    return user


# --- the quick tier: `python -m pytest --kata mha` ------------------------------------------------

def pytest_addoption(parser):
    parser.addoption("--kata", metavar="SLUG", help="only KATA's own tests: its grader's (tests/test_kata_<module>.py), "
                     "its content's rules, its record's gradings (reference, stub, bug oracles, style zoo) and the "
                     "structure of its cases")


QUICK = pytest.StashKey[Kata | None]()   # the kata of --kata, found once in pytest_configure


def _quick_tier(config):
    """The kata of --kata, or None; an unknown slug stops the run here, with one line."""
    slug = config.getoption("kata")
    if slug is None:
        return None
    try:
        return find(slug)
    except LookupError as exc:
        raise pytest.UsageError(f"--kata: {exc}") from None


def pytest_ignore_collect(collection_path, config):
    kata = config.stash[QUICK]
    if kata is not None and collection_path.suffix == ".py" and collection_path.name.startswith("test_") \
            and collection_path not in (*PER_KATA, kata.files["tests"]):
        return True
    return None


PER_KATA = (Path(__file__).with_name("test_content.py"), Path(__file__).with_name("test_cases.py"))


def _about(item, kata) -> bool:
    """Whether a test of PER_KATA is about ``kata``: its ``slug`` parameter names it."""
    return getattr(item, "callspec", None) is not None and item.callspec.params.get("slug") == kata.slug


def pytest_collection_modifyitems(config, items):
    kata = config.stash[QUICK]
    if kata is not None:
        mine = {i for i in items if i.path == kata.files["tests"] or _about(i, kata)}
        config.hook.pytest_deselected(items=[i for i in items if i not in mine])
        items[:] = [i for i in items if i in mine]
    _write_groups(config, items)


# --- several workers (pytest-xdist's `-n auto`, in pyproject.toml's addopts) ------------------------

LOCKS = pytest.StashKey[Path]()


def pytest_configure(config):
    config.stash[QUICK] = _quick_tier(config)
    if hasattr(config, "workerinput"):
        # The workers share the cores: torch's threads, one per core in every worker, would spin
        # against each other (twice as slow as one process). One each, and for the `kata` commands
        # a worker starts, as `kata grade` keeps its grading processes.
        os.environ["OMP_NUM_THREADS"] = "1"
        # For the same reason a `kata grade` grades in one process unless a test asks for more (-j):
        # each process it adds pays its own Python, torch and sandbox start, for no time won.
        os.environ["KATA_JOBS"] = "1"
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """The controller makes one folder for its workers: their locks and their groups."""
    if LOCKS not in node.config.stash:
        node.config.stash[LOCKS] = Path(tempfile.mkdtemp(prefix="kata-tests-"))
    node.workerinput["kata_locks"] = str(node.config.stash[LOCKS])


def pytest_unconfigure(config):
    if LOCKS in config.stash:
        shutil.rmtree(config.stash[LOCKS], ignore_errors=True)


def _write_groups(config, items):
    """Each worker writes down the tests that an ``xdist_group`` mark keeps together (a module's
    costly set-up, done once), for the controller's scheduler. pytest-xdist itself appends the
    group to each test's id, which pytest 9.2's structured ids ignore (pytest-xdist issue #1386)."""
    folder = getattr(config, "workerinput", {}).get("kata_locks")
    if folder is None:
        return
    groups = {item.nodeid: mark.args[0] for item in items for mark in item.iter_markers("xdist_group")}
    written = Path(folder) / f"groups-{config.workerinput['workerid']}.json"
    written.with_suffix(".tmp").write_text(json.dumps(groups))
    written.with_suffix(".tmp").replace(written)   # whole or not at all: the controller reads it next


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup" or LOCKS not in config.stash:
        return None
    from xdist.scheduler import LoadGroupScheduling

    class Grouped(LoadGroupScheduling):
        """loadgroup, with the groups the workers wrote down."""

        def _split_scope(self, nodeid):
            if not hasattr(self, "groups"):   # first asked once every worker has collected
                self.groups = {}
                for written in config.stash[LOCKS].glob("groups-*.json"):
                    self.groups.update(json.loads(written.read_text()))
            return self.groups.get(nodeid) or super()._split_scope(nodeid)

    return Grouped(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test marked ``serial`` runs with the machine to itself: the other workers finish the test
    they are in, then wait until it is done (its set-up and teardown included). Every test lines
    up at the gate; a serial test keeps it shut until it is done, so that the others cannot keep it
    waiting forever."""
    folder = getattr(item.config, "workerinput", {}).get("kata_locks")
    if folder is None:   # one process: nothing runs beside the test anyway
        return (yield)
    serial = item.get_closest_marker("serial") is not None
    # POSIX record locks belong to this process: a child it forks holds neither.
    with open(Path(folder) / "gate", "a+") as gate, open(Path(folder) / "machine", "a+") as machine:
        fcntl.lockf(gate, fcntl.LOCK_EX)
        fcntl.lockf(machine, fcntl.LOCK_EX if serial else fcntl.LOCK_SH)
        if not serial:
            fcntl.lockf(gate, fcntl.LOCK_UN)
        return (yield)   # closing the files lets go of both


# --- fixtures ------------------------------------------------------------------------------------

class Kept(Zygote):
    """A zygote of the session's: the gradings and commands that share it leave it running."""

    def close(self):
        pass

    def shut(self):
        super().close()


@pytest.fixture(scope="session")
def zygotes():
    """``zygotes(framework)``: the warm zygote that every test grading through the engine shares,
    one per framework as `kata grade` keeps them, so that a sandbox costs a fork rather than an
    interpreter start and an ``import torch``. The sandboxes are as real as a class's: bwrap where
    it can be had, a fresh worker per learner file. Tests about a zygote's own start make their own."""
    made = {}

    def get(framework):
        if framework not in made:
            made[framework] = Kept([framework], isolated=None, warm=True)
        return made[framework]

    yield get
    for zygote in made.values():
        zygote.shut()


@pytest.fixture
def warm_commands(monkeypatch, zygotes):
    """The `kata` commands a test runs in-process (click's CliRunner) fork their sandboxes from
    the session's zygotes, as the engine's own tests do, rather than start one each: seconds of an
    interpreter and an ``import torch`` per command, in modules whose subject is what the command
    does with a grading. A zygote's own start is tested where a command runs as a process."""
    import cli
    from graders.engine import runner
    cold = runner.zygote_for

    def shared(katas, device, *, warm=False):
        frameworks = {k.framework for k in katas}
        if len(frameworks) > 1 or any(runner._may_use_cuda(k, device) for k in katas):
            return cold(katas, device, warm=warm)
        return zygotes(frameworks.pop())

    for module in (runner, cli):
        monkeypatch.setattr(module, "zygote_for", shared)


@pytest.fixture
def grade_source(tmp_path, zygotes):
    """Grade a learner file written from ``source``; ``limits`` override the manifest's
    timeouts (tests of endless loops should not wait 10 s a check). Returns the result."""

    def run(slug, source, *, seed=1, file_name=None, **limits):
        kata = dataclasses.replace(find(slug), **limits)
        path = tmp_path / (file_name or kata.learner_file)
        path.write_text(source, encoding="utf-8")
        before = path.read_bytes()
        # reproducible, hidden checks too
        result = grade(kata, path, seed=seed, hidden_seed=seed, device="cpu", zygote=zygotes(kata.framework))
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


def split_lengths(Tk, n_splits):
    """The lengths of the chunks the flash-decoding reference's split_kv_decode hands
    partial_attention for a cache of Tk keys, in order (empty splits as 0)."""
    from unittest import mock

    import torch

    from reference import flash_decoding as fd

    sizes, attend = [], fd.partial_attention

    def partial(q, k, v):   # records each split's length, then attends as the reference does
        sizes.append(k.size(-2))
        return attend(q, k, v)

    with mock.patch.object(fd, "partial_attention", partial):
        fd.split_kv_decode(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, Tk, 1), torch.zeros(1, 1, Tk, 1), n_splits)
    return sizes
