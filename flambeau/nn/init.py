"""`nn.init`: in-place initialisation of tensors (uniform, normal, Xavier, Kaiming, orthogonal...).

Initialisers run without autograd on the tensor's data: samples are drawn from the flambeau
generator of the tensor's device (`flambeau.manual_seed` makes them reproducible) and written into
the tensor's array in place. Distributions match PyTorch's; the exact bits do not."""
from __future__ import annotations

import math
import warnings

import numpy as np

from .._dispatch import WRAPPER_DEVICE
from .._tensor import Tensor
from ..random import generator_for
from .. import _backends

__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
           "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
           "sparse_"]


def _write(tensor: Tensor, arr) -> Tensor:
    """Store `arr` (broadcastable to tensor's shape) into the tensor's memory, in place."""
    if tensor.device.type == "meta":
        return tensor
    if tensor._device is WRAPPER_DEVICE:       # a DTensor: its local tensor keeps its piece of the whole's values
        piece = tensor._wrapper_piece(arr)
        if piece is not None:
            _write(tensor._local_tensor, piece)
        return tensor
    a = tensor._data
    a[...] = arr.astype(a.dtype, copy=False) if hasattr(arr, "astype") else arr
    tensor._version[0] += 1
    return tensor


def _uniform(g, a: float, b: float, shape: tuple):
    """Uniform draws on [a, b) from NumPy's or CuPy's generator (CuPy's has no `uniform`): the same
    `a + (b - a) * random()` NumPy's `uniform` computes, so cpu values are NumPy's."""
    return a + (b - a) * g.random(shape)


def _normal(g, mean: float, std: float, shape: tuple):
    """Normal draws from NumPy's or CuPy's generator (CuPy's has no `normal`): NumPy's own formula."""
    return mean + std * g.standard_normal(shape)


def _on_host(arr) -> np.ndarray:
    return arr.get() if hasattr(arr, "get") else np.asarray(arr)


def _rng(tensor: Tensor, generator=None):
    xp = _backends.get(tensor.device.type).xp or np
    return xp, generator_for(tensor.device, generator).xp_generator(xp)


def calculate_gain(nonlinearity: str, param=None) -> float:
    linear = ["linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d"]
    if nonlinearity in linear or nonlinearity == "sigmoid":
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif not isinstance(param, bool) and isinstance(param, (int, float)):
            slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator=None) -> Tensor:
    if tensor.device.type == "meta":
        return tensor
    xp, g = _rng(tensor, generator)
    return _write(tensor, _uniform(g, a, b, tuple(tensor.shape)))


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator=None) -> Tensor:
    if tensor.device.type == "meta":
        return tensor
    xp, g = _rng(tensor, generator)
    return _write(tensor, _normal(g, mean, std, tuple(tensor.shape)))


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  generator=None) -> Tensor:
    """Normal(mean, std) truncated to [a, b], by inverse-CDF sampling."""
    if tensor.device.type == "meta":
        return tensor
    from scipy.special import erfinv  # deferred: scipy.special is slow to import
    def cdf(x):
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0
    if mean < a - 2 * std or mean > b + 2 * std:
        warnings.warn("mean is more than 2 std from [a, b] in nn.init.trunc_normal_. "
                      "The distribution of values may be incorrect.", stacklevel=2)
    lo, hi = cdf((a - mean) / std), cdf((b - mean) / std)
    _, g = _rng(tensor, generator)
    u = _on_host(_uniform(g, 2 * lo - 1, 2 * hi - 1, tuple(tensor.shape)))
    x = erfinv(u) * std * math.sqrt(2.0) + mean
    x = np.clip(x, a, b)
    xp = _backends.get(tensor.device.type).xp
    return _write(tensor, xp.asarray(x))


def constant_(tensor: Tensor, val: float) -> Tensor:
    return _write(tensor, np.asarray(val))


def ones_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 1.0)


def zeros_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 0.0)


