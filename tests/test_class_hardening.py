"""A class run that hostile learners cannot break (issue 24): text no UTF-8 file can hold, files
too large to read, grades.csv cells that are formulas, names that look alike, and links in an
nbgrader course. Each attack goes through the real `kata` command; nbgrader's through a real
course, its exchange and `nbgrader collect`. Each runs as the caller and, when that is root, as a
normal user whose class it is."""
import csv
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

from graders.engine.manifest import find
from graders.engine.structure import TAMPERING

from conftest import KATA, OTHER_UID, WHO, as_user, needs_bwrap

# The nbgrader course is generated once (nbgrader's generate_assignment takes seconds) and copied
# by each test that grades one: one worker runs the module.
pytestmark = [needs_bwrap, pytest.mark.xdist_group("class-hardening")]

REFERENCE = find("softmax").reference_path.read_text()
FULL = find("softmax").max_score
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}   # nbgrader runs alembic
SPARSE = 60 << 30   # st_size of a sparse file: no disk, but read whole it is 60 GB of memory


@dataclasses.dataclass
class Space:
    """The folder of one test's class, and the user whose class it is: the caller, or a normal user
    (``as_user``) who owns everything in it, as an instructor owns their course."""
    root: Path
    user: dict

    def run(self, command: list, **options) -> subprocess.CompletedProcess:
        if self.user:   # what the test put there is handed over before each command
            subprocess.run(["chown", "-R", f"{OTHER_UID}:{OTHER_UID}", str(self.root)], check=True)
        env = {**ENV, "HOME": str(self.root)} if self.user else ENV
        return subprocess.run(command, capture_output=True, env=env, **self.user, **options)

    def kata(self, *args, timeout=600) -> subprocess.CompletedProcess:
        """The installed `kata`, its output kept as bytes: it must be UTF-8 too."""
        return self.run([str(KATA), *map(str, args)], timeout=timeout)

    def nbgrader(self, *args, cwd: Path) -> subprocess.CompletedProcess:
        done = self.run([sys.executable, "-m", "nbgrader", *args], cwd=cwd, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        return done


@pytest.fixture(params=WHO)
def space(request, tmp_path):
    user = as_user(request.param)
    if not user:
        yield Space(tmp_path, {})
        return
    folder = Path(tempfile.mkdtemp(prefix="kata-class-"))   # pytest's own folders are root's alone
    try:
        yield Space(folder, user)
    finally:
        subprocess.run(["rm", "-rf", str(folder)])


def grades(out: Path) -> dict:
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        return {row[0]: row[1:] for row in csv.reader(f)}


def sparse(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(SPARSE)


# --- an nbgrader course ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """A course of one kata (softmax) whose assignment ps1 nbgrader has generated."""
    caller = Space(tmp_path_factory.mktemp("released"), {})
    course = caller.root / "course"
    assert caller.kata("nbgrader", "init", course, "--assignment", "ps1", "--katas", "softmax").returncode == 0
    caller.nbgrader("generate_assignment", "ps1", "--force", cwd=course)
    return course


@pytest.fixture
def course(released, space):
    """A copy of the released course, for one test's students."""
    return Path(shutil.copytree(released, space.root / "course"))


def submit(course: Path, student: str, code: str):
    """``student``'s notebook: the released one, ``code`` in its solution cell."""
    nb = json.loads((course / "release" / "ps1" / "softmax.ipynb").read_text())
    cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("solution"))
    cell["source"] = "".join(cell["source"]).split("\n")[0] + "\n" + code
    (course / "submitted" / student / "ps1").mkdir(parents=True)
    (course / "submitted" / student / "ps1" / "softmax.ipynb").write_text(json.dumps(nb))


def autograde(space: Space, course: Path) -> dict[str, float]:
    """`kata nbgrader autograde`, then each student's score in the gradebook."""
    from nbgrader.api import Gradebook

    run = space.kata("nbgrader", "autograde", course, "ps1", "-j", "2")
    assert run.returncode == 0, run.stderr.decode("utf-8")
    with warnings.catch_warnings(), Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        warnings.filterwarnings("ignore", module="nbgrader")
        return {s.student_id: s.score for s in gb.assignment_submissions("ps1")}


def feedback(course: Path, student: str) -> str:
    return (course / "kata" / "ps1" / student / "feedback.md").read_text(encoding="utf-8")


# --- 1. text no UTF-8 file can hold, from every channel of learner code -----------------------------

def hostile_texts(rng: random.Random) -> list[str]:
    """Random bytes as a learner's code may decode them (surrogateescape: lone surrogates), lone
    surrogates written out, control characters and bidi overrides."""
    noise = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 80))).decode("utf-8", "surrogateescape")
             for _ in range(4)]
    return [*noise, "\ud800", "tail \udfff", "\x00\x1b[2J\rover", "\u202eevil\u202c \u2066x\u2069"]


