"""`kata new SLUG`: every file a kata needs, in its place (``Kata.files``), and its row in the kit's
README; with ``--katas-dir DIR``, a course's own kata, every file in DIR/SLUG/.

What it writes is a working kata: a function ``example`` that doubles its input, a grader with one
public and one hidden check, a bug oracle, follow-ups, four style-zoo solutions and a zoo bug.
`kata lint` passes on it but for one rule: wherever the author has something to write, the text
says ``TODO(kata new)``, and lint names every such place until none is left. docs/authoring.md
walks through it.
"""
from __future__ import annotations

import re
from pathlib import Path
from string import Template

from ..engine.manifest import KATAS_DIR, ROOT, TRACKS, Kata, katas, parse
from .lint import FRAMEWORK_NAMES, MARKER, kata_row, shown

SLUG = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
TODO = MARKER

# Per framework: the import, the argument's type, how a grader draws x of a shape.
KINDS = {
    "torch": {"imports": "import torch", "type": "torch.Tensor",
              "draw": "torch.from_numpy(rng.standard_normal(shape))"},
    "numpy": {"imports": "import numpy as np", "type": "np.ndarray", "draw": "rng.standard_normal(shape)"},
    "triton": {"imports": "import torch\nimport triton\nimport triton.language as tl", "type": "torch.Tensor",
               "draw": "torch.from_numpy(rng.standard_normal(shape))"},
}

MANIFEST = '''format = 1
slug = "$slug"
title = "$TODO the kata's title"
order = $order
framework = "$framework"
summary = "$TODO what the learner writes, in one line (the README's table of katas says it too)."
minutes = 15
${track}difficulty = "medium"   # easy, medium or hard: `kata list` shows it beside the minutes

# $TODO the tolerances, with the reason for each figure: the roundings the computation makes.
[tolerances.float64]
rtol = 1e-12
atol = 1e-12

[[tasks]]
title = "$TODO the first task"
functions = ["example"]
hints = [
    { for = ["matches-reference", "example-bug"], text = "$TODO the gentlest nudge first." },
    { for = ["other-shapes"], text = "$TODO a hint for the hidden check." },
]

[checks]
matches-reference = 2
other-shapes = 1

[diagnoses.example-bug]
explain = "$TODO what the learner's code does wrong, and why it matters."
fix = "$TODO how to fix it."

[[followups]]
id = "first-choice"
kind = "choice"
question = "$TODO a question an interviewer asks about the idea."
options = ["$TODO the right answer", "$TODO a tempting wrong one", "$TODO another"]
answer = 1
explain = "$TODO why."

[[followups]]
id = "second-choice"
kind = "choice"
question = "$TODO a question."
options = ["$TODO the right answer", "$TODO a wrong one", "$TODO another"]
answer = 1
explain = "$TODO why."

[[followups]]
id = "third-choice"
kind = "choice"
question = "$TODO a question."
options = ["$TODO the right answer", "$TODO a wrong one", "$TODO another"]
answer = 1
explain = "$TODO why."

[[followups]]
id = "first-number"
kind = "numeric"
question = "$TODO a question with fresh numbers each time: B = {B}, T = {T}."
params = { B = [1, 2, 4], T = [128, 1024] }
answer = "2 * B * T"
explain = "$TODO how {answer:,} comes about."
mistakes = [{ answer = "B * T", explain = "$TODO the classic slip this answer is." }]

[[followups]]
id = "second-number"
kind = "numeric"
question = "$TODO a question: H = {H}."
params = { H = [8, 16, 32] }
answer = "H * 64"
explain = "$TODO how {answer:,} comes about."
'''

README = '''# Kata $order · $TODO the kata's title ($framework_name)

$TODO why the idea matters, in two sentences an interviewer would accept.

```python
def example(x: $type) -> $type
```

$TODO what the function returns, exactly.

## Tasks
1. **$TODO the first task.** $TODO what it asks.

## Try it
`kata run $slug` runs this example with your $module.py and says whether it prints what the
reference prints (below): your values in seconds, before `kata check` grades every case.

```python
from $module import example

# $TODO a worked example: call example on small (seeded) inputs and print what a learner wants to see
```

```text
$TODO what the example prints with the reference
```

## Checks
| check | points |
|---|---|
| matches the reference on every case | 2 |
| hidden: matches the reference on cases no public check shows | 1 |

```
kata check $slug      # grade your $module.py
kata hint $slug       # one more hint each time
```
'''

