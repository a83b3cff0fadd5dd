"""Whole-function tracing front end of `flambeau.compile` (until the bytecode front end lands).

`optimize(fn, backend, ...)` returns a `CompiledCallable`. On a call it describes the inputs
(every tensor's shape, strides, dtype, device and requires_grad; Python values; grad mode, default
dtype and autocast state; for a module its identity, every submodule's training flag and the
metadata of its parameters and buffers) and looks the description up in its cache, most recent
entry first. On a miss it traces the whole call with `make_fx` on fake tensors (the module's
parameters and buffers are swapped for fake inputs, so they become graph inputs read at each call),
hands the graph and the real example inputs to the backend (`backend(gm, example_inputs)`, PyTorch's
contract) and caches the result under guards equal to the description. With `dynamic=True` sizes
are traced symbolically (`tracing_mode="symbolic"`) and the entry's guards are the shape
environment's relations instead of exact sizes; with `dynamic=None` a function whose input sizes
change is recompiled once with symbolic sizes ("automatic dynamic").

Whatever cannot be traced (data-dependent Python control flow calls `bool()`/`item()` on a fake
tensor, an op without a meta function, a forward that rebinds a buffer) makes the function run
eagerly for those inputs, with a one-line warning naming the op and the reason; `fullgraph=True`
raises `Unsupported` instead. After `cache_size_limit` entries a function warns once and runs
eagerly for new kinds of inputs. Side effects other than tensor mutations (printing, appending to
Python lists) happen once, while tracing; tensors captured from globals or closures are baked
into the graph (as PyTorch constants) and are not guarded. `FLAMBEAU_LOGS=graph` prints each
captured graph.
"""
from __future__ import annotations

from . import _logging

import inspect
import warnings
import weakref
from typing import Callable

from . import _state
from ._tensor import Tensor
from .fx.experimental.proxy_tensor import make_fx
from .fx._symbolic_shapes import SymInt
from .nn.modules.module import Module
from .utils._python_dispatch import TorchDispatchMode
from ._functorch.aot_autograd import stateless_call

cache_size_limit = 8
compiling = 0                       # > 0 while a call is being captured
_all_callables = weakref.WeakSet()  # every CompiledCallable, for reset()


class Unsupported(RuntimeError):
    """Raised with fullgraph=True when the function cannot be captured as one graph."""


# ---- pytrees (lists, tuples, dicts, named tuples; anything else is a constant leaf) --------------
def _flatten(x, leaves: list):
    if isinstance(x, Tensor):
        leaves.append(x)
        return None
    t = type(x)
    if t in (list, tuple) or (isinstance(x, tuple) and hasattr(x, "_fields")):
        return (t, [_flatten(i, leaves) for i in x])
    if t is dict:
        return (dict, list(x), [_flatten(v, leaves) for v in x.values()])
    if isinstance(x, SymInt):
        x = int(x)
    return ("const", x)


def _unflatten(spec, it):
    if spec is None:
        return next(it)
    if spec[0] == "const":
        return spec[1]
    if spec[0] is dict:
        return {k: _unflatten(s, it) for k, s in zip(spec[1], spec[2])}
    t, items = spec
    vals = [_unflatten(s, it) for s in items]
    return t(*vals) if hasattr(t, "_fields") else t(vals)


def _const_key(spec):
    """A hashable form of a spec's constants (unhashable constants by identity)."""
    if spec is None:
        return None
    if spec[0] == "const":
        v = spec[1]
        try:
            hash(v)
            return (type(v), v)
        except TypeError:
            return (type(v), id(v))
    if spec[0] is dict:
        return (dict, tuple(spec[1]), tuple(_const_key(s) for s in spec[2]))
    return (spec[0], tuple(_const_key(s) for s in spec[1]))


