"""`flambeau.func`'s differentiation transforms: grad, grad_and_value, vjp, jvp, linearize, jacrev,
jacfwd, hessian (PyTorch's `torch.func` names, arguments, results and errors).

Every transform runs on the reverse-mode engine (`flambeau.autograd.grad`):
- an input to differentiate becomes a fresh leaf requiring grad (`x.detach().requires_grad_()`), or a
  differentiable alias (`x.view_as(x)`) when it already requires grad, so an enclosing transform (or
  the user's own autograd) still sees through it;
- the gradient is taken with `create_graph=True` only when the function's graph reaches a tensor
  requiring grad that the transform did not make (an enclosing `grad`, a captured parameter) and grad
  mode was on at the call; the results are then differentiable by whoever made that tensor, which
  is how `grad(grad(f))`, `jacfwd(jacrev(f))` and `hessian` compose. Otherwise results are detached;
- forward mode (`jvp`, `jacfwd`, `linearize`) is the double-vjp: `g(u) = vjp(f)(u)` is linear in the
  cotangent `u`, so `d/du <g(u), t> = J t`. It needs only the derivatives already declared with
  each operator (they are written in flambeau ops, hence differentiable again);
- Jacobians push a whole basis through one vjp (or jvp) under `vmap` (`_functorch.vmap`), in chunks
  of `chunk_size` rows.

Under `vmap` a transform works on physical tensors: `_functorch.batched.peel` turns each input into
a tensor carrying every active vmap level as a leading dimension, the function sees it re-wrapped,
and gradients of a batched output are per example (the levels never mix: no batching rule sums over
a batch dimension). `grad` of a function of an unbatched input under vmap therefore gives a batched
gradient, as torch.func does (per-sample gradients).
"""
from __future__ import annotations

import functools
from typing import Callable

from .. import _state
from .._tensor import Tensor
from ..autograd.engine import grad as _autograd_grad
from ..autograd.graph import accumulator, reachable_leaves
from ..utils._pytree import tree_flatten, tree_unflatten
from .._ops.creation import zeros_like, zeros, eye, ones_like
from .._ops.shape import cat
from . import batched as _batched
from .vmap import vmap


# ---- argnums ---------------------------------------------------------------------------------
def _wrap_argnum(argnum, num_args: int) -> int:
    if not isinstance(argnum, int):
        raise RuntimeError(f"argnum must be int, got: {type(argnum)}")
    if 0 <= argnum < num_args:
        return argnum
    if -num_args <= argnum < 0:
        return argnum + num_args
    raise RuntimeError(f"Got argnum={argnum}, but only {num_args} positional inputs")


def _wrap_argnums(argnums, num_args: int):
    if isinstance(argnums, int):
        return _wrap_argnum(argnums, num_args)
    if isinstance(argnums, tuple):
        if len(argnums) == 0:
            raise RuntimeError("argnums must be non-empty")
        if len(set(argnums)) != len(argnums):
            raise RuntimeError(f"argnums elements must be unique, got {argnums}")
        return tuple(_wrap_argnum(a, num_args) for a in argnums)
    raise RuntimeError(f"argnums must be int or Tuple[int, ...], got: {type(argnums)}")


def _slice_argnums(args: tuple, argnums):
    argnums = _wrap_argnums(argnums, len(args))
    if isinstance(argnums, int):
        return args[argnums], argnums
    return tuple(args[i] for i in argnums), argnums


def _replace_args(args: tuple, new, argnums) -> tuple:
    if isinstance(argnums, int):
        return tuple(new if i == argnums else a for i, a in enumerate(args))
    return tuple(new[argnums.index(i)] if i in argnums else a for i, a in enumerate(args))


