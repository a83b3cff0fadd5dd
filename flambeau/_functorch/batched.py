"""vmap's interpreter: batched tensors, one dispatch mode per vmap level, and the level bookkeeping
the differentiation transforms use.

A `BatchedTensor` is what the function under `vmap` sees: a tensor of the *logical* shape (one
example) standing for `value`, a tensor with one more dimension, `bdim`, that runs over the batch.
Its `_data` is a `MetaArray` of the logical shape, so shape, dtype and device queries answer
logically; every operator on it reaches the `VmapMode` of its level (vmap pushes one per call, the
innermost level on top), which:
  - runs the op's batching rule (`Op.batching_rule`, declared with the op in `flambeau/_ops`; ops
    tagged `pointwise` share `_ops._batching.pointwise_rule`) on the physical values, or else the
    generic fallback: the op once per example, results stacked, with a performance warning;
  - checks PyTorch's vmap rules: random ops by the `randomness` flag, in-place writes of a batched
    value into an unbatched tensor, `.item()` and data-dependent control flow.
Levels nest: a level-2 BatchedTensor's value may be a level-1 BatchedTensor; a mode handles only the
tensors of its own level and passes the call down for the rest (the next mode handles the next level).

Autograd records below the modes, on the physical values, so reverse mode needs no batching of its
own: `peel(t, depth)` turns a tensor seen inside `depth` vmap levels into one whose leading
dimensions are those levels' batches (materialised by `expand` where `t` is not batched at a level),
and `unpeel` reverses it. A transform differentiates physical tensors; examples never mix.
"""
from __future__ import annotations

import threading
import warnings

from .. import _state
from .._tags import Tag
from .._tensor import Tensor
from .._backends import MetaArray
from .._ops import _batching
from .._ops.shape import stack
from . import conv_batching



class _ThreadLevels(threading.local):
    """One thread's active VmapModes, outermost first (a mode's level is its index + 1); per thread,
    as the mode stack they sit on."""

    def __init__(self) -> None:
        self.levels: list = []


_levels = _ThreadLevels()


def depth() -> int:
    """How many vmap levels are active."""
    return len(_levels.levels)


class BatchedTensor(Tensor):
    """One example of `value` along `bdim` at vmap level `level` (see module docstring)."""

    def __repr__(self, *, tensor_contents=None) -> str:
        return f"BatchedTensor(lvl={self._level}, bdim={self._bdim}, value=\n{self._value!r}\n)"

    @property
    def requires_grad(self) -> bool:
        return self._value.requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self._value.requires_grad = value

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        self._value.requires_grad_(requires_grad)
        return self

    def detach(self) -> "Tensor":
        return make(self._value.detach(), self._bdim, self._level)

    def item(self):
        raise RuntimeError("vmap: It looks like you're calling .item() on a Tensor. We don't support vmap over "
                           "calling .item() on a Tensor, please try to rewrite what you're doing with other "
                           "operations. If error is occurring somewhere inside PyTorch internals, please file a "
                           "bug report.")

    def __bool__(self) -> bool:
        raise RuntimeError("vmap: It looks like you're attempting to use a Tensor in some data-dependent control "
                           "flow. We don't support that yet, please file an issue at "
                           "https://github.com/pytorch/pytorch/issues .")

    def tolist(self):
        raise RuntimeError("Cannot access data pointer of Tensor that doesn't have storage")

    def numpy(self, *, force: bool = False):
        raise RuntimeError("Cannot access data pointer of Tensor that doesn't have storage")

    def data_ptr(self) -> int:
        return 0                      # no storage of its own (as a meta tensor)

    def _host(self):
        raise RuntimeError("Cannot access data pointer of Tensor that doesn't have storage")


def make(value: Tensor, bdim: int, level: int) -> BatchedTensor:
    """The BatchedTensor of `value` batched along `bdim` at `level`."""
    shape = tuple(value.shape)
    logical = shape[:bdim] + shape[bdim + 1:]
    t = object.__new__(BatchedTensor)
    t._data = MetaArray(logical, value._dtype.np)
    t._dtype = value._dtype
    t._device = value._device
    t._version = value._version
    t._value = value
    t._bdim = bdim
    t._level = level
    return t


def level_of(t) -> int:
    return t._level if type(t) is BatchedTensor else 0


def batch_size(level: int) -> int:
    return _levels.levels[level - 1].batch_size