# ---- failure reporting -----------------------------------------------------------------------------
class _OpTracker(TorchDispatchMode):
    """Innermost during tracing: tags an exception with the op that raised it."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        try:
            return func(*args, **(kwargs or {}))
        except Exception as e:
            if getattr(e, "_flambeau_op", None) is None:
                try:
                    e._flambeau_op = func.name
                except AttributeError:
                    pass
            raise


def _reason(e: BaseException) -> str:
    op = getattr(e, "_flambeau_op", None)
    msg = (str(e).strip().splitlines() or [""])[0]
    if op:
        return f"aten.{op}: {msg}"
    if "cannot be called on meta tensors" in msg or "Cannot copy out of meta tensor" in msg:
        return (f"data-dependent: {msg} (the traced value is not known while tracing; Python control flow or a "
                "conversion depends on tensor data)")
    return f"{type(e).__name__}: {msg}"


# ---- state and guards --------------------------------------------------------------------------------
def _state_of(module: Module | None):
    """(unique tensors, {name: index}) of a module's parameters and buffers, shared ones once."""
    if module is None:
        return [], {}
    tensors, names, index = [], {}, {}
    for n, t in list(module.named_parameters(remove_duplicate=False)) + \
            [(n, b) for n, b in module.named_buffers(remove_duplicate=False) if b is not None]:
        k = index.get(id(t))
        if k is None:
            k = index[id(t)] = len(tensors)
            tensors.append(t)
        names[n] = k
    return tensors, names


def _tdesc(t: Tensor):
    return (tuple(t._data.shape), t.stride(), t._dtype, t._device, t._requires_grad)


def _tdesc_dynamic(t: Tensor):
    c = t.is_contiguous()
    return (len(t._data.shape), c, None if c else (tuple(t._data.shape), t.stride()), t._dtype, t._device,
            t._requires_grad)


class _Call:
    """One call's inputs, flattened, with its guard descriptions."""

    def __init__(self, module, args, kwargs):
        self.state, self.names = _state_of(module)
        leaves: list = []
        self.in_spec = _flatten((args, kwargs), leaves)
        self.tensors = self.state + leaves
        self.common = (_state.grad_enabled, _state.default_dtype, str(_state.autocast) if _state.autocast else "",
                       None if module is None else (id(module), tuple(m.training for m in module.modules()),
                                                    tuple(self.names.items())),
                       _const_key(self.in_spec))
        self._static = self._dyn = None

    @property
    def static_key(self):
        if self._static is None:
            self._static = (self.common, tuple(_tdesc(t) for t in self.tensors))
        return self._static

    @property
    def dynamic_key(self):
        if self._dyn is None:
            self._dyn = (self.common, tuple(_tdesc_dynamic(t) for t in self.tensors))
        return self._dyn


class _Entry:
    """A cache entry: guards, and the compiled callable (or None: run eagerly)."""

    def __init__(self, call: _Call, compiled, out_spec, shape_env=None, gm=None):
        self.compiled, self.out_spec, self.shape_env, self.gm = compiled, out_spec, shape_env, gm
        self.key = call.dynamic_key if shape_env is not None else call.static_key
        self._memo: dict = {}
        if shape_env is not None:
            self.static_dims = []
            for i, ph in enumerate(gm.graph.find_nodes(op="placeholder")):
                v = ph.meta.get("val")
                if isinstance(v, Tensor):
                    self.static_dims += [(i, d, s) for d, s in enumerate(v.shape) if not isinstance(s, SymInt)]

    def matches(self, call: _Call) -> bool:
        if self.shape_env is None:
            return call.static_key == self.key
        if call.dynamic_key != self.key:
            return False
        shapes = tuple(tuple(t._data.shape) for t in call.tensors)
        hit = self._memo.get(shapes)
        if hit is None:
            hit = self._memo[shapes] = self._shapes_ok(shapes)
        return hit

    def _shapes_ok(self, shapes) -> bool:
        if any(shapes[i][d] != s for i, d, s in self.static_dims):
            return False
        env = self.shape_env
        for sym, sources in env.var_to_sources.items():
            vals = {shapes[int(name)][dim] for name, dim in sources}
            if len(vals) != 1 or min(vals) < 2:
                return False
        return env.evaluate_guards(env.bindings_from_shapes(list(shapes)))


