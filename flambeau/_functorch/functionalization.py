"""Functionalization: run a program with every mutation rewritten as a functional op.

`FunctionalTensorMode` is a dispatch mode. For an in-place op (`x.add_(y)`, `x.copy_(s)`, an
`out=` call) it runs the functional op (`add`, `copy`) on the old value and rebinds the Python
tensor `x` to the result (its array, and its autograd node, like PyTorch's in-place autograd);
nothing is written. Views are tracked: each view remembers its base and the chain of view ops
that produced it. Mutating a view writes the new value back into a new value of the base through
the inverse of each view op (`slice` -> `slice_scatter`, `select` -> `select_scatter`, `view` ->
`view` back, `as_strided` -> `as_strided_scatter`, ...; through the memory, with the view's strides, when
the base is expanded and its elements share memory); every other view of that base is stale
from then on and is regenerated from the base (by replaying its chain) the next time an op uses it.

Under a tracing mode (make_fx) the recorded graph therefore holds only functional ops: a tensor is
matched to the node that made its current array. `functionalize(fn)` wraps a function: inputs
mutated by `fn` get their final value copied back once at the end (`copy_`, the only mutation left
in a traced graph), e.g. BatchNorm's running statistics. `run_functionalized` is the same without
the copy-back: it reports the mutated inputs and the outputs that alias inputs or each other (AOT
autograd turns the former into graph outputs and regenerates the latter at run time).

Limits: only views made while the mode is active are tracked (inputs that alias each other are
treated as distinct), and `detach()` / `.data` results share the old value, not later updates.

Ops whose kernel mutates an argument without saying so in its schema (`native_batch_norm` updating
running statistics) run as their functional form (no running statistics), the update written with
`copy_` after it.
"""
from __future__ import annotations

from typing import Callable

from .. import _dispatch
from .._decomp._table import aten
from .._decomp.decompositions_nn import batch_norm_update_running
from .._tensor import Tensor
from ..utils._python_dispatch import TorchDispatchMode

__all__ = ["FunctionalTensorMode", "functionalize", "run_functionalized"]


def _alias(t: Tensor) -> Tensor:
    """A new Tensor object for the current value of `t` (same array and autograd node)."""
    a = Tensor._make(t._data, t._device, t._dtype)
    if type(t) is not Tensor:
        a.__class__ = type(t)
        a.__dict__.update({k: v for k, v in t.__dict__.items() if k in ("fake_device", "fake_mode")})
    a._grad_fn, a._output_nr, a._requires_grad = t._grad_fn, t._output_nr, t._requires_grad
    return a


def _become(t: Tensor, r: Tensor) -> None:
    """Rebind `t` to the value (array and autograd history) of `r`."""
    t._data = r._data
    if r._grad_fn is not None or t._grad_fn is not None:
        t._grad_fn, t._output_nr, t._requires_grad = r._grad_fn, r._output_nr, r._requires_grad
    elif r._requires_grad:
        t._requires_grad = True
    t._version[0] += 1


def _like(t: Tensor, r: Tensor) -> Tensor:
    """`r`, made contiguous when it stands for the new value of a contiguous `t` (so later views of
    `t` see the layout they would see in eager)."""
    return r.contiguous() if t.is_contiguous() and not r.is_contiguous() else r


class _ViewInfo:
    __slots__ = ("base", "chain", "gen")

    def __init__(self, base, chain, gen):
        self.base, self.chain, self.gen = base, chain, gen


def _apply_step(step, x):
    func, bound, idx = step
    sargs = func._schema.args
    pos = [v for a, v in zip(sargs[1:], bound[1:]) if not a.kwarg_only]
    kw = {a.name: v for a, v in zip(sargs[1:], bound[1:]) if a.kwarg_only}
    out = func(x, *pos, **kw)
    return out if idx is None else out[idx]


# ---- view inverses: the value of a view's base after the view was replaced, per view op ----------
_VIEW_INVERSES: dict = {}        # Op -> fn(prev, new, bound args, output index)