def hostile_learners(texts: list[str]) -> dict[str, str]:
    """learner -> softmax.py: each sends the texts (T[4] and T[5] hold lone surrogates, written
    out) through one channel; ``ascii`` writes them as plain-ASCII literals. A 10 MB line goes
    along."""
    literal = ascii(texts)
    line = '"x" * 10_000_000'
    return {
        "printer": f"import sys\nT = {literal}\nprint(*T, {line})\nprint(*T, file=sys.stderr)\n"
                   f"def softmax(x, axis=-1):\n    print(*T, {line})\n    return x\n",
        "raiser": f"T = {literal}\nclass Hostile(Exception):\n    pass\n"
                  "Hostile.__module__, Hostile.__qualname__ = T[0], T[4]\n"
                  "Hostile.__name__ = T[-1]   # a type's __name__ holds no surrogate or NUL\n"
                  f"def softmax(x, axis=-1):\n    raise Hostile(''.join(T) + {line})\n",
        "returner": f"T = {literal}\nclass Shown:\n    def __repr__(self):\n        return ''.join(T)\n"
                    "Shown.__module__, Shown.__qualname__ = T[1], T[5]\n"
                    "calls = []\n"
                    f"def softmax(x, axis=-1):\n    calls.append(1)\n"
                    f"    return [''.join(T) + {line}, Shown(), {{T[2]: T[3]}}][len(calls) % 3]\n",
        "crasher": f"import os\nT = {literal}\ndef softmax(x, axis=-1):\n"
                   "    os.write(2, ''.join(T).encode('utf-8', 'surrogatepass') + b'\\xff\\xfe\\n')\n"
                   "    os._exit(3)\n",
        "import-raiser": f"T = {literal}\nraise ValueError(''.join(T) + {line})\n",
        "honest": REFERENCE,
    }


def test_hostile_text_cannot_stop_a_class_run(space):
    seed = 24   # the same draw every run, named in a failure's message
    texts = hostile_texts(random.Random(seed))
    subs, out = space.root / "subs", space.root / "out"
    learners = hostile_learners(texts)
    for name, source in learners.items():
        (subs / name).mkdir(parents=True)
        (subs / name / "softmax.py").write_text(source, encoding="utf-8")
        # Files the kit does not read, named as no UTF-8 text is.
        (subs / name / os.fsdecode(b"\xff\xfe.py")).write_text("x")
    for text in [os.fsdecode(b"bytes\xff\xfe"), *texts[-2:]]:   # folders named so: refused, listed
        (subs / text.replace("\x00", "")).mkdir()
    run = space.kata("grade", subs, "--out", out, "--katas", "softmax", "-j", "2")
    err = run.stderr.decode("utf-8")   # what it says is UTF-8 too
    assert run.returncode == 0 and "Traceback" not in err, f"seed {seed}: {err[-3000:]}"
    run.stdout.decode("utf-8")
    # Every learner gets results.json and feedback.md; the class gets grades.csv and summary.md.
    for name in learners:
        json.loads((out / name / "results.json").read_text(encoding="utf-8"))
        assert (out / name / "feedback.md").is_file(), name
    assert set(grades(out)) == {"learner", *learners}
    assert "## Folders not graded" in (out / "summary.md").read_text(encoding="utf-8")
    for path in out.rglob("*"):
        if path.is_file() and path.suffix != ".png":
            path.read_bytes().decode("utf-8")   # strict: raises on anything not UTF-8
    assert float(grades(out)["honest"][0]) == FULL   # the others cost the honest learner nothing
    # The texts reached the files, their lone surrogates replaced: every channel was tried.
    for name in set(learners) - {"honest"}:
        assert "\ufffd" in (out / name / "feedback.md").read_text(encoding="utf-8"), name


