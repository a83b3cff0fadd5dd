"""A compiled graph's products on cuda, straight to cuBLASLt (the wrapper's `mm`/`bmm` extern calls).

Eagerly each product pays for what it cannot know in advance: shape checks, operand views, the layout
plan and the descriptor cache look-up (`cublaslt.gemm`, ~50 us of host time per call, 147 products in a
GPT-2 training step). In a compiled graph with static sizes an extern product's operand layouts are
fixed, so `planned_product` finds its cuBLASLt plan, descriptors and algorithm once, at the first call,
from the arrays that call builds, and each later call is one `cublasLtMatmul` on the operands' pointers
(base pointer plus the view's offset), an output allocation, and checks that what the plan assumed still
holds: each pointer at the same place in a 256-byte unit as at the first call, a fresh output 256-byte
aligned, an operand passed as a whole buffer still has its strides, the precision settings unchanged.
(The descriptors are built for the first call's pointer alignments, a view at an offset included; a
later call whose pointers sit elsewhere in a 256-byte unit fails the check.) A call that fails a check
runs the eager kernel, as every call does for a product the plan cannot take (operands to copy first,
large misaligned sizes padded by `cublaslt.gemm`, dtypes cuBLASLt does not take).
"""
from __future__ import annotations

import ctypes

from .. import _backends, _state
from .._backends import cublaslt as LT
from .ir import StridedView

ALIGN = LT.MAX_ALIGNMENT            # bytes: the alignment the plan's descriptors promise cuBLASLt
PRODUCTS = ("mm", "bmm")


def _precision() -> tuple:
    return (_state.float32_matmul_precision, LT.allow_fp16_reduced_precision_reduction,
            LT.allow_bf16_reduced_precision_reduction)


class _Operand:
    """Where one product operand's memory is: the array at `index` of the call's arguments, plus the
    view's byte offset; `strides` (bytes) that a whole-buffer operand must still have."""
    __slots__ = ("index", "offset", "strides")

    def __init__(self, arg, index: int):
        self.index = index
        if isinstance(arg, StridedView):
            self.offset, self.strides = arg.layout.offset * arg.dtype.itemsize, None
        else:
            self.offset, self.strides = 0, tuple(st * arg.dtype.itemsize for st in arg.layout.strides)


def planned_product(args, index: dict, operands, eager):
    """fn(*arrays) -> the product of the extern `args` (two Buffers/StridedViews; `index` maps a base
    buffer's name to its position in the arrays), planned at its first call. `operands(arrays)` gives
    the two operand arrays as the eager kernel takes them; `eager(*arrays)` is the extern's general
    call, which the first call and any call failing a check runs. `call(*arrays, out=d)` writes the
    product into `d` (a contiguous array of its shape and dtype: mm_template.py's extern choice)."""
    ops = [_Operand(a, index[a.base.name if isinstance(a, StridedView) else a.name]) for a in args]
    state: dict = {}

    def call(*arrays, out=None):
        fast = state.get("fast")
        if fast is not None:
            d = fast(arrays, out)
            if d is not None:
                return d
        elif "fast" not in state:
            state["fast"] = _plan(ops, operands(arrays), arrays)
        d = eager(*arrays)
        if out is None:
            return d
        out[...] = d
        return out
    return call


def _plan(ops, operands, arrays):
    """The per-call function ((arrays, out) -> output, or None where a check fails) of a product whose
    operands are laid out as `operands`, or None when the direct path does not take it."""
    cupy = _backends.get("cuda").xp
    a, b = operands
    if not hasattr(a, "__cuda_array_interface__") or not LT.handles(a, b):
        return None
    lib = LT._lib_state["lib"]      # (read after `handles`, which loads cuBLASLt: a process's first product
    if lib is None:                 # was never planned when read before)
        return None
    if any(o.strides is not None and arrays[o.index].strides != o.strides for o in ops):
        return None
    if b.ndim == 2 and (a.ndim == 2 or a.flags.c_contiguous) and a.size * b.shape[1] >= LT.PAD_MIN_MACS and \
            LT._misaligned_2d(a, b):
        return None                                     # cublaslt.gemm pads these: keep its path
    p = LT._plan_for(a, b)
    if isinstance(p, str):
        return None
    it = a.itemsize
    ra, rb = a.data.ptr % ALIGN, b.data.ptr % ALIGN       # the pointers' place in an alignment unit, kept
    aligns = (LT.alignment(rb or ALIGN, p.a[4] * it), LT.alignment(ra or ALIGN, p.b[4] * it),
              LT.alignment(ALIGN, p.m * p.n * it), LT.alignment(ALIGN, p.m * p.n * it), 0)
    name = LT._names()[a.dtype]
    dev = cupy.cuda.runtime.getDevice()
    handle = LT._handle(dev)
    comp = LT._Compiled(lib, handle, p, name, LT.EPILOGUE_DEFAULT, aligns, LT.reduction_mask(name))
    precision = _precision()
    shape, dtype = tuple(p.out), a.dtype
    (ia, oa, sa), (ib, ob, sb) = ((o.index, o.offset, o.strides) for o in ops)
    matmul, empty, stream_of = lib.cublasLtMatmul, cupy.empty, cupy.cuda.get_current_stream
    one, zero, algo = ctypes.byref(LT._ONE), ctypes.byref(LT._ZERO), ctypes.byref(comp.algo)
    desc, la, lb, ld, ws_bytes = comp.desc, comp.la, comp.lb, comp.ld, comp.ws
    workspaces, calls = LT._workspaces, LT.calls

    def fast(arrays, out=None):
        x, y = arrays[ia], arrays[ib]
        pa, pb = x.data.ptr + oa, y.data.ptr + ob
        if pa % ALIGN != ra or pb % ALIGN != rb or (sa is not None and x.strides != sa) or \
                (sb is not None and y.strides != sb) or _precision() != precision:
            return None
        d = empty(shape, dtype) if out is None else out
        pd = d.data.ptr
        if pd % ALIGN:
            return None
        stream = stream_of().ptr
        ws = workspaces.get((dev, stream))
        if ws is None:
            ws = LT._workspace(cupy, dev, stream)
        LT._check(matmul(handle, desc, one, pb, la, pa, lb, zero, pd, ld, pd, ld, algo, ws.data.ptr, ws_bytes,
                         stream), "cublasLtMatmul")
        calls["gemm"] += 1
        return d
    return fast
