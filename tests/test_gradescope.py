"""`kata gradescope`: the real zip, unpacked into a temporary autograder root, its setup.sh run for
real (a virtual environment with torch and the kit's wheel, about 30 s, once per session), then its
run_autograder on submissions as Gradescope would run it: as here, and in a container that refuses
the namespaces bubblewrap makes, as Gradescope's does (tests/docker_seccomp.py), where learner
code that reads the kit, writes the results or reaches the other pair earns nothing by it."""
import csv
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from conftest import KATA, needs_bwrap
from graders.classroom.batch import LANDLOCK
from graders.engine.manifest import ROOT, find
from graders.engine.worker import landlock_abi

# One autograder, built and set up once: one worker runs them all.
pytestmark = [needs_bwrap, pytest.mark.xdist_group("gradescope")]

KATAS = [find("softmax"), find("causal-mask")]
MAX_SCORE = sum(k.max_score for k in KATAS)

# Gradescope's documented results.json fields
# (https://gradescope-autograders.readthedocs.io/en/latest/specs/#output-format); strict, so that
# a misspelt field fails here rather than being ignored by Gradescope.
VISIBILITY = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
FORMAT = {"enum": ["text", "simple_format", "html", "md", "ansi"]}
RESULTS_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "anyOf": [{"required": ["score"]}, {"required": ["tests"]}],
    "properties": {
        "score": {"type": "number"},
        "execution_time": {"type": "number"},
        "output": {"type": "string"},
        "output_format": FORMAT,
        "test_output_format": FORMAT,
        "test_name_format": FORMAT,
        "visibility": VISIBILITY,
        "stdout_visibility": VISIBILITY,
        "extra_data": {"type": "object"},
        "tests": {"type": "array", "items": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "score": {"type": "number"},
                "max_score": {"type": "number"},
                "status": {"enum": ["passed", "failed"]},
                "name": {"type": "string"},
                "name_format": FORMAT,
                "number": {"type": "string"},
                "output": {"type": "string"},
                "output_format": FORMAT,
                "tags": {"type": "array", "items": {"type": "string"}},
                "visibility": VISIBILITY,
                "extra_data": {"type": "object"},
            },
        }},
        "leaderboard": {"type": "array", "items": {
            "type": "object", "required": ["name", "value"],
            "properties": {"name": {"type": "string"}, "order": {"enum": ["asc", "desc"]}},
        }},
    },
}


def unpack(zip_path: Path) -> Path:
    """A fresh autograder root laid out as Gradescope does: the zip in source/, run_autograder
    copied beside it. Not under pytest's tmp_path: that is root-only, and the sandbox's
    unprivileged user must reach the venv's interpreter inside the root."""
    root = Path(tempfile.mkdtemp(prefix="autograder-"))
    root.chmod(0o755)
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(root / "source")
        for info in zf.infolist():   # like unzip: the modes recorded in the zip
            (root / "source" / info.filename).chmod(info.external_attr >> 16 & 0o777)
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")
    return root


def run_autograder(root: Path, files: dict[str, str | Path]) -> dict:
    """Grade a submission (file name -> source text, or a symlink's target) and return the
    results.json run_autograder left, checked against Gradescope's fields."""
    return autograde(root, files)[0]


def autograde(root: Path, files: dict[str, str | Path], launcher: tuple[str, ...] = (),
              users: list[dict] | None = None, created_at: str | None = None) -> tuple[dict, str]:
    """run_autograder's results.json and its stdout (what instructors see); ``launcher``: the
    command that runs it (a container's limits); ``users`` and ``created_at``: the submitters and
    when Gradescope took the submission, as its submission_metadata.json says (none: no metadata,
    as when the autograder is tried by hand)."""
    import jsonschema   # here, not at collection: it takes most of a second
    submission = root / "submission"
    shutil.rmtree(submission, ignore_errors=True)
    shutil.rmtree(root / "results", ignore_errors=True)
    (root / "submission_metadata.json").unlink(missing_ok=True)
    if users is not None:
        (root / "submission_metadata.json").write_text(json.dumps(
            {"id": 123456, "users": users, **({"created_at": created_at} if created_at else {})}))
    submission.mkdir()
    for name, content in files.items():
        (submission / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            (submission / name).symlink_to(content)
        else:
            (submission / name).write_text(content, encoding="utf-8")
    done = subprocess.run([*launcher, str(root / "run_autograder")], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "KATA_AUTOGRADER_ROOT": str(root)}, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))
    jsonschema.validate(results, RESULTS_SCHEMA)
    return results, done.stdout


