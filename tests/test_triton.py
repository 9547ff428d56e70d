"""The engine's Triton framework, below any kata: the static check of a Triton kata's file (each
way a kernel or a launcher could compute outside Triton's language, or reach the interpreter, as a
small file refused with its line), the hooks on Triton's interpreter (what a launch records, and a
lane outside every tensor read as ``other`` on any machine), and the codec that carries a strided
slice into the sandbox; and a launcher that computes, graded as triton-softmax under bubblewrap and
in a grading container's containment. The katas' own tests grade their files end to end."""
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import needs_bwrap
from graders.engine.manifest import ROOT, find
from graders.engine.runner import grade
from graders.engine.sandbox import Zygote
from graders.engine.structure import tampering

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")

KERNEL = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _double(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, 2 * tl.load(x_ptr + offs, mask=mask), mask=mask)

'''
LAUNCHER = '''
def double(x):
    out = torch.empty_like(x)
    _double[(triton.cdiv(x.numel(), 16),)](x, out, x.numel(), BLOCK=16)
    return out
'''


def scan(source: str) -> list[str]:
    return tampering(source, "triton")


def test_a_kernel_and_a_launcher_that_only_allocates_pass():
    assert scan(KERNEL + LAUNCHER) == []
    assert scan(KERNEL + LAUNCHER.replace("torch.empty_like(x)", "x.new_empty(x.shape).contiguous()")) == []


# {class of attack: (what the file does, what the check names)}: one small file per way to compute
# outside the kernels or to reach what records them.
ATTACKS = {
    "a torch function in the launcher": (
        LAUNCHER.replace("out = torch.empty_like(x)", "out = torch.softmax(x, -1)"), [("torch.softmax", 3)]),
    "torch.nn.functional in the launcher": (
        "import torch.nn.functional as F\n" + LAUNCHER.replace("out = torch.empty_like(x)", "out = F.relu(x)"),
        [("import torch.nn.functional", 1), ("torch.nn.functional.relu", 4)]),
    "a tensor method in the launcher": (
        LAUNCHER.replace("out = torch.empty_like(x)", "out = x.exp()"),
        [("x.exp in a launcher, which may only allocate, read shapes and launch", 3)]),
    "a tensor's values read into Python": (
        LAUNCHER.replace("out = torch.empty_like(x)", "out = torch.empty_like(x)\n    v = x.tolist()"),
        [("x.tolist in a launcher, which may only allocate, read shapes and launch", 4)]),
    "torch inside a kernel": (
        "\n@triton.jit\ndef _k(x_ptr):\n    y = torch.zeros(4)\n", [("torch.zeros inside a kernel", 4)]),
    "the interpreter's NumPy arrays inside a kernel": (
        "\n@triton.jit\ndef _k(x_ptr):\n    a = tl.load(x_ptr).handle.data\n",
        [("tl.load(x_ptr).handle", 4), ("tl.load(x_ptr).handle.data", 4)]),
    "a name the interpreter copies into the file's namespace": (
        LAUNCHER.replace("out = torch.empty_like(x)", "out = torch.empty_like(x)\n    b = interpreter_builder"),
        [("interpreter_builder, a name the file does not define", 4)]),
    "Triton's runtime": (
        LAUNCHER.replace("out = torch.empty_like(x)", "out = torch.empty_like(x)\n    triton.runtime.driver"),
        [("triton.runtime", 4), ("triton.runtime.driver", 4)]),
    "the jitted function's Python body": (
        LAUNCHER.replace("out = torch.empty_like(x)", "out = torch.empty_like(x)\n    f = _double.fn"),
        [("_double.fn", 4)]),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_each_way_around_the_kernels_is_refused_with_its_line(attack):
    body, expected = ATTACKS[attack]   # (what, line in the body)
    assert scan(KERNEL + body) == [f"{what} (line {line + KERNEL.count(chr(10))})" for what, line in expected]


def test_every_name_the_interpreter_injects_is_refused():
    """The interpreter copies its module's globals into a kernel's module at the first launch
    (FunctionRewriter._compile_and_exec): none of them may be named by a file that does not bind it."""
    from triton.runtime import interpreter

    names = [n for n in vars(interpreter) if n.isidentifier() and not n.startswith("__")]
    assert "interpreter_builder" in names and "np" in names
    for name in names:
        source = KERNEL + LAUNCHER.replace("return out", f"return {name}")
        assert f"{name}, a name the file does not define (line 16)" in scan(source) or \
            any(found.startswith(name) for found in scan(source)), name


@pytest.fixture(scope="module")
def interpreted():
    """Triton on its interpreter in this process, with the worker's hooks (manifest.interpret_triton)."""
    from graders.engine.manifest import interpret_triton

    return interpret_triton()


def load(source: str, name: str = "kernel_file"):
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    path = f"/tmp/{name}_{abs(hash(source))}.py"
    with open(path, "w") as f:   # Triton reads a kernel's source from its file
        f.write(source)
    module.__file__ = path
    exec(compile(source, path, "exec"), module.__dict__)
    return module


def test_a_launch_is_recorded_with_its_programs_and_the_elements_it_read(interpreted):
    module = load(KERNEL + LAUNCHER)
    x = torch.arange(40, dtype=torch.float32)
    interpreted.ops = ops = []
    try:
        out = module.double(x)
    finally:
        interpreted.ops = None
    assert torch.equal(out, 2 * x)
    (launch,) = ops
    assert launch["kind"] == "kernel" and launch["name"] == "_double" and launch["grid"] == [3, 1, 1]
    assert [p["loads"] for p in launch["programs"]] == [{"x_ptr": 1}] * 3
    assert launch["reads"]["x_ptr"] == {"loads": 3, "lanes": 40, "distinct": 40, "most": 1}
    assert launch["stores"]["out_ptr"] == {"stores": 3, "lanes": 40}
    assert launch["outside"] == {"load": 0, "store": 0}


def test_a_lane_outside_every_tensor_reads_other_and_writes_nothing(interpreted):
    """A kernel without its mask: the 8 lanes past the end of x read `other` (0 without one), on
    any machine, instead of whatever lay in memory there, and its stores there are dropped."""
    module = load((KERNEL + LAUNCHER).replace(", mask=mask)", ")"), "unmasked")
    x = torch.arange(40, dtype=torch.float32) + 1
    interpreted.ops = ops = []
    try:
        out = module.double(x)
    finally:
        interpreted.ops = None
    assert torch.equal(out, 2 * x)
    assert ops[0]["outside"] == {"load": 8, "store": 8}


def test_the_interpreters_own_torch_calls_stay_out_of_the_recording():
    """A launch copies its arguments with torch (GridExecutor): none of that is the launcher's."""
    from graders.engine.manifest import interpret_triton
    from graders.engine.worker import _recorder

    interpret_triton()
    module = load(KERNEL + LAUNCHER, "recorded")
    x, ops = torch.ones(20), []
    with _recorder()(ops):
        module.double(x)
    assert [op["name"] for op in ops if op["kind"] == "function"] == ["empty_like", "numel", "numel"]


def test_a_slice_crosses_into_a_triton_katas_sandbox_with_its_strides_and_gaps():
    from types import SimpleNamespace

    from graders.engine.learner import Learner

    learner = Learner.__new__(Learner)
    learner.device, learner._sandbox = "cpu", SimpleNamespace(framework="triton")
    base = torch.arange(30, dtype=torch.float32).reshape(5, 6)
    blobs = []
    sent = learner._encode(base[:, :4], blobs)
    assert sent["strides"] == [6, 1] and "permute" not in sent
    from graders.engine.worker import Codec

    got = Codec().decode(sent, blobs)
    assert got.stride() == (6, 1) and torch.equal(got, base[:, :4])
    # The gaps are the sender's values: a kernel that steps by the row length reads them.
    assert torch.equal(got.as_strided((28,), (1,)), base.flatten()[:28])
    # A permuted view still crosses as a permutation.
    assert "permute" in learner._encode(base.t(), [])
    # `kata repro`'s tape keeps the slice as the sandbox saw it.
    from graders.engine import tape

    arrays = {}
    again = tape._decode(tape._encode(base[:, :4], arrays), arrays)
    assert again.stride() == (6, 1) and torch.equal(again.as_strided((28,), (1,)), base.flatten()[:28])
    assert np.isfinite(got.numpy()).all()
    # Any other kata's gets a contiguous copy of the slice's values, as before: a shard of a
    # tensor sent to a rank must not carry all of the tensor it was cut from.
    learner._sandbox.framework = "torch"
    blobs = []
    sent = learner._encode(base[:, :4], blobs)
    assert "strides" not in sent and Codec().decode(sent, blobs).is_contiguous()


# A launcher that computes the answer and a kernel that only copies it (the acceptance), two
# ways: with torch's softmax, which the static check refuses too, and with operators alone, which
# it cannot see. The recording of the launcher's torch calls names both first.
COPY = '''import math

