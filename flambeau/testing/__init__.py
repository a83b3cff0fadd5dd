"""torch.testing: `assert_close` (and the deprecated `assert_allclose`) with PyTorch's rules.

Tensors (and NumPy arrays) are compared elementwise: `|actual - expected| <= atol + rtol * |expected|`,
with the default tolerances of the dtype (PyTorch's table), after checking shape, dtype and device
(each check can be turned off). Python numbers compare as float64/int64/complex128 scalars; lists,
tuples and dicts compare item by item and say which item failed. The messages are PyTorch's.
"""
from __future__ import annotations

import collections.abc
import math

import numpy as np

from .. import _dtype as D
from .._tensor import Tensor

__all__ = ["assert_close", "assert_allclose"]

# dtype -> (rtol, atol), as torch.testing._comparison.default_tolerances
_TOLERANCES = {D.float16: (1e-3, 1e-5), D.bfloat16: (1.6e-2, 1e-5), D.float32: (1.3e-6, 1e-5),
               D.float64: (1e-7, 1e-7), D.complex64: (1.3e-6, 1e-5), D.complex128: (1e-7, 1e-7)}
_NUMBER_DTYPE = {bool: D.bool, int: D.int64, float: D.float64, complex: D.complex128}


def _tolerances(*dtypes) -> tuple[float, float]:
    pairs = [_TOLERANCES.get(dt, (0.0, 0.0)) for dt in dtypes]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)


def _host(x) -> np.ndarray:
    if isinstance(x, Tensor):
        return np.asarray(x.detach()._host())
    return np.asarray(x)


def _dtype_of(x):
    if isinstance(x, Tensor):
        return x.dtype
    return D.FROM_NP[np.asarray(x).dtype]


def _index(flat: int, shape: tuple) -> tuple:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def _mismatch_message(actual: np.ndarray, expected: np.ndarray, close: np.ndarray, rtol: float, atol: float,
                      exact: bool) -> str:
    shape = expected.shape
    common = np.result_type(actual.dtype, expected.dtype)      # PyTorch takes differences in this dtype
    if common.kind in "biu":
        a, e = actual.astype(np.int64).ravel(), expected.astype(np.int64).ravel()
        abs_diff = np.abs(a - e)
        with np.errstate(divide="ignore", invalid="ignore"):
            rel_diff = abs_diff.astype(np.float32) / np.abs(e).astype(np.float32)
    else:
        a, e = actual.astype(common).ravel(), expected.astype(common).ravel()
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            abs_diff = np.abs(a - e)
            rel_diff = abs_diff / np.abs(e)
    abs_diff, rel_diff = abs_diff.astype(np.float64), rel_diff.astype(np.float64)
    bad = ~close.ravel()
    n_bad, n = int(bad.sum()), close.size
    masked_abs = np.where(bad, abs_diff, 0.0)
    masked_rel = np.where(bad, rel_diff, 0.0)
    i_abs = int(np.argmax(np.where(np.isnan(masked_abs), np.inf, masked_abs)))
    i_rel = int(np.argmax(np.where(np.isnan(masked_rel), np.inf, masked_rel)))
    head = "Tensor-likes are not equal!" if exact else "Tensor-likes are not close!"
    abs_v, rel_v = abs_diff[i_abs], rel_diff[i_rel]
    if exact and abs_v == int(abs_v):
        abs_v = int(abs_v)
    abs_line = f"Greatest absolute difference: {abs_v} at index {_index(i_abs, shape)}"
    rel_line = f"Greatest relative difference: {rel_v} at index {_index(i_rel, shape)}"
    if not exact:
        abs_line += f" (up to {atol} allowed)"
        rel_line += f" (up to {rtol} allowed)"
    return (f"{head}\n\nMismatched elements: {n_bad} / {n} ({100.0 * n_bad / n:.1f}%)\n"
            f"{abs_line}\n{rel_line}")


def _close(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float, equal_nan: bool) -> np.ndarray:
    wide = np.complex128 if np.iscomplexobj(actual) or np.iscomplexobj(expected) else np.float64
    a, e = actual.astype(wide), expected.astype(wide)
    with np.errstate(invalid="ignore", over="ignore"):
        close = (a == e) | (np.abs(a - e) <= atol + rtol * np.abs(e))
    if equal_nan:
        close |= np.isnan(a) & np.isnan(e)
    return close