# ---- one differentiation level -----------------------------------------------------------------
class _Level:
    """The inputs one transform differentiates and whether its results stay attached outside."""

    def __init__(self):
        self.outer_grad = _state.tls.grad_enabled
        self.private: set = set()        # ids of the leaves this level made
        self.leaves: list = []           # keep them alive while their ids are in `private`
        self.depth = _batched.depth()    # vmap levels active at entry: they are peeled into physical dims

    def differentiable(self, x):
        if not isinstance(x, Tensor):
            raise ValueError(f"Thing passed to transform API must be Tensor, got {type(x)}")
        p = _batched.peel(x, self.depth)
        with _GradOn():
            if p.requires_grad:
                leaf = p.view_as(p)
            else:
                leaf = p.detach().requires_grad_(True)
                self.private.add(id(leaf))
                self.leaves.append(leaf)
        return leaf

    def reaches_outside(self, outs) -> bool:
        """Whether the graph of `outs` (physical tensors) reaches a tensor requiring grad that this
        level did not make (then results must stay differentiable for it)."""
        if not self.outer_grad:
            return False
        roots = [o.grad_fn for o in outs if isinstance(o, Tensor) and o.grad_fn is not None]
        roots += [accumulator(o) for o in outs if isinstance(o, Tensor) and o.grad_fn is None and o._requires_grad]
        return any(id(node.variable) not in self.private for node in reachable_leaves(roots))


class _GradOn:
    def __enter__(self):
        self.prev = _state.tls.grad_enabled
        _state.tls.grad_enabled = True

    def __exit__(self, *exc):
        _state.tls.grad_enabled = self.prev
        return False


def _grads(outs, ins, gouts, create_graph: bool, retain_graph: bool = True):
    """Gradients of physical `outs` (with cotangents `gouts`) wrt physical leaves `ins`; zeros where
    unused."""
    live = [(o, g) for o, g in zip(outs, gouts) if o._requires_grad]
    if not live:
        return tuple(zeros_like(x) for x in ins)
    with _GradOn() if create_graph else _GradOff():
        res = _autograd_grad([o for o, _ in live], ins, grad_outputs=[g for _, g in live],
                             retain_graph=retain_graph, create_graph=create_graph, allow_unused=True)
    return tuple(zeros_like(x) if r is None else r for r, x in zip(res, ins))


class _GradOff(_GradOn):
    def __enter__(self):
        self.prev = _state.tls.grad_enabled
        _state.tls.grad_enabled = False


def _finish(level: _Level, t, attached: bool):
    """A result leaving the level: detached unless it must stay differentiable outside; re-batched."""
    if isinstance(t, Tensor) and not attached:
        t = t.detach()
    return _batched.unpeel(t, level.depth) if isinstance(t, Tensor) else t


# ---- vjp ---------------------------------------------------------------------------------------
def _vjp(func, primals: tuple, argnums, has_aux: bool, api: str):
    """Run `func` once; return (level, outputs (physical, flat), output spec, diff leaves, diff spec,
    aux, args with leaves)."""
    level = _Level()
    if argnums is None:
        diff = primals
    else:
        diff, argnums = _slice_argnums(primals, argnums)
    flat_diff, diff_spec = tree_flatten(diff)
    leaves = [level.differentiable(x) for x in flat_diff]
    wrapped = tree_unflatten([_batched.unpeel(p, level.depth) for p in leaves], diff_spec)
    args = wrapped if argnums is None else _replace_args(primals, wrapped, argnums)
    with _GradOn():
        out = func(*args)
    aux = None
    if has_aux:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise RuntimeError(f"{api}: output of function f should be a tuple: (output, aux) if has_aux is True")
        out, aux = out
    return level, out, aux, leaves, diff_spec


def vjp(func: Callable, *primals, has_aux: bool = False):
    """`(output, vjp_fn)` or `(output, vjp_fn, aux)`: `vjp_fn(cotangents)` gives the vector-Jacobian
    products, one per primal (in the primals' structure)."""
    return _vjp_with_argnums(func, *primals, has_aux=has_aux)


