"""The wrapper: generated Python that runs one compiled graph.

    def call(args):
        arg0, arg1 = args
        arg0 = arg0._data; arg1 = arg1._data          # flambeau Tensors -> NumPy arrays
        buf0 = _empty((256, 1024), _f32)              # memory plan: fresh or a freed buffer
        kernel0(arg0.ctypes.data, arg1.ctypes.data, buf0.ctypes.data)
        buf1 = extern_buf1(buf0)                      # an extern/fallback op on arrays
        return (_T(buf1, _cpu),)

Kernel function objects (ctypes, argtypes set once) and extern callables are globals of the
generated module, so a call is a straight line of statements.
"""
from __future__ import annotations

import ctypes

import numpy as np

from .. import _dtype as D
from .._backends import cpu_blas
from .._device import CPU
from .._tensor import Tensor
from .ir import Buffer, InputBuffer, MultiOutput, StridedView
from .scheduler import ExternStep, Kernel


def strided_array(base: np.ndarray, layout) -> np.ndarray:
    """A NumPy view of `base`'s memory with the layout's element strides and offset."""
    it = base.itemsize
    if base.flags.c_contiguous and all(layout.shape):          # the fast constructor (~10x as_strided)
        return np.ndarray(layout.shape, base.dtype, buffer=base, offset=layout.offset * it,
                          strides=tuple(st * it for st in layout.strides))
    span = 1 + sum((s - 1) * st for s, st in zip(base.shape, base.strides) if s > 0) // it if base.size else 1
    raw = np.lib.stride_tricks.as_strided(base, (span,), (it,))
    if not all(layout.shape):
        return np.empty(layout.shape, base.dtype)
    return np.lib.stride_tricks.as_strided(raw[layout.offset:], layout.shape,
                                           tuple(st * it for st in layout.strides))


def _contig(r):
    if type(r) is np.ndarray and r.flags.c_contiguous:
        return r
    r = np.asarray(r)
    return r if r.flags.c_contiguous else np.ascontiguousarray(r)


def make_extern(ek):
    """fn(*arrays of ek's input buffers, in `ek.inputs()` order) -> array or tuple of arrays."""
    bases = []
    index = {}
    for b in ek.inputs():
        if b.name not in index:
            index[b.name] = len(bases)
            bases.append(b)

    def build(a, arrays):
        if isinstance(a, StridedView):
            return strided_array(arrays[index[a.base.name]], a.layout)
        if isinstance(a, Buffer):
            return arrays[index[a.name]]
        if isinstance(a, list):
            return [build(x, arrays) for x in a]
        if isinstance(a, tuple):
            return tuple(build(x, arrays) for x in a)
        return a
    kernel = ek.op.kernel
    args, kwargs = ek.args, ek.kwargs
    multi = ek.layout is None
    if getattr(ek.op, "name", None) in ("mm", "bmm") and not kwargs and \
            all(isinstance(a, (Buffer, StridedView)) and a.dtype in _BLAS_DTYPES for a in args):
        return _matmul_extern(args, index), bases          # straight to BLAS (shapes and dtypes are static)

    def call(*arrays):
        r = kernel(np, *build(args, arrays), **build_kw(kwargs, arrays))
        if multi:
            return tuple(_contig(x) if x is not None and not isinstance(x, (int, float, bool)) else x for x in r)
        return _contig(r)

    def build_kw(kw, arrays):
        return {k: build(v, arrays) for k, v in kw.items()} if kw else {}
    return call, bases


_BLAS_DTYPES = (D.float32, D.float64)


def _matmul_extern(args, index):
    """The matrix product (flambeau._backends.cpu_blas) of the operands as arrays; views are built with
    the fast constructor."""
    def operand(a):
        i = index[a.base.name if isinstance(a, StridedView) else a.name]
        if isinstance(a, StridedView):
            lay = a.layout
            return lambda arrays: strided_array(arrays[i], lay)
        return lambda arrays: arrays[i]
    fa, fb = operand(args[0]), operand(args[1])
    matmul = cpu_blas.matmul

    def call(*arrays):
        return matmul(fa(arrays), fb(arrays))
    return call


