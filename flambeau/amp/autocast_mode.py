"""Automatic mixed precision: the `autocast` region and the casts it applies to operator inputs.

State: `_state.tls.autocast` (per thread, as PyTorch's) maps each device type where autocast is on to its dtype (an empty dict
means off everywhere, which is what the dispatcher tests on its hot path); it is replaced, never
mutated, so a saved reference restores it exactly. The requested dtype of each device is kept
here even while autocast is off there (`get_autocast_dtype`). Like PyTorch's, all of this is per
thread (`_thread`): a new thread starts with autocast off and the default dtypes.

When autocast is on, `flambeau._dispatch.dispatch` hands every call to `cast_inputs(op, ...)`,
which applies the policy the op declares with its tags (`Tag.autocast_*` for cuda and every device
but cpu, `Tag.cpu_autocast_*` for cpu):
  lower  - floating inputs on that device (except float64) go to the autocast dtype (matmuls, convs);
  fp32   - they go to float32 (losses, norms, reductions and transcendental ops that need range);
  fp32 unless a `dtype=` is given - softmax, sum, cumsum and friends;
  promote - they go to the widest floating type among them (cat on cpu, addcmul on cuda...);
  banned - the op refuses to run (binary_cross_entropy on cuda).
A Python composite that PyTorch lists (a loss, a pooling function) declares its policy with the
same tags (`_registry.autocast_policy`, `export(..., tags=...)`); `call_composite` casts its inputs
and runs its body with autocast off on those devices, as PyTorch runs an op below its autocast layer.
Casts go through `Tensor.to`, so autograd records them and gradients come back in the original
dtype. Within one outermost region, the lower-precision casts of leaf weights that require grad
are cached (PyTorch's cache_enabled). Backward passes run with autocast off (the engine clears it).
"""
from __future__ import annotations

import functools
import threading
import warnings

from .. import _dispatch, _state, cuda
from .. import _dtype as D
from .._tags import Tag
from .._tensor import Tensor

_DEVICE_TYPES = ("cpu", "cuda", "xpu", "hpu", "mps", "xla", "mtia", "maia", "ipu", "privateuseone")


class _ThreadAutocast(threading.local):
    """One thread's autocast settings besides its on/off map (`_state.tls.autocast`)."""

    def __init__(self) -> None:
        self.dtypes = {"cpu": D.bfloat16}      # requested dtype per device type; default float16 elsewhere
        self.nesting = 0
        self.cache_enabled = True
        self.cache: dict = {}                  # id(weight) -> (weight, version, dtype, cast)


_thread = _ThreadAutocast()


# ---- the policies -------------------------------------------------------------------------------
def _eligible(t, dev_type) -> bool:
    """A floating tensor on the autocast device, not float64 (which autocast never touches)."""
    return (isinstance(t, Tensor) and t._dtype.category == D.FLOATING and t._dtype is not D.float64
            and t.device.type == dev_type)          # .device: a fake tensor reports the device it stands for


def _cast(t, dev_type, dtype):
    """Tensor `t` cast to `dtype` when it is eligible (`_eligible`) and not of it already; the
    lower-precision cast of a float32 leaf that requires grad is made once per region (cache_enabled)."""
    tdt = t._dtype
    if tdt is dtype or tdt.category != D.FLOATING or tdt is D.float64 or t.device.type != dev_type:
        return t
    # cacheable: a float32 leaf that requires grad (`grad_fn is None` of a tensor that is not a view)
    if (tdt is D.float32 and t._requires_grad and t._base is None and t._grad_fn is None
            and dtype is not D.float32 and _thread.cache_enabled and _state.tls.grad_enabled):
        cache = _thread.cache
        hit = cache.get(id(t))
        if hit is not None and hit[0] is t and hit[1] == t._version[0] and hit[2] is dtype:
            return hit[3]
        out = t.to(dtype)
        cache[id(t)] = (t, t._version[0], dtype, out)
        return out
    return t.to(dtype)


