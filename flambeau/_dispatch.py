"""The dispatcher: every operator call passes through `dispatch(op, args, kwargs)`.

Layers, top first:
  0. autocast (the thread's `_state.tls.autocast` non-empty): inputs cast by the op's mixed-precision
     policy (`flambeau.amp.autocast_mode.cast_inputs`), above the modes so that they see the casts;
  1. the thread's mode stack (`_state.tls.modes`): the innermost mode's `__torch_dispatch__` sees the call with
     itself popped, so calling the op again inside it goes to the next layer (vmap batching,
     functionalization, proxy tracing, fake tensors and user modes are all modes);
  2. autograd: when grad mode is on and an input requires grad, a graph node is recorded
     (`flambeau.autograd.graph.record`);
  3. the device backend: the op's kernel over the device's array namespace (NumPy, CuPy), or its
     meta function on `meta` tensors.
In-place ops (`add_`) run their functional op and copy the result into `self`; `out=` likewise.

Wrapper tensor subclasses (DTensor) hold no data of their own: their `_device` is `WRAPPER_DEVICE`, so
a call with one among its arguments reaches, below autograd, the class's
`__torch_dispatch__(op, types, args, kwargs)` instead of a kernel (PyTorch's Python dispatch key),
and an in-place result is written into one by its `_wrapper_write(res)`. A class that declares
`_wrapper_owns_autograd` (sparse tensors) is called above autograd instead: its handlers record their graph.
"""
from __future__ import annotations

import numpy as np
import warnings

from ._dtype import BOOL, FLOATING, COMPLEX
from . import _state
from ._fp_errors import (quiet as _fp_quiet, restore as _fp_restore, run_quiet as _run_quiet,
                         context_taken as _fp_context_taken)
from ._tags import Tag
from ._tensor import Tensor
from ._backends import MetaArray, array_namespaces as _XP, get as _backend
from ._device import canonical, device as Device, QUANTIZED_CPU

_ndarray = np.ndarray
_tls = _state.tls
WRAPPER_DEVICE = object.__new__(Device)            # the `_device` of every wrapper subclass tensor
object.__setattr__(WRAPPER_DEVICE, "type", "wrapper")
object.__setattr__(WRAPPER_DEVICE, "index", None)
# The layers above register here when they are imported (this module imports none of them):
_graph = None          # flambeau.autograd.graph: record, record_not_implemented, record_inplace
_forward_ad = None     # flambeau.autograd.forward_ad: propagate, set_inplace_tangent
_cast_inputs = None    # flambeau.amp.autocast_mode.cast_inputs
_call_composite = None # flambeau.amp.autocast_mode.call_composite


def register_autograd(graph, forward_ad) -> None:
    """Called by `flambeau.autograd` at import: the modules that record reverse-mode graph nodes
    and propagate forward-mode tangents for every differentiable call."""
    global _graph, _forward_ad
    _graph, _forward_ad = graph, forward_ad
    Tensor._refresh_view = staticmethod(graph.refresh_view)


def register_autocast(cast_inputs, call_composite) -> None:
    """Called by `flambeau.amp.autocast_mode` at import: `cast_inputs(op, args, kwargs)` runs on
    every call while an autocast region is active, `call_composite(op, fn, args, kwargs)` on every
    call of a Python composite with an autocast policy (`_registry.autocast_policy`)."""
    global _cast_inputs, _call_composite
    _cast_inputs, _call_composite = cast_inputs, call_composite


def dispatch(op, args, kwargs):
    """Run `op` on `args`/`kwargs` through the layers above. The hot callers (Tensor methods and
    operators, `Op.__call__`) skip this frame for a functional op called without keyword arguments
    while no mode is active and no autocast region casts its inputs (`op.autocast_tagged`), and call
    `call_functional` directly: keep the conditions there in step with the branches here."""
    if _state.interposed:
        t = _tls
        if t.autocast and op.autocast_tagged:
            args, kwargs = _cast_inputs(op, args, kwargs)
        if t.modes:
            return _to_mode(op, args, kwargs)
    if kwargs and "out" in kwargs:
        return _with_out(op, args, kwargs)
    if op.is_inplace:
        return _inplace(op, args, kwargs)
    return call_functional(op, args, kwargs)


