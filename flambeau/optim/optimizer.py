"""`Optimizer`: parameter groups, per-parameter state, state_dict in PyTorch's structure, step hooks,
and the driver that runs an algorithm's array-level update rule either per parameter (foreach=False)
or once per (device, dtype) group on flat arrays (foreach=True, see `_foreach`)."""
from __future__ import annotations

import copy
import functools
import itertools
from collections import OrderedDict, defaultdict

import numpy as np

from .._tensor import Tensor, _no_grad
from .. import _dtype as D
from . import _foreach as FE
from .._ops.creation import tensor, zeros_like
from ..autograd import enable_grad

__all__ = ["Optimizer", "required"]


class _RequiredParameter:
    def __repr__(self):
        return "<required parameter>"


required = _RequiredParameter()


class _Handle:
    _ids = itertools.count()

    def __init__(self, d):
        self.d = d
        self.id = next(_Handle._ids)

    def remove(self):
        self.d.pop(self.id, None)


def _with_hooks(step):
    @functools.wraps(step)
    def wrapper(self, *args, **kwargs):
        for hook in list(self._optimizer_step_pre_hooks.values()):
            res = hook(self, args, kwargs)
            if res is not None:
                if not (isinstance(res, tuple) and len(res) == 2):
                    raise RuntimeError(f"{step} must return None or a tuple of (new_args, new_kwargs), but got "
                                       f"{res}.")
                args, kwargs = res
        out = step(self, *args, **kwargs)
        self._step_count = getattr(self, "_step_count", 0) + 1
        for hook in list(self._optimizer_step_post_hooks.values()):
            hook(self, args, kwargs)
        return out
    wrapper._hooked = True
    return wrapper


def per_tensor(fn, *arrays) -> np.ndarray:
    """`fn` applied to the per-tensor values (Python floats) of 1-D arrays: scalar math done the same way
    whether one tensor or a whole group is stepped, so both paths give bit-identical results."""
    return np.asarray([fn(*vals) for vals in zip(*(a.tolist() for a in arrays))], dtype=np.float64)


def _uniform_or(expand):
    """`ex` for `_update`: per-tensor values that are all equal (the usual case: every parameter
    has taken the same number of steps) become one Python float, which NumPy applies without
    changing the array dtype, as PyTorch applies its Python-float bias corrections; otherwise
    `expand` them to one value per element."""
    def ex(a):
        a = np.asarray(a)
        first = a.reshape(-1)[0]
        if a.dtype != np.bool_ and (a.size == 1 or (a == first).all()):   # masks stay arrays (xp.where)
            return float(first)
        return expand(a)
    return ex


_TENSOR_GRAD = Tensor.grad           # the property; a subclass may define its own `.grad`


def _scalar_tensor(value, dtype=None):
    return tensor(value, dtype=dtype or D.float32)


