"""Structural judgements: which library calls a learner's code uses.

Two views, because each alone is easy to miss: the source (names the file imports and calls,
aliases resolved, read with ``ast`` in the trusted process; the file never runs here) and the
torch functions recorded while the learner's code ran in the sandbox. Code can hide from both
(a name built at run time, a recorder switched off), so such constructs count as banned too.
"""
from __future__ import annotations

import ast


def source_calls(source: str) -> set[str]:
    """Dotted names the source refers to, with import aliases resolved
    (``import torch.nn.functional as F; F.softmax`` gives ``torch.nn.functional.softmax``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    names = set(aliases.values())
    for node in ast.walk(tree):
        dotted = _dotted(node) if isinstance(node, (ast.Attribute, ast.Name)) else _getattr_dotted(node)
        if dotted:
            head, _, rest = dotted.partition(".")
            if head in aliases:
                names.add(aliases[head] + (f".{rest}" if rest else ""))
    return names


def _getattr_dotted(node) -> str | None:
    """``getattr(F, "softmax")`` read as ``F.softmax``."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        base = _dotted(node.args[0])
        return f"{base}.{node.args[1].value}" if base else None
    return None


HIDING_MODULES = ("importlib", "builtins", "ctypes", "torch._C", "torch.overrides", "sys.modules")
HIDING_NAMES = {"__import__", "eval", "exec", "compile", "globals", "vars", "__builtins__"}
HIDING_ATTRIBUTES = {"_disable_torch_function", "DisableTorchFunction", "DisableTorchFunctionSubclass",
                     "_pop_mode", "_push_mode", "_set_torch_function_mode", "__torch_function__"}


def hidden_calls(source: str) -> list[str]:
    """Constructs that hide which functions the code calls from both views: a module or name
    reached at run time (importlib, __import__, eval, getattr with a computed name, sys.modules),
    or torch's function recording switched off. A kata solution needs none of them."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found = [module for name in sorted(source_calls(source)) for module in HIDING_MODULES
             if name == module or name.startswith(module + ".")]
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in HIDING_NAMES:
            found.append(node.id)
        elif isinstance(node, ast.Attribute) and node.attr in HIDING_ATTRIBUTES:
            found.append(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in HIDING_ATTRIBUTES:
            found.append(node.name)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and len(node.args) >= 2 and not isinstance(node.args[1], ast.Constant)):
            found.append("getattr with a computed name")
    return list(dict.fromkeys(found))


def _dotted(node) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def banned_in_source(source: str, banned) -> list[str]:
    used = source_calls(source)
    return [b for b in banned if b in used]


def banned_in_ops(ops: list[dict], banned) -> list[str]:
    """Banned functions among recorded torch calls. A call matches by name within the same top
    package, so ``x.softmax(-1)`` and ``torch.softmax`` both count as ``torch.softmax``."""
    found = []
    for name in banned:
        root, leaf = name.split(".")[0], name.rsplit(".", 1)[-1]
        for op in ops:   # functions and nn.Module calls alike (nn.MultiheadAttention)
            module = str(op.get("module") or "torch")
            if str(op.get("name")) == leaf and module.split(".")[0] == root:
                found.append(name)
                break
    return found


def ops_named(ops: list[dict], name: str) -> list[dict]:
    return [op for op in ops if op.get("name") == name]


def banned_used(source: str, ops: list[dict], banned) -> list[str]:
    """Banned names the learner's code uses, seen in its source or in the recorded calls, and
    constructs that would hide them, once each."""
    return list(dict.fromkeys(banned_in_source(source, banned) + banned_in_ops(ops, banned)
                              + hidden_calls(source)))
