"""Structural judgements: which library calls a learner's code uses, and whether it can be trusted
to say.

Two views, because each alone is easy to miss: the source (names the file imports and calls,
aliases resolved, read with ``ast`` in the trusted process; the file never runs here) and the
torch functions recorded while the learner's code ran in the sandbox. The recorder sees the torch
functions that the calling thread runs, nothing else, and code can shape what it sees: work done
in a thread, a child process, a custom or higher-order op or the autograd engine is not recorded;
a frame, the garbage collector or ``__main__`` reaches the worker's own objects; a file written at
run time can be imported. So a structure check trusts only a file that passes a static check of
its source as handed in (``tampering``), a text the file never reaches from the sandbox: it
imports only the kata's modules (an allow-list) and uses none of the constructs that lead
elsewhere (a deny-list). A file that fails it is ``tampering``, and every structure check of its
kata scores 0.

RestrictedPython, the maintained restricted-compile library, does not fit: its compiler refuses
every name and attribute that starts with "_" (``self._cache``, ``super().__init__()``: 119 of the
kit's 223 references, stubs and style-zoo files) and augmented assignment to an attribute
(``self.pos += T``), and it leaves imports and attribute reads to guards that run in the process of
the code they guard: the learner's, the one process whose word cannot be taken here.
"""
from __future__ import annotations

import ast
import functools

from . import expect

TAMPERING = "tampering"

# The modules a kata's file may import: code that runs in the calling thread, where the recorder
# sees every torch call, and that starts no thread or process, touches no file and runs no code
# built at run time. The names a module holds are judged one by one below.
COMMON_MODULES = (
    "math",                                       # sqrt, inf: every kata
    "__future__",                                 # annotations
    "typing", "dataclasses", "abc", "enum", "numbers",   # annotations, a config class, an interface
    "functools", "itertools", "collections", "collections.abc", "copy",   # reduce, product, deque, deepcopy
    "heapq", "bisect",                            # a heap or a sorted list of free ids
    "warnings",                                   # a warning about an odd argument
)
FRAMEWORK_MODULES = {
    # torch's namespaces of functions and layers; torch.nn.attention holds the sdpa_kernel that a
    # hint of sdpa-swap suggests. No torch kata with structure checks needs NumPy (KATAS.md, the
    # references and the style zoo): its arithmetic is never recorded.
    "torch": ("torch", "torch.nn", "torch.nn.functional", "torch.nn.init", "torch.nn.attention", "torch.linalg",
              "torch.fft", "torch.special"),
    "numpy": ("numpy",),
    "python": (),
}

# Attribute names refused on whatever object they are read, however it was reached: a module is
# reachable as an attribute of another (torch.os, torch.nn.functional.torch), and `from m import
# name` reads one too.
# torch whose work the recorder does not see: other threads and processes, custom and
# higher-order ops (their bodies run below the recorder), compilers and graphs, and the autograd
# engine (backward hooks, saved-tensor hooks and autograd.grad's own products all run unrecorded).
RUNS_ELSEWHERE = {"jit", "futures", "multiprocessing", "distributed", "parallel", "DataParallel", "library", "ops",
                  "classes", "compile", "compiler", "export", "fx", "onnx", "CUDAGraph", "graphs",
                  "make_graphed_callables", "jiterator", "cond", "while_loop", "flex_attention", "apply_", "map_",
                  "map2_", "autograd", "func", "backward", "grad_fn", "register_hook", "register_backward_hook",
                  "register_full_backward_hook", "register_full_backward_pre_hook",
                  "register_post_accumulate_grad_hook", "utils", "hub", "package", "overrides"}
# Modules no kata imports, where a module it does import holds them (torch.os.fork, torch.sys.modules,
# numpy.ctypeslib), and torch itself reached through another module.
OTHER_MODULES = {"os", "sys", "threading", "_thread", "subprocess", "concurrent", "asyncio", "signal", "atexit", "io",
                 "pathlib", "shutil", "tempfile", "importlib", "pkgutil", "zipimport", "runpy", "code", "codeop",
                 "traceback", "gc", "inspect", "ctypes", "ctypeslib", "f2py", "builtins", "operator", "types",
                 "pickle", "marshal", "socket", "torch"}