def _vjp_with_argnums(func, *primals, argnums=None, has_aux=False):
    api = "vjp(f, *primals)"
    level, out, aux, leaves, diff_spec = _vjp(func, primals, argnums, has_aux, api)
    flat_out, out_spec = tree_flatten(out)
    if (len(flat_out) == 1 and flat_out[0] is None) or len(flat_out) < 1:
        raise RuntimeError(f"{api}: Expected f to be a function that has non-empty output (got output = {out})")
    for o in flat_out:
        if not isinstance(o, Tensor):
            raise RuntimeError(f"{api}: expected f(*primals) to return only tensors, got unsupported type {type(o)}")
        if not (o.is_floating_point() or o.is_complex()):
            raise RuntimeError(f"vjp(f, ...): All outputs of f must be floating-point or complex Tensors, "
                               f"got Tensor with dtype {o.dtype}")
    phys_out = [_batched.peel(o, level.depth) for o in flat_out]
    attached = level.reaches_outside(phys_out)
    flat_aux, aux_spec = tree_flatten(aux)

    def vjp_fn(cotangents, retain_graph: bool = True, create_graph: bool | None = None):
        flat_ct, ct_spec = tree_flatten(cotangents)
        if ct_spec != out_spec:
            raise RuntimeError(f"Expected pytree structure of cotangents to be the same as pytree structure of "
                               f"outputs to the function. cotangents: {ct_spec}, primal output: {out_spec}")
        gouts = []
        for o, ct in zip(flat_out, flat_ct):
            if not isinstance(ct, Tensor):
                raise RuntimeError(f"vjp_fn: expected cotangents to be Tensors, got {type(ct)}")
            if tuple(ct.shape) != tuple(o.shape):
                raise RuntimeError(f"Mismatch in shape: grad_output[0] has a shape of {ct.shape} and "
                                   f"output[0] has a shape of {o.shape}.")
            gouts.append(_batched.peel(ct, level.depth))
        graph = attached if create_graph is None else (create_graph and _state.tls.grad_enabled) or attached
        res = _grads(phys_out, leaves, gouts, graph, retain_graph)
        res = [_finish(level, r, graph) for r in res]
        return tree_unflatten(res, diff_spec)

    outputs = tree_unflatten([_finish(level, o, attached) for o in phys_out], out_spec)
    if has_aux:
        auxs = tree_unflatten([_finish(level, _batched.peel(a, level.depth), attached)
                               if isinstance(a, Tensor) else a for a in flat_aux], aux_spec)
        return outputs, vjp_fn, auxs
    return outputs, vjp_fn