def kernel_error(code: int):
    """Raise what eager PyTorch raises for an error a generated kernel recorded."""
    if code == 1:
        raise IndexError("index out of range in self (an index read by a compiled kernel is out of bounds)")
    if code == 2:
        raise RuntimeError("ZeroDivisionError")
    raise RuntimeError(f"compiled kernel reported error code {code}")


class WrapperCodegen:
    def __init__(self, graph, order, memory, backend, kernels_ns):
        self.g = graph
        self.order = order
        self.mem = memory
        self.backend = backend
        self.ns = {"np": np, "_empty": np.empty, "_T": Tensor._make, "_cpu": CPU,
                   "_strided": strided_array}
        self.kernels_ns = kernels_ns
        self.lines: list = []

    def _dtype(self, dt) -> str:
        name = f"_dt_{dt.name}"
        self.ns[name] = dt.np
        return name

    def _ptr(self, name) -> str:
        return f"{name}.ctypes.data" if self.backend == "cpp" else name

    def generate(self) -> str:
        g, L = self.g, self.lines
        inputs = g.inputs
        L.append("def call(args):")
        if inputs:
            L.append(f"    {', '.join(f'_in{b.position}' for b in inputs)}{',' if len(inputs) == 1 else ''} = args")
            for b in inputs:
                L.append(f"    {b.name} = _in{b.position}._data")
        for name, c in g.constants.items():
            self.ns[f"_c_{name}"] = c.constant
            L.append(f"    {name} = _c_{name}._data")
        for i, step in enumerate(self.order):
            if isinstance(step, Kernel):
                self._kernel(step)
            else:
                self._extern(step)
            for name in self.mem["frees"][i]:
                if name not in self.mem["allocs"]:
                    L.append(f"    del {name}")
        if self.backend == "cpp" and any(isinstance(s, Kernel) for s in self.order):
            take = self.kernels_ns["fl_take_error"]
            take.argtypes, take.restype = [], ctypes.c_int
            self.ns["_take_error"], self.ns["_kernel_error"] = take, kernel_error
            L.append("    _e = _take_error()")
            L.append("    if _e:")
            L.append("        _kernel_error(_e)")
        L.append(f"    return {self._outputs()}")
        return "\n".join(L) + "\n"

    def _kernel(self, k: Kernel):
        for b in k.stores:
            act, other = self.mem["allocs"][b.name]
            shape = tuple(b.layout.shape)
            if act == "reuse":
                self.lines.append(f"    {b.name} = {other}.reshape({shape})")
            else:
                self.lines.append(f"    {b.name} = _empty({shape}, {self._dtype(b.dtype)})")
        args = [self._ptr(b.name) for b in k.loads] + [self._ptr(b.name) for b in k.stores]
        fn = self.kernels_ns[k.name]
        if self.backend == "cpp":
            fn.argtypes = [ctypes.c_void_p] * len(args)
            fn.restype = None
        self.ns[k.name] = fn
        self.lines.append(f"    {k.name}({', '.join(args)})")

    def _extern(self, step: ExternStep):
        ek = step.node
        fn, bases = make_extern(ek)
        name = f"_extern_{ek.name}"
        self.ns[name] = fn
        call = f"{name}({', '.join(b.name for b in bases)})"
        if ek.layout is None:
            outs = [f"{ek.name}_{i}" if any(o.i == i for o in ek.outputs) else "_" for i in range(ek.n_outputs)]
            self.lines.append(f"    {', '.join(outs)}{',' if len(outs) == 1 else ''} = {call}")
        else:
            self.lines.append(f"    {ek.name} = {call}")

    def _out_expr(self, o) -> str:
        if isinstance(o, InputBuffer) and o.position is not None:
            return f"_in{o.position}"
        if isinstance(o, StridedView):
            lay = o.layout
            name = f"_layout_{len(self.ns)}"
            self.ns[name] = lay
            return f"_T(_strided({o.base.name}, {name}), _cpu)"
        if isinstance(o, (Buffer, MultiOutput)):
            return f"_T({o.name}, _cpu)"
        name = f"_const_{len(self.ns)}"
        self.ns[name] = o
        return name

    def _outputs(self) -> str:
        outs = self.g.outputs
        if isinstance(outs, list):
            return "(" + "".join(self._out_expr(o) + ", " for o in outs) + ")"
        return self._out_expr(outs)