# Files written or read back: a helper module written at run time, or a pickle that runs code as it loads.
FILES = {"save", "savez", "savez_compressed", "savetxt", "tofile", "dump", "memmap", "open_memmap", "load", "loadtxt",
         "genfromtxt", "fromfile", "fromregex", "from_file", "DataSource", "load_library"}
# Frames, tracebacks and code objects give the worker's objects and bytecode; the rest switch
# torch's function recording off; typing evaluates annotation strings as code.
FRAMES = {"f_back", "f_globals", "f_locals", "f_builtins", "f_code", "f_trace", "tb_frame", "tb_next", "gi_frame",
          "gi_code", "cr_frame", "cr_code", "ag_frame", "ag_code"}
RECORDER = {"_disable_torch_function", "DisableTorchFunction", "DisableTorchFunctionSubclass", "_pop_mode",
            "_push_mode", "_set_torch_function_mode", "_C", "_global_forward_pre_hooks", "_global_forward_hooks"}
DENIED_ATTRIBUTES = (RUNS_ELSEWHERE | OTHER_MODULES | FILES | FRAMES | RECORDER
                     | {"numpy", "get_type_hints", "ForwardRef"})   # x.numpy(): NumPy's arithmetic, unrecorded
# Dunder attributes lead to every object (x.__class__.__base__.__subclasses__(), f.__globals__,
# e.__traceback__) but these: a base class's __init__ (super().__init__(), nn.Module.__init__(self))
# and a class's name for a message (self.__class__.__name__), read, never written.
ALLOWED_DUNDERS = {"__init__", "__class__", "__name__"}
# A method of these names takes over torch's dispatch (hiding or rewriting what the recorder
# sees); __match_args__ makes `case C(x)` read attributes named by strings.
DENIED_DEFINITIONS = {"__torch_function__", "__torch_dispatch__", "__match_args__"}
# Builtins that run code built at run time, reach a namespace or open a file. `input` is not one:
# it is the usual name of forward's argument, and the worker's standard input is closed.
DYNAMIC_BUILTINS = {"exec", "eval", "compile", "__import__", "globals", "locals", "vars", "open", "breakpoint", "help"}
# Allowed only called directly with a constant name, which the rules above then judge.
REFLECTION_BUILTINS = {"getattr", "setattr", "delattr", "hasattr"}
# What `kata lint` adds to a reference to prove that the kata's structure checks catch tampering.
TAMPERING_PROBE = "\nimport inspect\n"


def allowed_modules(framework: str) -> tuple[str, ...]:
    """The modules a file of a kata in ``framework`` (its manifest's) may import."""
    return FRAMEWORK_MODULES[framework] + COMMON_MODULES


def source_calls(source: str) -> set[str]:
    """Dotted names the source refers to, with import aliases resolved
    (``import torch.nn.functional as F; F.softmax`` gives ``torch.nn.functional.softmax``)."""
    try:
        return {name for name, _ in _references(ast.parse(source))}
    except SyntaxError:
        return set()