def _to_mode(op, args, kwargs):
    mode = _state.pop_mode()
    try:
        types = tuple({type(t) for t in flat_tensors(args, kwargs)})
        return mode.__torch_dispatch__(op, types, args, kwargs or {})
    finally:
        _state.push_mode(mode)


def redispatch_below_modes(op, args, kwargs):
    """Run an op skipping the whole mode stack (what a mode calls to reach autograd + backend)."""
    saved = _state.set_modes(())
    try:
        return dispatch(op, args, kwargs)
    finally:
        _state.set_modes(saved)


def flat_tensors(args, kwargs=None):
    out = []
    for a in args:
        if isinstance(a, Tensor):
            out.append(a)
        elif type(a) in (list, tuple):
            out.extend(x for x in a if isinstance(x, Tensor))
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, Tensor):
                out.append(a)
            elif type(a) in (list, tuple):
                out.extend(x for x in a if isinstance(x, Tensor))
    return out


def _device_mismatch(op, d1, d2):
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                        f"{d1} and {d2}! (when checking argument for {op.__name__})")


def _scan(op, args, kwargs):
    """Find the device and autograd needs; return (uargs, ukwargs, device, requires_grad, fw).
    `call_functional` does the common case (positional arguments, one device object) itself; this is the
    general scan: tensors in lists and keyword arguments, several devices to reconcile."""
    dev = None
    rg = False
    fw = False
    uargs = list(args)
    tensors = None
    i = 0
    for a in args:
        if isinstance(a, Tensor):
            uargs[i] = a._data
            d = a._device
            if dev is None:
                dev = d
            elif d is not dev:
                tensors = True
            if a._requires_grad or _stale_view_requires_grad(a):
                rg = True
            if a._fw_grad is not None:
                fw = True
        elif (type(a) is list or type(a) is tuple) and _has_tensor(a):
            items = []
            for x in a:
                if isinstance(x, Tensor):
                    items.append(x._data)
                    if dev is None:
                        dev = x._device
                    elif x._device is not dev:
                        tensors = True
                    if x._requires_grad or (x._base is not None and x._version[0] != x._view_version
                                            and _graph.refresh_view(x)):     # `_stale_view_requires_grad`
                        rg = True
                    if x._fw_grad is not None:
                        fw = True
                else:
                    items.append(x)
            uargs[i] = type(a)(items)
        i += 1
    ukwargs = kwargs
    if kwargs:
        ukwargs = dict(kwargs)
        for k, a in kwargs.items():
            if isinstance(a, Tensor):
                tensors = True
                ukwargs[k] = a._data
            elif type(a) in (list, tuple) and _has_tensor(a):
                tensors = True
                ukwargs[k] = type(a)(x._data if isinstance(x, Tensor) else x for x in a)
    if tensors:
        # the slow path: tensors in lists/kwargs, or several device objects to reconcile
        dev, rg, fw, mixed = _scan_all(op, flat_tensors(args, kwargs))
        if mixed:
            uargs, ukwargs = _cpu_scalars_to_values(args, kwargs, uargs, ukwargs, dev)
    return uargs, ukwargs, dev, rg, fw


def _quantized_unsupported(op) -> NotImplementedError:
    """PyTorch's error for an op without a QuantizedCPU kernel: flambeau has none, so every op but
    the quantization functions themselves (`_ops/quantized_tensor.py`, which read the integers
    directly) refuses quantized tensors rather than computing on their integers."""
    return NotImplementedError(
        f"Could not run '{_aten_name(op)}' with arguments from the 'QuantizedCPU' backend: flambeau has no "
        f"quantized kernels. dequantize() the tensor, compute in floating point, and quantize the result again.")


