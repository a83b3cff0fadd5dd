"""Tensor: a strided view of device memory with a dtype, a device and autograd metadata.

The data is an array of the device's namespace (a NumPy ndarray on cpu, a CuPy ndarray on cuda,
a `MetaArray` on meta). Views are arrays that share memory with their base (NumPy/CuPy strided
views), so an in-place op on a view updates the base. Views share their base's version counter,
which autograd uses to detect that a tensor saved for backward was modified in place.

Nearly every method is an operator exported by `flambeau._ops` and attached at import time; this
file holds only the state, the properties and the conversions that are not operators.

Layer 4 (tensor, with `_tensor_str` and `_dispatch`) of tests/test_layers.py's order: imports the
foundation, `_device` and `_backends` only.
"""
from __future__ import annotations

import numpy as np
import copy

from . import _dtype as D
from . import _state
from . import _pending_grads
from ._device import device as Device
from ._backends import MetaArray, contiguous_strides, device_checks, cupy_available, get as backend_of
from ._tensor_str import tensor_repr


class Size(tuple):
    """`torch.Size`: a tuple of ints."""

    def __repr__(self):
        return f"torch.Size([{', '.join(map(str, self))}])"

    def numel(self) -> int:
        n = 1
        for s in self:
            n *= s
        return n

    def __getitem__(self, i):
        r = tuple.__getitem__(self, i)
        return Size(r) if isinstance(i, slice) else r

    def __add__(self, o):
        return Size(tuple(self) + tuple(o))