def _compare_tensors(actual, expected, rtol, atol, equal_nan, check_device, check_dtype) -> None:
    shape_a, shape_e = tuple(actual.shape), tuple(expected.shape)
    if shape_a != shape_e:
        raise AssertionError(f"The values for attribute 'shape' do not match: {_size(actual)} != {_size(expected)}.")
    dt_a, dt_e = _dtype_of(actual), _dtype_of(expected)
    if check_dtype and dt_a is not dt_e:
        raise AssertionError(f"The values for attribute 'dtype' do not match: {dt_a} != {dt_e}.")
    if check_device and isinstance(actual, Tensor) and isinstance(expected, Tensor) and \
            actual.device != expected.device:
        raise AssertionError(f"The values for attribute 'device' do not match: {actual.device} != {expected.device}.")
    if rtol is None:
        rtol, atol = _tolerances(dt_a, dt_e)
    a, e = _host(actual), _host(expected)
    close = _close(a, e, rtol, atol, equal_nan)
    if not close.all():
        raise AssertionError(_mismatch_message(a, e, close, rtol, atol, exact=rtol == 0 and atol == 0))


def _size(x) -> str:
    return f"torch.Size({list(x.shape)})"


def _compare_numbers(actual, expected, rtol, atol, equal_nan) -> None:
    if rtol is None:
        rtol, atol = _tolerances(_NUMBER_DTYPE[type(actual)], _NUMBER_DTYPE[type(expected)])
    if actual == expected or (equal_nan and _isnan(actual) and _isnan(expected)):
        return
    diff = abs(actual - expected)
    if diff <= atol + rtol * abs(expected):
        return
    rel = diff / abs(expected) if expected != 0 else math.inf
    if rtol == 0 and atol == 0:
        raise AssertionError(f"Scalars are not equal!\n\nExpected {expected} but got {actual}.\n"
                             f"Absolute difference: {diff}\nRelative difference: {rel}")
    raise AssertionError(f"Scalars are not close!\n\nExpected {expected} but got {actual}.\nAbsolute difference: "
                         f"{diff} (up to {atol} allowed)\nRelative difference: {rel} (up to {rtol} allowed)")


def _isnan(x) -> bool:
    return isinstance(x, (float, complex)) and x != x


def _tensor_like(x) -> bool:
    return isinstance(x, (Tensor, np.ndarray))


def _number(x) -> bool:
    return isinstance(x, (bool, int, float, complex))


def _compare(actual, expected, where: str, **kw) -> None:
    try:
        if _tensor_like(actual) and _tensor_like(expected):
            return _compare_tensors(actual, expected, kw["rtol"], kw["atol"], kw["equal_nan"], kw["check_device"],
                                    kw["check_dtype"])
        if _number(actual) and _number(expected) and type(actual) is type(expected):
            return _compare_numbers(actual, expected, kw["rtol"], kw["atol"], kw["equal_nan"])
    except AssertionError as e:
        raise AssertionError(f"{e}\n\nThe failure occurred for item {where}" if where else str(e)) from None
    if isinstance(actual, collections.abc.Mapping) and isinstance(expected, collections.abc.Mapping):
        if set(actual) != set(expected):
            raise AssertionError(f"The keys of the mappings do not match:\n{sorted(map(str, actual))} != "
                                 f"{sorted(map(str, expected))}")
        for key in expected:
            _compare(actual[key], expected[key], f"{where}[{key!r}]", **kw)
        return
    if isinstance(actual, collections.abc.Sequence) and isinstance(expected, collections.abc.Sequence) and \
            not isinstance(actual, str) and not isinstance(expected, str):
        if len(actual) != len(expected):
            raise AssertionError(f"The length of the sequences mismatch: {len(actual)} != {len(expected)}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            _compare(a, e, f"{where}[{i}]", **kw)
        return
    if type(actual) is not type(expected) and _number(actual) and _number(expected):
        raise AssertionError(f"The (d)types do not match: {type(actual)} != {type(expected)}.")
    raise TypeError(f"No comparison pair was able to handle inputs of type {type(actual)} and {type(expected)}.")


def assert_close(actual, expected, *, allow_subclasses: bool = True, rtol: float | None = None,
                 atol: float | None = None, equal_nan: bool = False, check_device: bool = True,
                 check_dtype: bool = True, check_layout: bool = True, check_stride: bool = False,
                 msg=None) -> None:
    """Raise AssertionError unless `actual` and `expected` are close (see the module docstring)."""
    if (rtol is None) != (atol is None):
        missing = "rtol" if rtol is None else "atol"
        raise ValueError(f"Both 'rtol' and 'atol' must be either specified or omitted, but got no {missing}.")
    try:
        _compare(actual, expected, "", rtol=rtol, atol=atol, equal_nan=equal_nan, check_device=check_device,
                 check_dtype=check_dtype)
    except AssertionError as e:
        if msg is None:
            raise
        raise AssertionError(msg(str(e)) if callable(msg) else msg) from None


def assert_allclose(actual, expected, rtol: float | None = None, atol: float | None = None,
                    equal_nan: bool = True, msg: str = "") -> None:
    """Deprecated in PyTorch for assert_close; dtypes and devices are not checked."""
    if (rtol is None) != (atol is None):
        raise ValueError("rtol and atol must both be specified or both be unspecified")
    assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=equal_nan, check_device=False,
                 check_dtype=False, msg=msg or None)