class Optimizer:
    """Base class: holds `param_groups` (list of dicts) and `state` (param -> dict)."""

    # Subclasses set: _state_names (array states, zero-initialised unless _init_state says otherwise),
    # and implement `_update(xp, p, g, s, step, group, ex)` over arrays: p, g and the state arrays s
    # are flat (foreach) or one parameter's; `step` and scalar states hold one value per tensor and
    # `ex(a)` broadcasts such per-tensor values to p's elements. Updates are in place.
    _state_names: tuple = ()
    _scalar_states: tuple = ()      # per-parameter 0-d states (kept as one value per tensor)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "step" in cls.__dict__ and not getattr(cls.__dict__["step"], "_hooked", False):
            cls.step = _with_hooks(cls.__dict__["step"])

    def __init__(self, params, defaults: dict):
        self.defaults = defaults
        self._optimizer_step_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_step_post_hooks: OrderedDict = OrderedDict()
        self._optimizer_state_dict_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_state_dict_post_hooks: OrderedDict = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_load_state_dict_post_hooks: OrderedDict = OrderedDict()
        self._flat: dict = {}
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, "
                            f"but got {params.type()}")
        self.state: defaultdict = defaultdict(dict)
        self.param_groups: list = []
        groups = list(params)
        if len(groups) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)

    def __getstate__(self):
        return {"defaults": self.defaults, "state": self.state, "param_groups": self.param_groups}

    def __setstate__(self, state):
        self.__dict__.update(state)
        for name in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks", "_optimizer_state_dict_pre_hooks",
                     "_optimizer_state_dict_post_hooks", "_optimizer_load_state_dict_pre_hooks",
                     "_optimizer_load_state_dict_post_hooks"):
            self.__dict__.setdefault(name, OrderedDict())
        self._flat = {}

    def __repr__(self):
        s = type(self).__name__ + " ("
        for i, group in enumerate(self.param_groups):
            s += "\n"
            s += f"Parameter Group {i}\n"
            for key in sorted(group.keys()):
                if key != "params":
                    s += f"    {key}: {group[key]}\n"
        return s + ")"

    def add_param_group(self, param_group: dict) -> None:
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            param_group["params"] = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, but the ordering "
                            "of tensors in sets will change between runs. Please use a list instead.")
        else:
            param_group["params"] = list(params)
        for p in param_group["params"]:
            if not isinstance(p, Tensor):
                raise TypeError("optimizer can only optimize Tensors, but one of the params is " + type(p).__name__)
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        for name, default in self.defaults.items():
            if default is required and name not in param_group:
                raise ValueError(f"parameter group didn't specify a value of required optimization parameter {name}")
            param_group.setdefault(name, default)
        seen = set()
        for g in self.param_groups:
            seen.update(id(p) for p in g["params"])
        if any(id(p) in seen for p in param_group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if type(p).grad is _TENSOR_GRAD:        # `.grad` as Tensor's (read and set without its property)
                    if p._grad is None:
                        continue
                    if set_to_none:
                        p._grad = None
                        continue
                elif p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    # ---- hooks ----------------------------------------------------------------------------
    def register_step_pre_hook(self, hook):
        h = _Handle(self._optimizer_step_pre_hooks)
        self._optimizer_step_pre_hooks[h.id] = hook
        return h

    def register_step_post_hook(self, hook):
        h = _Handle(self._optimizer_step_post_hooks)
        self._optimizer_step_post_hooks[h.id] = hook
        return h

    def register_state_dict_pre_hook(self, hook, prepend: bool = False):
        h = _Handle(self._optimizer_state_dict_pre_hooks)
        self._optimizer_state_dict_pre_hooks[h.id] = hook
        return h

    def register_state_dict_post_hook(self, hook, prepend: bool = False):
        h = _Handle(self._optimizer_state_dict_post_hooks)
        self._optimizer_state_dict_post_hooks[h.id] = hook
        return h

    def register_load_state_dict_pre_hook(self, hook, prepend: bool = False):
        h = _Handle(self._optimizer_load_state_dict_pre_hooks)
        self._optimizer_load_state_dict_pre_hooks[h.id] = hook
        return h

    def register_load_state_dict_post_hook(self, hook, prepend: bool = False):
        h = _Handle(self._optimizer_load_state_dict_post_hooks)
        self._optimizer_load_state_dict_post_hooks[h.id] = hook
        return h

    # ---- state dict -----------------------------------------------------------------------
    def state_dict(self) -> dict:
        for hook in self._optimizer_state_dict_pre_hooks.values():
            hook(self)
        mapping: dict = {}
        start = 0
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            for i, p in enumerate(group["params"], start):
                mapping.setdefault(id(p), i)
            packed["params"] = [mapping[id(p)] for p in group["params"]]
            start += len(packed["params"])
            groups.append(packed)
        state = {(mapping[id(k)] if isinstance(k, Tensor) else k): v for k, v in self.state.items()}
        sd = {"state": state, "param_groups": groups}
        for hook in self._optimizer_state_dict_post_hooks.values():
            res = hook(self, sd)
            if res is not None:
                sd = res
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = state_dict.copy()
        for hook in self._optimizer_load_state_dict_pre_hooks.values():
            res = hook(self, state_dict)
            if res is not None:
                state_dict = res
        groups = self.param_groups
        saved_groups = copy.deepcopy(state_dict["param_groups"])
        if len(groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(groups, saved_groups)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                             "optimizer's group")
        id_map = dict(zip(itertools.chain.from_iterable(s["params"] for s in saved_groups),
                          itertools.chain.from_iterable(g["params"] for g in groups)))

        def cast(param, value, key=None):
            if isinstance(value, Tensor):
                if key == "step":
                    return value.clone()
                if param.is_floating_point() and value.is_floating_point():
                    return value.to(param.device, param.dtype).clone()
                return value.to(param.device).clone()
            if isinstance(value, dict):
                return {k: cast(param, v, k) for k, v in value.items()}
            return copy.deepcopy(value)

        state: defaultdict = defaultdict(dict)
        for k, v in state_dict["state"].items():
            if k in id_map:
                state[id_map[k]] = cast(id_map[k], v)
            else:
                state[k] = v
        new_groups = []
        for g, s in zip(groups, saved_groups):
            s["params"] = g["params"]
            new_groups.append(s)
        self.__setstate__({"state": state, "param_groups": new_groups})
        for hook in self._optimizer_load_state_dict_post_hooks.values():
            hook(self)

    # ---- the step driver ------------------------------------------------------------------
    def _init_state(self, p, group) -> dict:
        """Fresh state for parameter p (subclasses extend): 'step' plus zeroed arrays."""
        st = {"step": _scalar_tensor(0.0)}
        for name in self._state_names:
            st[name] = zeros_like(p)
        return st

    def _foreach_default(self, group) -> bool:
        """foreach=None picks the multi-tensor path when every parameter is on cuda, as PyTorch does:
        there it saves one kernel launch per tensor; on cpu, gathering into flat arrays costs more
        memory traffic than the per-tensor loop saves in dispatch (bench/optim_step.py)."""
        fe = group.get("foreach")
        if fe is None:
            return all(p.device.type == "cuda" for p in group["params"])
        return bool(fe)

    def _step_impl(self, closure=None):
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with _no_grad():
            self._step_groups()
        return loss

    def _step_groups(self):
        for gi, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if (p._grad if type(p).grad is _TENSOR_GRAD else p.grad) is not None]
            if not params:
                continue
            for p in params:
                if len(self.state[p]) == 0:
                    self.state[p].update(self._init_state(p, group))
            params = self._fused_step(group, params)
            if not params:
                continue
            if self._foreach_default(group):
                for idx in FE.group_by_device_dtype(range(len(params)), params):
                    self._foreach_step(gi, group, [params[i] for i in idx])
            else:
                for p in params:
                    self._single_step(group, p)

    def _fused_step(self, group, params) -> list:
        """Step the parameters a fused kernel takes (subclasses with one); return the others."""
        return params

    def _single_step(self, group, p):
        xp = FE.xp_of(p)
        st = self.state[p]
        g = p.grad._data
        if group.get("maximize", False):
            g = -g
        arrays = {k: v._data for k, v in st.items() if isinstance(v, Tensor) and k != "step"}
        step = st["step"]
        step._data[...] += 1
        step._version[0] += 1
        self._update(xp, p._data, g, arrays, np.asarray(step._data, dtype=np.float64).reshape(1), group,
                     _uniform_or(lambda a: xp.asarray(a, dtype=p._data.dtype).reshape(())))
        for k, v in st.items():
            if isinstance(v, Tensor):
                v._version[0] += 1
        p._version[0] += 1

    def _foreach_step(self, gi, group, params):
        xp = FE.xp_of(params[0])
        states = [self.state[p] for p in params]
        counts = FE.sizes(params)
        key = (gi, str(params[0].device), params[0].dtype)
        flats = self._flat.setdefault(key, {})
        names = [k for k, v in states[0].items() if isinstance(v, Tensor) and k != "step"]
        arrays = {n: flats.setdefault(n, FE.FlatState()).get(np if n in self._scalar_states else xp,
                                                             [s[n] for s in states]) for n in names}
        steps = flats.setdefault("step", FE.FlatState()).get(np, [s["step"] for s in states])
        steps += 1
        for s in states:
            for v in s.values():
                if isinstance(v, Tensor):
                    v._version[0] += 1
        P = FE.gather(xp, [p._data for p in params])
        G = FE.gather(xp, [p.grad._data for p in params])
        if group.get("maximize", False):
            G = -G
        self._update(xp, P, G, arrays, steps.astype(np.float64), group,
                     _uniform_or(lambda a: FE.expand(xp, a, counts).astype(P.dtype, copy=False)))
        FE.scatter(P, params)

    def _update(self, xp, p, g, s, step, group) -> None:
        raise NotImplementedError

    def step(self, closure=None):
        raise NotImplementedError
