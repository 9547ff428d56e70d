"""Structural judgements: which library calls a learner's code uses, and whether it can be trusted
to say.

Two views, because each alone is easy to miss: the source (names the file imports and calls,
aliases resolved, read with ``ast`` in the trusted process; the file never runs here) and the
torch functions recorded while the learner's code ran in the sandbox. Code can shape both (a name
built at run time, a recorder switched off, a frame or the garbage collector reaching the worker's
own objects), so introspection and dynamic code found in the source count as tampering: a
structure check cannot trust what it saw of such a file and scores 0.
"""
from __future__ import annotations

import ast

from . import expect

TAMPERING = "tampering"
# Modules (and module attributes) that reach into the interpreter, hand frames to a callback
# (settrace) or run code built at run time.
TAMPERING_MODULES = ("importlib", "builtins", "ctypes", "_ctypes", "runpy", "code", "codeop", "marshal", "pickle",
                     "inspect", "gc", "torch._C", "torch.overrides", "sys.modules", "sys._getframe",
                     "sys._current_frames", "sys.settrace", "sys.setprofile")
TAMPERING_NAMES = {"__import__", "eval", "exec", "compile", "globals", "vars", "__builtins__"}
# Frames (and a function's globals) give the learner's code the worker's objects; the rest switch
# torch's function recording off.
TAMPERING_ATTRIBUTES = {"f_back", "f_globals", "f_locals", "f_builtins", "tb_frame", "gi_frame", "cr_frame",
                        "ag_frame", "__globals__",
                        "_disable_torch_function", "DisableTorchFunction", "DisableTorchFunctionSubclass",
                        "_pop_mode", "_push_mode", "_set_torch_function_mode", "__torch_function__"}
# `from torch import *` binds bare names (softmax) that the source view cannot tell apart.
STAR_IMPORT_LIBRARIES = ("torch", "numpy", "scipy")
# What `kata lint` adds to a reference to prove that the kata's structure checks catch tampering.
TAMPERING_PROBE = "\nimport inspect\n"


def source_calls(source: str) -> set[str]:
    """Dotted names the source refers to, with import aliases resolved
    (``import torch.nn.functional as F; F.softmax`` gives ``torch.nn.functional.softmax``)."""
    try:
        return {name for name, _ in _references(ast.parse(source))}
    except SyntaxError:
        return set()


def _references(tree):
    """(dotted name, line) for each import and each use of an imported name."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                yield f"{node.module}.{a.name}", node.lineno
    for node in ast.walk(tree):
        dotted = _dotted(node) if isinstance(node, (ast.Attribute, ast.Name)) else _getattr_dotted(node)
        if dotted:
            head, _, rest = dotted.partition(".")
            if head in aliases:
                yield aliases[head] + (f".{rest}" if rest else ""), node.lineno


def _getattr_dotted(node) -> str | None:
    """``getattr(F, "softmax")`` read as ``F.softmax``."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        base = _dotted(node.args[0])
        return f"{base}.{node.args[1].value}" if base else None
    return None


def tampering(source: str) -> list[str]:
    """Introspection and dynamic code in the source, each as ``what (line N)``: frames, inspect,
    gc, ctypes, runpy, exec/eval/compile, importlib, __import__, sys.modules, getattr with a
    computed name, star imports of a library, torch's function recording switched off. A kata
    solution needs none of them."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []   # such a file does not load: its checks fail without a recording
    found = [(module, line) for name, line in _references(tree) for module in TAMPERING_MODULES
             if name == module or name.startswith(module + ".")]
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in TAMPERING_NAMES:
            found.append((node.id, node.lineno))
        elif isinstance(node, ast.Attribute) and node.attr in TAMPERING_ATTRIBUTES:
            found.append((node.attr, node.lineno))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in TAMPERING_ATTRIBUTES:
            found.append((node.value, node.lineno))   # getattr(frame, "f_back"), attrgetter("f_back")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in TAMPERING_ATTRIBUTES:
            found.append((node.name, node.lineno))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and len(node.args) >= 2 and not isinstance(node.args[1], ast.Constant)):
            found.append(("getattr with a computed name", node.lineno))
        elif (isinstance(node, ast.ImportFrom) and not node.level and node.module
              and node.module.split(".")[0] in STAR_IMPORT_LIBRARIES and any(a.name == "*" for a in node.names)):
            found.append((f"from {node.module} import *", node.lineno))
    lines: dict[str, list[int]] = {}
    for what, line in sorted(set(found), key=lambda item: (item[1], item[0])):
        lines.setdefault(what, []).append(line)
    return [f"{what} (line{'s' if len(at) > 1 else ''} {', '.join(map(str, at))})" for what, at in lines.items()]


def check_untampered(source: str, *, call: str, case: str | None = None):
    """A structure check's last judgement: what it recorded and read holds only for a file without
    tampering. Last, so that a known bug the check sees is still named (and the bug oracles, whose
    files load the reference with exec, keep their own diagnoses)."""
    found = tampering(source)
    expect.that(not found, "Your file uses introspection or dynamic code, with which code can hide what it "
                "calls from the grader: this structure check cannot trust what it saw, so it scores 0.",
                call=call, case=case, got=", ".join(found),
                expected="plain code: modules imported by name, their functions called directly",
                diagnose=lambda: TAMPERING)


def _dotted(node) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def banned_in_source(source: str, banned) -> list[str]:
    """Banned names the source refers to. A banned module bans what lies under it, however it is
    imported: ``from torch.autograd.functional import vjp`` uses ``torch.autograd``."""
    used = source_calls(source)
    return [b for b in banned if any(name == b or name.startswith(b + ".") for name in used)]


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
    """Banned names the learner's code uses, seen in its source or in the recorded calls, once each."""
    return list(dict.fromkeys(banned_in_source(source, banned) + banned_in_ops(ops, banned)))
