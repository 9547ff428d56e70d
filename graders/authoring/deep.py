"""`kata lint --deep`: every rule the suite applies to one kata, the graded ones at the seeds a class
could draw, and the record of its verdict beside the manifest (the kata's ``record`` file).

A known mistake's grade must not hang on the draw: every bug oracle and every bug of the style zoo
is graded at each of SEEDS and must lose the same checks at each, with its own diagnosis. That is
thousands of gradings, too many for every commit. So the proof is made here, once per change of the
kata, and recorded with the fingerprint of the kata's content (``content``); the suite then checks
at every run, cheaply, that

- the record matches the kata's files (else it names this command),
- the record itself says every rule held (it is read, not trusted: ``problems`` judges its entries),
- grading again, at one of its recorded seeds chosen from the fingerprint (``sampled_seed``), the
  reference, the stub, the tampering probe, one bug oracle of each diagnosis, and a share of the
  other oracles' variants and of the style zoo (``regraded``) gives exactly what the record says,
  so a record that lies is caught.

Why a few seeds then stand for twenty: a check's case structure is drawn from ``case_rng``, the
same at every seed (engine/draws.py), and a dry run proves it for every check at every seed of
SEEDS (``cases.seed_dependent``, also a rule here). Only values change with the seed.
"""
from __future__ import annotations

import hashlib
import json
import platform
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..engine.manifest import Kata
from ..engine.oracles import Bugs, code_of
from ..engine.runner import grade_files, grade_seeds
from ..engine.sandbox import Zygote
from ..engine.structure import TAMPERING, TAMPERING_PROBE
from . import cases, lint
from .lint import Finding, shown, zoo, zoo_code

# The seeds every graded rule holds at: small ones, as `--seed` replays take, and ones like a
# class's grading seeds, which lie in [2**31, 2**32).
SEEDS = (1, 2, 3, 4, 5) + tuple(2**31 + i for i in (0, 1, 2, 3, 7, 11, 99, 1_000, 4_099, 65_535, 123_456, 2**24,
                                                   10**8, 2**30, 2**31 - 1))
FEW = SEEDS[::4]   # a correct zoo solution's: it gets full marks, which the values cannot change
FORMAT = 1


@dataclass(frozen=True)
class Rule:
    name: str
    text: str


# The graded rules, on top of lint.RULES: docs/authoring.md lists both.
GRADED = (
    Rule("cases", f"every check's cases have the same structure at each of the {len(SEEDS)} seeds "
                  "(a dry run on the reference: graders/authoring/cases.py)"),
    Rule("reference", f"the reference passes with full score at each of the {len(SEEDS)} seeds"),
    Rule("stub", "the stub comes out not-started"),
    Rule("tampering", "the reference with a tampering line added is diagnosed `tampering` exactly where the "
                      "manifest declares it, and nowhere else"),
    Rule("oracles", f"every bug oracle (each variant) fails with its own diagnosis and no other, losing the "
                    f"same checks at each of the {len(SEEDS)} seeds"),
    Rule("zoo-bugs", f"every bug of the style zoo fails with the diagnosis its name gives, losing the same "
                     f"checks at each of the {len(SEEDS)} seeds"),
    Rule("zoo-solutions", f"every correct solution of the style zoo gets full marks at {len(FEW)} seeds"),
)


@dataclass(frozen=True)
class Subject:
    """Something graded for the kata's record: its name, the rule it keeps, its seeds."""
    name: str                 # "reference", "stub", "tampering", "oracle <variant>", "zoo <file stem>"
    rule: str                 # a GRADED rule's name
    seeds: tuple[int, ...]
    code: str | None = None   # the diagnosis it must get (oracles and zoo bugs)

    def source(self, kata: Kata) -> str:
        """The learner file that is this subject."""
        kind, _, name = self.name.partition(" ")
        reference = kata.files["reference"].read_text(encoding="utf-8")
        if kind == "reference":
            return reference
        if kind == "stub":
            return kata.files["stub"].read_text(encoding="utf-8")
        if kind == "tampering":
            return reference + TAMPERING_PROBE
        if kind == "oracle":
            return Bugs(kata).shim(name)
        return (kata.files["zoo"] / f"{name}.py").read_text(encoding="utf-8")