def _aliases(tree) -> dict[str, str]:
    """{name bound by an import: the dotted name it stands for}."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def _resolve(dotted: str | None, aliases: dict[str, str]) -> str | None:
    """``dotted`` (``F.softmax``) with its head resolved (``torch.nn.functional.softmax``); None
    unless it starts at an imported name."""
    head, _, rest = (dotted or "").partition(".")
    return aliases[head] + (f".{rest}" if rest else "") if head in aliases else None


def _references(tree):
    """(dotted name, line) for each import and each use of an imported name."""
    aliases = _aliases(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield from ((f"{node.module}.{a.name}", node.lineno) for a in node.names)
        elif name := _resolve(_dotted(node) or _getattr_dotted(node), aliases):
            yield name, node.lineno


def _getattr_dotted(node) -> str | None:
    """``getattr(F, "softmax")`` read as ``F.softmax``."""
    name = _constant_name(node, ("getattr",))
    base = name and _dotted(node.args[0])
    return f"{base}.{name}" if base else None


def tampering(source: str, framework: str) -> list[str]:
    """What in the source a structure check cannot trust, each as ``what (line N)``: an import
    outside the kata's allow-list (``allowed_modules``: threading, os, a helper module of one's
    own, ...), and the constructs of the deny-lists above, however a module is imported: a torch
    namespace that runs code where the recorder does not look, a dunder or another module's private
    attribute, a module bound to another name or patched, exec and its kin, getattr and its kin
    without a constant name, a file written or loaded. A kata solution needs none of them."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []   # such a file does not load: its checks fail without a recording
    found = _Scan(tree, allowed_modules(framework)).found
    lines: dict[str, list[int]] = {}
    for what, line in sorted(set(found), key=lambda item: (item[1], item[0])):
        lines.setdefault(what, []).append(line)
    return [f"{what} (line{'s' if len(at) > 1 else ''} {', '.join(map(str, at))})" for what, at in lines.items()]


class _Scan(ast.NodeVisitor):
    """One walk over a parsed file; ``found`` holds (what, line) for each thing refused. A parent
    is visited before its children, so a name marked as the base of an attribute (``torch`` in
    ``torch.exp``) or as a direct ``getattr`` is known when the walk reaches it."""

    def __init__(self, tree, allowed: tuple[str, ...]):
        self.allowed, self.found = allowed, []
        self.aliases = _aliases(tree)
        # Names bound to a module (`import torch`, `from torch import nn`): never a value of their own.
        self.modules = {name for name, target in self.aliases.items()
                        if target in allowed or name == target.split(".")[0]}
        self.bound = _bound(tree)
        self.bases, self.direct = set(), set()   # ids of Name nodes: an attribute's base, a direct getattr
        self.visit(tree)

    def refuse(self, what: str, node):
        self.found.append((what, node.lineno))

    def attribute_ok(self, name: str, *, of_module: bool, read: bool = True) -> bool:
        """Whether attribute ``name`` may be read (or written) on an object, or on a module when
        ``of_module`` (where a private name is the library's, never the file's own)."""
        if name in DENIED_ATTRIBUTES:
            return False
        if _dunder(name):
            return read and name in ALLOWED_DUNDERS
        return not name.startswith("_") or (not of_module and name in self.bound)

    def visit_Import(self, node):
        for a in node.names:
            if a.name not in self.allowed:
                self.refuse(f"import {a.name}", node)

    def visit_ImportFrom(self, node):
        module = "." * node.level + (node.module or "")
        for a in node.names:
            # Relative: a module of the learner's own, which a structure check cannot read.
            if node.level or node.module not in self.allowed or a.name == "*" \
                    or not self.attribute_ok(a.name, of_module=True):
                self.refuse(f"from {module} import {a.name}", node)

    def writable(self, chain: str | None) -> bool:
        """Whether the attribute at the end of ``chain`` may be set or deleted: on the file's own
        objects (self.x, self.cache.k), never on a module or a library's class (torch.exp = f,
        type(x).shape = p, x.__class__.shape = p), which the worker's own measures use."""
        return (chain is not None and _resolve(chain, self.aliases) is None
                and not any(_dunder(part) for part in chain.split(".")))

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name):
            self.bases.add(id(node.value))
        chain = _dotted(node)
        resolved, read = _resolve(chain, self.aliases), isinstance(node.ctx, ast.Load)
        if not self.attribute_ok(node.attr, of_module=resolved is not None, read=read) \
                or not (read or self.writable(chain)):
            self.refuse(resolved or _text(node), node)
        self.generic_visit(node)

    def visit_Call(self, node):
        if isinstance(node.func, ast.Name) and node.func.id in REFLECTION_BUILTINS:
            self.direct.add(id(node.func))
            if node.args and isinstance(node.args[0], ast.Name):
                self.bases.add(id(node.args[0]))   # getattr(torch, ...) reads torch, as torch.exp does
            name = _constant_name(node, REFLECTION_BUILTINS)
            if name is None:
                self.refuse(f"{node.func.id} with a computed name", node)
            else:
                base = _dotted(node.args[0])
                chain = base and f"{base}.{name}"
                resolved, read = _resolve(chain, self.aliases), node.func.id in ("getattr", "hasattr")
                if not self.attribute_ok(name, of_module=resolved is not None, read=read) \
                        or not (read or self.writable(chain)):
                    self.refuse(resolved or f"{node.func.id}(..., {name!r})", node)
        self.generic_visit(node)

    def visit_Name(self, node):
        load = isinstance(node.ctx, ast.Load)
        if node.id in DYNAMIC_BUILTINS:
            self.refuse(node.id, node)
        elif node.id in REFLECTION_BUILTINS and id(node) not in self.direct:
            self.refuse(f"{node.id} as a value", node)   # g = getattr; g(obj, name)
        elif _dunder(node.id) and (node.id not in ALLOWED_DUNDERS if load else node.id in DENIED_DEFINITIONS):
            self.refuse(node.id, node)
        elif load and node.id in self.modules and id(node) not in self.bases:
            self.refuse(f"{node.id} as a value", node)   # t = torch: t._C escapes the aliases above

    def visit_FunctionDef(self, node):
        if node.name in DENIED_DEFINITIONS:
            self.refuse(f"def {node.name}", node)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_MatchClass(self, node):
        for name in node.kwd_attrs:   # `case C(attr=x)` reads x = subject.attr
            if not self.attribute_ok(name, of_module=False):
                self.refuse(f"case {ast.unparse(node.cls)}({name}=...)", node)
        self.generic_visit(node)

    def visit_Constant(self, node):
        # A name held as a string reaches the object by other means: attrgetter("f_back"), "{0.__globals__}".
        if isinstance(node.value, str) and (node.value in FRAMES | RECORDER or (
                _dunder(node.value) and node.value not in ALLOWED_DUNDERS | {"__main__"})):
            self.refuse(repr(node.value), node)