# ---- grad --------------------------------------------------------------------------------------
def grad_and_value(func: Callable, argnums=0, has_aux: bool = False) -> Callable:
    """`f -> (grad of f wrt args[argnums], f(*args))`; with `has_aux`, f returns `(output, aux)` and
    the value is `(output, aux)`."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        api = "grad_and_value(f)(*args)"
        level, out, aux, leaves, diff_spec = _vjp(lambda *a: func(*a, **kwargs), args, argnums, has_aux, api)
        if not isinstance(out, Tensor):
            raise RuntimeError(f"{api}: Expected f(*args) to return a Tensor, got {type(out)}")
        if out.dim() != 0:
            raise RuntimeError(f"{api}: Expected f(*args) to return a scalar Tensor, got tensor with {out.dim()} "
                               "dims. Maybe you wanted to use the vjp or jacrev APIs instead?")
        p = _batched.peel(out, level.depth)
        attached = level.reaches_outside([p])
        res = _grads([p], leaves, [ones_like(p)], attached, retain_graph=attached)
        grads = tree_unflatten([_finish(level, r, attached) for r in res], diff_spec)
        value = _finish(level, p, attached)
        if has_aux:
            flat_aux, aux_spec = tree_flatten(aux)
            aux = tree_unflatten([_finish(level, _batched.peel(a, level.depth), attached)
                                  if isinstance(a, Tensor) else a for a in flat_aux], aux_spec)
            return grads, (value, aux)
        return grads, value
    _no_dynamo(wrapper)
    return wrapper


def grad(func: Callable, argnums=0, has_aux: bool = False) -> Callable:
    """`f -> grad of f wrt args[argnums]` (f returns a scalar Tensor); with `has_aux`, `(grad, aux)`."""
    gv = grad_and_value(func, argnums, has_aux)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        g, value = gv(*args, **kwargs)
        if has_aux:
            return g, value[1]
        return g
    _no_dynamo(wrapper)
    return wrapper


# ---- forward mode (double vjp) -------------------------------------------------------------------
class _Linearized:
    """f's outputs at the primals and the retained graph that maps tangents to output tangents."""

    def __init__(self, func, primals: tuple, argnums, has_aux: bool, api: str):
        self.api = api
        level, out, aux, leaves, diff_spec = _vjp(func, primals, argnums, has_aux, api)
        self.level, self.leaves, self.diff_spec, self.aux = level, leaves, diff_spec, aux
        flat_out, self.out_spec = tree_flatten(out)
        for o in flat_out:
            if not isinstance(o, Tensor):
                raise RuntimeError(f"{api}: expected f(*args) to return only tensors, got unsupported type {type(o)}")
        self.flat_out = flat_out
        self.phys_out = [_batched.peel(o, level.depth) for o in flat_out]
        self.attached = level.reaches_outside(self.phys_out)
        # g(u) = sum_o u_o^T J_o, differentiable in u (u are this level's own leaves)
        with _GradOn():
            self.us = [zeros_like(p).requires_grad_(True) for p in self.phys_out]
        level.private.update(id(u) for u in self.us)
        level.leaves.extend(self.us)
        self.g = _grads(self.phys_out, leaves, self.us, create_graph=True)

    def push(self, flat_tangents, retain_graph: bool = True, strict: bool = False):
        """Output tangents J t for flat tangents (logical tensors, one per differentiated leaf)."""
        ts = []
        for t in flat_tangents[:len(self.leaves)]:
            ts.append(_batched.peel(t, self.level.depth))
        live = [(g, t) for g, t in zip(self.g, ts) if g._requires_grad]
        graph = self.attached
        if not live:
            if strict:
                raise RuntimeError("jvp(f, primals, tangents, strict=True): The output of f is independent of the "
                                   "inputs. This is not allowed with strict=True.")
            res = [zeros_like(u) for u in self.us]
        else:
            res = list(_grads([g for g, _ in live], self.us, [t for _, t in live], graph, retain_graph))
        return [_finish(self.level, r, self.attached) for r in res]

    def outputs(self):
        return tree_unflatten([_finish(self.level, p, self.attached) for p in self.phys_out], self.out_spec)

    def aux_out(self):
        flat_aux, aux_spec = tree_flatten(self.aux)
        return tree_unflatten([_finish(self.level, _batched.peel(a, self.level.depth), self.attached)
                               if isinstance(a, Tensor) else a for a in flat_aux], aux_spec)


def _check_tangents(api: str, diff, tangents):
    flat_p, p_spec = tree_flatten(diff)
    flat_t, t_spec = tree_flatten(tangents)
    if p_spec != t_spec:
        raise RuntimeError(f"{api}: Expected primals and tangents to have the same python structure. For example, "
                           f"if primals is a tuple of 3 tensors, tangents also must be. Got primals with structure "
                           f"{p_spec} and tangents with structure {t_spec}")
    if len(flat_p) == 0:
        raise RuntimeError(f"{api}: Expected primals to contain at least one Tensor.")
    for p, t in zip(flat_p, flat_t):
        if not isinstance(p, Tensor):
            raise RuntimeError(f"{api}: Expected primals to only contain Tensors, got {type(p)}")
        if not isinstance(t, Tensor):
            raise RuntimeError(f"{api}: Expected tangents to only contain Tensors, got {type(t)}")
        if tuple(p.shape) != tuple(t.shape):
            raise RuntimeError("Trying to set a forward gradient that has a different size than that of the original "
                               f"Tensor, this is not supported. Tensor is of size {list(p.shape)} while the given "
                               f"forward gradient is of size {list(t.shape)}.")
    return flat_t