def subjects(kata: Kata) -> list[Subject]:
    """Everything graded for the kata's record, in order."""
    found = [Subject("reference", "reference", SEEDS), Subject("stub", "stub", SEEDS[:1]),
             Subject("tampering", "tampering", SEEDS[:1])]
    found += [Subject(f"oracle {name}", "oracles", SEEDS, code_of(name)) for name in Bugs(kata).names]
    for path in zoo(kata):
        code = zoo_code(path)
        found.append(Subject(f"zoo {path.stem}", "zoo-bugs", SEEDS, code) if code else
                     Subject(f"zoo {path.stem}", "zoo-solutions", FEW))
    return found


def summary(result: dict) -> dict:
    """What a record keeps of a result: the grade, the diagnoses, and each check lost with its
    diagnosis (skipped checks, CUDA's without a GPU, are not lost)."""
    return {"status": result["status"], "score": result["score"], "max_score": result["max_score"],
            "diagnoses": result["diagnoses"],
            "lost": {c["id"]: c["diagnosis"] for c in result["checks"] if c["status"] not in ("passed", "skipped")}}


def problems(kata: Kata, subject: Subject, summaries: list[dict]) -> list[str]:
    """What ``summaries`` (the subject's, one per seed graded) break of its rule: empty if nothing."""
    said = []
    for seed, got in zip(subject.seeds, summaries):
        wrong = _broken(kata, subject, got)
        if wrong:
            said.append(f"at seed {seed}: {wrong}")
            break
    other = next((seed for seed, got in zip(subject.seeds, summaries) if got != summaries[0]), None)
    if other is not None:
        said.append(f"its grade hangs on the draw: seed {subject.seeds[0]} gives {_grade(summaries[0])}, "
                    f"seed {other} gives {_grade(summaries[subject.seeds.index(other)])}")
    return said


def _grade(got: dict) -> str:
    return f"{got['score']:g}/{got['max_score']:g} losing {', '.join(got['lost']) or 'nothing'}" + \
        (f", diagnosed {', '.join(got['diagnoses'])}" if got["diagnoses"] else "")


def _broken(kata: Kata, subject: Subject, got: dict) -> str | None:
    """The sentence saying how one result breaks the subject's rule, or None."""
    full = got["status"] == "passed" and got["score"] == got["max_score"] > 0 and not got["diagnoses"]
    if subject.rule in ("reference", "zoo-solutions"):
        return None if full else f"{got['status']} {_grade(got)}"
    if subject.rule == "stub":
        return None if got["status"] == "not-started" else f"the stub is {got['status']}, not not-started"
    if subject.rule == "tampering":
        declared = TAMPERING in kata.diagnoses
        tampered = [cid for cid, code in got["lost"].items() if code == TAMPERING]
        others = [cid for cid, code in got["lost"].items() if code != TAMPERING]
        if bool(tampered) != declared:
            return (f"{TAMPERING} diagnosed by {', '.join(tampered) or 'no check'}, but kata.toml "
                    f"{'declares' if declared else 'does not declare'} [diagnoses.{TAMPERING}]")
        return f"it also loses {', '.join(others)}" if others else None
    caught = got["status"] == "failed" and subject.code in got["diagnoses"] and got["score"] < got["max_score"]
    # Another code's explanation for this one mistake is a wrong diagnosis (tampering excepted: the
    # shim that loads an oracle is found in the source).
    wrong = [d for d in got["diagnoses"] if d not in (subject.code, TAMPERING)]
    if caught and not wrong:
        return None
    return f"{got['status']} {_grade(got)}, where {subject.code} alone was due"


# --- the record ------------------------------------------------------------------------------------

# The manifest's keys that decide no grade of a file: where the kata stands in the catalogue and how
# long it takes, its tasks and their hints, its plots and its interview follow-ups (which the suite
# checks at every run). Editing them needs no deep lint. Of its diagnoses only the codes decide
# grades: their explanations and fixes are prose, which `kata lint` checks at every run.
UNGRADED = ("title", "summary", "order", "track", "difficulty", "minutes", "tasks", "plots", "followups")


