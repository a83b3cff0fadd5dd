"""`flambeau.autograd.functional`: jacobian, hessian, vjp, jvp, hvp, vhp over whole functions.

Each works on fresh inputs (detached, requiring grad; or differentiable views of them when
`create_graph=True`) so the caller's graph is untouched, and returns detached results unless
`create_graph=True`. `jvp` and `hvp` use the double-backward trick (reverse mode twice), as
PyTorch's versions do. Tuple-ness of inputs/outputs is mirrored in the results.
"""
from __future__ import annotations

from .. import _state
from .._tensor import Tensor
from .._ops.shape import stack
from .engine import grad as _grad
from .._ops.creation import zeros, zeros_like, ones_like


def _as_tuple(x, arg_name="inputs", fn_name="jacobian"):
    if isinstance(x, Tensor):
        return False, (x,)
    if not isinstance(x, (tuple, list)):
        raise TypeError(f"The {arg_name} given to {fn_name} must be either a Tensor or a tuple of Tensors "
                        f"but the value at index 0 has type {type(x)}.")
    for i, t in enumerate(x):
        if not isinstance(t, Tensor):
            raise TypeError(f"The {arg_name} given to {fn_name} must be either a Tensor or a tuple of "
                            f"Tensors but the value at index {i} has type {type(t)}.")
    return True, tuple(x)


def _prep(inputs, create_graph):
    prev = _state.tls.grad_enabled
    _state.tls.grad_enabled = True
    try:
        return tuple(x.view_as(x) if create_graph and x.requires_grad else x.detach().requires_grad_(True)
                     for x in inputs)
    finally:
        _state.tls.grad_enabled = prev


def _post(xs, create_graph):
    return tuple(x if x is None or create_graph else x.detach() for x in xs)


def _grads(outs, ins, gos, create_graph, strict, retain_graph=True):
    live = [(o, g) for o, g in zip(outs, gos) if o.requires_grad]
    if not live:
        res = (None,) * len(ins)
    else:
        res = _grad([o for o, _ in live], ins, grad_outputs=[g for _, g in live], create_graph=create_graph,
                    retain_graph=retain_graph, allow_unused=True)
    if strict and any(r is None for r in res):
        i = next(k for k, r in enumerate(res) if r is None)
        raise RuntimeError(f"The output of the user-provided function is independent of input {i}. This is "
                           "not allowed in strict mode.")
    return res


def _zeros_for(res, ins):
    return tuple(zeros_like(x) if r is None else r for r, x in zip(res, ins))


def _call(func, ins, name):
    with_grad = _state.tls.grad_enabled
    _state.tls.grad_enabled = True
    try:
        out = func(*ins)
    finally:
        _state.tls.grad_enabled = with_grad
    is_tuple, outs = _as_tuple(out, "outputs of the user-provided function", name)
    return is_tuple, outs


def vjp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(inputs), v^T J)."""
    in_tuple, ins = _as_tuple(inputs, "inputs", "vjp")
    ins = _prep(ins, create_graph)
    out_tuple, outs = _call(func, ins, "vjp")
    if v is None:
        if len(outs) != 1 or outs[0].numel() != 1:
            raise RuntimeError("The vector v can only be None if the user-provided function returns a single "
                               "Tensor with a single element.")
        vs = (ones_like(outs[0]),)
    else:
        vs = _as_tuple(v, "v", "vjp")[1]
    res = _zeros_for(_grads(outs, ins, vs, create_graph, strict), ins)
    outs = _post(outs, create_graph)
    res = _post(res, create_graph)
    return (outs if out_tuple else outs[0]), (res if in_tuple else res[0])


def jvp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(inputs), J v), by differentiating the vjp w.r.t. its (dummy) cotangent."""
    in_tuple, ins = _as_tuple(inputs, "inputs", "jvp")
    ins = _prep(ins, create_graph)
    if v is None:
        if len(ins) != 1 or ins[0].numel() != 1:
            raise RuntimeError("The vector v can only be None if the input to the user-provided function is a "
                               "single Tensor with a single element.")
        vs = (ones_like(ins[0]),)
    else:
        vs = _as_tuple(v, "v", "jvp")[1]
    out_tuple, outs = _call(func, ins, "jvp")
    prev = _state.tls.grad_enabled
    _state.tls.grad_enabled = True
    try:
        us = tuple(zeros_like(o).requires_grad_(True) for o in outs)
        gi = _grads(outs, ins, us, True, strict)
        pairs = [(g, t) for g, t in zip(gi, vs) if g is not None and g.requires_grad]
        if pairs:
            res = _grad([g for g, _ in pairs], us, grad_outputs=[t for _, t in pairs], create_graph=create_graph,
                        allow_unused=True)
        else:
            res = (None,) * len(us)
    finally:
        _state.tls.grad_enabled = prev
    res = _post(_zeros_for(res, outs), create_graph)
    outs = _post(outs, create_graph)
    return (outs if out_tuple else outs[0]), (res if out_tuple else res[0])


