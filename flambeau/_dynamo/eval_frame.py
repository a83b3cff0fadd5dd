"""Where compiled code is entered: the wrapper around a compiled function, and the code cache.

Without a C frame-evaluation hook, capture happens at the wrapper: `compile_fn(fn, backend)` returns
a `CompiledFunction` whose call binds the arguments to the code's parameters, looks up the cache of
`fn.__code__` (a list of entries, most recent first; each entry is one generated guard function and
one generated entry function) and calls the first entry whose guards hold. On a miss it translates
the frame (convert_frame.py) and adds the entry; after `config.cache_size_limit` entries for one
code object it warns once and runs the function eagerly. Frames that cannot be captured
(generators, SkipFrame) are remembered and run eagerly. Resume functions created at graph breaks
are compiled the same way, with the backend and settings of the frame that broke.

A compiled `nn.Module` is an `OptimizedModule`: it holds the original as `_orig_mod` (sharing its
parameters), reads and writes attributes through to it, has the original's `state_dict`, and its
`train()`/`eval()` switch the original (the training flags are guarded, so a switch recompiles).
"""
from __future__ import annotations

import functools
import itertools
import types
import weakref
from inspect import CO_VARARGS, CO_VARKEYWORDS
import warnings
from typing import Callable

from ..nn.modules.module import Module
from . import config, _logging, resume
from .._compile_lock import compile_lock, enter_eager_frame, exit_eager_frame, gc_paused
from .._counters import counters, record_fallback
from .backends.distributed import ddp_optimizer_for
from .backends.registry import lookup_backend
from .exc import InternalTorchDynamoError, SkipFrame, TorchDynamoException, Unsupported
from .convert_frame import convert_frame, CompileStats
from .compiled_state import CompiledWrapper, is_compiling, thread as _thread  # noqa: F401  (is_compiling: flambeau._dynamo's)
from .repro.debug_utils import AccuracyError, check_config
from .variables.tensor import tensor_method_name
from .utils import is_disabled

_caches: dict = {}            # (code, backend key) -> CodeCache
WHOLE_FRAME = "whole frame"   # the op of a fallback that runs a frame eagerly (suppress_errors, cache_size_limit)


class CodeCache:
    __slots__ = ("entries", "skip", "warned", "frame_sizes", "dynamic_dims", "code", "__weakref__")

    def __init__(self, code):
        self.code = code
        self.entries: list = []
        self.skip = False
        self.warned = False
        self.frame_sizes: dict = {}
        self.dynamic_dims: dict = {}


def _drop_entry(cache_ref, entry_ref) -> None:
    """Forget an entry whose guarded model died (its guards can never hold again)."""
    cache, entry = cache_ref(), entry_ref()
    if cache is not None and entry is not None and entry in cache.entries:
        cache.entries.remove(entry)


def reset() -> None:
    """Forget every compiled entry (the next call of each compiled function recompiles)."""
    _caches.clear()
    resume._resume_codes.clear()
    _resume_wrappers.clear()
    _callee_wrappers.clear()


def _make_binder(fn):
    """A function with `fn`'s signature returning its arguments as a tuple in co_varnames order."""
    code = fn.__code__
    n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & CO_VARARGS) + bool(code.co_flags & CO_VARKEYWORDS)
    names = list(code.co_varnames[:n])
    if not all(x.isidentifier() for x in names):
        return None, names              # comprehension code (`.0`): only positional calls are compiled
    pos = names[:code.co_argcount]
    kwonly = names[code.co_argcount:code.co_argcount + code.co_kwonlyargcount]
    rest = names[code.co_argcount + code.co_kwonlyargcount:]
    parts = []
    for i, p in enumerate(pos):
        parts.append(p)
        if i + 1 == code.co_posonlyargcount:
            parts.append("/")
    if code.co_flags & CO_VARARGS:
        parts.append("*" + rest[0])
    elif kwonly:
        parts.append("*")
    parts += kwonly
    if code.co_flags & CO_VARKEYWORDS:
        parts.append("**" + rest[-1])
    src = f"def ___bind({', '.join(parts)}):\n    return ({''.join(o + ', ' for o in names)})\n"
    ns: dict = {}
    exec(src, ns)
    b = ns["___bind"]
    b.__defaults__ = fn.__defaults__
    b.__kwdefaults__ = fn.__kwdefaults__
    return b, names


