"""Content is checked like code: every rule of docs/authoring.md, for every kata found in katas/.

The rules that read a kata's files run here as they are (lint.RULES). The graded rules were
proven by `kata lint --deep` at every seed of deep.SEEDS and recorded beside the kata's manifest
with its fingerprint. Here the record must match the kata's files and say every rule held, and
the subjects it graded are graded again, at one of their recorded seeds, and must keep their rule
and give exactly what the record says: the reference, the stub, the tampering probe and every bug
oracle at every run, and a quarter of the style zoo, drawn anew at each change of the kata or of the
engine (deep.regraded). test_cases.py proves at every seed that the checks' case structure
does not depend on it: why one seed stands for twenty."""
import dataclasses
import json
import runpy
import shutil
import subprocess
import sys
import traceback

import pytest

from graders.authoring.deep import (GRADED, changed_since, content, graded_keys, record_problems, regrade, regraded,
                                    subjects)
from graders.authoring.lint import (RULES, check_checks_table, check_citations, check_functions, check_hints,
                                     check_learner_words)
from graders.engine import tape
from graders.engine.manifest import ROOT, find, katas
from graders.practice import repro
from graders.engine.structure import TAMPERING

KATAS = [k.slug for k in katas()]


@pytest.mark.parametrize("slug, rule", [(k.slug, r.name) for k in katas() for r in RULES])
def test_rule_holds(slug, rule):
    ok, what = next(r for r in RULES if r.name == rule).check(find(slug))
    assert ok, what


@pytest.mark.parametrize("slug", KATAS)
def test_the_record_vouches_for_the_kata(slug):
    """katas/<slug>/lint.json matches the kata's files, and every entry keeps its rule."""
    said = record_problems(find(slug))
    assert not said, "\n".join(said)


@pytest.mark.parametrize("slug", KATAS)
def test_the_recorded_gradings_hold(slug, tmp_path, zygotes):
    """The subjects of the record the suite grades again (deep.regraded), each at one of its
    recorded seeds, keep their rule and give what the record says (when the record is current:
    otherwise the test above fails, naming the command). One pytest session grades them all, each in
    a sandbox of its own."""
    kata = find(slug)
    chosen = regraded(kata)
    wrong = []
    graded = regrade(kata, chosen, folder=tmp_path, zygote=zygotes(kata.framework), tapes=("zoo-bugs", "oracles"))
    for subject, (said, result) in zip(chosen, graded):
        failed = [f"{c['id']}: {c['message']}" for c in result["checks"] if c["status"] != "passed"]
        if said:
            wrong.append(f"{subject.name}: " + "\n".join(said + failed))
        if subject.rule == "tampering":   # the scan says where it looked
            assert all("inspect (line" in c["message"] for c in result["checks"] if c["diagnosis"] == TAMPERING)
    assert not wrong, "\n\n".join(wrong)
    _a_failed_check_reproduces(kata, chosen, tmp_path, zygotes(kata.framework))


def _a_failed_check_reproduces(kata, chosen, folder, zygote):
    """`kata repro`'s script of a public check a zoo bug (else a bug oracle) failed fails with the
    learner's own error (an exception from the file, or the script's assertion), and passes once the
    file is fixed (the reference in its place). Run here, in-process, as `python SCRIPT` runs it (a
    rank group's in a process of its own, as its ranks must be)."""
    for i, subject in sorted(enumerate(chosen), key=lambda pair: pair[1].rule != "zoo-bugs"):
        tapes, file = folder / str(i) / ".tapes", folder / str(i) / kata.learner_file
        for check in (tape.index(tapes) or {"checks": []})["checks"]:
            made = repro.write(kata, tapes, folder / "repro", check, zygote=zygote)
            if made.asserted:
                break
        else:
            continue
        break
    else:
        raise AssertionError(f"no zoo bug or bug oracle of {kata.slug} that the suite grades failed a public "
                             "check that `kata repro` can assert")
    error = _run(made.script, kata, file)
    assert error is not None, f"{made.script} passed on {subject.name}, which fails {made.check}"
    file.write_text(kata.files["reference"].read_text(encoding="utf-8"), encoding="utf-8")
    assert _run(made.script, kata, file) is None, f"{made.script} fails on the reference"


def _run(script, kata, file) -> str | None:
    """Run ``script``; None when it passes, else its error, which must be the learner's own."""
    if "import torch.distributed as dist" in script.read_text(encoding="utf-8"):
        run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 or str(file) in run.stderr or "AssertionError" in run.stderr, run.stderr
        return None if run.returncode == 0 else run.stderr
    saved = list(sys.path)
    # A bug oracle's file puts a package `reference` of its own in sys.modules: the kit's comes back.
    kit = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "reference"}
    sys.modules.pop(kata.module, None)
    try:
        runpy.run_path(str(script), run_name="__main__")
    except Exception as exc:
        frames = [frame.filename for frame in traceback.extract_tb(exc.__traceback__)]
        assert isinstance(exc, AssertionError) or str(file) in frames, traceback.format_exception(exc)
        return f"{type(exc).__name__}: {exc}"
    finally:
        sys.path[:] = saved
        sys.modules.pop(kata.module, None)
        for name in [name for name in sys.modules if name.split(".")[0] == "reference"]:
            del sys.modules[name]
        sys.modules.update(kit)
    return None


