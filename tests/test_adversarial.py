"""A class of adversarial learners graded by the real `kata grade` (docs/security.md).

Each folder of tests/adversarial/ is a learner. Most try one trick to get points they did not earn,
wrapped around a known computation: the same file without the trick is a control learner in the
same class. A trick may change nothing (the score equals the control's) or cost everything (0 when
it breaks the file); it never earns a point the control does not. One run grades the whole class;
the tests below read its grades.csv, results.json files and what it left on disk.

Every learner runs in bubblewrap's sandbox, as root (CI, Gradescope) and as a normal user: a
probe learner checks it directly, answering right only if it is not root and can read, list and
write none of the kit's reference and graders, SUBMISSIONS and OUT. Folders that are no learner (a
link to the reference, names of the class's files, a name that is not UTF-8) stand beside them.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from graders.engine.manifest import ROOT, find

from conftest import needs_bwrap

# One class run, read by every test: one worker runs them all.
pytestmark = [needs_bwrap, pytest.mark.xdist_group("adversarial")]

KATA = Path(sys.executable).with_name("kata")
CLASS = Path(__file__).with_name("adversarial")
KATAS = ("softmax", "causal-mask", "mha")   # manifest order
MARK = "kata-adversarial"            # in every file a learner plants or forges
DAEMON = "kata-adversarial-daemon"   # on the command line of the daemon learner's process
PLANTED_NAMES = ("conftest.py", "results.json", "grades.csv")
CONTROLS = {"softmax": "control-softmax", "causal-mask": "control-causal", "mha": "control-mha"}
FORMULA = '=HYPERLINK("x","y")'   # a learner's name that a spreadsheet would run
LOOKALIKE = "h\u043enest"         # honest with a Cyrillic о
COPIES = {FORMULA: "honest", LOOKALIKE: "honest"}   # learners whose files are another's (the fixture copies them)


@dataclasses.dataclass(frozen=True)
class Trick:
    # "same": the control's score, check by check; "zero"; "same-or-zero"; "at-most": never more
    # than the control's, check by check (the sandbox may stop it anywhere)
    expect: str
    control: str | None = None   # the learner with the same computation and no trick (default: CONTROLS)


TRICKS = {
    "patch-numpy": Trick("same"),
    "patch-torch": Trick("same"),
    "liar": Trick("zero"),
    "ndarray-subclass": Trick("same-or-zero"),   # refused, or plain data of the control's values
    "tensor-subclass": Trick("same-or-zero"),
    "exit-at-import": Trick("zero"),
    "exit-in-call": Trick("zero"),
    "sys-exit": Trick("zero"),
    "plant-conftest": Trick("same"),
    "detect-grading": Trick("same", control="honest"),
    "loop-at-import": Trick("zero"),
    "loop-in-call": Trick("zero"),
    "memory-hog": Trick("zero"),   # every call is stopped by the memory cap, or it would return values
    "print-flood": Trick("same"),
    "banned-in-disguise": Trick("same", control="control-banned"),
    "write-results": Trick("same"),
    "read-reference": Trick("same"),
    "copy-classmate": Trick("same"),
    "kill-parent": Trick("same"),   # its parent is out of sight: the kill reaches nothing
    "daemon": Trick("same-or-zero"),   # softmax.py forks at import: stopped; its mha.py as the control
    "find-anywhere": Trick("same"),
    "scratch-fill": Trick("same"),
    "fork-hog": Trick("zero"),   # every call forks: stopped, on every run
    # Containment's third round: around bubblewrap rather than through it.
    "keyring-thief": Trick("same"),      # a classmate's softmax left in a keyring: refused
    "namespace-escape": Trick("same"),   # a user namespace, root in it: refused
    "hidden-memory": Trick("same-or-zero"),   # memfds, sockets, SysV shm refused; tmpfs and pipes counted
    "thread-heads": Trick("at-most", control="control-mha-sdpa"),   # the banned call in a thread
    "unwritable-text": Trick("same"),    # lone surrogates printed: the run goes on, written as U+FFFD
    LOOKALIKE: Trick("same", control="honest"),        # honest's files, a name that looks like honest's
    FORMULA: Trick("same", control="honest"),          # honest's files, a name that is a formula
    "huge": Trick("zero"),               # a sparse softmax.py of 60 GB: refused unread
}
# Folders that are no learner: graded by no one, listed in summary.md, and the run goes on.
ODD_FOLDERS = {"grades.csv": "honest", "summary.md": "honest"}
LEARNERS = sorted(["honest", "control-banned", "control-mha-sdpa", "probe", *CONTROLS.values(), *TRICKS])
SPARSE_BYTES = 60 << 30   # huge's softmax.py: its size, on no disk (made by the fixture)
CLASSMATE_KEY = "kata-adversarial-classmate"   # what keyring-thief looks for (see the fixture)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file's bytes; for one over a megabyte (huge's), its size and time of change."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.stat().st_size <= 1 << 20 else
            str((p.stat().st_size, p.stat().st_mtime_ns)).encode() for p in sorted(folder.rglob("*")) if p.is_file()}


def watched_dirs(base: Path) -> set[Path]:
    """Where a learner could plant or forge files outside its sandbox: the filesystem's and the
    temporary directory's roots, the kit and its folders, the Python installation, the class's
    folders, and the parents of all of these."""
    dirs = {Path("/"), Path("/tmp"), Path(tempfile.gettempdir()), ROOT / "graders" / "engine",
            Path(sysconfig.get_paths()["purelib"]), Path(sys.executable).parent}
    dirs |= {p for p in ROOT.iterdir() if p.is_dir()} | {p for p in base.rglob("*") if p.is_dir()}
    return {d for p in dirs | {ROOT, base} for d in (p, *p.parents)}


def planted_files(dirs) -> set[Path]:
    found = set()
    for folder in dirs:
        for name in PLANTED_NAMES:
            path = folder / name
            try:
                if MARK in path.read_text(errors="replace"):
                    found.add(path)
            except OSError:
                pass
    return found


def daemon_pids() -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if DAEMON.encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except (OSError, ValueError):
            pass
    return pids


def write_probe(folder: Path, submissions: Path, out: Path):
    """The probe learner, told the paths of this run that its sandbox must not reach."""
    fill = {
        "READ": [ROOT / "reference" / "softmax.py", ROOT / "graders" / "softmax.py", submissions / "honest" / "softmax.py",
                 submissions / "probe" / "softmax.py", out / "grades.csv", out / ".kata" / "records" / "honest" / "softmax.json"],
        "LIST": [ROOT / "reference", ROOT / "graders", submissions, submissions / "honest", out],
        "WRITE": [ROOT, ROOT / "reference", ROOT / "graders", submissions, submissions / "probe", out,
                  Path(sysconfig.get_paths()["purelib"])],
    }
    path = folder / "softmax.py"
    source = path.read_text()
    for name, paths in fill.items():
        line = next(line for line in source.splitlines() if line.startswith(f"{name} = []"))
        source = source.replace(line, f"{name} = {[str(p) for p in paths]!r}")
    path.write_text(source)


@pytest.fixture(scope="module")
def graded():
    """Grade the class once: the command's outcome, grades.csv rows, results.json per learner, and
    what was on disk before, right after and a few seconds after the run."""
    # Not under pytest's private tmp folder: SUBMISSIONS and OUT sit in readable folders, as an
    # instructor's would, so that only `kata grade` itself can keep the sandbox out of them.
    base = Path(tempfile.mkdtemp(prefix="kata-class-"))
    base.chmod(0o755)
    submissions, out = base / "submissions", base / "out"
    token = base.name   # tells copy-classmate this run's classmates from other files on the machine
    for name in set(LEARNERS) - {"huge"}:
        shutil.copytree(CLASS / COPIES.get(name, name), submissions / name, ignore=shutil.ignore_patterns("__pycache__"))
        for file in (submissions / name).glob("*.py"):
            file.write_text(file.read_text() + f"\n# class: {token}\n")
    (submissions / "huge").mkdir()
    with open(submissions / "huge" / "softmax.py", "wb") as f:
        f.truncate(SPARSE_BYTES)
    write_probe(submissions / "probe", submissions, out)
    for name, like in ODD_FOLDERS.items():
        shutil.copytree(CLASS / like, submissions / name, ignore=shutil.ignore_patterns("__pycache__"))
    os.mkdir(os.path.join(os.fsencode(submissions), b"not-utf8-\xff"))
    shutil.copy(CLASS / "honest" / "softmax.py", os.path.join(os.fsencode(submissions), b"not-utf8-\xff", b"softmax.py"))
    (submissions / "linked").symlink_to(ROOT / "reference")   # its softmax.py is the reference
    before = snapshot(submissions)
    dirs = watched_dirs(base)
    planted_before = planted_files(dirs)
    command = [str(KATA), "grade", str(submissions), "--out", str(out), "--katas", ",".join(KATAS), "-j", "2"]
    # A classmate's correct softmax, left in a keyring that the grader's processes inherit (the
    # session keyring of this process), as a classmate's sandbox could once leave it.
    key = keyring_add(CLASSMATE_KEY, (ROOT / "reference" / "softmax.py").read_bytes())
    # Its own session: a learner signalling the grader's process group must not reach pytest.
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=base,
                            env={**os.environ, "NO_COLOR": "1"}, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    keyring_revoke(key)
    out_after = snapshot(out) if out.is_dir() else {}
    time.sleep(3)   # long enough for a process left behind to rewrite OUT
    out_later = snapshot(out) if out.is_dir() else {}
    survivors = daemon_pids()
    for pid in survivors:   # started by the daemon learner: end it, then fail the test that says so
        os.kill(pid, signal.SIGKILL)
    planted = planted_files(watched_dirs(base)) - planted_before
    for path in planted:
        if base not in path.parents:   # the class's folders go as a whole below
            path.unlink()

    def results(learner):
        return json.loads((out / learner / "results.json").read_text(encoding="utf-8"))

    grades = list(csv.reader((out / "grades.csv").open(encoding="utf-8"))) if (out / "grades.csv").exists() else []
    yield SimpleNamespace(proc=proc, stdout=stdout, stderr=stderr, out=out, before=before, after=snapshot(submissions),
                          out_after=out_after, out_later=out_later, survivors=survivors, planted=planted,
                          grades=grades, results=results)
    shutil.rmtree(base, ignore_errors=True)


def keyring_add(description: str, payload: bytes) -> int:
    """A user key in this process's session keyring (revoked after a minute at the latest)."""
    import ctypes

    import pyseccomp

    libc, arch = ctypes.CDLL(None, use_errno=True), pyseccomp.system_arch()
    serial = libc.syscall(pyseccomp.resolve_syscall(arch, "add_key"), b"user", description.encode(), payload,
                          len(payload), -3)   # KEY_SPEC_SESSION_KEYRING
    assert serial > 0, os.strerror(ctypes.get_errno())
    libc.syscall(pyseccomp.resolve_syscall(arch, "keyctl"), 15, serial, 60)   # KEYCTL_SET_TIMEOUT
    return serial