def jvp(func: Callable, primals, tangents, *, strict: bool = False, has_aux: bool = False):
    """`(f(*primals), J tangents)` (and aux): the Jacobian-vector product, by double vjp."""
    api = "jvp(f, primals, tangents)"
    if not isinstance(primals, tuple):
        raise RuntimeError(f"{api}: Expected primals to be a tuple. E.g. it should be valid to call f(*primals).")
    flat_t = _check_tangents(api, primals, tangents)
    lin = _Linearized(func, primals, None, has_aux, api)
    res = lin.push(flat_t, retain_graph=False, strict=strict)
    out_t = tree_unflatten(res, lin.out_spec)
    if has_aux:
        return lin.outputs(), out_t, lin.aux_out()
    return lin.outputs(), out_t


def linearize(func: Callable, *primals):
    """`(f(*primals), jvp_fn)`: `jvp_fn(*tangents)` evaluates J at the primals (graph kept for reuse)."""
    lin = _Linearized(func, primals, None, False, "linearize")

    def jvp_fn(*tangents):
        flat_t = _check_tangents("linearize", primals, tangents)
        return tree_unflatten(lin.push(flat_t), lin.out_spec)
    _no_dynamo(jvp_fn)
    return lin.outputs(), jvp_fn


# ---- Jacobians -----------------------------------------------------------------------------------
def _chunks(n: int, chunk_size: int | None):
    step = n if chunk_size is None or chunk_size >= n else chunk_size
    return [(s, min(s + step, n)) for s in range(0, n, max(step, 1))]


def _basis(shapes, like, start: int, stop: int):
    """Rows start..stop of the identity over the concatenated flattened `shapes`, split per shape."""
    n = sum(_numel(s) for s in shapes)
    rows = eye(n, dtype=like.dtype, device=like.device)[start:stop]
    out, o = [], 0
    for s in shapes:
        k = _numel(s)
        out.append(rows[:, o:o + k].reshape((stop - start,) + tuple(s)))
        o += k
    return out


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _map_rows(fn, rows, randomness: str = "error"):
    """fn over the leading dimension of each of `rows`, stacked (vmap over the basis)."""
    return vmap(fn, randomness=randomness)(*rows)


def _real_only(api: str, flat, what: str) -> None:
    for i, t in enumerate(flat):
        if isinstance(t, Tensor) and t.is_complex():
            raise RuntimeError(f"{api}: Expected all {what} to be real but received complex tensor at flattened "
                               f"input idx: {i}")