def _elem_strides(arr) -> tuple:
    if type(arr) is MetaArray:
        return arr.estrides
    it = arr.itemsize
    st = arr.strides
    if arr.size == 0 and len(st) > 1 and not any(st):
        return contiguous_strides(arr.shape)   # NumPy gives fresh empty arrays all-zero strides
    return tuple(s // it for s in st)


class Tensor:
    """A multi-dimensional array with autograd (see module docstring)."""

    # --- construction: `Tensor(...)` and `t.new_tensor(...)` build through the creation operators, so
    # `flambeau._ops.creation` installs them with the other methods (`_tensor_new`, `new_tensor`)

    # Per-instance autograd state defaults to these class attributes, so `_make` (the hot path of
    # every op) only stores what differs from them.
    _requires_grad = False
    _grad_fn = None
    _grad = None
    _base = None
    _view_version = 0      # a view's version counter when its grad_fn was recorded (autograd.graph.refresh_view)
    _view_untracked = False  # a view made by detach() or under no_grad: an in-place op on its base leaves it alone
    # a view made under no_grad (PyTorch's CreationMeta.NO_GRAD_MODE): "" for one, the view op's name for
    # a view of one made in grad mode; its base modified in place, its use in autograd raises (refresh_view)
    _no_grad_view = None
    # flambeau.autograd.graph.refresh_view, installed by the autograd layer (`_dispatch.register_autograd`):
    # a view whose base changed in place takes a node re-reading it from the base (PyTorch's regeneration)
    _refresh_view = None
    _output_nr = 0
    _hooks = None
    _fw_grad = None
    # a quantized tensor's map from its integers to reals (flambeau._ops.quantized_tensor), else None
    _quantizer = None
    # a leaf's (shape, dtype, device), kept across steps for its AccumulateGrad nodes (autograd.graph._leaf_meta)
    _leaf_meta = None
    # a wrapper subclass (`_device` is the dispatcher's WRAPPER_DEVICE) whose __torch_dispatch__ runs above
    # autograd and records its own graph sets this (flambeau.sparse's SparseTensor)
    _wrapper_owns_autograd = False

    @staticmethod
    def _make(data, device: Device, dtype=None) -> "Tensor":
        t = object.__new__(Tensor)
        t._data = data
        t._dtype = dtype if dtype is not None else D.FROM_NP[data.dtype]
        t._device = device
        t._version = [0]
        return t                    # _requires_grad, _fw_grad...: the class defaults

    # --- basic metadata -----------------------------------------------------------------
    @property
    def shape(self) -> Size:
        return Size(self._data.shape)

    def size(self, dim: int | None = None):
        if dim is None:
            return Size(self._data.shape)
        return self._data.shape[_wrap_dim(dim, self._data.ndim, "size")]

    @property
    def dtype(self):
        return self._dtype

    @property
    def device(self) -> Device:
        return self._device

    @property
    def ndim(self) -> int:
        return self._data.ndim

    def dim(self) -> int:
        return self._data.ndim

    ndimension = dim

    def numel(self) -> int:
        n = 1
        for s in self._data.shape:
            n *= s
        return n

    nelement = numel

    def element_size(self) -> int:
        return self._dtype.itemsize

    @property
    def itemsize(self) -> int:
        return self._dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel() * self._dtype.itemsize

    def stride(self, dim: int | None = None):
        st = _elem_strides(self._data)
        if dim is None:
            return st
        return st[_wrap_dim(dim, self._data.ndim, "stride")]

    def storage_offset(self) -> int:
        a = self._data
        if type(a) is MetaArray:
            return a.offset
        return (_ptr(a) - _ptr(storage_owner(a))) // a.itemsize

    def data_ptr(self) -> int:
        return 0 if type(self._data) is MetaArray else _ptr(self._data)

    def is_contiguous(self, memory_format=None) -> bool:
        shape, st = self._data.shape, self.stride()
        if memory_format is not None and memory_format is not contiguous_format:
            if memory_format is channels_last and len(shape) == 4:
                order = (1, 3, 2, 0)
            elif memory_format is channels_last_3d and len(shape) == 5:
                order = (1, 4, 3, 2, 0)
            else:
                return False
            shape = tuple(shape[i] for i in order)
            st = tuple(st[i] for i in order)
            shape, st = shape[::-1], st[::-1]
        expected = 1
        for s, t in zip(reversed(shape), reversed(st)):
            if s != 1 and t != expected:
                return False
            expected *= s
        return True

    @property
    def is_cuda(self) -> bool:
        return self._device.type == "cuda"

    @property
    def is_cpu(self) -> bool:
        return self._device.type == "cpu"

    @property
    def is_meta(self) -> bool:
        return self._device.type == "meta"

    @property
    def is_sparse(self) -> bool:
        return False

    @property
    def is_quantized(self) -> bool:
        return self._quantizer is not None

    @property
    def layout(self):
        return strided

    def is_floating_point(self) -> bool:
        return self._dtype.category == D.FLOATING

    def is_complex(self) -> bool:
        return self._dtype.category == D.COMPLEX

    def is_signed(self) -> bool:
        return self._dtype.is_signed

    def get_device(self) -> int:
        return -1 if self._device.type == "cpu" else (self._device.index or 0)

    # --- autograd state -----------------------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        if self._base is not None and self._version[0] != self._view_version:
            Tensor._refresh_view(self, strict=False)
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool):
        if self.grad_fn is not None:
            if not value:
                raise RuntimeError("you can only change requires_grad flags of leaf variables. If you "
                                   "want to use a computed variable in a subgraph that doesn't require "
                                   "differentiation use var_no_grad = var.detach().")
            return
        if value and self._dtype.category < D.FLOATING:
            raise RuntimeError("only Tensors of floating point and complex dtype can require gradients")
        self._requires_grad = bool(value)

    @property
    def grad_fn(self):
        """The node that made this tensor (None for a leaf). A view whose base was modified in place
        since its node was recorded gets a new one first, as PyTorch regenerates it (AsStridedBackward0)."""
        if self._base is not None and self._version[0] != self._view_version:
            Tensor._refresh_view(self, strict=True)
        return self._grad_fn

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        self.requires_grad = requires_grad
        return self

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    @property
    def grad(self):
        if _pending_grads.waits:          # a gradient DDP still reduces: the current stream waits for it
            _pending_grads.settle(self)
        return self._grad

    @grad.setter
    def grad(self, g):
        if _pending_grads.waits:
            _pending_grads.settle(self)
        if g is not None:
            if not isinstance(g, Tensor):
                raise TypeError(f"assigned grad expected to be a Tensor or None but got grad of type {type(g).__name__}")
            if g._dtype is not self._dtype:
                raise RuntimeError(f"assigned grad has data of a different type")
            if g.shape != self.shape:
                raise RuntimeError("assigned grad has data of a different size")
            if g._device != self._device:
                raise RuntimeError("assigned grad has data located on a different device")
        self._grad = g

    @property
    def output_nr(self) -> int:
        return self._output_nr

    @property
    def _version_counter(self) -> int:
        return self._version[0]

    @property
    def data(self) -> "Tensor":
        return self.detach()

    @data.setter
    def data(self, other: "Tensor"):
        self._data = other._data
        self._dtype = other._dtype
        self._device = other._device

    def detach(self) -> "Tensor":
        t = Tensor._make(self._data, self._device, self._dtype)
        t._version = self._version
        if self._base is not None:
            t._base, t._view_untracked = self._base, True
        return t

    def detach_(self) -> "Tensor":
        self._grad_fn = None
        self._requires_grad = False
        return self

    # backward, register_hook, register_post_accumulate_grad_hook and retain_grad are installed by
    # flambeau.autograd, __reduce_ex__ by flambeau.serialization, share_memory_ and is_shared by
    # flambeau.multiprocessing: the layers that implement them.

    @property
    def retains_grad(self) -> bool:
        return bool(getattr(self, "_retains_grad", False))

    @property
    def _is_view(self) -> bool:
        return self._base is not None

    def _is_view_fn(self) -> bool:
        return self._base is not None

    # --- conversions to Python and NumPy -----------------------------------------------
    def item(self):
        d = self._data
        if type(d) is np.ndarray and d.size == 1 and self._dtype in _NUMPY_ITEM:
            return d.item()               # the Python scalar `_py_scalar` makes, without the checks' calls
        if self.numel() != 1:
            raise RuntimeError(f"a Tensor with {self.numel()} elements cannot be converted to Scalar")
        self._check_has_data("item")
        v = self._host().reshape(-1)[0]
        return _py_scalar(v, self._dtype)

    def tolist(self):
        self._check_has_data("tolist")
        a = self._host()
        if self._dtype in D.LOW_PRECISION:
            a = a.astype(np.float32)
        return a.tolist()

    def numpy(self, *, force: bool = False) -> np.ndarray:
        if not force:
            if self._requires_grad:
                raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use "
                                   "tensor.detach().numpy() instead.")
            if self._device.type != "cpu":
                raise TypeError(f"can't convert {self._device.type}:{self._device.index or 0} device type tensor to "
                                "numpy. Use Tensor.cpu() to copy the tensor to host memory first.")
        return self._host()

    def _host(self) -> np.ndarray:
        if self._device.type == "cpu":
            return self._data
        if self._device.type == "meta":
            raise NotImplementedError("Cannot copy out of meta tensor; no data!")
        if self._device.type != "cuda":
            return backend_of(self._device.type).to_numpy(self._data)    # a third-party device
        host = self._data.get()
        device_checks.raise_pending()           # a synchronisation: report failed device-side checks
        return host

    def _check_has_data(self, what):
        if self._device.type == "meta":
            raise RuntimeError(f"Tensor.{what}() cannot be called on meta tensors")

    def __array__(self, dtype=None, copy=None):
        a = self.detach()._host()
        return a.astype(dtype) if dtype is not None else a

    def __len__(self) -> int:
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __iter__(self):
        if self._data.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))

    def __contains__(self, element) -> bool:
        """`x in t`: whether any element of `t` equals `x` (a number, or a tensor compared by broadcasting)."""
        if not isinstance(element, (Tensor, int, float, complex, bool, np.number, np.bool_)):
            raise RuntimeError(f"Tensor.__contains__ only supports Tensor or scalar, but you passed in a "
                               f"{type(element)}.")
        return bool((self == element).any().item())

    def __bool__(self) -> bool:
        n = self.numel()
        if n != 1:
            if n == 0:
                raise RuntimeError("Boolean value of Tensor with no values is ambiguous")
            raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __complex__(self) -> complex:
        return complex(self.item())

    def __index__(self) -> int:
        if self._dtype.category > D.INTEGER or self.numel() != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    def __hash__(self):
        return id(self)

    def __dlpack__(self, stream=None, **kwargs):
        # forward max_version/dl_device/copy: without max_version NumPy imports the array read-only
        if stream is not None:
            kwargs["stream"] = stream
        return self._data.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._data.__dlpack_device__()

    def __repr__(self, *, tensor_contents=None):
        if self._quantizer is not None:
            return self._quantizer.repr_of(self)
        return tensor_repr(self)

    def __format__(self, spec):
        if self._data.ndim == 0 and self._device.type != "meta":
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        if self.grad_fn is not None:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the "
                               "deepcopy protocol at the moment.  If you were attempting to deepcopy a "
                               "module, this may be because of a torch.nn.utils.weight_norm usage, see "
                               "https://github.com/pytorch/pytorch/pull/103001")
        with _no_grad():
            new = self.clone()
        new = type(self)._from(new) if type(self) is not Tensor else new
        new._requires_grad = self._requires_grad
        if self.grad is not None:
            new._grad = self._grad.__deepcopy__(memo)
        for k, v in self.__dict__.items():
            if k not in new.__dict__:
                new.__dict__[k] = copy.deepcopy(v, memo)
        memo[id(self)] = new
        return new

    @classmethod
    def _from(cls, t: "Tensor") -> "Tensor":
        new = object.__new__(cls)
        new.__dict__.update(t.__dict__)
        return new

    # --- type conversions sugar -------------------------------------------------------
    def type(self, dtype=None, non_blocking=False):
        """No argument: the legacy type name ("torch.FloatTensor", "torch.cuda.LongTensor"). A dtype,
        a legacy type (`torch.LongTensor`, which carries `dtype` and `is_cuda`) or its name: a cast."""
        cuda = self._device.type == "cuda"
        if dtype is None:
            name = _TYPE_NAMES.get(self._dtype, "torch.Tensor")
            return name.replace("torch.", "torch.cuda.", 1) if cuda and name != "torch.Tensor" else name
        if isinstance(dtype, str):
            cuda = dtype.startswith("torch.cuda.")
            inv = {v: k for k, v in _TYPE_NAMES.items()}
            key = dtype.replace("torch.cuda.", "torch.", 1)
            if key not in inv:
                raise ValueError(f"invalid type: '{dtype}'")
            dtype = inv[key]
        elif isinstance(dtype, type) and isinstance(getattr(dtype, "dtype", None), D.dtype):
            cuda, dtype = bool(dtype.is_cuda), dtype.dtype
        if cuda != (self._device.type == "cuda"):
            return self.to(device="cuda" if cuda else "cpu", dtype=dtype, non_blocking=non_blocking)
        return self.to(dtype)

    @property
    def T(self):
        return self.permute(*reversed(range(self.ndim)))

    @property
    def mT(self):
        return self.transpose(-2, -1)

    @property
    def H(self):
        return self.T.conj() if self.is_complex() else self.T

    @property
    def mH(self):
        return self.mT.conj() if self.is_complex() else self.mT

    __array_priority__ = 1000