def view_inverse(*ops):
    """Decorator: `fn(prev, new, b, idx)` rebuilds the base of a view made by each of `ops`."""
    def wrap(fn):
        for op in ops:
            _VIEW_INVERSES[op] = fn
        return fn
    return wrap


@view_inverse(aten.view, aten.squeeze, aten.unsqueeze, aten.alias)
def _reshape_inverse(prev, new, b, idx):
    return new if tuple(new.shape) == tuple(prev.shape) else new.reshape(tuple(prev.shape))


@view_inverse(aten.expand)
def _expand_inverse(prev, new, b, idx):
    if tuple(new.shape) == tuple(prev.shape):
        return new
    raise RuntimeError("unsupported operation: more than one element of the written-to tensor refers to a "
                       "single memory location. Please clone() the tensor before performing the operation.")


@view_inverse(aten.transpose.int)
def _transpose_inverse(prev, new, b, idx):
    return new.transpose(b[1], b[2])


@view_inverse(aten.permute)
def _permute_inverse(prev, new, b, idx):
    dims = [d % prev.ndim for d in b[1]]
    inv = [0] * len(dims)
    for i, d in enumerate(dims):
        inv[d] = i
    return new.permute(inv)


@view_inverse(aten.slice)
def _slice_inverse(prev, new, b, idx):
    return aten.slice_scatter(prev, new, *b[1:])


@view_inverse(aten.select)
def _select_inverse(prev, new, b, idx):
    return aten.select_scatter(prev, new, *b[1:])


@view_inverse(aten.diagonal)
def _diagonal_inverse(prev, new, b, idx):
    return aten.diagonal_scatter(prev, new, *b[1:])


@view_inverse(aten.as_strided)
def _as_strided_inverse(prev, new, b, idx):
    return aten.as_strided_scatter(prev, new, *b[1:])


@view_inverse(aten.split_with_sizes)
def _split_with_sizes_inverse(prev, new, b, idx):
    start = sum(b[1][:idx])
    return aten.slice_scatter(prev, new, b[2], start, start + b[1][idx], 1)


@view_inverse(aten.unbind.int)
def _unbind_inverse(prev, new, b, idx):
    return aten.select_scatter(prev, new, b[1], idx)


def _inverse(step, prev: Tensor, new: Tensor) -> Tensor:
    """The value of `prev` after its view `step(prev)` was replaced by `new`."""
    func, b, idx = step
    rule = _VIEW_INVERSES.get(func)
    if rule is not None:
        return rule(prev, new, b, idx)
    if func is aten.unfold and prev.is_contiguous():
        v = _apply_step(step, prev)
        return aten.as_strided_scatter(prev, new, tuple(v.shape), tuple(v.stride()),
                                       v.storage_offset() - prev.storage_offset())
    raise NotImplementedError(f"functionalization: mutating a view made by aten.{func.name} is not supported")


def _write_through_memory(base: Tensor, view: Tensor, r: Tensor) -> Tensor:
    """The value of an expanded `base` (stride 0: its elements share memory) after `r` was written
    through its `view`, as the memory sees it: the write lands in the base's distinct elements
    (`compact`, size 1 along each stride-0 dim) through the view's strides and offset, and every
    element of the base that shares that memory shows it (`x.expand(3, 3)[0] = y` changes each row)."""
    compact = base
    for d, (sz, st) in enumerate(zip(base.shape, base.stride())):
        if isinstance(st, int) and st == 0 and sz != 1:
            compact = aten.slice(compact, d, 0, 1)
    if not compact.is_contiguous():
        raise NotImplementedError("functionalization: a write through a view of an expanded tensor whose "
                                  "other dims are not contiguous")
    new = aten.as_strided_scatter(compact.contiguous(), r, tuple(view.shape), tuple(view.stride()),
                                  view.storage_offset() - base.storage_offset())
    return aten.expand(new, tuple(base.shape))