def jacrev(func: Callable, argnums=0, *, has_aux: bool = False, chunk_size: int | None = None,
           _preallocate_and_copy: bool = False) -> Callable:
    """The Jacobian of `func` wrt args[argnums] by reverse mode: one vjp per output element, run as a
    vmap over the rows of the identity (`chunk_size` rows at a time)."""
    if not (chunk_size is None or chunk_size > 0):
        raise ValueError("jacrev: `chunk_size` should be greater than 0.")

    @functools.wraps(func)
    def wrapper(*args):
        _real_only("jacrev", tree_flatten(args)[0], "inputs")
        r = _vjp_with_argnums(func, *args, argnums=argnums, has_aux=has_aux)
        out, vjp_fn = r[0], r[1]
        flat_out, out_spec = tree_flatten(out)
        _real_only("jacrev", flat_out, "outputs")
        shapes = [tuple(o.shape) for o in flat_out]
        n = sum(_numel(s) for s in shapes)
        pieces = []
        for a, b in _chunks(n, chunk_size):
            rows = _basis(shapes, flat_out[0], a, b)
            pieces.append(_map_rows(lambda *ct: tree_flatten(vjp_fn(tree_unflatten(list(ct), out_spec)))[0], rows))
        flat_in, in_spec = tree_flatten(_diff_part(args, argnums))
        per_input = [cat([p[i] for p in pieces]) if len(pieces) > 1 else pieces[0][i]
                     for i in range(len(flat_in))] if n else [zeros((0,) + tuple(x.shape), dtype=x.dtype)
                                                              for x in flat_in]
        # per_input[i]: [n, *in_shape]; split rows per output -> [*out_shape, *in_shape]
        jac_leaves = []
        o = 0
        for s in shapes:
            k = _numel(s)
            jac_leaves.append([per_input[i][o:o + k].reshape(s + tuple(x.shape)) for i, x in enumerate(flat_in)])
            o += k
        jac = tree_unflatten([tree_unflatten(j, in_spec) for j in jac_leaves], out_spec)
        if has_aux:
            return jac, r[2]
        return jac
    _no_dynamo(wrapper)
    return wrapper


def _diff_part(args, argnums):
    return _slice_argnums(args, argnums)[0]


def jacfwd(func: Callable, argnums=0, has_aux: bool = False, *, randomness: str = "error",
           chunk_size: int | None = None) -> Callable:
    """The Jacobian of `func` wrt args[argnums] by forward mode: one jvp per input element, run as a
    vmap over the rows of the identity (`chunk_size` rows at a time: a flambeau extension mirroring
    jacrev's)."""
    if not (chunk_size is None or chunk_size > 0):
        raise ValueError("jacfwd: `chunk_size` should be greater than 0.")

    @functools.wraps(func)
    def wrapper(*args):
        api = "jvp(f, primals, tangents)"
        _real_only("jacfwd", tree_flatten(args)[0], "inputs")
        lin = _Linearized(func, args, argnums, has_aux, api)
        diff, _ = _slice_argnums(args, argnums)
        flat_in, in_spec = tree_flatten(diff)
        shapes = [tuple(x.shape) for x in flat_in]
        m = sum(_numel(s) for s in shapes)
        pieces = []
        for a, b in _chunks(m, chunk_size):
            rows = _basis(shapes, flat_in[0], a, b)
            pieces.append(_map_rows(lambda *ts: tuple(lin.push(list(ts))), rows, randomness))
        outs = lin.flat_out
        per_out = [cat([p[j] for p in pieces]) if len(pieces) > 1 else pieces[0][j] for j in range(len(outs))]
        jac_leaves = []
        for j, o in enumerate(outs):
            t = per_out[j]                                  # [m, *out_shape]
            t = t.movedim(0, -1) if t.dim() > 1 else t      # [*out_shape, m]
            parts, k0 = [], 0
            for s in shapes:
                k = _numel(s)
                parts.append(t[..., k0:k0 + k].reshape(tuple(o.shape) + s))
                k0 += k
            jac_leaves.append(tree_unflatten(parts, in_spec))
        jac = tree_unflatten(jac_leaves, lin.out_spec)
        if has_aux:
            return jac, lin.aux_out()
        return jac
    _no_dynamo(wrapper)
    return wrapper


def hessian(func: Callable, argnums=0) -> Callable:
    """`jacfwd(jacrev(func, argnums), argnums)`."""
    return jacfwd(jacrev(func, argnums), argnums)


def _no_dynamo(fn) -> None:
    """A transform runs eagerly under flambeau.compile: calling it breaks the graph (with its name as
    the reason) and the code around it is compiled."""
    fn._flambeau_dynamo_disable = True


for _api in (vjp, grad_and_value, grad, jvp, linearize, jacrev, jacfwd, hessian):
    _no_dynamo(_api)

__all__ = ["vjp", "grad", "grad_and_value", "jvp", "linearize", "jacrev", "jacfwd", "hessian"]
