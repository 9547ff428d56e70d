"""Rank groups (graders/engine/sandbox.py's RankGroup, learner.py's Ranks): one learner file run as
the ranks of a torch.distributed group, which the grader starts and which talk to each other over
gloo. Under bubblewrap they share namespaces of their own: a loopback that only they have, no
other socket family, their own pipes to the grader. Tried as the caller and, as root, as a
normal user, and in a grading container's containment (no bwrap)."""
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from graders.engine.failures import LearnerRaised, SandboxFailed
from graders.engine.learner import CollectiveNotJoined, Learner
from graders.engine.manifest import ROOT
from graders.engine.sandbox import Sandbox, Zygote

from conftest import WHO, as_user, needs_bwrap

pytestmark = needs_bwrap

SOURCE = textwrap.dedent('''
    import os, socket, time
    import torch
    import torch.distributed as dist

    def summed(x):
        x = x * (dist.get_rank() + 1)
        dist.all_reduce(x)
        return x, dist.get_rank(), dist.get_world_size()

    def raises_on_one(x):
        if dist.get_rank() == 1:
            raise ValueError("rank one refuses")
        dist.all_reduce(x)
        return x

    def skips_on_one(x):
        if dist.get_rank() != 1:
            dist.all_reduce(x)
        return x

    def barrier_on_one(x, late):
        time.sleep(1.0 if dist.get_rank() == late else 0)   # the other rank's wait ends first
        if dist.get_rank() == 1:
            dist.barrier()
        else:
            dist.all_reduce(x)
        return x

    def barrier_then_async(x):
        dist.all_reduce(x)
        dist.barrier()
        dist.all_reduce(x, async_op=True)   # never waited on
        return x

    def forks_on_one(x):
        if dist.get_rank() == 1:
            os.fork()
        dist.all_reduce(x)
        return x

    def listen():
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        s.listen()
        globals()["held"] = s
        return s.getsockname()[1]

    def connect(port):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", port))
            return "connected"
        except OSError as exc:
            return type(exc).__name__

    def families():
        made = {}
        for name, args in [("unix", (socket.AF_UNIX, socket.SOCK_STREAM)),
                           ("inet6", (socket.AF_INET6, socket.SOCK_STREAM)),
                           ("packet", (17, socket.SOCK_RAW)),
                           ("netlink audit", (socket.AF_NETLINK, socket.SOCK_RAW, 9))]:
            try:
                socket.socket(*args).close()
                made[name] = "made"
            except OSError as exc:
                made[name] = exc.errno
        return made
''')


def _group_run(isolated: bool, world: int) -> dict:
    """Start a rank group of SOURCE and report what it did (run in this process or as another user)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ranked.py"
        path.write_text(SOURCE)
        return _report(path, isolated, world)


def _report(path: Path, isolated: bool, world: int) -> dict:
    with Zygote(["torch"], isolated=isolated, container=not isolated) as zygote:
        import torch

        with Sandbox(path, zygote=zygote, framework="torch", module_name="ranked", timeout_s=10,
                     import_timeout_s=60, memory_mb=2048, spawn=False) as sandbox:
            ranks = Learner(sandbox).ranks(world)
            summed = ranks.each(lambda r, learner: learner.summed(torch.ones(3)))
            return {"summed": [[x.tolist(), rank, size] for x, rank, size in summed],
                    "families": ranks.each(lambda r, learner: learner.families())[0],
                    "pipes": _pipes_per_rank(ranks.group)}


def _pipes_per_rank(group) -> list[list[str]]:
    """The pipes each rank's worker holds, read from outside (/proc/PID/fd)."""
    held = []
    for rank in group.ranks:
        fd_dir = f"/proc/{rank.proc.pid}/fd"
        links = [os.readlink(f"{fd_dir}/{fd}") for fd in os.listdir(fd_dir)]
        held.append(sorted(link for link in links if link.startswith("pipe:")))
    return held


@pytest.mark.parametrize("who", WHO)
def test_ranks_meet_over_their_own_loopback_and_nothing_else(who):
    user = as_user(who)
    script = "import json, sys; sys.path[:0] = ['tests']; from test_ranks import _group_run; " \
             "print(json.dumps(_group_run(True, 4)))"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=240, **user)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["summed"] == [[[10.0] * 3, rank, 4] for rank in range(4)]   # 1 + 2 + 3 + 4 on every rank
    # Only AF_INET (and gloo's NETLINK_ROUTE) may be made: no path out of the group's network.
    assert all(errno == 1 for errno in report["families"].values()), report["families"]
    # Each rank holds its own pipes to the grader only, not another rank's.
    pipes = [set(p) for p in report["pipes"]]
    assert all(pipes) and all(not (a & b) for i, a in enumerate(pipes) for b in pipes[i + 1:])


def test_ranks_run_without_bwrap_in_a_grading_containers_containment():
    if os.geteuid() != 0:
        pytest.skip("container containment runs the worker as another user: root only")
    report = _group_run(False, 2)
    assert report["summed"] == [[[3.0] * 3, rank, 2] for rank in range(2)]


@pytest.fixture(scope="module")
def zygote():
    with Zygote(["torch"]) as z:
        yield z


@pytest.fixture
def ranks_of(tmp_path, zygote):
    sandboxes = []

    def make(world, timeout_s=10):
        path = tmp_path / f"ranked{len(sandboxes)}.py"
        path.write_text(SOURCE)
        sandboxes.append(Sandbox(path, zygote=zygote, framework="torch", module_name="ranked", timeout_s=timeout_s,
                                 import_timeout_s=60, memory_mb=2048, spawn=False))
        return Learner(sandboxes[-1]).ranks(world)

    yield make
    for sandbox in sandboxes:   # closing a sandbox closes its rank groups
        sandbox.close()


