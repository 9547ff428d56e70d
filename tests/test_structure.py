"""Structure checks on learners who shape what the grader sees of them: memoised outputs, the
interpreter reached through introspection or dynamic code, module methods that lie."""
import pytest
import torch
import torch.nn as nn

from conftest import checks_by_id
from graders.engine.manifest import find
from graders.engine.structure import banned_in_source, tampering
from graders.engine.worker import _module_info

SOFTMAX = '''
import numpy as np
{imports}


def softmax(x, axis=-1):
    {line}
    z = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)
'''

# The library softmax, as a tensor method (a name the source view cannot resolve), run once per
# input: a repeated call returns the stored output and runs nothing.
MEMOISED_SOFTMAX = '''
import torch

_outputs = {}


def softmax(x, axis=-1):
    key = (x.tobytes(), x.shape, x.dtype.str, axis)
    if key not in _outputs:
        _outputs[key] = torch.from_numpy(x).softmax(axis).numpy()
    return _outputs[key].copy()
'''


def test_memoised_library_softmax_is_banned_api(grade_source):
    result = grade_source("softmax", MEMOISED_SOFTMAX)
    checks = checks_by_id(result)
    assert checks["banned-api"]["diagnosis"] == "banned-api" and checks["banned-api"]["score"] == 0
    assert "torch.softmax" in checks["banned-api"]["message"]
    assert result["score"] == result["max_score"] - find("softmax").checks["banned-api"]


# One construct of each kind: (imports, a line in softmax's body, what the message names).
CONSTRUCTS = {
    "frame": ("import sys", "caller = sys._getframe(1).f_back",
              "import sys (line 3), sys._getframe (line 7), sys._getframe(1).f_back (line 7)"),
    "inspect": ("import inspect", "here = inspect.currentframe()", "import inspect (line 3)"),
    "gc": ("import gc", "gc.isenabled()", "import gc (line 3)"),
    "ctypes": ("import ctypes", "ctypes.sizeof(ctypes.c_double)", "import ctypes (line 3)"),
    "runpy": ("import runpy", "pass", "import runpy (line 3)"),
    "star-import": ("from numpy import *", "z = exp(0.0)", "from numpy import * (line 3)"),
    "exec": ("", 'exec("pass")', "exec (line 7)"),
    "eval": ("", 'eval("1")', "eval (line 7)"),
    "compile": ("", 'compile("1", "<learner>", "eval")', "compile (line 7)"),
    "importlib": ("import importlib", 'importlib.import_module("numpy")', "import importlib (line 3)"),
    "__import__": ("", '__import__("numpy")', "__import__ (line 7)"),
}


@pytest.mark.parametrize("kind", list(CONSTRUCTS))
def test_introspection_and_dynamic_code_are_tampering(kind, grade_source):
    imports, line, named = CONSTRUCTS[kind]
    result = grade_source("softmax", SOFTMAX.format(imports=imports, line=line))
    check = checks_by_id(result)["banned-api"]
    assert (check["status"], check["score"], check["diagnosis"]) == ("failed", 0, "tampering")
    assert f"got: {named}" in check["message"]
    assert result["diagnoses"] == ["tampering"]   # the code computes softmax: nothing else fails


# Causal-mask written with torch's names bare: softmax could be torch.softmax or one's own.
STAR_TORCH = '''
import math
from torch import *


def causal_mask(n_queries, n_keys=None, device=None):
    n_keys = n_queries if n_keys is None else n_keys
    return ones(n_queries, n_keys, dtype=bool, device=device).tril(n_keys - n_queries)


def padding_mask(lengths, max_len):
    return (arange(max_len, device=lengths.device) < lengths[:, None])[:, None, None, :]


def masked_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    weights = nan_to_num(softmax(scores, dim=-1))   # a fully masked row: NaN becomes 0
    return weights @ v, weights
'''


def test_star_import_of_torch_is_tampering(grade_source):
    result = grade_source("causal-mask", STAR_TORCH)
    check = checks_by_id(result)["banned-api"]
    assert (check["score"], check["diagnosis"]) == (0, "tampering")
    assert "got: from torch import * (line 3)" in check["message"]
    assert result["diagnoses"] == ["tampering"]


@pytest.mark.parametrize("source", [
    "from torch.autograd.functional import hvp\nhvp(f, x, v)\n",
    "import torch.autograd.forward_ad as fwAD\nfwAD.dual_level()\n",
    "import torch\ntorch.autograd.functional.jvp(f, x, v)\n",
])
def test_a_banned_module_bans_what_lies_under_it_however_imported(source):
    assert banned_in_source(source, ["torch.autograd", "torch.func"]) == ["torch.autograd"]
    assert banned_in_source("import torch\ntorch.autograd_helpers(x)\n", ["torch.autograd"]) == []


def test_the_scan_keeps_what_it_caught_before():
    source = '''
import builtins
import torch
import torch.nn.functional as F
from sys import modules


def f(x, name):
    with torch._C.DisableTorchFunction():
        return getattr(F, name)(x)
'''
    assert tampering(source, "torch") == ["import builtins (line 2)", "from sys import modules (line 5)",
                                          "torch._C (line 9)", "torch._C.DisableTorchFunction (line 9)",
                                          "getattr with a computed name (line 10)"]


class Lying(nn.Module):
    """A plain tensor attribute reported as a buffer, and a non-persistent buffer reported as saved."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4, bias=False)
        self.mask = torch.ones(4, 4).tril()
        self.register_buffer("scratch", torch.zeros(4), persistent=False)

    def named_buffers(self, *args, **kwargs):
        yield from super().named_buffers(*args, **kwargs)
        yield "mask", self.mask

    def named_parameters(self, *args, **kwargs):
        yield from super().named_parameters(*args, **kwargs)
        yield "proj.bias", torch.zeros(4)

    def state_dict(self, *args, **kwargs):
        return {**super().state_dict(*args, **kwargs), "mask": self.mask, "scratch": self.scratch}


def test_module_facts_come_from_the_modules_own_dicts():
    info = _module_info(Lying())
    assert info["parameters"] == {"proj.weight": [[4, 4], "torch.float32", "cpu"]}
    assert info["buffers"] == {"scratch": [[4], "torch.float32", "cpu"]}
    assert info["state_dict"] == ["proj.weight"]
    assert info["training"] is True and info["type"].endswith("Lying")


def test_module_facts_match_torch_for_honest_modules():
    """nested, shared and tied modules, None and non-persistent buffers: what nn.Module's own
    methods report."""
    shared = nn.Linear(3, 3)
    model = nn.Sequential(shared, nn.BatchNorm1d(3), shared, nn.TransformerEncoderLayer(8, 2)).eval()
    model.register_buffer("nothing", None)
    model.register_buffer("step", torch.zeros(()), persistent=False)
    info = _module_info(model)
    assert info["parameters"] == {n: [list(p.shape), str(p.dtype), str(p.device)] for n, p in model.named_parameters()}
    assert info["buffers"] == {n: [list(b.shape), str(b.dtype), str(b.device)] for n, b in model.named_buffers()}
    assert info["state_dict"] == list(model.state_dict())
    assert info["training"] is False