def _aten_name(op) -> str:
    name = str(op)
    return "aten::" + name[len("aten."):] if name.startswith("aten.") else name


def _stale_view_requires_grad(t: Tensor) -> bool:
    """`t` is a view whose base changed in place since its node was recorded, and requires grad once
    its node is regenerated (`autograd.graph.refresh_view`): `a[:2]` after `a.add_(w)`."""
    return t._base is not None and t._version[0] != t._view_version and _graph.refresh_view(t)


def _has_tensor(seq) -> bool:
    for x in seq:                      # a loop, not any(<genexpr>): a generator costs more than a short list
        if isinstance(x, Tensor):
            return True
    return False


def _scan_all(op, tensors):
    dev = None
    mixed = rg = fw = False
    for t in tensors:
        d = t._device
        if d is QUANTIZED_CPU:
            if any(x._device is not QUANTIZED_CPU for x in tensors):
                other = next(x._dtype for x in tensors if x._device is not QUANTIZED_CPU)
                raise RuntimeError(f"{op.__name__}: promoteTypes with quantized numbers is not handled: a "
                                   f"{t._dtype} tensor meets a {other} one; dequantize() the quantized tensor first")
            raise _quantized_unsupported(op)
        if dev is None:
            dev = d
        elif d != dev and (d is WRAPPER_DEVICE or dev is WRAPPER_DEVICE):
            dev = WRAPPER_DEVICE       # the wrapper subclass decides what a plain tensor beside it means
        elif d != dev:
            # a 0-dim cpu tensor may join an op on another device (PyTorch's cpu-scalar rule)
            if d.type == "cpu" and t._data.ndim == 0:
                mixed = True
            elif dev.type == "cpu" and all(x._device == d or (x._device.type == "cpu" and x._data.ndim == 0)
                                           for x in tensors):
                dev = d
                mixed = True
            else:
                raise _device_mismatch(op, dev, d)
        if t._requires_grad or _stale_view_requires_grad(t):
            rg = True
        if t._fw_grad is not None:
            fw = True
    return dev, rg, fw, mixed


def _cpu_scalars_to_values(args, kwargs, uargs, ukwargs, dev):
    def conv(a, u):
        if isinstance(a, Tensor) and a._device != dev and a._data.ndim == 0:
            return a._data[()]
        return u
    uargs = [conv(a, u) for a, u in zip(args, uargs)]
    if kwargs:
        ukwargs = {k: conv(kwargs[k], u) for k, u in ukwargs.items()}
    return uargs, ukwargs


def _factory_device(op, args, kwargs):
    try:
        bound = op.bind(*args, **kwargs)
        names = [a.name for a in op._schema.args]
        d = bound[names.index("device")] if "device" in names else None
    except TypeError:
        d = kwargs.get("device") if kwargs else None
    if d is None:
        d = _tls.default_device
    return canonical(d)