def _cast_seq(a, dev_type, dtype):
    return type(a)([_cast(x, dev_type, dtype) if isinstance(x, Tensor) else x for x in a])


def _cast_all(args, kwargs, dev_type, dtype):
    out = []
    for a in args:                     # a loop, not a generator of a closure: this runs per autocast op
        if isinstance(a, Tensor):
            a = _cast(a, dev_type, dtype)
        elif (type(a) is list or type(a) is tuple) and _dispatch._has_tensor(a):
            a = _cast_seq(a, dev_type, dtype)
        out.append(a)
    if kwargs:
        kwargs = {k: _cast(v, dev_type, dtype) if isinstance(v, Tensor) else
                  _cast_seq(v, dev_type, dtype) if (type(v) is list or type(v) is tuple) and _dispatch._has_tensor(v)
                  else v for k, v in kwargs.items()}
    return tuple(out), kwargs


def _tensors(args, kwargs):
    for a in list(args) + list((kwargs or {}).values()):
        if isinstance(a, Tensor):
            yield a
        elif type(a) in (list, tuple):
            yield from (x for x in a if isinstance(x, Tensor))


def _lower(op, dev_type, dtype, args, kwargs):
    return _cast_all(args, kwargs, dev_type, dtype)


def _fp32(op, dev_type, dtype, args, kwargs):
    return _cast_all(args, kwargs, dev_type, D.float32)


def _fp32_opt(op, dev_type, dtype, args, kwargs):
    """float32 unless the caller asked for an output dtype; only the first tensor decides."""
    if kwargs and kwargs.get("dtype") is not None:
        return args, kwargs
    names = [a.name for a in op._schema.args]
    if "dtype" in names and len(args) > names.index("dtype") and args[names.index("dtype")] is not None:
        return args, kwargs
    first = next(_tensors(args, kwargs), None)
    if not _eligible(first, dev_type):
        return args, kwargs
    return _cast_all(args, kwargs, dev_type, D.float32)


def _promote(op, dev_type, dtype, args, kwargs):
    wide = None
    for t in _tensors(args, kwargs):
        if _eligible(t, dev_type):
            wide = t._dtype if wide is None else D.promote_types(wide, t._dtype)
    if wide is None:
        return args, kwargs
    return _cast_all(args, kwargs, dev_type, wide)


def _banned(op, dev_type, dtype, args, kwargs):
    raise RuntimeError(f"{op.__name__} is unsafe to autocast: a sigmoid followed by binary cross entropy "
                       "loses precision in reduced precision. Combine the two layers with "
                       "torch.nn.functional.binary_cross_entropy_with_logits (or nn.BCEWithLogitsLoss), "
                       "which is safe to autocast.")


# Each op declares its policy as tags: `autocast_*` on cuda and every other device, `cpu_autocast_*` on cpu.
_RULES = {Tag.autocast_lower_precision: _lower, Tag.autocast_fp32: _fp32, Tag.autocast_fp32_opt: _fp32_opt,
          Tag.autocast_promote: _promote, Tag.autocast_banned: _banned}
_CPU_RULES = {Tag.cpu_autocast_lower_precision: _lower, Tag.cpu_autocast_fp32: _fp32,
              Tag.cpu_autocast_promote: _promote}


_rule_cache: dict = {}              # op -> (its rule on every device but cpu, its rule on cpu); None: no rule


def _rules(op) -> tuple:
    rules = tuple(next((r for tag, r in table.items() if tag in op.tags), None) for table in (_RULES, _CPU_RULES))
    _rule_cache[op] = rules
    return rules


def _rule(op, dev_type):
    """The cast rule `op`'s tags give it on `dev_type`, or None."""
    return (_rule_cache.get(op) or _rules(op))[dev_type == "cpu"]


def cast_inputs(op, args, kwargs):
    """The dispatcher's autocast layer: return (args, kwargs) cast by the op's policy on each device."""
    if kwargs and "out" in kwargs:
        return args, kwargs            # out= variants are not autocast (PyTorch's rule)
    rules = _rule_cache.get(op) or _rules(op)
    for dev_type, dtype in _state.tls.autocast.items():
        rule = rules[dev_type == "cpu"]
        if rule is not None:
            args, kwargs = rule(op, dev_type, dtype, args, kwargs)
    return args, kwargs


