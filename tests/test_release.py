"""`kata release`: a student bundle holds no answer code, and its `kata check` grades the public
checks from recorded values as the full kit does (diagnoses included), the hidden ones skipped.

The bundle runs in an interpreter that cannot import the full kit: ``-I -S`` skips the editable
install's import hook, and only the bundle and the packages it needs are on sys.path."""
import json
import os
import re
import site
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from graders.classroom.release import hidden_checks
from graders.engine.bundle import HIDDEN_MESSAGE
from graders.engine.manifest import ROOT, find, katas
from graders.engine.oracles import Bugs
from graders.engine.runner import grade
from graders.practice.interview import plan
from tests.conftest import KATA

# One bundle, built once: one worker runs them all.
pytestmark = pytest.mark.xdist_group("release")

BUNDLED = ["softmax", "mha"]
SEED = 3


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("release") / "bundle"
    run = subprocess.run([str(KATA), "release", "--out", str(out), "--katas", ",".join(BUNDLED), "--seed", str(SEED)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return out


def isolated(bundle: Path, code: str, *args, cwd=None, env=None, input=None):
    """Run ``code`` in a Python that sees the bundle and site-packages, but not the full kit."""
    boot = f"import sys; sys.path[:0] = [{str(bundle)!r}]; sys.path += {site.getsitepackages()!r}; sys.argv[0] = 'kata'\n"
    return subprocess.run([sys.executable, "-I", "-S", "-c", boot + code, *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "NO_COLOR": "1", **(env or {})}, timeout=300, input=input)


def bundle_kata(bundle, workspace, *args, input=None):
    return isolated(bundle, "import cli; cli.main()", *args, cwd=workspace, env={"KATA_WORKSPACE": str(workspace)},
                    input=input)


def test_bundle_holds_no_answer_code(bundle):
    files = [p for p in bundle.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert not (bundle / "reference").exists()
    assert not [p for p in files if p.name.endswith(("_bugs.py", "_hidden.py"))]
    # Lines of the references and bug oracles that no learner-facing text (stubs, hints, READMEs) shows.
    shown = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "katas").rglob("*.*")] if p.suffix != ".pyc")
    answers = {line.strip() for path in (ROOT / "reference").glob("*.py") for line in path.read_text().splitlines()
               if len(line.strip()) >= 20 and not line.strip().startswith(("#", "import", "from"))
               and line.strip() not in shown}
    answers |= {f"def test_{cid.replace('-', '_')}(" for k in katas() for cid in hidden_checks(k)}
    assert len(answers) > 200
    text = "\n".join(p.read_text() for p in files if p.suffix != ".npz")
    assert [line for line in answers if line in text] == []
    assert isolated(bundle, "import reference").returncode != 0


def test_bundle_readme_is_the_students(bundle):
    readme = (bundle / "README.md").read_text()
    assert readme.startswith("# Attention katas") and f"recorded at seed {SEED}" in readme
    for slug in BUNDLED:
        assert f"| `{slug}` | {find(slug).title} | `{find(slug).learner_file}` |" in readme
    # The instructor's and the author's guides (the kit's docs/) stay with the kit.
    assert "`pip install\njupyterlab`" in readme and "`jupyter lab`" in readme   # for a course's notebooks
    # torch's CPU build first: PyPI's torch on Linux is the CUDA build, gigabytes a student does not need
    torch = metadata.version("torch").split("+")[0]
    assert (f"pip install torch=={torch} --index-url https://download.pytorch.org/whl/cpu\npip install .\n"
            in readme)
    students = (ROOT / "docs" / "teaching.md").read_text().split("**Students' install.**")[1].split("```")[1]
    assert "whl/cpu" in students and "nbgrader" in students   # they fetch and submit through nbgrader
    for theirs in ("kata grade", "kata release", "Gradescope", "nbgrader", "reference"):
        assert theirs not in readme