def jacobian(func, inputs, create_graph=False, strict=False, vectorize=False, strategy="reverse-mode"):
    """J[i][j] of shape out_i.shape + in_j.shape, nested like the function's outputs and inputs."""
    if strategy not in ("reverse-mode", "forward-mode"):
        raise ValueError('Expected strategy to be either "forward-mode" or "reverse-mode". Hint: If your '
                         'function has more outputs than inputs, "forward-mode" tends to be more performant. '
                         'Otherwise, prefer to use "reverse-mode".')
    in_tuple, ins = _as_tuple(inputs, "inputs", "jacobian")
    ins = _prep(ins, create_graph)
    out_tuple, outs = _call(func, ins, "jacobian")
    jac = []
    for o in outs:
        rows = [[] for _ in ins]
        flat_o = o.reshape(-1)
        for k in range(o.numel()):
            if o.requires_grad:
                gs = _grad(flat_o[k], ins, retain_graph=True, create_graph=create_graph, allow_unused=True)
            else:
                gs = (None,) * len(ins)
            if strict and any(g is None for g in gs):
                raise RuntimeError("Output 0 of the user-provided function is independent of input 0. This is "
                                   "not allowed in strict mode.")
            for j, (g, x) in enumerate(zip(gs, ins)):
                rows[j].append(zeros(x.shape, dtype=x.dtype, device=x.device) if g is None else g)
        jac.append(tuple(
            (stack(r) if r else zeros((0,) + tuple(x.shape), dtype=x.dtype, device=x.device))
            .reshape(tuple(o.shape) + tuple(x.shape)) for r, x in zip(rows, ins)))
    jac = [_post(j, create_graph) for j in jac]
    if out_tuple:
        return tuple(j if in_tuple else j[0] for j in jac)
    return jac[0] if in_tuple else jac[0][0]


def hessian(func, inputs, create_graph=False, strict=False, vectorize=False, outer_jacobian_strategy="reverse-mode"):
    """Jacobian of the gradient of a scalar function."""
    in_tuple, ins = _as_tuple(inputs, "inputs", "hessian")

    def jac_fn(*xs):
        out = func(*xs)
        _, outs = _as_tuple(out, "outputs of the user-provided function", "hessian")
        if len(outs) != 1 or outs[0].numel() != 1:
            raise RuntimeError("The function given to hessian should return a single Tensor with a single "
                               "element.")
        g = _grads(outs, xs, (None,), True, strict)
        return _zeros_for(g, xs)

    res = jacobian(jac_fn, ins, create_graph=create_graph, strict=strict)
    if in_tuple:
        return res
    return res[0][0] if isinstance(res[0], tuple) else res[0]


def _scalar_out(func, ins, name):
    out_tuple, outs = _call(func, ins, name)
    if len(outs) != 1 or outs[0].numel() != 1:
        raise RuntimeError(f"The function given to {name} should return a single Tensor with a single element.")
    return outs[0]


def vhp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(inputs), v^T H)."""
    in_tuple, ins = _as_tuple(inputs, "inputs", "vhp")
    ins = _prep(ins, create_graph)
    vs = _as_tuple(v, "v", "vhp")[1] if v is not None else None
    out = _scalar_out(func, ins, "vhp")
    g = _zeros_for(_grads([out], ins, (None,), True, strict), ins)
    pairs = [(gi, vi) for gi, vi in zip(g, vs) if gi.requires_grad]
    res = _grad([p for p, _ in pairs], ins, grad_outputs=[q for _, q in pairs], create_graph=create_graph,
                allow_unused=True) if pairs else (None,) * len(ins)
    res = _post(_zeros_for(res, ins), create_graph)
    out = out if create_graph else out.detach()
    return out, (res if in_tuple else res[0])


def hvp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(inputs), H v); the Hessian is symmetric for twice-differentiable functions, so H v = v^T H."""
    return vhp(func, inputs, v, create_graph, strict)
