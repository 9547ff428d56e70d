"""Manifests are parsed strictly, with errors that say how to fix them."""
import re
import shutil

import pytest

from graders.authoring.lint import check_track, check_shared_mistakes
from graders.engine.manifest import (DIFFICULTIES, KATAS_DIR, TRACKS, ManifestError, _katas, find, katas, mistakes,
                                      parse)

GOOD = (KATAS_DIR / "softmax" / "kata.toml").read_text()


def manifest(tmp_path, text, slug="softmax"):
    path = tmp_path / slug / "kata.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_every_shipped_manifest_parses_and_orders_uniquely():
    found = katas()
    assert [k.order for k in found] == sorted({k.order for k in found})
    for kata in found:
        assert kata.max_score > 0 and kata.tasks and kata.learner_file == kata.slug.replace("-", "_") + ".py"


def test_unknown_key_names_the_closest_known_one(tmp_path):
    path = manifest(tmp_path, GOOD.replace("timeout_s = 10", "timout_s = 10"))
    with pytest.raises(ManifestError, match=r"unknown key 'timout_s' in the top level\. Did you mean 'timeout_s'\?"):
        parse(path)


def test_unknown_key_in_a_task(tmp_path):
    path = manifest(tmp_path, GOOD.replace("hints = [", "hint = [", 1))
    with pytest.raises(ManifestError, match=r"unknown key 'hint' in \[\[tasks\]\] #1\. Did you mean 'hints'\?"):
        parse(path)


def test_a_hint_names_the_checks_it_serves(tmp_path):
    # `kata hint` gives the hint for the check that failed: a hint must say which checks it is for.
    bare = re.sub(r'\{ for = \[[^\]]*\], text = ("(?:[^"\\]|\\.)*") \}', r"\1", GOOD, count=1)
    with pytest.raises(ManifestError, match=r"tasks #1 hint #1 must be a table \{ for = \[check ids or diagnosis "
                                            r"codes\], text = \"\.\.\.\" \}, not str"):
        parse(manifest(tmp_path, bare))
    unknown = GOOD.replace("{ for = [", '{ for = ["matches-referense", ', 1)
    with pytest.raises(ManifestError, match=r"tasks #1 hint #1 needs .*; 'matches-referense' is neither a check nor a "
                                            r"diagnosis of this kata\."):
        parse(manifest(tmp_path, unknown))
    empty = re.sub(r"\{ for = \[[^\]]*\]", "{ for = []", GOOD, count=1)
    with pytest.raises(ManifestError, match=r"tasks #1 hint #1 needs a text and, in `for`, the checks"):
        parse(manifest(tmp_path, empty))


def test_a_task_names_its_functions(tmp_path):
    # `kata hint` answers a failed call of decode_step(...) with the hints of decode_step's task.
    assert [task.functions for task in parse(manifest(tmp_path, GOOD)).tasks] == [("softmax",)] * 3
    with pytest.raises(ManifestError, match=r"tasks #1 functions must name the stub's functions and classes: "
                                            r"\['softmax\(\)'\]\."):
        parse(manifest(tmp_path, GOOD.replace('functions = ["softmax"]', 'functions = ["softmax()"]', 1)))


def test_builds_on_names_earlier_checks(tmp_path):
    good = GOOD.replace("\n[diagnoses.", '\n[builds_on]\nsums-to-one = ["matches-reference"]\n\n[diagnoses.', 1)
    assert parse(manifest(tmp_path, good)).builds_on == {"sums-to-one": ("matches-reference",)}
    later = GOOD.replace("\n[diagnoses.", '\n[builds_on]\nmatches-reference = ["sums-to-one"]\n\n[diagnoses.', 1)
    with pytest.raises(ManifestError, match=r"builds_on\.matches-reference: 'sums-to-one' must be checks listed "
                                            r"before 'matches-reference' in \[checks\]"):
        parse(manifest(tmp_path, later))


GQA = (KATAS_DIR / "gqa" / "kata.toml").read_text()


def with_features(text: str, features: list[str]) -> str:
    """A manifest's text with its features line replaced (removed where there are none)."""
    line = f"features = {features!r}\n".replace("'", '"') if features else ""
    return re.sub(r"^features = \[.*\]\n", line, text, count=1, flags=re.M)


