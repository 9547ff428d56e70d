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
import builtins
import functools
import re
import string

from . import expect, manifest

TAMPERING = "tampering"
# A numerical library a kata does not list is no attempt on the grader: a file whose only finding
# is an import of one (an unused `import numpy` in a torch kata) is diagnosed as what it is. The
# checks that judge what the code calls still score 0: they do not see inside such a library.
IMPORT_NOT_ALLOWED = manifest.IMPORT_NOT_ALLOWED.code
LIBRARIES = frozenset({"numpy", "scipy", "torch", "einops", "opt_einsum", "jax", "flax", "tensorflow", "keras",
                       "pandas", "sympy", "numba", "cupy", "sklearn", "matplotlib", "triton", "xformers", "flash_attn"})

# The modules a kata's file may import: code that runs in the calling thread, where the recorder
# sees every torch call, and that starts no thread or process, touches no file and runs no code
# built at run time. Of the standard library's, only the names listed: an allow-list of what they
# mean, since a helper that looks harmless can turn a string into code or a name into an attribute
# (functools.singledispatch evaluates annotation strings, functools.wraps copies attributes named
# at run time, enum's functional API builds a class, a tensor subclass among them, from computed
# names). torch's namespaces are judged by the deny-lists below; a kata lets more through by name
# (its manifest's ``allow``: tp-attention's four names of torch.distributed).
COMMON_NAMES = {
    "math": None,                                 # sqrt, inf: every kata (None: every public name)
    "__future__": ("annotations",),
    "typing": ("Any", "Optional", "Union", "List", "Dict", "Tuple", "Set", "FrozenSet", "Sequence", "Mapping",
               "MutableMapping", "MutableSequence", "Iterable", "Iterator", "Callable", "Literal", "Final",
               "ClassVar", "TypeVar", "Generic", "Protocol", "NamedTuple", "Type", "Deque", "DefaultDict",
               "Annotated", "Self", "NoReturn", "cast", "overload", "final", "TYPE_CHECKING"),
    "dataclasses": ("dataclass", "field", "fields", "replace", "asdict", "astuple", "InitVar", "KW_ONLY"),
    "abc": ("ABC", "abstractmethod"),             # an interface
    "functools": ("reduce", "partial", "lru_cache", "cache", "cached_property", "total_ordering", "cmp_to_key"),
    "itertools": ("product", "permutations", "combinations", "combinations_with_replacement", "accumulate",
                  "chain", "count", "cycle", "repeat", "islice", "starmap", "zip_longest", "groupby", "pairwise",
                  "takewhile", "dropwhile", "filterfalse", "compress", "batched"),
    "collections": ("deque", "defaultdict", "OrderedDict", "Counter", "namedtuple", "ChainMap"),
    "collections.abc": ("Sequence", "Mapping", "MutableMapping", "MutableSequence", "Iterable", "Iterator",
                        "Callable", "Sized", "Hashable", "Collection", "Container", "Set"),
    "copy": ("copy", "deepcopy"),
    "heapq": ("heappush", "heappop", "heapify", "heappushpop", "heapreplace", "nlargest", "nsmallest", "merge"),
    "bisect": ("bisect", "bisect_left", "bisect_right", "insort", "insort_left", "insort_right"),
    "warnings": ("warn",),                        # a warning about an odd argument
}
COMMON_MODULES = tuple(COMMON_NAMES)
FRAMEWORK_MODULES = {
    # torch's namespaces of functions and layers; torch.nn.attention holds the sdpa_kernel that a
    # hint of sdpa-swap suggests. No torch kata with structure checks needs NumPy (KATAS.md, the
    # references and the style zoo): its arithmetic is never recorded.
    "torch": ("torch", "torch.nn", "torch.nn.functional", "torch.nn.init", "torch.nn.attention", "torch.linalg",
              "torch.fft", "torch.special"),
    "numpy": ("numpy",),
    "python": (),
    "triton": ("torch", "triton", "triton.language"),
}