def keyring_revoke(serial: int):
    import ctypes

    import pyseccomp

    ctypes.CDLL(None).syscall(pyseccomp.resolve_syscall(pyseccomp.system_arch(), "keyctl"), 3, serial)   # REVOKE


def shown(learner: str) -> str:
    """The learner's name as grades.csv writes it: a formula's gets a leading quote."""
    return f"'{learner}" if learner == FORMULA else learner


def checks_of(graded, learner, slug):
    prefix = f"{slug}: "
    return {t["name"]: t for t in graded.results(learner)["tests"] if t["name"].startswith(prefix)}


def row(graded, learner) -> dict[str, float]:
    header, *rows = graded.grades
    found = next(r for r in rows if r[0] == shown(learner))
    return {k: float(v) for k, v in zip(header[1:], found[1:]) if not k.endswith(" status")}


def submitted(learner) -> set[str]:
    if learner == "huge":
        return {"softmax"}
    return {find(p.name).slug for p in (CLASS / COPIES.get(learner, learner)).glob("*.py")}


def test_grading_finishes_with_a_complete_result(graded):
    assert graded.proc.returncode == 0, graded.stderr[-3000:]
    header, *rows = graded.grades
    assert header == ["learner", *KATAS, "total", "max", *(f"{slug} status" for slug in KATAS)]
    assert [r[0] for r in rows] == [shown(learner) for learner in LEARNERS]
    checks = sum(len(find(slug).checks) for slug in KATAS)
    for learner in LEARNERS:
        result = graded.results(learner)
        assert {"score", "execution_time", "output", "visibility", "stdout_visibility", "tests"} <= set(result)
        assert len(result["tests"]) == checks and all(t["name"].split(": ")[0] in KATAS for t in result["tests"])
        for test in result["tests"]:
            assert {"name", "number", "score", "max_score", "status", "output", "visibility"} <= set(test), learner
            assert test["status"] in ("passed", "failed") and 0 <= test["score"] <= test["max_score"], (learner, test)
        scores = row(graded, learner)
        assert scores["total"] == pytest.approx(result["score"]) == pytest.approx(sum(t["score"] for t in result["tests"]))
        assert scores["max"] == pytest.approx(sum(t["max_score"] for t in result["tests"]))


