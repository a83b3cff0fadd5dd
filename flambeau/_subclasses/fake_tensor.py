"""Fake tensors: metadata-only tensors that remember the device they stand for.

A `FakeTensor` is a tensor on the `meta` device (a `MetaArray`: shape, dtype, strides; no data)
whose `.device` reports the device of the real tensor it stands for. Under `FakeTensorMode` every
operator runs its meta function instead of its kernel: real input tensors are converted to fake
ones (memoised), factory ops are sent to `meta`, and outputs become FakeTensors on the device the
op would have produced (an explicit `device=` argument, else its inputs' device, else the default
device). Autograd still records below the mode, so `autograd.grad` works on fake tensors and its
backward ops are seen by modes above (proxy tracing).

Saved tensors unpacked in backward and `detach()` give new Tensor objects over the same
`MetaArray`; the mode recognises them by their array and restores their fake device. Asking a
FakeTensor for a value (`bool`, `item`) raises `DataDependentOutputException`.
"""
from __future__ import annotations

from .. import _state
from .._backends import MetaArray, contiguous_strides
from .._device import canonical, device as Device, META, CPU
from .._tensor import Tensor
from ..utils._python_dispatch import TorchDispatchMode


class DataDependentOutputException(RuntimeError):
    """An operation needs the values of a fake tensor (`bool(t)`, `t.item()`, `t.tolist()`): it has none."""


class FakeTensor(Tensor):
    """A meta tensor standing for a tensor on `fake_device` (see module docstring)."""

    def _check_has_data(self, what):
        raise DataDependentOutputException(f"Tensor.{what}() needs the value of a fake tensor of shape "
                                           f"{list(self.shape)}: the result depends on the data")

    @property
    def device(self) -> Device:
        return self.__dict__["fake_device"]

    @property
    def fake_device(self) -> Device:
        return self.__dict__["fake_device"]

    @property
    def fake_mode(self) -> "FakeTensorMode":
        return self.__dict__["fake_mode"]

    @property
    def is_cuda(self) -> bool:
        return self.fake_device.type == "cuda"

    @property
    def is_cpu(self) -> bool:
        return self.fake_device.type == "cpu"

    @property
    def is_meta(self) -> bool:
        return False

    def get_device(self) -> int:
        d = self.fake_device
        return -1 if d.type == "cpu" else (d.index or 0)

    def __repr__(self) -> str:
        extra = ""
        if self._dtype is not _state.default_dtype:
            extra += f", dtype=flambeau.{self._dtype.name}"
        if self.fake_device.type != "cpu":
            extra += f", device='{self.fake_device}'"
        return f"FakeTensor(..., size={tuple(self.shape)}{extra})"


