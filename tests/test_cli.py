"""The `kata` command, end to end through the installed console script in a subprocess (and a
few cases through Click's CliRunner where a prompt is answered)."""
import json

from click.testing import CliRunner

import cli
from graders.engine.manifest import ROOT, TRACKS, katas
from graders.practice.history import History

SCHEMA = json.loads((ROOT / "graders" / "engine" / "result.schema.json").read_text())
SOFTMAX = (ROOT / "reference" / "softmax.py").read_text()


def test_list_shows_every_kata_by_track_with_its_difficulty_and_minutes(kata_cmd):
    run = kata_cmd("list")
    assert run.returncode == 0
    lines = run.stdout.splitlines()
    rows = [line for line in lines if line[:3].strip().rstrip(".").isdigit()]
    assert [line.split()[1] for line in rows] == [k.slug for k in katas()]
    for line, kata in zip(rows, katas()):
        assert line.split()[3:6] == [kata.difficulty, str(kata.minutes), "min"] and kata.title in line, line
    # One status column, however long a title is.
    assert len({line.index(" - ", line.index(k.title)) for line, k in zip(rows, katas())}) == 1, run.stdout
    # Each track's heading, in order, then its katas.
    headings = [line for line in lines if line.strip() and line not in rows]
    assert headings == [f"{t.title} (--track {t.name})" for t in TRACKS]
    for track in TRACKS:
        under = lines[lines.index(f"{track.title} (--track {track.name})") + 1:]
        assert [line.split()[1] for line in under[:len(members(track))]] == members(track)

    serving = kata_cmd("list", "--track", "serving")
    assert serving.returncode == 0
    assert [line.split()[1] for line in serving.stdout.splitlines()[1:]] == ["roofline", "paged-kv", "flash-decoding",
                                                                               "doc-masking"]
    unknown = kata_cmd("list", "--track", "servng")
    assert unknown.returncode == 2 and "Did you mean 'serving'?" in unknown.stderr


def members(track) -> list[str]:
    return [k.slug for k in katas() if k.track == track.name]


def test_start_check_pass_flow(kata_cmd):
    ws = kata_cmd.workspace
    run = kata_cmd("start", "softmax")
    assert run.returncode == 0
    assert (ws / "softmax.py").read_text() == (ROOT / "katas/softmax/stub.py").read_text()
    assert "# Kata 1" in run.stdout and "kata check softmax" in run.stdout

    run = kata_cmd("check", "softmax")
    assert run.returncode == 1
    assert "NOT-STARTED" in run.stdout

    (ws / "softmax.py").write_text(SOFTMAX)
    run = kata_cmd("check", "softmax")
    assert run.returncode == 0, run.stdout
    assert "PASSED  10/10 points" in run.stdout

    run = kata_cmd("list")
    assert "passed" in run.stdout and "10/10" in run.stdout


def test_start_never_overwrites(kata_cmd):
    path = kata_cmd.workspace / "softmax.py"
    path.write_text("# my work\n")
    run = kata_cmd("start", "softmax")
    assert run.returncode == 0 and "already exists" in run.stdout
    assert path.read_text() == "# my work\n"


def test_check_json_validates_against_the_schema(kata_cmd):
    import jsonschema   # here, not at collection: it takes most of a second
    kata_cmd("start", "softmax")
    run = kata_cmd("check", "softmax", "--json", "--seed", "5")
    assert run.returncode == 1
    result = json.loads(run.stdout)
    jsonschema.validate(result, SCHEMA)
    assert result["status"] == "not-started" and result["seed"] == 5

    (kata_cmd.workspace / "softmax.py").write_text(SOFTMAX.replace("np.max(x, axis=axis, keepdims=True)", "0"))
    result = json.loads(kata_cmd("check", "softmax", "--json").stdout)
    jsonschema.validate(result, SCHEMA)
    assert result["status"] == "failed" and "softmax-overflow" in result["diagnoses"]


def test_same_seed_replays_the_same_failure(kata_cmd):
    (kata_cmd.workspace / "softmax.py").write_text(SOFTMAX.replace("axis=axis, keepdims=True)\n    e", "keepdims=True)\n    e"))
    first = json.loads(kata_cmd("check", "softmax", "--json", "--seed", "42").stdout)
    again = json.loads(kata_cmd("check", "softmax", "--json", "--seed", "42").stdout)
    strip = lambda r: [(c["id"], c["status"], c["message"]) for c in r["checks"]]
    assert strip(first) == strip(again) and first["status"] == "failed"