def test_the_controls_are_graded_as_written(graded):
    """The honest learner gets every point and each control some but not all of its kata's: so a
    trick's score above its control's, or a trick that costs points, both show."""
    maximum = {slug: sum(t["max_score"] for t in checks_of(graded, "honest", slug).values()) for slug in KATAS}
    assert row(graded, "honest") == pytest.approx({**maximum, "total": sum(maximum.values()), "max": sum(maximum.values())})
    for slug, control in [*CONTROLS.items(), ("softmax", "control-banned"), ("mha", "control-mha-sdpa")]:
        assert 0 < row(graded, control)[slug] < maximum[slug], (control, row(graded, control))


@pytest.mark.parametrize("learner", list(TRICKS))
def test_no_trick_earns_a_point(graded, learner):
    trick = TRICKS[learner]
    unearned, unexpected = [], []
    for slug in KATAS:
        control = trick.control or CONTROLS[slug]
        got, want = checks_of(graded, learner, slug), checks_of(graded, control, slug)
        if slug not in submitted(learner):
            want = {name: dict(test, score=0) for name, test in want.items()}   # no file, no points
        assert got.keys() == want.keys()
        unearned += [f"{name}: {got[name]['score']:g} where {control} has {want[name]['score']:g}\n"
                     f"    {got[name]['output'][:300]}" for name in got if got[name]["score"] > want[name]["score"]]
        # Code that hides its calls (importlib, sys.modules, ...) loses its structure checks' points too.
        same = all(got[name]["score"] == want[name]["score"]
                   or (got[name]["score"] < want[name]["score"]
                       and any(code in got[name]["output"] for code in ("banned-api", "tampering")))
                   for name in got)
        zero = all(test["score"] == 0 for test in got.values())
        if not {"same": same, "zero": zero, "same-or-zero": same or zero, "at-most": True}[trick.expect]:
            unexpected.append(f"{slug}: {row(graded, learner)[slug]:g} points, expected {trick.expect} "
                              f"({control} has {row(graded, control)[slug]:g})")
    assert not unearned, f"{learner} earned points its computation did not:\n" + "\n".join(unearned)
    assert not unexpected, f"{learner}: " + "; ".join(unexpected)


