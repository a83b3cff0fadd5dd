"""The wrapper: generated Python that runs one compiled graph.

    def call(args):
        arg0, arg1 = args
        arg0 = arg0._data; arg1 = arg1._data          # flambeau Tensors -> NumPy arrays
        buf0 = _empty((256, 1024), _f32)              # memory plan: fresh or a freed buffer
        kernel0_obj(arg0, arg1, buf0)                 # C++ kernels read the arrays' data pointers
        buf1 = extern_buf1(buf0)                      # an extern/fallback op on arrays
        return (_T(buf1, _dev),)

Graph inputs that the graph writes (`copy_`) get their final values copied into them last,
after the kernels' error check.

Kernel function objects (ctypes, argtypes set once; for Triton kernels a
`triton_runtime.Launcher`) and extern callables are globals of the
generated module, so a call is a straight line of statements. On cuda the arrays are CuPy's, the
externs run their kernels on CuPy, and a Triton kernel's bounds-check failure lands in `_err`:
read after the kernels on cpu; on cuda a per-device flag raised at the next synchronisation
(`device_checks`, as eager's checks), so a call never waits for the GPU.

A graph with symbolic sizes (graph.py) first reads each size symbol from the input it lives in
(`s0, s1 = arg0.shape`), then checks that every input has the shape and (unless it is empty) the
strides the kernels assume, that every size symbol is >= 2 (0 and 1 are specialised by the tracer) and that the tracer's
guards hold for these values (cached per distinct sizes); otherwise the graph runs eagerly
(`_eager`), never wrongly. Buffer shapes are Python expressions of the symbols, the kernels get
the symbols as trailing integer arguments, externs evaluate symbolic arguments and views.
"""
from __future__ import annotations

import ctypes

import numpy as np

from .. import _dtype as D
from .. import _backends
from .._backends import cpu_kernels, device_checks
from .._device import CPU
from .._tensor import Tensor
from ..fx._symbolic_shapes import expr_to_python
from . import codegen_cpp, config, extern_conv, extern_gemm
from .ir import Buffer, ComputedBuffer, InputBuffer, MultiOutput, Pointwise, StridedView, analyse
from .scheduler import ARENA_ALIGN, ExternStep, Kernel, plan_arena
from .sizevars import SizeExpr, derived_definition, evaluate, replacements


def strided_array(base: np.ndarray, layout) -> np.ndarray:
    """A NumPy view of `base`'s memory with the layout's element strides and offset."""
    if type(base) is not np.ndarray:
        return _strided_device(base, layout)
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


def _strided_device(base, layout):
    """`strided_array` for a device array (CuPy's ndarray type): a view at the layout's offset and strides."""
    it, array = base.itemsize, type(base)
    if not all(layout.shape):
        return array(layout.shape, base.dtype)
    return array(layout.shape, base.dtype, base.data + layout.offset * it, strides=tuple(st * it for st in layout.strides))


def empty_of(xp):
    """`xp.empty(shape, dtype)` of an array namespace; for CuPy its array type itself (`cupy.empty` is a
    Python function around `cupy.ndarray(shape, dtype)`: one frame less per buffer)."""
    if getattr(xp, "__name__", None) == "cupy" and isinstance(getattr(xp, "ndarray", None), type):
        return xp.ndarray
    return xp.empty


def device_view(layout, itemsize: int, repeated: bool = False):
    """fn(base) -> `_strided_device(base, layout)` for a static layout, its byte strides and offset worked
    out once here (for `itemsize`; a base of another item size takes `_strided_device`). `repeated`: the
    base is usually the same array call after call (a graph input that is a parameter, updated in place),
    so the last view is kept with its base and handed out again for that same base."""
    shape, strides, off = tuple(layout.shape), tuple(st * itemsize for st in layout.strides), layout.offset * itemsize
    if not all(shape):
        return lambda base: _strided_device(base, layout)

    def view(base):
        if base.itemsize != itemsize:
            return _strided_device(base, layout)
        return type(base)(shape, base.dtype, base.data + off if off else base.data, strides=strides)
    if not repeated:
        return view
    last = [(None, None)]               # (base, its view) of the last call, replaced as one item

    def same_base_view(base):
        seen, v = last[0]
        if seen is not base:
            v = view(base)
            last[0] = (base, v)
        return v
    return same_base_view


stats = {"extern_output_copies": 0}     # extern outputs copied into the layout the graph assumed


def _contig(r):
    if type(r) is np.ndarray and r.flags.c_contiguous:
        return r
    if hasattr(r, "__cuda_array_interface__"):
        if r.flags.c_contiguous:
            return r
        stats["extern_output_copies"] += 1
        return r.copy()
    r = np.asarray(r)
    if r.flags.c_contiguous:
        return r
    stats["extern_output_copies"] += 1
    return np.ascontiguousarray(r)


