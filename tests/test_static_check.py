"""The static check that structure checks stand on (structure.tampering): each way learners hid
work from the recorder or reached the worker's objects, as a small learner file refused with its
line; and two attacks graded end to end, which earn no more than the same computation without
the trick. (That every reference, stub and style-zoo file of a kata with structure checks is let
through is a content rule, `scan`: test_content.py.)"""
from pathlib import Path

import pytest

from conftest import checks_by_id
from graders.engine.structure import TAMPERING, tampering

ZOO = Path(__file__).with_name("zoo")
ATTACKS = Path(__file__).with_name("attacks")


def scan(source: str) -> list[str]:
    return tampering(source, "torch")


# One learner file per way around the old deny-list (issue 24), and per way found beside them:
# {attack: (source, what the check names)}.
ATTACKS_BY_CLASS = {
    "import __main__": ('''
import torch
import __main__


def mha_by_loop(mha, x):
    __main__.recording = None
''', ["import __main__ (line 3)", "__main__ (line 7)", "__main__.recording (line 7)"]),
    "sys.__dict__": ('''
import torch


def mha_by_loop(mha, x):
    modules = torch.sys.__dict__["modules"]
''', ["torch.sys (line 6)", "torch.sys.__dict__ (line 6)"]),
    "traceback.walk_tb frames": ('''
import traceback


def mha_by_loop(mha, x):
    try:
        raise RuntimeError
    except RuntimeError as error:
        for frame, _ in traceback.walk_tb(error.__traceback__):
            frame.f_globals.clear()
''', ["import traceback (line 2)", "error.__traceback__ (line 9)", "frame.f_globals (line 10)"]),
    "getattr under another name": ('''
import torch.nn.functional as F

fetch = getattr


def attend(scores):
    return fetch(F, "soft" + "max")(scores, dim=-1)
''', ["getattr as a value (line 4)", "F as a value (line 8)"]),
    "a helper module written at run time": ('''
import torch

with open("/tmp/helper.py", "w") as f:
    f.write("def heads(x): ...")
import helper
''', ["open (line 4)", "import helper (line 6)"]),
    "threading.Thread": ('''
import torch
from threading import Thread


def mha_by_loop(mha, x):
    worker = Thread(target=mha, args=(x,))
''', ["from threading import Thread (line 3)"]),
    "torch.library.custom_op": ('''
import torch


@torch.library.custom_op("kata::heads", mutates_args=())
def heads(x: torch.Tensor) -> torch.Tensor:
    return x @ x.mT
''', ["torch.library (line 5)"]),
    "os.fork": ('''
import os


def mha_by_loop(mha, x):
    if os.fork() == 0:
        os._exit(0)
''', ["import os (line 2)", "os._exit (line 7)"]),
    "multiprocessing": ('''
import multiprocessing as mp
''', ["import multiprocessing (line 2)"]),
    "torch.multiprocessing": ('''
import torch


def mha_by_loop(mha, x):
    torch.multiprocessing.Process(target=mha, args=(x,)).start()
''', ["torch.multiprocessing (line 6)"]),
    "torch.jit.fork": ('''
import torch


def mha_by_loop(mha, x):
    return torch.jit.wait(torch.jit.fork(mha, x))
''', ["torch.jit (line 6)"]),
    "NumPy": ('''
import numpy as np
import torch


def attend(q, k):
    return torch.from_numpy(q.numpy() @ k.numpy().T)
''', ["import numpy (line 2)", "k.numpy (line 7)", "q.numpy (line 7)"]),
    # Found beside them: each runs torch calls the recorder does not see, or reaches what it should not.
    "os reached through torch": ('''
import torch


def mha_by_loop(mha, x):
    torch.os.fork()
''', ["torch.os (line 6)"]),
    "torch reached through another module": ('''
import torch.nn.functional as F


def off():
    return F.torch._C.DisableTorchFunction()
''', ["torch.nn.functional.torch (line 6)", "torch.nn.functional.torch._C (line 6)",
      "torch.nn.functional.torch._C.DisableTorchFunction (line 6)"]),
    "a module bound to another name": ('''
import torch

t = torch
''', ["torch as a value (line 4)"]),
    "a private name of a library": ('''
from dataclasses import _create_fn
''', ["from dataclasses import _create_fn (line 2)"]),
    "the subclasses of object": ('''
def everything():
    return ().__class__.__base__.__subclasses__()
''', ["().__class__ other than for its name (line 3)", "().__class__.__base__ (line 3)",
      "().__class__.__base__.__subclasses__ (line 3)"]),
    "a match on attributes": ('''
def reach(f):
    match f:
        case object(__globals__=found):
            return found
''', ["case object(__globals__=...) (line 4)"]),
    "torch.cond": ('''
import torch


def attend(q, k):
    return torch.cond(q.sum() > 0, lambda q, k: q @ k.mT, lambda q, k: q @ k.mT, (q, k))
''', ["torch.cond (line 6)"]),
    "Tensor.apply_": ('''
import torch


def attend(q, k, out):
    torch.zeros(1).apply_(lambda v: out.append(q @ k.mT) or v)
''', ["torch.zeros(1).apply_ (line 6)"]),
    "a backward hook": ('''
import torch


def attend(q, k, out):
    q.register_hook(lambda g: out.append(g @ k))
    q.sum().backward()
''', ["q.register_hook (line 6)", "q.sum().backward (line 7)"]),
    "annotations evaluated": ('''
import typing


def f(x: "exec('...')"):
    return typing.get_type_hints(f)
''', ["the annotation \"exec('...')\" (line 5)", "typing.get_type_hints (line 6)"]),
    "the worker's own measures patched": ('''
import torch


def mha_by_loop(mha, x):
    torch.nn.modules.module.register_module_forward_pre_hook = lambda hook: None
    type(x).shape = property(lambda t: (1,))
''', ["torch.nn.modules.module.register_module_forward_pre_hook (line 6)",
      "type(x) other than for its name (line 7)", "type(x).shape (line 7)"]),
    "a torch function mode": ('''
import torch


class Quiet(torch.Tensor):
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return func(*args, **kwargs)
''', ["class Quiet(torch.Tensor) (line 5)", "def __torch_dispatch__ (line 6)"]),
}