@pytest.fixture(scope="module")
def zip_path(tmp_path_factory):
    out = tmp_path_factory.mktemp("gradescope") / "autograder.zip"
    done = subprocess.run([str(KATA), "gradescope", "--out", str(out), "--katas", "softmax,causal-mask"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.fixture(scope="module")
def installed(zip_path):
    """An autograder root after a real setup.sh. KATA_TORCH_INDEX_URL is emptied so that torch
    comes from pip's configured index (the default, PyTorch's CPU index, needs the internet)."""
    root = unpack(zip_path)
    try:
        done = subprocess.run(["bash", str(root / "source" / "setup.sh")], cwd=root / "source",
                              capture_output=True, text=True, timeout=900,
                              env={**os.environ, "KATA_AUTOGRADER_ROOT": str(root), "KATA_TORCH_INDEX_URL": ""})
        assert done.returncode == 0, done.stdout + done.stderr
        yield root
    finally:
        shutil.rmtree(root)


def test_zip_holds_the_scripts_a_wheel_of_the_kit_and_the_katas(zip_path):
    with zipfile.ZipFile(zip_path) as zf:
        modes = {i.filename: i.external_attr >> 16 & 0o777 for i in zf.infolist()}
        config = json.loads(zf.read("config.json"))
        wheel, = [n for n in modes if n.endswith(".whl")]
        with zf.open(wheel) as f, zipfile.ZipFile(f) as whl:
            packed = set(whl.namelist())
    assert modes["setup.sh"] == modes["run_autograder"] == 0o755
    assert set(modes) == {"setup.sh", "run_autograder", "config.json", "class.json", wheel}
    assert modes["class.json"] == 0o600   # the class's secret: root's alone in the image
    assert config["katas"] == ["softmax", "causal-mask"]
    assert "triton" not in config   # no Triton kata: setup.sh installs no Triton
    assert {"cli.py", "reference/softmax.py", "graders/softmax.py", "katas/softmax/kata.toml"} <= packed


def test_reference_submission_gets_full_marks(installed):
    results = run_autograder(installed, {k.learner_file: k.reference_path.read_text(encoding="utf-8")
                                         for k in KATAS})
    assert results["score"] == MAX_SCORE
    assert len(results["tests"]) == sum(len(k.checks) for k in KATAS)
    assert all(t["status"] == "passed" for t in results["tests"])
    # learner code ran as another user; the wheel with the reference must stay out of its reach
    assert stat.S_IMODE((installed / "source").stat().st_mode) & 0o077 == 0


# Right except along axes of odd length: which draws catch it depends on the inputs drawn.
ODD_AXES = """import numpy as np

def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    out = e / e.sum(axis=axis, keepdims=True)
    return out if x.shape[axis] % 2 == 0 else out * (1 + 1e-3)
"""


def test_a_re_run_of_a_submission_gets_the_same_grade(installed):
    """Gradescope re-runs a submission (a regrade request, a changed autograder): the zip's
    class.json fixes every input, so the same file gets the very same tests."""
    first = run_autograder(installed, {"softmax.py": ODD_AXES})
    again = run_autograder(installed, {"softmax.py": ODD_AXES})
    assert 0 < first["score"] < MAX_SCORE
    assert first["tests"] == again["tests"]


def test_empty_submission_scores_zero_and_says_what_is_missing(installed):
    results = run_autograder(installed, {})
    assert results["score"] == 0
    assert all(t["status"] == "failed" for t in results["tests"])
    text = json.dumps(results)
    assert all(f"No {k.learner_file} was submitted." in text for k in KATAS)


def test_each_student_draws_inputs_of_their_own_and_keeps_them_on_resubmission(installed):
    """Seeds come from the class's secret and the submitters' Gradescope ids (submission_metadata.json):
    a wrong softmax shows two students other failing values, and a student resubmitting the same
    ones; a name or an address of theirs plays no part."""
    def shown(user_id, name):
        results, stdout = autograde(installed, {"softmax.py": OVERFLOW},
                                    users=[{"email": f"{name}@example.com", "id": user_id, "name": name}])
        failed = [t["output"] for t in results["tests"] if t["status"] == "failed"]
        assert failed and f"student-{user_id}" in stdout, stdout   # summary.md names the learner by id
        return failed

    ada, bob = shown(1201, "Ada"), shown(1202, "Bob")
    assert ada != bob
    assert shown(1201, "Ada Lovelace") == ada


def test_a_late_submission_loses_the_late_policys_share_as_a_test_of_its_own(installed):
    """`kata gradescope --due ... --late-penalty 10%/day` keeps the deadline in the zip's class
    file; the time Gradescope took the submission (submission_metadata.json) decides the penalty."""
    class_file = installed / "source" / "class.json"
    saved = class_file.read_text()
    rules = json.loads(saved)
    class_file.write_text(json.dumps({**rules, "deadline": {"due": "2026-12-01T23:59:00+00:00",
                                                             "penalty": "10%/day"}}))
    user = [{"email": "ada@example.com", "id": 1201, "name": "Ada"}]
    try:
        late, _ = autograde(installed, {k.learner_file: k.reference_path.read_text() for k in KATAS}, users=user,
                            created_at="2026-12-02T09:00:00.000000-08:00")   # 17 hours late: one day
    finally:
        class_file.write_text(saved)
    penalty, = [t for t in late["tests"] if t["name"] == "late penalty"]
    assert penalty["score"] == pytest.approx(-0.1 * MAX_SCORE) and penalty["max_score"] == 0
    assert late["score"] == pytest.approx(0.9 * MAX_SCORE) and "1 day(s) after the due date" in late["output"]


def test_files_as_students_hand_them_in_are_found_and_listed(installed):
    """What zipping a folder gives (hw3/...), and a browser's second download of a file."""
    softmax, mask = KATAS
    results, stdout = autograde(installed, {"hw3/softmax.py": softmax.reference_path.read_text(),
                                            "causal-mask (1).py": mask.reference_path.read_text()})
    assert results["score"] == MAX_SCORE
    assert "No softmax.py was submitted, so `hw3/softmax.py`, the one file named like it, was graded." in \
        results["output"]
    assert "Files submitted:\n./causal-mask (1).py\n./hw3/softmax.py\n" in stdout


def test_crashing_submission_scores_zero(installed):
    results = run_autograder(installed, {"softmax.py": "import os\nos._exit(0)\n",
                                         "causal_mask.py": "def causal_mask(T:\n"})
    assert results["score"] == 0
    assert len(results["tests"]) == sum(len(k.checks) for k in KATAS)


def test_a_symlink_to_the_installed_reference_earns_nothing(installed):
    reference, = (installed / "venv").glob("lib/python3*/site-packages/reference/softmax.py")
    results = run_autograder(installed, {"softmax.py": reference})
    assert results["score"] == 0


def test_failing_kata_grade_still_writes_results(installed, zip_path):
    # another root on the same installation, configured with a kata `kata grade` refuses
    root = unpack(zip_path)
    try:
        (root / "venv").symlink_to(installed / "venv")
        (root / "source" / "config.json").write_text(json.dumps({"katas": ["no-such-kata"]}), encoding="utf-8")
        results = run_autograder(root, {"softmax.py": "print('hi')\n"})
    finally:
        shutil.rmtree(root)
    assert results["score"] == 0 and "tests" not in results
    assert results["output"].startswith("Grading failed (kata grade exit status 2)")


def test_a_courses_own_kata_in_the_zip_is_graded(installed):
    """`kata --katas-dir DIR gradescope` puts a course's own kata (docs/teaching.md, "An exercise
    of your own") in the zip under katas/, where run_autograder finds it."""
    from test_course_kata import LOOPS, guide_files

    folder = installed / "source" / "katas" / "qk-scores"
    folder.mkdir(parents=True)
    for name, text in guide_files().items():
        (folder / name).write_text(text)
    config = installed / "source" / "config.json"
    saved = config.read_text()
    config.write_text(json.dumps({**json.loads(saved), "katas": ["qk-scores"]}))
    try:
        results, _ = autograde(installed, {"qk_scores.py": LOOPS})
    finally:
        config.write_text(saved)
        shutil.rmtree(installed / "source" / "katas")
    assert results["score"] == 3 and [t["status"] for t in results["tests"]] == ["passed", "passed"], results


def test_missing_setup_still_writes_results(zip_path):
    root = unpack(zip_path)   # setup.sh never ran: no venv
    try:
        results = run_autograder(root, {"softmax.py": "print('hi')\n"})
    finally:
        shutil.rmtree(root)
    assert results["score"] == 0
    assert "setup.sh did not finish" in results["output"]


# --- in a container that refuses namespaces (Docker's default seccomp profile, Gradescope's) -------

CONTAINER = (sys.executable, str(Path(__file__).with_name("docker_seccomp.py")))
in_a_container = pytest.mark.skipif(os.geteuid() != 0 or platform.machine() != "x86_64",
                                    reason="Docker's seccomp profile is imitated for x86_64, and as root")
CAUSAL_MASK = find("causal-mask")
ATTEMPT = '''
import json, os, signal, sys, time
tried = {"ok": [], "denied": {}}   # what succeeded; what failed, as {what: {exception: times}}
def attempt(what, action, target=""):
    try:
        action()
    except Exception as exc:
        counts = tried["denied"].setdefault(what, {})
        counts[type(exc).__name__] = counts.get(type(exc).__name__, 0) + 1
    else:
        tried["ok"].append(f"{what} {target}")
'''


def site_packages(root: Path) -> Path:
    found, = (root / "venv").glob("lib/python3*/site-packages")
    return found


def attack(installed: Path, softmax: str) -> tuple[dict, dict, str]:
    """Grade softmax.py = ``softmax`` beside a correct causal_mask.py in the container; returns
    results.json, what the attack reported (its import raises a RuntimeError carrying the report
    as JSON) and the autograder's stdout."""
    results, stdout = autograde(installed, {"softmax.py": ATTEMPT + softmax,
                                            "causal_mask.py": CAUSAL_MASK.reference_path.read_text()}, CONTAINER)
    assert "tests" in results, results["output"]
    text = next(t["output"] for t in results["tests"] if "ATTACK " in t["output"])
    report = json.loads(text.split("ATTACK ", 1)[1].splitlines()[0])
    return results, report, stdout


def causal_mask_score(results: dict) -> float:
    return sum(t["score"] for t in results["tests"] if t["name"].startswith("causal-mask: "))


def _cmdline_has(pid: str, token: str) -> bool:
    try:
        return token.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@in_a_container
def test_bwrap_cannot_make_a_sandbox_under_dockers_seccomp_profile():
    done = subprocess.run([*CONTAINER, "bwrap", "--unshare-pid", "--ro-bind", "/", "/", "true"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "Operation not permitted" in done.stderr, done.stderr
    done = subprocess.run([*CONTAINER, sys.executable, "-c", "from graders.engine import bwrap; print(bwrap.problem())"],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.startswith("bubblewrap (bwrap) could not start a sandbox here"), done.stdout + done.stderr


@in_a_container
def test_in_a_container_a_correct_submission_gets_full_marks_as_another_user(installed):
    results, stdout = autograde(installed, {k.learner_file: k.reference_path.read_text(encoding="utf-8")
                                            for k in KATAS}, CONTAINER)
    assert results["score"] == MAX_SCORE, results["output"]
    assert all(t["status"] == "passed" for t in results["tests"])
    assert "Sandbox: container" in stdout   # summary.md, shown to instructors
    assert LANDLOCK[landlock_abi() > 0] in " ".join(stdout.split())   # what learner code could read, said
    # what the sandbox user must not read: the kit as installed, its source, the grades
    site = site_packages(installed)
    private = [site / "reference", site / "graders", site / "katas", site / "cli.py",
               *site.glob("attention_katas-*.dist-info"), *site.glob("__pycache__/cli.*.pyc"),
               installed / "source", installed / "results"]
    assert len(private) == 8 and all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in private)


@in_a_container
def test_in_a_container_learner_code_reads_neither_the_kit_nor_its_source(installed):
    site = site_packages(installed)
    wheel, = (installed / "source").glob("*.whl")
    # A clone of the kit beside the installed one, readable by all, as a checkout mounted in a
    # grading image is: the kit cannot protect it by permissions, so learner code must not reach it.
    clone = Path(tempfile.mkdtemp(prefix="kata-clone-"))
    shutil.copytree(ROOT / "reference", clone / "reference")
    for path in [clone, *clone.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    files = [site / "reference" / "softmax.py", site / "graders" / "softmax_hidden.py", site / "cli.py",
             *site.glob("__pycache__/cli.*.pyc"), *site.glob("attention_katas-*.dist-info/RECORD"), wheel,
             installed / "source" / "config.json", clone / "reference" / "softmax.py"]
    folders = [site / "reference", installed / "source", clone / "reference"]
    try:
        results, report, _ = attack(installed, f'''
for path in {json.dumps(list(map(str, files)))}:
    attempt("read " + path, lambda path=path: open(path, "rb").read(1))
for path in {json.dumps(list(map(str, folders)))}:
    attempt("list " + path, lambda path=path: os.listdir(path))
def reference():
    from reference.softmax import softmax
attempt("import reference.softmax", reference)
raise RuntimeError("ATTACK " + json.dumps(tried))
''')
    finally:
        shutil.rmtree(clone)
    assert report["ok"] == [] and len(report["denied"]) == len(files) + len(folders) + 1, report
    assert causal_mask_score(results) == CAUSAL_MASK.max_score and results["score"] == CAUSAL_MASK.max_score


@in_a_container
def test_in_a_container_learner_code_cannot_write_the_results(installed):
    """At once; nor later, from a daemon meant to forge results.json once grading is over: a pair
    that starts a process is stopped."""
    results_json = installed / "results" / "results.json"
    results, report, _ = attack(installed, f'''
attempt("write at once", lambda: open({str(results_json)!r}, "w").write("{{}}"))
attempt("list", lambda: os.listdir({str(results_json.parent)!r}))
raise RuntimeError("ATTACK " + json.dumps(tried))
''')
    assert report["ok"] == [] and set(report["denied"]) == {"write at once", "list"}, report
    assert json.loads(results_json.read_text()) == results
    assert causal_mask_score(results) == CAUSAL_MASK.max_score

    token = f"kata-attack-{os.getpid()}"
    daemon = f"import json, time\nfor _ in range(600):\n    open({str(results_json)!r}, 'w').write('{{}}')\n    time.sleep(0.1)\n"
    results, _ = autograde(installed, {"softmax.py": "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', "
                                                     f"{daemon!r}, {token!r}], start_new_session=True)\n",
                                       "causal_mask.py": CAUSAL_MASK.reference_path.read_text()}, CONTAINER)
    time.sleep(1.0)   # a daemon that outlived grading would write now
    assert json.loads(results_json.read_text()) == results
    softmax = [t for t in results["tests"] if t["name"].startswith("softmax: ")]
    assert softmax and all(t["score"] == 0 for t in softmax)
    assert any("your code started a process during importing softmax.py" in t["output"] for t in softmax)
    assert causal_mask_score(results) == CAUSAL_MASK.max_score
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _cmdline_has(pid, token)]


@in_a_container
def test_in_a_container_a_pair_makes_no_file_anywhere(installed):
    """The container's /tmp, /dev/shm and disk are every pair's: a pair that could make a file there
    could leave its code for a classmate's pair to run, or fill the disk under the class's grades
    (issue 42, class E). A worker makes no file, folder, link or node anywhere, nor an IPC object
    another pair could open, and changes no mode; the one file it holds, its own copy of the
    learner's file, is capped in size."""
    results, report, _ = attack(installed, '''
for folder in ("/tmp", "/dev/shm", "/var/tmp", "."):
    path = os.path.join(folder, "kata-left-for-a-classmate")
    attempt("create in " + folder, lambda path=path: open(path, "w").write("def softmax(x, axis=-1): ..."))
    attempt("mkdir in " + folder, lambda path=path: os.mkdir(path + ".d"))
    attempt("fifo in " + folder, lambda path=path: os.mkfifo(path + ".fifo"))
    attempt("link in " + folder, lambda path=path: os.symlink("/etc/passwd", path + ".link"))
    attempt("tmpfile in " + folder, lambda folder=folder: os.close(os.open(folder, os.O_TMPFILE | os.O_RDWR)))
attempt("chmod its folder", lambda: os.chmod(".", 0o777))
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def made(result):
    if result < 0:
        raise OSError(ctypes.get_errno(), "refused")
attempt("a SysV message queue", lambda: made(libc.msgget(0x6b617461, 0o1666)))
attempt("a SysV semaphore set", lambda: made(libc.semget(0x6b617461, 1, 0o1666)))
attempt("a POSIX message queue", lambda: made(libc.mq_open(b"/kata-left", 0o100 | 0o2, 0o666, None)))
def fill():
    with open(__file__, "ab") as f:   # its own copy: the one file it may write
        for _ in range(128):
            f.write(b"#" * (1 << 20))
attempt("grow its copy to 128 MB", fill)
raise RuntimeError("ATTACK " + json.dumps(tried))
''')
    assert report["ok"] == [], report
    assert len(report["denied"]) == 4 * 5 + 5, report
    assert causal_mask_score(results) == CAUSAL_MASK.max_score and results["score"] == CAUSAL_MASK.max_score


@in_a_container
def test_in_a_container_learner_code_reaches_no_other_pair_nor_the_grading_folder(installed):
    """The other kata's worker, the grader and its zygotes (signals, /proc), the grading folder
    whose path the grader's command line shows, other sandboxes' folders, the submission itself."""
    results, report, _ = attack(installed, f'''
me, grader, seen = os.getpid(), None, set()
deadline = time.time() + 4   # while the other pair is graded too (one grading process each)
while time.time() < deadline:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me or pid in seen:
            continue
        try:
            argv = open(f"/proc/{{pid}}/cmdline", "rb").read().decode(errors="replace").split("\\0")
        except OSError:
            continue
        if "--out" in argv and "grade" in argv:   # kata grade SUBMISSIONS --out OUT: the copy and the grades
            grader = argv   # (not another command with an --out, which tests running beside this one start)
        if "--out" in argv or any(a.endswith("worker.py") or "multiprocessing" in a for a in argv):
            seen.add(pid)
            attempt("kill", lambda pid=pid: os.kill(int(pid), signal.SIGKILL), pid)
            attempt("read environ", lambda pid=pid: open(f"/proc/{{pid}}/environ", "rb").read(1), pid)
            attempt("read mem", lambda pid=pid: open(f"/proc/{{pid}}/mem", "rb").read(1), pid)
    time.sleep(0.2)
tried["grader found"] = grader is not None
if grader:
    out, subs = grader[grader.index("--out") + 1], grader[grader.index("grade") + 1]
    attempt("list the grading folder", lambda: os.listdir(os.path.dirname(out)))
    attempt("read the copy of causal_mask.py", lambda: open(subs + "/submission/causal_mask.py").read())
    attempt("write OUT's results.json", lambda: open(out + "/submission/results.json", "w").write("{{}}"))
attempt("change the submitted causal_mask.py", lambda: open({str(installed / "submission" / "causal_mask.py")!r}, "a"))
try:
    names = sorted(os.listdir("/tmp"))
except OSError:   # under Landlock not even /tmp can be listed
    names = []
for name in names:
    path = "/tmp/" + name
    if name.startswith(("kata-sandbox-", "kata-zygote-")) and path != os.getcwd() and os.stat(path).st_uid != os.getuid():
        attempt("list another sandbox's folder", lambda path=path: os.listdir(path), path)
raise RuntimeError("ATTACK " + json.dumps(tried))
''')
    assert report["grader found"] and report["ok"] == [], report
    # a process that ends between being listed and signalled (other gradings' workers come and go)
    # is ProcessLookupError: gone, never reached; every other kill was refused
    assert set(report["denied"]["kill"]) <= {"PermissionError", "ProcessLookupError"}, report
    assert report["denied"]["kill"].get("PermissionError", 0) >= 2, report   # the grader, its zygotes and workers
    assert causal_mask_score(results) == CAUSAL_MASK.max_score and results["score"] == CAUSAL_MASK.max_score


# --- a class in every submission form, graded both ways --------------------------------------------

OVERFLOW = ("import numpy as np\n\ndef softmax(x, axis=-1):\n"
            "    e = np.exp(x)   # no max subtracted: overflows for large logits\n"
            "    return e / e.sum(axis=axis, keepdims=True)\n")


def handed_in_notebooks(tmp_path: Path, solutions: dict[str, str | tuple[str, str]]) -> dict[str, str]:
    """name -> the notebook `kata notebook softmax` writes, its solution cell (after the kata's
    marker line) holding ``solutions[name]``, saved as Jupyter saves it (source as a list of lines).
    A pair (above, code): ``above`` in a code cell of the learner's own above the solution cell."""
    from graders.practice.notebook import SOLUTION_TAG, marker

    done = subprocess.run([str(KATA), "notebook", "softmax", "--workspace", str(tmp_path / "ws")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    written = json.loads((tmp_path / "ws" / "softmax.ipynb").read_text(encoding="utf-8"))
    made = {}
    for name, code in solutions.items():
        nb = json.loads(json.dumps(written))
        at, cell = next((i, c) for i, c in enumerate(nb["cells"]) if SOLUTION_TAG in c["metadata"].get("tags", []))
        assert cell["source"].startswith(marker(KATAS[0]) + "\n")
        above, code = code if isinstance(code, tuple) else (None, code)
        cell["source"] = (marker(KATAS[0]) + "\n" + code).splitlines(keepends=True)
        if above is not None:
            nb["cells"].insert(at, {"cell_type": "code", "id": "own", "metadata": {}, "execution_count": None,
                                    "outputs": [], "source": above.splitlines(keepends=True)})
        made[name] = json.dumps(nb, indent=1) + "\n"
    return made


def test_a_class_in_every_submission_form_gets_the_same_grades_from_kata_grade_and_gradescope(installed, tmp_path):
    """Nine learners handing in every form the kit accepts (the expected name, a notebook,
    a case variant, `-` for `_`, a browser's " (1)" copy, one folder down, two candidates for one
    kata, nothing), right and buggy code; `kata grade` and the Gradescope autograder both give
    each the total its checks add up to, and say which file they graded (the autograder, a run
    per submission, for the five whose files differ in kind: a notebook, copies, a folder, two
    candidates, nothing). Each kata's file in each form is some learner's; a class of every file
    right under the expected names is test_reference_submission_gets_full_marks's submission (and
    test_batch's alice)."""
    softmax, mask = KATAS
    ref_softmax, ref_mask = softmax.reference_path.read_text(), mask.reference_path.read_text()
    # Query i sees keys 0..i (is_causal=True's alignment): wrong for every rectangular mask, whose
    # shapes the checks fix, so the score does not depend on the inputs drawn.
    top_left = ref_mask.replace("return ones.tril(n_keys - n_queries)", "return ones.tril()")
    assert top_left != ref_mask
    # dan's import sits in a cell of its own above the solution: graded, as nbgrader runs the notebook
    imported, rest = OVERFLOW.split("\n", 1)
    notebooks = handed_in_notebooks(tmp_path, {"softmax.ipynb": ref_softmax, "Softmax.ipynb": (imported, rest)})
    # Per kata: full marks, the points a known bug loses, or nothing.
    FULL_S, FULL_M = softmax.max_score, mask.max_score
    OVERFLOW_S = FULL_S - softmax.checks["stable-for-large-logits"]                  # 10 - 2 = 8
    TOP_LEFT_M = (FULL_M - mask.checks["rectangular-masks-bottom-right"]   # 12 - 2 - 1 = 9
                  - mask.checks["causal-and-padding-combined"])
    assert (FULL_S, FULL_M, OVERFLOW_S, TOP_LEFT_M) == (10, 12, 8, 9)
    renamed = "No {} was submitted, so `{}`, the one file named like it, was graded."
    both = ("`Softmax.py` and `hw3/softmax.py` could each be your softmax.py, so none was graded: submit one of "
            "them, named softmax.py.")
    CLASS = {   # learner: (files, softmax's score, causal-mask's score, what the feedback says)
        "ben": ({"softmax.ipynb": notebooks["softmax.ipynb"], "causal_mask.py": ref_mask}, FULL_S, FULL_M,
                ["Graded: cell 2 of softmax.ipynb, your code cells in order (the test and check cells left out)."]),
        "cat": ({"Softmax.py": ref_softmax, "Causal_Mask.py": ref_mask}, FULL_S, FULL_M,
                [renamed.format("softmax.py", "Softmax.py"), renamed.format("causal_mask.py", "Causal_Mask.py")]),
        "dan": ({"Softmax.ipynb": notebooks["Softmax.ipynb"], "causal-mask.py": ref_mask}, OVERFLOW_S, FULL_M,
                [renamed.format("softmax.py", "Softmax.ipynb"), renamed.format("causal_mask.py", "causal-mask.py"),
                 "Graded: cells 2 and 3 of Softmax.ipynb, your code cells in order (the test and check cells "
                 "left out)."]),
        "eli": ({"softmax (1).py": ref_softmax, "causal-mask (1).py": top_left}, FULL_S, TOP_LEFT_M,
                [renamed.format("softmax.py", "softmax (1).py"),
                 renamed.format("causal_mask.py", "causal-mask (1).py")]),
        "fox": ({"hw3/softmax.py": ref_softmax, "hw3/causal_mask.py": ref_mask}, FULL_S, FULL_M,
                [renamed.format("softmax.py", "hw3/softmax.py"),
                 renamed.format("causal_mask.py", "hw3/causal_mask.py")]),
        "gia": ({"Softmax.py": ref_softmax, "hw3/softmax.py": ref_softmax, "causal_mask.py": ref_mask}, 0, FULL_M,
                [both]),
        "hal": ({"softmax.py": ref_softmax}, FULL_S, 0, ["No causal_mask.py was submitted."]),
        "ivy": ({"softmax.py": OVERFLOW, "causal_mask.py": top_left}, OVERFLOW_S, TOP_LEFT_M, []),
        "jay": ({"notes.txt": "I ran out of time.\n"}, 0, 0,
                ["No softmax.py was submitted.", "No causal_mask.py was submitted."]),
    }
    expected = {name: s + m for name, (_, s, m, _) in CLASS.items()}
    assert expected == {"ben": 22, "cat": 22, "dan": 20, "eli": 19, "fox": 22, "gia": 12, "hal": 10,
                        "ivy": 17, "jay": 0}
    forms = {form for files, *_ in CLASS.values() for form in files}
    assert {"softmax.py", "causal_mask.py", "softmax.ipynb", "Softmax.py", "Softmax.ipynb", "causal-mask.py",
            "softmax (1).py", "hw3/softmax.py"} <= forms

    def said(results: dict) -> str:
        return "\n".join([results.get("output", ""), *(t.get("output", "") for t in results.get("tests", []))])

    def per_kata(results: dict) -> tuple[float, float]:
        return tuple(sum(t["score"] for t in results["tests"] if t["name"].startswith(f"{k.slug}: ")) for k in KATAS)

    # (1) `kata grade` on the whole class
    subs, out = tmp_path / "subs", tmp_path / "out"
    for learner, (files, *_) in CLASS.items():
        for name, text in files.items():
            (subs / learner / name).parent.mkdir(parents=True, exist_ok=True)
            (subs / learner / name).write_text(text, encoding="utf-8")
    run = subprocess.run([str(KATA), "grade", str(subs), "--out", str(out), "--katas", "softmax,causal-mask"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    with open(out / "grades.csv", newline="") as f:
        rows = {row["learner"]: row for row in csv.DictReader(f)}
    assert {name: float(row["total"]) for name, row in rows.items()} == expected, run.stderr
    assert {name: (float(row["softmax"]), float(row["causal-mask"])) for name, row in rows.items()} == \
        {name: (s, m) for name, (_, s, m, _) in CLASS.items()}
    for learner, (_, _, _, sentences) in CLASS.items():
        feedback = (out / learner / "feedback.md").read_text(encoding="utf-8")
        results = json.loads((out / learner / "results.json").read_text(encoding="utf-8"))
        assert results["score"] == expected[learner], learner
        for sentence in sentences:
            assert sentence in said(results), (learner, sentence)
            if "named like it" in sentence or "could each be" in sentence:
                assert sentence in feedback, (learner, sentence)
        if not any("named like it" in s for s in sentences):
            assert "named like it" not in feedback, learner

    # (2) the Gradescope autograder, one learner's submission at a time, for each kind of file the
    # zip's script hands kata grade (a notebook with a cell of its own, a browser's copies, a
    # folder, two candidates, nothing); the other forms are found by the same code as these
    # (batch.find_submission), and graded in (1).
    for learner in ("dan", "eli", "fox", "gia", "jay"):
        files, s, m, sentences = CLASS[learner]
        results, stdout = autograde(installed, files)
        assert results["score"] == expected[learner], (learner, said(results))
        assert per_kata(results) == (s, m), learner
        assert "Files submitted:\n" + "".join(f"./{name}\n" for name in sorted(files)) in stdout, (learner, stdout)
        for sentence in sentences:
            assert sentence in said(results), (learner, sentence)