def test_hostile_text_cannot_empty_the_gradebook(course, space):
    submit(course, "honest", REFERENCE)
    submit(course, "shouter", 'def softmax(x, axis=-1):\n    print("\\ud800")\n    raise ValueError("\\udcff")\n')
    # The notebook's JSON itself holds a lone surrogate ("\ud800" in the file), in the code.
    submit(course, "rawjson", 'def softmax(x, axis=-1):\n    print("\ud800")\n    return x\n')
    scores = autograde(space, course)
    assert scores["honest"] == FULL and scores["shouter"] == 0 and scores["rawjson"] < FULL   # returns x
    for student in ("shouter", "rawjson"):
        assert "\ufffd" in feedback(course, student), student


# --- 2. files sized before they are read ----------------------------------------------------------

# softmax with a banned call (torch.softmax) run with torch's recording off, both reached only
# through an annotation string that functools.singledispatch evaluates as code when it registers.
HIDDEN_BANNED = """import functools

import numpy as np

HIDDEN = []


@functools.singledispatch
def _hide(arg):
    return arg


@_hide.register
def _(arg: "HIDDEN.extend([__import__('torch'), __import__('torch')._C.DisableTorchFunction]) or int"):
    return arg


def softmax(x, axis=-1):
    torch, quiet = HIDDEN
    with quiet():
        return np.asarray(torch.softmax(torch.as_tensor(x), dim=axis))
"""


def test_a_banned_call_hidden_in_a_notebook_cell_earns_nothing(course, space):
    """Containment, round four (class A), in a notebook: the banned call, run from an annotation
    string with recording off, had 10/10 from `kata nbgrader autograde`. The static check refuses
    the helper and the string: the banned-API check scores 0 as tampering, and graded rules give
    the kata 0."""
    submit(course, "mallory", HIDDEN_BANNED)
    assert autograde(space, course)["mallory"] == FULL - find("softmax").checks["banned-api"]
    said = feedback(course, "mallory")
    assert "functools.singledispatch" in said and TAMPERING in said
    graded = space.kata("nbgrader", "autograde", course, "ps1", "--graded")
    assert graded.returncode == 0, graded.stderr.decode("utf-8")
    assert "under this class's rules the kata scores 0" in feedback(course, "mallory")


def test_files_too_large_are_refused_unread(space, course):
    subs, out = space.root / "subs", space.root / "out"
    sparse(subs / "huge" / "softmax.py")
    (subs / "honest").mkdir()
    (subs / "honest" / "softmax.py").write_text(REFERENCE)
    run = space.kata("grade", subs, "--out", out, "--katas", "softmax")
    assert run.returncode == 0, run.stderr.decode()
    assert grades(out)["huge"][0] == "0" and float(grades(out)["honest"][0]) == FULL
    assert "softmax.py is larger than 1 MB, so it was not graded." in (out / "huge" / "feedback.md").read_text()
    for file in (subs / "huge" / "softmax.py", space.root / "softmax.ipynb"):
        sparse(file)
        check = space.kata("check", "softmax", "--file", file, "-w", space.root, timeout=120)
        assert check.returncode == 2 and b"MB, so it was not graded." in check.stderr, check.stderr.decode()
    submit(course, "honest", REFERENCE)
    sparse(course / "submitted" / "huge" / "ps1" / "softmax.ipynb")
    scores = autograde(space, course)
    assert scores == {"honest": FULL, "huge": 0}
    assert "softmax.ipynb is larger than 32 MB, so it was not graded." in feedback(course, "huge")


# --- 3. grades.csv cells that a spreadsheet would run ---------------------------------------------

