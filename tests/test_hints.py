"""`kata hint` aims at the first check the last run failed (graders/practice/hints.py): per kata, a
file whose only mistake is a late task's gets that task's hint first; and through the installed
command, the hints follow the failed checks and say when they are all seen."""
import json
import shutil

import pytest

from graders.engine.manifest import ROOT, find
from graders.practice import hints

ZOO = ROOT / "tests" / "zoo"

# Per kata: a file whose only mistake belongs to a late task, and that task's number. The file is
# from the style zoo, or the reference with one late line changed (old, new).
LATE = {
    "softmax": ("d2l__softmax-overflow", 2),
    "split-heads": ("nanogpt__merge-needs-contiguous", 3),
    "causal-mask": ("llama_float32_softmax__nan-on-fully-masked-row", 6),
    "mha": ("d2l__weights-before-dropout", 4),
    "gqa": ("nanogpt__no-causal-mask", 4),
    "sdpa-swap": ("nanogpt__manual-path-no-dropout", 2),
    "flops-memory": ("loop_heavy__max-seq-len-off-by-one", 5),
    "scaling-variance": (("rng = np.random.default_rng(seed)", "rng = np.random.default_rng()"), 2),
    "mha-by-loop": ("function_only__no-causal-mask", 3),
    "cross-attention": ("annotated_transformer__padding-on-queries", 3),
    "positional-encoding": ("bloom_hf__alibi-sign", 4),
    "kv-cache": ("nanogpt_tuple__mask-top-left-aligned", 4),
    "flash-tiling": ("triton_tutorial__causal-block-skip-off-by-one", 4),
    "rope": ("lucidrains__rope-on-values", 3),
    "attention-backward": ("einsum__mask-top-left-aligned", 4),
    "sliding-window": ("deque__rolling-buffer-grows", 3),
    "linear-attention": ("quadratic_mask__state-grows-with-t", 5),
}


@pytest.mark.parametrize("slug", LATE)
def test_the_first_hint_is_for_the_failed_check(grade_source, slug):
    """Graded in the kit's sandbox as `kata check` grades, the hint `kata hint` would give first
    (hints.choose, on the run's failed checks; the command's own path is the next test's)."""
    kata = find(slug)
    mistake, task = LATE[slug]
    if isinstance(mistake, str):
        source = (ZOO / slug / f"{mistake}.py").read_text()
    else:
        source = kata.reference_path.read_text().replace(*mistake, 1)
    failed = hints.failed_checks(grade_source(slug, source))
    assert failed
    choice = hints.choose(kata, set(), failed)
    said = hints.heading(kata, choice)
    assert said.endswith(f" (task {task}: {kata.tasks[task - 1].title})"), said
    hint = kata.hints[choice.index]
    assert kata.task_of(hint) == task > 1
    if choice.code:
        assert {check: code for check, code, _ in failed}[choice.check] == choice.code and choice.code in hint.serves
    else:
        assert choice.check == failed[0][0] and choice.check in hint.serves


def test_hints_follow_the_failed_checks_then_say_they_are_seen(kata_cmd):
    kata = find("softmax")
    # Nothing checked yet: task order.
    heading, text = kata_cmd("hint", "softmax").stdout.splitlines()[:2]
    assert heading == f"Hint 1/{len(kata.hints)} (task 1: {kata.tasks[0].title})" and text == kata.hints[0].text
    shutil.copyfile(ZOO / "softmax" / "d2l__softmax-overflow.py", kata_cmd.workspace / "softmax.py")
    kata_cmd("check", "softmax", "--seed", "1")
    state = json.loads((kata_cmd.workspace / ".kata/state.json").read_text())["katas"]["softmax"]
    failed = [check for check, *_ in state["failed"]]
    # The hints for its diagnoses first, then for the checks that gave them, then for the others
    # (every call is softmax's, which every task writes).
    codes = [code for _, code, _ in state["failed"] if code]
    diagnosed = [check for check, code, _ in state["failed"] if code]
    aimed = []
    for names in (codes, diagnosed, failed):
        aimed += [i for i, h in enumerate(kata.hints) if i and i not in aimed and set(h.serves) & set(names)]
    shown = [kata_cmd("hint", "softmax").stdout.splitlines() for _ in aimed]
    assert [lines[1] for lines in shown] == [kata.hints[i].text for i in aimed]
    assert all("for the failed check" in lines[0] for lines in shown)
    done = kata_cmd("hint", "softmax").stdout
    assert done.startswith("You have seen every hint of softmax for the checks your last run failed "
                           f"({', '.join(f'`{check}`' for check in failed)})")
    state = json.loads((kata_cmd.workspace / ".kata/state.json").read_text())["katas"]["softmax"]
    assert state["hints_taken"] == sorted([0, *aimed]) and state["hints_seen"] == 1 + len(aimed)


def test_a_state_from_before_aimed_hints_keeps_the_hints_it_saw(kata_cmd):
    (kata_cmd.workspace / ".kata").mkdir()
    (kata_cmd.workspace / ".kata/state.json").write_text(json.dumps(
        {"format": 1, "katas": {"softmax": {"hints_seen": 2, "status": "failed"}}}))
    heading = kata_cmd("hint", "softmax").stdout.splitlines()[0]
    assert heading.startswith(f"Hint 3/{len(find('softmax').hints)} (task ")


# Per kata: a file whose only mistake is in one function, found by composite checks (calls of
# several functions, some of them other tasks'), and that function's task: the reference with one
# line changed (old, new). Neither mistake is a known bug, so no diagnosis aims the hints.
ONE_FUNCTION = {
    # train_flops_per_token counts attention's matmuls at 2/3 of PaLM's: fails textbook-answers,
    # whose cases call every function of the kata, and the checks of task 5.
    "roofline": (("attention = 12 * L * T * d ", "attention = 8 * L * T * d "), 5),
    # linear_attention_chunked divides by a denominator one thousandth too big: fails
    # chunked-equals-recurrent, whose cases run linear_attention_step (tasks 4 and 6, right here) too.
    "linear-attention": (("outs.append(num / den)", "outs.append(num / (den + 1e-3))"), 7),
}


@pytest.mark.parametrize("slug", ONE_FUNCTION)
def test_hints_are_those_of_the_function_the_failed_call_names(grade_source, slug):
    """Every hint served, to the last, is from the task of the function whose calls failed (the
    `call` line of each failed check): the tasks whose functions pass are never served."""
    kata = find(slug)
    change, task = ONE_FUNCTION[slug]
    source = kata.reference_path.read_text()
    assert change[0] in source
    failed = hints.failed_checks(grade_source(slug, source.replace(*change, 1)))
    served = []
    while (choice := hints.choose(kata, set(served), failed)).index is not None:
        served.append(choice.index)
    assert served and [kata.task_of(kata.hints[i]) for i in served] == [task] * len(served), served


def test_after_a_pass_the_hint_says_so_and_goes_on_in_task_order(kata_cmd):
    kata = find("softmax")
    shutil.copyfile(kata.reference_path, kata_cmd.workspace / "softmax.py")
    assert kata_cmd("check", "softmax").returncode == 0
    for number in (1, 2):
        heading, text = kata_cmd("hint", "softmax").stdout.splitlines()[:2]
        assert heading.startswith(f"Hint {number}/{len(kata.hints)}, the next in task order: your last run "
                                  "passed every check (task 1: ") and text == kata.hints[number - 1].text
