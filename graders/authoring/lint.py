"""Author checks (`kata lint`): content is checked like code.

``RULES`` are the rules a kata's files must keep, read from them without grading anything (the
manifest parsing that reaches this far is a rule too: a broken manifest stops every command).
``kata lint`` applies them and grades the reference, the stub and every bug oracle at one seed;
``kata lint --deep`` (deep.py) applies them and every graded rule at the seeds a class could draw,
and records the verdict. The suite applies the same rules to every kata: docs/authoring.md lists
them all.
"""
from __future__ import annotations

import ast
import itertools
import random
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..engine.manifest import DIFFICULTIES, ROOT, TRACKS, Kata, mistakes
from ..engine.oracles import Bugs
from ..engine.questions import evaluate
from ..engine.structure import IMPORT_NOT_ALLOWED, TAMPERING, tampering
from ..practice.plots import PLOTS
from ..practice.run import HEADING, NoExample, example
from .leaks import leaks


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
    paths = [kata.files[role] for role in ("readme", "stub", "manifest", "reference", "grader", "bugs", "hidden",
                                           "expected")]
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

    manifest = tomllib.loads(kata.files["manifest"].read_text(encoding="utf-8"))
    return {kata.readme_path.name: kata.readme_path.read_text(encoding="utf-8"),
            kata.stub_path.name: kata.stub_path.read_text(encoding="utf-8"),
            "kata.toml": "\n".join(strings(manifest))}


def check_learner_words(kata: Kata) -> tuple[bool, str]:
    """No words of the kit's own making in what a learner reads (KIT_WORDS)."""
    found = [f"{name} says {match.group(0)!r} ({why})" for name, text in learner_texts(kata).items()
             for pattern, why in KIT_WORDS.items() for match in re.finditer(pattern, text, re.IGNORECASE)]
    return not found, ("its texts speak to the learner only" if not found else "; ".join(found))


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


def check_try_it(kata: Kata) -> tuple[bool, str]:
    """The README has a worked example `kata run` runs: one ```python block in its Try-it section,
    then the ```text block of what it prints (tests/test_run.py runs it with the reference)."""
    try:
        source, _ = example(kata)
    except NoExample as exc:
        return False, str(exc)
    return True, f"its `{HEADING}` example has {len(source.splitlines())} lines of code and their printout"


MIN_CHOICE, MIN_NUMERIC = 3, 2
MIN_HIDDEN, MAX_HIDDEN = 1, 3
MIN_IDIOMS = 4
# What `kata new` writes where the author has something to fill in.
MARKER = "TODO(kata new)"
# The roles of the files every kata has (``expected`` is optional; the zoo is a folder).
REQUIRED = ("manifest", "readme", "stub", "reference", "bugs", "grader", "hidden", "tests")


# A course's own kata needs no bug oracles, hidden checks, tests or style zoo.
COURSE_REQUIRED = ("manifest", "readme", "stub", "reference", "grader")


def check_files(kata: Kata) -> tuple[bool, str]:
    """Every file of the kata is in its place."""
    required = COURSE_REQUIRED if kata.folder else REQUIRED
    missing = [f"{role} ({shown(kata.files[role])})" for role in required if not kata.files[role].is_file()]
    if not kata.folder and not kata.files["zoo"].is_dir():
        missing.append(f"zoo ({shown(kata.files['zoo'])}/)")
    return not missing, ("every file in its place" if not missing else f"missing: {', '.join(missing)}")


def check_markers(kata: Kata) -> tuple[bool, str]:
    """No `kata new` marker is left: every place it asked for content holds content."""
    found = [f"{shown(path)}:{n}" for path in authored(kata) for n, line in
             enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if MARKER in line]
    return not found, ("no `kata new` marker left" if not found else
                       f"{len(found)} `{MARKER}` marker(s) to fill in: {', '.join(found[:8])}"
                       + (" …" if len(found) > 8 else ""))