def test_check_file_option_infers_the_kata(kata_cmd, tmp_path):
    path = tmp_path / "softmax.py"
    path.write_text(SOFTMAX)
    run = kata_cmd("check", "--file", str(path))
    assert run.returncode == 0 and "PASSED" in run.stdout


def test_check_without_kata_grades_every_started_one(kata_cmd):
    run = kata_cmd("check")
    assert run.returncode == 2 and "No kata started" in run.stderr
    (kata_cmd.workspace / "softmax.py").write_text(SOFTMAX)
    run = kata_cmd("check")
    assert run.returncode == 0 and "softmax" in run.stdout


def test_usage_errors_exit_2(kata_cmd):
    run = kata_cmd("check", "softmx")
    assert run.returncode == 2 and "Did you mean 'softmax'" in run.stderr
    run = kata_cmd("check", "softmax")
    assert run.returncode == 2 and "kata start softmax" in run.stderr


def listed(kata_cmd, slug) -> tuple[str, str]:
    """`kata list`'s status and best score of ``slug``; `kata history`'s, which must agree."""
    line = next(line for line in kata_cmd("list").stdout.splitlines() if line.split()[1:2] == [slug])
    status, best = line.split()[-2:]
    shown = next(line for line in kata_cmd("history").stdout.splitlines() if line.split()[:1] == [slug])
    assert f"best {best}  " in shown and f"({status})" in shown, (line, shown)
    return status, best


def test_list_and_history_agree_and_a_scratch_run_counts_in_neither(kata_cmd, tmp_path):
    ws = kata_cmd.workspace
    overflow = (ROOT / "tests" / "zoo" / "softmax" / "d2l__softmax-overflow.py").read_text()
    (ws / "softmax.py").write_text(overflow)
    failed = json.loads(kata_cmd("check", "softmax", "--json").stdout)
    assert listed(kata_cmd, "softmax") == ("failed", f"{failed['score']:g}/10")
    scratch = tmp_path / "softmax.py"
    scratch.write_text(SOFTMAX)
    assert kata_cmd("check", "softmax", "--file", str(scratch)).returncode == 0
    assert listed(kata_cmd, "softmax") == ("failed", f"{failed['score']:g}/10")   # not the kata's own file
    assert "(and 1 run(s) of scratch files, not counted)" in kata_cmd("history").stdout
    assert json.loads((ws / ".kata/history.jsonl").read_text().splitlines()[-1])["scratch"] == str(scratch)
    (ws / "softmax.py").write_text(SOFTMAX)
    kata_cmd("check", "softmax")
    assert listed(kata_cmd, "softmax") == ("passed", "10/10")
    (ws / "softmax.py").write_text(overflow)
    kata_cmd("check", "softmax")
    assert listed(kata_cmd, "softmax") == ("failed", "10/10")   # the last run's status, the best score


def test_checks_that_need_cuda_count_nowhere_on_a_cpu(kata_cmd):
    (kata_cmd.workspace / "sdpa_swap.py").write_text((ROOT / "reference" / "sdpa_swap.py").read_text())
    run = kata_cmd("check", "sdpa-swap", "--device", "cpu")
    assert run.returncode == 0 and "PASSED  10/10 points" in run.stdout
    assert run.stdout.count("  not counted\n") == 3
    assert listed(kata_cmd, "sdpa-swap") == ("passed", "10/10")


def test_solution_only_after_a_pass(kata_cmd):
    run = kata_cmd("solution", "softmax")
    assert run.returncode == 1 and "not passed" in run.stderr
    run = kata_cmd("solution", "softmax", "--force", input="n\n")
    assert run.returncode == 1 and "def softmax" not in run.stdout
    (kata_cmd.workspace / "softmax.py").write_text(SOFTMAX)
    kata_cmd("check", "softmax")
    run = kata_cmd("solution", "softmax")
    assert run.returncode == 0 and "def softmax" in run.stdout


def test_solution_force_confirmed(tmp_path):
    result = CliRunner().invoke(cli.main, ["solution", "softmax", "--force", "-w", str(tmp_path)], input="y\n")
    assert result.exit_code == 0 and "def softmax" in result.output
    assert json.loads((tmp_path / ".kata/state.json").read_text())["katas"]["softmax"]["solution_seen_before_pass"]


def test_reset_backs_up_then_restores_the_stub(kata_cmd):
    path = kata_cmd.workspace / "softmax.py"
    path.write_text("# my precious work\n")
    run = kata_cmd("reset", "softmax")
    assert run.returncode == 0
    backups = list((kata_cmd.workspace / ".kata/backups").iterdir())
    assert [b.read_text() for b in backups] == ["# my precious work\n"]
    assert path.read_text() == (ROOT / "katas/softmax/stub.py").read_text()
    kata_cmd("reset", "softmax")
    assert len(list((kata_cmd.workspace / ".kata/backups").iterdir())) == 2


