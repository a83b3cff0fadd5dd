"""A compiled graph's convolutions on cuda, straight to their cuDNN plans (the wrapper's `convolution`
and `_convolution_weight_grad` extern calls: forward, transposed (the input gradient) and weight
gradient).

Eagerly each convolution pays for what it cannot know in advance: dtype and geometry checks, whether
cuDNN takes the operands, making them packed and aligned, the plan-cache key, the output's layout
(`_ops/nn_conv.py`, `_backends/cudnn.py`). In a compiled graph with static sizes all of that is fixed,
so `planned_convolution` runs the first call eagerly while `cudnn.record_calls` notes the one cuDNN
call it makes (kind, plan, operands, output), and keeps that plan when the call took the graph's own
arrays as they were (no cast, no copy) and returned cuDNN's output itself. Each later call then
allocates the output as the first call's was laid out and runs the plan (`cudnn._run`: workspace,
variant pack, execute), adding the bias as the eager kernel does, after checks that what the plan
assumed still holds: each operand with the first call's strides and a 16-byte aligned pointer (what
the plan's descriptors promise cuDNN), the current device and the cuDNN flags unchanged. A call that
fails a check runs the eager kernel, as every call does for a convolution the first call could not
plan (cuDNN unavailable or not taking it, the CuPy im2col path, an operand copied first).
"""
from __future__ import annotations

import math

from .._backends import cudnn as C, triton_launch as TL

CONVOLUTIONS = ("convolution", "_convolution_weight_grad")
ALIGN = 16                      # bytes: the operand alignment the plans' descriptors promise cuDNN
stats = {"planned": 0, "fast": 0, "eager": 0}    # plans kept; calls run by a plan; calls run eagerly (first ones too)


def _flags() -> tuple:
    return C.enabled, C.allow_tf32, C.deterministic, C.benchmark, C.use_graph_api


def planned_convolution(op_name: str, arguments, eager, empty, sources=()):
    """fn(*arrays) -> the extern's output, planned at its first call. `arguments(arrays, None)` gives
    the kernel's positional arguments (operand arrays, bias, constants); `eager(*arrays)` is the
    extern's general call; `empty(shape, dtype)` allocates on the graph's device. `sources[j]` tells
    where kernel argument j comes from (wrapper.operand_source: the index of its array in the call's
    arrays, and for a view of it the byte offset and strides; None: unknown): a planned operand that
    has one is read as a pointer, without making its view."""
    bias_at = 2 if op_name == "convolution" else None
    fast, first = None, True

    def call(*arrays):
        nonlocal fast, first
        if fast is not None:
            r = fast(arrays)
            if r is not None:
                return r
        elif first:
            first = False
            with C.record_calls() as seen:
                r = eager(*arrays)
            fast = _plan(seen, r, arguments, arrays, bias_at, empty, sources)
            stats["planned"] += fast is not None
            stats["eager"] += 1
            return r
        stats["eager"] += 1
        return eager(*arrays)
    return call


def _same_memory(p, q) -> bool:
    return p.data.ptr == q.data.ptr and p.shape == q.shape and p.strides == q.strides and p.dtype == q.dtype


def _layout_of(out, empty):
    """(shape to allocate, dims permutation or None, dtype) making a new array laid out as `out` (a dense
    layout: C order, or its dims permuted: `empty(shape, dtype)`, then `.transpose(permutation)`), or None."""
    shape, dtype, strides = tuple(out.shape), out.dtype, tuple(out.strides)
    if out.flags.c_contiguous:
        return shape, None, dtype
    order = sorted(range(len(shape)), key=lambda d: -strides[d])
    back = tuple(order.index(d) for d in range(len(shape)))
    permuted = tuple(shape[d] for d in order)
    if tuple(empty(permuted, dtype).transpose(back).strides) != strides:
        return None
    return permuted, back, dtype


def strides_of(shape, back, itemsize: int) -> list:
    """Byte strides of the array of `shape` that `empty(permuted shape).transpose(back)` makes: packed with
    its dims in the order `order` (back's inverse), the first slowest."""
    order = sorted(range(len(back)), key=lambda d: back[d])
    st, acc = [0] * len(shape), itemsize
    for d in reversed(order):
        st[d] = acc
        acc *= shape[d]
    return st


def _allocator(out, empty):
    """fn() -> a new array laid out as `out` (`_layout_of`), or None."""
    layout = _layout_of(out, empty)
    if layout is None:
        return None
    shape, back, dtype = layout
    if back is None:
        return lambda: empty(shape, dtype)
    return lambda: empty(shape, dtype).transpose(back)