def authored(kata: Kata) -> list[Path]:
    """The files an author writes for the kata (what `kata new` makes), those that exist."""
    paths = [kata.files[role] for role in (*REQUIRED, "expected")] + zoo(kata)
    return [p for p in paths if p.is_file()]


def zoo(kata: Kata) -> list[Path]:
    """The kata's style zoo: correct solutions ``<idiom>.py`` and bugs ``<idiom>__<code>.py``."""
    return sorted(kata.files["zoo"].glob("*.py"))


def zoo_code(path: Path) -> str | None:
    """The diagnosis a zoo file must get (None: a correct solution, full marks)."""
    return path.stem.split("__", 1)[1] if "__" in path.stem else None


def check_zoo(kata: Kata) -> tuple[bool, str]:
    """At least MIN_IDIOMS correct solutions in other people's idioms; each bug named for one of the
    kata's diagnoses."""
    files = zoo(kata)
    correct = [p for p in files if zoo_code(p) is None]
    unknown = [p.name for p in files if zoo_code(p) is not None and zoo_code(p) not in kata.diagnoses]
    ok = len(correct) >= MIN_IDIOMS and not unknown
    if ok:
        return ok, f"style zoo: {len(correct)} idioms, {len(files) - len(correct)} bugs"
    said = [f"{len(correct)} correct idioms, at least {MIN_IDIOMS} wanted"] if len(correct) < MIN_IDIOMS else []
    said += [f"{', '.join(unknown)} named for no diagnosis of the kata"] if unknown else []
    return ok, "style zoo: " + "; ".join(said)


def public_checks(kata: Kata) -> set[str]:
    """Ids of the checks in the kata's grader file."""
    return _test_ids(kata.files["grader"])


def hidden_checks(kata: Kata) -> set[str]:
    """Ids of the checks in the kata's hidden grader file (test_foo_bar is foo-bar)."""
    return _test_ids(kata.files["hidden"])


