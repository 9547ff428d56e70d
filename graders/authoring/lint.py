"""Author checks (`kata lint`): content is checked like code.

For each kata: its files exist; stub and reference define the same names with the same
signatures and docstrings; every task has a hint and every check a hint that serves it; what a
learner reads has no words of the kit's own making; the README's checks table is [checks], hidden
checks marked; the interview follow-ups hold enough questions of both kinds (their manifest parse
has computed every numeric answer already); every plot the manifest lists can be drawn; the
manifest's diagnoses are exactly the bug oracles' codes, plus ``tampering`` where the structure
checks find it; the reference passes with full score; the stub comes out not-started; every bug
oracle fails with its own diagnosis code and no other; and the reference with a tampering line
added is diagnosed ``tampering`` exactly where the manifest declares it.
"""
from __future__ import annotations

import ast
import itertools
import re
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..engine.manifest import Kata
from ..engine.oracles import Bugs, code_of
from ..engine.plugin import hidden_grader
from ..engine.runner import grade
from ..engine.structure import TAMPERING, TAMPERING_PROBE
from ..practice.plots import PLOTS


@dataclass
class Finding:
    kata: str
    ok: bool
    what: str


def api(source: str) -> dict[str, tuple]:
    """Public top-level functions and classes (with their public methods, ``__init__`` and
    ``forward``): name -> (signature, docstring)."""
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            found[node.name] = _describe(node)
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and (not item.name.startswith("_") or item.name == "__init__"):
                        found[f"{node.name}.{item.name}"] = _describe(item)
    return found


def _describe(node) -> tuple:
    if isinstance(node, ast.ClassDef):
        signature = "(" + ", ".join(ast.unparse(b) for b in node.bases) + ")"
    else:
        signature = f"({ast.unparse(node.args)})" + (f" -> {ast.unparse(node.returns)}" if node.returns else "")
    return signature, ast.get_docstring(node)


def check_api(kata: Kata) -> list[Finding]:
    stub = api(kata.stub_path.read_text(encoding="utf-8"))
    ref = api(kata.reference_path.read_text(encoding="utf-8"))
    findings = []
    for name in sorted(set(stub) | set(ref)):
        if name not in stub or name not in ref:
            where = "stub" if name not in stub else "reference"
            findings.append(Finding(kata.slug, False, f"{name} is missing from the {where}"))
        elif stub[name][0] != ref[name][0]:
            findings.append(Finding(kata.slug, False, f"{name}: stub signature {stub[name][0]} "
                                                      f"differs from the reference's {ref[name][0]}"))
        elif stub[name][1] != ref[name][1]:
            findings.append(Finding(kata.slug, False, f"{name}: stub and reference docstrings differ"))
    if not findings:
        findings.append(Finding(kata.slug, True, f"stub and reference share {len(ref)} names, "
                                                 "signatures and docstrings"))
    return findings


# Pages of the kit's authors that are not shipped: a learner or a reader of the code cannot open them.
UNSHIPPED = ("KATAS.md", "DESIGN.md")


def check_citations(kata: Kata) -> tuple[bool, str]:
    """The kata's files cite only what ships with it (its own README), never the authors' pages."""
    paths = (kata.readme_path, kata.stub_path, kata.dir / "kata.toml", kata.reference_path, kata.grader_path,
             kata.reference_path.with_name(f"{kata.module}_bugs.py"), hidden_grader(kata),
             kata.reference_path.with_name(f"{kata.module}_expected.py"))
    cited = sorted({f"{path.name} cites {page}" for path in paths if path.exists()
                    for page in UNSHIPPED if page in path.read_text(encoding="utf-8")})
    return not cited, ("its files cite only what ships (the kata's README)" if not cited else
                       "; ".join(cited) + ": cite the kata's README instead, which learners have")


# Words about how the kit was made, which a learner cannot follow: what a kata ships speaks to the
# learner about attention only.
KIT_WORDS = {
    r"\bdecided here\b": "say what the convention is, not where it was decided",
    r"\bthe issue\b|\bissue #?\d+": "the learner has no issue to read",
    r"\bnobody here\b": "say whose code it is (torch's, SciPy's), not who did not write it",
    r"\boracles?\b": "say what the check compares with (the reference, torch's autograd)",
}


