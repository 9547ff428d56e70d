"""Containment, round four (issue 42): one attack per class that got through, each graded through
the real kit as the caller and, when that is root, as a normal user.

A: code that turns a string into code or a name into an attribute, or builds a class from a
namespace made at run time, is refused by the static check's allow-lists of meaning.
B: tp-attention's ranks measured where their code cannot reach (tests/test_kata_tp_attention.py
holds an attack per measure; here one, as a normal user too).
C: memory held in shared memory (``share_memory_()``) counts toward what a memory check reads.
D: a grading has a budget of CPU and wall-clock time for all its calls together.
E: in a grading container a worker makes no file anywhere (tried through Gradescope's container in
test_gradescope.py), and a class run starts one rank group at a time.
F: code cannot tell a class's grading from self-study by the seeds it can observe, and a replay of
a file that is itself random says so.
"""
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import KATA, WHO, as_user, checks_by_id, needs_bwrap
from test_hardening import attack
from graders.classroom.rules import Policy
from graders.engine.manifest import find
from graders.engine.structure import TAMPERING, tampering

ATTACKS = Path(__file__).with_name("attacks")
ZOO = Path(__file__).with_name("zoo")


def kata_check(who: str, slug: str, source: Path, seed: int = 1) -> dict:
    """`kata check SLUG --file FILE --json --seed SEED` run by ``who`` in a workspace of its own;
    the result."""
    user = as_user(who)
    folder = Path(tempfile.mkdtemp(prefix="kata-round-four-"))
    try:
        shutil.copy(source, folder / source.name)
        for path in (folder, folder / source.name):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        if user:
            subprocess.run(["chown", "-R", f"{user['user']}:{user['group']}", str(folder)], check=True)
        env = {**os.environ, "HOME": str(folder), "KATA_WORKSPACE": str(folder), "NO_COLOR": "1"}
        command = [str(KATA), "check", slug, "--file", str(folder / source.name), "--json", "--seed", str(seed)]
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=folder, timeout=600, **user)
        assert done.returncode in (0, 1), done.stdout + done.stderr
        return json.loads(done.stdout.splitlines()[-1])
    finally:
        subprocess.run(["rm", "-rf", str(folder)])


# --- A: strings that run as code, classes built at run time --------------------------------------