DOC = "$TODO what the learner writes, in one sentence; what it takes and returns."

STUB = '''$imports


def example(x: $type) -> $type:
    """$doc"""
    raise NotImplementedError("write example")
'''

REFERENCE = '''"""Reference of the $slug kata. $TODO where the idea comes from, with its source."""
$imports


def example(x: $type) -> $type:
    """$doc"""
    return 2 * x   # $TODO the reference: short, flat, a comment that says why
'''

# A Triton kata's reference computes in a kernel: its launcher only allocates and launches.
TRITON_REFERENCE = '''"""Reference of the $slug kata. $TODO where the idea comes from, with its source."""
$imports


@triton.jit
def _example_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)   # this program's block of elements
    mask = offs < n   # the last block runs past the end
    tl.store(out_ptr + offs, 2 * tl.load(x_ptr + offs, mask=mask), mask=mask)


def example(x: $type) -> $type:
    """$doc"""
    x = x.contiguous()
    out = torch.empty_like(x)
    _example_kernel[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), BLOCK=128)
    return out
'''

BUGS = '''"""Known $slug bugs, each a complete reference with exactly that mistake."""


def example_not_doubled(x):
    return x   # $TODO a mistake learners make, with a comment that says what goes wrong


BUGS = {"example-bug": {"example": example_not_doubled}}
'''

GRADER = '''"""Grader of the $slug kata ($readme)."""
$imports

from graders.engine import expect

SHAPES = [(2, 5), (3, 4, 6)]   # $TODO the public cases: every listed bug must show on them


def judge(learner, bugs, kata, x, case):
    """example(x) equals the reference's, to the tolerance of float64."""
    got = learner.example(x)
    tol = kata.tolerance("float64")
    expect.array(got, bugs.reference.example(x), call="example(x)", case=case, **tol,
                 diagnose=lambda: bugs.match(got, lambda impl: impl.example(x), **tol))


def test_matches_reference(learner, bugs, kata, rng):
    """matches the reference on every case"""
    for shape in SHAPES:   # the structure is the grader's; rng draws the values, fresh at each seed
        judge(learner, bugs, kata, $draw, f"x: float64 {shape}, standard normal")
'''

HIDDEN = '''"""Hidden checks of the $slug kata: fresh values at each grading, never in a student bundle."""
$imports

from graders.$module import judge


def test_other_shapes(learner, bugs, kata, case_rng, rng):
    """matches the reference on cases no public check shows"""
    # case_rng draws the structure (the same at every seed); rng the values (fresh at each).
    shape = tuple(int(n) for n in case_rng.integers(2, 7, size=3))
    judge(learner, bugs, kata, $draw, "hidden inputs")
'''

TESTS = '''"""What is specific to the $slug kata: the facts its README teaches. $TODO test each claim of the README
that code can check, with the installed libraries."""
from reference.$module import example


def test_example_doubles():
    assert example(1.5) == 3.0
'''

IDIOM = '''"""$TODO whose idiom this imitates (nanoGPT, Hugging Face, Llama, d2l, einsum, loops), and what
about it a grader could get wrong."""
$imports


def example(x):
    return $body
'''
IDIOMS = {"idiom_one": "2 * x", "idiom_two": "x + x", "idiom_three": "x * 2.0", "idiom_four": "x - (-x)"}
ZOO_BUG = '''"""$TODO the bug, written in an idiom of the zoo: the mistake learners make."""
$imports


def example(x):
    return x
'''


# A course's own kata (`kata new SLUG --katas-dir DIR`): the same kata in one folder, with a hidden
# check that stands alone and no style zoo or tests of the kit's.
FOLDER_HIDDEN = '''"""Hidden checks of the $slug kata: fresh values at each grading, never in a student bundle."""
$imports

from graders.engine import expect


def test_other_shapes(learner, bugs, kata, case_rng, rng):
    """matches the reference on cases no public check shows"""
    # case_rng draws the structure (the same at every seed); rng the values (fresh at each).
    shape = tuple(int(n) for n in case_rng.integers(2, 7, size=3))
    x = $draw
    got = learner.example(x)
    tol = kata.tolerance("float64")
    expect.array(got, bugs.reference.example(x), call="example(x)", case="hidden inputs", **tol,
                 diagnose=lambda: bugs.match(got, lambda impl: impl.example(x), **tol))
'''
COURSE_ORDER = 1001   # a course's own katas come after the kit's, whose orders stay below