class CompiledFunction(CompiledWrapper):
    """A function compiled with a backend (see module docstring)."""

    def __init__(self, fn, backend, *, fullgraph: bool = False, dynamic=None, stats: CompileStats | None = None):
        self_obj = None
        if isinstance(fn, types.MethodType):
            self_obj, fn = fn.__self__, fn.__func__
        if not isinstance(fn, types.FunctionType):
            raise TypeError(f"flambeau._dynamo: cannot compile {fn!r} (a Python function or method is needed)")
        self.fn = fn
        self.self_obj = self_obj
        self.code = fn.__code__
        self.backend = backend
        self.fullgraph = fullgraph
        self.dynamic = dynamic
        self.stats = stats if stats is not None else CompileStats()
        self.key = (self.code, id(backend), fullgraph, dynamic)
        c = self.code
        self.simple = not (c.co_flags & (CO_VARARGS | CO_VARKEYWORDS)) and not c.co_kwonlyargcount
        self.nargs = c.co_argcount
        self._binder, self.argnames = _make_binder(fn)
        functools.update_wrapper(self, fn)

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return types.MethodType(self, obj)

    def __call__(self, *args, **kwargs):
        if self.self_obj is not None:
            args = (self.self_obj,) + args
        t = _thread
        if t.tracing or t.disabled:
            return self.fn(*args, **kwargs)
        if self.simple and not kwargs and len(args) == self.nargs:
            L = args
        else:
            try:
                L = self._binder(*args, **kwargs)
            except TypeError:               # (also when there is no binder) eager raises the right error
                return self.fn(*args, **kwargs)
        cache = _caches.get(self.key)
        if cache is not None:
            if cache.skip:
                return self._eagerly(args, kwargs)
            fn = self.fn
            for e in cache.entries:
                if e.guard(fn, *L):
                    return e.entry(fn, *L)
        return self._miss(L, args, kwargs)

    def _miss(self, L, args, kwargs):
        """Translate the frame for these arguments and call the new entry. One thread at a time
        compiles (`compile_lock`); a thread that waited looks again for an entry whose guards hold,
        which the thread before it may have added. The entry or the eager call runs without the lock."""
        with compile_lock:
            entry = self._entry_after_waiting(L)
            if entry is None:
                entry = self._compile(L)
        if entry is None:
            return self._eagerly(args, kwargs)
        return entry.entry(self.fn, *L)

    def _eagerly(self, args, kwargs):
        """The frame run eagerly (skipped, or past its cache size limit); the nn.Module calls it makes are
        compiled as their own frames with this frame's backend (`Module.__call__` asks `_nested_module_call`):
        PyTorch's frame hook compiles every nested frame of a skipped one, so a model whose loop over its
        blocks breaks the graph (an FSDP2 block's hooks) still has each block compiled."""
        enter_eager_frame(self._nested_module_call)
        try:
            return self.fn(*args, **kwargs)
        finally:
            exit_eager_frame()

    def _nested_module_call(self, module):
        """The compiled call of `module` made inside this frame's eager run, or None to call it as it is: a
        module whose forward is `disable`d, or one compiled already (its own backend and settings)."""
        if isinstance(module, OptimizedModule) or is_disabled(getattr(module, "forward", None)):
            return None
        return self._compile_callee(module)

    def _entry_after_waiting(self, L):
        cache = _caches.get(self.key)
        if cache is not None and not cache.skip:
            for e in cache.entries:
                if e.guard(self.fn, *L):
                    return e
        return None

    def _compile(self, L):
        """A new entry for arguments `L` (added to the cache), or None to run the frame eagerly."""
        cache = _caches.get(self.key)
        if cache is None:
            cache = _caches[self.key] = CodeCache(self.code)
        if cache.skip:
            return None
        if len(cache.entries) >= config.cache_size_limit:
            if not cache.warned:
                cache.warned = True
                warnings.warn(f"flambeau._dynamo hit config.cache_size_limit ({config.cache_size_limit}) for "
                              f"{self.code.co_name} ({self.code.co_filename}:{self.code.co_firstlineno}); "
                              "it now runs eagerly. Last guard failures: "
                              f"{'; '.join(self._failures(cache.entries[0], L)[:3])}")
            record_fallback(WHOLE_FRAME, f"{self.code.co_name}: cache_size_limit reached", log=False)
            return None
        if cache.entries:
            counters["recompiles"][self.code.co_name] += 1
            reasons = self._failures(cache.entries[0], L)
            _logging.trace("recompiles", "Recompiling function %s in %s:%d\n    triggered by the following "
                           "guard failure(s):\n    - %s", self.code.co_name, self.code.co_filename,
                           self.code.co_firstlineno, "\n    - ".join(reasons))
        values = dict(zip(self.argnames, L))
        check_config()                          # a minifier setting the user got wrong raises as is
        _thread.tracing += 1
        counters["frames"]["total"] += 1
        try:
            with gc_paused():
                entry = convert_frame(self.fn, self.code, values, self.backend, one_graph=self.fullgraph,
                                      dynamic=self.dynamic, cache=cache, compile_resume=self._compile_resume,
                                      compile_callee=self._compile_callee, stats=self.stats)
        except SkipFrame as e:
            self._record_skip(e)
            cache.skip = e.permanent
            return None
        except Unsupported:
            raise
        except Exception as e:                  # a capture or backend failure: raise, or run eagerly and say why
            if not config.suppress_errors:
                if isinstance(e, (TorchDynamoException, AccuracyError)):     # already says what failed
                    raise
                raise InternalTorchDynamoError(f"{type(e).__name__}: {e}\n\nwhile capturing {self.code.co_name} "
                                               f"({self.code.co_filename}:{self.code.co_firstlineno})") from e
            _logging.log.warning("flambeau._dynamo could not compile %s (%s:%d), running it eagerly "
                                 "(config.suppress_errors): %s: %s", self.code.co_name, self.code.co_filename,
                                 self.code.co_firstlineno, type(e).__name__, e)
            record_fallback(WHOLE_FRAME, f"{self.code.co_name}: {type(e).__name__}: {e}")
            cache.skip = True
            return None
        finally:
            _thread.tracing -= 1
        counters["frames"]["ok"] += 1
        cache.entries.insert(0, entry)
        entry.guards.drop_with(functools.partial(_drop_entry, weakref.ref(cache), weakref.ref(entry)))
        return entry

    def _record_skip(self, e: SkipFrame) -> None:
        """A frame that runs eagerly is never silent: counted (`counters["frames"]["skipped"]`), a break
        reason of explain() ("skipped frame ...") and logged under FLAMBEAU_LOGS=graph_breaks."""
        c = self.code
        cause = e.__cause__ if isinstance(e.__cause__, Unsupported) else None
        stack = list(cause.user_stack) if cause is not None else []
        stack.append((c.co_filename, c.co_firstlineno, c.co_name))
        self.stats.break_reasons.append(Unsupported(f"skipped frame {c.co_name} (runs eagerly): {e}",
                                                    user_stack=stack))
        counters["frames"]["skipped"] += 1
        _logging.trace("graph_breaks", "Skipping frame %s (%s:%d), it runs eagerly: %s", c.co_name, c.co_filename,
                       c.co_firstlineno, e)

    def original(self):
        return self.fn if self.self_obj is None else types.MethodType(self.fn, self.self_obj)

    @property
    def cache(self) -> list:
        """The compiled entries of this function's code (most recent first)."""
        c = _caches.get(self.key)
        return list(c.entries) if c is not None else []

    def _failures(self, entry, L) -> list:
        return entry.guards.failures(entry.argnames, entry.globals, self.fn, L) or ["(unknown)"]

    def _compile_callee(self, fn):
        return compiled_callee(fn, self.backend, self.fullgraph, self.dynamic, self.stats)

    def _compile_resume(self, rcode, globals_, closure):
        return compiled_resume(rcode, globals_, closure, self.backend, self.fullgraph, self.dynamic, self.stats)