def _plan(seen, result, arguments, arrays, bias_at, empty, sources=()):
    """The per-call function (arrays -> output, or None where a check fails) of a convolution whose
    first (eager) call made the cuDNN calls `seen` and returned `result`, or None when it cannot be
    planned."""
    if len(seen) != 1:
        return None
    kind, plan, a, b, out = seen[0]
    if result is not out or plan is None:
        return None                     # a cast or a re-layout after cuDNN: the eager path's to do
    vals = arguments(arrays, None)[0]
    where = []
    for operand in (a, b):              # which kernel argument cuDNN got as each operand, untouched
        j = next((j for j in (0, 1) if hasattr(vals[j], "data") and _same_memory(vals[j], operand)), None)
        if j is None:
            return None                 # copied (a cast, a re-layout, a misaligned pointer) first
        where.append(j)
    ja, jb = where
    sa, sb = tuple(a.strides), tuple(b.strides)
    alloc = _allocator(out, empty)
    if alloc is None or a.data.ptr % ALIGN or b.data.ptr % ALIGN:
        return None
    layout = _layout_of(out, empty) + (empty,)
    bias = vals[bias_at] if bias_at is not None else None
    bshape = (1, -1) + (1,) * (out.ndim - 2)
    flags, dev = _flags(), C._device_id()
    run, device_id = C._run, C._device_id
    pointers = isinstance(plan, C._GraphPlan) and _pointer_fast(
        kind, plan, [sources[j] if j < len(sources) else None for j in where], (sa, sb), layout,
        None if bias is None else (lambda arrays: arguments(arrays, None)[0][bias_at]), bshape, flags, dev)
    if pointers:
        return pointers

    def fast(arrays):
        vals = arguments(arrays, None)[0]
        x, y = vals[ja], vals[jb]
        if x.data.ptr % ALIGN or y.data.ptr % ALIGN or x.strides != sa or y.strides != sb or \
                _flags() != flags or device_id() != dev:
            return None
        r = alloc()
        run(kind, plan, x, y, r)
        if bias is not None:
            r += vals[bias_at].reshape(bshape)
        stats["fast"] += 1
        return r
    return fast


def _pointer_fast(kind, plan, sources, strides, layout, bias_of, bshape, flags, dev):
    """The per-call function of a graph-API plan whose two operands both have a known source
    (`planned_convolution`'s `sources`): the operands' pointers read from the call's arrays (a view's
    at its byte offset, with its fixed strides; an array itself checked for the first call's strides),
    no view and no argument list made; the output allocated inline (`layout`: `_layout_of` and the
    `empty`), the cuDNN flags compared inline; None when an operand's source is unknown or disagrees
    with what the first call saw."""
    if any(s is None for s in sources):
        return None
    (ia, oa, va), (ib, ob, vb) = sources
    sa, sb = strides
    if (va is not None and va != sa) or (vb is not None and vb != sb):
        return None                     # (a view's strides are its layout's: what the first call saw)
    check_a, check_b = va is None, vb is None
    oa, ob = oa or 0, ob or 0
    shape, back, dtype, empty = layout
    if back is not None:                # one array over a block with the output's byte strides (no transpose)
        cupy = TL._cupy()              # (imported where CuPy is first used: an optional dependency)
        nd, cuda_alloc = cupy.ndarray, cupy.cuda.alloc
        shape = tuple(shape[d] for d in back)
        nbytes = math.prod(shape) * dtype.itemsize
        byte_strides = tuple(strides_of(shape, back, dtype.itemsize))
    run, device_id, stream = C.run_pointers, C._device_id, C._current_stream

    def fast(arrays):
        x, y = arrays[ia], arrays[ib]
        px, py = x.data.ptr + oa, y.data.ptr + ob
        if (px | py) % ALIGN or (check_a and x.strides != sa) or (check_b and y.strides != sb) or \
                (C.enabled, C.allow_tf32, C.deterministic, C.benchmark, C.use_graph_api) != flags or \
                device_id() != dev:
            return None
        r = empty(shape, dtype) if back is None else nd(shape, dtype, memptr=cuda_alloc(nbytes), strides=byte_strides)
        run(kind, plan, px, py, r.data.ptr, dev, stream())
        if bias_of is not None:
            r += bias_of(arrays).reshape(bshape)
        stats["fast"] += 1
        return r
    return fast
