"""`repr(tensor)` in PyTorch's format: `tensor([1., 2.], requires_grad=True)`.

One formatter per tensor picks the number style from the nonzero finite values shown: integers
(`1.`), fixed point with `precision` digits, or scientific when the values span more than three
orders of magnitude, exceed 1e8, or (non-integers) go below 1e-4. All elements are right-aligned
to one width. Rows wrap at `linewidth`; tensors with more than `threshold` elements show only
`edgeitems` items at each end of every dimension. Suffixes (device, size, dtype, grad_fn,
requires_grad, tangent) follow PyTorch's rules for when they appear.
"""
from __future__ import annotations

import math

import numpy as np

from . import _dtype as D
from . import _state


class _PrintOptions:
    precision = 4
    threshold = 1000
    edgeitems = 3
    linewidth = 80
    sci_mode = None


PRINT_OPTS = _PrintOptions()


def set_printoptions(precision=None, threshold=None, edgeitems=None, linewidth=None, profile=None,
                     sci_mode=None) -> None:
    """PyTorch's `set_printoptions`; profile is 'default', 'short' or 'full'."""
    if profile == "default":
        PRINT_OPTS.precision, PRINT_OPTS.threshold, PRINT_OPTS.edgeitems, PRINT_OPTS.linewidth = 4, 1000, 3, 80
    elif profile == "short":
        PRINT_OPTS.precision, PRINT_OPTS.threshold, PRINT_OPTS.edgeitems, PRINT_OPTS.linewidth = 2, 1000, 2, 80
    elif profile == "full":
        PRINT_OPTS.precision, PRINT_OPTS.threshold, PRINT_OPTS.edgeitems, PRINT_OPTS.linewidth = 4, math.inf, 3, 80
    if precision is not None:
        PRINT_OPTS.precision = precision
    if threshold is not None:
        PRINT_OPTS.threshold = threshold
    if edgeitems is not None:
        PRINT_OPTS.edgeitems = edgeitems
    if linewidth is not None:
        PRINT_OPTS.linewidth = linewidth
    PRINT_OPTS.sci_mode = sci_mode


class _Formatter:
    def __init__(self, values: np.ndarray, floating: bool):
        self.floating = floating
        self.int_mode = True
        self.sci_mode = False
        self.width = 1
        p = PRINT_OPTS.precision
        if not floating:
            self.width = max((len(str(v)) for v in values.tolist()), default=1)
            return
        v = values[np.isfinite(values) & (values != 0)].astype(np.float64)
        if v.size == 0:
            return
        a = np.abs(v)
        lo, hi = float(a.min()), float(a.max())
        self.int_mode = bool(np.all(v == np.ceil(v)))
        if self.int_mode:
            self.sci_mode = hi / lo > 1000.0 or hi > 1.0e8
            strs = [f"{x:.{p}e}" for x in v.tolist()] if self.sci_mode else [f"{x:.0f}." for x in v.tolist()]
        else:
            self.sci_mode = hi / lo > 1000.0 or hi > 1.0e8 or lo < 1.0e-4
            strs = [f"{x:.{p}e}" if self.sci_mode else f"{x:.{p}f}" for x in v.tolist()]
        if PRINT_OPTS.sci_mode is not None:
            self.sci_mode = PRINT_OPTS.sci_mode
        self.width = max(len(s) for s in strs)

    def format(self, x) -> str:
        p = PRINT_OPTS.precision
        if self.floating:
            if self.sci_mode:
                s = f"{x:.{p}e}"
            elif self.int_mode:
                s = f"{x:.0f}" + ("" if math.isinf(x) or math.isnan(x) else ".")
            else:
                s = f"{x:.{p}f}"
        else:
            s = str(x)
        return s.rjust(self.width)


def _summarized(a: np.ndarray, k: int) -> np.ndarray:
    """The elements that will be printed: `k` at each end of every long dimension."""
    for d in range(a.ndim):
        if a.shape[d] > 2 * k:
            idx = list(range(k)) + list(range(a.shape[d] - k, a.shape[d]))
            a = np.take(a, idx, axis=d)
    return a


