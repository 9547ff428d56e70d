"""`kata lint --mutants`: the mutants a reference yields, and how graded mutants are classed."""
import re

from graders.authoring import mutants
from graders.engine.manifest import find

SOURCE = '''
import math
import torch


def attend(q, k, v, mask, dropout):
    """A docstring: 1 + 1 is never mutated."""
    if q.size(-1) % 2:
        raise ValueError(f"odd size {q.size(-1) - 1}")
    att = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    att = att.masked_fill(~mask[:q.size(-2), :k.size(-2)], float("-inf"))
    allowed = torch.ones(4, 4, dtype=torch.bool).tril()
    return dropout(torch.softmax(att, dim=-1)) @ v, allowed
'''


def test_a_reference_yields_the_mistakes_learners_make():
    found = {(m.what, m.diff.splitlines()[-1].strip()) for m in mutants.mutants(SOURCE)}
    changes = [diff for _, diff in found]
    for expected in ["+    att = q @ k / math.sqrt(q.size(-1))",                       # transpose dropped
                     "+    att = q @ k.transpose(-2, -1) / q.size(-1)",                 # sqrt dropped
                     "+    att = q @ k.transpose(-2, -1)",                              # scale dropped
                     "+    att = k.transpose(-2, -1) @ q / math.sqrt(q.size(-1))",      # operands swapped
                     "+    att = att.masked_fill(mask[:q.size(-2), :k.size(-2)], float('-inf'))",   # polarity
                     "+    att = att.masked_fill(~mask[:q.size(-2) + 1, :k.size(-2)], float('-inf'))",  # off by one
                     "+    att = att.masked_fill(~mask[:q.size(-2), :k.size(-2)], float('inf'))",
                     "+    allowed = torch.ones(4, 4, dtype=torch.bool).triu()",
                     "+    return (torch.softmax(att, dim=-1) @ v, allowed)",         # dropout dropped
                     "+    return (dropout(torch.softmax(att, dim=-2)) @ v, allowed)"]:  # softmax dim
        assert expected in changes
    assert not any("docstring" in diff or "odd size" in diff or "import" in diff for diff in changes)


def _mutant(source: str) -> mutants.Mutant:
    return mutants.Mutant(0, "by hand", None, source, "")


def test_mutants_are_killed_equivalent_or_survivors():
    kata = find("softmax")
    reference = kata.reference_path.read_text()
    last = "return e / np.sum(e, axis=axis, keepdims=True)"
    assert last in reference
    killed = _mutant(reference.replace(last, "return e"))
    # x.max is np.max: the same values bit for bit, so no grader could tell
    equivalent = _mutant(reference.replace("np.max(x, axis=axis, keepdims=True)", "x.max(axis=axis, keepdims=True)"))
    # float64 values move by 1e-13, far inside the tolerance: full marks, other values
    survivor = _mutant(reference.replace(last, last + " * (1 + 1e-13)"))
    score = mutants.score(kata, seeds=[1], chosen=[killed, equivalent, survivor])
    assert [m.outcome for m in score.mutants] == ["killed", "equivalent", "survived"]
    assert score.ratio == 0.5
    assert re.search(r"^softmax\s+3\s+1\s+1\s+1\s+50\.0%  below 95%$", mutants.table([score]), re.M)


def test_kata_lint_mutants_prints_the_table(kata_cmd):
    run = kata_cmd("lint", "softmax", "--mutants", "--sample", "4", "--seeds", "1", "--seed", "3")
    assert re.search(r"^softmax\s+4\s+\d+\s+\d+\s+\d+\s+\d+\.\d%", run.stdout, re.M), run.stdout
    assert run.returncode in (0, 1)
    assert (run.returncode == 0) == (" ok" in run.stdout.splitlines()[-1])


def test_a_module_katas_equivalent_mutant_is_equivalent():
    """Answers that hold objects (a module's handle, whose repr names an address) still compare."""
    kata = find("mha")
    reference = kata.reference_path.read_text()
    split = "return t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)"
    assert split in reference
    swapped = _mutant(reference.replace(split, split.replace("transpose(1, 2)", "transpose(2, 1)")))
    assert mutants.score(kata, seeds=[1], chosen=[swapped]).mutants[0].outcome == "equivalent"
