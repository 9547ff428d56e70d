"""Mutation testing of a kata's grader (`kata lint --mutants`): is every small mistake caught?

A mutant is the reference with one small change of the kinds learners make: operands or dims
swapped, a transpose, contiguous, scale, sqrt or dtype cast dropped, tril for triu, a diagonal or
slice off by one, an operator, comparison or mask polarity flipped, dropout left out. Each mutant
is graded in the sandbox like a learner's file, at each seed. It is

- killed when some seed scores it below full marks;
- equivalent when, at every seed, every value its code answered the grader with is identical
  to the reference's (bit for bit): no grader could tell them apart on those inputs;
- a survivor otherwise: it computes something else and still gets full marks.

The score of a kata is killed / (mutants - equivalent).
"""
from __future__ import annotations

import ast
import copy
import difflib
import hashlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.manifest import Kata
from ..engine.runner import grade
from ..engine.sandbox import Zygote

GOAL = 0.95   # the share of non-equivalent mutants every kata's grader must kill

_OPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
        ast.Pow: ast.Mult}
_SWAPPABLE = (ast.Sub, ast.Div, ast.FloorDiv, ast.MatMult, ast.Pow, ast.Mod)
_COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
# x.m(...) -> x: layout, copies, dtype casts, masks.
_DROP_METHOD = {"transpose", "contiguous", "float", "double", "half", "to", "type_as", "astype", "tril",
                "triu", "clone", "squeeze", "unsqueeze", "detach", "permute"}
# f(x, ...) -> x: scales, dropout, elementwise maps.
_DROP_CALL = {"sqrt", "exp", "log", "abs", "float", "int", "round"}
_RENAME = {"tril": "triu", "triu": "tril", "max": "min", "min": "max", "amax": "amin", "amin": "amax",
           "sum": "mean", "mean": "sum", "softmax": "log_softmax"}
# Calls whose arguments are sizes, positions or offsets: each argument may be off by one.
_SIZED = {"tril", "triu", "arange", "ones", "zeros", "view", "reshape", "expand", "split",
          "repeat_interleave", "narrow", "full"}


def _name(func) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _plus(node, delta: int):
    return ast.BinOp(copy.deepcopy(node), ast.Add() if delta > 0 else ast.Sub(), ast.Constant(1))


def candidates(node) -> list[tuple[str, ast.AST]]:
    """(what changes, the node that replaces ``node``) for every mutation of this one node."""
    found = []
    if isinstance(node, ast.BinOp):
        if type(node.op) in _OPS:
            found.append((f"{type(node.op).__name__} -> {_OPS[type(node.op)].__name__}",
                          ast.BinOp(node.left, _OPS[type(node.op)](), node.right)))
        if isinstance(node.op, _SWAPPABLE):
            found.append(("operands swapped", ast.BinOp(node.right, node.op, node.left)))
        if isinstance(node.op, (ast.Mult, ast.Div)):
            found.append(("scale dropped", node.left))
    elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        op = type(node.ops[0])
        found.append((f"{op.__name__} -> {_COMPARE[op].__name__}", ast.Compare(node.left, [_COMPARE[op]()], node.comparators)))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Invert, ast.USub, ast.Not)):
        found.append((f"{type(node.op).__name__} dropped", node.operand))
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        found.append((f"{node.value} -> {not node.value}", ast.Constant(not node.value)))
    elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
        found += [(f"{node.value!r} -> {node.value + d!r}", ast.Constant(node.value + d)) for d in (1, -1)]
    elif isinstance(node, ast.Constant) and node.value in ("-inf", "inf"):
        flipped = "inf" if node.value == "-inf" else "-inf"
        found.append((f"{node.value} -> {flipped}", ast.Constant(flipped)))
    elif isinstance(node, ast.Attribute) and node.attr in _RENAME:
        found.append((f".{node.attr} -> .{_RENAME[node.attr]}", ast.Attribute(node.value, _RENAME[node.attr], node.ctx)))
    elif isinstance(node, ast.Call):
        name = _name(node.func)
        if isinstance(node.func, ast.Attribute) and name in _DROP_METHOD:
            found.append((f".{name}(...) dropped", node.func.value))
        if (name in _DROP_CALL or "dropout" in name.lower()) and node.args:
            found.append((f"{name}(x) -> x", node.args[0]))
        if len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args):
            for i in range(len(node.args) - 1):
                args = list(node.args)
                args[i], args[i + 1] = args[i + 1], args[i]
                found.append((f"{name}: arguments {i + 1} and {i + 2} swapped", ast.Call(node.func, args, node.keywords)))
        if name in _SIZED:
            for i, arg in enumerate(node.args):
                if not isinstance(arg, (ast.Constant, ast.Starred)):
                    for d in (1, -1):
                        args = list(node.args)
                        args[i] = _plus(arg, d)
                        found.append((f"{name}: argument {i + 1} {'+' if d > 0 else '-'} 1",
                                      ast.Call(node.func, args, node.keywords)))
    elif isinstance(node, ast.Slice):
        for part in ("lower", "upper"):
            bound = getattr(node, part)
            if bound is not None and not isinstance(bound, ast.Constant):
                for d in (1, -1):
                    found.append((f"slice {part} {'+' if d > 0 else '-'} 1", ast.Slice(
                        **{**{k: getattr(node, k) for k in ("lower", "upper", "step")}, part: _plus(bound, d)})))
    return found