# The attributes a Tensor instance stores on the hot paths (`_make`, the dispatcher, autograd's `record`,
# the engine). CPython keeps one key table for all instance dictionaries of a class and adds a new name to it
# only while the table has room, and each instance created takes room away: a name first stored after a few
# dozen tensors exist (`_grad_fn` when a model's parameters are built before its first recorded op) no longer
# fits, and from then on every tensor storing it carries a dictionary object of its own (one more object for
# the garbage collector to track and walk, and more memory). Storing them all once at import puts them in
# the table while it has room (tests/test_gc_garbage.py::test_graph_tensors_carry_no_dictionary_object).
_INSTANCE_ATTRS = ("_data", "_dtype", "_device", "_version", "_requires_grad", "_fw_grad", "_grad_fn",
                   "_output_nr", "_base", "_view_version", "_view_untracked", "_no_grad_view", "_grad", "_hooks",
                   "_accumulator", "_undefined_grad", "_is_root_grad", "_retains_grad", "_post_acc_hooks",
                   "_quantizer", "_pinned", "_leaf_meta")


def _share_instance_keys() -> None:
    t = object.__new__(Tensor)
    for name in _INSTANCE_ATTRS:
        setattr(t, name, None)


_share_instance_keys()


def storage_owner(a):
    """The array owning the memory of array `a`: the end of its chain of bases, passing through
    NumPy's stride-trick wrappers (an expanded view's base is a `DummyArray` without a dtype)."""
    root = a
    while True:
        b = getattr(root, "base", None)
        while b is not None and not hasattr(b, "dtype"):
            b = getattr(b, "base", None)
        if b is None:
            return root
        root = b