# ---- physical views for the differentiation transforms --------------------------------------------
def expose(t: Tensor, level: int) -> Tensor:
    """`t` seen one level below `level`: its level-`level` batch as logical dimension 0 (broadcast
    by `expand` where `t` is not batched at that level)."""
    lv = level_of(t)
    if lv == level:
        return t._value.movedim(t._bdim, 0) if t._bdim else t._value
    if lv > level:
        return make(expose(t._value, level), t._bdim + 1, lv)
    if lv == 0:                  # a plain tensor (a parameter under vmap(grad)): one expand adds the dimension
        return t.expand((batch_size(level),) + tuple(t.shape))
    return t.unsqueeze(0).expand((batch_size(level),) + tuple(t.shape))


def wrap_at(t: Tensor, dim: int, level: int) -> Tensor:
    """Declare logical dimension `dim` of `t` the batch of `level` (below any higher level's wrapper)."""
    lv = level_of(t)
    if lv > level:
        b = t._bdim
        vd = dim if dim < b else dim + 1
        inner = wrap_at(t._value, vd, level)
        return make(inner, b if b < vd else b - 1, lv)
    return make(t, dim, level)


def peel(t, n: int):
    """`t` with vmap levels 1..n as leading dimensions `[B_1, ..., B_n, *logical]` (levels above n stay
    wrapped)."""
    if not isinstance(t, Tensor):
        return t
    for level in range(n, 0, -1):
        t = expose(t, level)
    return t


def unpeel(t, n: int):
    """Inverse of `peel`: leading dimensions become vmap levels 1..n again."""
    if not isinstance(t, Tensor):
        return t
    for level in range(1, n + 1):
        t = wrap_at(t, 0, level)
    return t


# ---- the interpreter ----------------------------------------------------------------------------
_RANDOMNESS = ("error", "different", "same")


class VmapMode:
    """The dispatch mode of one vmap level (pushed by `vmap`, see module docstring)."""

    def __init__(self, level: int, batch_size: int, randomness: str):
        self.level = level
        self.batch_size = batch_size
        self.randomness = randomness
        self._decomposing: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "out" in kwargs and kwargs["out"] is None:
            kwargs = {k: v for k, v in kwargs.items() if k != "out"}
        own = _has_level(args, self.level) or _has_level(kwargs.values(), self.level)
        if func.nondeterministic:
            return self._random(func, args, kwargs, own)
        if not own:
            return func(*args, **kwargs)
        if "out" in kwargs and kwargs["out"] is not None:
            raise RuntimeError(f"vmap: {func.__name__}: out= arguments are not supported under vmap; "
                               "use the out-of-place op and copy_.")
        if func.is_inplace:
            return self._inplace(func, args, kwargs)
        return self.apply(func, args, kwargs)

    def apply(self, func, args, kwargs):
        """Run `func` over the batch: its rule, else its decomposition, else the loop fallback."""
        values = func.bind(*args, **kwargs)
        phys, dims = _unwrap(values, self.level)
        rule = rule_of(func)
        r = NotImplemented if rule is None else rule(dims, *phys)
        if r is NotImplemented:
            out = self._decompose(func, args, kwargs)
            if out is not NotImplemented:
                return out
            r = self._fallback(func, phys, dims)
        out, out_dims = r
        return _rewrap(out, out_dims, self.level)

    def _decompose(self, func, args, kwargs):
        """The op's decomposition run on the batched tensors under this level (its parts batch by their
        own rules), or NotImplemented without one."""
        if func.decomposition is None or func in self._decomposing:
            return NotImplemented
        self._decomposing.add(func)
        _state.push_mode(self)
        try:
            return func.decomposition(*args, **kwargs)
        finally:
            _state.pop_mode()
            self._decomposing.discard(func)

    def _fallback(self, func, phys, dims):
        warnings.warn(f"There is a performance drop because we have not yet implemented the batching rule for "
                      f"aten::{func.name}. Please file us an issue on GitHub so that we can prioritize its "
                      "implementation.", UserWarning, stacklevel=4)
        results = []
        for i in range(self.batch_size):
            results.append(_batching.call(func, _select(phys, dims, i)))
        return _stack_results(results)

    def _random(self, func, args, kwargs, own):
        """A random op under the `randomness` flag: 'different' draws per example (a factory once per
        example; on batched inputs the op runs on the physical values, whose draws are independent),
        'same' draws once for the logical shape (an op on batched inputs only through its
        decomposition's `*_like` draws, as PyTorch's dropout)."""
        if self.randomness == "error":
            raise RuntimeError("vmap: called random operation while in randomness error mode. Please either use "
                               "the 'same' or 'different' randomness flags on vmap or perform the randomness "
                               "operation out of vmap")
        same = self.randomness == "same"
        if not own:
            if same:
                return func(*args, **kwargs)
            out, out_dims = _stack_results([func(*args, **kwargs) for _ in range(self.batch_size)])
            return _rewrap(out, out_dims, self.level)
        if func.is_inplace:
            return self._inplace(func, args, kwargs)
        if not same:
            return self.apply(func, args, kwargs)
        if func.name.endswith("_like"):      # rand_like(x): one draw of the logical shape, shared by the batch
            phys, dims = _unwrap(func.bind(*args, **kwargs), self.level)
            return _batching.call(func, _select(phys, dims, 0))
        out = self._decompose(func, args, kwargs)
        if out is NotImplemented:
            raise RuntimeError(f"vmap: {func.__name__}: Vmap does not currently support same randomness with a "
                               "batched tensor input. Please file an issue with functorch")
        return out

    def _inplace(self, func, args, kwargs):
        values = func.bind(*args, **kwargs)
        self_t = values[0]
        if level_of(self_t) != self.level:
            raise RuntimeError(f"vmap: {func.__name__}(self, *extra_args) is not possible because there exists a "
                               "Tensor `other` in extra_args that has more elements than `self`. This happened due "
                               "to `other` being vmapped over but `self` not being vmapped over in a vmap. Please "
                               f"try to use out-of-place operators instead of {func.__name__}. If said operator is "
                               "being called inside the PyTorch framework, please file a bug report instead.")
        functional = func.functional
        if functional is None:
            out = self.apply(func, args, kwargs)
            return self_t if out is None else out
        res = self.__torch_dispatch__(functional, (), args, kwargs)
        dst = self_t._value.movedim(self_t._bdim, 0) if self_t._bdim else self_t._value
        src = expose(res, self.level) if isinstance(res, Tensor) else res
        dst.copy_(src)
        return self_t