def test_a_shared_mistake_has_the_librarys_code_and_explanation_in_every_kata_that_names_it():
    library = mistakes()
    for code, mistake in library.items():
        named = [k for k in katas() if code in k.diagnoses]
        assert len(named) >= 2, f"{code} is shared by {[k.slug for k in named]}"
        for kata in named:
            assert kata.diagnoses[code].shared and kata.diagnoses[code].explain.startswith(mistake.explain)
            assert mistake.occurs in kata.features, kata.slug


def test_a_shared_code_with_its_own_explanation_or_an_unknown_one_is_refused(tmp_path):
    own = GQA.replace("[diagnoses.kv-repeat-tiled]\nshared = true\n",
                      '[diagnoses.kv-repeat-tiled]\nexplain = "my own words"\n')
    with pytest.raises(ManifestError, match=r"\[diagnoses\.kv-repeat-tiled\] is a mistake several katas share: "
                                            r"write `shared = true`"):
        parse(manifest(tmp_path, own, "gqa"))
    unknown = GQA.replace("[diagnoses.kv-proj-wrong-size]\n", "[diagnoses.kv-proj-wrong-size]\nshared = true\n")
    with pytest.raises(ManifestError, match=r"shared = true, but mistakes\.toml has no mistake 'kv-proj-wrong-size'"):
        parse(manifest(tmp_path, unknown, "gqa"))
    feature = with_features(GQA, ["grouped"])
    with pytest.raises(ManifestError, match=r"features: 'grouped' is no mistake's `occurs`.*known: .*gqa"):
        parse(manifest(tmp_path, feature, "gqa"))
    also = GQA.replace("[diagnoses.kv-repeat-tiled]\nshared = true\n",
                       '[diagnoses.kv-repeat-tiled]\nshared = true\nalso = "Here in a loop."\n')
    diagnosis = parse(manifest(tmp_path, also, "gqa")).diagnoses["kv-repeat-tiled"]
    assert diagnosis.explain == mistakes()["kv-repeat-tiled"].explain + " Here in a loop."


def test_lint_lists_the_shared_mistakes_that_can_occur_and_fails_on_one_not_named(tmp_path):
    ok, said = check_shared_mistakes(find("gqa"))
    assert ok and said.startswith("shared mistakes that can occur: kv-repeat-tiled")
    assert "named: kv-repeat-tiled" in said
    unnamed = parse(manifest(tmp_path, with_features(GQA, [*find("gqa").features, "rope"]), "gqa"))
    ok, said = check_shared_mistakes(unnamed)
    assert not ok and "can occur but not named (a bug oracle and `[diagnoses.CODE] shared = true`): " \
                      "rope-half-vs-interleaved" in said
    stray = parse(manifest(tmp_path, with_features(GQA, []), "gqa"))
    ok, said = check_shared_mistakes(stray)
    assert not ok and "named but its `occurs` is not among the features: kv-repeat-tiled" in said


def test_future_format_is_refused(tmp_path):
    with pytest.raises(ManifestError, match="format = 2 is not supported"):
        parse(manifest(tmp_path, GOOD.replace("format = 1", "format = 2")))


def test_slug_must_match_folder(tmp_path):
    with pytest.raises(ManifestError, match="must equal the folder name 'other'"):
        parse(manifest(tmp_path, GOOD, slug="other"))


def test_missing_required_key(tmp_path):
    with pytest.raises(ManifestError, match="missing the required key 'framework'"):
        parse(manifest(tmp_path, GOOD.replace('framework = "numpy"\n', "")))


def test_wrong_types_and_values(tmp_path):
    with pytest.raises(ManifestError, match="order must be an integer"):
        parse(manifest(tmp_path, GOOD.replace("order = 1", 'order = "1"')))
    with pytest.raises(ManifestError, match="framework = 'jax' must be one of"):
        parse(manifest(tmp_path, GOOD.replace('framework = "numpy"', 'framework = "jax"')))
    with pytest.raises(ManifestError, match="must be positive"):
        parse(manifest(tmp_path, GOOD.replace("matches-reference = 3", "matches-reference = 0")))
    with pytest.raises(ManifestError, match="not valid TOML"):
        parse(manifest(tmp_path, GOOD + "\n[[[\n"))


