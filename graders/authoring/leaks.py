"""Answers given away: a function body of a kata's reference found in what a learner is given.

Bodies are compared normalised (docstrings dropped, every name and constant blanked), so a copy
with other names or numbers is found too, whole or as a run of statements inside a larger body.
`kata lint` looks in the kata's stub and public grader; tests/test_leaks.py in everything
`kata release` ships and every notebook nbgrader releases.
"""
from __future__ import annotations

import ast
import copy

from ..engine.manifest import katas

# A body is an answer from 20 AST nodes on: blanked, KVCache's `return 0 if self.k is None else
# self.k.shape[2]` (19 nodes) or `self.k = None; self.v = None` (12) could be anyone's code, while
# the smallest answers, one-line formulas such as softmax_backward's (24) and two-statement
# helpers such as RollingKVCache._last (42), are over it.
MIN_NODES = 20
STATEMENT_LISTS = ("body", "orelse", "finalbody")


class Blank(ast.NodeTransformer):
    """Names, argument names and constants become one placeholder; the API called (attribute and
    keyword names) stays, since that is what an answer is made of."""

    def visit_Name(self, node):
        return ast.Name("_", node.ctx)

    def visit_arg(self, node):
        return ast.arg("_")

    def visit_Constant(self, node):
        return ast.Constant("_")

    def visit_FunctionDef(self, node):
        self.generic_visit(node)
        node.name, node.returns, node.decorator_list = "_", None, []
        node.body = undocumented(node.body) or [ast.Pass()]
        return node

    visit_AsyncFunctionDef = visit_FunctionDef


def undocumented(body: list) -> list:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def normalised(statements: list) -> tuple[str, ...]:
    return tuple(ast.dump(Blank().visit(copy.deepcopy(s))) for s in statements)


def functions(tree, prefix=""):
    """(qualified name, body without its docstring) of every function and method in ``tree``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, undocumented(node.body)
            yield from functions(node, f"{prefix}{node.name}.")


def answers(kata) -> dict[str, tuple[str, ...]]:
    """{qualified name: normalised body} of the reference's functions big enough to be an answer,
    but for the code the stub gives the learner as it is (mha-by-loop's given module)."""
    given = {name: normalised(body) for name, body in functions(ast.parse(kata.stub_path.read_text()))}
    found = {}
    for name, body in functions(ast.parse(kata.reference_path.read_text())):
        if sum(1 for s in body for _ in ast.walk(s)) >= MIN_NODES and given.get(name) != normalised(body):
            found[name] = normalised(body)
    return found


def statement_runs(source: str) -> list[tuple[str, ...]]:
    """Every list of statements in ``source`` (module, class, function and block bodies), normalised."""
    tree = Blank().visit(ast.parse(source))   # blanked once, in place: the lists below are its parts
    runs = []
    for node in ast.walk(tree):
        for field in STATEMENT_LISTS:
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                runs.append(tuple(map(ast.dump, undocumented(block))))
    return runs


def holds(runs: list[tuple[str, ...]], body: tuple[str, ...]) -> bool:
    """Whether ``body`` is a contiguous run of statements of one of ``runs``."""
    n = len(body)
    return any(run[i:i + n] == body for run in runs for i in range(len(run) - n + 1))


def leaks(released: dict[str, str], among=None) -> list[str]:
    """'kata: reference function in where' for every answer of ``among`` (every kata by default)
    found in ``released`` ({where: Python source})."""
    runs = {where: statement_runs(source) for where, source in released.items()}
    return [f"{kata.slug}: {kata.reference_path.name}'s {name} in {where}"
            for kata in (katas() if among is None else among) for name, body in answers(kata).items()
            for where, found in runs.items() if holds(found, body)]