def _moved(kata, tmp_path, role, change):
    """``kata`` with the file of ``role`` replaced by a copy in ``tmp_path`` that ``change`` edits."""
    copy = tmp_path / kata.files[role].name
    copy.write_text(change(kata.files[role].read_text()))
    return dataclasses.replace(kata, paths={**kata.paths, role: copy})


@pytest.mark.parametrize("role", ["reference", "grader"])
def test_a_kata_changed_since_its_deep_lint_fails_naming_the_command(role, tmp_path):
    kata = find("softmax")
    assert record_problems(kata) == []
    changed = _moved(kata, tmp_path, role, lambda text: text + "\n# changed\n")
    said = record_problems(changed)
    assert len(said) == 1 and "its content changed since `kata lint --deep softmax` was run" in said[0] \
        and kata.files[role].relative_to(ROOT).as_posix() in said[0] and "commit katas/softmax/lint.json" in said[0]


def test_a_manifests_hints_and_catalogue_keys_need_no_deep_lint_and_its_graded_keys_do(tmp_path):
    """The record hashes the manifest's keys that decide grades, whatever its comments and layout, and
    of its diagnoses the codes, not their prose."""
    manifest = find("softmax").files["manifest"]
    text, copy = manifest.read_text(), tmp_path / "kata.toml"

    def keys(edited):
        assert edited != text
        copy.write_text(edited)
        return graded_keys(copy)

    for ungraded in (text.replace("minutes = 10", "minutes = 12") + "\n# a comment\n",
                     text.replace("with the same `axis`.", "with the same axis."),
                     text.replace('title = "Numerically stable softmax"', 'title = "Softmax"'),
                     text.replace("so slices along `axis` do not sum to 1.", "so its slices do not sum to 1.")):
        assert keys(ungraded) == graded_keys(manifest)
    for graded in (text.replace("stable-for-large-logits = 2", "stable-for-large-logits = 3"),
                   text.replace("rtol = 1e-7", "rtol = 1e-6"), text.replace("timeout_s = 10", "timeout_s = 20"),
                   text.replace("[diagnoses.softmax-global-max]", "[diagnoses.global-max]")):
        assert keys(graded) != graded_keys(manifest)


def test_a_file_changed_while_the_deep_lint_ran_keeps_it_from_writing_a_record(tmp_path):
    """The record vouches for the files as they were graded: `deep` takes their content before
    grading and writes nothing when it differs after (an author's edit mid-run)."""
    kata = find("softmax")
    moved = _moved(kata, tmp_path, "reference", lambda text: text)
    before = content(moved)
    assert changed_since(moved, before) == []
    moved.files["reference"].write_text(moved.files["reference"].read_text() + "\n# edited mid-run\n")
    assert changed_since(moved, before) == [str(moved.files["reference"])]


def _planted(kata, tmp_path, name, **result):
    """``kata`` with a record whose entry for ``name`` says ``result`` instead."""
    record = json.loads(kata.files["record"].read_text())
    record["subjects"][name]["result"].update(result)
    return _moved(kata, tmp_path, "record", lambda _: json.dumps(record))


def test_a_record_entry_that_breaks_its_rule_is_caught(tmp_path):
    kata = find("softmax")
    said = record_problems(_planted(kata, tmp_path, "oracle softmax-overflow", status="passed", score=10.0, lost={},
                                    diagnoses=[]))
    assert len(said) == 1 and "says oracle softmax-overflow breaks its rule" in said[0] \
        and "was not written by `kata lint --deep softmax`" in said[0]


def test_a_record_entry_planted_with_a_wrong_result_is_caught(tmp_path, zygotes):
    """A result that keeps the rule but is not what grading gives (a score moved): the sampled
    re-grade sees it."""
    kata, name = find("softmax"), "oracle softmax-overflow"
    planted = _planted(kata, tmp_path, name, score=6.0)
    assert record_problems(planted) == []   # the record alone looks right
    [(said, _)] = regrade(planted, [next(s for s in subjects(kata) if s.name == name)], folder=tmp_path,
                          zygote=zygotes(kata.framework))
    assert len(said) == 1 and "where lint.json records 6/10" in said[0] and "kata lint --deep softmax" in said[0]


def test_the_authors_guide_lists_every_rule():
    """docs/authoring.md lists each rule the suite applies, as the code words it."""
    guide = (ROOT / "docs" / "authoring.md").read_text()
    missing = [rule.name for rule in (*RULES, *GRADED) if f"- `{rule.name}`: {rule.text}.\n" not in guide]
    assert not missing, f"docs/authoring.md lacks (or words otherwise) the rules {missing}"