_resume_wrappers: dict = {}


def compiled_resume(rcode, globals_, closure, backend, fullgraph, dynamic, stats):
    """The compiled function for a resume code object (one per code object when there is no closure)."""
    key = (rcode, id(backend), dynamic)
    if not closure:
        hit = _resume_wrappers.get(key)
        if hit is not None:
            return hit
    fn = types.FunctionType(rcode, globals_, rcode.co_name, None, closure)
    c = CompiledFunction(fn, backend, fullgraph=fullgraph, dynamic=dynamic, stats=stats)
    if not closure:
        _resume_wrappers[key] = c
    return c


def compiled_callee(fn, backend, fullgraph, dynamic, stats):
    """A function or module called at a graph break, compiled as its own frame (memoised per object)."""
    key = (id(fn) if not isinstance(fn, types.MethodType) else (id(fn.__func__), id(fn.__self__)), id(backend))
    hit = _callee_wrappers.get(key)
    if hit is not None and hit[0] is (fn.__func__ if isinstance(fn, types.MethodType) else fn):
        return hit[1]
    if isinstance(fn, Module):
        c = _ModuleCall(fn, backend, fullgraph, dynamic)
        c.forward.stats = c.call_impl.stats = stats
    else:
        c = CompiledFunction(fn, backend, fullgraph=fullgraph, dynamic=dynamic, stats=stats)
    _callee_wrappers[key] = (fn.__func__ if isinstance(fn, types.MethodType) else fn, c)
    return c