# {route: (source, what the check names)}: each a way to run a string as code, to read or write an
# attribute named at run time, or to make a tensor subclass whose handler torch runs where the
# recorder has stepped aside; every one was tamper-clean before this round.
ROUTES = {
    "an annotation string run by singledispatch": ('''
import functools

@functools.singledispatch
def f(arg):
    return arg

@f.register
def _(arg: "__import__('torch')._C.DisableTorchFunction or int"):
    return arg
''', ["functools.singledispatch (line 4)", "the annotation \"__import__('torch')._C.DisableTorchFunct\"... (line 9)"]),
    "type() with three arguments": ('''
import torch

Quiet = type("Quiet", (torch.Tensor,), {"__torch_" + "function__": classmethod(lambda *a: None)})
''', ["type() with 3 arguments (line 4)"]),
    "a metaclass reached through type(x)": ('''
import torch

def sub(namespace):
    meta = type(torch.Tensor)
    return meta("Quiet", (torch.Tensor,), namespace)
''', ["type(torch.Tensor) other than for its name (line 5)"]),
    "a metaclass reached through __class__": ('''
import torch

def sub(namespace):
    return torch.Tensor.__class__("Quiet", (torch.Tensor,), namespace)
''', ["torch.Tensor.__class__ other than for its name (line 5)"]),
    "enum's functional API mixing in a tensor": ('''
import enum
import torch

Quiet = enum.Enum("Quiet", [("__torch_" + "function__", 1)], type=torch.Tensor)
''', ["import enum (line 2)"]),
    "functools.wraps copying attributes named at run time": ('''
import functools

def steal(f, name):
    return functools.wraps(f, assigned=[name])(lambda: None)
''', ["functools.wraps (line 5)"]),
    "a format string that reads attributes": ('''
def steal(f):
    return "{0.__glo" "bals__}".format(f)
''', ["'{0.__globals__}'.format: a format string that is built at run time or reads attributes (line 3)"]),
    "a format string built at run time": ('''
def steal(f, name):
    return ("{0." + name + "}").format(f)
''', ["('{0.' + name + '}').format: a format string that is built at run time or reads attributes (line 3)"]),
    "a tensor base bound at run time": ('''
import torch

Base = torch.Tensor

class Quiet(Base):
    pass
''', ["class Quiet(Base) (line 6)"]),
    "a metaclass keyword": ('''
import abc

class Quiet(metaclass=abc.ABCMeta):
    pass
''', ["abc.ABCMeta (line 4)", "class Quiet(metaclass=...) (line 4)"]),
    "a method torch calls from inside an op": ('''
class Size:
    def __index__(self):
        return 4

    def __getitem__(self, i):
        return 4
''', ["def __index__ (line 3)", "def __getitem__ (line 6)"]),
    "a builtin that lists names": ('''
import torch

def names():
    return dir(torch)
''', ["dir, a builtin this check does not list (line 5)", "torch as a value (line 5)"]),
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_strings_run_as_code_and_classes_built_at_run_time_are_refused(route):
    source, named = ROUTES[route]
    assert tampering(source, "torch") == named


@needs_bwrap
@pytest.mark.parametrize("who", WHO)
def test_work_hidden_below_the_recorder_earns_nothing(who):
    """mha-by-loop: the heads computed at once in a tensor subclass's handler (a class built with
    type() from a key assembled at run time), with recording switched off by a tool named only in
    an annotation string (evaluated by functools.singledispatch), or in a __repr__ that torch's
    own code calls inside tensordot (every name of that file passes the static check: the worker
    sees the learner's code run inside a torch call), a loop only faked. All had 10/10; now each
    structure check scores 0 as tampering, and the file no more than the same computation done in
    plain sight (the style zoo's all-heads file)."""
    control = kata_check(who, "mha-by-loop", ZOO / "mha-by-loop" / "function_only__not-a-loop.py")
    assert checks_by_id(control)["per-head-loop"]["diagnosis"] == "not-a-loop"
    for attack in ("subclass_handler", "annotation", "in_repr"):
        result = kata_check(who, "mha-by-loop", ATTACKS / "mha-by-loop" / f"{attack}.py")
        checks = checks_by_id(result)
        assert all(checks[c]["score"] == 0 and checks[c]["diagnosis"] == TAMPERING
                   for c in ("per-head-loop", "given-class-unchanged")), (attack, checks)
        assert result["score"] <= control["score"] < control["max_score"], attack


def test_graded_rules_zero_a_kata_whose_banned_api_check_found_tampering():
    """A banned call run from a string or below the recorder is not seen as one: the banned-API
    check can only say ``tampering``, which graded rules treat as the banned call it hides."""
    checks = [{"id": "matches", "score": 4.0, "diagnosis": None},
              {"id": "banned-api", "score": 0.0, "diagnosis": TAMPERING}]
    result = {"checks": checks, "score": 4.0, "status": "failed", "diagnoses": [TAMPERING]}
    assert Policy(banned_fails=True).apply(result)["score"] == 0.0
    assert Policy().apply(result)["score"] == 4.0
    honest = {**result, "checks": [checks[0], {**checks[1], "diagnosis": None, "score": 1.0}], "diagnoses": []}
    assert Policy(banned_fails=True).apply(honest) is honest


# --- B: tp-attention's ranks ----------------------------------------------------------------------

@needs_bwrap
@pytest.mark.parametrize("who", WHO)
def test_a_collective_the_process_group_does_not_record_scores_nothing_on_the_structure_checks(who, tmp_path):
    """The reference with its one all-reduce made through the default group's own method, which
    the static check does not let through (tp-attention allows four names of torch.distributed):
    it had 13/13; now the three checks that judge what the ranks hold and send score 0."""
    reference = find("tp-attention").reference_path.read_text()
    source = tmp_path / "tp_attention.py"
    source.write_text(reference.replace("        dist.all_reduce(out)", "        dist.group.WORLD.allreduce([out]).wait()"))
    checks = checks_by_id(kata_check(who, "tp-attention", source))
    assert all(checks[c]["score"] == 0 and checks[c]["diagnosis"] == TAMPERING
               for c in ("parameters-per-rank", "own-shards-only", "one-all-reduce")), checks
    assert checks["matches-single-process"]["status"] == "passed"


# --- C: memory of every kind ------------------------------------------------------------------------

@needs_bwrap
@pytest.mark.parametrize("who", WHO)
def test_a_history_kept_in_shared_memory_is_held_memory(who):
    """sliding-window: a right rolling buffer that also keeps every chunk of the stream in tensors
    moved to shared memory had 22/22 (the check read the worker's anonymous memory only); now it
    loses the memory check with rolling-buffer-grows, as the same history kept in plain tensors
    does."""
    result = kata_check(who, "sliding-window", ATTACKS / "sliding-window" / "shared_history.py")
    check = checks_by_id(result)["buffer-never-exceeds-window"]
    assert check["score"] == 0 and check["diagnosis"] == "rolling-buffer-grows", check
    assert result["score"] == result["max_score"] - check["max_score"]


# --- D: a pair's total time -----------------------------------------------------------------------

WAITER = "import time\n\ndef wait(s):\n    time.sleep(s)\n"


@needs_bwrap
@pytest.mark.parametrize("who", WHO)
def test_a_file_that_waits_in_every_call_is_stopped_by_its_grading_budget(who):
    """Each call waits under its own limit (20 s of CPU time, a 100 s backstop), as a file sleeping
    45 s a call did for most of an hour of a class run. With a grading budget of 1 s of CPU time
    (3 s of wall-clock time), the third call is stopped where the budget ends and the fourth is not
    run: a sentence says why each time, and the calls before keep their answers."""
    answers = attack(who, WAITER, [[("wait", [1.2])] * 4], budget_s=1.0)
    assert answers[:2] == [None, None], answers
    assert "was stopped when this file's grading had used its budget" in answers[2]["stopped"], answers
    assert "was not run: this file's grading had used its budget (1 s of CPU time, 3 s of wall-clock time" \
        in answers[3]["stopped"], answers


def test_every_kata_has_its_reference_time_measured():
    """Each grading's budget derives from its kata's reference (benchmarks/reference_cpu.py): a new
    kata is measured, never graded on the floor by oversight."""
    from graders.engine.manifest import katas
    from graders.engine.runner import REFERENCE_CPU

    table = json.loads(REFERENCE_CPU.read_text(encoding="utf-8"))
    assert set(table) == {k.slug for k in katas()}
    assert all(0 < seconds < 60 for seconds in table.values()), table


# --- E: a grading container's pairs kept apart ------------------------------------------------------

RANKED = "import torch\nimport torch.distributed as dist\n\ndef summed(x):\n    dist.all_reduce(x)\n    return x\n"


def _summed_in_a_group(path: str, lock, answers):
    """Sum ones over a rank group of two, in a grading container's containment, with ``lock`` shared
    as a class run's grading processes share it; the answer goes to ``answers`` (a queue)."""
    import torch

    from graders.engine.learner import Learner
    from graders.engine.sandbox import Sandbox, Zygote, one_rank_group_at_a_time

    one_rank_group_at_a_time(lock)
    with Zygote(["torch"], isolated=False, container=True) as zygote, \
            Sandbox(Path(path), zygote=zygote, framework="torch", module_name="ranked", timeout_s=10,
                    import_timeout_s=60, memory_mb=2048, spawn=False) as sandbox:
        sandbox.ensure_loaded()
        answers.put("ready")   # all that is left is the rank group, which waits for the lock
        ranks = Learner(sandbox).ranks(2)
        summed = [x.tolist() for x in ranks.each(lambda r, learner: learner.summed(torch.ones(2)))]
        answers.put((summed, ranks.group.store))
        answers.get()   # the group stays open until the test says
    one_rank_group_at_a_time(None)


@pytest.mark.skipif(os.geteuid() != 0, reason="container containment runs the worker as another user: root only")
def test_in_a_container_two_rank_groups_never_run_at_once(tmp_path):
    """A grading container's rank groups share its network, where one group's ranks could reach
    another's gloo and store sockets: the grading processes of a class run share one lock, and a
    second process's group starts only once the first's is closed. Its ranks meet through a TCP
    store, since they may make no file."""
    import multiprocessing
    import queue

    path = tmp_path / "ranked.py"
    path.write_text(RANKED)
    os.chmod(tmp_path, 0o755)
    context = multiprocessing.get_context("spawn")
    lock = context.Lock()
    first_answers, second_answers = context.Queue(), context.Queue()
    first = context.Process(target=_summed_in_a_group, args=(str(path), lock, first_answers))
    second = context.Process(target=_summed_in_a_group, args=(str(path), lock, second_answers))
    first.start()
    try:
        assert first_answers.get(timeout=120) == "ready"
        summed, store = first_answers.get(timeout=120)
        assert summed == [[2.0] * 2] * 2 and store.startswith("tcp://127.0.0.1:"), (summed, store)
        second.start()
        assert second_answers.get(timeout=120) == "ready"
        with pytest.raises(queue.Empty):   # the second group waits while the first is open (unlocked: a second or two)
            second_answers.get(timeout=8)
        first_answers.put("close")
        summed, _ = second_answers.get(timeout=120)
        assert summed == [[2.0] * 2] * 2
        second_answers.put("close")
    finally:
        for process in (first, second):
            process.join(30)
            if process.is_alive():
                process.kill()


# --- F: class and self-study told apart ----------------------------------------------------------

# Right only where the seed its code can read back looks like a class's ([2**31, 2**32), see
# classroom.rules), wrong (all zeros) where it looks like self-study's: its score says what it saw.
SEED_READER = """
import numpy as np


def softmax(x, axis=-1):
    if np.random.get_state()[1][0] < 2**31:
        return np.zeros_like(x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)
"""


@needs_bwrap
@pytest.mark.parametrize("who", WHO)
def test_the_seed_code_can_observe_carries_no_range(who, tmp_path):
    """Graded at four self-study seeds and four class seeds, a file that reads its seed from NumPy's
    global state behaves the same way in both ranges: the seed it sees is hashed from the grading's."""
    source = tmp_path / "softmax.py"
    source.write_text(SEED_READER)
    seen = {seed: kata_check(who, "softmax", source, seed)["status"] == "passed"
            for seed in (1, 2, 3, 4, 2**31 + 1, 2**31 + 2, 2**31 + 3, 2**31 + 4)}
    self_study, in_class = [v for s, v in seen.items() if s < 2**31], [v for s, v in seen.items() if s >= 2**31]
    assert not (all(in_class) and not any(self_study)), seen
    assert any(seen.values()) and not all(seen.values()), seen   # it reads a value spread over the 32 bits


RANDOM_SOFTMAX = """
import os

import numpy as np


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    noise = np.frombuffer(os.urandom(8), dtype=np.uint64)[0] / 2**64   # a new value each call, in [0, 1)
    return e / e.sum(axis=axis, keepdims=True) + noise * 1e-3
"""


@needs_bwrap
def test_a_replay_of_a_file_that_is_itself_random_says_so(tmp_path):
    """`kata grade --replay` of a file that draws from the system's randomness: the replays differ
    from each other too, and the sentence says that the file is not deterministic, not the kit."""
    subs, out = tmp_path / "subs", tmp_path / "out"
    (subs / "ann").mkdir(parents=True)
    (subs / "ann" / "softmax.py").write_text(RANDOM_SOFTMAX)
    run = lambda *extra: subprocess.run([str(KATA), "grade", str(subs), "--out", str(out), "--katas", "softmax",
                                         *extra], capture_output=True, text=True, timeout=600)
    assert run().returncode == 0
    replay = run("--replay")   # each grading's feedback shows other values: no two are the same
    assert replay.returncode == 1 and "the file itself is not deterministic" in replay.stdout, replay.stdout
    assert "bug of the kit" not in replay.stdout