class FunctionalTensorMode(TorchDispatchMode):
    """Rewrites mutations into functional ops (see module docstring)."""

    def __init__(self):
        super().__init__()
        self._views: dict = {}      # id(view) -> _ViewInfo
        self._gen: dict = {}        # id(base) -> [base, generation]
        self._keep: list = []       # keeps tracked views alive so their ids stay unique
        self._hidden = False        # inside a hidden-mutation decomposition: its writes carry no grad

    # ---- views --------------------------------------------------------------------------------
    def _generation(self, base: Tensor) -> int:
        g = self._gen.get(id(base))
        if g is None:
            g = self._gen[id(base)] = [base, 0]
        return g[1]

    def sync(self, t: Tensor) -> Tensor:
        """Regenerate a view whose base was mutated since the view was last computed."""
        info = self._views.get(id(t))
        if info is None:
            return t
        g = self._generation(info.base)
        if info.gen != g:
            x = info.base
            for step in info.chain:
                x = _apply_step(step, x)
            t._data = x._data
            t._grad_fn, t._output_nr, t._requires_grad = x._grad_fn, x._output_nr, x._requires_grad
            t._view_version = t._version[0]
            info.gen = g
        return t

    def _sync_all(self, args, kwargs):
        if not self._views:
            return
        for t in _dispatch.flat_tensors(args, kwargs):
            if id(t) in self._views:
                self.sync(t)

    def base_of(self, t: Tensor):
        """(base tensor, view chain) of a tracked view, else (t, [])."""
        info = self._views.get(id(t))
        return (info.base, info.chain) if info is not None else (t, [])

    def _track_view(self, func, args, kwargs, out):
        b = func.bind(*args, **kwargs)
        src = b[0]
        base, chain = self.base_of(src)
        gen = self._generation(base)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for i, o in enumerate(outs):
            if isinstance(o, Tensor):
                step = (func, b, i if isinstance(out, (tuple, list)) else None)
                self._views[id(o)] = _ViewInfo(base, chain + [step], gen)
                self._keep.append(o)

    # ---- mutation -----------------------------------------------------------------------------
    def _commit(self, t: Tensor, r: Tensor) -> None:
        """`t` now holds value `r` (cast and shape-checked by the caller)."""
        if self._hidden and not t._requires_grad:
            r = r.detach()
        info = self._views.get(id(t))
        if info is None:
            _become(t, _like(t, r))
            self._gen.setdefault(id(t), [t, 0])[1] += 1
            return
        base = info.base
        if _expanded(base):
            new = _write_through_memory(base, t, r)
        else:
            vals = [base]
            for step in info.chain[:-1]:
                vals.append(_apply_step(step, vals[-1]))
            new = r
            for step, prev in zip(reversed(info.chain), reversed(vals)):
                new = _inverse(step, prev, new)
        if new._dtype is not base._dtype:
            new = new.to(base._dtype)
        _become(base, _like(base, new))
        self._gen.setdefault(id(base), [base, 0])[1] += 1
        self.sync(t)

    def _mutate(self, func, args, kwargs):
        out_arg = kwargs.get("out") if kwargs else None
        if out_arg is not None:
            kw = {k: v for k, v in kwargs.items() if k != "out"}
            res = func(*args, **kw)
            outs = out_arg if isinstance(out_arg, (tuple, list)) else (out_arg,)
            vals = res if isinstance(res, (tuple, list)) else (res,)
            for o, v in zip(outs, vals):
                if not _dispatch.can_cast(v._dtype, o._dtype):
                    raise RuntimeError(f"result type {_dispatch.type_name(v._dtype)} can't be cast to the desired "
                                       f"output type {_dispatch.type_name(o._dtype)}")
                self._commit(o, v if v._dtype is o._dtype else v.to(o._dtype))
            return out_arg
        self_t = args[0] if args else kwargs["self"]
        _dispatch.check_inplace_autograd(self_t)
        old = _alias(self_t)
        kw = {k: v for k, v in kwargs.items() if k != "out"}
        if args:
            r = func.functional(old, *args[1:], **kw)
        else:
            kw["self"] = old
            r = func.functional(**kw)
        if not _dispatch.can_cast(r._dtype, self_t._dtype):
            raise RuntimeError(f"result type {_dispatch.type_name(r._dtype)} can't be cast to the desired output "
                               f"type {_dispatch.type_name(self_t._dtype)}")
        if tuple(r.shape) != tuple(self_t.shape):
            raise RuntimeError(f"output with shape {list(self_t.shape)} doesn't match the broadcast shape "
                               f"{list(r.shape)}")
        if r._dtype is not self_t._dtype:
            r = r.to(self_t._dtype)
        self._commit(self_t, r)
        return self_t

    def _auto_functionalize(self, func, args, kwargs):
        """An op writing arguments its schema marks (a custom op's `mutates_args`) runs as its
        functional twin, which returns the outputs and then the new values of those arguments
        (PyTorch's auto_functionalized); each written argument is rebound to its new value."""
        bound = func.bind(*args, **kwargs)
        res = func.functional_twin(*bound)
        n = len(func._schema.returns)
        news = iter(res[n:])
        for i in func.mutated_args:
            new = next(news)
            targets = bound[i] if isinstance(bound[i], (list, tuple)) else (bound[i],)
            values = new if isinstance(new, (list, tuple)) else (new,)
            for t, v in zip(targets, values):
                if isinstance(t, Tensor):
                    self._commit(t, v)
        return None if n == 0 else res[0] if n == 1 else tuple(res[:n])

    # ---- the mode -----------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._sync_all(args, kwargs)
        if func.is_inplace or (kwargs and kwargs.get("out") is not None):
            return self._mutate(func, args, kwargs or {})
        if func.mutated_args:
            return self._auto_functionalize(func, args, kwargs or {})
        if func is aten.native_batch_norm and func.decomposition is not None:
            b = func.bind(*args, **(kwargs or {}))
            if b[5] and (b[3] is not None or b[4] is not None):
                return self._batch_norm_training(func, *b)
        out = func(*args, **(kwargs or {}))
        if func.is_view:
            self._track_view(func, args, kwargs or {}, out)
        return out


    def _batch_norm_training(self, func, x, weight, bias, running_mean, running_var, training, momentum, eps):
        """BatchNorm in training with running statistics: the op itself without them (one node, which
        autograd differentiates by its own derivative, native_batch_norm_backward: two per-channel sums
        and one pointwise pass, the input saved), then the running statistics written from its mean and
        rstd (variance = rstd^-2 - eps) as a hidden mutation (no gradient)."""
        out = func(x, weight, bias, None, None, training, momentum, eps)
        mean, rstd = out[1].detach(), out[2].detach()
        self._hidden = True
        try:
            with self:
                var = aten.sub(aten.reciprocal(aten.mul(rstd, rstd)), eps)
                batch_norm_update_running(x, running_mean, running_var, mean, var, momentum)
        finally:
            self._hidden = False
        return out


