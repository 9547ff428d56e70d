"""The benchmark scripts run and print their figures (the figures themselves are not asserted:
performance claims live in the benchmarks' output, not in timed tests, so they run beside the
other tests here; docs/measurements.md's figures come from an idle machine)."""
import importlib.util
import json
import re
import subprocess
import sys

from graders.engine.manifest import ROOT

from conftest import needs_bwrap


def test_check_overhead_prints_a_ratio_per_kata():
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "check_overhead.py"), "softmax", "--runs", "1"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert re.search(r"^softmax\s+\d+\.\d+ s\s+\d+\.\d+ s\s+\d+\.\d+x$", run.stdout, re.M), run.stdout


def test_grade_class_prints_the_cost_per_pair():
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "grade_class.py"), "--learners", "2",
                          "--katas", "softmax", "--naive-sample", "1"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert re.search(r"^kata grade:\s+\d+\.\d+ s in total, \d+\.\d+ s per \(learner, kata\), \d+\.\d+ s per submitted file$", run.stdout, re.M), run.stdout
    assert re.search(r"^kata grade, resumed:\s+\d+\.\d+ s", run.stdout, re.M), run.stdout


def test_nbgrader_class_prints_both_paths_and_the_ratio():
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "nbgrader_class.py"), "--learners", "1",
                          "--katas", "softmax"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"^nbgrader autograde:\s+\d+\.\d+ s, \d+\.\d+ s per notebook$", run.stdout, re.M), run.stdout
    assert re.search(r"^kata nbgrader autograde:\s+\d+\.\d+ s, \d+\.\d+ s per notebook", run.stdout, re.M), run.stdout
    assert re.search(r"^ratio: the kit's path is \d+\.\dx faster per notebook$", run.stdout, re.M), run.stdout


def test_mutation_score_prints_the_table_and_the_time():
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "mutation_score.py"), "softmax", "--sample", "3",
                          "--seeds", "1"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert re.search(r"^softmax\s+3\s+\d+\s+\d+\s+\d+\s+\d+\.\d%", run.stdout, re.M), run.stdout
    assert re.search(r"^softmax: \d+\.\d s, \d+\.\d\d s per mutant$", run.stdout, re.M), run.stdout


def test_suite_time_prints_each_tier():
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "suite_time.py"), "--tiers", "collect"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    row = r"^collect\s+python -m pytest --collect-only -q\s+(\d+\.\ds\s+){3} \d+ collected$"
    assert re.search(row, run.stdout, re.M), run.stdout
    refused = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "suite_time.py"), "--tiers", "fast"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "unknown tier(s) fast" in refused.stderr


def test_check_time_prints_each_katas_cold_check():
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "check_time.py"), "softmax", "--runs", "1"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert re.search(r"^softmax\s+\d+\.\d\d s\s+\d+\.\d\d s$", run.stdout, re.M), run.stdout


def test_reference_cpu_prints_and_writes_each_katas_time(tmp_path):
    out = tmp_path / "reference-cpu.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "reference_cpu.py"), "softmax", "--seeds", "1",
                          "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert re.search(r"^softmax\s+\d+\.\d\d s of CPU time in the sandbox$", run.stdout, re.M), run.stdout
    assert list(json.loads(out.read_text())) == ["softmax"]


@needs_bwrap
def test_red_team_class_grades_a_class_and_compares_each_trick_with_its_control():
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "red_team_class.py"), "--modes", "bwrap",
                          "--only", "f"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "bwrap: " in run.stdout and "complete, no trick above its control" in run.stdout, run.stdout
    assert re.search(r"^  f-seed-reader\s+\d+(\.\d+)?\s+f-control\s+10(\.0)?$", run.stdout, re.M), run.stdout


def test_suite_time_gives_each_kata_its_share_of_the_full_tier(tmp_path):
    """A test is about the kata its parameters name first, the longest slug that fits, or whose own
    tests file it is; a kata's share is its tests' time over the workers."""
    spec = importlib.util.spec_from_file_location("suite_time", ROOT / "benchmarks" / "suite_time.py")
    suite_time = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite_time)
    report = tmp_path / "full.xml"
    report.write_text('<testsuites><testsuite>'
                      '<testcase classname="tests.test_content" name="test_rule_holds[mha-by-loop-api]" time="4"/>'
                      '<testcase classname="tests.test_content" name="test_rule_holds[mha-api]" time="2"/>'
                      '<testcase classname="tests.test_kata_mha" name="test_something" time="6"/>'
                      '<testcase classname="tests.test_cli" name="test_list[softmaxes]" time="100"/>'
                      '</testsuite></testsuites>')
    got = suite_time.shares(report, ["mha", "mha-by-loop", "softmax"])
    assert got == {"mha": 8 / suite_time.WORKERS, "mha-by-loop": 4 / suite_time.WORKERS, "softmax": 0.0}