def _test_ids(path: Path) -> set[str]:
    if not path.exists():
        return set()
    return {node.name.removeprefix("test_").replace("_", "-") for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def check_graders(kata: Kata) -> tuple[bool, str]:
    """The graders' checks are [checks]: each in one file, MIN_HIDDEN to MAX_HIDDEN of them hidden."""
    public, hidden = public_checks(kata), hidden_checks(kata)
    problems = []
    if public | hidden != set(kata.checks) or public & hidden:
        problems.append(f"checks of the graders {sorted(public | hidden)} against [checks] {sorted(kata.checks)}"
                        + (f"; in both files: {', '.join(sorted(public & hidden))}" if public & hidden else ""))
    if not MIN_HIDDEN <= len(hidden) <= MAX_HIDDEN:
        problems.append(f"{len(hidden)} hidden checks, {MIN_HIDDEN} to {MAX_HIDDEN} wanted")
    return not problems, (f"{len(public)} public and {len(hidden)} hidden checks, as [checks] lists them"
                          if not problems else "; ".join(problems))


def check_followups(kata: Kata) -> tuple[bool, str]:
    """An interview asks up to five questions of one kata, with both kinds: the bank must hold them,
    each asked and graded as written (``asked_wrong``)."""
    kinds = [q.kind for q in kata.followups]
    choice, numeric = kinds.count("choice"), kinds.count("numeric")
    wrong = [f"{q.id}: {why}" for q in kata.followups if (why := asked_wrong(kata, q))]
    if choice < MIN_CHOICE or numeric < MIN_NUMERIC:
        wrong.insert(0, f"{choice} choice and {numeric} numeric questions; an interview needs at least "
                        f"{MIN_CHOICE} and {MIN_NUMERIC}")
    return not wrong, (f"{len(kinds)} follow-up questions ({choice} choice, {numeric} numeric)" if not wrong else
                       "follow-ups: " + "; ".join(wrong))


def asked_wrong(kata: Kata, q) -> str | None:
    """How question ``q`` is not asked and graded as written, drawn at a few seeds: None if it is.
    A choice question's text is literal (braces included) and its answer graded right with its
    explanation; a numeric one computes its answer (never a stored number), hides it from the
    text, grades it right, and grades another number and each listed mistake wrong, with the
    mistake's explanation."""
    if q.kind == "choice":
        asked = q.draw(random.Random(0), kata.slug)
        right, verdict = asked.grade(asked.expected)
        return None if asked.text == q.question and right and verdict == f"Right. {q.explain}" else \
            "not asked or graded as written"
    if isinstance(ast.parse(q.answer, mode="eval").body, ast.Constant):
        return "its answer is a stored number, not computed from its parameters"
    for seed in range(4):
        asked = q.draw(random.Random(seed), kata.slug)
        expected = asked.expected
        if "{" in asked.text or str(expected) in asked.text:
            return f"its text shows a brace or the answer ({asked.params})"
        if not asked.grade(repr(expected))[0] or asked.grade(repr(expected * 3 + 1))[0]:
            return f"the answer is not graded right, or another number is ({asked.params})"
        for mistake, why in q.mistakes:
            right, verdict = asked.grade(repr(evaluate(mistake, asked.params)))
            if right or not verdict.startswith(why.format(**asked.params, answer=expected)):
                return f"the mistake {mistake!r} is not graded wrong with its explanation ({asked.params})"
    return None


def check_tasks(kata: Kata) -> tuple[bool, str]:
    """Every task has a hint."""
    bare = [t.title for t in kata.tasks if not t.hints]
    return not bare, ("every task has a hint" if not bare else f"tasks without a hint: {', '.join(bare)}")


def check_hints(kata: Kata) -> tuple[bool, str]:
    """`kata hint` gives the hint for the check that failed: every check needs one."""
    served = {name for hint in kata.hints for name in hint.serves}
    unserved = [check for check in kata.checks if check not in served]
    return not unserved, (f"every check has a hint ({len(kata.hints)} hints)" if not unserved else
                          f"checks no hint serves (name them in a hint's `for`): {', '.join(unserved)}")


def check_track(kata: Kata) -> tuple[bool, str]:
    """The manifest says where the kata stands on the learner's path: its track and difficulty."""
    missing = ([f"no track ({', '.join(t.name for t in TRACKS)})"] if not kata.track else []) + \
              ([f"no difficulty ({', '.join(DIFFICULTIES)})"] if not kata.difficulty else [])
    return not missing, (f"on the {kata.track} track, {kata.difficulty}" if not missing else
                         f"the manifest names {' and '.join(missing)}")


def check_functions(kata: Kata) -> tuple[bool, str]:
    """Each task names the stub's functions and classes it writes (its ``functions``, whose failed
    calls `kata hint` answers with the task's hints), and each of those is some task's."""
    public = [name for name in api(kata.stub_path.read_text(encoding="utf-8")) if "." not in name]
    named = {name for task in kata.tasks for name in task.functions}
    bare = [task.title for task in kata.tasks if not task.functions]
    stray, unnamed = sorted(named - set(public)), [name for name in public if name not in named]
    problems = [said for wrong, said in (
        (bare, f"tasks that name no function (`functions = [...]`): {', '.join(bare)}"),
        (stray, f"not a public function or class of the stub: {', '.join(stray)}"),
        (unnamed, f"the stub's {', '.join(unnamed)} in no task's `functions`")) if wrong]
    return not problems, "; ".join(problems) or f"each task names its functions; the stub's {len(public)} are all named"


def check_plots(kata: Kata) -> tuple[bool, str]:
    """Every plot the manifest lists has a drawing."""
    missing = [kind for kind in kata.plots if (kata.slug, kind) not in PLOTS]
    return not missing, (f"{', '.join(kata.plots) or 'no plot'} to draw" if not missing else
                         f"plots without a drawing in graders/practice/plots.py: {', '.join(missing)}")


def check_diagnoses(kata: Kata) -> tuple[bool, str]:
    """The manifest's diagnoses are the bug oracles' codes, each explained, plus ``tampering`` where
    the structure checks find it (the source scan finds it, whatever the code computes: the
    reference with TAMPERING_PROBE added stands for its oracle) and the engine's
    ``import-not-allowed`` beside it."""
    documented, oracles = set(kata.diagnoses) - {TAMPERING, IMPORT_NOT_ALLOWED}, set(Bugs(kata).codes)
    unexplained = [d.code for d in kata.diagnoses.values() if not (d.explain and d.fix)]
    ok = documented == oracles and not unexplained
    return ok, (f"{len(oracles)} diagnoses, each with a bug oracle and an explanation" if ok else
                f"diagnoses without an oracle: {sorted(documented - oracles) or 'none'}; "
                f"oracles without [diagnoses] entry: {sorted(oracles - documented) or 'none'}"
                + (f"; without explain or fix: {', '.join(unexplained)}" if unexplained else ""))


def check_shared_mistakes(kata: Kata) -> tuple[bool, str]:
    """Every mistake of katas/mistakes.toml that can occur in the kata (its ``occurs`` among the
    manifest's ``features``) is named there with the library's code and explanation, and none is
    named that cannot occur."""
    occur = [code for code, mistake in mistakes().items() if mistake.occurs in kata.features]
    named = [code for code, diagnosis in kata.diagnoses.items() if diagnosis.shared]
    unnamed, stray = [c for c in occur if c not in named], [c for c in named if c not in occur]
    said = f"shared mistakes that can occur: {', '.join(occur) or 'none'}; named: {', '.join(named) or 'none'}"
    return not unnamed and not stray, said + (
        f"; can occur but not named (a bug oracle and `[diagnoses.CODE] shared = true`): {', '.join(unnamed)}"
        if unnamed else "") + (f"; named but its `occurs` is not among the features: {', '.join(stray)}" if stray else "")


def check_kata_table(kata: Kata) -> tuple[bool, str]:
    """The kit's README lists the kata in its table of katas, at its order."""
    listed = [line for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
              if line.startswith(f"| {kata.order} | `{kata.slug}` |")]
    if listed and MARKER in listed[0]:
        return False, f"its row in the README's table of katas still says `{MARKER}`: say what the learner writes"
    return bool(listed), ("the README's table of katas lists it" if listed else
                          f"the README's table of katas lacks its row, e.g. `{kata_row(kata)}`")


def kata_row(kata: Kata) -> str:
    """The kata's row in the README's table of katas."""
    return f"| {kata.order} | `{kata.slug}` | {FRAMEWORK_NAMES[kata.framework]} | {kata.summary or kata.title} |"


FRAMEWORK_NAMES = {"numpy": "NumPy", "torch": "PyTorch", "python": "Python", "triton": "Triton"}


def check_leaks(kata: Kata) -> tuple[bool, str]:
    """No function body of the reference is in what the learner is given: the stub and the grader
    (a student bundle ships the public grader)."""
    given = {shown(kata.files[role]): kata.files[role].read_text(encoding="utf-8") for role in ("stub", "grader")}
    found = leaks(given, among=[kata])
    return not found, ("the stub and the grader hold no reference code" if not found else "; ".join(found))


def check_scan(kata: Kata) -> tuple[bool, str]:
    """Where the kata judges structure (it declares ``tampering``), the static scan passes the
    reference, the stub and every style-zoo file but those named for ``tampering`` or
    ``banned-api`` (a banned import is named by its own check first)."""
    if TAMPERING not in kata.diagnoses:
        return True, "no structure checks, no static scan"
    paths = [kata.files["reference"], kata.files["stub"],
             *(p for p in zoo(kata) if zoo_code(p) not in (TAMPERING, "banned-api"))]
    refused = [f"{p.name}: {', '.join(found)}" for p in paths
               if (found := tampering(p.read_text(encoding="utf-8"), kata.framework, kata.allow))]
    return not refused, (f"the static scan passes the reference, the stub and {len(paths) - 2} zoo files"
                         if not refused else "the static scan refuses " + "; ".join(refused))


def check_api_rule(kata: Kata) -> tuple[bool, str]:
    findings = check_api(kata)
    return all(f.ok for f in findings), "; ".join(f.what for f in findings)


@dataclass(frozen=True)
class Rule:
    name: str
    text: str        # what it asks of the kata, for docs/authoring.md and `kata lint --help`
    check: object    # kata -> (ok, what)


# The rules read from a kata's files, in the order `kata lint` applies them: each later one may
# assume the files exist.
RULES = (
    Rule("files", "every file of the kata is in its place (Kata.files)", check_files),
    Rule("markers", f"no `{MARKER}` marker is left", check_markers),
    Rule("api", "stub and reference define the same names, signatures and docstrings", check_api_rule),
    Rule("graders", f"the graders' checks are [checks], {MIN_HIDDEN} to {MAX_HIDDEN} of them hidden", check_graders),
    Rule("tasks", "every task has a hint", check_tasks),
    Rule("hints", "every check has a hint that serves it", check_hints),
    Rule("functions", "every task names the stub's public functions and classes it writes, and each is some "
                      "task's", check_functions),
    Rule("followups", f"at least {MIN_CHOICE} choice and {MIN_NUMERIC} numeric follow-up questions, each asked and "
                      "graded as written: a numeric answer computed from its parameters, each listed mistake graded "
                      "wrong with its explanation", check_followups),
    Rule("diagnoses", "the diagnoses are the bug oracles' codes (and `tampering`, with the engine's "
                      "`import-not-allowed`), each explained", check_diagnoses),
    Rule("shared-mistakes", "every mistake of katas/mistakes.toml that can occur in the kata (its `occurs` among the "
                            "manifest's features) is named, with the library's code and explanation",
         check_shared_mistakes),
    Rule("checks-table", "the kata's README lists every check with its points, hidden ones marked",
         check_checks_table),
    Rule("try-it", f"the kata's README has a `{HEADING}` section: one ```python example, then the ```text block it "
                   "prints with the reference (tests/test_run.py runs it)", check_try_it),
    Rule("citations", "its files cite only what ships with it", check_citations),
    Rule("learner-words", "what a learner reads has no words of the kit's own making", check_learner_words),
    Rule("track", "the manifest names the kata's track (one of manifest.TRACKS) and its difficulty", check_track),
    Rule("plots", "every plot the manifest lists has a drawing (tests/test_plot.py draws each from the reference)",
         check_plots),
    Rule("zoo", f"at least {MIN_IDIOMS} correct solutions in the style zoo; each zoo bug named for a diagnosis",
         check_zoo),
    Rule("leaks", "no function body of the reference is in the stub or the grader", check_leaks),
    Rule("scan", "where the kata judges structure, the static scan passes the reference, the stub and the zoo's "
                 "files (but its `tampering` and `banned-api` bugs)", check_scan),
    Rule("kata-table", "the kit's README lists the kata in its table of katas", check_kata_table),
)


# What `kata lint` asks of a course's own kata: the rules that hold for any exercise (the kit's own
# also want hidden checks, follow-ups, a style zoo, a row in its README ...).
COURSE_RULES = tuple(rule for rule in RULES if rule.name in ("files", "markers", "api", "tasks", "hints", "diagnoses",
                                                               "leaks"))


def static(kata: Kata, progress=lambda finding: None) -> list[Finding]:
    """Every rule of RULES (of COURSE_RULES for a course's own kata), in order; a kata with files
    missing stops after the first."""
    findings = []
    for rule in COURSE_RULES if kata.folder else RULES:
        ok, what = rule.check(kata)
        findings.append(Finding(kata.slug, ok, f"{rule.name}: {what}"))
        progress(findings[-1])
        if rule.name == "files" and not ok:
            break
    return findings


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