def eye_(tensor: Tensor) -> Tensor:
    if tensor.ndim != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    xp = _backends.get(tensor.device.type).xp or np
    return _write(tensor, xp.eye(*tensor.shape))


def dirac_(tensor: Tensor, groups: int = 1) -> Tensor:
    d = tensor.ndim
    if d not in (3, 4, 5):
        raise ValueError("Only tensors with 3, 4, or 5 dimensions are supported")
    sizes = tensor.shape
    if sizes[0] % groups != 0:
        raise ValueError("dim 0 must be divisible by groups")
    out_per = sizes[0] // groups
    m = min(out_per, sizes[1])
    a = np.zeros(tuple(sizes))
    centre = tuple(s // 2 for s in sizes[2:])
    for g in range(groups):
        for i in range(m):
            a[(g * out_per + i, i) + centre] = 1
    xp = _backends.get(tensor.device.type).xp or np
    return _write(tensor, xp.asarray(a))


def _calculate_fan_in_and_fan_out(tensor: Tensor):
    if tensor.ndim < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 dimensions")
    rf = 1
    for s in tensor.shape[2:]:
        rf *= s
    return tensor.shape[1] * rf, tensor.shape[0] * rf


def _calculate_correct_fan(tensor: Tensor, mode: str) -> int:
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator=None) -> Tensor:
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    a = math.sqrt(3.0) * gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator=None) -> Tensor:
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)), generator)


def kaiming_uniform_(tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                     generator=None) -> Tensor:
    if 0 in tensor.shape:
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=2)
        return tensor
    fan = _calculate_correct_fan(tensor, mode)
    bound = math.sqrt(3.0) * calculate_gain(nonlinearity, a) / math.sqrt(fan)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                    generator=None) -> Tensor:
    if 0 in tensor.shape:
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=2)
        return tensor
    fan = _calculate_correct_fan(tensor, mode)
    return normal_(tensor, 0, calculate_gain(nonlinearity, a) / math.sqrt(fan), generator)


def orthogonal_(tensor: Tensor, gain: float = 1, generator=None) -> Tensor:
    if tensor.ndim < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    if tensor.numel() == 0:
        return tensor
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    _, g = _rng(tensor, generator)
    flat = _on_host(_normal(g, 0.0, 1.0, (rows, cols)))
    if rows < cols:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    xp = _backends.get(tensor.device.type).xp
    return _write(tensor, xp.asarray((gain * q).reshape(tuple(tensor.shape))))


def sparse_(tensor: Tensor, sparsity: float, std: float = 0.01, generator=None) -> Tensor:
    if tensor.ndim != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    rows, cols = tensor.shape
    nz = int(math.ceil(sparsity * rows))
    _, g = _rng(tensor, generator)
    a = _on_host(_normal(g, 0.0, std, (rows, cols)))
    npg = np.random.default_rng(int(generator_for(tensor.device, generator)._np.integers(0, 2**62)))
    for c in range(cols):
        a[npg.permutation(rows)[:nz], c] = 0
    xp = _backends.get(tensor.device.type).xp
    return _write(tensor, xp.asarray(a))


def _deprecated(fn, old):
    def wrapper(*args, **kwargs):
        warnings.warn(f"`nn.init.{old}` is now deprecated in favor of `nn.init.{fn.__name__}`.",
                      FutureWarning, stacklevel=2)
        return fn(*args, **kwargs)
    wrapper.__name__ = old
    return wrapper


uniform = _deprecated(uniform_, "uniform")
normal = _deprecated(normal_, "normal")
constant = _deprecated(constant_, "constant")
xavier_uniform = _deprecated(xavier_uniform_, "xavier_uniform")
xavier_normal = _deprecated(xavier_normal_, "xavier_normal")
kaiming_uniform = _deprecated(kaiming_uniform_, "kaiming_uniform")
kaiming_normal = _deprecated(kaiming_normal_, "kaiming_normal")
orthogonal = _deprecated(orthogonal_, "orthogonal")
