"""Student bundles (`kata release`): the kit without its answers.

A bundle is an installable copy of the kit with no reference/ package, no bug oracles and no
hidden checks. In their place, ``graders/recorded/`` holds, per kata, every oracle value its
public checks ask for at one seed, recorded here by grading the reference and each bug oracle (so
diagnoses still work there), plus the hidden checks' ids and names. How the judge grades inside a
bundle is ``graders/engine/bundle.py``.
"""
from __future__ import annotations

import json
import re
import shutil
import tempfile
import tomllib
from importlib import metadata
from pathlib import Path

from ..engine.bundle import NO_REFERENCE, bundle_info
from ..engine.manifest import MISTAKES, ROOT, Kata
from ..engine.manifest import katas as all_katas
from ..engine.oracles import Bugs
from ..engine.plugin import check_names
from ..engine.recording import Store
from ..engine.runner import grade
from ..engine.sandbox import Zygote
from .rules import RELEASE_SEEDS

DEFAULT_SEED = 0   # `kata release`'s seed when none is given; release seeds are below RELEASE_SEEDS


class ReleaseError(Exception):
    """The bundle could not be built (the message says why)."""


def hidden_checks(kata: Kata) -> dict[str, str]:
    """{check id: name} of the kata's hidden checks."""
    path = kata.files["hidden"]
    return check_names(path) if path.exists() else {}


def build(out: Path, katas: list[Kata], *, seed: int, withhold_fixes: bool = False,
          progress=lambda text: None) -> None:
    """Write a bundle of ``katas`` to ``out`` (missing or empty), recorded at ``seed``: one below
    RELEASE_SEEDS, so that it is never a class's grading seed (see ``rules``). ``withhold_fixes``:
    the bundle's manifests hold no diagnosis's fix (graded work)."""
    if not 0 <= seed < RELEASE_SEEDS:
        raise ReleaseError(f"a release seed lies in [0, {RELEASE_SEEDS}): grading seeds lie above it.")
    if out.exists() and any(out.iterdir()):
        raise ReleaseError(f"{out} is not empty: choose a new folder for the bundle.")
    if bundle_info() is not None:
        raise ReleaseError(NO_REFERENCE.format(command="release"))
    _copy_kit(out, katas)
    if withhold_fixes:
        _withhold_fixes(out)
    (out / "README.md").write_text(student_readme(katas, seed, withhold_fixes), encoding="utf-8")
    (out / "graders" / "recorded").mkdir()
    with Zygote({k.framework for k in katas}, isolated=None, warm=True) as zygote, tempfile.TemporaryDirectory(prefix="kata-release-") as tmp:
        for kata in katas:
            bugs, store = Bugs(kata), Store()
            path = Path(tmp) / kata.learner_file

            def run(source: str) -> dict:
                path.write_text(source, encoding="utf-8")
                return grade(kata, path, seed=seed, device="cpu", zygote=zygote, record=store)

            result = run(kata.reference_path.read_text(encoding="utf-8"))
            if result["status"] != "passed":
                raise ReleaseError(f"{kata.slug}: the reference does not pass its grader at seed {seed} "
                                   "(`kata lint` says why); no bundle was made.")
            for name in bugs.names:   # what diagnosing each known bug asks of the oracles
                run(bugs.shim(name))
            visible = [c["id"] for c in result["checks"] if c["visibility"] == "visible" and c["status"] != "skipped"]
            info = {"kata": kata.slug, "seed": seed, "codes": bugs.names, "hidden": hidden_checks(kata),
                    "recorded": visible}
            store.save(info, out / "graders" / "recorded" / f"{kata.module}.json",
                       out / "graders" / "recorded" / f"{kata.module}.npz")
            progress(f"{kata.slug}: {len(store)} oracle values recorded for {len(visible)} public checks; "
                     f"{len(info['hidden'])} hidden check(s) left out")
    (out / "graders" / "recorded" / "bundle.json").write_text(
        json.dumps({"format": 1, "seed": seed, "katas": [k.slug for k in katas]}), encoding="utf-8")
    leaks = answers_in(out)
    if leaks:
        raise ReleaseError(f"the bundle in {out} holds answer code: {', '.join(leaks)}")


ANSWERS = ("reference", "bugs", "expected", "hidden")   # the roles of a kata's files that hold answers


def _in_bundle(kata: Kata, path: Path) -> Path:
    """Where one of ``kata``'s files lies in a bundle: where the kit keeps it, or in katas/<slug>/
    for a course's own kata."""
    return Path("katas", kata.dir.name, path.name) if kata.folder else path.relative_to(ROOT)


def answers_in(root: Path) -> list[str]:
    """Paths under ``root`` that a bundle must not hold: the reference package, and any kata's
    answers (its reference, bug oracles, expected values, hidden checks) where the kit keeps them."""
    answers = {_in_bundle(kata, kata.files[role]) for kata in all_katas() for role in ANSWERS}
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.name == "reference" or p.relative_to(root) in answers)


