"""Bugs injected into the inductor's lowerings for the minifier tests (tests/test_minifier.py).

`BUGS[kind] = (op, rule)`: "error" makes `sin` raise while lowering, "accuracy" makes
`mul.Tensor` add 0.01 to every product, "backward" makes `cos` raise (a program without cos
meets it only in the backward graph, as sin's derivative), "dynamic" makes `sin` raise only when
its input has a symbolic size (a graph compiled with dynamic shapes), "crash" makes `sin`'s lowering
kill the interpreter with a segfault (as a crash in generated C++ would). `inject(kind)` installs one process-wide; the tests'
sitecustomize hook calls it in a repro script's subprocess when FLAMBEAU_TEST_INDUCTOR_BUG is set.
"""
from __future__ import annotations

import ctypes

from flambeau._decomp._table import aten
from flambeau._inductor import lowering as L
from flambeau._inductor.ir import ops

BUG_MESSAGE = "injected sin lowering bug"
COS_BUG_MESSAGE = "injected cos lowering bug"
DYNAMIC_BUG_MESSAGE = "injected sin lowering bug on symbolic sizes"
_sin_lowering = aten.sin.lowering
MUL_OFFSET = 0.01


def sin_raises(g, x):
    raise RuntimeError(BUG_MESSAGE)


def cos_raises(g, x):
    raise RuntimeError(COS_BUG_MESSAGE)


def sin_raises_on_symbolic_sizes(g, x):
    val = g.node.args[0].meta["val"]
    if not all(isinstance(s, int) for s in val.shape):
        raise RuntimeError(DYNAMIC_BUG_MESSAGE)
    return _sin_lowering(g, x)


def sin_segfaults(g, x):
    ctypes.string_at(0)                  # reads address 0: SIGSEGV


def mul_off_by_a_constant(g, a, b):
    dt = L.out_dtype(g)
    return L.make_pointwise(g, lambda x, y: ops.add(ops.mul(x, y), ops.constant(MUL_OFFSET, dt)), [a, b], dt)


BUGS = {"error": (aten.sin, sin_raises), "accuracy": (aten.mul, mul_off_by_a_constant),
        "backward": (aten.cos, cos_raises), "dynamic": (aten.sin, sin_raises_on_symbolic_sizes),
        "crash": (aten.sin, sin_segfaults)}


def inject(kind: str) -> None:
    op, rule = BUGS[kind]
    op.lowering = rule
