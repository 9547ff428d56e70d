"""What a Triton kata's code ran, read from a recording (``learner.recording()``): the kernel
launches that the worker's hooks on Triton's interpreter saw (worker.KernelTracer), and the torch
functions its launchers called around them.

A launcher may allocate, read shapes and strides, take views and launch: the kernels compute
everything. The static check refuses every torch name and tensor method outside that list
(structure.TRITON_NAMES, LAUNCHER_ATTRIBUTES); what it cannot see from the text, an operator on
tensors (``x * 2``, ``a @ b``) or an index that copies (``cache[table]``), the recording shows.
"""
from __future__ import annotations

from . import expect, structure

# The recorded torch functions a launcher may call: allocations, a tensor's layout (``__get__``
# reads .shape, .dtype and .device), views, and copies that compute nothing (contiguous, to):
# a kata that forbids copies (a paged kernel reads the cache in place) judges those itself.
LAUNCHER_FUNCTIONS = {
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "full", "full_like", "ones", "ones_like",
    "new_empty", "new_zeros", "new_full", "__get__", "stride", "size", "dim", "numel", "element_size",
    "is_contiguous", "is_floating_point", "data_ptr", "storage_offset", "view", "reshape", "unsqueeze", "squeeze",
    "transpose", "permute", "expand", "flatten", "unflatten", "contiguous", "to", "__len__",
}


def launches(ops: list[dict], name: str | None = None) -> list[dict]:
    """The kernel launches of a recording, in order (those of kernel ``name`` when given)."""
    return [op for op in ops if op.get("kind") == "kernel" and name in (None, op.get("name"))]


def launcher_calls(ops: list[dict]) -> list[str]:
    """The torch functions the launchers called, in order (never those of a launch itself)."""
    return [str(op.get("name")) for op in ops if op.get("kind") == "function"]


def check_kernels_compute(learner, ops: list[dict], *, call: str, case: str, code: str):
    """The recorded call launched at least one kernel and its launcher computed nothing with torch
    (diagnosed ``code``); then the static check (structure.check_untampered): the recording holds
    only for a file that passes it. Lanes outside the tensors (``outside``) are the kata's to judge."""
    kernels = launches(ops)
    expect.that(bool(kernels), "Your function launched no Triton kernel: this kata is graded on what its kernels compute.",
                call=call, case=case, got="no launch", expected="a kernel launched with kernel[grid](...)",
                diagnose=lambda: code)
    computed = sorted(set(launcher_calls(ops)) - LAUNCHER_FUNCTIONS)
    expect.that(not computed, "Your launcher computes with torch: a launcher may allocate, read shapes and strides, "
                "take views and launch, and the kernel computes everything.",
                call=call, case=case, got=", ".join(computed[:8]), expected="allocations, views and launches only",
                diagnose=lambda: code)
    structure.check_untampered(learner, call=call, case=case)


def outside(ops: list[dict], kind: str = "load") -> int:
    """Lanes of the recorded launches that fell outside every tensor argument (``kind``: load or
    store): the hooks read the load's ``other`` there instead (0 without one), and write nothing."""
    return sum(int(op.get("outside", {}).get(kind, 0)) for op in launches(ops))
