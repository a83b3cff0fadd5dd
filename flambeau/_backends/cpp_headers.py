"""C++ that several of flambeau's C++ sources share, kept once as headers in this folder (`lowp.h`:
bfloat16/float16 <-> float). `header(name)` is a header's text (the C++ code generator's prelude holds
it); `with_headers(source)` is a source with each `#include "name"` of such a header replaced by the
header's text, so a source compiled from its text in the build cache needs no include path and its
cache key covers the header. (A source compiled from its own path, as AOTInductor's objects are,
finds the headers beside it.)"""
from __future__ import annotations

import functools
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
_LOCAL_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_]+\.h)".*$', re.M)     # a trailing comment goes too


@functools.lru_cache(maxsize=None)
def header(name: str) -> str:
    """The text of the header `name` of this folder."""
    with open(os.path.join(HERE, name)) as f:
        return f.read()


def with_headers(source: str) -> str:
    """`source` with its `#include "name.h"` lines of this folder's headers replaced by their text."""
    def inline(m: re.Match) -> str:
        return header(m.group(1)) if os.path.exists(os.path.join(HERE, m.group(1))) else m.group(0)
    return _LOCAL_INCLUDE.sub(inline, source)