# ---- the compiled callable ---------------------------------------------------------------------------
class CompiledCallable:
    """What `optimize` returns: cache lookup by guards, tracing and backend compilation on a miss."""

    def __init__(self, fn: Callable, backend: Callable, *, fullgraph: bool = False, dynamic: bool | None = None,
                 module: Module | None = None, name: str | None = None):
        if module is None and inspect.ismethod(fn) and isinstance(fn.__self__, Module):
            module = fn.__self__
        self.fn, self.backend, self.fullgraph, self.dynamic, self.module = fn, backend, fullgraph, dynamic, module
        self.name = name or getattr(fn, "__qualname__", None) or type(fn).__name__
        self.cache: list = []
        self._warned_limit = False
        self._saw_static = set()
        _all_callables.add(self)

    def reset(self) -> None:
        self.cache.clear()
        self._warned_limit = False
        self._saw_static.clear()

    def __call__(self, *args, **kwargs):
        call = _Call(self.module, args, kwargs)
        for e in self.cache:
            if e.matches(call):
                return self._run(e, call, args, kwargs)
        if len(self.cache) >= cache_size_limit:
            if not self._warned_limit:
                self._warned_limit = True
                warnings.warn(f"flambeau.compile: {self.name} hit cache_size_limit ({cache_size_limit}); "
                              "running eagerly for new kinds of inputs", UserWarning, stacklevel=2)
            return self.fn(*args, **kwargs)
        entry = self._compile(call)
        self.cache.insert(0, entry)
        return self._run(entry, call, args, kwargs)

    def _run(self, e: _Entry, call: _Call, args, kwargs):
        if e.compiled is None:
            return self.fn(*args, **kwargs)
        out = e.compiled(*call.tensors)
        return _unflatten(e.out_spec, iter(out))

    def _symbolic(self, call: _Call) -> bool:
        if self.dynamic is not None:
            return bool(self.dynamic)
        seen = call.dynamic_key in self._saw_static
        self._saw_static.add(call.dynamic_key)
        return seen                     # a second size for the same kind of input: go symbolic

    def _compile(self, call: _Call) -> _Entry:
        symbolic = self._symbolic(call)
        try:
            gm, out_spec = capture(self.fn, self.module, call, symbolic)
        except Exception as e:
            if self.fullgraph:
                raise Unsupported(f"flambeau.compile(fullgraph=True): cannot capture {self.name} as one graph: "
                                  f"{_reason(e)}") from e
            warnings.warn(f"flambeau.compile: {self.name} runs eagerly for these inputs ({_reason(e)})",
                          UserWarning, stacklevel=3)
            return _Entry(call, None, None)
        try:
            compiled = self.backend(gm, list(call.tensors))
        except NotImplementedError as e:
            if self.fullgraph:
                raise Unsupported(f"flambeau.compile(fullgraph=True): backend cannot compile {self.name}: "
                                  f"{_reason(e)}") from e
            warnings.warn(f"flambeau.compile: {self.name} runs eagerly for these inputs (backend: {_reason(e)})",
                          UserWarning, stacklevel=3)
            return _Entry(call, None, None)
        return _Entry(call, compiled, out_spec, gm.meta.get("shape_env") if symbolic else None, gm)


def capture(fn: Callable, module: Module | None, call: _Call, symbolic: bool):
    """Trace one call into a GraphModule over the flat input tensors; returns (gm, output spec).
    This is the piece the bytecode front end replaces."""
    n_state = len(call.state)
    names = call.names
    in_spec = call.in_spec
    out_spec = []

    def flat_fn(*flat):
        state, leaves = flat[:n_state], flat[n_state:]
        args, kwargs = _unflatten(in_spec, iter(leaves))
        with _OpTracker():
            if module is not None:
                with stateless_call(module, {n: state[k] for n, k in names.items()}):
                    out = fn(*args, **kwargs)
            else:
                out = fn(*args, **kwargs)
        leaves_out: list = []
        out_spec.append(_flatten(out, leaves_out))
        return tuple(leaves_out)
    global compiling
    compiling += 1
    try:
        gm = make_fx(flat_fn, tracing_mode="symbolic" if symbolic else "fake")(*call.tensors)
    finally:
        compiling -= 1
    if _logging.enabled("graph"):
        print(f"===== captured graph of {getattr(fn, '__qualname__', type(fn).__name__)} =====\n"
              f"{gm.print_readable(print_output=False)}")
    return gm, out_spec[0]


def optimize(fn: Callable, backend: Callable, *, fullgraph: bool = False, dynamic: bool | None = None,
             module: Module | None = None) -> CompiledCallable:
    """The front end's entry point used by `flambeau.compile`."""
    return CompiledCallable(fn, backend, fullgraph=fullgraph, dynamic=dynamic, module=module)


def reset() -> None:
    """Forget every compiled entry of every compiled function."""
    for c in list(_all_callables):
        c.reset()