# A Triton kata's file is kernels and their launchers, and the kernels compute everything: a
# launcher may allocate, read shapes and strides, take views and launch, nothing else (so torch's
# names are an allow-list, and so are the attributes its code reads), and a kernel is Triton's
# language (no torch, no interpreter's handle or NumPy data). Triton's interpreter copies its own
# module's names into the file's namespace at the first launch, so a name the file never binds
# is refused too.
TRITON_NAMES = {
    "triton": ("jit", "cdiv", "next_power_of_2", "heuristics", "language"),
    "triton.language": None,
    "torch": ("empty", "empty_like", "empty_strided", "zeros", "zeros_like", "full", "full_like", "ones", "ones_like",
              "float16", "float32", "float64", "bfloat16", "float8_e4m3fn", "int8", "int16", "int32", "int64", "uint8",
              "bool", "half", "float", "dtype", "device", "Tensor", "Size", "finfo", "iinfo", "is_tensor",
              "no_grad", "inference_mode"),
}
TRITON_DENIED = {"handle", "data", "runtime", "interpreter", "interpreter_builder", "interpreter_semantic", "compiler",
                 "backends", "knobs", "testing", "tools", "driver", "semantic", "fn", "rewrite", "rewritten_fn",
                 "rewriter", "pre_run_hooks", "add_pre_run_hook", "cache", "src"}
