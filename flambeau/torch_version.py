"""torch.torch_version.TorchVersion: the version string that compares as a version.

`torch.__version__ >= "2.1"`, `< (2, 14)` and `== "2.13.0+flambeau"` compare by PEP 440 rules
(release numbers, then pre-, post-, dev-release and local label), not character by character; a
string that is no version falls back to plain string comparison, as in PyTorch. It stays a `str`
(`.split("+")`, hashing, printing).
"""
from __future__ import annotations

import math
import re
from typing import Any, Iterable

_VERSION = re.compile(
    r"^\s*v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_.]?(?P<pre_n>\d*))?"
    r"(?:-(?P<post_n1>\d+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>\d*))?"
    r"(?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>\d*))?"
    r"(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?\s*$", re.IGNORECASE)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


class InvalidVersion(ValueError):
    """A string that is not a PEP 440 version."""


def version_key(text: str) -> tuple:
    """A sort key ordering versions as PEP 440 does; InvalidVersion for text that is none."""
    m = _VERSION.match(text)
    if m is None:
        raise InvalidVersion(f"Invalid version: '{text}'")
    release = [int(p) for p in m["release"].split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    has_post = m["post_n1"] is not None or m["post_l"] is not None
    if m["pre_l"] is not None:
        pre = (_PRE_RANK[m["pre_l"].lower()], int(m["pre_n"] or 0))
    elif m["dev_l"] is not None and not has_post:
        pre = (-math.inf, 0)
    else:
        pre = (math.inf, 0)
    post = (int(m["post_n1"] or m["post_n2"] or 0),) if has_post else (-math.inf,)
    dev = (int(m["dev_n"] or 0),) if m["dev_l"] is not None else (math.inf,)
    local = () if m["local"] is None else tuple(
        (1, int(s), "") if s.isdigit() else (0, 0, s.lower()) for s in re.split(r"[-_.]", m["local"]))
    return int(m["epoch"] or 0), tuple(release), pre, post, dev, (m["local"] is not None, local)


def _other_key(other: Any) -> tuple:
    if isinstance(other, str):
        return version_key(other)
    if hasattr(other, "release") and hasattr(other, "public"):
        return version_key(str(other))
    if isinstance(other, Iterable):
        return version_key(".".join(str(item) for item in other))
    raise InvalidVersion(other)


class TorchVersion(str):
    """A `str` that compares with strings, tuples and packaging Versions as a version (`!=` stays
    str's, as in PyTorch)."""

    __slots__ = ()

    def _compare(self, other: Any, method: str) -> bool:
        try:
            mine, theirs = version_key(self), _other_key(other)
        except InvalidVersion:
            return getattr(super(), method)(other)
        return getattr(mine, method)(theirs)

    def __lt__(self, other: Any) -> bool:
        return self._compare(other, "__lt__")

    def __le__(self, other: Any) -> bool:
        return self._compare(other, "__le__")

    def __gt__(self, other: Any) -> bool:
        return self._compare(other, "__gt__")

    def __ge__(self, other: Any) -> bool:
        return self._compare(other, "__ge__")

    def __eq__(self, other: Any) -> bool:
        return self._compare(other, "__eq__")

    __hash__ = str.__hash__