def _vector(a, indent, summarize, fmt) -> str:
    k = PRINT_OPTS.edgeitems
    elem_len = fmt.width + 2
    per_line = max(1, int(math.floor((PRINT_OPTS.linewidth - indent) / elem_len)))
    vals = a.tolist()
    if summarize and len(vals) > 2 * k:
        data = [fmt.format(x) for x in vals[:k]] + [" ..."] + [fmt.format(x) for x in vals[-k:]]
    else:
        data = [fmt.format(x) for x in vals]
    lines = [", ".join(data[i:i + per_line]) for i in range(0, len(data), per_line)]
    return "[" + ("," + "\n" + " " * (indent + 1)).join(lines) + "]"


def _nested(a, indent, summarize, fmt) -> str:
    if a.ndim == 0:
        return fmt.format(a.item())
    if a.ndim == 1:
        return _vector(a, indent, summarize, fmt)
    k = PRINT_OPTS.edgeitems
    n = a.shape[0]
    if summarize and n > 2 * k:
        rows = [_nested(a[i], indent + 1, summarize, fmt) for i in range(k)] + ["..."] + \
               [_nested(a[i], indent + 1, summarize, fmt) for i in range(n - k, n)]
    else:
        rows = [_nested(a[i], indent + 1, summarize, fmt) for i in range(n)]
    return "[" + ("," + "\n" * (a.ndim - 1) + " " * (indent + 1)).join(rows) + "]"


def _complex_body(a, indent, summarize) -> str:
    k = PRINT_OPTS.edgeitems
    shown = _summarized(a, k) if summarize else a
    fr = _Formatter(shown.real.reshape(-1), True)
    fi = _Formatter(shown.imag.reshape(-1), True)

    class _C:
        width = fr.width + fi.width + 2

        @staticmethod
        def format(z):
            im = fi.format(abs(z.imag)).lstrip()
            return (fr.format(z.real) + ("-" if z.imag < 0 or (z.imag == 0 and math.copysign(1, z.imag) < 0)
                                         else "+") + im.rjust(fi.width) + "j")
    return _nested(a, indent, summarize, _C)


def _body(t, indent) -> str:
    a = np.asarray(t._host())
    if t.dtype in D.LOW_PRECISION or t.dtype.name.startswith("float8"):
        a = a.astype(np.float32)
    summarize = a.size > PRINT_OPTS.threshold
    if t.dtype.category == D.COMPLEX:
        return _complex_body(a, indent, summarize)
    shown = _summarized(a, PRINT_OPTS.edgeitems) if summarize else a
    fmt = _Formatter(shown.reshape(-1), t.dtype.category == D.FLOATING)
    return _nested(a, indent, summarize, fmt)


def _add_suffixes(text: str, suffixes, indent: int) -> str:
    parts = [text]
    last = len(text) - text.rfind("\n") + 1
    for s in suffixes:
        if last + len(s) + 2 > PRINT_OPTS.linewidth:
            parts.append(",\n" + " " * indent + s)
            last = indent + len(s)
        else:
            parts.append(", " + s)
            last += len(s) + 2
    parts.append(")")
    return "".join(parts)


def tensor_repr(t, prefix: str = "tensor(") -> str:
    indent = len(prefix)
    suffixes = []
    default_float = _state.default_dtype
    default_complex = D.complex128 if default_float is D.float64 else D.complex64
    has_default_dtype = t.dtype in (default_float, default_complex, D.int64, D.bool)
    default_dev = _state.tls.default_device.type if _state.tls.default_device is not None else "cpu"
    if t.device.type != default_dev or (t.device.type == "cuda" and t.device.index not in (None, 0)):
        suffixes.append(f"device='{t.device}'")
    if t.device.type == "meta":
        body = "..."
        suffixes.append(f"size={tuple(t.shape)}")
        if not has_default_dtype:
            suffixes.append(f"dtype={t.dtype}")
    elif t.numel() == 0:
        body = "[]"
        if t.ndim != 1:
            suffixes.append(f"size={tuple(t.shape)}")
        if t.dtype is not default_float:
            suffixes.append(f"dtype={t.dtype}")
    else:
        body = _body(t, indent)
        if not has_default_dtype:
            suffixes.append(f"dtype={t.dtype}")
    if t.grad_fn is not None:
        name = t.grad_fn.name()
        suffixes.append(f"grad_fn=<{name.rsplit('::', 1)[-1]}>")
    elif t.requires_grad:
        suffixes.append("requires_grad=True")
    if t._fw_grad is not None:
        suffixes.append(f"tangent={tensor_repr(t._fw_grad)}")
    return _add_suffixes(prefix + body, suffixes, indent)
