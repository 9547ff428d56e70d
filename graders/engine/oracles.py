"""Bug oracles: reference implementations of known bugs, used to name what a learner got wrong.

``reference/<module>_bugs.py`` holds ``BUGS = {diagnosis code: {API name: implementation}}``, or
for a bug people write in several ways, a list of such dicts (its variants, named ``code``,
``code~2``, ...). Each bug is the reference with those names replaced. A failed check asks ``Bugs.match`` which
bug produces exactly the learner's output on the same inputs; a bug that gives the reference's
own output on those inputs cannot be told apart there and is never named.

Graders reach the reference and the bugs only through ``Bugs``: ``bugs.reference`` and each
``impl`` are ``Oracle`` proxies whose calls go through a ``Book`` (see recording.py), so a
student bundle can replay them without the code. There ``Bugs`` imports nothing from reference/.

``bugs.expected`` is such a proxy too, of ``reference/<module>_expected.py``: the expected values
a grader writes out by hand, apart from the reference (the band a mask must be, RoPE as complex
numbers). They are answers as much as the reference is, so they stay out of bundles with it.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np

from .expect import same
from .manifest import Kata
from .recording import Book, NotRecorded, Oracle


class Bugs:
    def __init__(self, kata: Kata, book: Book | None = None, *, codes: list[str] | None = None):
        """The full kit's oracles; in a bundle (``book`` replays) only their ``codes`` are known."""
        self.book = book or Book()
        if self.book.replaying:
            self.reference = Oracle(self.book, "reference", None)
            self.expected = Oracle(self.book, "expected", None)
            self.impls = {name: Oracle(self.book, name, None) for name in codes}
            return
        module = kata.load("reference")
        # Bug oracles are optional for a course's own kata: without them nothing is diagnosed.
        self.module = kata.load("bugs") if kata.files["bugs"].is_file() else SimpleNamespace(BUGS={})
        public = {k: v for k, v in vars(module).items() if not k.startswith("_")}
        self.reference = Oracle(self.book, "reference", module)
        self.expected = Oracle(self.book, "expected",
                               kata.load("expected") if kata.files["expected"].is_file() else SimpleNamespace())
        self.overrides = {name: overrides for code, variants in self.module.BUGS.items()
                          for name, overrides in _variants(code, variants)}
        self.impls = {name: Oracle(self.book, name, SimpleNamespace(**{**public, **overrides}))
                      for name, overrides in self.overrides.items()}

    @property
    def names(self) -> list[str]:
        """Every variant of every bug: ``code`` for the first, ``code~2`` and on for the others."""
        return list(self.impls)

    @property
    def codes(self) -> list[str]:
        return list(dict.fromkeys(code_of(name) for name in self.impls))

    def variants(self) -> list[tuple[str, Oracle]]:
        """(diagnosis code, oracle) for every variant."""
        return [(code_of(name), impl) for name, impl in self.impls.items()]

    def match(self, got, compute: Callable, *, rtol: float, atol: float, among=None) -> str | None:
        """The code of the first bug whose output on this call is ``got``, if any."""
        with warnings.catch_warnings(), np.errstate(all="ignore"):   # bugs overflow by design
            warnings.simplefilter("ignore")
            return self._match(got, compute, rtol=rtol, atol=atol, among=among)

    def _match(self, got, compute, *, rtol, atol, among):
        try:
            expected = compute(self.reference)
        except NotRecorded:   # a bundle that did not record this call names no bug
            return None
        for code, impl in self.variants():
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

    def shim(self, name: str) -> str:
        """Source of a learner file that is this bug (a name from ``names``): how `kata lint` and
        the tests grade a bug.

        Self-contained: it embeds the reference and bug modules, since a sandbox may not read
        reference/ (as root it cannot)."""
        reference = self.reference.namespace.__name__
        lines = ["import sys as _sys, types as _types",
                 "_sys.modules['reference'] = _package = _types.ModuleType('reference')",
                 "_package.__path__ = []"]
        for module in (self.reference.namespace, self.module):
            qualified = module.__name__
            lines += [f"_module = _sys.modules[{qualified!r}] = _types.ModuleType({qualified!r})",
                      f"setattr(_package, {qualified.rpartition('.')[2]!r}, _module)",
                      f"exec(compile({Path(module.__file__).read_text()!r}, {qualified!r}, 'exec'), _module.__dict__)"]
        lines.append(f"from {reference} import *  # noqa: F403")
        for api, impl in self.overrides[name].items():
            lines.append(f"from {self.module.__name__} import {impl.__name__} as {api}")
        return "\n".join(lines) + "\n"


VARIANT = "~"


def code_of(name: str) -> str:
    """The diagnosis code of a variant's name: ``mask-inverted~2`` -> ``mask-inverted``."""
    return name.partition(VARIANT)[0]


def _variants(code: str, variants) -> list[tuple[str, dict]]:
    variants = variants if isinstance(variants, list) else [variants]
    return [(code if i == 1 else f"{code}{VARIANT}{i}", overrides) for i, overrides in enumerate(variants, 1)]