class _Mutate(ast.NodeTransformer):
    """Applies mutation number ``target`` (counting in a fixed walk); with None, counts them all."""

    def __init__(self, target: int | None):
        self.target, self.seen, self.what = target, 0, []

    def visit(self, node):
        if isinstance(node, ast.Raise) or isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            return node   # error messages and docstrings: nothing a grader judges
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.JoinedStr)):
            return node
        for what, replacement in candidates(node):
            if self.seen == self.target:
                self.seen += 1
                self.what.append((what, getattr(node, "lineno", None)))
                return ast.copy_location(replacement, node) if hasattr(node, "lineno") else replacement
            self.seen += 1
            if self.target is None:
                self.what.append((what, getattr(node, "lineno", None)))
        return self.generic_visit(node)


@dataclass
class Mutant:
    number: int
    what: str
    line: int | None
    source: str
    diff: str
    outcome: str = ""   # killed | equivalent | survived


def mutants(source: str) -> list[Mutant]:
    """Every single-change mutant of ``source`` (a reference), in a fixed order."""
    tree = ast.parse(source)
    counter = _Mutate(None)
    counter.visit(copy.deepcopy(tree))
    original = ast.unparse(tree).splitlines()
    found = []
    for number, (what, line) in enumerate(counter.what):
        mutator = _Mutate(number)
        mutated = ast.fix_missing_locations(mutator.visit(copy.deepcopy(tree)))
        text = ast.unparse(mutated)
        diff = "\n".join(row for row in difflib.unified_diff(original, text.splitlines(), lineterm="", n=0)
                          if row[:1] in "+-" and not row.startswith(("+++", "---")))
        if diff:   # a change unparse cannot show (e.g. -0 -> 0) is no mutant
            found.append(Mutant(number, what, line, text + "\n", diff))
    return found


@dataclass
class Score:
    kata: str
    mutants: list[Mutant] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(m.outcome == outcome for m in self.mutants)

    @property
    def ratio(self) -> float:
        judged = len(self.mutants) - self.count("equivalent")
        return self.count("killed") / judged if judged else 1.0


def score(kata: Kata, *, seeds: list[int], sample: int | None = None, chosen: list[Mutant] | None = None) -> Score:
    """Grade every mutant of ``kata``'s reference (the first ``sample`` of them, if given; or the
    ``chosen`` ones) and set each one's outcome."""
    if chosen is None:
        chosen = mutants(kata.reference_path.read_text(encoding="utf-8"))[:sample]
    result = Score(kata.slug, chosen)
    with Zygote([kata.framework], isolated=None, warm=True) as zygote, \
            tempfile.TemporaryDirectory(prefix="kata-mutants-") as tmp:
        path = Path(tmp) / kata.learner_file

        def traced(source: str, seed: int) -> tuple[dict, str]:
            path.write_text(source, encoding="utf-8")
            trace = hashlib.sha256()
            return grade(kata, path, seed=seed, hidden_seed=seed, device="cpu", zygote=zygote, trace=trace), \
                trace.hexdigest()

        expected = {seed: traced(kata.reference_path.read_text(encoding="utf-8"), seed)[1] for seed in seeds}
        for mutant in chosen:
            same = True
            for seed in seeds:
                graded, digest = traced(mutant.source, seed)
                if graded["score"] < graded["max_score"] or graded["status"] != "passed":
                    mutant.outcome = "killed"
                    break
                same = same and digest == expected[seed]
            else:
                mutant.outcome = "equivalent" if same else "survived"
    return result


def survivors(score: Score) -> list[str]:
    """Each survivor of ``score`` with its change, indented: what a grader still lets through."""
    lines = []
    for mutant in score.mutants:
        if mutant.outcome == "survived":
            lines.append(f"  {score.kata}: survivor #{mutant.number} ({mutant.what}, line {mutant.line})")
            lines += [f"      {row}" for row in mutant.diff.splitlines()]
    return lines


def table(scores: list[Score]) -> str:
    """Per kata: mutants, equivalent, killed, survivors and the share killed, against the goal."""
    lines = [f"{'kata':<18}{'mutants':>8}{'equivalent':>11}{'killed':>8}{'survivors':>10}{'killed %':>10}",
             "-" * 65]
    for s in scores:
        mark = "ok" if s.ratio >= GOAL else f"below {GOAL:.0%}"
        lines.append(f"{s.kata:<18}{len(s.mutants):>8}{s.count('equivalent'):>11}{s.count('killed'):>8}"
                     f"{s.count('survived'):>10}{s.ratio:>9.1%}  {mark}")
    return "\n".join(lines)
