"""Forward-mode AD (`flambeau.autograd.forward_ad`): dual tensors and tangent propagation.

A dual tensor carries its tangent in `Tensor._fw_grad`. The dispatcher calls `propagate(op, args,
kwargs, out)` after any op one of whose inputs has a tangent. There are no per-op forward formulas:
the Jacobian-vector product is obtained from the op's reverse-mode derivative by the double-vjp
trick. The derivative is linear in the output cotangent u, so with g_i(u) = vjp_i(u),

    J v = d/du  sum_i <g_i(u), v_i>

which one reverse pass with respect to a dummy u computes. Every op with a derivative therefore
has forward mode for free. View ops apply themselves to the tangent (so the tangent of a view is
a view of the tangent), and in-place ops write the new tangent into the existing one in place.
"""
from __future__ import annotations

import weakref
from collections import namedtuple

from .._dtype import FLOATING
from .. import _state
from .._tensor import Tensor
from .._ops.creation import zeros_like, zeros
from .._dispatch import write_into
from .._backends import get as _backend
from .graph import OUTPUT_MASK, TensorMeta, result_index
from .engine import grad as _grad

_current_level = -1
_duals: "weakref.WeakSet" = weakref.WeakSet()    # tensors holding a tangent at the current level

UnpackedDualTensor = namedtuple("UnpackedDualTensor", ["primal", "tangent"])


def enter_dual_level() -> int:
    global _current_level
    if _current_level >= 0:
        raise RuntimeError("Nested forward mode AD is not supported at the moment")
    _current_level += 1
    return _current_level


def exit_dual_level(*, level: int | None = None) -> None:
    global _current_level
    if level is None:
        level = _current_level
    if level != _current_level:
        raise RuntimeError("Trying to exit a forward AD level that was not the last one that was created. "
                           "This is not supported.")
    for t in list(_duals):
        t._fw_grad = None
    _duals.clear()
    _current_level -= 1


class dual_level:
    """Context manager for one forward-AD level; tangents are cleared when it exits."""

    def __enter__(self) -> int:
        return enter_dual_level()

    def __exit__(self, *exc) -> None:
        exit_dual_level()


def _set_tangent(t: Tensor, tangent) -> None:
    t._fw_grad = tangent
    if tangent is not None:
        _duals.add(t)


def _alias(t: Tensor) -> Tensor:
    """A new Tensor object over the same data and autograd history, without a tangent."""
    a = Tensor._make(t._data, t._device, t._dtype)
    a._version, a._base, a._view_version = t._version, t._base, t._view_version
    a._grad_fn, a._output_nr, a._requires_grad = t._grad_fn, t._output_nr, t._requires_grad
    return a


def make_dual(tensor: Tensor, tangent: Tensor, *, level: int | None = None) -> Tensor:
    """A view of `tensor` whose tangent is `tangent` (same shape)."""
    if _current_level < 0:
        raise RuntimeError("Trying to create a dual Tensor for forward AD but no level exists, make sure "
                           "to enter_dual_level() first.")
    if not (tensor.is_floating_point() or tensor.is_complex()):
        raise ValueError(f"Expected primal to be floating point or complex, but got: {tensor.dtype}")
    if not (tangent.is_floating_point() or tangent.is_complex()):
        raise ValueError(f"Expected tangent to be floating point or complex, but got: {tangent.dtype}")
    if tangent.shape != tensor.shape:
        raise RuntimeError("Trying to set a forward gradient that has a different size than that of the "
                           f"original Tensor, this is not supported. Tensor is of size {list(tensor.shape)} "
                           f"while the given forward gradient is of size {list(tangent.shape)}.")
    prev = _state.tls.fwd_grad_enabled
    _state.tls.fwd_grad_enabled = False
    try:
        out = tensor.view(tensor.shape)
    finally:
        _state.tls.fwd_grad_enabled = prev
    if tangent.dtype is not tensor.dtype:
        tangent = tangent.to(tensor.dtype)
    _set_tangent(out, tangent)
    return out


def unpack_dual(tensor: Tensor, *, level: int | None = None) -> UnpackedDualTensor:
    """(primal view without tangent, tangent or None)."""
    if not isinstance(tensor, Tensor):
        return UnpackedDualTensor(tensor, None)
    if tensor._fw_grad is None:
        return UnpackedDualTensor(tensor, None)
    prev = _state.tls.fwd_grad_enabled
    _state.tls.fwd_grad_enabled = False
    try:
        primal = tensor.view(tensor.shape)
    finally:
        _state.tls.fwd_grad_enabled = prev
    primal._fw_grad = None
    return UnpackedDualTensor(primal, tensor._fw_grad)


def _strip(v):
    if isinstance(v, Tensor):
        return _alias(v) if v._fw_grad is not None else v
    if type(v) in (list, tuple):
        return type(v)(_strip(x) for x in v)
    return v


def _tangents_of(v):
    if isinstance(v, Tensor):
        return v._fw_grad
    if type(v) in (list, tuple):
        return [x._fw_grad if isinstance(x, Tensor) else None for x in v]
    return None


def _view_tangent(op, args, kwargs, out):
    """View ops: the same view of the input's tangent."""
    self = args[0] if args else kwargs["self"]
    rest = list(args[1:]) if args else []
    kw = {k: v for k, v in (kwargs or {}).items() if k != "self"}
    t = op(self._fw_grad, *rest, **kw) if args else op(self=self._fw_grad, **kw)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    ts = t if isinstance(t, (tuple, list)) else (t,)
    for o, tt in zip(outs, ts):
        if isinstance(o, Tensor):
            _set_tangent(o, tt)