def conform(layout):
    """fn(array) -> the array when it is laid out as `layout` says (a dense layout: graph.py's
    `_extern_layout`), else a copy laid out so: what an extern's output goes through before the
    kernels that read it with the layout's strides."""
    if layout is None or layout.is_contiguous():
        return _contig
    shape, strides = layout.shape, layout.strides
    dims = [d for d, s in enumerate(shape) if s != 1]
    order = sorted(range(len(shape)), key=lambda d: -strides[d])
    back = tuple(order.index(d) for d in range(len(shape)))

    def to_layout(r):
        it = r.itemsize
        if all(r.strides[d] == strides[d] * it for d in dims):
            return r
        xp = np if type(r) is np.ndarray else _backends.get("cuda").xp
        stats["extern_output_copies"] += 1
        out = xp.empty(tuple(shape[d] for d in order), r.dtype).transpose(back)
        out[...] = r
        return out
    return to_layout


class ConcreteLayout:
    """A layout with the size symbols substituted (what `strided_array` reads)."""
    __slots__ = ("shape", "strides", "offset")

    def __init__(self, layout, env: dict):
        self.shape = tuple(evaluate(s, env) for s in layout.shape)
        self.strides = tuple(evaluate(s, env) for s in layout.strides)
        self.offset = evaluate(layout.offset, env)


def _symbolic_args(a) -> bool:
    if isinstance(a, SizeExpr):
        return True
    if isinstance(a, StridedView):
        return a.layout.is_symbolic()
    if isinstance(a, (list, tuple)):
        return any(_symbolic_args(x) for x in a)
    if isinstance(a, dict):
        return any(_symbolic_args(x) for x in a.values())
    return False


def _getter(a, index: dict):
    """fn(arrays, env) -> the value of extern argument `a` at a call, built once when the graph is
    compiled; None when `a` is a constant (passed as it is). A StridedView becomes a view of its
    base's array, a Buffer that array, a SizeExpr its value; lists and tuples are rebuilt only when
    they hold something of these."""
    if isinstance(a, StridedView):
        i, lay = index[a.base.name], a.layout
        if lay.is_symbolic():
            return lambda arrays, env: strided_array(arrays[i], ConcreteLayout(lay, env))
        return lambda arrays, env: strided_array(arrays[i], lay)
    if isinstance(a, Buffer):
        i = index[a.name]
        return lambda arrays, env: arrays[i]
    if isinstance(a, SizeExpr):
        return lambda arrays, env: a.evaluate(env)
    if isinstance(a, (list, tuple)):
        parts = [(x, _getter(x, index)) for x in a]
        if all(g is None for _, g in parts):
            return None
        parts = [(None if g is not None else x, g) for x, g in parts]      # no IR node kept (see _arguments)
        kind = list if isinstance(a, list) else tuple
        return lambda arrays, env: kind([x if g is None else g(arrays, env) for x, g in parts])
    return None


def operand_source(a, index: dict):
    """(i, byte offset, byte strides) of an extern argument that is array `i` of the call's arrays as
    it is (offset and strides None) or a non-empty view of it with a static layout, else None: where
    a pointer can be read without making the view (extern_conv's planned convolutions)."""
    if isinstance(a, StridedView):
        lay = a.layout
        if lay.is_symbolic() or not all(lay.shape):
            return None
        it = a.dtype.itemsize
        return index[a.base.name], lay.offset * it, tuple(st * it for st in lay.strides)
    if isinstance(a, Buffer):
        return index[a.name], None, None
    return None


def _arguments(args: tuple, kwargs: dict, index: dict):
    """fn(arrays, env) -> (positional list, keyword dict) of an extern call: the constants placed once,
    the getters (`_getter`) filling in the rest."""
    fills = [(i, g) for i, a in enumerate(args) if (g := _getter(a, index)) is not None]
    kw_fills = [(k, g) for k, v in kwargs.items() if (g := _getter(v, index)) is not None]
    # the filled places hold None, not the IR buffers and views (which would keep the graph's lowering alive)
    filled, kw_filled = {i for i, _ in fills}, {k for k, _ in kw_fills}
    template = [None if i in filled else a for i, a in enumerate(args)]
    kw = {k: None if k in kw_filled else v for k, v in kwargs.items()}
    if not kw_fills:
        if len(fills) == len(template) and all(isinstance(args[i], Buffer) and not isinstance(args[i], StridedView)
                                               for i, _ in fills):
            at = [index[a.name] for a in args]            # every argument an array as it is
            return lambda arrays, env: ([arrays[i] for i in at], kw)

        def positional(arrays, env):
            vals = template.copy()
            for i, g in fills:
                vals[i] = g(arrays, env)
            return vals, kw
        return positional

    def both(arrays, env):
        vals = template.copy()
        for i, g in fills:
            vals[i] = g(arrays, env)
        d = kw.copy()
        for k, g in kw_fills:
            d[k] = g(arrays, env)
        return vals, d
    return both