def test_lint_refuses_a_check_no_hint_serves():
    kata = find("softmax")
    tasks = tuple(dataclasses.replace(task, hints=tuple(
        dataclasses.replace(hint, serves=tuple(name for name in hint.serves if name != "banned-api") or ("sums-to-one",))
        for hint in task.hints)) for task in kata.tasks)
    ok, what = check_hints(dataclasses.replace(kata, tasks=tasks))
    assert not ok and what == "checks no hint serves (name them in a hint's `for`): banned-api"


def test_lint_refuses_tasks_whose_functions_are_wrong_or_missing():
    kata = find("roofline")
    names = [("dtype_bytes",), (), ("decode_intensity", "prefill_intensity", "attention_intensity"),
             ("crossover_batch",), ("train_flops_per_token", "mfu")]
    tasks = tuple(dataclasses.replace(task, functions=functions) for task, functions in zip(kata.tasks, names))
    ok, what = check_functions(dataclasses.replace(kata, tasks=tasks))
    assert not ok and what == ("tasks that name no function (`functions = [...]`): The time of one decode step; "
                               "not a public function or class of the stub: attention_intensity; "
                               "the stub's decode_step, attention_decode_intensity in no task's `functions`")


@pytest.mark.parametrize("where, text", [
    ("README.md", "\n**Decided here, where the issue is silent:** rows of zeros.\n"),
    ("stub.py", "\n# Checked against an oracle nobody here wrote.\n"),
    ("kata.toml", '\n[[followups]]\nid = "x"\nkind = "choice"\nquestion = "As issue 27 asks?"\n'
                  'options = ["a", "b", "c"]\nanswer = 1\nexplain = "x"\n'),
])
def test_words_of_the_kits_making_are_found(tmp_path, where, text):
    kata = find("softmax")
    shutil.copytree(kata.dir, tmp_path / "softmax")
    path = tmp_path / "softmax" / where
    path.write_text(path.read_text() + text)
    ok, what = check_learner_words(dataclasses.replace(kata, dir=tmp_path / "softmax"))
    assert not ok and what.startswith(f"{where} says"), what


@pytest.mark.parametrize("row, change, says", [
    ("| hidden: sums to 1 along `axis` | 1 |", "| sums to 1 along `axis` | 1 |", "rows marked hidden: 0"),
    ("| no library softmax | 1 |", "| no library softmax | 2 |", "points"),
    ("| no library softmax | 1 |", "", "points"),
])
def test_a_checks_table_out_of_step_with_the_manifest_is_found(tmp_path, row, change, says):
    kata = find("softmax")
    shutil.copytree(kata.dir, tmp_path / "softmax")
    readme = tmp_path / "softmax" / "README.md"
    assert row in readme.read_text()
    readme.write_text(readme.read_text().replace(row + "\n", change + "\n" if change else ""))
    ok, what = check_checks_table(dataclasses.replace(kata, dir=tmp_path / "softmax"))
    assert not ok and what.startswith("README checks table: " + says), what


def test_a_citation_of_the_authors_pages_is_found(tmp_path):
    kata = find("softmax")
    shutil.copytree(kata.dir, tmp_path / "softmax")
    readme = tmp_path / "softmax" / "README.md"
    readme.write_text(readme.read_text() + "\nThe tolerances are those of KATAS.md §1.\n")
    ok, what = check_citations(dataclasses.replace(kata, dir=tmp_path / "softmax"))
    assert not ok and what.startswith("README.md cites KATAS.md")


def test_the_suite_grades_an_oracle_of_each_diagnosis_again_and_a_share_of_the_rest_drawn_anew_when_the_engine_changes(
        tmp_path, monkeypatch):
    from graders.authoring import deep

    kata = find("kv-cache")
    every, chosen = subjects(kata), regraded(kata)
    assert [s.rule for s in chosen[:3]] == ["reference", "stub", "tampering"]
    first = [s for s in every if s.rule == "oracles" and "~" not in s.name]
    assert {s.code for s in first} == {s.code for s in every if s.rule == "oracles"} and set(first) <= set(chosen)
    variants = [s for s in every if s.rule == "oracles" and s not in first]
    for rule, of_rule in (("oracles", variants), *((r, [s for s in every if s.rule == r])
                                                    for r in ("zoo-solutions", "zoo-bugs"))):
        assert len(of_rule) > deep.ZOO_SHARE
        assert len([s for s in chosen if s in of_rule]) == -(-len(of_rule) // deep.ZOO_SHARE)
    engine = tmp_path / "engine"
    shutil.copytree(deep.ENGINE, engine, ignore=shutil.ignore_patterns("__pycache__"))
    (engine / "expect.py").write_text((engine / "expect.py").read_text() + "\n# a change\n")
    monkeypatch.setattr(deep, "ENGINE", engine)
    assert regraded(kata) != chosen
