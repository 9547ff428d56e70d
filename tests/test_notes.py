"""Notes: a passed check may tell the learner something about their code (here, that it computes in
float32 inside), shown under the check and listed in the JSON result."""
from graders.engine.manifest import ROOT

LLAMA = ROOT / "tests" / "zoo" / "gqa" / "llama.py"   # F.softmax(scores.float(), -1).type_as(q)


def test_float32_inside_passes_with_a_note(grade_source, kata_cmd):
    result = grade_source("gqa", LLAMA.read_text(), seed=3)
    noted = [c for c in result["checks"] if c.get("notes")]
    assert result["score"] == result["max_score"] and result["notes"] == ["float32-inside"]
    assert noted and all(c["status"] == "passed" and c["notes"] == ["float32-inside"] for c in noted)
    assert all("to float32 rounding only (max abs error" in c["message"] for c in noted)
    shown = kata_cmd("check", "gqa", "--file", str(LLAMA), "--seed", "3")   # and as `kata check` shows it
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "note      Your code computes in float32 inside: the output and " in shown.stdout
    assert " agree to float32 rounding only (" in shown.stdout and "which this check accepts" in shown.stdout


def test_the_reference_passes_without_notes(grade_source):
    result = grade_source("gqa", (ROOT / "reference" / "gqa.py").read_text(), seed=3)
    assert result["score"] == result["max_score"]
    assert result["notes"] == [] and not any(c.get("notes") for c in result["checks"])