_callee_wrappers: dict = {}


def compile_fn(fn, backend, *, fullgraph: bool = False, dynamic=None):
    """`fn` compiled with `backend(gm, example_inputs) -> callable` (see module docstring)."""
    return CompiledFunction(fn, backend, fullgraph=fullgraph, dynamic=dynamic)


# ---- modules ------------------------------------------------------------------------------------------
class _ModuleCall(CompiledWrapper):
    """The compiled call of an nn.Module: its forward when it has no hooks, else its `_call_impl`."""

    def __init__(self, module, backend, fullgraph, dynamic):
        self.module = module
        self.forward = CompiledFunction(module.forward, backend, fullgraph=fullgraph, dynamic=dynamic)
        self.call_impl = CompiledFunction(module._call_impl, backend, fullgraph=fullgraph, dynamic=dynamic)

    @property
    def cache(self) -> list:
        return self.forward.cache + self.call_impl.cache

    def original(self):
        return self.module

    def __call__(self, *args, **kwargs):
        m = self.module
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks:
            if not (m._backward_hooks or m._backward_pre_hooks) and all(
                    map(is_disabled, itertools.chain(m._forward_pre_hooks.values(), m._forward_hooks.values()))):
                return self._around_eager_hooks(args, kwargs)
            return self.call_impl(*args, **kwargs)
        return self.forward(*args, **kwargs)

    def _around_eager_hooks(self, args, kwargs):
        """Forward hooks that are all `disable`d (FSDP2's, as PyTorch's `skip_fsdp_hooks`) run eagerly around
        the compiled forward: capturing `_call_impl` would break the graph at each of them, in loops."""
        m = self.module
        if m._forward_pre_hooks:
            args, kwargs = m._run_pre_hooks(args, kwargs)
        return m._run_forward_hooks(args, kwargs, self.forward(*args, **kwargs))