def call_functional(op, args, kwargs, record=True):
    """Autograd and the backend kernel for a functional op (layers 2 and 3 of the module docstring)."""
    # The common case of `_scan`, inlined (this runs on every op): positional arguments, tensors on
    # one device object, no tensor inside a list; anything else goes to `_scan`.
    dev = None
    rg = fw = general = False
    uargs = list(args)
    i = 0
    for a in args:
        if isinstance(a, Tensor):
            uargs[i] = a._data
            if dev is None:
                dev = a._device
            elif a._device is not dev:
                general = True
            if a._requires_grad or (a._base is not None and a._version[0] != a._view_version
                                    and _graph.refresh_view(a)):     # `_stale_view_requires_grad`, inlined
                rg = True
            if a._fw_grad is not None:
                fw = True
        elif type(a) is list or type(a) is tuple:
            for x in a:
                if isinstance(x, Tensor):
                    general = True
                    break
        i += 1
    ukwargs = kwargs
    if kwargs and not general:
        # keyword arguments holding no tensor (dim=, dtype=, keepdim=) leave the scan above complete
        for a in kwargs.values():
            if isinstance(a, Tensor) or ((type(a) is list or type(a) is tuple) and _has_tensor(a)):
                general = True
                break
    if general:
        uargs, ukwargs, dev, rg, fw = _scan(op, args, kwargs)
    if dev is QUANTIZED_CPU:
        raise _quantized_unsupported(op)
    if dev is WRAPPER_DEVICE and record and _wrapper_class(args, kwargs)._wrapper_owns_autograd:
        return _wrapper_call(op, args, kwargs)      # sparse tensors: their handlers record their own graph
    if (rg or fw) and record and op.derivative is None and op.decomposition is not None and _tls.grad_enabled:
        # no derivative formula: differentiate through the decomposition (its ops have formulas),
        # unless it declines these inputs (NotImplemented): then the op runs and backward raises
        r = op.decomposition(*args, **(kwargs or {}))
        if r is not NotImplemented:
            return r
    if dev is None:
        dev = _factory_device(op, args, kwargs)
    if op.out_device is not None or dev.type == "meta" or op.kernel is None or dev is WRAPPER_DEVICE:
        out = _unusual_call(op, args, kwargs, uargs, ukwargs, dev)
    else:
        xp = _XP.get(dev.type) or _backend(dev.type).xp
        kernel = op.kernel
        # CPython 3.11 runs a call with a fixed number of arguments in the caller's loop; a call with
        # *args goes through C and a new interpreter loop (~1000 instructions more)
        n = len(uargs)
        if op.quiet_fp_errors and dev.type != "cuda":
            # inf/nan results are silent, as in PyTorch: NumPy's FP warnings are off inside the kernel
            # (`_fp_errors.run_quiet`; views and ops tagged no_fp_errors compute nothing that can raise,
            # and cuda kernels: CuPy's device arithmetic raises no NumPy FP errors)
            try:
                if ukwargs:
                    r = _run_quiet(kernel, xp, *uargs, **ukwargs)
                elif n == 2:
                    r = _run_quiet(kernel, xp, uargs[0], uargs[1])
                elif n == 1:
                    r = _run_quiet(kernel, xp, uargs[0])
                else:
                    r = _run_quiet(kernel, xp, *uargs)
            except RuntimeError as e:
                if not _fp_context_taken(e):
                    raise
                r = _run_kernel(op, xp, uargs, ukwargs)
        elif ukwargs:
            r = kernel(xp, *uargs, **ukwargs)
        elif n == 2:
            r = kernel(xp, uargs[0], uargs[1])
        elif n == 1:
            r = kernel(xp, uargs[0])
        else:
            r = kernel(xp, *uargs)
        tr = type(r)
        # an array (NumPy's, or an accelerator's that `_wrap` has seen: CuPy's) becomes a Tensor here
        out = Tensor._make(r, dev) if tr is _ndarray or tr in device_array_types else _wrap(r, dev)
        if op.return_type is not None and type(out) is tuple:
            out = op.return_type(*out)
    if op.is_view:
        _mark_views(args[0] if args else kwargs["self"], out, op)
    if record and (rg or fw):
        if rg and _tls.grad_enabled:
            if op.derivative is not None:
                _graph.record(op, args, kwargs, out)
            elif not _nondiff(op):
                _graph.record_not_implemented(op, args, kwargs, out)
        if fw and _tls.fwd_grad_enabled:
            _forward_ad.propagate(op, args, kwargs, out)
    return out


def use_kernel_runner(run):
    """Make `run` (an `_fp_errors.run_quiet`-like callable: `run(kernel, *args)`) the one eager kernels
    quiet about FP errors are called through; returns the previous one, to be put back the same way."""
    global _run_quiet
    previous, _run_quiet = _run_quiet, run
    return previous