def make_extern(ek, xp=np):
    """(fn, bases, symbolic): fn(*arrays of ek's input buffers, in `ek.inputs()` order) -> array or
    tuple of arrays; when `symbolic`, fn takes the size symbols' values {name: int} last. `xp` is
    the array namespace of the graph's device (NumPy, CuPy). How each argument is made from the
    arrays is worked out here, once (`_arguments`), not at each call."""
    bases = []
    index = {}
    for b in ek.inputs():
        if b.name not in index:
            index[b.name] = len(bases)
            bases.append(b)
    kernel = ek.op.kernel
    args, kwargs = ek.args, ek.kwargs
    multi = ek.layout is None
    if multi:
        layouts = {o.i: o.layout for o in ek.outputs}
        fixes = [conform(layouts.get(i)) for i in range(getattr(ek, "n_outputs", 0))]
    else:
        fix = conform(ek.layout)
    symbolic = _symbolic_args(args) or _symbolic_args(kwargs)
    conv = _packed_convolution(ek) if xp is np and not multi and not kwargs and not symbolic else None
    if conv is not None:
        operands = _arguments(tuple(args[:3]), {}, index)

        def packed_call(*arrays):
            x, _, bias = operands(arrays, None)[0]
            return fix(conv(x, bias))
        return packed_call, bases, False
    if xp is np and getattr(ek.op, "name", None) in ("mm", "bmm") and not kwargs and not symbolic and \
            all(isinstance(a, (Buffer, StridedView)) and a.dtype in _BLAS_DTYPES for a in args):
        return _matmul_extern(args, index), bases, False   # straight to BLAS (shapes and dtypes are static)
    arguments = _arguments(tuple(args), kwargs or {}, index)

    def call(*arrays):
        env = None
        if symbolic:
            arrays, env = arrays[:-1], arrays[-1]
        vals, kw = arguments(arrays, env)
        r = kernel(xp, *vals, **kw)
        if multi:
            return tuple(f(x) if x is not None and not isinstance(x, (int, float, bool)) else x
                         for f, x in zip(fixes, r)) + tuple(r[len(fixes):])
        return fix(r)
    if xp is not np and getattr(ek.op, "name", None) in extern_gemm.PRODUCTS and not kwargs and not symbolic and \
            len(args) == 2 and all(isinstance(a, (Buffer, StridedView)) for a in args):
        return extern_gemm.planned_product(args, index, lambda arrays: arguments(arrays, None)[0], call), bases, False
    if xp is not np and getattr(ek.op, "name", None) in extern_conv.CONVOLUTIONS and not kwargs and not symbolic \
            and not multi:
        return extern_conv.planned_convolution(ek.op.name, arguments, call, empty_of(xp),
                                               [operand_source(a, index) for a in args[:2]]), bases, False
    return call, bases, symbolic


_BLAS_DTYPES = (D.float32, D.float64)


def _matmul_extern(args, index):
    """np.matmul on the operands as arrays: a product planned once for its fixed layouts
    (`cpu_kernels.gemm_plan`, handed the operands' base arrays as they are), else `cpu_kernels.matmul`
    on views built with the fast constructor."""
    ia, ib = (index[a.base.name if isinstance(a, StridedView) else a.name] for a in args)
    weight = _constant_operand(args[1])
    if weight is not None and _plan_layout(args[0]) is not None:
        packed = cpu_kernels.gemm_plan_packed(_plan_layout(args[0]), weight)
        if packed is not None:
            return lambda *arrays: packed(arrays[ia])
    planned = cpu_kernels.gemm_plan(*[_plan_layout(a) for a in args]) if all(
        _plan_layout(a) is not None for a in args) else None
    if planned is not None:
        if (ia, ib) == (0, 1):
            return planned                # the wrapper's arguments are the two bases, in order
        return lambda *arrays: planned(arrays[ia], arrays[ib])

    def operand(a):
        i = index[a.base.name if isinstance(a, StridedView) else a.name]
        if isinstance(a, StridedView):
            lay = a.layout
            return lambda arrays: strided_array(arrays[i], lay)
        return lambda arrays: arrays[i]
    fa, fb = operand(args[0]), operand(args[1])
    matmul = cpu_kernels.matmul

    def call(*arrays):
        return matmul(fa(arrays), fb(arrays))
    return call


def _constant_operand(a, ndim: int = 2):
    """The array of a product's right operand (a convolution's weight: `ndim` 3 or 4) when it is a frozen
    weight (`config.freezing`) of a static layout and `config.prepack_weights` is on: its GEMM panels are
    then packed once. (Without freezing a graph's constants are read live, so a weight changed in place
    stays seen.)"""
    base = a.base if isinstance(a, StridedView) else a
    if not (config.prepack_weights and config.freezing and isinstance(base, InputBuffer) and getattr(base, "constant", None) is not None
            and a.dtype == D.float32 and len(a.layout.shape) == ndim and not a.layout.is_symbolic()):
        return None
    return strided_array(base.constant._data, a.layout) if isinstance(a, StridedView) else base.constant._data