def _ptr(a) -> int:
    if isinstance(a, np.ndarray):
        return a.__array_interface__["data"][0]
    return a.data.ptr


# dtypes whose NumPy `item()` is the Python scalar of their category (not bfloat16/float8, whose
# ml_dtypes scalars `item()` returns as they are)
_NUMPY_ITEM = frozenset(d for d in D.ALL if np.dtype(d.np).kind in "biufc")


def _py_scalar(v, dt):
    if dt.category == D.BOOL:
        return bool(v)
    if dt.category == D.INTEGER:
        return int(v)
    if dt.category == D.COMPLEX:
        return complex(v)
    return float(v)


def _wrap_dim(dim: int, ndim: int, what: str = "") -> int:
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim + n if dim < 0 else dim


class _no_grad:
    def __enter__(self):
        self.prev = _state.tls.grad_enabled
        _state.tls.grad_enabled = False

    def __exit__(self, *a):
        _state.tls.grad_enabled = self.prev


class _Layout:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "torch." + self.name


class memory_format:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "torch." + self.name


strided = _Layout("strided")
sparse_coo = _Layout("sparse_coo")
sparse_csr = _Layout("sparse_csr")
sparse_csc = _Layout("sparse_csc")
sparse_bsr = _Layout("sparse_bsr")
sparse_bsc = _Layout("sparse_bsc")
contiguous_format = memory_format("contiguous_format")
channels_last = memory_format("channels_last")
channels_last_3d = memory_format("channels_last_3d")
preserve_format = memory_format("preserve_format")