def test_corrupt_state_is_reported_not_fatal(kata_cmd):
    state = kata_cmd.workspace / ".kata/state.json"
    state.parent.mkdir()
    state.write_text("{not json")
    run = kata_cmd("hint", "softmax")
    assert run.returncode == 0 and "unreadable" in run.stderr and "Hint 1/" in run.stdout
    assert json.loads(state.read_text())["katas"]["softmax"]["hints_seen"] == 1
    assert [p.name.startswith("state.corrupt-") for p in state.parent.glob("state.corrupt-*")] == [True]


def test_a_workspace_that_cannot_be_written_still_shows_the_grade(kata_cmd):
    # A file where the .kata folder belongs fails every write there, for root as for another user
    # (whose kata check in root's 0600 workspace failed the same way, after grading).
    (kata_cmd.workspace / ".kata").write_text("not a folder")
    (kata_cmd.workspace / "softmax.py").write_text((ROOT / "reference/softmax.py").read_text())
    run = kata_cmd("check", "softmax")
    assert run.returncode == 0 and "PASSED" in run.stdout, run.stderr
    assert "this result was not recorded in" in run.stderr and "Traceback" not in run.stderr
    assert (kata_cmd.workspace / ".kata").read_text() == "not a folder"


def test_workspace_option_and_env(tmp_path, kata_cmd):
    other = tmp_path / "elsewhere"
    run = kata_cmd("start", "softmax", "--workspace", str(other))
    assert run.returncode == 0 and (other / "softmax.py").exists()
    assert not (kata_cmd.workspace / "softmax.py").exists()


def test_cuda_without_a_gpu_is_an_environment_error(kata_cmd):
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    kata = next(k for k in katas() if k.framework == "torch")
    (kata_cmd.workspace / kata.learner_file).write_text(kata.reference_path.read_text())
    run = kata_cmd("check", kata.slug, "--device", "cuda")
    assert run.returncode == 2 and "no CUDA device" in run.stderr


def test_lint_passes_on_softmax(kata_cmd):
    run = kata_cmd("lint", "softmax", "--seed", "3")
    assert run.returncode == 0, run.stdout
    assert "softmax: reference: passed 10/10 losing nothing" in run.stdout
    assert "softmax: stub: not-started" in run.stdout
    assert "softmax: oracle softmax-overflow: failed 7/10 losing stable-for-large-logits, banned-api, diagnosed " \
           "softmax-overflow" in run.stdout and "0 problem(s)" in run.stdout


def test_help_comes_from_docstrings(kata_cmd):
    run = kata_cmd("check", "--help")
    assert "Grade KATA" in run.stdout and "--seed" in run.stdout


def suggested(workspace, *passed, options=()) -> list[str]:
    """`kata next`'s lines after a history (written as `kata check` writes it) of passes of ``passed``, in order."""
    history = History(workspace / ".kata" / "history.jsonl")
    for slug in passed:
        history.append({"type": "check", "kata": slug, "status": "passed", "score": 1.0, "max_score": 1.0,
                        "sha256": slug})
    result = CliRunner().invoke(cli.main, ["next", *options, "-w", str(workspace)])
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def test_next_continues_the_track_the_learner_is_on(tmp_path):
    assert suggested(tmp_path / "a", "roofline")[:2] == ["1. paged-kv: continues the serving track",
                                                         "   kata start paged-kv"]
    # Serving to kernels passed: the nearest track not done, not the first kata of all.
    after = suggested(tmp_path / "b", *(k.slug for k in katas()
                                        if k.track in ("serving", "architecture", "scale", "kernels")))
    assert after[0] == "1. cross-attention: starts the beyond track: every track after it is done", after
    assert not any("softmax" in line for line in after)
    assert suggested(tmp_path / "c", "softmax", "roofline", "paged-kv", "flash-decoding", "doc-masking")[0] == \
        "1. mla: starts the architecture track: the serving track is done"
    # A track asked for: only its katas, from the first not passed.
    assert suggested(tmp_path / "b", options=["--track", "seed", "-n", "2"]) == [
        "1. softmax: starts the seed track", "   kata start softmax",
        "2. scaling-variance: not started yet", "   kata start scaling-variance"]
    asked = suggested(tmp_path / "c", options=["--track", "seed", "-n", "20"])
    assert asked[0] == "1. scaling-variance: continues the seed track" and "softmax" in asked[-2]   # due last