def _packed_convolution(ek):
    """fn(x, bias) -> y for a float32 1-D or 2-D convolution of groups 1 whose weight is a frozen constant
    (`_constant_operand`): the weight's tiles packed once, here (`cpu_kernels.conv2d_plan_packed`; a 1-D
    one as the 2-D convolution of its (N, C, 1, L) view), where the eager kernel packs them per call.
    None for any other extern."""
    if getattr(ek.op, "name", None) != "convolution":
        return None
    x, w, bias, stride, padding, dilation, transposed, _, groups = ek.args
    nd = len(w.layout.shape) - 2
    if transposed or groups != 1 or nd not in (1, 2) or x.dtype != D.float32 or \
            (bias is not None and bias.dtype != D.float32):
        return None
    weight = _constant_operand(w, nd + 2)
    if weight is None:
        return None
    one = nd == 1
    plan = cpu_kernels.conv2d_plan_packed(weight[:, :, None, :] if one else weight)
    if plan is None:
        return None
    stride, padding, dilation = (tuple(v) * nd if len(v) == 1 else tuple(v) for v in (stride, padding, dilation))
    if not one:
        return lambda x, b: plan(x, b, stride, padding, dilation)
    st, pd, dl = (1, stride[0]), (0, padding[0]), (1, dilation[0])

    def conv1d(x, b):
        y = plan(x[:, :, None, :], b, st, pd, dl)
        return y.reshape(y.shape[0], y.shape[1], y.shape[3])
    return conv1d


def _plan_layout(a):
    """(shape, element strides, element offset) of a matmul operand relative to the array the
    wrapper passes for it, or None where that array's layout is not known when compiling. A view
    is relative to its base's memory (as `strided_array` reads it); a graph input's strides are
    checked before the wrapper runs; every other buffer the wrapper makes is C-contiguous, and its
    layout must say so."""
    lay = a.layout
    if not isinstance(a, (StridedView, InputBuffer)) and not lay.is_contiguous():
        return None
    if lay.dtype != D.float32 or lay.is_symbolic():
        return None
    return lay.shape, lay.strides, lay.offset


def _poisoned(xp):
    """`empty` whose memory holds NaN (floats) or -1 (integers, True for bool; all bits set in an arena of
    bytes, a NaN to its float views): an element a kernel forgets to write shows instead of reading as
    the zeros fresh host pages happen to hold."""
    def empty(shape, dtype):
        a = xp.empty(shape, dtype)
        a.fill(np.nan if np.dtype(dtype).kind == "f" or np.dtype(dtype).name == "bfloat16" else
               255 if np.dtype(dtype) == np.uint8 else -1)
        return a
    return empty


def in_place_writes(graph, order, input_writes: dict) -> dict:
    """{output buffer name: graph InputBuffer} of the outputs whose value the caller copies into an input
    (`input_writes`: output index -> input position, AOT autograd's mutated inputs) that the kernel
    computing them may store straight into that input: a pointwise buffer of the input's contiguous
    layout, returned once; the input neither returned nor read after that kernel, and in it read only
    by that buffer's own element function at the element it writes (so each element is read before it
    is overwritten). The wrapper still checks per call that no other input shares the input's memory
    (`unaliased`)."""
    outs = graph.outputs if isinstance(graph.outputs, list) else [graph.outputs]
    flat = graph.flat_outputs()
    inputs = {b.position: b for b in graph.inputs if b.position is not None}
    step_of = {b.name: i for i, k in enumerate(order) if not hasattr(k, "node") for b in k.stores}
    found: dict = {}
    for j, pos in input_writes.items():
        o, inp = outs[j] if j < len(outs) else None, inputs.get(pos)
        if not isinstance(o, ComputedBuffer) or not isinstance(o.data, Pointwise) or inp is None or \
                o.name not in step_of or pos in graph.mutations or inp in found.values():
            continue
        lay, il = o.layout, inp.layout
        if graph.dynamic or lay.dtype != il.dtype or tuple(lay.shape) != tuple(il.shape) or not lay.is_contiguous() or \
                not il.is_contiguous() or il.offset != 0 or sum(x is o for x in flat) != 1 or \
                any(x is inp or (isinstance(x, StridedView) and x.base is inp) for x in flat):
            continue
        i = step_of[o.name]
        later = (k.node.inputs() if hasattr(k, "node") else k.loads for k in order[i + 1:])
        if any(inp.name == b.name for reads in later for b in reads):
            continue
        if any(n.buf is not o and inp.name in n.read_names for n in order[i].nodes) or \
                inp.name in getattr(order[i], "operand_names", ()):     # a product template's operands (mm_template.py)
            continue
        own = [idx.key() for b, idx in o.data.reads() if b.name == inp.name]
        aligned = analyse(inp.make_loader(), o.data.ranges).loads[0][1].key()
        if all(key == aligned for key in own):
            found[o.name] = inp
    return found