def _run_kernel(op, xp, uargs, ukwargs):
    """The op's kernel on unwrapped arguments, NumPy's FP errors silenced by setting the error state
    (where `_fp_errors.run_quiet`'s context is taken: another thread's kernel, or an op run by a kernel)."""
    token = _fp_quiet() if op.quiet_fp_errors else None
    try:
        return op.kernel(xp, *uargs, **(ukwargs or {}))
    finally:
        if token is not None:
            _fp_restore(token)


def _unusual_call(op, args, kwargs, uargs, ukwargs, dev):
    """`call_functional` on a meta device, for an op whose output device is its own (`out_device`),
    for one without a kernel, or with a wrapper subclass tensor among the arguments."""
    if dev is WRAPPER_DEVICE:
        out = _wrapper_call(op, args, kwargs)
        if op.return_type is not None and type(out) is tuple:
            out = op.return_type(*out)
        return out
    out_dev = op.out_device(*args, **(kwargs or {})) if op.out_device is not None else dev
    if dev.type == "meta" or out_dev.type == "meta":
        out = _meta_call(op, args, kwargs, out_dev)
    elif op.kernel is None:
        raise NotImplementedError(f"Could not run 'aten::{op.name}' with arguments from the "
                                  f"'{dev.type.upper()}' backend: it has no kernel.")
    else:
        out = _wrap(_run_kernel(op, _XP.get(dev.type) or _backend(dev.type).xp, uargs, ukwargs), out_dev)
    if op.return_type is not None and type(out) is tuple:
        out = op.return_type(*out)
    return out


def _wrapper_class(args, kwargs) -> type:
    return next(type(t) for t in flat_tensors(args, kwargs) if t._device is WRAPPER_DEVICE)


def _wrapper_call(op, args, kwargs):
    tensors = flat_tensors(args, kwargs)
    cls = next(type(t) for t in tensors if t._device is WRAPPER_DEVICE)
    return cls.__torch_dispatch__(op, tuple({type(t) for t in tensors}), tuple(args), kwargs or {})


def _nondiff(op):
    return Tag.nondifferentiable in op.tags


device_array_types: set = set()   # array types of the accelerator backends seen by `_wrap` (cupy.ndarray)


def _wrap(r, dev):
    t = type(r)
    if t is _ndarray or t in device_array_types:
        return Tensor._make(r, dev)
    if t is tuple or t is list:
        make = Tensor._make
        return t([make(x, dev) if type(x) is _ndarray else _wrap(x, dev) for x in r])
    if isinstance(r, np.generic):
        return Tensor._make(np.asarray(r), dev)
    if r is None or isinstance(r, (int, float, bool, Tensor)):
        return r
    if hasattr(r, "__cuda_array_interface__") or type(r).__name__ == "ndarray":
        if t.__name__ == "ndarray":
            device_array_types.add(t)
        return Tensor._make(r, dev)
    return r


def _mark_views(base, out, op):
    b = base._base if base._base is not None else base
    if isinstance(out, Tensor):
        out._base = b
        out._version = base._version
        out._view_version = base._version[0]
        if not _tls.grad_enabled:
            out._view_untracked = True
            out._no_grad_view = ""
        elif base._no_grad_view is not None:
            out._no_grad_view = _graph.node_title(op)
    elif isinstance(out, (tuple, list)):
        plain = _tls.grad_enabled and base._no_grad_view is None
        version = base._version
        for o in out:                  # unbind/split: the tensor branch above per piece, inlined when plain
            if plain and type(o) is Tensor:
                o._base = b
                o._version = version
                o._view_version = version[0]
            else:
                _mark_views(base, o, op)


def _meta_call(op, args, kwargs, dev):
    if op.meta is None:
        raise NotImplementedError(f"Could not run 'aten::{op.name}' with arguments from the 'Meta' "
                                  f"backend: {op.name} has no meta function (its output shape depends on data).")
    spec = op.meta(*args, **(kwargs or {}))
    return spec_to_meta(spec, dev)