LAUNCHER_ATTRIBUTES = {
    # a tensor's layout and views (no arithmetic), and allocations like it
    "shape", "stride", "size", "numel", "dim", "ndim", "dtype", "device", "element_size", "itemsize", "is_contiguous",
    "is_cuda", "data_ptr", "storage_offset", "view", "reshape", "unsqueeze", "squeeze", "transpose", "permute",
    "expand", "flatten", "unflatten", "contiguous", "T", "mT", "to", "new_empty", "new_zeros", "new_full",
    "is_floating_point",
    # lists, dicts and strings
    "append", "extend", "insert", "pop", "index", "count", "items", "keys", "values", "get", "setdefault", "update",
    "join", "format", "startswith", "endswith", "split",
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
# Builtins that run code built at run time, reach a namespace or open a file.
DYNAMIC_BUILTINS = {"exec", "eval", "compile", "__import__", "globals", "locals", "vars", "open", "breakpoint", "help"}
# Allowed only called directly with a constant name, which the rules above then judge.
REFLECTION_BUILTINS = {"getattr", "setattr", "delattr", "hasattr"}
# The builtins a file may use where it binds no name of its own (every exception class too): values,
# containers and the functions that walk them, all running in the caller's thread. Not dir, id,
# memoryview, input or iter's kin of the async world; ``type`` only for a name or a comparison
# (``type(x).__name__``, ``type(a) is type(b)``): with three arguments it builds a class, a
# tensor subclass among them, from a namespace built at run time, and so does calling what
# ``type(x)`` returns when x is a class.
ALLOWED_BUILTINS = {"abs", "all", "any", "ascii", "bin", "bool", "bytearray", "bytes", "callable", "chr", "classmethod",
                    "complex", "dict", "divmod", "enumerate", "filter", "float", "format", "frozenset", "hash", "hex",
                    "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min", "next", "object",
                    "oct", "ord", "pow", "print", "property", "range", "repr", "reversed", "round", "set", "slice",
                    "sorted", "staticmethod", "str", "sum", "super", "tuple", "zip", "NotImplemented", "Ellipsis",
                    *(name for name, value in vars(builtins).items()
                      if isinstance(value, type) and issubclass(value, BaseException))}
# The special methods a class of the file may define (or assign in its body): Python calls these
# from the learner's own code, in its thread. The rest are refused, because torch calls them from
# inside an op, where the recorder has stepped aside (__torch_function__, __getitem__ and __iter__
# of a sequence given as sizes, __index__, __float__, __array__), or because they change how
# attributes, classes or copies are made (__getattr__, __init_subclass__, __set_name__,
# __reduce__, __class_getitem__).
ALLOWED_DEFINITIONS = {"__init__", "__post_init__", "__call__", "__repr__", "__str__", "__len__", "__contains__",
                       "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__enter__", "__exit__",
                       "__all__", "__slots__"}
# Bases a class of the file may have besides its own classes and the standard library's names
# above: torch.nn's modules, never a tensor (torch.Tensor, nn.Parameter and nn.Buffer are
# tensors, whose subclasses take over torch's dispatch).
TENSOR_CLASSES = {"Tensor", "Parameter", "Buffer", "UninitializedParameter", "UninitializedBuffer", "parameter"}
# What `kata lint` adds to a reference to prove that the kata's structure checks catch tampering.
TAMPERING_PROBE = "\nimport inspect\n"


def allowed_modules(framework: str, allow: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The modules a file of a kata in ``framework`` (its manifest's) may import; ``allow`` (the
    manifest's) adds the modules of the names it lists."""
    return tuple(dict.fromkeys(FRAMEWORK_MODULES[framework] + COMMON_MODULES
                               + tuple(name.rpartition(".")[0] for name in allow)))


def _restricted(allow: tuple[str, ...], framework: str = "torch") -> dict[str, frozenset | None]:
    """{module: the only names of it a file may use (None: any)}: the standard library's, a Triton
    kata's torch and triton, and the modules whose names ``allow`` lists."""
    names_of = COMMON_NAMES | (TRITON_NAMES if framework == "triton" else {})
    restricted = {module: None if names is None else frozenset(names) for module, names in names_of.items()}
    for name in allow:
        module, _, leaf = name.rpartition(".")
        restricted[module] = frozenset(restricted.get(module) or ()) | {leaf}
    return restricted


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


def tampering(source: str, framework: str, allow: tuple[str, ...] = ()) -> list[str]:
    """What in the source a structure check cannot trust, each as ``what (line N)``: an import
    outside the kata's allow-list (``allowed_modules``: threading, os, a helper module of one's
    own, ...), and the constructs of the deny-lists above, however a module is imported: a torch
    namespace that runs code where the recorder does not look, a dunder or another module's private
    attribute, a module bound to another name or patched, exec and its kin, getattr and its kin
    without a constant name, a file written or loaded; and what lies outside the allow-lists of
    meaning: a standard-library name, a builtin or a special method not listed, a class whose base
    is a tensor or that names a metaclass, ``type`` used other than for a name, a string that runs
    as code (an annotation, a format string that reads attributes). A kata solution needs none of
    them. ``allow``: names the kata lets through besides (its manifest's)."""
    return list(_scan(source, framework, allow)[0])


def libraries_only(source: str, framework: str, allow: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The libraries (``LIBRARIES``) the file imports though the kata does not list them, where
    such imports are all that ``tampering`` finds; empty otherwise."""
    found, libraries = _scan(source, framework, allow)
    return libraries if len(found) == len(libraries) else ()


# The verdict on a file, by its text: one walk however many gradings and checks read it (grade_seeds
# grades a file at 20 seeds). The text is the trusted process's copy of the file as handed in
# (Sandbox.source_text, read before the worker starts), which the learner's code never reaches, so
# when the walk happens cannot change what it finds.
@functools.lru_cache(maxsize=64)
def _scan(source: str, framework: str, allow: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(what ``tampering`` finds, each as ``what (line N)``; the imports of LIBRARIES among it, as
    ``import numpy (line 1)``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return (), ()   # such a file does not load: its checks fail without a recording
    scan = _Scan(tree, allowed_modules(framework, allow), _restricted(allow, framework), triton=framework == "triton")
    lines: dict[str, list[int]] = {}
    for what, line in sorted(set(scan.found), key=lambda item: (item[1], item[0])):
        lines.setdefault(what, []).append(line)
    found = {what: f"{what} (line{'s' if len(at) > 1 else ''} {', '.join(map(str, at))})" for what, at in lines.items()}
    return tuple(found.values()), tuple(found[what] for what in found if what in scan.libraries)


class _Scan(ast.NodeVisitor):
    """One walk over a parsed file; ``found`` holds (what, line) for each thing refused. A parent
    is visited before its children, so a name marked as the base of an attribute (``torch`` in
    ``torch.exp``) or as a direct ``getattr`` is known when the walk reaches it."""

    def __init__(self, tree, allowed: tuple[str, ...], restricted: dict[str, frozenset | None], triton: bool = False):
        self.allowed, self.restricted, self.found = allowed, restricted, []
        self.triton, self.kernel = triton, 0   # a Triton kata's file; the depth of @triton.jit functions we are in
        self.stored = {node.attr for node in ast.walk(tree)   # attributes of the file's own objects (self.k)
                       if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load)}
        self.aliases = _aliases(tree)
        # Names bound to a module (`import torch`, `from torch import nn`): never a value of their own.
        self.modules = {name for name, target in self.aliases.items()
                        if target in allowed or name == target.split(".")[0]}
        self.bound = _bound(tree)
        self.names = _names(tree)   # every name the file binds: a builtin's name is then its own
        self.classes = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
        self.parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        self.bases, self.direct = set(), set()   # ids of Name nodes: an attribute's base, a direct getattr
        self.libraries = set()   # what was refused that is an import of a library (LIBRARIES)
        self.visit(tree)

    def refuse(self, what: str, node):
        self.found.append((what, node.lineno))

    def attribute_ok(self, name: str, *, of_module: bool, read: bool = True) -> bool:
        """Whether attribute ``name`` may be read (or written) on an object, or on a module when
        ``of_module`` (where a private name is the library's, never the file's own)."""
        if name in DENIED_ATTRIBUTES or (self.triton and name in TRITON_DENIED):
            return False
        if _dunder(name):
            return read and name in ALLOWED_DUNDERS
        return not name.startswith("_") or (not of_module and name in self.bound)

    def listed(self, resolved: str | None, node=None) -> bool | None:
        """The allow-lists' verdict on the dotted name ``resolved``: False for a name of a restricted
        module (the standard library's, or one the kata's ``allow`` opens) that its list lacks, or
        for such a module used as a value (``node`` not the base of an attribute); True for a listed
        name or module itself, which the deny-lists then leave alone; None outside them."""
        module = max((m for m in self.restricted if resolved == m or (resolved or "").startswith(m + ".")),
                     key=len, default=None)
        if module is None:
            return None
        if resolved == module:
            return node is None or isinstance(self.parents.get(id(node)), ast.Attribute)
        names, leaf = self.restricted[module], resolved[len(module) + 1:].split(".")[0]
        if leaf not in (names or ()) and (names is not None or leaf.startswith("_")):
            return False
        return True if resolved == f"{module}.{leaf}" else None

    def judged(self, name: str, resolved: str | None, node, *, read: bool = True) -> bool:
        """Whether attribute ``name`` (``resolved`` when read from an imported name) may be reached."""
        verdict = self.listed(resolved, node)
        return verdict if verdict is not None else self.attribute_ok(name, of_module=resolved is not None, read=read)

    def visit_Import(self, node):
        for a in node.names:
            if a.name not in self.allowed:
                self.refuse(f"import {a.name}", node)
                if a.name.split(".")[0] in LIBRARIES:
                    self.libraries.add(f"import {a.name}")

    def visit_ImportFrom(self, node):
        module = "." * node.level + (node.module or "")
        for a in node.names:
            # Relative: a module of the learner's own, which a structure check cannot read.
            if node.level or node.module not in self.allowed or a.name == "*" \
                    or not self.judged(a.name, f"{node.module}.{a.name}", None):
                self.refuse(f"from {module} import {a.name}", node)
                if not node.level and node.module not in self.allowed and a.name != "*" \
                        and node.module.split(".")[0] in LIBRARIES:
                    self.libraries.add(f"from {module} import {a.name}")

    def writable(self, chain: str | None) -> bool:
        """Whether the attribute at the end of ``chain`` may be set or deleted: on the file's own
        objects (self.x, self.cache.k), never on a module or a library's class (torch.exp = f,
        type(x).shape = p, x.__class__.shape = p), which the worker's own measures use."""
        return (chain is not None and _resolve(chain, self.aliases) is None
                and not any(_dunder(part) for part in chain.split(".")))

    def named(self, node) -> bool:
        """Whether ``node``, a class (``type(x)``, ``x.__class__``), is used only for its name or in
        a comparison: never called, subclassed or kept, which could build a class."""
        parent = self.parents.get(id(node))
        return (isinstance(parent, ast.Attribute) and parent.attr in ("__name__", "__qualname__")) \
            or isinstance(parent, ast.Compare)

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name):
            self.bases.add(id(node.value))
        chain = _dotted(node)
        resolved, read = _resolve(chain, self.aliases), isinstance(node.ctx, ast.Load)
        if not self.judged(node.attr, resolved, node, read=read) or not (read or self.writable(chain)):
            self.refuse(resolved or _text(node), node)
        elif self.triton and self.kernel and (resolved or "").split(".")[0] == "torch":
            self.refuse(f"{resolved} inside a kernel", node)
        elif self.triton and not self.kernel and resolved is None and node.attr not in LAUNCHER_ATTRIBUTES \
                and node.attr not in self.stored:
            self.refuse(f"{_text(node)} in a launcher, which may only allocate, read shapes and launch", node)
        elif node.attr == "__class__" and not self.named(node):
            self.refuse(f"{_text(node)} other than for its name", node)
        elif node.attr in ("format", "format_map") and not _plain_format(node.value):
            self.refuse(f"{_text(node)}: a format string that is built at run time or reads attributes", node)
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
                if not self.judged(name, resolved, None, read=read) or not (read or self.writable(chain)):
                    self.refuse(resolved or f"{node.func.id}(..., {name!r})", node)
        elif isinstance(node.func, ast.Name) and node.func.id == "type" and "type" not in self.names:
            self.direct.add(id(node.func))
            if len(node.args) != 1 or node.keywords:
                self.refuse(f"type() with {len(node.args) + len(node.keywords)} arguments", node)
            elif not self.named(node):
                self.refuse(f"{_text(node)} other than for its name", node)
        self.generic_visit(node)

    def visit_Name(self, node):
        load = isinstance(node.ctx, ast.Load)
        if node.id in DYNAMIC_BUILTINS:
            self.refuse(node.id, node)
        elif node.id in REFLECTION_BUILTINS | {"type"} and id(node) not in self.direct and node.id not in self.names:
            self.refuse(f"{node.id} as a value", node)   # g = getattr; g(obj, name)
        elif _dunder(node.id) and (node.id not in ALLOWED_DUNDERS if load else node.id not in ALLOWED_DEFINITIONS):
            self.refuse(node.id, node)
        elif load and node.id in self.modules and id(node) not in self.bases:
            self.refuse(f"{node.id} as a value", node)   # t = torch: t._C escapes the aliases above
        elif load and node.id not in self.names and hasattr(builtins, node.id) and not _dunder(node.id) \
                and node.id not in ALLOWED_BUILTINS | REFLECTION_BUILTINS | {"type"}:
            self.refuse(f"{node.id}, a builtin this check does not list", node)
        elif self.triton and load and node.id not in self.names and not hasattr(builtins, node.id):
            self.refuse(f"{node.id}, a name the file does not define", node)

    def visit_FunctionDef(self, node):
        if _dunder(node.name) and node.name not in ALLOWED_DEFINITIONS:
            self.refuse(f"def {node.name}", node)
        self.annotations(node.returns)
        kernel = self.triton and any(
            (_resolve(_dotted(d.func if isinstance(d, ast.Call) else d), self.aliases) or "").startswith("triton.")
            for d in node.decorator_list)
        self.kernel += kernel
        self.generic_visit(node)
        self.kernel -= kernel

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_arg(self, node):
        self.annotations(node.annotation)
        self.generic_visit(node)

    def visit_AnnAssign(self, node):
        self.annotations(node.annotation)
        self.generic_visit(node)

    def annotations(self, node):
        """A string in an annotation is code that typing may evaluate: only a name (a class
        defined later) is let through."""
        for part in ast.walk(node) if node is not None else ():
            if isinstance(part, ast.Constant) and isinstance(part.value, str) \
                    and not all(word.isidentifier() for word in part.value.split(".")):
                self.refuse(f"the annotation {part.value[:40]!r}{'...' if len(part.value) > 40 else ''}", part)

    def visit_ClassDef(self, node):
        for base in node.bases:
            if not self.base_ok(base):
                self.refuse(f"class {node.name}({_text(base)})", node)
        for keyword in node.keywords:
            self.refuse(f"class {node.name}({keyword.arg}=...)", node)   # a metaclass
        self.generic_visit(node)

    def base_ok(self, base) -> bool:
        """A base class of the file's own, a builtin exception or ``object``, a listed name of the
        standard library, or a torch.nn module (never a tensor; see TENSOR_CLASSES)."""
        if isinstance(base, ast.Subscript):   # Generic[T]
            base = base.value
        if isinstance(base, ast.Name) and base.id not in self.aliases:
            return base.id in self.classes or (base.id not in self.names and base.id in ALLOWED_BUILTINS
                                               and isinstance(getattr(builtins, base.id), type))
        resolved = _resolve(_dotted(base), self.aliases)
        if resolved is None:
            return False
        if resolved.startswith("torch.nn."):
            return not TENSOR_CLASSES & set(resolved.split("."))
        return self.listed(resolved) is True and resolved.split(".")[0] in COMMON_NAMES

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


def _plain_format(node) -> bool:
    """Whether ``node`` is a format string written in the file whose fields name arguments only
    (``"{} of {n:.2f}"``), never an attribute or an item of one (``"{0.__globals__}"``)."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return False

    def plain(text: str, depth: int = 0) -> bool:
        try:
            fields = list(string.Formatter().parse(text))
        except ValueError:
            return False
        return all(field is None or (re.fullmatch(r"\w*", field) and depth < 2 and plain(spec or "", depth + 1))
                   for _, field, spec, _ in fields)

    return plain(node.value)


def _names(tree) -> set[str]:
    """Every name the file binds: assigned, imported, defined, an argument, an exception or a
    pattern's capture."""
    names = set(_aliases(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
    return names


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


def check_untampered(learner, *, call: str, case: str | None = None):
    """A structure check's last judgement: what it recorded and read holds only for a file that
    passes the static check (``tampering``) and whose recorded calls hold no custom operator (the
    recorder sees none of the calls its body makes). Last, so that a known bug the check sees is
    still named (and the bug oracles, whose files load the reference with exec, keep their own
    diagnoses)."""
    found = [*tampering(learner.source, learner.framework, learner.allow),
             *(f"{name}, a custom operator" for name in sorted(learner.custom_operators)),
             *(f"{name}, a function of your file that torch ran inside one of its own calls, where the recorder "
               "does not look" for name in sorted(learner.below_recorder))]
    allowed = ", ".join(allowed_modules(learner.framework, learner.allow))
    libraries = libraries_only(learner.source, learner.framework, learner.allow)
    if found and len(found) == len(libraries):
        expect.that(False, "Your file imports a library this kata does not allow. That is no fault in itself, but "
                    "this check judges what your code calls and cannot see inside a library it does not list, so it "
                    "scores 0. Remove the import (an unused one too) and write it with the modules listed.",
                    call=call, case=case, got=", ".join(found), expected=f"imports of {allowed} only",
                    diagnose=lambda: IMPORT_NOT_ALLOWED)
    expect.that(not found, "Your file uses something with which code can hide what it computes from the grader "
                "(a module this kata does not list, introspection, dynamic code, a thread or a process, a file): "
                "each is named below with its line. This structure check cannot trust what it saw, so it scores 0.",
                call=call, case=case, got=", ".join(found),
                expected=f"plain code that imports only {allowed} and calls their functions directly",
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