def propagate(op, args, kwargs, out) -> None:
    """Give the outputs of `op(*args, **kwargs) -> out` their tangents."""
    if _current_level < 0:
        return
    prev_fw, prev_grad = _state.tls.fwd_grad_enabled, _state.tls.grad_enabled
    _state.tls.fwd_grad_enabled = False
    try:
        if op.is_view:
            self = args[0] if args else kwargs["self"]
            if self._fw_grad is not None:
                _view_tangent(op, args, kwargs, out)
                return
        if op.derivative is None:
            return
        _jvp_by_double_vjp(op, args, kwargs or {}, out, prev_grad)
    finally:
        _state.tls.fwd_grad_enabled, _state.tls.grad_enabled = prev_fw, prev_grad


def _jvp_by_double_vjp(op, args, kwargs, out, grad_was_enabled):
    outs = out if isinstance(out, (tuple, list)) else (out,)
    diff = [isinstance(o, Tensor) and o._dtype.category >= FLOATING for o in outs]
    if not any(diff):
        return
    bound = op.bind(*args, **kwargs)
    names = [a.name for a in op._schema.args]
    tangents = [_tangents_of(bound[i]) for i in op.tensor_args]
    # higher order (forward over reverse): keep the graph when anything involved requires grad
    create = grad_was_enabled and (any(isinstance(v, Tensor) and v._requires_grad
                                       for v in _flat(bound)) or
                                   any(t is not None and t._requires_grad for t in _flat(tangents)))
    _state.tls.grad_enabled = True
    us = [zeros_like(o).requires_grad_() if d else None for o, d in zip(outs, diff)]
    kw = {}
    for n in op.saved_names:
        if n == "result":
            kw[n] = _strip(out)
        elif n == OUTPUT_MASK:          # the gradients paired with a tangent
            kw[n] = tuple(t is not None and (type(t) is not list or any(x is not None for x in t))
                          for t in tangents)
        elif (k := result_index(n)) is not None:
            kw[n] = _strip(outs[k])
        elif n.endswith("_geometry") and n not in names:
            kw[n] = TensorMeta.geometry(bound[names.index(n[:-9])])
        elif n.endswith("_meta") and n not in names:
            v = bound[names.index(n[:-5])]
            kw[n] = TensorMeta(v) if isinstance(v, Tensor) else \
                [TensorMeta(x) if isinstance(x, Tensor) else None for x in v] if type(v) in (list, tuple) else v
        else:
            kw[n] = _strip(bound[names.index(n)])
    g_in = us[0] if len(outs) == 1 else tuple(u if u is not None else zeros_like(o) for u, o in zip(us, outs))
    if len(outs) == 1 and us[0] is None:
        return
    res = op.derivative(g_in, **kw)
    if not isinstance(res, (tuple, list)) or (len(op.tensor_args) == 1 and isinstance(res, list)):
        res = (res,)
    total = None
    for g, v in zip(res, tangents):
        gl, vl = (g, v) if type(v) is list else ([g], [v])
        for gi, vi in zip(gl if gl is not None else [], vl):
            if gi is None or vi is None:
                continue
            if gi.is_complex():
                gi = gi.conj()
            term = (gi * vi).sum()
            total = term if total is None else total + term
    live = [u for u in us if u is not None]
    if total is None or not total._requires_grad:
        jvps = [None] * len(live)
    else:
        jvps = list(_grad(total, live, allow_unused=True, create_graph=create))
    _state.tls.grad_enabled = grad_was_enabled
    k = 0
    for o, d in zip(outs, diff):
        if not d:
            continue
        j = jvps[k]
        k += 1
        if j is None:
            j = zeros_like(o)
        elif not create:
            j = j.detach()
        _set_tangent(o, j)


def _flat(v):
    for x in (v if type(v) in (list, tuple) else [v]):
        if type(x) in (list, tuple):
            yield from x
        else:
            yield x


def set_inplace_tangent(self: Tensor, new_tangent) -> None:
    """After `self.op_(...)`: write the new tangent into self's tangent in place (views share it)."""
    if new_tangent is None:
        return
    prev = _state.tls.fwd_grad_enabled, _state.tls.grad_enabled
    _state.tls.fwd_grad_enabled = False
    try:
        if self._fw_grad is None and self._base is not None:
            _give_base_tangent(self)
        if self._fw_grad is None:
            _set_tangent(self, new_tangent.to(self._dtype) if new_tangent._dtype is not self._dtype else new_tangent)
            return
        write_into(self._fw_grad, new_tangent.detach(), "copy_")
    finally:
        _state.tls.fwd_grad_enabled, _state.tls.grad_enabled = prev


def _give_base_tangent(view: Tensor) -> None:
    """A view of a tensor without tangent is about to get one: give the base a zero tangent and
    the view the matching strided window of it, so the base sees the view's tangent."""
    base = view._base
    if base.storage_offset() != 0 or not base.is_contiguous() or view._device.type == "meta":
        return
    if base._fw_grad is None:
        _set_tangent(base, zeros(base.shape, dtype=base._dtype, device=base._device))
    bt = base._fw_grad
    if not bt.is_contiguous():
        return
    xp = _backend(view._device.type).xp
    it = bt._data.itemsize
    flat = bt._data.reshape(-1)
    arr = xp.lib.stride_tricks.as_strided(flat[view.storage_offset():], shape=view._data.shape,
                                          strides=tuple(s * it for s in view.stride()))
    t = Tensor._make(arr, view._device, view._dtype)
    t._base = bt
    t._version = bt._version
    _set_tangent(view, t)


__all__ = ["dual_level", "make_dual", "unpack_dual", "enter_dual_level", "exit_dual_level",
           "UnpackedDualTensor"]