def test_odd_folders_are_refused_one_by_one_and_listed(graded):
    summary = (graded.out / "summary.md").read_text(encoding="utf-8")
    for name in [*ODD_FOLDERS, "linked", "not-utf8-\\xff"]:
        assert f"| `{name}` |" in summary, name
    assert (graded.out / "grades.csv").is_file() and (graded.out / "summary.md").is_file()


def test_look_alike_names_are_graded_apart_and_named(graded):
    summary = (graded.out / "summary.md").read_text(encoding="utf-8")
    assert "names look alike" in summary and f"`{LOOKALIKE}` {ascii(LOOKALIKE)}" in summary
    assert row(graded, LOOKALIKE) == row(graded, "honest")


def test_submissions_are_left_byte_identical(graded):
    assert {k: v for k, v in graded.after.items() if k in graded.before} == graded.before
    assert sorted(graded.after.keys() - graded.before.keys()) == []


def test_reports_stay_small_whatever_is_printed(graded):
    for learner in LEARNERS:
        assert len((graded.out / learner / "results.json").read_bytes()) < 1_000_000, learner
        assert len((graded.out / learner / "feedback.md").read_bytes()) < 1_000_000, learner


def test_nothing_is_planted_or_forged_outside_the_sandbox(graded):
    """conftest.py, results.json and grades.csv that learners try to leave in the kit, the class's
    folders, OUT and the parents of all these (cleaned up by the fixture): none but in world-writable
    temporary directories, and no file of OUT carries a learner's forgery."""
    temporary = {Path("/tmp"), Path(tempfile.gettempdir())}
    assert sorted(p for p in graded.planted if p.parent not in temporary) == []
    assert sorted(name for name, data in graded.out_after.items() if MARK.encode() in data) == []


def test_no_learner_process_outlives_the_run(graded):
    assert graded.survivors == [], "the daemon learner's process survived its sandbox (ended by the test)"
    assert graded.out_later == graded.out_after, "OUT changed after `kata grade` had finished"


def test_the_sandbox_user_cannot_reach_the_kit_the_class_or_out(graded):
    """The probe answers right only when it runs unprivileged and every read, listing and write of
    the reference, the graders, the submissions and OUT is refused; else it says what it could do.
    (Its imports, os and glob, cost it the structure check: `tampering`, which says nothing here.)"""
    tests = checks_of(graded, "probe", "softmax")
    failed = {name: t["output"][:600] for name, t in tests.items()
              if t["status"] != "passed" and "Diagnosis: tampering" not in t["output"]}
    assert not failed, "\n".join(f"{name}: {output}" for name, output in failed.items())