def spec_to_meta(spec, dev):
    if isinstance(spec, (tuple, list)):
        return type(spec)(spec_to_meta(s, dev) for s in spec)
    if spec is None:
        return None
    return Tensor._make(MetaArray(spec.shape, spec.dtype.np, spec.strides, spec.offset), dev, spec.dtype)


# ---- in-place and out= ------------------------------------------------------------------
_CAST_NAMES = {"bool": "Bool", "uint8": "Byte", "int8": "Char", "int16": "Short", "int32": "Int",
               "int64": "Long", "float16": "Half", "bfloat16": "BFloat16", "float32": "Float",
               "float64": "Double", "complex64": "ComplexFloat", "complex128": "ComplexDouble"}


def type_name(dt) -> str:
    return _CAST_NAMES.get(dt.name, dt.name)


def can_cast(src, dst) -> bool:
    """PyTorch's canCast: no complex->real, float->integral, or non-bool->bool."""
    if src.category == COMPLEX and dst.category != COMPLEX:
        return False
    if src.category == FLOATING and dst.category < FLOATING:
        return False
    if src.category != BOOL and dst.category == BOOL:
        return False
    return True


def _check_no_internal_overlap(t: Tensor):
    a = t._data
    if type(a) is MetaArray or a.size == 0:
        return
    _raise_if_overlapping(a.shape, a.strides)


def check_no_internal_overlap(t: Tensor):
    """PyTorch's assert_no_internal_overlap from sizes and strides alone (meta and fake tensors too):
    an in-place op may not write a tensor with a stride-0 dimension (an expanded one)."""
    _raise_if_overlapping(tuple(t.shape), t.stride())


def _raise_if_overlapping(shape, strides):
    if 0 in shape:
        return
    for s, st in zip(shape, strides):
        if st == 0 and s > 1:
            raise RuntimeError("unsupported operation: more than one element of the written-to tensor "
                               "refers to a single memory location. Please clone() the tensor before "
                               "performing the operation.")


def check_inplace_autograd(self: Tensor):
    if not _tls.grad_enabled:
        return
    if self._no_grad_view is not None and self._base._requires_grad:
        raise RuntimeError(_graph.no_grad_view_error(self, "is being modified inplace with grad mode enabled"))
    if self._requires_grad and self.grad_fn is None:
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
    b = self._base
    if b is not None and b._requires_grad and b._grad_fn is None:
        raise RuntimeError("a view of a leaf Variable that requires grad is being used in an in-place operation.")


def write_into(self: Tensor, res: Tensor, opname: str, overlap_ok: bool = False):
    """Copy `res` into `self` with PyTorch's in-place dtype and shape rules; `overlap_ok` lets a
    self whose elements share memory (an expanded tensor) be written, as PyTorch's fill_ does."""
    if self._device is WRAPPER_DEVICE:
        self._wrapper_write(res, opname)
        self._version[0] += 1
        return
    if not can_cast(res._dtype, self._dtype):
        raise RuntimeError(f"result type {type_name(res._dtype)} can't be cast to the desired output type "
                           f"{type_name(self._dtype)}")
    if res._data.shape != self._data.shape:
        raise RuntimeError(f"output with shape {list(self._data.shape)} doesn't match the broadcast shape "
                           f"{list(res._data.shape)}")
    if not overlap_ok:
        _check_no_internal_overlap(self)
    if self._device.type != "meta":
        if res._device != self._device:
            raise _device_mismatch(opname, self._device, res._device)
        dst = self._data
        src = res._data
        if res._dtype is self._dtype:
            _copy_same_dtype(dst, src)
        else:
            token = _fp_quiet()               # a cast that overflows gives inf silently, as in PyTorch
            try:
                dst[...] = src.astype(dst.dtype)
            finally:
                _fp_restore(token)
    self._version[0] += 1


