"""The Gradescope autograder zip (``kata gradescope``).

Gradescope's format (https://gradescope-autograders.readthedocs.io/en/latest/specs/): the zip's
root holds ``setup.sh``, run once as root when Gradescope builds the grading image, and
``run_autograder``, run for every submission with the learner's files in
``/autograder/submission``; it must leave ``/autograder/results/results.json``. The whole zip is
unpacked into ``/autograder/source``. Ours adds a wheel of this kit, made at zip time (built from
the checkout, or packed again from a normal install) so that the image grades with exactly the kit
the instructor has, ``config.json`` (which katas, which torch) and, under ``katas/``, the folders
of a course's own katas. ``$KATA_AUTOGRADER_ROOT`` replaces ``/autograder`` in both scripts, so
that a test runs them end to end on a temporary tree.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

from ..engine.manifest import ROOT, Kata
from .rules import ClassRules

SETUP_SH = r"""#!/usr/bin/env bash
# Run once by Gradescope, as root, while it builds the grading image: a Python >= 3.11 with venv,
# a virtual environment outside source/ (learner code runs as another user and must be able to
# run its interpreter, while source/ becomes root-only), the CPU build of torch, then the kit.
set -euo pipefail
root="${KATA_AUTOGRADER_ROOT:-/autograder}"
venv="$root/venv"