def wrap_inline(fn):
    """`fn` itself if it is a Python function or method, else a Python function calling it: an operator
    (`flambeau.matmul`), a builtin or an object with `__call__` has no bytecode of its own, so capture
    starts from this function's call of it (PyTorch's `external_utils.wrap_inline`). So is a method of
    the Tensor class (`flambeau.Tensor.add`, PyTorch's a C method): its body is the library's, not code
    to capture."""
    python = isinstance(fn, (types.FunctionType, types.MethodType))
    if python and tensor_method_name(getattr(fn, "__func__", fn)) is None:
        return fn

    @functools.wraps(fn, updated=())
    def inner(*args, **kwargs):
        return fn(*args, **kwargs)
    return inner


def optimize_for_compiler(model, backend, *, fullgraph: bool = False, dynamic=None, module=None):
    """The front-end entry point `flambeau.compile` uses: a callable running `model` compiled."""
    if isinstance(model, Module):
        return _ModuleCall(model, ddp_optimizer_for(model, backend), fullgraph, dynamic)
    return CompiledFunction(wrap_inline(model), backend, fullgraph=fullgraph, dynamic=dynamic)


class OptimizeContext:
    """What `optimize(backend)` returns: applied to a function or module, it compiles it."""

    def __init__(self, backend, nopython: bool, dynamic):
        self.backend = backend
        self.nopython = nopython
        self.dynamic = dynamic

    def __call__(self, fn):
        be = lookup_backend(self.backend)
        if isinstance(fn, Module):
            return OptimizedModule(fn, _ModuleCall(fn, be, self.nopython, self.dynamic))
        c = CompiledFunction(wrap_inline(fn), be, fullgraph=self.nopython, dynamic=self.dynamic)
        if isinstance(fn, types.MethodType):
            return c

        @functools.wraps(fn)
        def compiled(*args, **kwargs):
            return c(*args, **kwargs)
        compiled._torchdynamo_orig_callable = fn
        compiled._compiled = c
        return compiled


def optimize(backend="inductor", nopython: bool = False, dynamic=None, **kwargs) -> OptimizeContext:
    """`flambeau._dynamo.optimize(backend)(fn)`: fn compiled with `backend` (nopython=True: one graph or an error)."""
    return OptimizeContext(backend, nopython, dynamic)


# ---- disable --------------------------------------------------------------------------------------------
def disable(fn=None, recursive: bool = True, reason: str | None = None):
    """Run `fn` (and what it calls) eagerly, never captured; a call to it from compiled code breaks the graph."""
    if fn is None:
        return lambda f: disable(f, recursive=recursive, reason=reason)
    if isinstance(fn, Module):
        fn.forward = disable(fn.forward, recursive=recursive, reason=reason)
        return fn

    @functools.wraps(fn)
    def run_eagerly(*args, **kwargs):
        if not recursive:
            return fn(*args, **kwargs)
        t = _thread
        t.disabled += 1
        try:
            return fn(*args, **kwargs)
        finally:
            t.disabled -= 1
    run_eagerly._flambeau_dynamo_disable = True
    return run_eagerly


class OptimizedModule(Module):
    """A compiled nn.Module (see the module docstring)."""

    def __init__(self, mod: Module, compiled: Callable):
        super().__init__()
        self._modules["_orig_mod"] = mod
        self.__dict__["_compiled"] = compiled
        self.training = mod.training

    def forward(self, *args, **kwargs):
        return self.__dict__["_compiled"](*args, **kwargs)

    def __getattr__(self, name: str):
        mods = self.__dict__.get("_modules")
        if mods is not None and name == "_orig_mod":
            return mods["_orig_mod"]
        if mods is None or "_orig_mod" not in mods:
            return super().__getattr__(name)
        return getattr(mods["_orig_mod"], name)

    def __setattr__(self, name: str, value) -> None:
        mods = self.__dict__.get("_modules")
        if mods is None or "_orig_mod" not in mods or name in self.__dict__ or name == "training":
            super().__setattr__(name, value)
            if name == "training" and mods is not None and "_orig_mod" in mods:
                mods["_orig_mod"].training = value
        else:
            setattr(mods["_orig_mod"], name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._orig_mod, name)

    def state_dict(self, *args, **kwargs):
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self._orig_mod.load_state_dict(*args, **kwargs)