def _copy_kit(out: Path, katas: list[Kata]):
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("cli.py", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, out / name)
    (out / "pyproject.toml").write_text(_bundle_pyproject(), encoding="utf-8")
    for package in kit_packages():
        shutil.copytree(ROOT / "graders" / package, out / "graders" / package, ignore=skip)
    shutil.copy2(ROOT / "graders" / "__init__.py", out / "graders" / "__init__.py")
    (out / "katas").mkdir()
    if (ROOT / "katas" / "__init__.py").exists():
        shutil.copy2(ROOT / "katas" / "__init__.py", out / "katas" / "__init__.py")
    shutil.copy2(MISTAKES, out / "katas" / MISTAKES.name)   # the explanations of shared mistakes
    for kata in katas:
        # The kata's folder but its record of `kata lint --deep`, which is about the kit's own tests,
        # and, for a course's own kata, the answers it keeps there (its grader stays beside them).
        left_out = [*(kata.files[role].name for role in ANSWERS), ".*"] if kata.folder else []   # .*: a run's .kata
        shutil.copytree(kata.dir, out / "katas" / kata.dir.name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", kata.files["record"].name, *left_out))
        if not kata.folder:
            shutil.copy2(kata.grader_path, out / "graders" / kata.grader_path.name)


WITHHELD = "Withheld: this course grades the kata, and your instructor's feedback comes with the grades."
FIX_LINE = re.compile(r'^fix = "(?:[^"\\]|\\.)*"$', re.MULTILINE)   # how every manifest writes a fix


def _withhold_fixes(out: Path):
    """Replace every diagnosis's fix in the bundle's manifests and mistakes library by WITHHELD,
    and make sure none is left: the fix is answer code, and the files are the students' to read."""
    files = [*(out / "katas").glob("*/kata.toml"), out / "katas" / MISTAKES.name]
    for path in files:
        path.write_text(FIX_LINE.sub(f"fix = {json.dumps(WITHHELD)}", path.read_text(encoding="utf-8")),
                        encoding="utf-8")
    for path in files:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        entries = [*data.get("diagnoses", {}).values(), *(v for k, v in data.items() if isinstance(v, dict)
                                                          and path.name == MISTAKES.name)]
        if any(entry.get("fix", WITHHELD) != WITHHELD for entry in entries):
            raise ReleaseError(f"{path.relative_to(out)} holds a fix written another way than `fix = \"...\"` "
                               "on one line: it cannot be withheld, so no bundle was made.")


def kit_packages() -> list[str]:
    """The packages under graders/ a bundle ships (the judge, and what learners and instructors do
    with it): not the kata graders, nor authoring, whose commands need the reference."""
    return sorted(p.parent.name for p in (ROOT / "graders").glob("*/__init__.py") if p.parent.name != "authoring")


def student_readme(katas: list[Kata], seed: int, withhold_fixes: bool = False) -> str:
    """The bundle's README: what a student does with it (the kit's own README and docs/
    are the instructor's and the author's too)."""
    rows = "\n".join(f"| `{k.slug}` | {k.title} | `{k.learner_file}` |" for k in katas)
    first = katas[0]
    python = metadata.metadata("attention-katas")["Requires-Python"]
    torch = metadata.version("torch").split("+")[0]
    fixes = ("\n\nThis bundle is for graded work: a diagnosis names the known bug your output matches and what it "
             "means, without its fix." if withhold_fixes else "")
    return f"""# Attention katas

Your exercises: write each kata's code from scratch, and `kata check` tells you exactly what is
wrong (the call, the case, what came back, what was expected, the known bug your output matches
and how to fix it).{fixes}

| kata | task | your file |
|---|---|---|
{rows}

## Set up

Python `{python}`, in this folder:

```bash
python -m venv .venv && . .venv/bin/activate
pip install torch=={torch} --index-url https://download.pytorch.org/whl/cpu
pip install .
```

The second line installs torch's CPU build, a few hundred megabytes, on which every kata runs: on
Linux, PyPI's torch is the CUDA build, several gigabytes (on a machine with an NVIDIA GPU, leave
that line out).

Checks run your code in bubblewrap's sandbox where it is installed (`sudo apt-get install
bubblewrap` on Debian and Ubuntu); without it, in a separate process, and `kata check` says so.

## Work

```bash
kata list                       # the katas, with your status and best score
kata start {first.slug:<20} # writes {first.learner_file} and shows the task
kata check {first.slug:<20} # grades it
kata hint {first.slug:<21} # one hint at a time
```

`kata check` grades the public checks against expected values recorded at seed {seed}, the only
seed it takes here. The hidden checks are listed as skipped: they draw fresh inputs and run when
your instructor grades. Hand in the files `kata start` made, under the same names.

## Notebooks

If your instructor hands out notebooks, install Jupyter beside the katas (`pip install
jupyterlab`, with what your course uses to fetch and submit them) and open them with `jupyter lab`:
save the notebook, then run its test cells, which grade your code cells as `kata check` does.
"""


def _bundle_pyproject() -> str:
    """The bundle's pyproject.toml, from the installed kit's metadata (a checkout or a wheel
    install alike): the same name, version and dependencies, no reference package, and the
    recordings as package data."""
    meta = metadata.metadata("attention-katas")
    requires = [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
    lines = ['[build-system]', 'requires = ["setuptools>=69"]', 'build-backend = "setuptools.build_meta"', '',
             '[project]', 'name = "attention-katas"', f'version = "{meta["Version"]}"',
             'description = "Attention katas: a student bundle (public checks, recorded expected values)."',
             'readme = "README.md"', f'requires-python = "{meta["Requires-Python"]}"',
             f'dependencies = {json.dumps(requires)}', '', '[project.scripts]', 'kata = "cli:main"', '',
             '[tool.setuptools]', 'py-modules = ["cli"]',
             f'packages = {json.dumps(["graders", *(f"graders.{p}" for p in kit_packages()), "katas"])}', '',
             '[tool.setuptools.package-data]', 'katas = ["mistakes.toml", "*/kata.toml", "*/README.md", "*/stub.py"]',
             '"graders.engine" = ["result.schema.json"]', 'graders = ["recorded/*.json", "recorded/*.npz"]']
    return "\n".join(lines) + "\n"