def _owner(a):
    """What owns an array's memory: a NumPy array's last base; a CuPy array's allocation (`data.mem`,
    shared by every array made on its memory, even ones CuPy records no base for)."""
    if isinstance(a, np.ndarray):
        b = a.base
        while b is not None:
            a, b = b, getattr(b, "base", None)
        return a
    return a.data.mem


def unaliased(written: tuple, others: tuple) -> bool:
    """Whether the arrays of the inputs a graph writes in place have memory of their own: no two of
    them, and no other input, share an owner (`_owner`)."""
    ids = {id(_owner(w)) for w in written}
    if len(ids) != len(written):
        return False
    return not any(id(_owner(a)) in ids for a in others)


def unaliased_device(written: tuple, others: tuple) -> bool:
    """`unaliased` for device (CuPy) arrays, whose owner is their allocation (`data.mem`): read inline,
    a set and one membership test per input (a graph's inputs are a model's parameters: hundreds)."""
    owners = {id(a.data.mem) for a in written}
    if len(owners) != len(written):
        return False
    return owners.isdisjoint([id(a.data.mem) for a in others])


def kernel_error(code: int):
    """Raise what eager PyTorch raises for an error a generated kernel recorded."""
    if code == 1:
        raise IndexError("index out of range in self (an index read by a compiled kernel is out of bounds)")
    if code == 2:
        raise RuntimeError("ZeroDivisionError")
    if code == 3:
        raise RuntimeError("index out of bounds in scatter (an index stored to by a compiled kernel is out of "
                           "range of its dimension)")
    raise RuntimeError(f"compiled kernel reported error code {code}")


def guard_checker(shape_env, names: list):
    """ok(values) -> whether the tracer's guards over these symbols hold (values in `names` order);
    cached per distinct values, so sympy runs once per new size."""
    guards = []
    if shape_env is not None:                # (sizes pinned by a guard are constants in the graph)
        repl = replacements(shape_env)
        guards = [g.xreplace(repl) if repl else g for g in shape_env.guards]
        guards = [g for g in guards if {s.name for s in g.free_symbols} <= set(names)]
    cache: dict = {}

    def ok(values: tuple) -> bool:
        r = cache.get(values)
        if r is None:
            import sympy  # deferred: sympy is slow to import
            subs = {sympy.Symbol(n, integer=True, positive=True): sympy.Integer(v) for n, v in zip(names, values)}
            r = cache[values] = all(bool(g.xreplace(subs)) for g in guards)
        return r
    return ok