# Debian and Ubuntu ship venv's ensurepip separately: a python3 without it cannot make a venv.
usable() { "$1" -c 'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }
py=""
for candidate in python3 python3.13 python3.12 python3.11; do
    if command -v "$candidate" >/dev/null && usable "$candidate"; then py="$candidate"; break; fi
done
if [ -z "$py" ]; then
    apt-get update -q
    if python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        apt-get install -y -q python3-venv && py=python3
    else    # Ubuntu 22.04's python3 is 3.10; its universe has 3.11
        apt-get install -y -q python3.11 python3.11-venv && py=python3.11
    fi
fi

# Learner code runs in bubblewrap's sandbox, or where this container refuses the namespaces bwrap
# makes (Docker's default seccomp profile), as an unprivileged user of the container (see
# run_autograder's `kata grade --container`), under a seccomp filter built with libseccomp.
if ! command -v bwrap >/dev/null || ! ldconfig -p | grep libseccomp.so.2 >/dev/null; then
    apt-get update -q && apt-get install -y -q bubblewrap libseccomp2
fi

torch="$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["torch"])' "$root/source/config.json")"
"$py" -m venv "$venv"
# torch from PyPI is the CUDA build (gigabytes); graders run on CPU. KATA_TORCH_INDEX_URL= (empty)
# installs from pip's configured index instead, e.g. behind a mirror.
index="${KATA_TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
"$venv/bin/python" -m pip install -q ${index:+--index-url "$index"} "torch==$torch"
# A class with Triton katas: the Triton they were packed with (their kernels run on its interpreter).
triton="$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("triton") or "")' "$root/source/config.json")"
if [ -n "$triton" ]; then "$venv/bin/python" -m pip install -q "triton==$triton"; fi
"$venv/bin/python" -m pip install -q "$root"/source/*.whl
# That user must not read the kit as installed (references, graders, compiled copies, metadata),
# nor its wheel: root only. Python, torch and NumPy stay readable; the sandbox's zygote, started
# as root, reads the worker's source before each worker drops to that user.
"$venv/bin/python" -I -c 'import os
from graders.engine.sandbox import kit_files
for path in kit_files():
    os.chmod(path, os.stat(path).st_mode & 0o700)'
chmod -R go-rwx "$root/source"
"$venv/bin/kata" --version
"""

RUN_AUTOGRADER = r"""#!/usr/bin/env bash
# Run by Gradescope for every submission. Whatever happens (an empty or crashing submission, a
# failed setup, `kata grade` itself failing), results.json exists when this script ends: a
# fallback with score 0 and a sentence saying what went wrong is written first and replaced by
# the real results only when grading finished.
set -u
root="${KATA_AUTOGRADER_ROOT:-/autograder}"
results="$root/results/results.json"
mkdir -p "$root/results"
chmod 700 "$root/results"   # learner code, run as another user, must not replace the results

fallback() {   # $1: a fixed sentence (no quotes or backslashes: it is written into JSON as is)
    printf '{"score": 0, "output": "%s", "visibility": "visible", "stdout_visibility": "hidden"}\n' \
        "$1" > "$results.tmp" && mv -f "$results.tmp" "$results"
}
fallback "The autograder stopped before grading finished, so nothing was graded. Please tell your instructor."

if [ ! -x "$root/venv/bin/kata" ]; then
    fallback "The autograder is not installed (its setup.sh did not finish), so nothing was graded. Please tell your instructor."
    exit 0
fi
katas="$("$root/venv/bin/python" -c 'import json, sys; print(",".join(json.load(open(sys.argv[1]))["katas"]))' \
    "$root/source/config.json")" || {
    fallback "The autograder cannot read its config.json, so nothing was graded. Please tell your instructor."
    exit 0
}

# The source holds the kit's wheel, reference included: learner code, which `kata grade` runs as
# an unprivileged user when we are root, must not read it. mktemp -d makes a root-only folder for
# the copy of the submission and the grades (--container checks all this, and refuses otherwise).
chmod -R go-rwx "$root/source"
# Whose submission this is: each student draws inputs of their own from the class's secret, the
# same for every resubmission, by their Gradescope user ids (a group's, in order), never by a name
# or an address of theirs. Without the metadata, as when the autograder is tried by hand: one name.
learner="$("$root/venv/bin/python" - "$root/submission_metadata.json" <<'PY'
import json, sys
try:
    with open(sys.argv[1], encoding="utf-8") as f:
        ids = sorted({int(user["id"]) for user in json.load(f)["users"]})
except (OSError, ValueError, KeyError, TypeError):
    ids = []
print("student-" + "-".join(map(str, ids)) if ids else "submission")
PY
)" || learner=submission
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/submissions/$learner"
if [ -d "$root/submission" ]; then
    cp -R "$root/submission/." "$work/submissions/$learner/"
fi
# `kata grade` reads the files as root: a submitted symlink to the reference must not count.
find "$work/submissions" -type l -delete
echo "Files submitted:"
(cd "$work/submissions/$learner" && find . -type f | LC_ALL=C sort | cat -v)
# The class's secret and policy: every re-run of a submission draws the same inputs.
mkdir -p "$work/out/.kata" && cp "$root/source/class.json" "$work/out/.kata/class.json"
# When Gradescope took the submission: what a due date in the class file is judged against.
"$root/venv/bin/python" - "$root/submission_metadata.json" "$learner" > "$work/out/submitted.csv" <<'PY' \
    || rm -f "$work/out/submitted.csv"
import datetime, json, sys
with open(sys.argv[1], encoding="utf-8") as f:
    created = datetime.datetime.fromisoformat(json.load(f)["created_at"])
print(f"learner,submitted\n{sys.argv[2]},{created.isoformat()}")
PY

# --container: this container is thrown away after grading; where its seccomp profile refuses
# bwrap's namespaces, learner code runs as an unprivileged user of the container instead.
# The course's own katas travel in the zip, beside the kit's wheel (root-only, as the rest of source/).
if [ -d "$root/source/katas" ]; then
    export KATA_KATAS_DIR="$root/source/katas"
fi
"$root/venv/bin/kata" grade "$work/submissions" --out "$work/out" --katas "$katas" --container
status=$?
[ -f "$work/out/summary.md" ] && cat "$work/out/summary.md"   # the autograder's output: instructors only
graded="$work/out/$learner/results.json"
if [ "$status" -ne 0 ] || [ ! -s "$graded" ]; then
    fallback "Grading failed (kata grade exit status $status) before it wrote your results. Please tell your instructor."
    exit 0
fi
cp "$graded" "$results.tmp" && mv -f "$results.tmp" "$results"
"""


class GradescopeError(Exception):
    """The zip cannot be built here; the message says why."""


def torch_version() -> str:
    """The torch this kit runs with here, without a local tag (2.13.0+cpu -> 2.13.0)."""
    try:
        return metadata.version("torch").split("+")[0]
    except metadata.PackageNotFoundError:
        raise GradescopeError("torch is not installed here; install the torch the autograder should use.") from None


def build_wheel(dest: Path) -> Path:
    """A wheel of the kit as it runs here: built from its checkout (an editable install), else
    packed again from the installed files (a normal install)."""
    pyproject = ROOT / "pyproject.toml"
    return _checkout_wheel(dest, pyproject) if pyproject.is_file() else _installed_wheel(dest)


def _installed_wheel(dest: Path) -> Path:
    """The wheel a normal install came from, packed again from its files as RECORD lists them
    (compiled caches, the console script and pip's own notes left out; RECORD written anew). A
    file changed since it was installed is refused: the image would grade with another kit."""
    dist = metadata.distribution("attention-katas")
    info = Path(dist._path).name   # NAME-VERSION.dist-info
    pip_notes = {f"{info}/{name}" for name in ("INSTALLER", "REQUESTED", "direct_url.json", "RECORD")}
    wheel_meta = dist.read_text("WHEEL") or ""
    tag = next((line.split(": ", 1)[1].strip() for line in wheel_meta.splitlines() if line.startswith("Tag: ")),
               "py3-none-any")
    path = dest / f"{info.removesuffix('.dist-info')}-{tag}.whl"
    record = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for file in sorted(dist.files or (), key=str):
            name = file.as_posix()
            if name.startswith("../") or "__pycache__" in file.parts or name in pip_notes:
                continue
            data = file.locate().read_bytes()
            digest = _record_hash(data)
            if file.hash is not None and f"{file.hash.mode}={file.hash.value}" != digest:
                raise GradescopeError(f"{file.locate()} was changed since the kit was installed: install the kit "
                                      "again (or from a checkout, `pip install -e .`) and build the zip then.")
            zf.writestr(name, data)
            record.append(f"{name},{digest},{len(data)}")
        zf.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return path


def _record_hash(data: bytes) -> str:
    """A file's hash as a wheel's RECORD writes it (PEP 376/427: sha256, urlsafe base64, unpadded)."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _checkout_wheel(dest: Path, pyproject: Path) -> Path:
    """A wheel of the kit's checkout at ROOT, built from a clean copy: setuptools' in-tree build/
    folder would leave files deleted since an earlier build inside the wheel."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    layout = project["tool"]["setuptools"]
    tops = {f"{m}.py" for m in layout.get("py-modules", [])} | {p.split(".")[0] for p in layout["packages"]}
    tops |= {"pyproject.toml", project["project"]["readme"]}
    src = dest / "src"
    src.mkdir()
    for name in sorted(tops):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    # Build isolation fetches the setuptools pyproject.toml asks for: the one in this environment
    # may be older (Python 3.11's venv ships setuptools 65).
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), str(src)],
                          capture_output=True, text=True)
    wheels = list(dest.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        raise GradescopeError(f"building the kit's wheel failed:\n{done.stdout}{done.stderr}")
    return wheels[0]


def _add(zf: zipfile.ZipFile, name: str, data: str | bytes, mode: int):
    info = zipfile.ZipInfo(name, date_time=time.localtime()[:6])
    info.external_attr = (0o100000 | mode) << 16   # Unix mode: keeps the scripts executable
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)


def course_katas(katas: list[Kata]) -> dict[str, Path]:
    """{name in the zip: file} for the course's own katas among ``katas``: each folder whole, its
    reference included (the autograder grades with it; source/ is root-only while grading), but
    for a run's history (.kata/) and compiled caches."""
    return {f"katas/{kata.dir.name}/{path.relative_to(kata.dir).as_posix()}": path
            for kata in katas if kata.folder for path in sorted(kata.dir.rglob("*"))
            if path.is_file() and not any(part.startswith(".") or part == "__pycache__"
                                          for part in path.relative_to(kata.dir).parts)}


def build(out: Path, katas: list[Kata], rules: ClassRules) -> dict:
    """Write the autograder zip to ``out`` (atomically); returns what went in it. ``rules`` (the
    class's secret and policy) travel as class.json: every re-run of a submission draws the
    same inputs, and learners never see it (source/ is root-only while grading)."""
    config = {"katas": [k.slug for k in katas], "torch": torch_version(),
              "kit": metadata.version("attention-katas")}
    if any(k.framework == "triton" for k in katas):
        try:
            config["triton"] = metadata.version("triton")
        except metadata.PackageNotFoundError:
            raise GradescopeError("The class has Triton katas and Triton is not installed here: "
                                  "pip install 'attention-katas[triton]' first.") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_wheel(Path(tmp))
        partial = out.with_name(f".{out.name}.partial")
        with zipfile.ZipFile(partial, "w") as zf:
            _add(zf, "setup.sh", SETUP_SH, 0o755)
            _add(zf, "run_autograder", RUN_AUTOGRADER, 0o755)
            _add(zf, "config.json", json.dumps(config, indent=2) + "\n", 0o644)
            _add(zf, "class.json", rules.to_json(), 0o600)
            _add(zf, wheel.name, wheel.read_bytes(), 0o644)
            for name, path in course_katas(katas).items():
                _add(zf, name, path.read_bytes(), 0o644)
        os.replace(partial, out)
    return {**config, "wheel": wheel.name, "size": out.stat().st_size}