def content(kata: Kata) -> dict[str, str]:
    """{path: sha256} of every file that decides the kata's grades: the manifest (its keys outside
    UNGRADED, whatever their layout and comments), stub, reference, bug oracles, expected
    values, graders and style zoo (its README and own tests are checked at every run)."""
    paths = [kata.files[role] for role in ("stub", "reference", "bugs", "expected", "grader", "hidden")]
    files = {shown(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in [*paths, *zoo(kata)] if p.is_file()}
    return {shown(kata.files["manifest"]): graded_keys(kata.files["manifest"]), **files}


def graded_keys(manifest: Path) -> str:
    """The sha256 of a manifest's keys that decide grades (all but UNGRADED; of the diagnoses, their codes)."""
    keys = {k: v for k, v in tomllib.loads(manifest.read_text(encoding="utf-8")).items() if k not in UNGRADED}
    keys["diagnoses"] = sorted(keys.get("diagnoses", {}))
    return hashlib.sha256(json.dumps(keys, sort_keys=True, default=str).encode()).hexdigest()


def fingerprint(files: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def command(kata: Kata) -> str:
    return f"kata lint --deep {kata.slug}"


def read_record(kata: Kata) -> dict | None:
    path = kata.files["record"]
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_record(kata: Kata, graded: dict[str, list[dict]], files: dict[str, str]) -> Path:
    """Write the record of a deep lint every rule of which held: ``graded`` holds each subject's
    summaries, one per seed (all equal by then), of the kata's ``files`` as they were graded."""
    import torch

    record = {"format": FORMAT, "kata": kata.slug, "command": command(kata), "fingerprint": fingerprint(files),
              "files": files, "made with": {"python": platform.python_version(), "torch": torch.__version__},
              "subjects": {s.name: {"rule": s.rule, "seeds": list(s.seeds), "result": graded[s.name][0]}
                           for s in subjects(kata)}}
    # One line per subject: a change of the kata shows in a diff as the entries it changed.
    head = json.dumps({k: v for k, v in record.items() if k != "subjects"}, indent=1, sort_keys=True)
    entries = ",\n".join(f"  {json.dumps(name)}: {json.dumps(entry, sort_keys=True)}"
                         for name, entry in record["subjects"].items())
    path = kata.files["record"]
    path.write_text(f'{head[:-2]},\n "subjects": {{\n{entries}\n }}\n}}\n', encoding="utf-8")
    return path


def record_problems(kata: Kata) -> list[str]:
    """Why the kata's record does not vouch for it as it is now (no grading: the record is read and
    its entries judged by the rules): empty when it does."""
    record, where = read_record(kata), shown(kata.files["record"])
    fix = f"run `{command(kata)}` and commit {where}"
    if record is None or record.get("format") != FORMAT:
        return [f"{kata.slug}: {where} is missing or unreadable: {fix}"]
    files = content(kata)
    if record.get("fingerprint") != fingerprint(files) or record.get("files") != files:
        changed = sorted(set(files.items()) ^ set(record.get("files", {}).items()))
        return [f"{kata.slug}: its content changed since `{command(kata)}` was run "
                f"({', '.join(dict.fromkeys(path for path, _ in changed))}): {fix}"]
    expected = {s.name: s for s in subjects(kata)}
    recorded = record.get("subjects", {})
    said = []
    if set(recorded) != set(expected):
        said.append(f"{kata.slug}: {where} grades {sorted(set(recorded) ^ set(expected))} "
                    f"apart from what the kata has: {fix}")
    for name, subject in expected.items():
        entry = recorded.get(name)
        if entry is None:
            continue
        if entry.get("rule") != subject.rule or tuple(entry.get("seeds", ())) != subject.seeds:
            said.append(f"{kata.slug}: {where} graded {name} at other seeds or by another rule: {fix}")
            continue
        for wrong in problems(kata, subject, [entry["result"]] * len(subject.seeds)):
            said.append(f"{kata.slug}: {where} says {name} breaks its rule ({wrong}): it was not written by "
                        f"`{command(kata)}`, which writes only what passes")
    return said


def regrade(kata: Kata, chosen: list[Subject], *, folder: Path, zygote: Zygote | None = None,
            tapes: tuple[str, ...] = ()) -> list[tuple[list[str], dict]]:
    """Grade each of ``chosen`` at its sampled seed, all in one pytest session: what each result
    breaks of its rule and, where the record vouches for the kata, how it differs from the
    record's entry (empty: nothing); and the result. The subjects of the rules ``tapes`` keep the
    tapes of their failed public checks, each in ``folder/<i>/.tapes`` beside its file ``folder/<i>/``."""
    runs = []
    for i, subject in enumerate(chosen):
        path = folder / str(i) / kata.learner_file
        path.parent.mkdir(parents=True)
        path.write_text(subject.source(kata), encoding="utf-8")
        runs.append((path, sampled_seed(kata, subject)))
    results = grade_files(kata, runs, device="cpu", zygote=zygote,
                          repro={i: folder / str(i) / ".tapes" for i, s in enumerate(chosen) if s.rule in tapes})
    record = None if record_problems(kata) else read_record(kata)   # read once for the whole batch
    return [(_against_record(kata, subject, seed, result, record), result)
            for subject, (_, seed), result in zip(chosen, runs, results)]


def _against_record(kata: Kata, subject: Subject, seed: int, result: dict, record: dict | None) -> list[str]:
    got = summary(result)
    said = problems(kata, Subject(subject.name, subject.rule, (seed,), subject.code), [got])
    if record is not None:   # the record vouches for the kata: the result must be its entry
        recorded = record["subjects"][subject.name]["result"]
        if got != recorded:
            said.append(f"graded at seed {seed}, {subject.name} gives {_grade(got)}, where "
                        f"{kata.files['record'].name} records {_grade(recorded)}: the kit no longer grades the "
                        f"kata as recorded; if that is meant, run `{command(kata)}` and commit the record")
    return said


# The share the suite grades again each run of the bug oracles' further variants and of the style
# zoo: one in ZOO_SHARE of each rule.
ZOO_SHARE = 4
ENGINE = Path(__file__).resolve().parents[1] / "engine"


def _engine_key(kata: Kata) -> str:
    """The fingerprint of the kata's content and of the engine that grades it: a change of either
    draws other subjects and seeds for the suite."""
    engine = {f"engine/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(ENGINE.glob("*.py"))}
    return fingerprint({**content(kata), **engine})


CASES_SHARE = 3   # the seeds of SEEDS at which the suite runs the cases rule again (the first and two drawn)


def cases_seeds(kata: Kata) -> list[int]:
    """The seeds at which the suite proves the cases rule again: the first of SEEDS and two drawn
    from the kata's and the engine's fingerprint. `kata lint --deep` proves it at all of SEEDS,
    and its record holds only for the content it graded (record_problems)."""
    key = _engine_key(kata)
    drawn = sorted(SEEDS[1:], key=lambda seed: hashlib.sha256(f"{key} {seed}".encode()).hexdigest())
    return [SEEDS[0], *drawn[:CASES_SHARE - 1]]


def regraded(kata: Kata) -> list[Subject]:
    """The subjects of the record the suite grades again: the reference, the stub, the tampering
    probe and the first bug oracle of each diagnosis, each run, and one in ZOO_SHARE (at least one)
    of the oracles' further variants, of the style zoo's correct solutions and of its bugs. The
    share is drawn from the fingerprint of the kata and of the engine that grades it, so that a
    change of either draws another: every variant and every file of the zoo is graded at every seed
    by `kata lint --deep`, and again by the suite over a few changes."""
    key = _engine_key(kata)
    draw = lambda s: hashlib.sha256(f"{key} {s.name}".encode()).hexdigest()
    every = subjects(kata)
    chosen = {s.name for s in every if s.rule in ("reference", "stub", "tampering")
              or (s.rule == "oracles" and "~" not in s.name)}   # a variant is named "oracle CODE~2"
    for rule in ("oracles", "zoo-solutions", "zoo-bugs"):
        drawn = sorted((s for s in every if s.rule == rule and s.name not in chosen), key=draw)
        chosen |= {s.name for s in drawn[:-(-len(drawn) // ZOO_SHARE)]}
    return [s for s in every if s.name in chosen]


def sampled_seed(kata: Kata, subject: Subject) -> int:
    """The seed the suite grades ``subject`` at: one of its recorded seeds, chosen by the kata's
    content, so that each run re-grades one entry of each subject it grades and a new content
    another. The same for every subject that has it (the reference, every oracle and zoo bug):
    their checks then meet the same inputs, whose oracle values a Triton kata computes once
    (recording.MEMO)."""
    draw = int(hashlib.sha256(fingerprint(content(kata)).encode()).hexdigest(), 16)
    common = SEEDS[draw % len(SEEDS)]
    return common if common in subject.seeds else subject.seeds[draw % len(subject.seeds)]


# --- kata lint, and kata lint --deep ---------------------------------------------------------------

def check(kata: Kata, *, seed: int, progress=lambda finding: None) -> list[Finding]:
    """`kata lint`: every rule of lint.RULES, and the reference, the stub, the tampering probe and
    every bug oracle graded at ``seed``: minutes less than ``deep``, and no record."""
    chosen = [Subject(s.name, s.rule, (seed,), s.code) for s in subjects(kata) if not s.name.startswith("zoo ")]
    return _run(kata, chosen, progress, cases_rule=False)[0]


def deep(kata: Kata, progress=lambda finding: None) -> tuple[list[Finding], Path | None]:
    """`kata lint --deep`: every rule, the graded ones at their seeds; the record's path if every
    rule held and it was written."""
    files = content(kata)
    findings, graded = _run(kata, subjects(kata), progress, cases_rule=True)
    if graded is None or not all(f.ok for f in findings):
        return findings, None
    changed = changed_since(kata, files)
    if changed:   # what was graded is not what the record would vouch for
        findings.append(Finding(kata.slug, False, f"record: {', '.join(changed)} changed while it ran: run "
                                                  f"`{command(kata)}` again, with the files left as they are"))
        progress(findings[-1])
        return findings, None
    return findings, write_record(kata, graded, files)


def changed_since(kata: Kata, files: dict[str, str]) -> list[str]:
    """The kata's files whose content is not ``files``' (a ``content`` taken earlier)."""
    return sorted(dict.fromkeys(path for path, _ in set(files.items()) ^ set(content(kata).items())))


def _run(kata: Kata, chosen: list[Subject], progress, *, cases_rule: bool) -> tuple[list[Finding], dict | None]:
    findings = lint.static(kata, progress)
    if not findings[0].ok:   # files are missing: nothing can be graded
        return findings, None

    def add(ok: bool, what: str):
        findings.append(Finding(kata.slug, ok, what))
        progress(findings[-1])

    if cases_rule:
        varied = cases.seed_dependent(kata, list(SEEDS))
        add(not varied, f"cases: every check's structure is the same at {len(SEEDS)} seeds" if not varied else
            "cases: " + "; ".join(varied.values()))
    graded = {}
    with Zygote([kata.framework], isolated=None, warm=True) as zygote, \
            tempfile.TemporaryDirectory(prefix="kata-lint-") as tmp:
        path = Path(tmp) / kata.learner_file
        for subject in chosen:
            path.write_text(subject.source(kata), encoding="utf-8")
            results = grade_seeds(kata, path, list(subject.seeds), device="cpu", zygote=zygote)
            graded[subject.name] = [summary(r) for r in results]
            wrong = problems(kata, subject, graded[subject.name])
            first = graded[subject.name][0]
            add(not wrong, f"{subject.name}: " + ("; ".join(wrong) if wrong else
                f"{first['status']}" + ("" if first["status"] == "not-started" else f" {_grade(first)}")
                + (f", the same at {len(subject.seeds)} seeds" if len(subject.seeds) > 1 else "")))
    return findings, graded
