"""What a check raises when it does not pass. The runner turns these into per-check reports."""
from __future__ import annotations


SHORT_WORDS = {"a", "an", "the", "one", "two", "its", "all", "any"}   # prose; other short words are names


def sentence(text: str) -> str:
    """``text`` as the start of a sentence: its first word capitalised where it is a word ("the
    output"), never where it is code: a call (``softmax(...)``), a name with ``_`` or ``.``, or a
    short name such as ``dq`` or ``lse``, which a capital would turn into another one."""
    first = text.split(" ", 1)[0]
    if not (first.isalpha() and first.islower() and (len(first) > 3 or first in SHORT_WORDS)):
        return text
    return text[:1].upper() + text[1:]


class CheckFailed(AssertionError):
    """The learner's code was judged wrong.

    ``message`` is one sentence; the optional fields are shown as labelled lines (the call, the
    case, where the values differ, what came back, what was expected) and ``diagnosis`` is a code
    from the kata's manifest.
    """

    status = "failed"

    def __init__(self, message: str, *, call: str | None = None, case: str | None = None,
                 got: str | None = None, expected: str | None = None, diagnosis: str | None = None,
                 output: str = "", where: str | None = None):
        super().__init__(message)
        self.message = message
        self.call, self.case, self.where, self.got, self.expected = call, case, where, got, expected
        self.diagnosis = diagnosis
        self.output = output

    def details(self) -> list[tuple[str, str]]:
        """The labelled lines: every field given, a falsy value too (``expected=0.0``, ``got=()``)."""
        return [(label, str(value)) for label, value in (("call", self.call), ("case", self.case),
                                                         ("where", self.where), ("got", self.got),
                                                         ("expected", self.expected))
                if value is not None and value != ""]

    def text(self) -> str:
        return "\n".join([self.message, *(f"{label}: {value}" for label, value in self.details())])


class NotStarted(CheckFailed):
    """The learner's code raised NotImplementedError: the stub is untouched there."""


class LearnerRaised(CheckFailed):
    """The learner's code raised an exception (other than NotImplementedError); ``type_name``
    is its class name, or None when the call named something the file does not define."""

    def __init__(self, message: str, *, type_name: str | None = None, **fields):
        super().__init__(message, **fields)
        self.type_name = type_name


class SandboxFailed(CheckFailed):
    """The check could not judge the code: it timed out, crashed, exhausted memory, or the
    learner's file could not be loaded. ``forbidden``: it was stopped for starting a thread or a
    process, which a kata that declares ``tampering`` diagnoses so."""

    status = "error"
    forbidden = False
