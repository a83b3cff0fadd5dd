"""`repr(tensor)` in PyTorch's format: `tensor([1., 2.], requires_grad=True)`."""
from __future__ import annotations

import numpy as np

from . import _dtype as D
from . import _state


def _fmt_array(a: np.ndarray, dt) -> str:
    if dt in D.LOW_PRECISION:
        a = a.astype(np.float32)
    if a.size == 0:
        return "[]"
    if dt.category == 2:
        fin = a[np.isfinite(a)]
        ints = fin.size == 0 or bool(np.all(fin == np.round(fin)))
        big = fin.size and (np.abs(fin).max() >= 1e8 or (np.abs(fin[fin != 0]).min(initial=1) < 1e-4))
        if big:
            fmt = lambda x: f"{x:.4e}"  # noqa: E731
        elif ints:
            fmt = lambda x: f"{x:.0f}." if np.isfinite(x) else _nonfinite(x)  # noqa: E731
        else:
            fmt = lambda x: f"{x:.4f}" if np.isfinite(x) else _nonfinite(x)  # noqa: E731
    elif dt.category == 0:
        fmt = lambda x: "True" if x else "False"  # noqa: E731
    elif dt.category == 3:
        fmt = lambda x: f"{x.real:.4f}{x.imag:+.4f}j"  # noqa: E731
    else:
        fmt = str
    flat = [fmt(x) for x in a.reshape(-1)]
    width = max(len(s) for s in flat)
    flat = [s.rjust(width) for s in flat]
    if a.ndim == 0:
        return flat[0]
    return _nest(flat, a.shape, 0, 7)


def _nonfinite(x):
    return "nan" if np.isnan(x) else ("inf" if x > 0 else "-inf")


def _nest(flat, shape, depth, indent):
    if len(shape) == 1:
        if shape[0] > 1000:
            items = flat[:3] + ["..."] + flat[-3:]
        else:
            items = flat
        return "[" + ", ".join(items) + "]"
    n = shape[0]
    step = len(flat) // n if n else 0
    rows = [_nest(flat[i * step:(i + 1) * step], shape[1:], depth + 1, indent) for i in range(n)]
    sep = "," + "\n" * (len(shape) - 1) + " " * (indent + depth + 1)
    return "[" + sep.join(rows) + "]"


def tensor_repr(t) -> str:
    suffix = []
    if t.device.type != "cpu":
        suffix.append(f"device='{t.device}'")
    if t.device.type == "meta":
        body = "..."
        suffix.append(f"size={tuple(t.shape)}")
    else:
        a = t._host()
        body = _fmt_array(np.asarray(a), t.dtype)
        if t.numel() == 0 and t.ndim != 1:
            suffix.append(f"size={tuple(t.shape)}")
    default_int = t.dtype is D.int64
    default_float = t.dtype is _state.default_dtype
    if not (default_float or default_int or t.dtype is D.bool) or (t.numel() == 0 and not default_float):
        suffix.append(f"dtype={t.dtype}")
    if t.grad_fn is not None:
        suffix.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t.requires_grad:
        suffix.append("requires_grad=True")
    return "tensor(" + body + "".join(", " + s for s in suffix) + ")"
