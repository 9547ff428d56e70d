"""Content is checked like code: for every kata found in katas/, the reference passes with full
score, the stub is not-started, every bug oracle is caught with its own diagnosis code (at every
seed of SEEDS, with the same grade at each), tampering is diagnosed where the manifest declares
it, and stub and reference share names, signatures and docstrings, and its files cite only what
ships."""
import dataclasses
import shutil

import pytest

from conftest import SEEDS, uneven
from graders.authoring.lint import check_api, check_checks_table, check_citations, check_hints, check_learner_words
from graders.engine.manifest import find, katas
from graders.engine.oracles import Bugs, code_of
from graders.engine.structure import TAMPERING, TAMPERING_PROBE

KATAS = [k.slug for k in katas()]
ORACLES = [(k.slug, name) for k in katas() for name in Bugs(k).names]   # every variant of every bug


@pytest.mark.parametrize("slug", KATAS)
def test_reference_passes_with_full_score(slug, grade_source):
    kata = next(k for k in katas() if k.slug == slug)
    # Its source, not an import: as root the sandbox cannot read reference/.
    result = grade_source(slug, kata.reference_path.read_text())
    failed = {c["id"]: c["message"] for c in result["checks"] if c["status"] not in ("passed", "skipped")}
    assert failed == {}
    assert result["status"] == "passed"
    assert result["score"] == result["max_score"] > 0
    assert result["diagnoses"] == []


@pytest.mark.parametrize("slug", KATAS)
def test_stub_is_not_started(slug, grade_source):
    kata = next(k for k in katas() if k.slug == slug)
    result = grade_source(slug, kata.stub_path.read_text())
    assert result["status"] == "not-started"
    assert result["score"] == 0
    assert all(c["status"] in ("failed", "skipped") for c in result["checks"])


@pytest.mark.parametrize("slug,name", ORACLES)
def test_bug_oracle_is_caught_with_its_own_diagnosis(slug, name, grade_at_seeds):
    """At every seed of SEEDS, losing the same checks at each: a known bug's grade must not hang on
    the draw of a class's seeds."""
    kata = next(k for k in katas() if k.slug == slug)
    results = grade_at_seeds(slug, Bugs(kata).shim(name), SEEDS)
    for seed, result in zip(SEEDS, results):
        assert result["status"] == "failed", f"seed {seed}"
        assert code_of(name) in result["diagnoses"], f"seed {seed}: {result['diagnoses']}"
        # ... and no other code's explanation: that would be a wrong diagnosis of this one mistake.
        assert set(result["diagnoses"]) <= {code_of(name), TAMPERING}, f"seed {seed}: {result['diagnoses']}"
        assert result["score"] < result["max_score"], f"seed {seed}"
    assert uneven(results, SEEDS) == {}
    assert len({r["score"] for r in results}) == 1   # so the same grade at every seed


@pytest.mark.parametrize("slug", KATAS)
def test_tampering_is_diagnosed_where_declared(slug, grade_source):
    """tampering has no bug oracle (the source scan finds it, whatever the code computes): the
    reference with a tampering line added stands for one."""
    kata = next(k for k in katas() if k.slug == slug)
    result = grade_source(slug, kata.reference_path.read_text() + TAMPERING_PROBE)
    tampered = [c for c in result["checks"] if c["diagnosis"] == TAMPERING]
    assert bool(tampered) == (TAMPERING in kata.diagnoses)
    assert all(c["score"] == 0 and "inspect (line" in c["message"] for c in tampered)
    assert all(c["status"] in ("passed", "skipped") for c in result["checks"] if c not in tampered)


@pytest.mark.parametrize("slug", KATAS)
def test_stub_and_reference_share_the_api(slug):
    kata = next(k for k in katas() if k.slug == slug)
    assert all(f.ok for f in check_api(kata)), [f.what for f in check_api(kata) if not f.ok]


@pytest.mark.parametrize("slug", KATAS)
def test_diagnoses_documented_and_every_task_hinted(slug):
    kata = next(k for k in katas() if k.slug == slug)
    assert set(kata.diagnoses) - {TAMPERING} == set(Bugs(kata).codes)
    assert all(task.hints for task in kata.tasks)
    assert all(d.explain and d.fix for d in kata.diagnoses.values())


@pytest.mark.parametrize("slug", KATAS)
def test_every_check_has_a_hint(slug):
    ok, what = check_hints(find(slug))
    assert ok, what


def test_lint_refuses_a_check_no_hint_serves():
    kata = find("softmax")
    tasks = tuple(dataclasses.replace(task, hints=tuple(
        dataclasses.replace(hint, serves=tuple(name for name in hint.serves if name != "banned-api") or ("sums-to-one",))
        for hint in task.hints)) for task in kata.tasks)
    ok, what = check_hints(dataclasses.replace(kata, tasks=tasks))
    assert not ok and what == "checks no hint serves (name them in a hint's `for`): banned-api"


@pytest.mark.parametrize("slug", KATAS)
def test_files_cite_only_what_ships(slug):
    ok, what = check_citations(find(slug))
    assert ok, what


@pytest.mark.parametrize("slug", KATAS)
def test_what_a_learner_reads_speaks_to_the_learner(slug):
    ok, what = check_learner_words(find(slug))
    assert ok, what


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


@pytest.mark.parametrize("slug", KATAS)
def test_the_readme_lists_every_check_and_marks_the_hidden_ones(slug):
    ok, what = check_checks_table(find(slug))
    assert ok, what


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
