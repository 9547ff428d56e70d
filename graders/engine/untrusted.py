"""What the trusted side takes from learners, made safe to keep: text that any UTF-8 file can
hold, and files sized before they are read.

Text: the sandbox's JSON can carry a lone surrogate (``"\\ud800"``, or bytes a learner's code
decoded with surrogateescape), which Python keeps in a str but no UTF-8 file can hold: written
into feedback.md it would stop the class run. Files: a submission is sized by ``stat`` (a sparse
file's size counts) before a byte of it is read, and never read past its limit.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

MAX_SUBMISSION_BYTES = 1 << 20   # a kata file is a few kilobytes
_SURROGATE = re.compile("[\ud800-\udfff]")   # the code points UTF-8 cannot encode


def encodable(value):
    """``value`` (parsed JSON) with every string in it, dict keys included, writable as UTF-8: a
    surrogate becomes U+FFFD (json.loads joins an escaped pair into the one character it means)."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [encodable(v) for v in value]
    if isinstance(value, dict):
        return {encodable(k): encodable(v) for k, v in value.items()}
    return value


class TooLarge(ValueError):
    """A learner's file over its size limit; the message says so in a sentence."""


def _refusal(path: Path, limit: int) -> str:
    return f"{Path(path).name} is larger than {limit / 2**20:g} MB, so it was not graded."


def too_large(path: Path, limit: int = MAX_SUBMISSION_BYTES) -> str | None:
    """A sentence if the file at ``path`` is larger than ``limit`` bytes, else None."""
    return None if os.stat(path).st_size <= limit else _refusal(path, limit)


def read_capped(path: Path, limit: int = MAX_SUBMISSION_BYTES) -> bytes:
    """The bytes of the file at ``path``, sized before they are read; raises TooLarge when it
    holds more than ``limit``. At most ``limit`` + 1 bytes are read: it may grow meanwhile."""
    if too_large(path, limit) is None:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
        if len(data) <= limit:
            return data
    raise TooLarge(_refusal(path, limit))