def learner_texts(kata: Kata) -> dict[str, str]:
    """What a learner reads of the kata: its README, its stub and every string of its manifest
    (titles, hints, diagnoses, follow-ups; the manifest's comments are for authors)."""
    def strings(value):
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for item in value.values():
                yield from strings(item)
        elif isinstance(value, list):
            for item in value:
                yield from strings(item)

    manifest = tomllib.loads((kata.dir / "kata.toml").read_text(encoding="utf-8"))
    return {kata.readme_path.name: kata.readme_path.read_text(encoding="utf-8"),
            kata.stub_path.name: kata.stub_path.read_text(encoding="utf-8"),
            "kata.toml": "\n".join(strings(manifest))}


def check_learner_words(kata: Kata) -> tuple[bool, str]:
    """No words of the kit's own making in what a learner reads (KIT_WORDS)."""
    found = [f"{name} says {match.group(0)!r} ({why})" for name, text in learner_texts(kata).items()
             for pattern, why in KIT_WORDS.items() for match in re.finditer(pattern, text, re.IGNORECASE)]
    return not found, ("its texts speak to the learner only" if not found else "; ".join(found))


def hidden_checks(kata: Kata) -> set[str]:
    """Ids of the checks in the kata's hidden grader file (test_foo_bar is foo-bar)."""
    path = hidden_grader(kata)
    if not path.exists():
        return set()
    return {node.name.removeprefix("test_").replace("_", "-") for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def check_checks_table(kata: Kata) -> tuple[bool, str]:
    """The README's checks table is the manifest's [checks]: one row per check, in order, with its
    points, and "hidden: " at the start of exactly the hidden checks' rows."""
    lines = kata.readme_path.read_text(encoding="utf-8").splitlines()
    if "| check | points |" not in lines:
        return False, "the README has no `| check | points |` table"
    start = lines.index("| check | points |") + 2
    rows = [line.strip("| ").rsplit("|", 1) for line in itertools.takewhile(lambda l: l.startswith("|"), lines[start:])]
    problems = []
    if [points.strip() for _, points in rows] != [f"{p:g}" for p in kata.checks.values()]:
        problems.append(f"points {[p.strip() for _, p in rows]} against [checks] {list(kata.checks.values())}")
    hidden = hidden_checks(kata)
    marked = [i for i, (text, _) in enumerate(rows) if text.startswith("hidden:")]
    if marked != [i for i, check in enumerate(kata.checks) if check in hidden]:
        problems.append(f"rows marked hidden: {len(marked)}, hidden checks: {', '.join(sorted(hidden)) or 'none'}")
    return not problems, ("the README's checks table lists every check with its points, hidden ones marked"
                          if not problems else "README checks table: " + "; ".join(problems))


MIN_CHOICE, MIN_NUMERIC = 3, 2


def check_followups(kata: Kata) -> tuple[bool, str]:
    """An interview asks up to five questions of one kata, with both kinds: the bank must hold them."""
    kinds = [q.kind for q in kata.followups]
    choice, numeric = kinds.count("choice"), kinds.count("numeric")
    ok = choice >= MIN_CHOICE and numeric >= MIN_NUMERIC
    return ok, (f"{len(kinds)} follow-up questions ({choice} choice, {numeric} numeric)" if ok else
                f"follow-ups: {choice} choice and {numeric} numeric questions; an interview needs at least "
                f"{MIN_CHOICE} and {MIN_NUMERIC}")


def check_hints(kata: Kata) -> tuple[bool, str]:
    """`kata hint` gives the hint for the check that failed: every check needs one."""
    served = {name for hint in kata.hints for name in hint.serves}
    unserved = [check for check in kata.checks if check not in served]
    return not unserved, (f"every check has a hint ({len(kata.hints)} hints)" if not unserved else
                          f"checks no hint serves (name them in a hint's `for`): {', '.join(unserved)}")


def lint(kata: Kata, *, seed: int, progress=lambda finding: None) -> list[Finding]:
    findings: list[Finding] = []

    def add(ok: bool, what: str):
        findings.append(Finding(kata.slug, ok, what))
        progress(findings[-1])

    for path in (kata.readme_path, kata.stub_path, kata.reference_path, kata.grader_path,
                 kata.reference_path.with_name(f"{kata.module}_bugs.py")):
        if not path.exists():
            add(False, f"missing file {path}")
    if findings:
        return findings
    for finding in check_api(kata):
        findings.append(finding)
        progress(finding)
    bare = [t.title for t in kata.tasks if not t.hints]
    add(not bare, "every task has a hint" if not bare else f"tasks without a hint: {', '.join(bare)}")
    add(*check_hints(kata))
    ok, what = check_followups(kata)
    add(ok, what)
    add(*check_citations(kata))
    add(*check_learner_words(kata))
    add(*check_checks_table(kata))
    if kata.plots:
        missing = [kind for kind in kata.plots if (kata.slug, kind) not in PLOTS]
        add(not missing, f"plots {', '.join(kata.plots)} can be drawn" if not missing else
            f"plots without a drawing in graders/practice/plots.py: {', '.join(missing)}")

    bugs = Bugs(kata)
    # tampering is found in the source by the trusted scan, whatever the code computes: no bug
    # oracle stands for it; the reference with TAMPERING_PROBE added does, below.
    documented, oracles = set(kata.diagnoses) - {TAMPERING}, set(bugs.codes)
    add(documented == oracles,
        f"{len(oracles)} diagnoses, each with a bug oracle and an explanation" if documented == oracles else
        f"diagnoses without an oracle: {sorted(documented - oracles) or 'none'}; "
        f"oracles without [diagnoses] entry: {sorted(oracles - documented) or 'none'}")

    with tempfile.TemporaryDirectory(prefix="kata-lint-") as tmp:
        def run(source: str) -> dict:
            path = Path(tmp) / kata.learner_file
            path.write_text(source, encoding="utf-8")
            return grade(kata, path, seed=seed, device="cpu")

        result = run(kata.reference_path.read_text(encoding="utf-8"))
        # Skipped checks (@cuda without a GPU) do not count: the result's max_score leaves them out.
        full = result["status"] == "passed" and result["score"] == result["max_score"]
        skipped = sum(c["status"] == "skipped" for c in result["checks"])
        note = f" ({skipped} CUDA check(s) skipped: no GPU)" if skipped else ""
        add(full, f"reference passes with full score {result['score']:g}/{result['max_score']:g}{note}" if full else
            f"reference scores {result['score']:g}/{result['max_score']:g} ({result['status']}): "
            + "; ".join(f"{c['id']}: {c['message'].splitlines()[0]}" for c in result["checks"] if c["status"] != "passed"))

        result = grade(kata, kata.stub_path, seed=seed, device="cpu")
        add(result["status"] == "not-started", f"stub is {result['status']}")

        for name in bugs.names:
            result = run(bugs.shim(name))
            code = code_of(name)
            caught = result["status"] == "failed" and code in result["diagnoses"]
            others = [d for d in result["diagnoses"] if d != code]
            # Another code's explanation given for this one mistake would be a wrong diagnosis
            # (tampering excepted: the shim that loads an oracle is found in the source).
            wrong = [d for d in others if d != TAMPERING]
            add(caught and not wrong,
                f"bug oracle {name}: {result['status']} {result['score']:g}/{result['max_score']:g}, "
                f"diagnosed {code}" + (f" (also {', '.join(others)})" if others else "") if caught and not wrong else
                f"bug oracle {name}: {result['status']}, diagnosed {', '.join(result['diagnoses']) or 'nothing'}"
                + (f": {', '.join(wrong)} explain another mistake than {code}" if caught else ""))

        result = run(kata.reference_path.read_text(encoding="utf-8") + TAMPERING_PROBE)
        caught = [c["id"] for c in result["checks"] if c["diagnosis"] == TAMPERING]
        declared = TAMPERING in kata.diagnoses
        add(bool(caught) == declared, f"reference with `{TAMPERING_PROBE.strip()}` added: "
            + (f"{TAMPERING} diagnosed by {', '.join(caught)}" if caught else f"no {TAMPERING} diagnosis")
            + ("" if bool(caught) == declared else
               f", but kata.toml {'declares' if declared else 'does not declare'} [diagnoses.{TAMPERING}]"))
    return findings
