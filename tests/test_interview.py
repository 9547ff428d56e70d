"""Mock interviews, end to end: the real `kata interview` driven through its standard input as a
learner would, the scorecard and the history entry it leaves, and replay by seed."""
import json
import os
import queue
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import cli
import pytest
from click.testing import CliRunner

from conftest import KATA
from graders.engine import manifest
from graders.engine.plugin import cuda_checks
from graders.practice.interview import CODING_POINTS, FOLLOWUP_POINTS, HINT_COST, plan

# In-process commands fork from the session's zygotes; Session runs `kata interview` as a process.
pytestmark = pytest.mark.usefixtures("warm_commands")

REFERENCE = Path(__file__).resolve().parents[1] / "reference"


class Session:
    """A `kata interview` subprocess: send lines, wait for text to appear on its output."""

    def __init__(self, workspace: Path, *args):
        env = {**os.environ, "KATA_WORKSPACE": str(workspace), "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([str(KATA), "interview", *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=workspace)
        self.chunks, self.text, self.output = queue.Queue(), "", ""   # output: everything read so far
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        while chunk := os.read(self.proc.stdout.fileno(), 4096):
            self.chunks.put(chunk.decode("utf-8", "replace"))

    def expect(self, pattern: str, timeout: float = 120) -> re.Match:
        """Wait for ``pattern`` in the output after what earlier calls consumed."""
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(pattern, self.text)
            if match:
                self.text = self.text[match.end():]
                return match
            try:
                chunk = self.chunks.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.proc.kill()
                raise AssertionError(f"no {pattern!r} within {timeout} s; output so far:\n{self.text}") from None
            self.text += chunk
            self.output += chunk

    def send(self, line: str):
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        self.proc.stdin.close()
        code = self.proc.wait(timeout)
        time.sleep(0.2)   # let the reader drain
        while not self.chunks.empty():
            chunk = self.chunks.get()
            self.text += chunk
            self.output += chunk
        return code, self.text


def answer(asked, right: bool) -> str:
    """What a learner types: the right answer, or a wrong one of the same form."""
    expected = asked.expected
    if asked.question.kind == "choice":
        return expected if right else next(c for c in "abcdef" if c != expected)
    return repr(expected) if right else repr(expected * 3 + 1)


def history(workspace: Path) -> list[dict]:
    path = workspace / ".kata" / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_same_seed_draws_the_same_interview_and_seeds_differ():
    katas = manifest.katas()

    def drawn(seed, **kw):
        p = plan(katas, seed=seed, **kw)
        return ([k.slug for k in p.katas],
                [(a.kata, a.question.id, a.params, a.order, a.text) for a in p.questions])

    assert drawn(5) == drawn(5)
    assert drawn(5, minutes=60) == drawn(5, minutes=60)
    assert len({str(drawn(seed)) for seed in range(6)}) > 1
    for seed in range(20):
        p = plan(katas, seed=seed)
        assert 3 <= len(p.questions) <= 5
        assert sum(k.minutes for k in p.katas) <= 30 or len(p.katas) == 1
        assert {a.question.kind for a in p.questions} == {"choice", "numeric"}
        assert len({(a.kata, a.question.id) for a in p.questions}) == len(p.questions)
    given = plan(katas, seed=1, chosen=[manifest.find("mha"), manifest.find("gqa")])
    assert [k.slug for k in given.katas] == ["mha", "gqa"]
    assert given.minutes == manifest.find("mha").minutes + manifest.find("gqa").minutes
    assert {a.kata for a in given.questions} == {"mha", "gqa"} and len(given.questions) == 4


def test_a_scripted_interview_runs_to_the_scorecard_and_the_history(tmp_path):
    seed, softmax = 11, manifest.find("softmax")
    expected = plan(manifest.katas(), seed=seed, chosen=[softmax])
    session = Session(tmp_path, "--katas", "softmax", "--seed", str(seed), "--minutes", "20")
    session.expect(r"Mock interview: softmax in 20:00, then 3 follow-up questions")
    learner_file = Path(session.expect(r"Your file: (\S+)").group(1))
    assert learner_file.parent.parent == tmp_path / "interviews"
    assert learner_file.read_text() == softmax.stub_path.read_text()

    session.send("hint")
    session.expect(rf"Hint 1/\d+ \(task 1: {re.escape(softmax.tasks[0].title)}\) \(-5 points\)")
    session.send("check")
    session.expect(r"NOT-STARTED")
    shutil.copyfile(REFERENCE / "softmax.py", learner_file)
    session.send("c")
    session.expect(rf"PASSED\s+{softmax.max_score:g}/{softmax.max_score:g} points")
    session.send("done")
    for number, asked in enumerate(expected.questions, 1):
        session.expect(rf"Follow-up {number}/3 \(softmax\)\n{re.escape(asked.text)}")
        session.send(answer(asked, right=number != 2))
        session.expect("Right" if number != 2 else "answer is")
    code, output = session.finish()
    assert code == 0, output
    assert re.search(r"Total\s+81\.7/100", output), output   # 60 - 5 + 40 * 2/3

    [*checks, card] = history(tmp_path)
    assert [c["status"] for c in checks] == ["not-started", "passed", "passed"]
    assert card["type"] == "interview" and card["status"] == "completed" and card["seed"] == seed
    assert card["coding"] == [{"kata": "softmax", "status": "passed", "score": softmax.max_score,
                               "max_score": softmax.max_score, "hints": 1}]
    assert card["coding_points"] == CODING_POINTS - HINT_COST
    assert (card["followups_right"], card["followups_asked"]) == (2, 3)
    assert card["followup_points"] == round(FOLLOWUP_POINTS * 2 / 3, 1)
    assert card["score"] == round(CODING_POINTS - HINT_COST + FOLLOWUP_POINTS * 2 / 3, 1)
    assert [a["id"] for a in card["followups"]] == [a.question.id for a in expected.questions]
    assert card["time_up"] is False and 0 < card["time_used_s"] < 20 * 60

    # The same seed replays the same questions: here through Click's runner, answers piped in.
    replay = plan(manifest.katas(), seed=seed, chosen=[softmax])
    piped = "done\n" + "".join(answer(a, right=True) + "\n" for a in replay.questions)
    result = CliRunner().invoke(cli.main, ["interview", "--katas", "softmax", "--seed", str(seed),
                                           "-w", str(tmp_path)], input=piped)
    assert result.exit_code == 0, result.output
    again = history(tmp_path)[-1]
    assert [(a["id"], a["params"], a["question"]) for a in again["followups"]] == \
           [(a["id"], a["params"], a["question"]) for a in card["followups"]]
    assert again["coding"][0]["status"] == "not-started" and again["followups_right"] == 3
    assert again["score"] == FOLLOWUP_POINTS
    assert (tmp_path / "softmax.py").exists() is False   # the practice file was never touched

    shown = CliRunner().invoke(cli.main, ["history", "-w", str(tmp_path)])
    assert shown.exit_code == 0
    assert re.search(r"81\.7/100 .*softmax", shown.output) and "81.7 -> 40" in shown.output


def test_an_interview_aims_and_charges_hints_only_on_failing_work_and_withholds_fixes(tmp_path):
    softmax = manifest.find("softmax")
    overflow = softmax.diagnoses["softmax-overflow"]
    session = Session(tmp_path, "--katas", "softmax", "--seed", "3", "--minutes", "20")
    learner_file = Path(session.expect(r"Your file: (\S+)").group(1))
    session.expect(r"hint   a hint for what your last check failed \(-5 points each; free when it failed nothing\)")
    session.expect(r"done   grade your file as it is now as your final answer, and go on to the next kata or the "
                   r"follow-up questions")
    shutil.copyfile(Path(__file__).parent / "zoo" / "softmax" / "d2l__softmax-overflow.py", learner_file)
    for _ in range(2):   # the fixes are said to be withheld once, not at every check
        session.send("check")
        session.expect(r"diagnosis softmax-overflow")
        session.expect(rf"Replay exactly this run: kata check softmax --file {re.escape(str(learner_file))} --seed 3")
    session.send("hint")
    aimed = next(h for h in softmax.hints if "softmax-overflow" in h.serves)
    task = softmax.task_of(aimed)
    session.expect(rf"Hint {softmax.hints.index(aimed) + 1}/{len(softmax.hints)} for the failed check `[a-z-]+`, "
                   rf"diagnosed `softmax-overflow` \(task {task}: {re.escape(softmax.tasks[task - 1].title)}\) "
                   rf"\(-5 points\)\n{re.escape(aimed.text)}")
    # Once the file passes, a hint aims at nothing and costs nothing.
    shutil.copyfile(REFERENCE / "softmax.py", learner_file)
    session.send("check")
    session.expect(r"PASSED")
    session.send("hint")
    session.expect(r"Hint 1/\d+, the next in task order: your last run passed every check \(task 1: .*\) \(free\)")
    session.send("quit")
    code, output = session.finish()
    assert code == 1, output
    assert overflow.fix not in session.output and not re.search(r"^ +fix ", session.output, re.MULTILINE)
    assert session.output.count("are withheld in an interview") == 1, session.output
    assert history(tmp_path)[-1]["coding"][0]["hints"] == 1


def test_code_saved_after_the_time_is_up_does_not_count(tmp_path):
    softmax = manifest.find("softmax")
    questions = plan(manifest.katas(), seed=3, chosen=[softmax]).questions
    session = Session(tmp_path, "--katas", "softmax", "--seed", "3", "--minutes", "0.1")
    learner_file = Path(session.expect(r"Your file: (\S+)").group(1))
    shutil.copyfile(REFERENCE / "softmax.py", learner_file)
    session.expect(r"Time is up", timeout=60)
    learner_file.write_text("def softmax(x, axis=-1):\n    return x\n")   # too late
    session.send("")
    session.expect(r"Grading your final softmax\.py")
    for number, asked in enumerate(questions, 1):
        session.expect(rf"Follow-up {number}/")
        session.send(answer(asked, right=False))
    code, output = session.finish()
    assert code == 0, output
    card = history(tmp_path)[-1]
    assert card["time_up"] is True and card["time_used_s"] == 6.0
    assert card["coding"][0]["status"] == "passed" and card["score"] == CODING_POINTS
    assert (learner_file.parent / "at-time-up" / "softmax.py").read_bytes() == (REFERENCE / "softmax.py").read_bytes()
    assert re.search(r"Time\s+0:06 of 0:06 \(time ran out\)", output)


@pytest.mark.parametrize("piped", ["quit\n", "", "done\n"], ids=["quit", "eof-while-coding", "eof-in-follow-ups"])
def test_an_abandoned_interview_is_saved_as_abandoned(tmp_path, piped):
    result = CliRunner().invoke(cli.main, ["interview", "--katas", "split-heads", "--seed", "2",
                                           "-w", str(tmp_path)], input=piped)
    assert result.exit_code == 1, result.output
    assert "Interview abandoned" in result.output and "Scorecard (abandoned" in result.output
    card = history(tmp_path)[-1]
    assert card["status"] == "abandoned" and card["followups"] == []
    assert card["coding"][0]["status"] == ("not-started" if piped == "done\n" else "not-graded")


def test_invalid_answers_are_asked_again(tmp_path):
    p = plan(manifest.katas(), seed=4, chosen=[manifest.find("gqa")])
    lines = ["done"]
    for asked in p.questions:
        lines += (["z", "", answer(asked, True)] if asked.question.kind == "choice" else [answer(asked, True)])
    result = CliRunner().invoke(cli.main, ["interview", "--katas", "gqa", "--seed", "4", "-w", str(tmp_path)],
                                input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    assert history(tmp_path)[-1]["followups_right"] == len(p.questions)
    if any(a.question.kind == "choice" for a in p.questions):
        assert "Type one letter" in result.output


def test_no_cuda_is_said_before_the_clock_starts(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = CliRunner().invoke(cli.main, ["interview", "--katas", "mha", "--device", "cuda", "-w", str(tmp_path)])
    assert result.exit_code == 2 and "no CUDA device" in result.output
    assert not (tmp_path / "interviews").exists() and not (tmp_path / ".kata").exists()


def test_the_newer_katas_run_to_a_scorecard(tmp_path):
    """`kata interview --katas cross-attention,positional-encoding`: both coding tasks, then their
    follow-ups, to a scorecard in the history."""
    chosen = [manifest.find("cross-attention"), manifest.find("positional-encoding")]
    p = plan(manifest.katas(), seed=6, chosen=chosen)
    assert {a.kata for a in p.questions} == {"cross-attention", "positional-encoding"}
    piped = "done\ndone\n" + "".join(answer(a, right=True) + "\n" for a in p.questions)
    result = CliRunner().invoke(cli.main, ["interview", "--katas", "cross-attention,positional-encoding",
                                           "--seed", "6", "-w", str(tmp_path)], input=piped)
    assert result.exit_code == 0, result.output
    assert re.search(rf"Total\s+{FOLLOWUP_POINTS:g}(\.0)?/100", result.output), result.output
    rows = [line for line in result.output.splitlines() if "not-started" in line and "points" in line]
    assert len(rows) == 2 and len({row.index("not-started") for row in rows}) == 1, rows   # one column
    assert rows[1].split() == ["positional-encoding", "not-started", "0/15", "points"]
    card = history(tmp_path)[-1]
    assert [c["kata"] for c in card["coding"]] == ["cross-attention", "positional-encoding"]
    assert card["status"] == "completed" and card["followups_right"] == len(p.questions)


@pytest.mark.parametrize("slugs", [("kv-cache", "flash-tiling", "rope"), ("attention-backward", "sliding-window"),
                                   ("roofline", "paged-kv", "flash-decoding", "doc-masking"),
                                   ("mla", "rope-scaling", "linear-attention", "tp-attention"),
                                   ("ring-attention", "spec-decode", "prefix-cache", "kv-quant"),
                                   ("triton-softmax", "triton-flash", "triton-paged-decode")])
def test_the_katas_beyond_the_material_run_to_a_scorecard(tmp_path, slugs):
    """`kata interview` draws the katas beyond the material (KV caches, tiling, RoPE, backward,
    windows, the four of serving, the four of architecture, the four at scale, the three kernels):
    their coding tasks, then their follow-ups, to a scorecard that counts each kata's points."""
    chosen = [manifest.find(slug) for slug in slugs]
    p = plan(manifest.katas(), seed=4, chosen=chosen)
    assert {a.kata for a in p.questions} <= set(slugs) and p.questions
    piped = "done\n" * len(slugs) + "".join(answer(a, right=True) + "\n" for a in p.questions)
    result = CliRunner().invoke(cli.main, ["interview", "--katas", ",".join(slugs), "--seed", "4",
                                           "-w", str(tmp_path)], input=piped)
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split()[1:] for line in result.output.splitlines()
            if "not-started" in line and "points" in line}
    on_cpu = {k.slug: k.max_score - sum(k.checks[c] for c in cuda_checks(k)) for k in chosen}   # no @cuda check here
    assert rows == {k.slug: ["not-started", f"0/{on_cpu[k.slug]:g}", "points"] for k in chosen}, result.output
    card = history(tmp_path)[-1]
    assert [c["kata"] for c in card["coding"]] == list(slugs)
    assert card["status"] == "completed" and card["followups_right"] == len(p.questions)


# The follow-ups written for the topics the content reviews found missing (one kata at least each).
REVIEW_FOLLOWUPS = {
    "softmax": ["log-softmax", "upcast-to-float32"],
    "scaling-variance": ["logit-growth"],
    "causal-mask": ["fp16-mask-fill", "document-mask-pairs"],
    "split-heads": ["checkpoint-layouts"],
    "mha": ["llama-attention"],
    "mha-by-loop": ["sum-over-heads"],
    "gqa": ["decode-intensity"],
    "flops-memory": ["decoupled-head-dim-params", "decode-step-time", "decode-crossover-batch",
                     "training-flops-per-token", "activation-memory"],
    "cross-attention": ["cached-cross-kv", "cross-cache-bytes", "vlm-cross-vs-fusion"],
    "positional-encoding": ["learned-positions", "t5-relative-buckets", "embedding-scale"],
    "kv-cache": ["cat-copy-bytes", "paged-blocks"],
    "flash-tiling": ["io-complexity", "fa1-vs-fa2-loops", "split-kv-merge"],
    "rope": ["pi-angle", "llama31-scaling", "partial-rotary"],
    "attention-backward": ["delta-rowsum", "train-matmul-flops", "backward-loop-order"],
    "sliding-window": ["interleaved-cache-bytes", "global-tokens"],
    # The second review's (content-2026-11b.md), on the katas of serving and architecture.
    "roofline": ["activation-bytes-per-layer", "moe-decode-crossover", "tp-all-reduce-over-matmul"],
    "flash-decoding": ["gqa-packing", "split-count-tradeoff", "splits-to-fill-sms", "cascade-shared-prefix", "lse-base-2"],
    "paged-kv": ["prefix-cache-chain", "prefix-cache-hits", "gather-copy-bytes", "preemption", "padded-block-table"],
    "doc-masking": ["boundaries-reach-the-kernel", "packed-loss-targets"],
    "linear-attention": ["state-reset-at-documents", "state-in-float32", "gated-delta-state", "decay-half-life"],
    "mla": ["absorbed-decode-intensity", "tp-replicates-latent"],
    "rope-scaling": ["dynamic-ntk-and-kv-cache", "static-yarn-short-context"],
    "tp-attention": ["sequence-parallel", "when-context-parallel"],
    # The katas at scale, on what the second review's section 4 found no kata teaching: every follow-up.
    "ring-attention": ["ring-memory-per-gpu", "why-zigzag", "overlap-condition", "ulysses-vs-ring",
                       "ring-bytes-per-rank", "contiguous-causal-blocks"],
    "spec-decode": ["one-pass", "exact-distribution", "bonus-token", "truncate-or-gather", "tokens-per-step",
                    "tree-nodes"],
    "prefix-cache": ["recompute-last-token", "free-order", "cache-salt", "cached-tokens", "prefill-saved"],
    "kv-quant": ["keys-per-channel", "decoded-token-key-scale", "accumulate-in-float32", "float8-cast-saturates",
                 "int8-max-error", "cache-ratio", "tokens-that-fit"],
    # The kernel katas, on the second review's kernel-level reasoning (PK2, topic 8): every follow-up.
    "triton-softmax": ["why-one-program-per-row", "power-of-two-block", "why-exp2", "unfused-bytes", "padding-lanes",
                       "resident-programs"],
    "triton-flash": ["why-exp2", "block-sizes", "causal-half-work", "accumulate-float32", "grid-programs", "waves",
                     "causal-key-blocks", "kv-bytes-read"],
    "triton-paged-decode": ["why-table-in-kernel", "why-group-per-program", "block-size-trade", "small-batch-occupancy",
                            "why-exp2", "kv-bytes-per-query-head", "last-block-waste", "gather-extra-bytes"],
}


def seeds_asking(kata, wanted: list[str]) -> list[int]:
    """Interview seeds for `--katas <kata>` whose follow-ups, together, ask every one of ``wanted``:
    each time the seed that asks the most of those not yet asked."""
    asked_at = {seed: {a.question.id for a in plan(manifest.katas(), seed=seed, chosen=[kata]).questions}
                for seed in range(500)}
    seeds, left = [], set(wanted)
    while left:
        seed = max(asked_at, key=lambda s: len(left & asked_at[s]))
        assert left & asked_at[seed], f"no seed asks {sorted(left)}"
        seeds.append(seed)
        left -= asked_at[seed]
    return seeds


@pytest.mark.parametrize("slug", sorted(REVIEW_FOLLOWUPS))
def test_the_follow_ups_on_the_reviews_missing_topics_are_asked_and_graded(tmp_path, slug):
    """`kata interview --katas <slug>` at seeds that between them ask each new follow-up, answered
    right: each is asked, graded right, and counted in the scorecard."""
    kata = manifest.find(slug)
    assert set(REVIEW_FOLLOWUPS[slug]) <= {q.id for q in kata.followups}
    asked = set()
    for seed in seeds_asking(kata, REVIEW_FOLLOWUPS[slug]):
        p = plan(manifest.katas(), seed=seed, chosen=[kata])
        piped = "done\n" + "".join(answer(a, right=True) + "\n" for a in p.questions)
        workspace = tmp_path / str(seed)
        result = CliRunner().invoke(cli.main, ["interview", "--katas", slug, "--seed", str(seed), "-w", str(workspace)],
                                    input=piped)
        assert result.exit_code == 0, result.output
        card = history(workspace)[-1]
        assert card["status"] == "completed" and card["followups_right"] == len(p.questions), result.output
        asked |= {a["id"] for a in card["followups"]}
    assert set(REVIEW_FOLLOWUPS[slug]) <= asked
