"""`kata run`: the README's worked example run with the learner's own code, in seconds.

Each kata's README has a "Try it" section: one ```python block that imports the kata's functions
from the learner's module and prints a few values, then a ```text block with what the reference
prints. ``run`` runs that block as a script with the kit's Python, the learner's file importable
under the module name the block imports, and ``differences`` compares the printout with the
README's. A kata graded on several ranks has a block that starts them itself (a two-rank
``torch.multiprocessing.spawn`` harness over gloo): ``run`` gives it a free port in
``MASTER_PORT``.

This is the learner's code run on their request, as `python` would run it: outside the kit's
sandbox, and judged by nobody. Grading is `kata check`.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from ..engine.manifest import Kata

HEADING = "## Try it"
TIMEOUT_S = 60            # a worked example takes seconds; a minute is a loop that never ends
RANKS_TIMEOUT_S = 120     # ... unless it starts processes, each of which imports torch
FENCE = re.compile(r"^```(\w*)\s*$")
# A number as Python, NumPy and torch print one; the last digit printed is the one that may differ.
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
NOT_WRITTEN = re.compile(r"^NotImplementedError(?:: (.*))?$")


class NoExample(ValueError):
    """A README without one Try-it example and its printout; the message says what is wrong."""


def example(kata: Kata) -> tuple[str, str]:
    """The README's Try-it example: (its python source, the text the reference prints)."""
    return parse(kata.readme_path.read_text(encoding="utf-8"))


def parse(readme: str) -> tuple[str, str]:
    """The Try-it section's ```python block and the ```text block after it (see ``example``)."""
    lines = readme.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == HEADING]
    if len(starts) != 1:
        raise NoExample(f"the README has {'no' if not starts else len(starts)} `{HEADING}` section"
                        f"{'' if not starts else 's'}: it wants one")
    section = itertools.takewhile(lambda line: not line.startswith("## "), lines[starts[0] + 1:])
    blocks, inside = [], None
    for line in section:
        fence = FENCE.match(line)
        if inside is None and fence:
            inside = (fence.group(1), [])
        elif inside is not None and line.strip() == "```":
            blocks.append(inside)
            inside = None
        elif inside is not None:
            inside[1].append(line)
    if [kind for kind, _ in blocks] != ["python", "text"] or inside is not None:
        has = ", ".join(kind or "plain" for kind, _ in blocks) or "none"
        raise NoExample(f"its `{HEADING}` section wants exactly one ```python block, then the ```text block that "
                        f"the block prints with the reference; it has {has}")
    return tuple("\n".join(body) + "\n" for _, body in blocks)


def starts_ranks(source: str) -> bool:
    """Whether the example starts a group of ranks itself (a rank kata's harness)."""
    return "init_process_group" in source


def timeout_for(source: str) -> int:
    """Seconds the example may take."""
    return RANKS_TIMEOUT_S if starts_ranks(source) else TIMEOUT_S


@dataclass
class Outcome:
    returncode: int
    printed: str          # what the example printed (stdout)
    errors: str           # its stderr: warnings, or the traceback it ended with
    timed_out: bool = False

    @property
    def not_written(self) -> str | None:
        """The message of the NotImplementedError the run ended with (a stub's), or None."""
        last = self.errors.rstrip().rpartition("\n")[2]
        found = self.returncode != 0 and NOT_WRITTEN.match(last)
        return (found.group(1) or "") if found else None


def run(kata: Kata, file: Path, *, timeout: float | None = None, echo=lambda line: None) -> Outcome:
    """Run the kata's example with the code of ``file`` (a learner's .py file) importable as the
    module the example imports, stopped after ``timeout`` seconds (``timeout_for`` by default);
    ``echo`` gets each line it prints as it prints it."""
    source, _ = example(kata)
    timeout = timeout or timeout_for(source)
    module = Path(kata.learner_file).stem
    with tempfile.TemporaryDirectory(prefix="kata-run-") as tmp:
        script = Path(tmp) / "try_it.py"
        script.write_text(source, encoding="utf-8")
        where = file.resolve().parent
        if file.name != f"{module}.py":   # a file of another name is imported under the module's
            where = Path(tmp) / "module"
            where.mkdir()
            (where / f"{module}.py").write_text(file.read_text(encoding="utf-8"), encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(where), os.environ.get("PYTHONPATH")])),
               "PYTHONUNBUFFERED": "1", "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1",
               "MASTER_PORT": str(free_port())}
        if kata.framework == "triton":   # the kernels run on Triton's interpreter, as `kata check` runs them
            env.setdefault("TRITON_INTERPRET", "1")
        # Its own session, so that a timeout stops the ranks it spawned as well.
        proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, encoding="utf-8", errors="replace", start_new_session=True)
        errors, expired = [], threading.Event()
        reader = threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True)
        reader.start()

        def stop():
            expired.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, stop)
        timer.daemon = True
        timer.start()
        printed = []
        try:
            for line in proc.stdout:
                printed.append(line)
                echo(line)
            proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:   # interrupted (Ctrl-C): nothing of it outlives `kata run`
                stop()
                proc.wait()
            reader.join()
        return Outcome(proc.returncode, "".join(printed), "".join(errors), timed_out=expired.is_set())


def free_port() -> int:
    """A TCP port of the loopback no one listens on now, for the ranks' store."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def differences(printed: str, expected: str) -> list[tuple[int, str, str]]:
    """The lines of ``printed`` that are not ``expected``'s: (line number, yours, the README's),
    empty when they agree. Spacing is not compared, and a number with decimals may differ by one
    in its last printed digit: a correct answer computed in another order rounds either way."""
    ours, theirs = printed.rstrip("\n").splitlines(), expected.rstrip("\n").splitlines()
    return [(n, mine or "", readme or "") for n, (mine, readme) in enumerate(itertools.zip_longest(ours, theirs), 1)
            if mine is None or readme is None or not _same_line(mine, readme)]


def _same_line(mine: str, readme: str) -> bool:
    """The same words around the same numbers (``_same_number``), however they are spaced."""
    words = lambda line: [re.sub(r"\s+", "", text) for text in NUMBER.split(line)]
    return words(mine) == words(readme) and all(
        _same_number(a, b) for a, b in zip(NUMBER.findall(mine), NUMBER.findall(readme)))


def _same_number(mine: str, readme: str) -> bool:
    """Equal, or off by at most one in the README's last decimal (integers are exact)."""
    mantissa, _, exponent = readme.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    if decimals == 0:
        return float(mine) == float(readme)
    unit = 10.0 ** (int(exponent or 0) - decimals)
    return abs(float(mine) - float(readme)) <= unit * (1 + 1e-9)
