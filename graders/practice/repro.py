"""`kata repro`: a failed public check of the last run, as a script the learner runs and prints in.

`kata check` keeps the calls each failed public check made into the learner's file (engine/tape.py;
hidden checks keep none). From that tape this module writes ``repro/<kata>.<check>.py`` and its
``.npz`` of inputs in the workspace: the call that went wrong, with the same inputs and the seed
the kit set before it, what the check expected back, and an assertion. The script imports the
learner's file directly and runs without the kit's sandbox, so an exception shows the learner's
own traceback. What to expect comes from the kata's reference, fed the same calls in the sandbox
(a student bundle has no reference: its scripts make the call and print what came back).

The call is the first one of the tape whose answer differs from the reference's (the check may
have made many; a later one may only have noticed). Before it come the calls that made or changed
the objects it uses (a module built and loaded, a cache appended to). In a rank group, each rank's
calls run in a process of its own, on a gloo group of the same size.
"""
from __future__ import annotations

import ast
import builtins
import keyword
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..engine import expect
from ..engine.manifest import TORCH_FRAMEWORKS, Kata
from ..engine.plugin import check_names
from ..engine.tape import Handle, Outcome, Step, Tape, Unknown, index, leaves, load, needed, spread
from ..engine.worker import drawn_seed


class ReproError(Exception):
    """Why no script could be written (said to the learner as it is)."""


@dataclass
class Repro:
    script: Path
    check: str
    asserted: bool   # False where nothing the calls return tells the failure (a structure check)


def folder_of(meta: Path, kata: Kata) -> Path:
    """Where `kata check` keeps the kata's tapes, under the workspace's ``.kata``."""
    return meta / "repro" / kata.slug


def write(kata: Kata, tapes: Path, out: Path, check: str | None = None, zygote=None) -> Repro:
    """Write the script of ``check`` (the first failed public check when None) into ``out``; the
    reference's sandbox is forked from ``zygote`` where one is given."""
    info = index(tapes)
    if info is None:
        raise ReproError(f"No run of {kata.slug} to reproduce: run `kata check {kata.slug}` first (on a .py "
                         "file: a notebook's run keeps no calls).")
    hidden = set(check_names(kata.files["hidden"])) if kata.files["hidden"].is_file() else set()
    if check in hidden:
        raise ReproError(f"`{check}` is a hidden check: hidden checks are never reproduced. Its name and "
                         "message in `kata check` are what it tells.")
    if check is not None and check not in kata.checks:
        raise ReproError(f"{kata.slug} has no check `{check}`; its public checks: "
                         + ", ".join(c for c in kata.checks if c not in hidden))
    failed = info["checks"]
    if not failed:
        raise ReproError(f"Your last run of {kata.slug} failed no public check: nothing to reproduce.")
    if check is not None and check not in failed:
        raise ReproError(f"`{check}` did not fail in your last run of {kata.slug}; it failed: "
                         + ", ".join(f"`{c}`" for c in failed))
    check = check or failed[0]
    tape = load(tapes, check)
    steps = tape.steps
    if len(steps) == tape.start:
        raise ReproError(f"`{check}` failed before it called your code (see its message in `kata check`).")
    expected = _expected(kata, steps, info["seed"], zygote)
    at = _failing(kata, tape, expected)
    script = out / f"{kata.slug}.{check}.py"
    out.mkdir(parents=True, exist_ok=True)
    text, arrays, asserted = Writer(kata, steps, expected, at, info, check, tape.given).script(script)
    np.savez(script.with_suffix(".npz"), **arrays)
    script.write_text(text, encoding="utf-8")
    return Repro(script, check, asserted)


# --- what the reference answers --------------------------------------------------------------------

def _expected(kata: Kata, steps: list[Step], seed: int, zygote) -> list[Outcome] | None:
    """What the reference answers to each step (in the sandbox), or None without a reference."""
    from ..engine.learner import Learner
    from ..engine.runner import sandbox_for

    reference = kata.files["reference"]
    if not reference.is_file():
        return None
    world = len({s.rank for s in steps} - {None})
    with sandbox_for(kata, reference, device="cpu", zygote=zygote) as sandbox:
        learner = Learner(sandbox, device="cpu", seed=seed)   # the calls made outside a rank group
        answers = {None: learner.replay([s for s in steps if s.rank is None])}
        if world:
            answers |= enumerate(learner.ranks(world).each(
                lambda rank, each: each.replay([s for s in steps if s.rank == rank])))
    taken = {rank: iter(outcomes) for rank, outcomes in answers.items()}
    return [next(taken[s.rank]) for s in steps]