class WrapperCodegen:
    def __init__(self, graph, order, memory, backend, kernels_ns, size_names=(), eager=None, device=CPU,
                 input_writes=None, saved=None):
        self.g = graph
        self.order = order
        self.mem = memory
        self.backend = backend
        self.device = device
        self.xp = np if device.type == "cpu" else _backends.get(device.type).xp
        self.ns = {"np": np, "_empty": _poisoned(self.xp) if config.poison_buffers else empty_of(self.xp),
                   "_T": Tensor._make, "_dev": device,
                   "_strided": strided_array, "_Concrete": ConcreteLayout, "_copyto": self.xp.copyto}
        self.kernels_ns = kernels_ns
        self.lines: list = []
        self.size_names = list(size_names)
        self.eager = eager
        self.arena: dict = {}           # kernel temporary -> byte offset in the call's arena (`_plan_arena`)
        self.raw: set = set()           # arena temporaries passed as addresses (`_raw_temporaries`)
        # a forward graph's (first output saved for the backward only, positions among the saved ones that
        # its backward returns as gradients), or None
        self.saved = saved
        self.saved_arena: dict = {}     # saved activation -> byte offset in the call's saved arena
        self._stored: dict = {}         # buffer a kernel stores -> its shape
        self._fresh: dict = {}          # buffer allocated by a line `name = _empty(...)` -> (line index, dtype source)
        self._reshaped: set = set()     # id of each output view made by allocating its base in its shape
        # output buffer -> the graph input its value is written into (`_in_place`)
        self.in_place: dict = in_place_writes(graph, order, input_writes or {}) if input_writes else {}

    def _dtype(self, dt) -> str:
        name = f"_dt_{dt.name}"
        self.ns[name] = dt.np
        return name

    def _objects(self) -> bool:
        """Whether kernels take their arrays as objects (`<kernel>_obj`, see codegen_cpp.DATA_OFFSET)."""
        return self.backend == "cpp" and codegen_cpp.DATA_OFFSET is not None

    def _ptr(self, name) -> str:
        return f"{name}.ctypes.data" if self.backend == "cpp" and not self._objects() else name

    def generate(self) -> str:
        g, L = self.g, self.lines
        inputs = g.inputs
        L.append("def call(args):")
        positions = sorted({b.position for b in inputs} | {p for p, d, _ in g.size_inputs if d is None})
        if positions:
            L.append(f"    {', '.join(f'_in{p}' for p in positions)}{',' if len(positions) == 1 else ''} = args")
            for b in inputs:
                L.append(f"    {b.name} = _in{b.position}._data")
        if g.dynamic:
            self._bind_sizes()
        deferred = False
        if self.backend == "triton" and any(isinstance(s, Kernel) and self.kernels_ns[s.name].error_flag
                                             for s in self.order):
            self.ns["_kernel_error"] = kernel_error
            if self.xp is np:
                self.ns["_zeros"] = self.xp.zeros
                L.append("    _err = _zeros(1, np.int32)")
            else:                     # cuda: raised at the next synchronisation, no host read per call
                deferred = True
                self.ns["_err"] = device_checks.graph_error_flag(self.xp, self.device.index or 0, kernel_error)
                self.ns["_flag_pending"] = device_checks.flag_pending
        for name, c in g.constants.items():
            self.ns[f"_c_{name}"] = c.constant
            L.append(f"    {name} = _c_{name}._data")
        self._plan_arena()
        if self.in_place:
            written = {inp.name for inp in self.in_place.values()}
            self.ns["_unaliased"] = unaliased if self.xp is np else unaliased_device
            L.append(f"    _own = _unaliased(({''.join(f'{b.name}, ' for b in g.inputs if b.name in written)}), "
                     f"({''.join(f'{b.name}, ' for b in g.inputs if b.name not in written)}))")
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
        if "_zeros" in self.ns:
            L.append("    if _err[0]:")
            L.append("        _kernel_error(int(_err[0]))")
        if deferred:
            L.append("    _flag_pending(_err)")
        for pos, buf in g.mutations.items():         # graph inputs written by copy_: into the caller's tensor
            L.append(f"    _copyto(_in{pos}._data, {buf.name})")
        L.append(f"    return {self._outputs()}")
        return "\n".join(L) + "\n"

    def _bind_sizes(self):
        """Read each size symbol from where it lives; run eagerly unless every input is as assumed."""
        g, L = self.g, self.lines
        where = {}
        for pos, dim, e in g.size_inputs:
            if isinstance(e, SizeExpr) and len(e.terms) == 1 and e.terms[0][1] == 1 and len(e.terms[0][0]) == 1:
                name = e.terms[0][0][0]
                if name not in where:
                    where[name] = f"_in{pos}" if dim is None else f"arg{pos}.shape[{dim}]"
        for name in self.size_names:
            d = derived_definition(name)
            if d is None:
                L.append(f"    {name} = {where[name]}")
            else:
                L.append(f"    {name} = {expr_to_python(d, {sym: sym.name for sym in d.free_symbols})}")
        checks = [f"{name} < 2" for name in self.size_names if derived_definition(name) is None]
        for b in g.inputs:
            lay, it = b.layout, b.dtype.itemsize
            checks.append(f"{b.name}.shape != {_tuple_src(lay.shape)}")
            dims = [d for d, s in enumerate(lay.shape) if not (isinstance(s, int) and s <= 1)]
            if dims and 0 not in lay.shape:          # (the strides of an empty array are arbitrary)
                checks.append(f"({b.name}.size and ({''.join(f'{b.name}.strides[{d}], ' for d in dims)}) != "
                              f"({''.join(f'{_src(lay.strides[d] * it)}, ' for d in dims)}))")
        for pos, dim, e in g.size_inputs:
            if dim is None:
                checks.append(f"_in{pos} != {_src(e)}")
        base = [n for n in self.size_names if derived_definition(n) is None]
        self.ns["_guards_ok"] = guard_checker(g.shape_env, base)
        self.ns["_eager"] = self.eager
        sizes = "".join(f"{n}, " for n in base)
        if base:
            checks.append(f"not _guards_ok(({sizes}))")
        if checks:
            L.append(f"    if {' or '.join(checks)}:")
            L.append("        return _eager(*args)")
        L.append(f"    _S = {{{', '.join(f'{n!r}: {n}' for n in self.size_names)}}}")

    def _plan_arena(self):
        """On a device in `config.arena_devices`, a graph with static sizes allocates one arena per call
        and makes each kernel temporary a view of it at its planned offset (scheduler.plan_arena)."""
        self.arena: dict = {}
        if self.g.dynamic or self.device.type not in config.arena_devices:
            return
        offsets, total = plan_arena(self.order, self.mem)
        if offsets:
            self.arena = offsets
            self.ns["_u8"], self.ns["_nd"] = np.uint8, self.xp.ndarray
            self.lines.append(f"    _arena = _empty(({total},), _u8)")
            self.lines.append("    _amem = _arena" if self.xp is np else "    _amem = _arena.data")
            self._raw_temporaries()
        self._plan_saved_arena()

    def _raw_temporaries(self):
        """The arena temporaries that only Triton kernels launched straight from their pointers
        (`Launcher.direct`) store and read are their device addresses (ints), not arrays: no CuPy array
        made per temporary per call (`self.raw`; the launches take them as raw arguments)."""
        if self.backend != "triton" or self.xp is np:
            return
        users: dict = {}
        for step in self.order:
            if isinstance(step, Kernel):
                ok = self.kernels_ns[step.name].direct()
                for b in list(step.loads) + list(step.stores):
                    users[b.name] = users.get(b.name, True) and ok
            else:
                for b in step.node.inputs():
                    users[b.name] = False
        self.raw = {n for n in self.arena if users.get(n) and n not in self.in_place}
        if self.raw:
            self.lines.append("    _aptr = _amem.ptr")

    def _plan_saved_arena(self):
        """A training forward's activations saved for the backward only (outputs from `saved[0]` on that no
        output the caller sees is or views, nor a gradient the backward returns (`saved[1]`), stored by a
        kernel into a fresh buffer of their own) live from this call
        until the backward has run, all of them: they are views of one allocation per call, one after
        the other at `ARENA_ALIGN` offsets. The allocation is freed once the last of them is."""
        outs = self.g.outputs
        if self.saved is None or not isinstance(outs, list) or len(outs) <= self.saved[0]:
            return
        first, returned = self.saved
        # (an output the caller sees, a gradient, or a view of one, would keep the whole arena alive with it)
        apart = [o for o in outs[:first]] + [o for i, o in enumerate(outs[first:]) if i in returned]
        visible = {id(o.base if isinstance(o, StridedView) else o) for o in apart}
        saved = [o for o in outs[first:] if isinstance(o, Buffer) and id(o) not in visible]
        stored = {b.name for k in self.order if isinstance(k, Kernel) for b in k.stores}
        offsets, total, seen = {}, 0, set()
        for b in saved:
            act, other = self.mem["allocs"].get(b.name, (None, None))
            if b.name in seen or b.name not in stored or b.name in self.in_place or b.layout.is_symbolic() or \
                    act is None or (act == "reuse" and other not in self.arena) or not b.layout.numel:
                continue            # (a reused buffer is another's memory: see `_kernel`)
            seen.add(b.name)
            offsets[b.name] = total
            total += -(-b.layout.numel * b.dtype.itemsize // ARENA_ALIGN) * ARENA_ALIGN
        if len(offsets) < 2:
            return
        self.saved_arena = offsets
        self.ns["_u8"], self.ns["_nd"] = np.uint8, self.xp.ndarray
        self.lines.append(f"    _sarena = _empty(({total},), _u8)")
        self.lines.append("    _smem = _sarena" if self.xp is np else "    _smem = _sarena.data")

    def _kernel(self, k: Kernel):
        for b in k.stores:
            act, other = self.mem["allocs"][b.name]
            shape, dtype = _tuple_src(b.layout.shape), self._dtype(b.dtype)
            off = self.arena.get(b.name)
            inp = self.in_place.get(b.name)
            if inp is not None:          # stored into the input that receives it, when no other input aliases it
                self.lines.append(f"    {b.name} = {inp.name} if _own else _empty({shape}, {dtype})")
            elif b.name in self.raw:       # an address in the arena (`_raw_temporaries`)
                self.lines.append(f"    {b.name} = _aptr + {off}")
            elif off is not None:          # a view of the arena (NumPy: buffer and offset; CuPy: a memory pointer)
                at = f"_amem, {off}" if self.xp is np else f"_amem + {off}"
                self.lines.append(f"    {b.name} = _nd({shape}, {dtype}, {at})")
            elif b.name in self.saved_arena:    # a view of the saved activations' arena
                off = self.saved_arena[b.name]
                at = f"_smem, {off}" if self.xp is np else f"_smem + {off}"
                self.lines.append(f"    {b.name} = _nd({shape}, {dtype}, {at})")
            elif act == "reuse" and other not in self.arena:
                same = tuple(self._stored[other]) == tuple(b.layout.shape)
                self.lines.append(f"    {b.name} = {other}" if same else f"    {b.name} = {other}.reshape({shape})")
            else:
                self._fresh[b.name] = (len(self.lines), dtype)
                self.lines.append(f"    {b.name} = _empty({shape}, {dtype})")
            self._stored[b.name] = b.layout.shape
        args = [self._ptr(b.name) for b in k.loads] + [self._ptr(b.name) for b in k.stores]
        if self.backend == "triton":
            launcher = self.kernels_ns[k.name]
            names = [b.name for b in k.loads] + [b.name for b in k.stores]
            self.ns[k.name] = launcher.entry(tuple(i for i, n in enumerate(names) if n in self.raw))
            err = ["_err"] if launcher.error_flag else []
            self.lines.append(f"    {k.name}({', '.join(args + self.size_names + err)})")
            return
        fn = self.kernels_ns[k.name + "_obj" if self._objects() else k.name]
        if self.backend == "cpp":
            fn.argtypes = [ctypes.py_object if self._objects() else ctypes.c_void_p] * len(args) + \
                [ctypes.c_int64] * len(self.size_names)
            fn.restype = None
        args += self.size_names
        self.ns[k.name] = fn
        self.lines.append(f"    {k.name}({', '.join(args)})")

    def _extern(self, step: ExternStep):
        ek = step.node
        fn, bases, symbolic = make_extern(ek, self.xp)
        name = f"_extern_{ek.name}"
        self.ns[name] = fn
        call = f"{name}({', '.join([b.name for b in bases] + (['_S'] if symbolic else []))})"
        call += f"  # {getattr(ek.op, 'name', ek.op)}"
        if ek.layout is None:
            outs = [f"{ek.name}_{i}" if any(o.i == i for o in ek.outputs) else "_" for i in range(ek.n_outputs)]
            self.lines.append(f"    {', '.join(outs)}{',' if len(outs) == 1 else ''} = {call}")
        else:
            self.lines.append(f"    {ek.name} = {call}")

    def _out_expr(self, o) -> str:
        if isinstance(o, InputBuffer) and o.position is not None:
            return f"_in{o.position}"
        for pos, buf in self.g.mutations.items():     # copy_ returns the input it wrote
            if o is buf:
                return f"_in{pos}"
        if isinstance(o, SizeExpr):
            return _src(o)
        if isinstance(o, StridedView) and id(o) in self._reshaped:
            return f"_T({o.base.name}, _dev{self._known_dtype(o.base)})"
        if isinstance(o, StridedView):
            lay = o.layout
            name = f"_layout_{len(self.ns)}"
            self.ns[name] = lay
            if lay.is_symbolic():
                return f"_T(_strided({o.base.name}, _Concrete({name}, _S)), _dev)"
            dt = self._known_dtype(o.base)        # (a view's array has its base's dtype)
            if self.xp is not np:         # a device array's view: strides and offset in bytes worked out once
                self.ns[name] = device_view(lay, o.base.dtype.itemsize, _small_input(o.base))
                return f"_T({name}({o.base.name}), _dev{dt})"
            return f"_T(_strided({o.base.name}, {name}), _dev{dt})"
        if isinstance(o, (Buffer, MultiOutput)):
            return f"_T({o.name}, _dev{self._known_dtype(o)})"
        name = f"_const_{len(self.ns)}"
        self.ns[name] = o
        return name

    def _known_dtype(self, b) -> str:
        """", <name>" of the flambeau dtype of a buffer a kernel stores (its array made here of that dtype, or an
        input of it), passed to `Tensor._make` so that it need not look the array's dtype up; "" otherwise."""
        dt = getattr(b, "dtype", None)
        if b.name not in self._stored or dt is None or D.FROM_NP.get(dt.np) is not dt:
            return ""
        name = f"_fl_{dt.name}"
        self.ns[name] = dt
        return f", {name}"

    def _allocate_in_output_shape(self):
        """A Triton graph's kernels take their buffers as pointers only, so a buffer allocated here (`_empty`)
        whose one appearance among the outputs is a view of all of it in C order (a batch norm's (1, C, 1, 1)
        statistics returned as (C,)), and that no extern reads nor a `copy_` copies, is allocated in the
        view's shape and returned as it is: no view made per call (on cuda a CuPy array each)."""
        if self.backend != "triton" or self.g.dynamic:
            return
        flat = self.g.flat_outputs()
        seen: dict = {}
        for o in flat:
            base = o.base if isinstance(o, StridedView) else o
            seen[id(base)] = seen.get(id(base), 0) + 1
        extern_reads = {b.name for s in self.order if isinstance(s, ExternStep) for b in s.node.inputs()}
        copied = {b.name for b in self.g.mutations.values()}
        for o in flat:
            if not isinstance(o, StridedView) or o.base.name not in self._fresh or seen[id(o.base)] != 1:
                continue
            lay, base = o.layout, o.base
            if lay.is_symbolic() or not lay.is_contiguous() or lay.numel != base.layout.numel or \
                    lay.dtype != base.layout.dtype or base.name in extern_reads or base.name in copied:
                continue
            at, dtype = self._fresh[base.name]
            self.lines[at] = f"    {base.name} = _empty({_tuple_src(lay.shape)}, {dtype})"
            self._reshaped.add(id(o))

    def _outputs(self) -> str:
        self._allocate_in_output_shape()
        outs = self.g.outputs
        if isinstance(outs, list):
            return "(" + "".join(self._out_expr(o) + ", " for o in outs) + ")"
        return self._out_expr(outs)


KEPT_VIEW_BYTES = 1 << 16     # a graph input at most this large may be kept from one call to the next (`device_view`)


def _small_input(b) -> bool:
    """Whether an output view's base is a small graph input of a static layout (a batch norm's weight,
    returned as (1, C, 1, 1) for the backward): the same array call after call when it is a parameter, so
    its view is kept (`device_view(repeated=True)`), which keeps the input alive until the next call."""
    lay = b.layout
    return isinstance(b, InputBuffer) and not lay.is_symbolic() and lay.numel * b.dtype.itemsize <= KEPT_VIEW_BYTES


def _src(e) -> str:
    """Python source of an int | SizeExpr (the symbols are locals of `call`)."""
    return str(e)


def _tuple_src(shape) -> str:
    return repr(tuple(shape))          # SizeExpr's repr is its Python source