def test_duplicate_order_is_refused(tmp_path):
    manifest(tmp_path, GOOD)
    shutil.copytree(tmp_path / "softmax", tmp_path / "twin")
    (tmp_path / "twin" / "kata.toml").write_text(GOOD.replace('slug = "softmax"', 'slug = "twin"'))
    with pytest.raises(ManifestError, match="order = 1 is also used by"):
        _katas.__wrapped__((tmp_path,))   # uncached


def test_a_courses_kata_may_take_no_slug_of_the_kits(tmp_path):
    manifest(tmp_path, GOOD.replace("order = 1", "order = 1001"))
    with pytest.raises(ManifestError, match="slug 'softmax' is also the kata in"):
        _katas.__wrapped__((KATAS_DIR, tmp_path))


def test_find_accepts_file_and_module_names():
    assert find("softmax.py").slug == "softmax"
    with pytest.raises(LookupError, match="Did you mean 'softmax'"):
        find("sofmax")


def test_readme_kata_table_lists_every_kata():
    from graders.engine.manifest import ROOT

    readme = (ROOT / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| ") and "`" in line.split("|")[2]]
    listed = [(int(r.split("|")[1]), r.split("|")[2].strip().strip("`")) for r in rows]
    assert listed == [(k.order, k.slug) for k in katas()]


def test_ci_runs_the_readme_test_command():
    from graders.engine.manifest import ROOT

    readme = (ROOT / "README.md").read_text()
    command = readme.split("Develop it")[1].split("```bash\n")[1].split("\n")[0].rsplit("&& ", 1)[1]
    assert command == "python -m pytest"
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith(command)


def test_readme_says_which_torch_to_pick():
    """PyPI's Linux torch is the CUDA build: the README gives the CPU-only index for machines without
    an NVIDIA GPU, and never calls the plain command the CPU build."""
    from graders.engine.manifest import ROOT

    readme = (ROOT / "README.md").read_text()
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in readme
    assert "CUDA build" in readme and "installs the CPU build" not in readme


def test_tolerance_grows_with_the_inputs_magnitude(tmp_path):
    half = "[tolerances.float16]\nrtol = 0.001\natol = 0.0001\nulps = 2\n\n[[tasks]]"
    kata = parse(manifest(tmp_path, GOOD.replace("[[tasks]]", half, 1)))
    assert kata.tolerance("float16") == {"rtol": 0.001, "atol": 0.0001}
    # rounding x ~ 1000 to float16 moves it by up to 2**-10 * 1000 / 2: two such roundings
    assert kata.tolerance("float16", magnitude=1000.0) == {"rtol": 0.001, "atol": 0.0001 + 2 * 2**-10 * 1000}
    with pytest.raises(ManifestError, match=r"\[tolerances.float8\]: unknown dtype"):
        parse(manifest(tmp_path, GOOD.replace("[[tasks]]", half.replace("float16", "float8"), 1)))


def test_track_and_difficulty_are_checked(tmp_path):
    kata = parse(manifest(tmp_path, GOOD))
    assert kata.track in {t.name for t in TRACKS} and kata.difficulty in DIFFICULTIES
    with pytest.raises(ManifestError, match=r"track = 'sed': no track named 'sed'\. Did you mean 'seed'\? The tracks: "
                                            r"seed, beyond, serving, architecture, scale, kernels\."):
        parse(manifest(tmp_path, re.sub(r'^track = ".*"$', 'track = "sed"', GOOD, flags=re.M)))
    with pytest.raises(ManifestError, match=r"difficulty = 'tricky' must be one of easy, medium, hard\."):
        parse(manifest(tmp_path, re.sub(r'^difficulty = ".*"$', 'difficulty = "tricky"', GOOD, flags=re.M)))
    # Both may be left out (a course's kata written before they were), but `kata lint` wants them.
    bare = parse(manifest(tmp_path, re.sub(r'^(track|difficulty) = ".*"\n', "", GOOD, flags=re.M)))
    assert (bare.track, bare.difficulty) == ("", "")
    ok, said = check_track(bare)
    assert not ok and said == "the manifest names no track (seed, beyond, serving, architecture, scale, kernels) and no " \
                              "difficulty (easy, medium, hard)"
    assert check_track(kata) == (True, f"on the {kata.track} track, {kata.difficulty}")