def call_composite(op, fn, args, kwargs):
    """A Python composite with an autocast policy (`_registry.autocast_policy`): cast its inputs as
    an op's, then run its body with autocast off on the devices whose policy applied, so that its
    inner ops are not cast again (PyTorch runs an op's kernel below its autocast layer)."""
    args, kwargs = cast_inputs(op, args, kwargs)
    saved = _state.tls.autocast
    _state.set_autocast({d: t for d, t in saved.items() if _rule(op, d) is None})
    try:
        return fn(*args, **kwargs)
    finally:
        _state.set_autocast(saved)


# ---- per-thread state -------------------------------------------------------------------------------
def _set(device_type, enabled, dtype):
    on = dict(_state.tls.autocast)
    _thread.dtypes[device_type] = dtype
    if enabled:
        on[device_type] = dtype
    else:
        on.pop(device_type, None)
    _state.set_autocast(on)


def _check_device(device_type):
    if device_type not in _DEVICE_TYPES:
        raise RuntimeError(f"User specified an unsupported autocast device_type '{device_type}'")


def is_autocast_available(device_type: str) -> bool:
    """Whether autocast can run on `device_type` ('cpu', 'cuda', ...)."""
    return device_type in _DEVICE_TYPES


def is_autocast_enabled(device_type: str | None = None) -> bool:
    """Whether autocast is on for `device_type` (no argument: cuda, as in PyTorch)."""
    return ("cuda" if device_type is None else device_type) in _state.tls.autocast


def set_autocast_enabled(device_type, enabled=None) -> None:
    """`set_autocast_enabled(device_type, enabled)`, or the old `set_autocast_enabled(enabled)` for cuda."""
    if enabled is None:
        device_type, enabled = "cuda", device_type
    _check_device(device_type)
    _set(device_type, enabled, get_autocast_dtype(device_type))


def get_autocast_dtype(device_type: str):
    """The dtype autocast uses on `device_type` (bfloat16 on cpu, float16 on cuda unless changed)."""
    return _thread.dtypes.get(device_type, D.float16)


def set_autocast_dtype(device_type: str, dtype) -> None:
    _check_device(device_type)
    _set(device_type, is_autocast_enabled(device_type), dtype)


def is_autocast_cache_enabled() -> bool:
    return _thread.cache_enabled


def set_autocast_cache_enabled(enabled: bool) -> None:
    _thread.cache_enabled = bool(enabled)


def clear_autocast_cache() -> None:
    _thread.cache.clear()


def autocast_increment_nesting() -> int:
    _thread.nesting += 1
    return _thread.nesting


def autocast_decrement_nesting() -> int:
    _thread.nesting -= 1
    return _thread.nesting


def is_autocast_cpu_enabled() -> bool:
    return is_autocast_enabled("cpu")


def set_autocast_cpu_enabled(enabled: bool) -> None:
    set_autocast_enabled("cpu", enabled)


def get_autocast_cpu_dtype():
    return get_autocast_dtype("cpu")


def set_autocast_cpu_dtype(dtype) -> None:
    set_autocast_dtype("cpu", dtype)


def get_autocast_gpu_dtype():
    return get_autocast_dtype("cuda")


def set_autocast_gpu_dtype(dtype) -> None:
    set_autocast_dtype("cuda", dtype)


