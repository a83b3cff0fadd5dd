"""View and shape operators: view/reshape, transpose/permute, expand, squeeze/unsqueeze, narrow,
select, slicing, diagonal, unfold, as_strided, alias, plus clone/contiguous and dtype/device
conversion (`_to_copy`, `Tensor.to`). The split family and flatten/movedim live in `views_split`.

View ops return arrays sharing memory with their input (NumPy/CuPy strided views); the dispatcher
marks the output as a view (shared version counter, `_base`) because the schema says `Tensor(a)`.
Their meta functions compute strides the way PyTorch does.
"""
from __future__ import annotations

import numpy as np

from .. import _dtype as D
from .._tensor import Tensor, _ptr, storage_owner, contiguous_format, preserve_format, channels_last, channels_last_3d
from .._device import canonical, device as Device
from .._backends import MetaArray, contiguous_strides, cuda_cast, device_checks, get as backend, namespace_backend
from ._registry import defop, export, TensorSpec, Tag, PointwiseSpelling
from ._helpers import wrap_dim, direct_device, direct_call
from .memory_format import check_format, empty_strided_array, format_strides, suggest_memory_format
from .creation import zeros, arange, tensor
from .._dispatch import type_name, device_array_types, WRAPPER_DEVICE
from .._device import QUANTIZED_CPU
from .. import _dispatch, _fp_errors, _state
from .._backends import array_namespaces
from . import _batching, _registry, _sharding


def infer_size(shape, numel):
    """`shape` with its one -1 (if any) replaced so that the sizes multiply to `numel`; the checks in
    PyTorch's order (infer_size_impl)."""
    infer = None
    known = 1
    for i, s in enumerate(shape):
        if s == -1:
            if infer is not None:
                raise RuntimeError("only one dimension can be inferred")
            infer = i
        elif s < 0:
            raise RuntimeError(f"invalid shape dimension {s}")
        else:
            known *= s
    if infer is not None:
        if known == 0 or numel % known:
            raise RuntimeError(f"shape '{_fmt(shape)}' is invalid for input of size {numel}")
        shape = list(shape)
        shape[infer] = numel // known
    elif known != numel:
        raise RuntimeError(f"shape '{_fmt(shape)}' is invalid for input of size {numel}")
    return tuple(shape)


def _fmt(shape):
    return "[" + ", ".join(map(str, shape)) + "]"


def view_strides(oldshape, oldstride, newshape):
    """PyTorch's computeStride: strides of a view with `newshape`, or None when impossible."""
    if not oldshape:
        return tuple(1 for _ in newshape)
    numel = 1
    for s in oldshape:
        numel *= s
    if numel == 0:
        return contiguous_strides(newshape) if tuple(oldshape) != tuple(newshape) else tuple(oldstride)
    newstride = [0] * len(newshape)
    view_d = len(newshape) - 1
    chunk_base_stride = oldstride[-1]
    tensor_numel = 1
    view_numel = 1
    for tensor_d in range(len(oldshape) - 1, -1, -1):
        tensor_numel *= oldshape[tensor_d]
        if tensor_d == 0 or (oldshape[tensor_d - 1] != 1 and
                             oldstride[tensor_d - 1] != tensor_numel * chunk_base_stride):
            while view_d >= 0 and (view_numel < tensor_numel or newshape[view_d] == 1):
                newstride[view_d] = view_numel * chunk_base_stride
                view_numel *= newshape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = oldstride[tensor_d - 1]
                tensor_numel = 1
                view_numel = 1
    if view_d != -1:
        return None
    return tuple(newstride)


def _size_args(size):
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        return tuple(size[0])
    return tuple(size)