def _bound(tree) -> set[str]:
    """The names the file binds itself (self._cache = ..., def _helper, setattr(self, "_k", k)): a
    private attribute of one of these is the file's own, not a library's."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
            bound.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif name := _constant_name(node, ("setattr",)):
            bound.add(name)
    return bound


def _text(node, limit: int = 40) -> str:
    """How the source writes ``node``, its end kept when long: ``torch.zeros(1).apply_``."""
    text = ast.unparse(node)
    return text if len(text) <= limit else "..." + text[3 - limit:]


def _dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _constant_name(node, functions) -> str | None:
    """The name in ``getattr(obj, "name", ...)`` (a call of one of ``functions``), if constant."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions
            and len(node.args) >= 2 and not isinstance(node.args[0], ast.Starred)
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        return node.args[1].value
    return None


# The verdict on a file, by its text: one walk however many gradings and checks read it (grade_seeds
# grades a file at 20 seeds). The text is the trusted process's copy of the file as handed in
# (Sandbox.source_text, read before the worker starts), which the learner's code never reaches, so
# when the walk happens cannot change what it finds.
_verdict = functools.lru_cache(maxsize=64)(tampering)


def check_untampered(learner, *, call: str, case: str | None = None):
    """A structure check's last judgement: what it recorded and read holds only for a file that
    passes the static check (``tampering``) and whose recorded calls hold no custom operator (the
    recorder sees none of the calls its body makes). Last, so that a known bug the check sees is
    still named (and the bug oracles, whose files load the reference with exec, keep their own
    diagnoses)."""
    found = [*_verdict(learner.source, learner.framework),
             *(f"{name}, a custom operator" for name in sorted(learner.custom_operators))]
    expect.that(not found, "Your file uses something with which code can hide what it computes from the grader "
                "(a module this kata does not list, introspection, dynamic code, a thread or a process, a file): "
                "each is named below with its line. This structure check cannot trust what it saw, so it scores 0.",
                call=call, case=case, got=", ".join(found),
                expected=f"plain code that imports only {', '.join(allowed_modules(learner.framework))} and calls "
                "their functions directly",
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