class NewKataError(Exception):
    """The kata could not be written (the message says why); nothing was written."""


def plan(slug: str, framework: str, into: Path | None = None) -> dict[Path, str]:
    """{path: text} of every file of a new kata ``slug``: in the kit, or in the folder of a
    course's own katas ``into`` (manifest, README, stub, reference, bug oracles, grader and hidden
    checks, all in ``into/slug/``)."""
    if not SLUG.fullmatch(slug):
        raise NewKataError(f"{slug!r} is not a kata slug: lower-case words joined by hyphens, e.g. `ring-attention`.")
    if framework not in KINDS:
        raise NewKataError(f"--framework must be one of {', '.join(KINDS)} (a kata of plain Python numbers "
                           "starts from numpy's and sets `framework = \"python\"`).")
    known = katas()
    if into is not None and any(k.slug == slug for k in known):   # a course's kata may not take a kit's slug
        raise NewKataError(f"{slug} is a kata already ({next(k.dir for k in known if k.slug == slug)}).")
    orders = [k.order for k in known if (k.order >= COURSE_ORDER) == (into is not None)]
    kata = Kata(slug=slug, title=slug, order=max(orders, default=COURSE_ORDER - 1 if into else 0) + 1,
                framework=framework, dir=(into or KATAS_DIR) / slug, learner_file=slug.replace("-", "_") + ".py",
                folder=into is not None)
    taken = [path for path in (*kata.files.values(),) if path.exists() and path != kata.files["expected"]]
    if taken:
        raise NewKataError(f"{slug} exists already: {', '.join(shown(p) for p in taken)}.")
    kind = KINDS[framework]
    values = {"slug": slug, "module": kata.module, "order": kata.order, "framework": framework, "TODO": TODO,
              "framework_name": FRAMEWORK_NAMES[framework], "imports": kind["imports"], "type": kind["type"],
              "draw": kind["draw"]}
    values["doc"] = Template(DOC).substitute(values)
    values["readme"] = "its README.md, beside it" if into else f"katas/{slug}/README.md"
    # A kit's kata joins the last track (a new stage adds its own to TRACKS); a course's own is
    # listed after the kit's tracks, unless its author names one.
    values["track"] = "" if into else f'track = "{TRACKS[-1].name}"   # one of TRACKS in graders/engine/manifest.py\n'
    # Follow-up questions are for the kit's interviews: a course's own kata goes without.
    manifest = MANIFEST.split("\n[[followups]]")[0] + "\n" if into else MANIFEST
    files = {kata.files["manifest"]: manifest, kata.files["readme"]: README, kata.files["stub"]: STUB,
             kata.files["reference"]: TRITON_REFERENCE if framework == "triton" else REFERENCE, kata.files["bugs"]: BUGS, kata.files["grader"]: GRADER,
             kata.files["hidden"]: FOLDER_HIDDEN if into else HIDDEN}
    if into is None:   # the kit's own katas are tested and linted with a style zoo
        files.update({kata.files["tests"]: TESTS, kata.files["zoo"] / "idiom_one__example-bug.py": ZOO_BUG})
        files.update({kata.files["zoo"] / f"{name}.py": Template(IDIOM).safe_substitute(body=body)
                      for name, body in IDIOMS.items()})
    return {path: Template(text).substitute(values) for path, text in files.items()}


def write(slug: str, framework: str, into: Path | None = None) -> list[Path]:
    """Write the new kata's files and, in the kit, its row in the README's table of katas; the
    paths written. ``into``: the folder of a course's own katas (see ``plan``)."""
    files = plan(slug, framework, into)
    if into is not None:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        return list(files)
    readme = ROOT / "README.md"
    table = readme.read_text(encoding="utf-8")
    rows = [line for line in table.splitlines() if re.match(r"\| \d+ \| `", line)]
    if not rows:
        raise NewKataError("the README has no table of katas to add the new kata's row to.")
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    kata = parse(KATAS_DIR / slug / "kata.toml")
    readme.write_text(table.replace(rows[-1] + "\n", rows[-1] + "\n" + kata_row(kata) + "\n", 1), encoding="utf-8")
    return [*files, readme]
