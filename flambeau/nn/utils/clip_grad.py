"""Gradient clipping: clip_grad_norm_ (total norm over all gradients) and clip_grad_value_.

The foreach path concatenates the gradients of each (device, dtype) group into one array for the norm (a
few vectorised operations), the per-tensor path takes each gradient's norm; the rescale multiplies each
gradient in place. Norms and the clip factor stay on the gradients' device (no host read)."""
from __future__ import annotations

import functools
import math
import warnings

import numpy as np

from ..._tensor import Tensor, _no_grad
from ...optim import _foreach as FE
from ..._ops.creation import tensor
from ..._dtype import promote_types

__all__ = ["clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "get_total_norm", "clip_grads_with_norm_"]


def _grads(parameters):
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p.grad for p in parameters if p.grad is not None]


def _norm(xp, a, norm_type):
    a = a.astype(np.float64) if a.dtype.itemsize < 4 else a
    if norm_type == math.inf:
        return xp.max(xp.abs(a)) if a.size else xp.asarray(0.0)
    if norm_type == -math.inf:
        return xp.min(xp.abs(a)) if a.size else xp.asarray(0.0)
    if norm_type == 0:
        return xp.sum(a != 0).astype(a.dtype)
    return xp.sum(xp.abs(a) ** norm_type) ** (1.0 / norm_type)


def get_total_norm(tensors, norm_type: float = 2.0, error_if_nonfinite: bool = False, foreach=None):
    """The norm of the norms of `tensors`' (device, dtype) groups, as a tensor on the first tensor's device.
    Computed where the tensors are, without reading a value on the host (a cuda training step that clips its
    gradients has no host synchronisation, as PyTorch's), except to raise for `error_if_nonfinite`."""
    if isinstance(tensors, Tensor):
        tensors = [tensors]
    tensors = [t for t in tensors if t is not None]
    norm_type = float(norm_type)
    if not tensors:
        return tensor(0.0)
    first = tensors[0]
    xp = FE.xp_of(first)
    per = []                                      # 0-d arrays on the first tensor's device
    for idx in FE.group_by_device_dtype(range(len(tensors)), tensors):
        ts = [tensors[i] for i in idx]
        gxp = FE.xp_of(ts[0])
        per_tensor = foreach is False or norm_type == 0    # a 0-norm counts the tensors with nonzero norms
        norms = [_norm(gxp, t._data, norm_type) for t in ts] if per_tensor else \
            [_norm(gxp, FE.gather(gxp, [t._data for t in ts]), norm_type)]
        if ts[0].device != first.device:
            norms = [Tensor._make(gxp.asarray(n), ts[0].device).to(first.device)._data for n in norms]
        per += [n.astype(np.float64) if n.dtype != np.float64 else n for n in norms]
    total = _norm(xp, xp.stack(per), norm_type)
    if error_if_nonfinite and not bool(xp.isfinite(total)):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so "
                           "it cannot be clipped. To disable this error and scale the gradients by the non-finite "
                           "norm anyway, set `error_if_nonfinite=False`")
    dtype = functools.reduce(promote_types, {t.dtype for t in tensors})   # PyTorch stacks per-dtype norms
    return Tensor._make(xp.asarray(total).astype(dtype.np), first.device, dtype)


def clip_grads_with_norm_(parameters, max_norm: float, total_norm, foreach=None) -> None:
    """Every gradient times min(max_norm / (total_norm + 1e-6), 1), the factor computed where `total_norm` is
    (a device tensor stays on the device: no host read) and cast to each gradient's dtype."""
    grads = _grads(parameters)
    if not grads:
        return
    if isinstance(total_norm, Tensor):
        txp = FE.xp_of(total_norm)
        coef = Tensor._make(txp.asarray(txp.minimum(float(max_norm) / (total_norm._data.astype(np.float64) + 1e-6),
                                                    1.0)), total_norm.device)
    else:
        coef = min(float(max_norm) / (float(total_norm) + 1e-6), 1.0)          # a number: no device involved
    with _no_grad():
        for idx in FE.group_by_device_dtype(range(len(grads)), grads):
            gs = [grads[i] for i in idx]
            dt = gs[0]._data.dtype
            c = dt.type(coef) if not isinstance(coef, Tensor) else \
                (coef if coef.device == gs[0].device else coef.to(gs[0].device))._data.astype(dt)
            for g in gs:
                g._data *= c
                g._version[0] += 1


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach=None):
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    parameters = list(parameters)
    total = get_total_norm(_grads(parameters), norm_type, error_if_nonfinite, foreach)
    clip_grads_with_norm_(parameters, max_norm, total, foreach)
    return total


def clip_grad_norm(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                   foreach=None):
    warnings.warn("`torch.nn.utils.clip_grad_norm` is now deprecated in favor of `torch.nn.utils.clip_grad_norm_`.",
                  FutureWarning, stacklevel=2)
    return clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


def clip_grad_value_(parameters, clip_value: float, foreach=None) -> None:
    clip_value = float(clip_value)
    grads = _grads(parameters)
    with _no_grad():
        for idx in FE.group_by_device_dtype(range(len(grads)), grads):
            gs = [grads[i] for i in idx]
            xp = FE.xp_of(gs[0])
            if foreach is False:
                for g in gs:
                    xp.clip(g._data, -clip_value, clip_value, out=g._data)
                    g._version[0] += 1
            else:
                flat = FE.gather(xp, [g._data for g in gs])
                xp.clip(flat, -clip_value, clip_value, out=flat)
                FE.scatter(flat, gs)