import torch
import triton
import triton.language as tl


@triton.jit
def _copy_row(y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * n + tl.arange(0, BLOCK)
    mask = tl.arange(0, BLOCK) < n
    tl.store(out_ptr + offs, tl.load(y_ptr + offs, mask=mask), mask=mask)


def softmax(x):
    y = {answer}
    out = torch.empty_like(y)
    _copy_row[(y.shape[0],)](y, out, y.shape[1], BLOCK=triton.next_power_of_2(y.shape[1]))
    return out
'''
CHEATS = {"torch.softmax": ("torch.softmax(x.float(), dim=-1).to(x.dtype)", "launcher-computes"),
          "operators": ("(math.e ** x) / ((math.e ** x) @ torch.ones(x.shape[1], x.shape[1], dtype=x.dtype))",
                        "launcher-computes")}


@pytest.mark.parametrize("containment", [pytest.param("bwrap", marks=needs_bwrap), "container"])
@pytest.mark.parametrize("cheat", list(CHEATS))
def test_a_launcher_that_computes_and_a_kernel_that_copies_fail_the_structure_check(cheat, containment, tmp_path):
    if containment == "container" and os.geteuid() != 0:
        pytest.skip("container containment runs the worker as another user: root only")
    answer, code = CHEATS[cheat]
    kata = find("triton-softmax")
    path = tmp_path / kata.learner_file
    path.write_text(COPY.format(answer=answer), encoding="utf-8")
    with Zygote(["triton"], isolated=containment == "bwrap", container=containment == "container") as zygote:
        assert zygote.containment == containment
        result = grade(kata, path, seed=1, hidden_seed=1, device="cpu", zygote=zygote)
    checks = {c["id"]: c for c in result["checks"]}
    assert checks["one-program-per-row"]["status"] == "failed"
    assert checks["one-program-per-row"]["diagnosis"] == code, checks["one-program-per-row"]
    assert bool(scan(path.read_text())) == (cheat == "torch.softmax")
    assert result["score"] < result["max_score"]


def test_the_gpu_benchmark_says_it_needs_a_gpu_here():
    """benchmarks/triton_kernels.py compiles the references for a GPU: here it says there is none."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: benchmarks/triton_kernels.py runs for real (docs/measurements.md)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "benchmarks/triton_kernels.py"], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 2 and "no CUDA device" in done.stderr, done.stderr


def test_kata_run_runs_a_triton_kata_on_the_interpreter(monkeypatch):
    """`kata run` runs the README's example in a process of its own: its kernels on the interpreter
    too, where the caller's environment does not say so."""
    from graders.practice.run import run

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    kata = find("triton-softmax")
    outcome = run(kata, kata.files["reference"])
    assert outcome.returncode == 0, outcome