FORMULAS = ['=HYPERLINK("http:\\\\x","y")', "+1+cmd", "-2+3", "@SUM(A1)"]


def test_grades_csv_holds_no_formula(space):
    subs, out = space.root / "subs", space.root / "out"
    for name in [*FORMULAS, "ada"]:   # no files: every pair is missing, and nothing runs
        (subs / name).mkdir(parents=True)
    run = space.kata("grade", subs, "--out", out, "--katas", "softmax")
    assert run.returncode == 0, run.stderr.decode()
    rows = grades(out)
    assert set(rows) == {"learner", "ada", *(f"'{name}" for name in FORMULAS)}
    for row in rows.values():   # the scores stay plain numbers
        assert all(cell in ("softmax", "total", "max", "softmax status", "missing") or float(cell) >= 0
                   for cell in row)


# --- 4. names that look alike -----------------------------------------------------------------------

LOOKALIKES = [["Jos\u00e9", "Jose\u0301"], ["alice", "\u0430lice"]]   # NFC and NFD; Cyrillic а


def test_lookalike_names_are_graded_apart_and_reported(space):
    subs, out = space.root / "subs", space.root / "out"
    for name in [*sum(LOOKALIKES, []), "bob"]:
        (subs / name).mkdir(parents=True)
    (subs / "alice" / "softmax.py").write_text(REFERENCE)
    run = space.kata("grade", subs, "--out", out, "--katas", "softmax")
    assert run.returncode == 0, run.stderr.decode()
    rows = grades(out)
    assert float(rows["alice"][0]) == FULL and rows["\u0430lice"][0] == "0"   # graded apart
    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert "names look alike" in summary
    listed = [line for line in summary.splitlines() if line.startswith("- `")]
    assert sorted(listed) == sorted("- " + ", ".join(f"`{name}` {ascii(name)}" for name in sorted(group, key=os.fsencode))
                                    for group in LOOKALIKES)


# --- 5. links in an nbgrader course -------------------------------------------------------------------

def test_links_in_an_nbgrader_course_are_refused(course, space):
    source = course / "source" / "ps1"
    submit(course, "honest", REFERENCE)
    (course / "submitted" / "mallory" / "ps1").mkdir(parents=True)
    (course / "submitted" / "mallory" / "ps1" / "softmax.ipynb").symlink_to(source / "softmax.ipynb")
    (course / "submitted" / "trudy").mkdir()
    (course / "submitted" / "trudy" / "ps1").symlink_to(source)
    (course / "submitted" / "sybil").symlink_to(course / "submitted" / "honest")
    # Planted in the exchange's inbound, named as `nbgrader submit` names a submission: a link in
    # place of the folder, and a folder holding a link; `nbgrader collect` brings them in.
    with open(course / "nbgrader_config.py", "a") as config:
        config.write(f"c.Exchange.root = {str(space.root / 'exchange')!r}\n")
    inbound = space.root / "exchange" / course.name / "inbound"
    inbound.mkdir(parents=True)
    stamp = "2024-01-01 00:00:00.000000 UTC"
    (inbound / f"eve+ps1+{stamp}+r1").symlink_to(source)
    (inbound / f"oscar+ps1+{stamp}+r2").mkdir()
    (inbound / f"oscar+ps1+{stamp}+r2" / "softmax.ipynb").symlink_to(source / "softmax.ipynb")
    space.nbgrader("collect", "ps1", cwd=course)
    # A later submission replaces what was collected: nbgrader deletes it first, and must be able to.
    (inbound / "eve+ps1+2024-01-02 00:00:00.000000 UTC+r3").symlink_to(source)
    space.nbgrader("collect", "--update", "ps1", cwd=course)
    scores = autograde(space, course)
    linked = ("mallory", "trudy", "eve", "oscar")
    assert scores == {"honest": FULL, **dict.fromkeys(linked, 0)}   # sybil, a linked student, is no student
    for student in linked:
        assert "softmax.ipynb is a link to a file outside your submission, so it was not graded." in \
            feedback(course, student), student
    assert "| `sybil` | it is a symbolic link, not a folder |" in (course / "kata" / "ps1" / "summary.md").read_text()