def _copy_same_dtype(dst, src) -> None:
    """dst[...] = src for arrays of one dtype and shape; on cuda, two C-contiguous arrays are copied as
    one device-to-device memcpy on the current stream (a few us of host time, where CuPy's
    element-wise copy kernel costs a launch): every in-place op and out= write ends here."""
    if (type(dst) is not _ndarray and type(dst) in device_array_types and type(dst).__module__.startswith("cupy")
            and dst.flags.c_contiguous and src.flags.c_contiguous and dst.shape == src.shape and dst.nbytes):
        dptr, sptr = dst.data, src.data
        if dptr.ptr != sptr.ptr and dptr.device_id == sptr.device_id:
            dptr.copy_from_device_async(sptr, dst.nbytes)
            return
    dst[...] = src


def _inplace(op, args, kwargs):
    self = args[0] if args else kwargs["self"]
    if not isinstance(self, Tensor):
        raise TypeError(f"{op.__name__}(): argument 'self' must be Tensor, not {type(self).__name__}")
    if self._device is QUANTIZED_CPU:
        # PyTorch's in-place ops allocate their result with empty_strided, which refuses quantized tensors
        raise RuntimeError(f"{op.__name__}: in-place ops on quantized tensors are not supported "
                           f"({self._dtype}); dequantize() first")
    f = op.functional
    check_inplace_autograd(self)
    tensors = flat_tensors(args, kwargs)
    rg = _tls.grad_enabled and any(t._requires_grad or _stale_view_requires_grad(t) for t in tensors)
    fw = False
    for t in tensors:
        if t._fw_grad is not None:
            fw = True
            break
    orig = None
    if rg and self._base is not None:
        _graph.refresh_view(self)
    if rg and "self" in f.saved_names:
        orig = self.detach().clone() if self._device.type != "meta" else self.detach()
        orig._grad_fn, orig._output_nr, orig._requires_grad = self._grad_fn, self._output_nr, self._requires_grad
    res = call_functional(f, args, kwargs, False)
    if fw:
        _forward_ad.propagate(f, args, kwargs, res)
    write_into(self, res, op.__name__, Tag.overlap_ok in op.tags)
    if fw:
        _forward_ad.set_inplace_tangent(self, res._fw_grad)
    if rg:
        if orig is not None:
            args = (orig,) + tuple(args[1:]) if args else args
        _graph.record_inplace(f, args, kwargs, self)
    return self


def _with_out(op, args, kwargs):
    kwargs = dict(kwargs)
    out = kwargs.pop("out")
    if out is None:
        return dispatch(op, args, kwargs)
    if _tls.grad_enabled and any(t._requires_grad for t in flat_tensors(args, kwargs)):
        raise RuntimeError(f"{op.__name__}(): functions with out=... arguments don't support automatic "
                           "differentiation, but one of the arguments requires grad.")
    saved = _state.set_autocast({})      # out= variants are not autocast (PyTorch's rule)
    try:
        res = dispatch(op, args, kwargs)
    finally:
        _state.set_autocast(saved)
    if isinstance(out, (tuple, list)):
        for o, r in zip(out, res):
            resize_out(o, r)
        return type(res)(*out) if hasattr(res, "_fields") else tuple(out)
    resize_out(out, res)
    return out


def resize_out(out: Tensor, res: Tensor):
    if out._data.shape != res._data.shape:
        if out.numel() != 0:
            warnings.warn(f"An output with one or more elements was resized since it had shape "
                          f"{list(out.shape)}, which does not match the required output shape "
                          f"{list(res.shape)}. This behavior is deprecated.", UserWarning)
        xp = _backend(out._device.type).xp
        out._data = xp.empty(res._data.shape, dtype=out._data.dtype) if xp else \
            MetaArray(res._data.shape, out._data.dtype)
    if out._dtype is not res._dtype and not can_cast(res._dtype, out._dtype):
        raise RuntimeError(f"result type {type_name(res._dtype)} can't be cast to the desired output "
                           f"type {type_name(out._dtype)}")
    write_into(out, res, "out")