def test_two_learners_groups_cannot_reach_each_other(ranks_of):
    first, second = ranks_of(2), ranks_of(2)
    port = first.each(lambda r, learner: learner.listen())[0]
    assert first.each(lambda r, learner: learner.connect(port)) == ["connected", "connected"]
    assert second.each(lambda r, learner: learner.connect(port)) == ["ConnectionRefusedError"] * 2


def test_nothing_outside_reaches_a_group_or_is_reached_from_it(ranks_of):
    ranks = ranks_of(2)
    with socket.socket() as outside:
        outside.bind(("127.0.0.1", 0))
        outside.listen()
        assert ranks.each(lambda r, learner: learner.connect(outside.getsockname()[1])) == ["ConnectionRefusedError"] * 2
    port = ranks.each(lambda r, learner: learner.listen())[0]
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))


def test_a_rank_that_raises_stops_the_group_and_is_the_one_reported(ranks_of):
    import torch

    ranks = ranks_of(2)
    with pytest.raises(LearnerRaised, match="rank one refuses"):
        ranks.each(lambda r, learner: learner.raises_on_one(torch.ones(2)))
    assert not ranks.group.running
    # The next call starts the group afresh.
    assert [x.tolist() for x, _, _ in ranks.each(lambda r, learner: learner.summed(torch.ones(2)))] == [[3.0] * 2] * 2


def test_a_rank_that_starts_a_process_is_named_not_its_peers_broken_collective(ranks_of):
    import torch

    ranks = ranks_of(2)
    with pytest.raises(SandboxFailed, match="started a process"):
        ranks.each(lambda r, learner: learner.forks_on_one(torch.ones(2)))


def test_a_collective_one_rank_never_joins_names_that_rank_from_the_ranks_own_records(ranks_of):
    import torch

    ranks = ranks_of(2)
    # The wait is measured: its 3 s timeout, and a tenth or two more on a busy machine.
    said = r"Rank 1 never called all_reduce \(rank 0 waited 3\.\d s\)"
    with pytest.raises(CollectiveNotJoined, match=said) as caught:
        ranks.each(lambda r, learner: learner.skips_on_one(torch.ones(2)))
    assert caught.value.rank == 1 and "/gloo/" not in caught.value.message
    assert ranks.group.left_waiting and not ranks.group.running
    # Started afresh, the group waits less: its learner is known to leave a rank waiting.
    with pytest.raises(CollectiveNotJoined, match=r"\(rank 0 waited 0\.[5-9] s\)"):
        ranks.each(lambda r, learner: learner.skips_on_one(torch.ones(2)))


@pytest.mark.parametrize("late", [0, 1])
def test_a_collective_another_rank_calls_in_its_place_is_named_the_same_whichever_wait_ends_first(ranks_of, late):
    import torch

    with pytest.raises(CollectiveNotJoined, match=r"Rank 1 called barrier where rank 0 called all_reduce"):
        ranks_of(2).each(lambda r, learner: learner.barrier_on_one(torch.ones(2), late))


def test_each_ranks_process_group_records_barriers_and_unwaited_async_collectives(ranks_of):
    import torch

    ranks = ranks_of(2)
    before = ranks.collectives()
    ranks.each(lambda r, learner: learner.barrier_then_async(torch.ones(2)))
    after = ranks.collectives([b["entered"][-1][0] if b["entered"] else -1 for b in before])
    for b, a in zip(before, after):
        assert [(name, shape) for _, name, shape in a["entered"]] == [("all_reduce", [2]), ("barrier", None),
                                                                      ("all_reduce", [2])]
        assert a["unwaited"] - b["unwaited"] == 1


def test_the_groups_loopback_traffic_is_counted_from_outside(ranks_of):
    import torch

    ranks = ranks_of(2)
    ranks.each(lambda r, learner: learner.summed(torch.ones(1)))
    before = ranks.loopback_bytes()
    ranks.each(lambda r, learner: learner.kit_function("all_reduce")(torch.ones(25_000)))   # 100 kB a rank
    sent = ranks.loopback_bytes() - before
    assert 100_000 <= sent <= 400_000, sent


def test_a_grading_keeps_one_group_per_world_and_closing_its_sandbox_ends_it(ranks_of):
    import torch

    ranks = ranks_of(2)
    ranks.each(lambda r, learner: learner.summed(torch.ones(1)))
    pids = [rank.proc.pid for rank in ranks.group.ranks]
    sandbox = ranks.group.sandbox
    assert sandbox.rank_group(2) is ranks.group and sandbox.rank_group(4) is not ranks.group
    ranks.each(lambda r, learner: learner.summed(torch.ones(1)))
    assert [rank.proc.pid for rank in ranks.group.ranks] == pids   # the same processes: no second start
    sandbox.close()
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)


def test_a_kit_group_loads_no_file_of_the_learners_and_closes_with_its_sandbox(ranks_of):
    """What a grader measures there (one all-reduce's bytes) is kit code's alone: the learner's
    file, which could patch the kit's functions in its own ranks, is not loaded."""
    import torch

    ranks = ranks_of(2)
    sandbox = ranks.group.sandbox
    kit = Learner(sandbox).kit_ranks(2)
    assert kit.group is not ranks.group and kit.group is sandbox.kit_group(2)
    assert kit.each(lambda r, learner: learner.names()) == [[], []]
    summed = kit.each(lambda r, learner: learner.kit_function("all_reduce")(torch.ones(3)))
    assert [x.tolist() for x in summed] == [[2.0] * 3] * 2
    assert kit.loopback_bytes() > 0
    pids = [rank.proc.pid for rank in kit.group.ranks]
    sandbox.close()
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)