@defop("view(Tensor(a) self, SymInt[] size) -> Tensor(a)", function=False, tags=(Tag.core, Tag.recomputable))
def _view(xp, self, size):
    shape = infer_size(size, self.size)
    if self.flags.c_contiguous:
        return self.reshape(shape)                 # a contiguous array always reshapes to a view
    if type(self) is np.ndarray:
        try:
            return np.reshape(self, shape, copy=False)
        except ValueError:
            pass
    else:
        st = view_strides(self.shape, [s // self.itemsize for s in self.strides], shape)
        if st is not None:
            return xp.lib.stride_tricks.as_strided(self, shape, [s * self.itemsize for s in st])
    raise RuntimeError("view size is not compatible with input tensor's size and stride (at least one "
                       "dimension spans across two contiguous subspaces). Use .reshape(...) instead.")


@_view.def_meta
def _(self, size):
    shape = infer_size(size, self.numel())
    st = view_strides(self.shape, self.stride(), shape)
    if st is None:
        raise RuntimeError("view size is not compatible with input tensor's size and stride (at least one "
                           "dimension spans across two contiguous subspaces). Use .reshape(...) instead.")
    return TensorSpec(shape, self.dtype, st, self.storage_offset())


@_view.def_derivative
def _view_derivative(grad, self_meta):
    """The gradient reshaped to the input's shape (a copy where the strides allow no view, as
    `reshape`); on the array itself when nothing observes dispatch (`direct_device`)."""
    dev = direct_device(grad)
    if dev is not None:
        return Tensor._make(grad._data.reshape(tuple(self_meta.shape)), dev)
    return grad.reshape(self_meta.shape)


@export("view", method=True, function=False)
def view(self, *size, dtype=None):
    if len(size) == 1 and isinstance(size[0], D.dtype):
        return view_dtype(self, size[0])
    if dtype is not None:
        return view_dtype(self, dtype)
    return _view(self, _size_args(size))


def _check_view_dtype_sizes(self, dtype) -> None:
    """PyTorch's rules for viewing elements as a dtype of another size: the last dimension is
    contiguous and, for a larger dtype, its size, the other strides and the offset divide evenly."""
    how = f"to view {type_name(self.dtype)} as {type_name(dtype)} (different element sizes)"
    if self.ndim == 0:
        raise RuntimeError(f"self.dim() cannot be 0 {how}")
    if self.stride(-1) != 1:
        raise RuntimeError(f"self.stride(-1) must be 1 {how}, but got {self.stride(-1)}")
    if dtype.itemsize > self.dtype.itemsize:
        ratio = dtype.itemsize // self.dtype.itemsize
        if self.shape[-1] % ratio:
            raise RuntimeError(f"self.size(-1) must be divisible by {ratio} {how}, but got {self.shape[-1]}")
        if self.storage_offset() % ratio:
            raise RuntimeError(f"self.storage_offset() must be divisible by {ratio} {how}, "
                               f"but got {self.storage_offset()}")
        for d, st in enumerate(self.stride()[:-1]):
            if st % ratio:
                raise RuntimeError(f"self.stride({d}) must be divisible by {ratio} {how}, but got {st}")


def view_dtype(self, dtype):
    if dtype.itemsize != self.dtype.itemsize:
        _check_view_dtype_sizes(self, dtype)
    t = Tensor._make(self._data.view(dtype.np), self.device, dtype)
    t._base = self._base if self._base is not None else self
    t._version = self._version
    t._view_version = self._version[0]
    return t


@export("reshape", method=True)
def reshape(self, *shape):
    shape = _size_args(shape)
    new = infer_size(shape, self.numel())
    a = self._data if self._device is not WRAPPER_DEVICE else None     # a DTensor's _data is its local shard
    if (type(a) is np.ndarray or type(a) in device_array_types) and a.flags.c_contiguous:
        return _view(self, new)               # a contiguous array always has a view of any shape
    if view_strides(self.shape, self.stride(), new) is not None:
        return _view(self, new)
    return _view(self.clone(memory_format=_contig()), new)


def _contig():
    return contiguous_format


@export("view_as", method=True, function=False)
def view_as(self, other):
    return _view(self, tuple(other.shape))


@export("reshape_as", method=True, function=False)
def reshape_as(self, other):
    return reshape(self, tuple(other.shape))


@defop("transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a)", method=True, tags=(Tag.recomputable,))
def transpose(xp, self, dim0, dim1):
    n = self.ndim
    return xp.swapaxes(self, wrap_dim(dim0, n), wrap_dim(dim1, n)) if n else self.view()


@transpose.def_meta
def _(self, dim0, dim1):
    n = self.ndim
    d0, d1 = wrap_dim(dim0, n), wrap_dim(dim1, n)
    shape, st = list(self.shape), list(self.stride())
    if n:
        shape[d0], shape[d1] = shape[d1], shape[d0]
        st[d0], st[d1] = st[d1], st[d0]
    return TensorSpec(shape, self.dtype, st, self.storage_offset())


@transpose.def_derivative
def _transpose_derivative(grad, dim0, dim1):
    dev = direct_device(grad)
    if dev is not None:
        return direct_call(transpose, dev, grad._data, dim0, dim1)
    return grad.transpose(dim0, dim1)


@defop("permute(Tensor(a) self, int[] dims) -> Tensor(a)", function=False, tags=(Tag.core, Tag.recomputable))
def _permute(xp, self, dims):
    return xp.transpose(self, _perm(dims, self.ndim))


def _perm(dims, n):
    if len(dims) != n:
        raise RuntimeError(f"permute(sparse_coo): number of dimensions in the tensor input does not match "
                           f"the length of the desired ordering of dimensions i.e. input.dim() = {n} is not "
                           f"equal to len(dims) = {len(dims)}")
    p = tuple(wrap_dim(d, n) for d in dims)
    if len(set(p)) != n:
        raise RuntimeError("permute(): duplicate dims are not allowed.")
    return p


@_permute.def_meta
def _(self, dims):
    p = _perm(dims, self.ndim)
    return TensorSpec([self.shape[i] for i in p], self.dtype, [self.stride()[i] for i in p],
                      self.storage_offset())


@_permute.def_derivative
def _(grad, dims):
    p = _perm(dims, grad.ndim)
    inv = [0] * len(p)
    for i, d in enumerate(p):
        inv[d] = i
    return grad.permute(inv)


@export("permute", method=True)
def permute(self, *dims):
    return _permute(self, _size_args(dims))


def expand_shape(shape, size):
    size = list(size)
    if len(size) < len(shape):
        raise RuntimeError(f"expand(torch.FloatTensor{{{list(shape)}}}, size={size}): the number of sizes "
                           f"provided ({len(size)}) must be greater or equal to the number of dimensions in "
                           f"the tensor ({len(shape)})")
    off = len(size) - len(shape)
    out = []
    for i, s in enumerate(size):
        if i < off:
            if s < 0:
                raise RuntimeError(f"The expanded size of the tensor ({s}) isn't allowed in a leading, "
                                   "non-existing dimension 0")
            out.append(s)
        else:
            old = shape[i - off]
            if s == -1:
                s = old
            elif old != 1 and s != old:
                raise RuntimeError(f"The expanded size of the tensor ({s}) must match the existing size "
                                   f"({old}) at non-singleton dimension {i}.  Target sizes: {size}.  Tensor "
                                   f"sizes: {list(shape)}")
            out.append(s)
    return tuple(out)


def expand_strides(shape, strides, new):
    off = len(new) - len(shape)
    return tuple(0 if i < off or (shape[i - off] == 1 and new[i] != 1) else strides[i - off]
                 for i in range(len(new)))


@defop("expand(Tensor(a) self, SymInt[] size, *, bool implicit=False) -> Tensor(a)", function=False,
       tags=(Tag.core, Tag.recomputable))
def _expand(xp, self, size, *, implicit=False):
    new = expand_shape(self.shape, size)
    it = self.itemsize
    st = expand_strides(self.shape, [s // it for s in self.strides], new)
    return xp.lib.stride_tricks.as_strided(self, new, [s * it for s in st])


@_expand.def_meta
def _(self, size, *, implicit=False):
    new = expand_shape(self.shape, size)
    return TensorSpec(new, self.dtype, expand_strides(self.shape, self.stride(), new), self.storage_offset())


@_expand.def_derivative
def _(grad, self_meta):
    return grad.sum_to_size(self_meta.shape)


@export("expand", method=True, function=False)
def expand(self, *size, implicit=False):
    return _expand(self, _size_args(size), implicit=implicit)


@export("expand_as", method=True, function=False)
def expand_as(self, other):
    return _expand(self, tuple(other.shape))


@export("sum_to_size", method=True, function=False)
def sum_to_size(self, *size):
    shape = _size_args(size)
    if tuple(self.shape) == tuple(shape):
        return self
    nd = self.ndim - len(shape)
    dims = tuple(range(nd)) + tuple(nd + i for i, s in enumerate(shape) if s == 1 and self.shape[nd + i] != 1)
    r = self.sum(dims, keepdim=True) if dims else self
    return r.reshape(shape) if nd else r


@defop("clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor", method=True,
       tags=(Tag.core, Tag.recomputable, Tag.no_fp_errors))
def clone(xp, self, *, memory_format=None):
    if memory_format is None or memory_format is preserve_format:
        return xp.array(self, order="K", copy=True)     # dense: the same strides; else dense in their order
    if memory_format is contiguous_format:
        return xp.array(self, order="C", copy=True)
    check_format(memory_format, self.ndim, "clone")
    out = empty_strided_array(xp, self.shape, format_strides(self.shape, memory_format), self.dtype)
    out[...] = self
    return out


def preserved_strides(shape, strides) -> list:
    """PyTorch's preserve_format: dense strides that keep the order of the input's strides."""
    order = sorted(range(len(shape)), key=lambda i: -strides[i])
    st = [0] * len(shape)
    acc = 1
    for i in reversed(order):
        st[i] = acc
        acc *= max(shape[i], 1)
    return st


@clone.def_meta
def _clone_meta(self, *, memory_format=None):
    if memory_format is contiguous_format or (memory_format in (None, preserve_format) and self.is_contiguous()):
        return TensorSpec(self.shape, self.dtype)
    if memory_format in (None, preserve_format):
        return TensorSpec(self.shape, self.dtype, preserved_strides(self.shape, self.stride()))
    check_format(memory_format, self.ndim, "clone")
    return TensorSpec(self.shape, self.dtype, format_strides(self.shape, memory_format))


@clone.def_derivative
def _(grad):
    return grad


@export("contiguous", method=True, function=False)
def contiguous(self, memory_format=None):
    mf = memory_format or contiguous_format
    if self.is_contiguous(memory_format=mf):
        return self
    return clone(self, memory_format=mf)


# ---- dtype / device conversion -------------------------------------------------------------
def _target_device(self, *, dtype=None, device=None, non_blocking=False):
    return canonical(device) if device is not None else self.device


_CAST = "static_cast<{T}>({0})"


# as an element formula (the loop IR's `ops.to_dtype`): a cast to the result dtype, picked by its kind
@defop("_to_copy(Tensor self, *, ScalarType? dtype=None, Device? device=None, bool non_blocking=False) -> Tensor",
       function=False, out_device=_target_device, tags=(Tag.core, Tag.recomputable),
       pointwise=PointwiseSpelling({"bool": "({0} != 0)", "int": _CAST, "float": _CAST}, "{0}",
                                   {"bool": "({0} != 0)", "int": "{0}.to({T})", "float": "{0}.to({T})"},
                                   heavy=False, by_result=True))
def _to_copy(xp, self, *, dtype=None, device=None, non_blocking=False):
    src = self
    npdt = dtype.np if dtype is not None else self.dtype
    if device is not None:
        dev = canonical(device)
        if dev.type == "cuda" and xp is not np and (r := cuda_cast.cast(xp, src, npdt, dev.index)) is not None:
            return r                  # a cast on the array's own device (the derivative of a cast passes device=)
        if dev.type == "cpu":
            if type(src) is not np.ndarray and hasattr(src, "get"):
                src = src.get()
                device_checks.raise_pending()     # a synchronisation: report failed device-side checks
            elif type(src) is not np.ndarray:
                src = namespace_backend(xp).to_numpy(src)     # a third-party device
            return np.array(src, dtype=npdt, copy=True, order="K")
        if dev.type == "meta":
            estrides = src.estrides if isinstance(src, MetaArray) else [b // src.itemsize for b in src.strides]
            return MetaArray(src.shape, npdt, preserved_strides(src.shape, estrides))
        b = backend(dev.type)
        if type(src) is np.ndarray and dev.type == "cuda":
            import cupy  # deferred: optional dependency, present only where cuda is used
            with cupy.cuda.Device(dev.index or 0):
                return cupy.array(src.astype(npdt, copy=False), copy=True)
        return b.xp.array(src, dtype=npdt, copy=True)
    if xp is not np and (r := cuda_cast.cast(xp, src, npdt)) is not None:
        return r
    return xp.array(src, dtype=npdt, copy=True, order="K")


@_to_copy.def_meta
def _to_copy_meta(self, *, dtype=None, device=None, non_blocking=False):
    if self.is_contiguous():
        return TensorSpec(self.shape, dtype or self.dtype)
    return TensorSpec(self.shape, dtype or self.dtype, preserved_strides(self.shape, self.stride()))


@_to_copy.def_derivative
def _to_copy_derivative(grad, self_meta):
    """The gradient cast back to the input's dtype and device: on the same device, when nothing observes
    dispatch (`direct_device`), the kernel on the array (autocast's casts: one per weight and activation)."""
    dev = direct_device(grad)
    if dev is not None and (dev is self_meta.device or dev == self_meta.device):
        # no device=: on the array's own device the kernel casts there (`cuda_cast.cast` checks it is the
        # current one either way), as it would with device= naming it; on cuda the kernel's first case,
        # `cuda_cast.cast`, without its frames
        if dev.type == "cuda" and (r := cuda_cast.cast(array_namespaces["cuda"], grad._data,
                                                       self_meta.dtype.np)) is not None:
            return Tensor._make(r, dev)
        return direct_call(_to_copy, dev, grad._data, dtype=self_meta.dtype)
    return _to_copy(grad, dtype=self_meta.dtype, device=self_meta.device)


_to_copy_method = _to_copy


def _parse_to(args, kwargs):
    dtype = kwargs.pop("dtype", None)
    device = kwargs.pop("device", None)
    copy = kwargs.pop("copy", False)
    non_blocking = kwargs.pop("non_blocking", False)
    memory_format = kwargs.pop("memory_format", None)
    if kwargs:
        raise TypeError(f"to() received an invalid combination of arguments - got unexpected {list(kwargs)}")
    for a in args:
        if isinstance(a, D.dtype):
            dtype = a
        elif isinstance(a, Tensor):
            dtype, device = a.dtype, a.device
        elif isinstance(a, bool):
            if non_blocking is False:
                non_blocking = a
            else:
                copy = a
        elif a is not None:
            if isinstance(a, (str, Device, int)):
                device = a
            else:
                raise TypeError(f"to() received an invalid combination of arguments - got ({type(a).__name__})")
    return dtype, device, copy, non_blocking, memory_format


_DIRECT_CAST_DEVICES = ("cpu", "cuda")


def _cast_to(self: Tensor, dtype: D.dtype) -> Tensor:
    """`_to_copy(self, dtype=dtype)`: a cast on self's device (autocast casts a weight or an activation
    this way about 120 times a GPT-2 step). When nothing would see the dispatched call (no dispatch mode,
    no FX hook, no forward-mode tangent, a dense cpu or cuda tensor, not a view whose base changed in
    place since its node was recorded), this is what the dispatcher would do, without its frames: the
    kernel on self's array (NumPy's FP errors silenced on cpu), the result wrapped, and the graph node
    recorded when self requires grad; else the op is dispatched."""
    dev = self._device
    if ((_state.interposed and _state.tls.modes) or _registry._fx_hook is not None or self._fw_grad is not None
            or dev is QUANTIZED_CPU or dev.type not in _DIRECT_CAST_DEVICES
            or (self._base is not None and self._version[0] != self._view_version)):
        return _to_copy(self, dtype=dtype, device=None, non_blocking=False)
    xp = array_namespaces.get(dev.type) or backend(dev.type).xp
    if xp is np:
        token = _fp_errors.quiet()
        try:
            r = _to_copy.kernel(xp, self._data, dtype=dtype)
        finally:
            _fp_errors.restore(token)
    else:
        # `_to_copy`'s kernel without its frame for the case it would take first: `cuda_cast.cast`
        r = cuda_cast.cast(xp, self._data, dtype.np)
        if r is None:
            r = _to_copy.kernel(xp, self._data, dtype=dtype)
    tr = type(r)
    out = Tensor._make(r, dev) if tr is np.ndarray or tr in device_array_types else _dispatch._wrap(r, dev)
    if self._requires_grad and _state.tls.grad_enabled:
        # all four schema arguments positionally: `record` takes them as bound, as it would bind the call's
        _dispatch._graph.record_cast(_to_copy, (self, dtype, None, False), out)
    return out


@export("to", method=True, function=False)
def to(self, *args, **kwargs):
    """PyTorch's `Tensor.to`: `self` when nothing changes (for a memory format: when `self` already
    suggests it), else a copy; `memory_format=` lays the copy out in that format."""
    if not kwargs and len(args) == 1 and type(args[0]) is D.dtype:     # `t.to(dtype)`, autocast's cast
        if args[0] is self._dtype:
            return self
        return _cast_to(self, args[0])
    dtype, device, copy, non_blocking, mf = _parse_to(args, dict(kwargs))
    if device is not None:
        device = canonical(device)
    keep_format = mf is None or mf is preserve_format
    if mf is not None and not keep_format:
        check_format(mf, self.ndim, "to")
    same = (dtype is None or dtype is self.dtype) and (device is None or device == self.device)
    if same and not copy and (keep_format or suggest_memory_format(self) is mf):
        return self
    if keep_format:
        return _to_copy(self, dtype=dtype, device=device, non_blocking=non_blocking)
    if same:
        return clone(self, memory_format=mf)
    r = _to_copy(self, dtype=dtype, device=device, non_blocking=non_blocking)
    return r if r.is_contiguous(memory_format=mf) else clone(r, memory_format=mf)


def _conv(dtype):
    def f(self, memory_format=None):
        return to(self, dtype)
    return f


for _name, _dt in [("float", D.float32), ("double", D.float64), ("half", D.float16), ("bfloat16", D.bfloat16),
                   ("int", D.int32), ("long", D.int64), ("short", D.int16), ("char", D.int8),
                   ("byte", D.uint8), ("bool", D.bool), ("cfloat", D.complex64), ("cdouble", D.complex128)]:
    export(_name, method=True, function=False)(_conv(_dt))


@export("cpu", method=True, function=False)
def cpu(self, memory_format=None):
    return to(self, "cpu")


@export("cuda", method=True, function=False)
def cuda(self, device=None, non_blocking=False, memory_format=None):
    if isinstance(device, int):
        device = f"cuda:{device}"
    return to(self, device or "cuda", non_blocking=non_blocking)


@export("type_as", method=True, function=False)
def type_as(self, other):
    return to(self, other.dtype)


@defop("unsqueeze(Tensor(a) self, int dim) -> Tensor(a)", method=True, tags=(Tag.core, Tag.recomputable))
def unsqueeze(xp, self, dim):
    return xp.expand_dims(self, wrap_dim(dim, self.ndim + 1))


@unsqueeze.def_meta
def _(self, dim):
    d = wrap_dim(dim, self.ndim + 1)
    shape, st = list(self.shape), list(self.stride())
    shape.insert(d, 1)
    st.insert(d, st[d] * self.shape[d] if d < self.ndim else 1)
    return TensorSpec(shape, self.dtype, st, self.storage_offset())


@unsqueeze.def_derivative
def _(grad, dim):
    return grad.squeeze(dim)


@defop("squeeze.dims(Tensor(a) self, int[]? dim=None) -> Tensor(a)", function=False, tags=(Tag.core, Tag.recomputable))
def _squeeze(xp, self, dim=None):
    return xp.reshape(self, _squeezed(self.shape, dim, self.ndim)) if self.ndim else self.view()


def _squeezed(shape, dim, ndim):
    if dim is None:
        return tuple(s for s in shape if s != 1)
    dims = {wrap_dim(d, ndim) for d in ((dim,) if isinstance(dim, int) else dim)}
    return tuple(s for i, s in enumerate(shape) if not (i in dims and s == 1))


@_squeeze.def_meta
def _(self, dim=None):
    keep = [i for i, s in enumerate(self.shape) if not (s == 1 and (dim is None or i in
            {wrap_dim(d, self.ndim) for d in ((dim,) if isinstance(dim, int) else dim)}))]
    return TensorSpec([self.shape[i] for i in keep], self.dtype, [self.stride()[i] for i in keep],
                      self.storage_offset())


@_squeeze.def_derivative
def _(grad, self_meta):
    return grad.reshape(self_meta.shape)


@export("squeeze", method=True)
def squeeze(self, dim=None):
    return _squeeze(self, None if dim is None else ((dim,) if isinstance(dim, int) else tuple(dim)))


# ---- slicing views: slice, select, narrow, diagonal, unfold, as_strided --------------------------
def _sel(dim, key):
    return (slice(None),) * dim + (key,)


def take_view(xp, a, dim, i):
    """`a` indexed by `i` (0 <= i < size) along `dim` as a view: the trailing Ellipsis keeps a 0-dim result
    an array sharing `a`'s memory (`a[i]` of a 1-D array is a scalar copy)."""
    return a[i, ...] if dim == 0 else a[(slice(None),) * dim + (i, ...)]


def slice_bounds(size, start, end, step):
    """PyTorch's slice normalisation: clamp start/end into [0, size], end >= start."""
    if step <= 0:
        raise RuntimeError("slice step must be positive")
    start = 0 if start is None else start
    end = size if end is None else end
    if start < 0:
        start += size
    if end < 0:
        end += size
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end, (end - start + step - 1) // step


@defop("slice.Tensor(Tensor(a) self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor(a)",
       function=False, tags=(Tag.core, Tag.recomputable))
def slice_(xp, self, dim=0, start=None, end=None, step=1):
    if step <= 0:
        raise RuntimeError("slice step must be positive")
    # Python's slice clamping for a positive step is PyTorch's (see slice_bounds, used by meta)
    if dim == 0 and self.ndim:
        return self[start:end:step]
    return self[_sel(wrap_dim(dim, self.ndim), slice(start, end, step))]


@slice_.def_meta
def _(self, dim=0, start=None, end=None, step=1):
    d = wrap_dim(dim, self.ndim)
    s, e, n = slice_bounds(self.shape[d], start, end, step)
    shape, st = list(self.shape), list(self.stride())
    shape[d] = n
    off = self.storage_offset() + s * st[d]
    st[d] *= step
    return TensorSpec(shape, self.dtype, st, off)


@slice_.def_derivative
def _(grad, self_meta, dim, start, end, step):
    return grad.new_zeros(self_meta.shape).slice_scatter(grad, dim, start, end, step)


def _check_index(what, self_shape, dim, index):
    size = self_shape[dim]
    if index < -size or index >= size:
        raise IndexError(f"{what}(): index {index} out of range for tensor of size {list(self_shape)} at "
                         f"dimension {dim}")
    return index + size if index < 0 else index


@defop("select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)", method=True, tags=(Tag.core, Tag.recomputable))
def select(xp, self, dim, index):
    if self.ndim == 0:
        raise IndexError("select() cannot be applied to a 0-dim tensor.")
    d = wrap_dim(dim, self.ndim)
    return take_view(xp, self, d, _check_index("select", self.shape, d, index))


@select.def_meta
def _(self, dim, index):
    if self.ndim == 0:
        raise IndexError("select() cannot be applied to a 0-dim tensor.")
    d = wrap_dim(dim, self.ndim)
    i = _check_index("select", self.shape, d, index)
    st = self.stride()
    return TensorSpec(self.shape[:d] + self.shape[d + 1:], self.dtype, st[:d] + st[d + 1:],
                      self.storage_offset() + i * st[d])


@select.def_derivative
def _(grad, self_meta, dim, index):
    return grad.new_zeros(self_meta.shape).select_scatter(grad, dim, index)


@export("narrow", method=True)
def narrow(self, dim, start, length):
    if self.ndim == 0:
        raise RuntimeError("narrow() cannot be applied to a 0-dim tensor.")
    if isinstance(start, Tensor):
        start = int(start.item())
    d = wrap_dim(dim, self.ndim)
    size = self.shape[d]
    if length < 0:
        raise RuntimeError("narrow(): length must be non-negative.")
    if not -size <= start <= size:
        raise IndexError(f"start out of range (expected to be in range of [{-size}, {size}], but got {start})")
    if start < 0:
        start += size
    if start + length > size:
        raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size ({size}).")
    return slice_(self, d, start, start + length, 1)


def _diag_geometry(shape, strides, offset, dim1, dim2):
    n = len(shape)
    d1, d2 = wrap_dim(dim1, n), wrap_dim(dim2, n)
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    return d1, d2


def _diag_len(shape, offset, d1, d2):
    if offset >= 0:
        return max(min(shape[d1], shape[d2] - offset), 0)
    return max(min(shape[d1] + offset, shape[d2]), 0)


def _diag_spec(shape, st, off, offset, d1, d2):
    L = _diag_len(shape, offset, d1, d2)
    if L > 0:
        off += offset * st[d2] if offset >= 0 else -offset * st[d1]
    keep = [i for i in range(len(shape)) if i not in (d1, d2)]
    return [shape[i] for i in keep] + [L], [st[i] for i in keep] + [st[d1] + st[d2]], off


@defop("diagonal(Tensor(a) self, int offset=0, int dim1=0, int dim2=1) -> Tensor(a)", method=True)
def diagonal(xp, self, offset=0, dim1=0, dim2=1):
    d1, d2 = _diag_geometry(self.shape, None, offset, dim1, dim2)
    it = self.itemsize
    shape, st, off = _diag_spec(self.shape, [s // it for s in self.strides], 0, offset, d1, d2)
    base = self
    if shape[-1] > 0 and off:
        base = self[_sel(d2, slice(offset, None))] if offset >= 0 else self[_sel(d1, slice(-offset, None))]
    return xp.lib.stride_tricks.as_strided(base, shape, [s * it for s in st])


@diagonal.def_meta
def _(self, offset=0, dim1=0, dim2=1):
    d1, d2 = _diag_geometry(self.shape, None, offset, dim1, dim2)
    shape, st, off = _diag_spec(self.shape, self.stride(), self.storage_offset(), offset, d1, d2)
    return TensorSpec(shape, self.dtype, st, off)


@diagonal.def_derivative
def _(grad, self_meta, offset, dim1, dim2):
    z = zeros(self_meta.shape, dtype=grad.dtype, device=grad.device)
    return z.diagonal_scatter(grad, offset, dim1, dim2)


def _unfold_geometry(shape, st, dimension, size, step):
    n = len(shape)
    d = wrap_dim(dimension, n)
    dsize = shape[d] if n else 1
    if size > dsize:
        raise RuntimeError(f"maximum size for tensor at dimension {d} is {dsize} but size is {size}")
    if step <= 0:
        raise RuntimeError(f"step is {step} but must be > 0")
    if not n:
        return (size,), (1,)
    nw = (dsize - size) // step + 1
    shape, sst = list(shape), list(st)
    shape[d] = nw
    sst[d] = st[d] * step
    return tuple(shape) + (size,), tuple(sst) + (st[d],)


@defop("unfold(Tensor(a) self, int dimension, int size, int step) -> Tensor(a)", method=True, function=False)
def unfold(xp, self, dimension, size, step):
    it = self.itemsize
    shape, st = _unfold_geometry(self.shape, [s // it for s in self.strides], dimension, size, step)
    return xp.lib.stride_tricks.as_strided(self, shape, [s * it for s in st])


@unfold.def_meta
def _(self, dimension, size, step):
    shape, st = _unfold_geometry(self.shape, self.stride(), dimension, size, step)
    return TensorSpec(shape, self.dtype, st, self.storage_offset())


@unfold.def_derivative
def _(grad, self_meta, dimension, size, step):
    shape = self_meta.shape
    if not len(shape):
        return grad.sum().reshape(())
    d = wrap_dim(dimension, len(shape))
    nw = grad.shape[d]                  # may be symbolic (a traced backward): the index is an arange of it
    idx = (arange(nw, device=grad.device)[:, None] * step + arange(size, device=grad.device)[None, :]).reshape(-1)
    g = grad.movedim(-1, d + 1).reshape(tuple(shape[:d]) + (nw * size,) + tuple(shape[d + 1:]))
    z = zeros(shape, dtype=grad.dtype, device=grad.device)
    return z.index_add(d, idx, g)


def storage_root(a):
    """The array owning `a`'s memory, viewed as a flat 1-D array of `a`'s dtype."""
    root = storage_owner(a)
    nbytes = root.size * root.itemsize
    start = (_ptr(a) - _ptr(root)) // a.itemsize
    flat = root.reshape(-1) if root.flags["C_CONTIGUOUS"] else root.ravel(order="K")
    if flat.dtype != a.dtype:
        flat = flat.view(a.dtype)
    return flat, start, nbytes // a.itemsize


def _check_as_strided(size, stride, storage_offset, storage_size, itemsize):
    if len(size) != len(stride):
        raise RuntimeError(f"mismatch in length of strides and shape")
    if any(s < 0 for s in stride):
        raise RuntimeError("as_strided: Negative strides are not supported at the moment, got strides: "
                           f"{list(stride)}")
    if storage_offset < 0:
        raise RuntimeError(f"Tensor: invalid storage offset {storage_offset}")
    need = 0 if any(s == 0 for s in size) else storage_offset + 1 + sum((s - 1) * t for s, t in zip(size, stride))
    if storage_size is not None and need > storage_size:
        raise RuntimeError(f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset "
                           f"{storage_offset}, and itemsize {itemsize} requiring a storage size of "
                           f"{need * itemsize} are out of bounds for storage of size {storage_size * itemsize}")


@defop("as_strided(Tensor(a) self, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor(a)",
       method=True, tags=(Tag.core, Tag.recomputable))
def as_strided(xp, self, size, stride, storage_offset=None):
    flat, start, n = storage_root(self)
    off = start if storage_offset is None else storage_offset
    _check_as_strided(size, stride, off, n, self.itemsize)
    return xp.lib.stride_tricks.as_strided(flat[off:], tuple(size), tuple(s * self.itemsize for s in stride))


@as_strided.def_meta
def _(self, size, stride, storage_offset=None):
    off = self.storage_offset() if storage_offset is None else storage_offset
    _check_as_strided(size, stride, off, None, self.dtype.itemsize)
    return TensorSpec(size, self.dtype, stride, off)


def storage_positions(shape, strides, offset):
    """The storage index of every element of a strided layout, as an int64 array of `shape`."""
    p = np.full(shape, offset, dtype=np.int64)
    for k, (n, st) in enumerate(zip(shape, strides)):
        p = p + (np.arange(n, dtype=np.int64) * st).reshape([-1 if j == k else 1 for j in range(len(shape))])
    return p


@as_strided.def_derivative
def _(grad, self_geometry, size, stride, storage_offset):
    g = self_geometry
    pin = storage_positions(tuple(g.shape), g.stride(), g.storage_offset()).reshape(-1)
    off = g.storage_offset() if storage_offset is None else storage_offset
    pout = storage_positions(tuple(size), tuple(stride), off).reshape(-1)
    top = int(max(pin.max(initial=0), pout.max(initial=0))) + 1
    store = np.full(top, -1, dtype=np.int64)
    store[pin] = np.arange(pin.size, dtype=np.int64)
    src = store[pout]
    keep = np.nonzero(src >= 0)[0]
    z = zeros((pin.size,), dtype=grad.dtype, device=grad.device)
    gflat = grad.reshape(-1)
    if keep.size != src.size:
        gflat = gflat.take(tensor(keep, device=grad.device))
    return z.index_add(0, tensor(src[keep], device=grad.device), gflat).reshape(g.shape)


@defop("alias(Tensor(a) self) -> Tensor(a)", tags=(Tag.recomputable,))
def alias(xp, self):
    return self.view()


alias.def_meta(lambda self: TensorSpec(self.shape, self.dtype, self.stride(), self.storage_offset()))
alias.def_derivative(lambda grad: grad)


# ---- vmap batching rules ----------------------------------------------------------------------------
@_view.def_batching_rule
def _view_batching(in_dims, self, size):
    x = _batching.front(self, in_dims[0])
    try:
        return _view(x, (x.shape[0],) + tuple(size)), 0
    except RuntimeError:              # the batch dimension moved to the front breaks the strides: copy
        return x.reshape((x.shape[0],) + tuple(size)), 0


@_expand.def_batching_rule
def _expand_batching(in_dims, self, size, implicit=False):
    x = _batching.pad_front(self, in_dims[0], len(size))
    return _expand(x, (x.shape[0],) + tuple(size)), 0


@_permute.def_batching_rule
def _permute_batching(in_dims, self, dims):
    x = _batching.front(self, in_dims[0])
    n = x.dim() - 1
    return _permute(x, [0] + [_batching.wrap_dim(d, n) + 1 for d in dims]), 0


@_squeeze.def_batching_rule
def _squeeze_batching(in_dims, self, dim):
    x = _batching.front(self, in_dims[0])
    n = x.dim() - 1
    if dim is None:
        dims = [k + 1 for k in range(n) if x.shape[k + 1] == 1]
    else:
        dims = [_batching.wrap_dim(d, n) + 1 for d in dim] if n else []
    return (_squeeze(x, dims) if dims else x), 0


for _op in (_to_copy, alias):
    _op.def_batching_rule(_batching.unary_rule(_op))


@clone.def_batching_rule
def _clone_batching(in_dims, self, memory_format=None):
    """A channels-last clone lays out each example as PyTorch's vmap does: the batch dimension is folded
    into the leading (N) one, so the physical tensor keeps the logical rank the format needs."""
    if memory_format not in (channels_last, channels_last_3d):
        return clone(self, memory_format=memory_format), in_dims[0]
    x = _batching.front(self, in_dims[0])
    flat = x.reshape((x.shape[0] * x.shape[1],) + tuple(x.shape[2:])) if x.dim() > 1 else x
    out = clone(flat, memory_format=memory_format)
    return out.reshape(tuple(x.shape)), 0
transpose.def_batching_rule(_batching.dim_rule(transpose, "dim0", "dim1"))
unsqueeze.def_batching_rule(_batching.dim_rule(unsqueeze, "dim", extra=1))
slice_.def_batching_rule(_batching.dim_rule(slice_, "dim"))
select.def_batching_rule(_batching.dim_rule(select, "dim"))
diagonal.def_batching_rule(_batching.dim_rule(diagonal, "dim1", "dim2"))
unfold.def_batching_rule(_batching.dim_rule(unfold, "dimension"))


# ---- DTensor sharding rules -------------------------------------------------------------------------
_view.def_sharding_rule(_sharding.view_rule)
_expand.def_sharding_rule(_sharding.expand_rule)
transpose.def_sharding_rule(_sharding.transpose_rule)
_permute.def_sharding_rule(_sharding.permute_rule)
unsqueeze.def_sharding_rule(_sharding.unsqueeze_rule)
_squeeze.def_sharding_rule(_sharding.squeeze_rule)
slice_.def_sharding_rule(_sharding.slice_rule)
select.def_sharding_rule(_sharding.select_rule)
for _like_op in (clone, _to_copy, alias):
    _like_op.def_sharding_rule(_sharding.like_rule)
