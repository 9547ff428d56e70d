"""Bug oracles: reference implementations of known bugs, used to name what a learner got wrong.

``reference/<module>_bugs.py`` holds ``BUGS = {diagnosis code: {API name: implementation}}``.
Each bug is the reference with those names replaced. A failed check asks ``Bugs.match`` which
bug produces exactly the learner's output on the same inputs; a bug that gives the reference's
own output on those inputs cannot be told apart there and is never named.
"""
from __future__ import annotations

import importlib
import warnings
from types import SimpleNamespace
from typing import Callable

import numpy as np

from .expect import same
from .manifest import Kata


class Bugs:
    def __init__(self, kata: Kata):
        self.reference = importlib.import_module(f"reference.{kata.module}")
        self.module = importlib.import_module(f"reference.{kata.module}_bugs")
        public = {k: v for k, v in vars(self.reference).items() if not k.startswith("_")}
        self.impls = {code: SimpleNamespace(**{**public, **overrides})
                      for code, overrides in self.module.BUGS.items()}

    @property
    def codes(self) -> list[str]:
        return list(self.impls)

    def output(self, code: str, compute: Callable):
        return compute(self.impls[code])

    def match(self, got, compute: Callable, *, rtol: float, atol: float, among=None) -> str | None:
        """The code of the first bug whose output on this call is ``got``, if any."""
        with warnings.catch_warnings(), np.errstate(all="ignore"):   # bugs overflow by design
            warnings.simplefilter("ignore")
            return self._match(got, compute, rtol=rtol, atol=atol, among=among)

    def _match(self, got, compute, *, rtol, atol, among):
        expected = compute(self.reference)
        for code, impl in self.impls.items():
            # banned-api oracles compute the right values with a forbidden call: structural only.
            if code == "banned-api" or (among is not None and code not in among):
                continue
            try:
                out = compute(impl)
            except Exception:
                continue
            if not same(out, expected, rtol=rtol, atol=atol) and same(got, out, rtol=rtol, atol=atol):
                return code
        return None

    def shim(self, code: str) -> str:
        """Source of a learner file that is this bug: how `kata lint` and the tests grade a bug."""
        lines = [f"from reference.{self.reference.__name__.rsplit('.', 1)[-1]} import *  # noqa: F403"]
        for name, impl in self.module.BUGS[code].items():
            lines.append(f"from {self.module.__name__} import {impl.__name__} as {name}")
        return "\n".join(lines) + "\n"