def _failing(kata: Kata, tape: Tape, expected: list[Outcome] | None) -> int | None:
    """The first step of the check whose answer differs from the reference's (or that raised where
    the reference did not); None when every answer agrees, or there is no reference to ask."""
    if expected is None:
        return None
    for i, (step, want) in list(enumerate(zip(tape.steps, expected)))[tape.start:]:
        if want.lost:
            return None   # the reference cannot make this call: nothing after it can be compared
        if (step.raised is None) != (want.raised is None):
            return i
        if step.raised is None and not isinstance(step.got, Handle) and not _close(kata, step.got, want.value, step):
            return i
    return None


def tolerance(kata: Kata, value, step: Step) -> dict:
    """The kata's tolerance for the first floating-point leaf of ``value``, grown with the inputs'
    magnitude as the checks grow it; exact for integers."""
    floats = lambda v: [leaf for leaf in leaves(v) if "float" in (_dtype(leaf) or "")]
    if not floats(value):
        return {"rtol": 0.0, "atol": 0.0}
    magnitude = expect.magnitude(*floats([step.args, step.kwargs, value]))
    try:
        return kata.tolerance(_dtype(floats(value)[0]), magnitude)
    except KeyError:   # a dtype the kata states no tolerance for: the widest it states
        tols = [kata.tolerance(d, magnitude) for d in kata.tolerances]
        return max(tols, key=lambda t: t["rtol"]) if tols else {"rtol": 1e-3, "atol": 1e-5}


def _close(kata: Kata, got, want, step: Step) -> bool:
    """What the script's ``same`` asserts: arrays and tensors of the same type and dtype, and the
    same structure of values agreeing within the kata's tolerance (``expect.same``)."""
    for g, w in zip(leaves(got), leaves(want)):
        if _dtype(w) is not None and hasattr(w, "shape") and (type(g) is not type(w) or _dtype(g) != _dtype(w)):
            return False
    return expect.same(got, want, **tolerance(kata, want, step))


def _dtype(value) -> str | None:
    if isinstance(value, (np.ndarray, np.generic)):
        return str(value.dtype)
    if type(value).__module__ == "torch" and type(value).__name__ in ("Tensor", "Parameter"):
        return str(value.dtype).removeprefix("torch.")
    if type(value) is float:
        return "float64"
    return None


def _uses_torch(value) -> bool:
    return any(type(v).__module__ == "torch" for v in leaves(value))


# --- the script ------------------------------------------------------------------------------------

SAME = '''
def same(got, expected, where="the result"):
    """What the check compares: the type, the shape and dtype, then the values within tolerance."""
    number = (int, float, np.generic)
    if isinstance(expected, number) and not isinstance(expected, bool):
        assert isinstance(got, number), f"{where}: expected a number, got {type(got).__name__}"
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL, err_msg=where)
        return
    assert type(got) is type(expected), f"{where}: expected a {type(expected).__name__}, got {type(got).__name__}"
    if isinstance(expected, (tuple, list)):
        assert len(got) == len(expected), f"{where}: expected {len(expected)} values, got {len(got)}"
        for i, (g, e) in enumerate(zip(got, expected)):
            same(g, e, f"{where}[{i}]")
    elif isinstance(expected, dict):
        assert got.keys() == expected.keys(), f"{where}: expected the keys {list(expected)}, got {list(got)}"
        for key in expected:
            same(got[key], expected[key], f"{where}[{key!r}]")
'''
SAME_TORCH = '''    elif isinstance(expected, torch.Tensor):
        torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL, msg=lambda m: f"{where}: {m}")
'''
SAME_NUMPY = '''    elif isinstance(expected, np.ndarray):
        assert got.shape == expected.shape and got.dtype == expected.dtype, \\
            f"{where}: expected {expected.dtype} {expected.shape}, got {got.dtype} {got.shape}"
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL, err_msg=where)
    else:
        assert got == expected, f"{where}: expected {expected!r}, got {got!r}"
'''