@pytest.mark.parametrize("attack", list(ATTACKS_BY_CLASS))
def test_each_way_around_the_recorder_is_refused_with_its_line(attack):
    source, named = ATTACKS_BY_CLASS[attack]
    assert scan(source) == named


def test_what_a_kata_solution_writes_is_let_through():
    """The idioms the deny-lists come near: a base class's __init__ and a class's name, private
    names of one's own, getattr with a constant name, methods named like builtins, the main guard."""
    source = '''
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    n_head: int = 2


class Attention(nn.Module):
    def __init__(self, d: int, cfg: Config):
        super().__init__()
        self._scale = 1 / math.sqrt(d // cfg.n_head)
        self._cache = deque(maxlen=4)
        self.kv = Config()
        self.kv.n_head += 1

    def forward(self, input):
        if not hasattr(self, "_cache"):
            raise RuntimeError(f"{self.__class__.__name__} lost its cache")
        return getattr(F, "softmax")(input @ input.mT * self._scale, dim=-1)


def frozen(model):
    return model.eval()


if __name__ == "__main__":
    print(Attention(4, Config())(torch.ones(1, 2, 4)))
'''
    assert scan(source) == []


def test_a_numpy_kata_takes_numpy_and_not_torch():
    source = "import numpy as np\nimport torch\n\n\ndef softmax(x, axis=-1):\n    return np.exp(x)\n"
    assert tampering(source, "numpy") == ["import torch (line 2)"]
    assert scan(source) == ["import numpy (line 1)"]


# --- the real graders ----------------------------------------------------------------------------

# The checks that judge what the recorder saw: the ones a trick in the source must lose.
STRUCTURE_CHECKS = {"mha-by-loop": ("per-head-loop", "given-class-unchanged"),
                    "flash-tiling": ("causal-skips-blocks-above-the-diagonal", "never-builds-the-full-scores",
                                     "banned-api")}


def graded(grade_source, path):
    """A learner file of tests/attacks/<kata>/ or tests/zoo/<kata>/, graded for its kata."""
    return grade_source(path.parent.name, path.read_text(encoding="utf-8"))


def lost_to_the_static_check(result, slug, named):
    checks = checks_by_id(result)
    return all(checks[c]["score"] == 0 and checks[c]["diagnosis"] == TAMPERING
               and f"{named} (line" in checks[c]["message"] for c in STRUCTURE_CHECKS[slug])


def lost_to_a_thread(result, slug):
    """Every structure check lost: to the static check, or to a sandbox that stops a worker as it
    starts a thread (then the call fails before any judgement)."""
    checks = checks_by_id(result)
    return lost_to_the_static_check(result, slug, "threading") or all(
        checks[c]["score"] == 0 and checks[c]["status"] == "error" for c in STRUCTURE_CHECKS[slug])


def test_all_heads_in_a_thread_or_a_callback_earn_nothing(grade_source):
    """mha-by-loop: the vectorised computation done where the recorder does not look, the loop only
    faked, scores no more than the same computation done in plain sight: the style zoo's all-heads
    file, which loses per-head-loop."""
    control = graded(grade_source, ZOO / "mha-by-loop" / "function_only__not-a-loop.py")
    threaded = graded(grade_source, ATTACKS / "mha-by-loop" / "threaded.py")
    in_apply = graded(grade_source, ATTACKS / "mha-by-loop" / "in_apply.py")
    assert checks_by_id(control)["per-head-loop"]["diagnosis"] == "not-a-loop"
    assert lost_to_a_thread(threaded, "mha-by-loop")
    assert lost_to_the_static_check(in_apply, "mha-by-loop", "torch.zeros(1).apply_")
    assert threaded["score"] <= control["score"] and in_apply["score"] <= control["score"] < control["max_score"]


def test_the_full_scores_in_a_thread_earn_nothing(grade_source):
    """flash-tiling: the whole score matrix built in a thread, the tiles only faked, scores no more
    than the same computation in plain sight (which loses the two checks on tiles)."""
    control = graded(grade_source, ATTACKS / "flash-tiling" / "control.py")
    threaded = graded(grade_source, ATTACKS / "flash-tiling" / "threaded.py")
    assert lost_to_a_thread(threaded, "flash-tiling")
    assert threaded["score"] <= control["score"] < control["max_score"]