def test_a_release_seed_is_never_a_grading_seed(tmp_path):
    """Grading seeds lie in [2**31, 2**32) (tests/test_batch.py), release seeds below."""
    for seed in (str(2**31), str(2**32), "-1"):
        run = subprocess.run([str(KATA), "release", "--out", str(tmp_path / "b"), "--katas", "softmax", "--seed", seed],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and "--seed" in run.stderr and not (tmp_path / "b").exists(), run.stderr


def test_bundle_needs_its_seed_and_refuses_reference_commands(bundle, tmp_path):
    assert bundle_kata(bundle, tmp_path, "start", "softmax").returncode == 0
    wrong_seed = bundle_kata(bundle, tmp_path, "check", "softmax", "--seed", str(SEED + 1))
    assert wrong_seed.returncode == 2 and f"seed {SEED} only" in wrong_seed.stderr
    for command in (["solution", "softmax", "--force"], ["lint", "softmax"]):
        refused = bundle_kata(bundle, tmp_path, *command)
        assert refused.returncode == 2 and "does not include the reference" in refused.stderr


def test_a_bundle_for_graded_work_withholds_every_fix(tmp_path):
    """`kata release --withhold-fixes`: the bundle diagnoses a known bug and explains it, but no
    fix is printed, nor held in any file a student can read."""
    out = tmp_path / "bundle"
    run = subprocess.run([str(KATA), "release", "--out", str(out), "--katas", "softmax", "--withhold-fixes"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    kit = [*(ROOT / "katas").glob("*/kata.toml"), ROOT / "katas" / "mistakes.toml"]
    fixes = {f for path in kit for f in re.findall(r'^fix = "(.+)"$', path.read_text(), re.MULTILINE)}
    text = "\n".join(p.read_text() for p in out.rglob("*") if p.is_file() and p.suffix not in (".npz", ".pyc"))
    assert len(fixes) > 200 and [f for f in fixes if f in text] == []
    assert "without its fix" in (out / "README.md").read_text()
    overflow = find("softmax").diagnoses["softmax-overflow"]
    (tmp_path / "softmax.py").write_text("import numpy as np\n\ndef softmax(x, axis=-1):\n    e = np.exp(x)\n"
                                         "    return e / e.sum(axis=axis, keepdims=True)\n")
    shown = bundle_kata(out, tmp_path, "check", "softmax").stdout
    assert "softmax-overflow" in shown and overflow.explain.split(".")[0] in " ".join(shown.split())
    assert overflow.fix not in shown and "Withheld" in shown


@pytest.mark.parametrize("slug", BUNDLED)
def test_bundle_check_grades_stub_and_reference(bundle, tmp_path, slug):
    kata = find(slug)
    assert bundle_kata(bundle, tmp_path, "start", slug).returncode == 0
    stub = bundle_kata(bundle, tmp_path, "check", slug, "--json")
    assert json.loads(stub.stdout)["status"] == "not-started"
    (tmp_path / kata.learner_file).write_text(kata.reference_path.read_text())
    run = bundle_kata(bundle, tmp_path, "check", slug, "--json")
    result = json.loads(run.stdout)
    assert run.returncode == 0 and result["status"] == "passed" and result["seed"] == SEED
    hidden = hidden_checks(kata)
    for check in result["checks"]:
        if check["id"] in hidden:
            assert (check["status"], check["max_score"], check["visibility"]) == ("skipped", 0, "hidden")
            assert check["message"] == HIDDEN_MESSAGE
        else:
            assert (check["status"], check["score"]) == ("passed", kata.checks[check["id"]])
    shown = bundle_kata(bundle, tmp_path, "check", slug).stdout
    assert re.search(r"hidden check\(s\) run when your instructor grades", shown)


@pytest.mark.parametrize("slug", BUNDLED)
def test_bundle_diagnoses_every_bug_as_the_full_kit_does(bundle, tmp_path, slug, zygotes):
    kata = find(slug)
    paths = {}
    for code in Bugs(kata).names:
        paths[code] = tmp_path / code / kata.learner_file
        paths[code].parent.mkdir()
        paths[code].write_text(Bugs(kata).shim(code))
    # One interpreter grades every bug in the bundle: a `kata check` per bug would import torch each time.
    script = ("import json, sys\nfrom graders.engine.manifest import find\nfrom graders.engine.runner import grade\n"
              "from graders.engine.sandbox import Zygote\nkata = find(sys.argv[1])\n"
              "with Zygote([kata.framework], isolated=None) as zygote:\n"
              "    for path in sys.argv[2:]:\n"
              "        print(json.dumps(grade(kata, path, seed=%d, device='cpu', zygote=zygote)))\n" % SEED)
    run = isolated(bundle, script, slug, *map(str, paths.values()))
    assert run.returncode == 0, run.stderr
    replayed = dict(zip(paths, map(json.loads, run.stdout.splitlines())))
    public = set(kata.checks) - set(hidden_checks(kata))
    for code, path in paths.items():
        full = grade(kata, path, seed=SEED, device="cpu", zygote=zygotes(kata.framework))
        expected = {c["id"]: (c["status"], c["diagnosis"]) for c in full["checks"] if c["id"] in public}
        got = {c["id"]: (c["status"], c["diagnosis"]) for c in replayed[code]["checks"] if c["id"] in public}
        assert got == expected, code
        assert replayed[code]["status"] == "failed"


def test_bundle_interviews_check_at_its_seed_and_plots(bundle, tmp_path):
    questions = plan(katas(), seed=SEED + 5, chosen=[find("softmax")]).questions
    answers = "".join(f"{a.expected!r}\n" if a.question.kind == "numeric" else f"{a.expected}\n" for a in questions)
    run = bundle_kata(bundle, tmp_path, "interview", "--katas", "softmax", "--seed", str(SEED + 5),
                      input="done\n" + answers)
    assert run.returncode == 0, run.stdout + run.stderr
    entries = [json.loads(line) for line in (tmp_path / ".kata" / "history.jsonl").read_text().splitlines()]
    assert entries[0]["status"] == "not-started" and entries[0]["seed"] == SEED   # the check, at the bundle's seed
    assert entries[-1]["followups_right"] == len(questions)

    (tmp_path / "mha.py").write_text(find("mha").reference_path.read_text())
    drawn = bundle_kata(bundle, tmp_path, "plot", "mha")
    assert drawn.returncode == 0, drawn.stderr
    assert (tmp_path / "mha-heatmaps.png").read_bytes().startswith(b"\x89PNG")


def test_a_released_notebooks_test_cells_run_with_the_bundle_alone(bundle, tmp_path, monkeypatch):
    """The students' install for an nbgrader course: the bundle and Jupyter. The notebook that
    `nbgrader generate_assignment` releases runs in a kernel that sees the bundle, not the full
    kit: its test cells grade the saved notebook from the recorded values."""
    import nbclient
    import nbformat

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}   # nbgrader runs alembic
    course = tmp_path / "course"
    subprocess.run([str(KATA), "nbgrader", "init", str(course), "--assignment", "ps1", "--katas", "softmax"],
                   check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", "ps1"], cwd=course, env=env, check=True,
                   capture_output=True)
    boot = (f"import sys; sys.path[:0] = [{str(bundle)!r}]; sys.path += {site.getsitepackages()!r}; "
            "from ipykernel import kernelapp; kernelapp.launch_new_instance()")
    spec = tmp_path / "jupyter" / "kernels" / "bundle"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({"argv": [sys.executable, "-I", "-S", "-c", boot, "-f",
                                                           "{connection_file}"], "language": "python",
                                                  "display_name": "the student bundle"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    released = nbformat.read(course / "release" / "ps1" / "softmax.ipynb", as_version=4)
    outputs = {}
    for name, code in (("reference", (ROOT / "reference" / "softmax.py").read_text()),
                       ("overflow", "import numpy as np\n\ndef softmax(x, axis=-1):\n    e = np.exp(x)\n"
                                    "    return e / e.sum(axis=axis, keepdims=True)\n")):
        nb = nbformat.from_dict(json.loads(json.dumps(released)))
        solution = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution"))
        solution.source = solution.source.split("\n")[0] + "\n" + code
        nbformat.write(nb, tmp_path / "softmax.ipynb")   # the test cells grade the saved notebook
        nbclient.NotebookClient(nb, kernel_name="bundle", timeout=120, allow_errors=True,
                                resources={"metadata": {"path": str(tmp_path)}}).execute()
        tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
        outputs[name] = {c.metadata["nbgrader"]["grade_id"]: "".join(o.get("text", "") + o.get("evalue", "")
                                                                      for o in c.outputs) for c in tests}
    hidden = {f"softmax-{cid}" for cid in hidden_checks(find("softmax"))}   # released empty: nbgrader cleared them
    assert set(outputs["reference"]) > hidden and all(not outputs["reference"][i] for i in hidden)
    assert all("✓" in text for i, text in outputs["reference"].items() if i not in hidden), outputs["reference"]
    stable = outputs["overflow"]["softmax-stable-for-large-logits"]
    assert "softmax-overflow" in stable and "did not pass" in stable, stable