def comment(text: str) -> str:
    """Text as one comment line: what a check says may hold the learner's own strings, never code."""
    return re.sub(r"[^\x20-\x7e]", "?", " ".join(str(text).split()))[:300]


class Writer:
    def __init__(self, kata: Kata, steps: list[Step], expected, at: int | None, info: dict, check: str,
                 given: str | None):
        self.kata, self.steps, self.expected, self.at, self.info, self.check = kata, steps, expected, at, info, check
        self.given = given
        self.arrays: dict[str, np.ndarray] = {}
        self.names: dict[int, str] = {}   # a sandbox object's handle -> its variable
        self.taken: set[str] = set()
        self.params, self.inits = _parameters(kata.stub_path)
        self.torch = kata.framework in TORCH_FRAMEWORKS or any(_uses_torch([s.args, s.kwargs, s.got]) for s in steps)

    def script(self, path: Path) -> tuple[str, dict, bool]:
        kata, info = self.kata, self.info
        last = self.at if self.at is not None else len(self.steps) - 1
        failing = self.steps[last]
        chosen = _needed(self.steps, last)
        ranks = sorted({self.steps[i].rank for i in chosen if self.steps[i].rank is not None})
        want = self.expected[last] if self.expected is not None else None
        asserted = self.at is not None and want is not None
        name = info["names"].get(self.check, self.check)
        head = [f'"""`kata repro {kata.slug} {self.check}`: {comment(name)}; seed {info["seed"]}.', "",
                f"Your last `kata check {kata.slug}` failed this public check. This script makes its failing call",
                "again, with the same inputs, on your file as it is now: not in the kit's sandbox, so an",
                "exception shows your own traceback. Print in it, or in your file; fix; run it again",
                f"(`python {path.name}`), then `kata check {kata.slug}`.", '"""']
        if not asserted:
            why = ("no reference is installed (a student bundle) to say what it should return"
                   if self.expected is None else
                   "every call returned what the reference returns: the check judged something else of it "
                   "(see its message in `kata check`)")
            head[-1:] = ["", f"It asserts nothing: {why}.", '"""']
        triton = kata.framework == "triton"
        lines = [*head, *(["import os"] if triton else []), "import random", "import sys", "from pathlib import Path", "",
                 "import numpy as np"]
        if triton:   # as the kit runs it: on Triton's interpreter, set before Triton loads
            lines.append('os.environ.setdefault("TRITON_INTERPRET", "1")   # the kernels run on the CPU, as in `kata check`')
        if self.torch:
            lines.append("import torch")
        if ranks:
            lines += ["import torch.distributed as dist", "import torch.multiprocessing as mp"]
        functions = sorted({self.steps[i].path[0] for i in chosen if self.steps[i].handle is None})
        lines += ["", f"sys.path.insert(0, {str(Path(info['file']).parent)!r})   # the folder of your file"]
        if self.given:
            lines += [f"import {kata.module}", f"GIVEN = {self.given!r}",
                      f"exec(compile(GIVEN, 'the code the kit gives', 'exec'), vars({kata.module}))   "
                      "# what your file lacks, added as the kit adds it"]
        if functions:
            lines.append(f"from {kata.module} import {', '.join(functions)}   # your file, {Path(info['file']).name}")
        lines += ["",
                  'DATA = np.load(Path(__file__).with_suffix(".npz"))',
                  f"SEED = {drawn_seed(int(info['seed']))}   # the kit seeds random, NumPy"
                  f"{' and torch' if self.torch else ''} with it before each call (seed {info['seed']}, hashed), "
                  "as reseed() does here"]
        if asserted:
            tol = tolerance(kata, want.value, failing) if want.raised is None else {"rtol": 0.0, "atol": 0.0}
            why = "the check's tolerance for this dtype" if tol["rtol"] or tol["atol"] else "exact: integers"
            lines.append(f"RTOL, ATOL = {tol['rtol']!r}, {tol['atol']!r}   # {why}")
        lines += ["", "", "def reseed():", "    random.seed(SEED)", "    np.random.seed(SEED)"]
        lines += ["    torch.manual_seed(SEED)"] if self.torch else []
        if asserted and want.raised is None:
            lines += ["", SAME.rstrip("\n")] + ([SAME_TORCH.rstrip("\n")] if self.torch else [])
            lines.append(SAME_NUMPY.rstrip("\n"))
        body = []
        if ranks:
            for rank in ranks:
                body.append(f"if rank == {rank}:")
                body += ["    " + line for line in self._calls([i for i in chosen if self.steps[i].rank == rank],
                                                               last if failing.rank == rank else None, asserted)]
            lines += ["", "", "def run(rank, world_size, port):",
                      '    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, '
                      "world_size=world_size)", "    try:"]
            lines += ["        " + line for line in body]
            lines += ["    finally:", "        dist.destroy_process_group()", "", "",
                      'if __name__ == "__main__":', "    import socket", "",
                      "    with socket.socket() as s:   # a free port for the group's rendezvous",
                      '        s.bind(("127.0.0.1", 0))', "        port = s.getsockname()[1]",
                      f"    mp.spawn(run, args=({len(ranks)}, port), nprocs={len(ranks)})   # each rank a process",
                      "    print(\"Every rank ran: the calls return what the check expects.\")" if asserted else ""]
        else:
            lines += ["", ""] + self._calls(chosen, last, asserted)
            if asserted:
                lines.append('print("This call now returns what the check expects: run `kata check '
                             f'{kata.slug}` again.")')
        return "\n".join(lines).rstrip("\n") + "\n", self.arrays, asserted

    def _calls(self, chosen: list[int], last: int | None, asserted: bool) -> list[str]:
        lines = []
        for i in chosen:
            step = self.steps[i]
            args, kwargs, setup = self._arguments(step)
            lines += setup
            target = step.path[0] if step.handle is None else self.names.get(step.handle, "obj")
            rest = [p for p in step.path[1 if step.handle is None else 0:] if p != "__call__"]
            call = ".".join([target, *rest])
            if not step.get:
                call += "(" + ", ".join(args + [f"{k}={v}" for k, v in kwargs.items()]) + ")"
            if not step.get and (step.handle is None or step.path == ["__call__"]):   # where code may draw at random
                lines.append("reseed()")
            if i != last:
                if isinstance(step.got, Handle):
                    made = step.path[-1].strip("_") if step.get else step.got.type_name.rsplit(".", 1)[-1]
                    var = self._name(_snake(made))
                    self.names[step.got.id] = var
                    call = f"{var} = {call}"
                lines += [call] if step.raised is None else [
                    "try:", f"    {call}", "except Exception as exc:   # it raised in the check too, as it should",
                    '    print(f"{type(exc).__name__}: {exc}")']
                continue
            want = self.expected[i] if self.expected is not None else None
            if asserted and want.raised is not None:
                lines += ["try:", f"    {call}", "except Exception as exc:",
                          "    print(f\"It raises {type(exc).__name__}, as the check expects: {exc}\")", "else:",
                          f"    raise AssertionError({comment('the check expects it to raise: ' + want.raised)!r})"]
                continue
            lines += [f"got = {call}   # the call the check failed on", "print('got:', got)"]
            if asserted:
                lines += [f"expected = {self._literal(want.value, 'expected')}", "same(got, expected)"]
        return lines

    def _arguments(self, step: Step) -> tuple[list[str], dict, list[str]]:
        names = self.params.get(step.path[-1] if step.path[-1] != "__call__" else "forward", [])
        if step.handle is None and step.path[0] in self.inits:
            names = self.inits[step.path[0]]
        setup, args = [], []
        for j, value in enumerate(step.args):
            hint = names[j] if j < len(names) else f"arg{j}"
            args.append(self._argument(value, hint, setup))
        kwargs = {k: self._argument(v, k, setup) for k, v in step.kwargs.items()}
        return args, kwargs, setup

    def _argument(self, value, hint: str, setup: list[str]) -> str:
        literal = self._literal(value, hint)
        if "DATA[" not in literal:
            return literal
        var = self._name(hint)
        setup.append(f"{var} = {literal}   {self._shape(value)}")
        return var

    def _shape(self, value) -> str:
        arrays = [v for v in leaves(value) if _dtype(v) is not None and hasattr(v, "shape")]
        return "# " + ", ".join(f"{_dtype(v)} {tuple(v.shape)}" for v in arrays[:4]) if arrays else ""

    def _literal(self, value, hint: str) -> str:
        if isinstance(value, Handle):
            return self.names.get(value.id, "None  # an object made by a call this script does not make")
        if isinstance(value, Unknown):
            return f"None  # a {comment(value.type_name)} the kit could not keep"
        if isinstance(value, tuple):
            inner = ", ".join(self._literal(v, f"{hint}_{i}") for i, v in enumerate(value))
            return f"({inner}{',' if len(value) == 1 else ''})"
        if isinstance(value, list):
            return "[" + ", ".join(self._literal(v, f"{hint}_{i}") for i, v in enumerate(value)) + "]"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k!r}: {self._literal(v, str(k))}" for k, v in value.items()) + "}"
        if isinstance(value, np.generic):
            return f"np.{value.dtype}({value.item()!r})"
        if isinstance(value, np.ndarray):
            return f'DATA["{self._array(hint, value)}"]'
        if type(value).__module__ == "torch" and type(value).__name__ in ("Tensor", "Parameter"):
            return self._tensor(value, hint)
        if type(value).__module__ == "torch":   # a dtype or a device
            return f"torch.{str(value).removeprefix('torch.')}" if type(value).__name__ == "dtype" \
                else f"torch.device({str(value)!r})"
        return repr(value)

    def _tensor(self, t, hint: str) -> str:
        import torch

        dtype = str(t.dtype).removeprefix("torch.")
        if t.device.type == "meta":
            return f"torch.empty({list(t.shape)}, dtype=torch.{dtype}, device='meta')"
        base, form = spread(t)
        narrow = base.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)   # not in NumPy
        data = (base.float() if narrow else base).numpy()   # float32 holds each of their values exactly
        code = f'torch.from_numpy(DATA["{self._array(hint, data)}"])'
        if narrow:
            code += f".to(torch.{dtype})"
        if form.get("strides"):
            code += f".as_strided({tuple(t.shape)}, {tuple(form['strides'])})   # a slice with the check's strides"
        elif form["permute"] != list(range(t.dim())):
            code += f".permute{tuple(form['permute'])}   # a view with the check's strides"
        if t.requires_grad:
            code += ".requires_grad_()"
        return code

    def _array(self, hint: str, array: np.ndarray) -> str:
        key = self._name(re.sub(r"\W", "_", hint) or "a", used=self.arrays)
        self.arrays[key] = array
        return key

    def _name(self, hint: str, used=None) -> str:
        used = self.taken if used is None else used
        if keyword.iskeyword(hint) or hint in vars(builtins) or hint in ("np", "torch", "dist", "mp", "DATA", "SEED"):
            hint += "_"
        name, n = hint, 2
        while name in used:
            name, n = f"{hint}_{n}", n + 1
        if used is self.taken:
            self.taken.add(name)
        return name