_TYPE_NAMES = {D.float32: "torch.FloatTensor", D.float64: "torch.DoubleTensor", D.float16: "torch.HalfTensor",
               D.bfloat16: "torch.BFloat16Tensor", D.int64: "torch.LongTensor", D.int32: "torch.IntTensor",
               D.int16: "torch.ShortTensor", D.int8: "torch.CharTensor", D.uint8: "torch.ByteTensor",
               D.bool: "torch.BoolTensor", D.complex64: "torch.ComplexFloatTensor",
               D.complex128: "torch.ComplexDoubleTensor"}


def is_tensor(obj) -> bool:
    return isinstance(obj, Tensor)


def _pin_memory(self, device=None) -> "Tensor":
    """A copy of a cpu tensor in page-locked host memory (for fast async copies to cuda)."""
    if self._device.type != "cpu":
        raise RuntimeError(f"cannot pin '{self.type()}' only dense CPU tensors can be pinned")
    if not cupy_available():
        raise RuntimeError("Cannot access accelerator device when none is available.")
    import cupyx  # deferred: optional dependency, present only where cuda is used
    buf = cupyx.empty_pinned(self._data.shape, dtype=self._data.dtype)
    buf[...] = self._data
    t = Tensor._make(buf, self._device, self._dtype)
    t.__dict__["_pinned"] = True
    return t


Tensor.pin_memory = _pin_memory
Tensor.is_pinned = lambda self, device=None: bool(self.__dict__.get("_pinned", False))