_POINTWISE_RULES: dict = {}


def rule_of(op):
    """The op's batching rule: its own, or the shared one of its `pointwise` tag."""
    if op.batching_rule is not None:
        return op.batching_rule
    if Tag.pointwise in op.tags:
        rule = _POINTWISE_RULES.get(op)
        if rule is None:
            rule = _POINTWISE_RULES[op] = _batching.pointwise_rule(op)
        return rule
    return None


def _has_level(values, level: int) -> bool:
    for a in values:
        if type(a) is BatchedTensor and a._level == level:
            return True
        if type(a) in (list, tuple):
            for x in a:
                if type(x) is BatchedTensor and x._level == level:
                    return True
    return False


def _unwrap(values, level: int):
    """Physical values and batch dims (None where unbatched; a list for a list of tensors)."""
    phys, dims = [], []
    for a in values:
        if type(a) is BatchedTensor and a._level == level:
            phys.append(a._value)
            dims.append(a._bdim)
        elif type(a) in (list, tuple) and any(type(x) is BatchedTensor and x._level == level for x in a):
            phys.append(type(a)(x._value if level_of(x) == level else x for x in a))
            dims.append([x._bdim if level_of(x) == level else None for x in a])
        else:
            phys.append(a)
            dims.append(None)
    return phys, tuple(dims)


def _select(phys, dims, i: int):
    out = []
    for a, d in zip(phys, dims):
        if isinstance(d, list):
            out.append(type(a)(x.select(dx, i) if dx is not None else x for x, dx in zip(a, d)))
        elif d is not None:
            out.append(a.select(d, i))
        else:
            out.append(a)
    return out


def _stack_results(results):
    first = results[0]
    if isinstance(first, Tensor):
        return stack(results), 0
    if isinstance(first, (tuple, list)):
        outs, dims = [], []
        for k in range(len(first)):
            o, d = _stack_results([r[k] for r in results])
            outs.append(o)
            dims.append(d)
        return (type(first)(*outs) if hasattr(first, "_fields") else type(first)(outs)), tuple(dims)
    return first, None


def _rewrap(out, out_dims, level: int):
    if isinstance(out, Tensor):
        return make(out, out_dims, level) if out_dims is not None else out
    if isinstance(out, (tuple, list)):
        if not isinstance(out_dims, (tuple, list)):
            out_dims = (out_dims,) * len(out)
        items = [_rewrap(o, d, level) for o, d in zip(out, out_dims)]
        return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)
    return out


def push_level(batch_size: int, randomness: str) -> VmapMode:
    if randomness not in _RANDOMNESS:
        raise RuntimeError(f"Only allowed values for randomness are 'error', 'different', or 'same'. Got {randomness}")
    levels = _levels.levels
    mode = VmapMode(len(levels) + 1, batch_size, randomness)
    levels.append(mode)
    _state.push_mode(mode)
    return mode


def pop_level(mode: VmapMode) -> None:
    _levels.levels.remove(mode)
    _state.remove_mode(mode)


conv_batching.install()