class FakeTensorMode(TorchDispatchMode):
    """Run operators on fake tensors (see module docstring)."""

    def __init__(self, *, allow_non_fake_inputs: bool = False, shape_env=None, static_shapes: bool | None = None):
        super().__init__()
        self.allow_non_fake_inputs = allow_non_fake_inputs
        self.shape_env = shape_env
        self.static_shapes = shape_env is None if static_shapes is None else static_shapes
        self._data_dev: dict = {}     # id(MetaArray) -> (MetaArray, device it stands for)
        self._memo: dict = {}         # id(real tensor) -> (real tensor, its FakeTensor)

    # ---- conversion ---------------------------------------------------------------------------
    def from_tensor(self, t: Tensor, *, symbolic: bool = False, source: str = "") -> FakeTensor:
        """The FakeTensor standing for the real tensor `t` (the same one each time)."""
        if isinstance(t, FakeTensor):
            return t
        hit = self._memo.get(id(t))
        if hit is not None:
            return hit[1]
        shape, strides, offset = tuple(t.shape), t.stride(), t.storage_offset()
        if symbolic and self.shape_env is not None:
            contiguous = t.is_contiguous()
            shape = self.shape_env.create_symbolic_sizes(shape, source)
            if contiguous:
                strides, offset = contiguous_strides(shape), 0
        arr = MetaArray(shape, t._dtype.np, strides, offset)
        f = Tensor._make(arr, META, t._dtype)
        self._register(f, t.device)
        if t._requires_grad:
            f._requires_grad = True
        self._memo[id(t)] = (t, f)
        return f

    def _register(self, t: Tensor, dev: Device) -> None:
        t.__class__ = FakeTensor
        t.__dict__["fake_device"] = dev
        t.__dict__["fake_mode"] = self
        self._data_dev[id(t._data)] = (t._data, dev)

    def _as_fake(self, t: Tensor) -> Tensor:
        if isinstance(t, FakeTensor):
            return t
        if t._device.type == "meta":
            hit = self._data_dev.get(id(t._data))
            if hit is not None:
                self._register(t, hit[1])
            return t
        if not self.allow_non_fake_inputs:
            raise RuntimeError(f"Please convert all Tensors to FakeTensors first or instantiate FakeTensorMode "
                               f"with 'allow_non_fake_inputs'. Found a real tensor of shape {list(t.shape)}.")
        return self.from_tensor(t)

    def _convert(self, a):
        if isinstance(a, Tensor):
            return self._as_fake(a)
        if type(a) in (list, tuple) and any(isinstance(x, Tensor) for x in a):
            return type(a)(self._as_fake(x) if isinstance(x, Tensor) else x for x in a)
        return a

    # ---- the mode -----------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        args = tuple(self._convert(a) for a in args)
        kwargs = {k: self._convert(v) for k, v in (kwargs or {}).items()}
        dev, args, kwargs = self._device_args(func, args, kwargs)
        out = func(*args, **kwargs)
        self._wrap_outputs(out, dev)
        return out

    def _device_args(self, func, args, kwargs):
        """The device of the outputs, and the arguments with any `device` argument sent to meta."""
        names = [a.name for a in func._schema.args]
        explicit = None
        if "device" in names:
            i = names.index("device")
            if "device" in kwargs:
                explicit = kwargs["device"]
                kwargs["device"] = META
            elif i < len(args):
                explicit = args[i]
                args = args[:i] + (META,) + args[i + 1:]
            else:
                kwargs["device"] = META
        if explicit is not None:
            explicit = canonical(explicit)
            if explicit.type != "meta":
                return explicit, args, kwargs
        return self._common_device(func, args, kwargs), args, kwargs

    def _common_device(self, func, args, kwargs) -> Device:
        dev = None
        for t in _flat(args, kwargs):
            d = t.fake_device if isinstance(t, FakeTensor) else t._device
            if dev is None or (dev.type == "cpu" and d.type != "cpu" and _is_cpu_scalar_dev(dev, args, kwargs)):
                dev = d
            elif d != dev and not (d.type == "cpu" and t.ndim == 0):
                raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                                   f"devices, {dev} and {d}! (when checking argument for {func.__name__})")
        if dev is None:
            dev = _state.tls.default_device
            dev = canonical(dev) if dev is not None else CPU
        return dev

    def _wrap_outputs(self, out, dev: Device) -> None:
        if isinstance(out, Tensor):
            if not isinstance(out, FakeTensor) and out._device.type == "meta":
                self._register(out, dev)
        elif isinstance(out, (tuple, list)):
            for o in out:
                self._wrap_outputs(o, dev)


def _flat(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, Tensor):
            yield a
        elif type(a) in (list, tuple):
            for x in a:
                if isinstance(x, Tensor):
                    yield x


def _is_cpu_scalar_dev(dev, args, kwargs) -> bool:
    """True when every tensor seen on `dev` (cpu) so far is 0-dim, so another device may win."""
    for t in _flat(args, kwargs):
        d = t.fake_device if isinstance(t, FakeTensor) else t._device
        if d == dev and t.ndim != 0:
            return False
    return True