def _needed(steps: list[Step], last: int) -> list[int]:
    """The steps the ``last`` one needs (tape.needed); in a rank group, every rank makes the calls
    the failing rank makes, at the same places in its own sequence."""
    chosen = set(needed(steps, [last]))
    if steps[last].rank is not None:
        mine = [i for i, s in enumerate(steps) if s.rank == steps[last].rank]
        places = {mine.index(i) for i in chosen if i in mine}
        for rank in {s.rank for s in steps} - {steps[last].rank, None}:
            theirs = [i for i, s in enumerate(steps) if s.rank == rank]
            chosen |= {theirs[p] for p in places if p < len(theirs)}
    return sorted(chosen)


def _parameters(stub: Path) -> tuple[dict, dict]:
    """{function or method name: its parameter names, self left out}, and {class: its __init__'s}:
    the names a script gives the arguments it passes."""
    found, classes = {}, {}
    for node in ast.parse(stub.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = [a.arg for a in node.args.args]
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    names = [a.arg for a in item.args.args][1:]
                    if item.name == "__init__":
                        classes[node.name] = names
                    else:
                        found.setdefault(item.name, names)
    return found, classes


def _snake(name: str) -> str:
    """A variable's name from a class's (which the learner's code chose: only letters, digits and _
    are kept), ``PagedKVCache`` -> ``paged_kv_cache``."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", re.sub(r"\W", "", name)).lower()
    return snake if re.match(r"[a-z_]", snake) else f"obj{snake}"