class _Saved:
    __slots__ = ("t", "data", "grad_fn", "output_nr", "requires_grad", "version")

    def __init__(self, t: Tensor):
        self.t, self.data = t, t._data
        self.grad_fn, self.output_nr, self.requires_grad = t._grad_fn, t._output_nr, t._requires_grad

    def restore(self) -> Tensor:
        """Put the original value back into the input; return a tensor holding its final value."""
        t = self.t
        final = _alias(t)
        t._data = self.data
        t._grad_fn, t._output_nr, t._requires_grad = self.grad_fn, self.output_nr, self.requires_grad
        return final


def flat_input_tensors(args, kwargs=None) -> list:
    out = []

    def walk(a):
        if isinstance(a, Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            for x in a:
                walk(x)
        elif isinstance(a, dict):
            for x in a.values():
                walk(x)
    walk(args)
    if kwargs:
        walk(kwargs)
    return out


class FunctionalResult:
    """What `run_functionalized` reports: the outputs, the mutated inputs (position in the flat
    input list, final value), per output what it aliases (see `output_aliases`), the intermediate
    bases that some outputs are views of, and what `then` returned."""

    def __init__(self, out, mutations, aliases, bases, extra):
        self.out, self.mutations, self.aliases, self.bases, self.extra = out, mutations, aliases, bases, extra


def _expanded(t: Tensor) -> bool:
    return any(isinstance(st, int) and st == 0 and sz != 1 for sz, st in zip(t.shape, t.stride()))


def output_aliases(mode: FunctionalTensorMode, outs: list, inputs: list) -> tuple[list, list]:
    """Per output, what it must alias at run time so that a later in-place op through one output is
    seen through the others, as in eager: `("input", i, chain)` a view of input `i`, `("output", k,
    chain)` a view of (or the same tensor as) the earlier output `k`, `("base", b, chain)` a view of
    the intermediate `bases[b]` that two or more outputs are views of (it becomes an extra graph
    output, PyTorch's alias_of_intermediate), or None (an output of its own). A single view of an
    intermediate nothing else refers to is an output of its own (no one can observe the aliasing)
    unless it is expanded: its elements share memory, and an in-place op on it must raise as in eager."""
    pos = {id(t): i for i, t in reversed(list(enumerate(inputs)))}
    roots = [mode.base_of(o) for o in outs]
    own = {}                            # id(output that is no view) -> its position
    for k, (o, (base, chain)) in enumerate(zip(outs, roots)):
        if not chain and id(o) not in pos:
            own.setdefault(id(o), k)
    shared: dict = {}                   # id(intermediate base) -> number of outputs viewing it
    for base, chain in roots:
        if chain and id(base) not in pos and id(base) not in own:
            shared[id(base)] = shared.get(id(base), 0) + 1
    aliases, bases, base_pos = [], [], {}
    for k, (o, (base, chain)) in enumerate(zip(outs, roots)):
        if id(base) in pos:
            aliases.append(("input", pos[id(base)], chain))
        elif id(base) in own and own[id(base)] != k:
            aliases.append(("output", own[id(base)], chain))
        elif chain and (shared.get(id(base), 0) > 1 or _expanded(o)):
            if id(base) not in base_pos:
                base_pos[id(base)] = len(bases)
                bases.append(base)
            aliases.append(("base", base_pos[id(base)], chain))
        else:
            aliases.append(None)
    return aliases, bases


def run_functionalized(fn: Callable, args: tuple, kwargs: dict | None = None,
                       then: Callable | None = None) -> FunctionalResult:
    """Run `fn(*args, **kwargs)` under functionalization without writing into its inputs (see module
    docstring). `then(out, mode, aliases, bases)`, if given, runs under the same mode right after `fn` (AOT autograd
    runs the backward there); its result is `.extra`."""
    kwargs = kwargs or {}
    extra = None
    inputs = flat_input_tensors(args, kwargs)
    saved = []
    seen = set()
    for t in inputs:
        if id(t) not in seen:
            seen.add(id(t))
            saved.append(_Saved(t))
    mode = FunctionalTensorMode()
    try:
        with mode:
            out = fn(*args, **kwargs)
        outs = flat_input_tensors(out)
        for o in outs:
            mode.sync(o)
        aliases, bases = output_aliases(mode, outs, inputs)
        if then is not None:
            with mode:
                extra = then(out, mode, aliases, bases)
    finally:
        mutations = []
        for s in saved:
            if s.t._data is not s.data:
                mutations.append((pos_of(inputs, s.t), s.restore()))
    return FunctionalResult(out, mutations, aliases, bases, extra)


def pos_of(seq, t) -> int:
    for i, x in enumerate(seq):
        if x is t:
            return i
    raise ValueError("tensor not in the input list")


def functionalize(fn: Callable, *, remove: str = "mutations") -> Callable:
    """`functionalize(fn)(*args)`: run `fn` with mutations rewritten functionally, then copy the
    final value of each mutated input back into it with one `copy_`."""
    if remove not in ("mutations", "mutations_and_views"):
        raise RuntimeError(f"functionalize(f, remove='mutations'): received invalid argument for remove={remove}")

    def wrapped(*args, **kwargs):
        res = run_functionalized(fn, args, kwargs)
        inputs = flat_input_tensors(args, kwargs)
        for i, final in res.mutations:
            inputs[i].copy_(final)
        return res.out
    wrapped.__name__ = getattr(fn, "__name__", "functionalized")
    wrapped.__wrapped__ = fn
    return wrapped