# ---- the context manager ------------------------------------------------------------------------
class autocast:
    """Run the enclosed ops in mixed precision on `device_type`; a context manager or a decorator.

        with flambeau.autocast("cpu"):           # bfloat16 on cpu, float16 on cuda by default
            loss = model(x)
    """

    def __init__(self, device_type: str, dtype=None, enabled: bool = True, cache_enabled: bool | None = None):
        if not isinstance(device_type, str):
            raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
        if dtype is not None and not isinstance(dtype, D.dtype):
            raise ValueError(f"Expected `dtype` to be a flambeau.dtype, got: `{type(dtype)}`")
        self.device = device_type
        self.fast_dtype = get_autocast_dtype(device_type) if dtype is None else dtype
        _check_device(device_type)
        self._cache_enabled = _thread.cache_enabled if cache_enabled is None else bool(cache_enabled)
        name = device_type.upper()
        if enabled:
            if device_type == "cuda":
                if not cuda.is_available():
                    warnings.warn("CUDA is not available. Disabling autocast.", stacklevel=2)
                    enabled = False
            elif self.fast_dtype not in (D.bfloat16, D.float16):
                warnings.warn(f"In {name} autocast, but the target dtype is not supported. Disabling autocast.\n"
                              f"{name} Autocast only supports dtypes of flambeau.bfloat16, flambeau.float16 "
                              "currently.", stacklevel=2)
                enabled = False
        self._enabled = bool(enabled)
        self._saved = []

    def __enter__(self):
        self._saved.append((is_autocast_enabled(self.device), get_autocast_dtype(self.device), _thread.cache_enabled))
        _set(self.device, self._enabled, self.fast_dtype)
        autocast_increment_nesting()
        set_autocast_cache_enabled(self._cache_enabled)
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        if autocast_decrement_nesting() == 0:
            clear_autocast_cache()
        prev, prev_dtype, prev_cache = self._saved.pop()
        _set(self.device, prev, prev_dtype)
        set_autocast_cache_enabled(prev_cache)
        return False

    def __call__(self, func):
        @functools.wraps(func)
        def decorated(*args, **kwargs):
            with self:
                return func(*args, **kwargs)
        decorated.__autocast_wrapped__ = True
        return decorated

    def __repr__(self):
        return f"autocast(device_type={self.device!r}, dtype={self.fast_dtype}, enabled={self._enabled})"


# ---- custom autograd Functions ------------------------------------------------------------------
def _cast_tree(value, device_type, dtype):
    if isinstance(value, Tensor):
        return value.to(dtype) if _eligible(value, device_type) else value
    if isinstance(value, dict):
        return {k: _cast_tree(v, device_type, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cast_tree(v, device_type, dtype) for v in value)
    return value


def custom_fwd(fwd=None, *, device_type: str, cast_inputs=None):
    """Decorator for a custom Function's forward: optionally run it in `cast_inputs` with autocast off,
    and remember the autocast state so `custom_bwd` can run backward under the same state."""
    if not isinstance(device_type, str):
        raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
    if fwd is None:
        return functools.partial(custom_fwd, device_type=device_type, cast_inputs=cast_inputs)

    @functools.wraps(fwd)
    def decorate_fwd(*args, **kwargs):
        ctx = args[0]
        ctx._dtype = get_autocast_dtype(device_type)
        if cast_inputs is None:
            ctx._fwd_used_autocast = is_autocast_enabled(device_type)
            return fwd(*args, **kwargs)
        autocast_on = is_autocast_enabled(device_type)
        ctx._fwd_used_autocast = False
        if autocast_on:
            with autocast(device_type=device_type, enabled=False):
                return fwd(*_cast_tree(args, device_type, cast_inputs), **_cast_tree(kwargs, device_type,
                                                                                        cast_inputs))
        return fwd(*args, **kwargs)
    return decorate_fwd


def custom_bwd(bwd=None, *, device_type: str):
    """Decorator for a custom Function's backward: run it with the autocast state of its forward."""
    if not isinstance(device_type, str):
        raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
    if bwd is None:
        return functools.partial(custom_bwd, device_type=device_type)

    @functools.wraps(bwd)
    def decorate_bwd(*args, **kwargs):
        ctx = args[0]
        with autocast(device_type=device_type, enabled=ctx._fwd_used_autocast, dtype=ctx._dtype):
            return bwd(*args, **kwargs)
    return decorate_bwd


_dispatch.register_autocast(cast_inputs, call_composite)
