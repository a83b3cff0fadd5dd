"""Adam family: Adam, AdamW (amsgrad, maximize, weight decay), Adamax, NAdam, RAdam.

Each `_update` is the algorithm's step over arrays (see `Optimizer._update`); it runs per parameter or
once on a group's flat arrays."""
from __future__ import annotations

import math
import operator

import numpy as np

from .._backends import cpu_kernels, triton_launch
from .._tensor import Tensor
from .. import _pending_grads
from .optimizer import Optimizer, _scalar_tensor, per_tensor
from . import _foreach as FE
from .._ops.creation import zeros_like

__all__ = ["Adam", "AdamW", "Adamax", "NAdam", "RAdam"]


def _check(lr, eps, betas, weight_decay):
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


def _check_fused(foreach, differentiable):
    if foreach:
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
    if differentiable:
        raise RuntimeError("`fused` does not support `differentiable`")


def _weight_decay(p, g, group, decoupled):
    wd = group["weight_decay"]
    if wd == 0:
        return g
    if decoupled:
        p *= 1 - group["lr"] * wd
        return g
    return g + wd * p


_data_of, _grad_of = operator.attrgetter("_data"), operator.attrgetter("_grad")
_layout_of = operator.attrgetter("dtype", "shape", "strides")
MAX_CUTS = 4        # `_FusedPlan.segments` keeps this many cuts of a group's parameters


class _FusedPlan:
    """One parameter group's fused step, worked out for the parameters that had gradients: which of them
    the kernel takes (cuda, float32, one dense layout with their states: `triton_adam.supported`), their
    step counters and version counters, and `triton_adam.Arrays` of their arrays. `holds` says whether a
    later step brings the same parameters with the same arrays, state dicts and state tensors (all held
    here, so no id is reused meanwhile); `gradients` checks each step's gradients against the layouts.
    The checks are maps over the parameters (no Python loop body per parameter)."""

    def __init__(self, params, state, amsgrad: bool, triton_adam):
        self.ids = tuple(map(id, params))
        self.amsgrad = amsgrad
        # (the parameter standing in for its gradient: each step's gradients are checked in `gradients`)
        self.taken = [p for p in params if p.device.type == "cuda" and triton_adam.supported(
            p._data, p._data, *(v._data for k, v in state[p].items() if k != "step"))]
        self.states = [state[p] for p in self.taken]
        # the step counters of those parameters; host ones (as `_init_state` makes them) as views of one array
        # (`FlatState`), so that a step adds one to all of them in one operation
        steps = [st["step"] for st in self.states]
        self.steps = FE.FlatState().get(np, steps) if steps and all(
            type(t._data) is np.ndarray for t in steps) else [t._data for t in steps]
        self.params = list(params)
        self.datas = list(map(_data_of, params))
        self.dicts = list(map(state.get, params))
        self.names = sorted({k for st in self.dicts for k in st})
        self.sizes = list(map(len, self.dicts))
        get = {n: operator.itemgetter(n) for n in self.names}
        # per state name: the tensors and their arrays (every parameter has each name: else no plan holds)
        whole = all(n in st for st in self.dicts for n in self.names)
        self.tensors = {n: list(map(get[n], self.dicts)) for n in self.names} if whole else None
        self.arrays_of = {n: list(map(_data_of, t)) for n, t in self.tensors.items()} if whole else None
        self.one_device = len({str(p.device) for p in self.taken}) <= 1
        self.all_cuda = all(p.device.type == "cuda" for p in params)
        taken = set(map(id, self.taken))
        self.rest = [p for p in params if id(p) not in taken]
        self.layouts = [(np.dtype(np.float32), p._data.shape, p._data.strides) for p in self.taken]
        self.versions = [p._version for p in self.taken] + [
            st[n]._version for st in self.states for n in ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
            if n in st]
        self.rows = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq" if amsgrad else "exp_avg")
        self.arrays = self._arrays(range(len(self.taken)), triton_adam) if self.taken else None
        self.cuts: dict = {}      # how DDP's pending reductions cut the taken parameters -> `segments`

    def _arrays(self, indices, triton_adam):
        return triton_adam.Arrays([self.taken[i]._data for i in indices], *(
            [self.states[i][n]._data for i in indices] for n in self.rows))

    def segments(self, triton_adam) -> list | None:
        """The taken parameters in the order their gradients become final (`_pending_grads.partition`:
        those DDP has finished reducing first, then each group still reducing), each part with its own
        `triton_adam.Arrays` (made once per cut): [(group or None, Arrays, indices into `taken`)]; None
        when no taken gradient is pending."""
        parts = [(g, ps) for g, ps in _pending_grads.partition(self.taken) if ps]
        if len(parts) == 1 and parts[0][0] is None:
            return None
        key = tuple(tuple(map(id, ps)) for _, ps in parts)
        cut = self.cuts.get(key)
        if cut is None:
            if len(self.cuts) >= MAX_CUTS:
                self.cuts.clear()
            where = {id(p): i for i, p in enumerate(self.taken)}
            indices = [[where[id(p)] for p in ps] for _, ps in parts]
            cut = self.cuts[key] = [(self._arrays(idx, triton_adam), idx) for idx in indices]
        return [(g, arrays, idx) for (g, _), (arrays, idx) in zip(parts, cut)]

    def holds(self, params, state, amsgrad: bool) -> bool:
        """Whether these are the planned parameters with the same arrays, state dicts and state tensors."""
        is_ = operator.is_
        if amsgrad != self.amsgrad or self.tensors is None or tuple(map(id, params)) != self.ids or \
                not all(map(is_, map(_data_of, params), self.datas)):
            return False
        dicts = list(map(state.get, params))
        if not all(map(is_, dicts, self.dicts)) or list(map(len, dicts)) != self.sizes:
            return False
        for n in self.names:
            try:
                tensors = list(map(operator.itemgetter(n), dicts))
            except KeyError:
                return False
            if not all(map(is_, tensors, self.tensors[n])) or not all(map(is_, map(_data_of, tensors), self.arrays_of[n])):
                return False
        return True

    def advance_steps(self) -> float | None:
        """Add one to every taken parameter's step count and return the new count; None (nothing changed)
        when the counts differ."""
        steps = self.steps
        if type(steps) is np.ndarray:
            if (steps != steps[0]).any():
                return None
            steps += 1
            return float(steps[0])
        if len(set(map(float, steps))) != 1:
            return None
        for st in steps:
            st[...] += 1
        return float(steps[0])

    def gradients(self, triton_adam) -> tuple:
        """(the taken parameters' gradient arrays, ids of the taken parameters whose gradient the kernel
        does not take this step: another dtype or layout)."""
        grads = list(map(_data_of, map(_grad_of, self.taken)))
        if list(map(_layout_of, grads)) == self.layouts:
            return grads, ()
        others = set()
        for p, g, (_, shape, strides), st in zip(self.taken, grads, self.layouts, self.states):
            if g.dtype != np.float32 or g.shape != shape or (g.strides != strides and not triton_adam.supported(
                    p._data, g, *(v._data for k, v in st.items() if k != "step"))):
                others.add(id(p))
        return grads, others


class Adam(Optimizer):
    _state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=None,
                 decoupled_weight_decay=False):
        _check(lr, eps, betas, weight_decay)
        if fused:
            _check_fused(foreach, differentiable)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize, foreach=foreach, capturable=capturable,
                                      differentiable=differentiable, fused=fused,
                                      decoupled_weight_decay=decoupled_weight_decay))

    def _init_state(self, p, group):
        st = super()._init_state(p, group)
        if group["amsgrad"]:
            st["max_exp_avg_sq"] = zeros_like(p)
        return st

    def _fused_step(self, group, params) -> list:
        """fused=True (or unset with foreach unset, where PyTorch would pick foreach): the float32 cuda
        parameters in one Triton launch per step count (`triton_adam`); the rest go the usual way.
        What stays from step to step (which parameters the kernel takes, their and their states' arrays
        and addresses) is kept per group (`_FusedPlan`) while the same tensors and arrays come back."""
        fused = group.get("fused")
        if fused is None and (group.get("foreach") is not None or group.get("differentiable")):
            fused = False
        if not (fused or fused is None):
            return params
        plans = self.__dict__.setdefault("_fused_plans", {})
        plan = plans.get(id(group))
        fresh = plan is None or not plan.holds(params, self.state, group["amsgrad"])
        if fresh:       # (the devices first: a cpu model never imports Triton)
            if fused is None and not all(p.device.type == "cuda" for p in params) or not triton_launch.available():
                return params
        elif fused is None and not plan.all_cuda:      # (the plan's parameters: their devices checked once)
            return params
        from .._backends import triton_adam  # deferred: imports Triton, optional (cuda only)
        if fresh:
            plan = plans[id(group)] = _FusedPlan(params, self.state, group["amsgrad"], triton_adam)
        if not plan.taken:
            return params
        grads, others = plan.gradients(triton_adam)
        if others or not plan.one_device:    # a gradient the kernel does not take: those go the usual way
            fused = [p for p in plan.taken if id(p) not in others]
            self._fused_groups(group, fused, triton_adam)
            fused = set(map(id, fused))
            return [p for p in params if id(p) not in fused]
        first = plan.advance_steps()
        if first is None:                               # uneven step counts: one launch per count
            self._fused_groups(group, plan.taken, triton_adam)
            return plan.rest
        hyper = dict(lr=self._fused_lr(group), beta1=group["betas"][0], beta2=group["betas"][1], eps=group["eps"],
                     weight_decay=group["weight_decay"], step=first, amsgrad=group["amsgrad"],
                     maximize=group["maximize"], decoupled=group["decoupled_weight_decay"])
        segments = plan.segments(triton_adam) if _pending_grads.waits else None
        if segments is None:
            triton_adam.launch(plan.arrays, [g.data.ptr for g in grads], **hyper)
        else:       # DDP's last reductions still run: the others' update first, each pending group after its wait
            for pending, arrays, idx in segments:
                if pending is not None:
                    pending.settle()
                triton_adam.launch(arrays, [grads[i].data.ptr for i in idx], **hyper)
        for ver in plan.versions:
            ver[0] += 1
        return plan.rest

    @staticmethod
    def _fused_lr(group):
        lr = group["lr"]
        if isinstance(lr, Tensor):
            return lr._data if lr.device.type == "cuda" else float(lr.item())
        return lr

    def _fused_groups(self, group, taken, triton_adam) -> None:
        """The fused step of `taken` (parameters the kernel takes), one launch per device and step count."""
        by_step: dict = {}
        for p in taken:
            step = self.state[p]["step"]
            step._data[...] += 1
            step._version[0] += 1
            by_step.setdefault((str(p.device), float(step._data)), []).append(p)
        b1, b2 = group["betas"]
        lr = self._fused_lr(group)
        for (_, step), ps in by_step.items():
            states = [self.state[p] for p in ps]
            triton_adam.step([p._data for p in ps], [p.grad._data for p in ps], [s["exp_avg"]._data for s in states],
                             [s["exp_avg_sq"]._data for s in states],
                             [s["max_exp_avg_sq"]._data for s in states] if group["amsgrad"] else None,
                             lr=lr, beta1=b1, beta2=b2, eps=group["eps"], weight_decay=group["weight_decay"],
                             step=step, amsgrad=group["amsgrad"], maximize=group["maximize"],
                             decoupled=group["decoupled_weight_decay"])
            for p, s in zip(ps, states):
                p._version[0] += 1
                for name in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
                    if name in s:
                        s[name]._version[0] += 1

    def _update(self, xp, p, g, s, step, group, ex):
        b1, b2 = group["betas"]
        if step.size == 1:         # one tensor's step: what `ex(per_tensor(...))` gives, without its arrays
            t = step.item()
            bc1, bc2_sqrt = float(1 - b1 ** t), float(math.sqrt(1 - b2 ** t))
        else:
            bc1 = ex(per_tensor(lambda t: 1 - b1 ** t, step))
            bc2_sqrt = ex(per_tensor(lambda t: math.sqrt(1 - b2 ** t), step))
        if xp is np and step.size == 1 and self._fused_cpu(p, g, s, bc1, bc2_sqrt, group):
            return
        g = _weight_decay(p, g, group, group["decoupled_weight_decay"])
        m, v = s["exp_avg"], s["exp_avg_sq"]
        m += (g - m) * (1 - b1)
        v *= b2
        v += (1 - b2) * g * g
        if group["amsgrad"]:
            mx = s["max_exp_avg_sq"]
            xp.maximum(mx, v, out=mx)
            denom = xp.sqrt(mx) / bc2_sqrt + group["eps"]
        else:
            denom = xp.sqrt(v) / bc2_sqrt + group["eps"]
        p -= (group["lr"] / bc1) * m / denom

    def _fused_cpu(self, p, g, s, bc1, bc2_sqrt, group) -> bool:
        """The update below, bit for bit, as one C++ pass over float32 arrays (one parameter)."""
        b1, b2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        if not isinstance(lr, (int, float)) or p.dtype != np.float32:
            return False
        decoupled = group["decoupled_weight_decay"]
        return cpu_kernels.adam_step(p, g, s["exp_avg"], s["exp_avg_sq"], s.get("max_exp_avg_sq") if group["amsgrad"] else None,
                                  1 - lr * wd if (decoupled and wd) else 1.0, 0.0 if (decoupled or not wd) else wd,
                                  b1, b2, float(bc2_sqrt), group["eps"], float(lr / bc1))

    def step(self, closure=None):
        return self._step_impl(closure)


class AdamW(Adam):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach, maximize=maximize,
                         capturable=capturable, differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)


class Adamax(Optimizer):
    _state_names = ("exp_avg", "exp_inf")

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, foreach=None, *,
                 maximize=False, differentiable=False, capturable=False):
        _check(lr, eps, betas, weight_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=foreach,
                                      maximize=maximize, differentiable=differentiable, capturable=capturable))

    def _update(self, xp, p, g, s, step, group, ex):
        b1, b2 = group["betas"]
        g = _weight_decay(p, g, group, False)
        m, u = s["exp_avg"], s["exp_inf"]
        m += (g - m) * (1 - b1)
        xp.maximum(u * b2, xp.abs(g) + group["eps"], out=u)
        clr = ex(per_tensor(lambda t: group["lr"] / (1 - b1 ** t), step))
        p -= clr * m / u

    def step(self, closure=None):
        return self._step_impl(closure)


class NAdam(Optimizer):
    _state_names = ("exp_avg", "exp_avg_sq")
    _scalar_states = ("mu_product",)

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, momentum_decay=4e-3,
                 decoupled_weight_decay=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False):
        _check(lr, eps, betas, weight_decay)
        if not 0.0 <= momentum_decay:
            raise ValueError(f"Invalid momentum_decay value: {momentum_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      momentum_decay=momentum_decay, decoupled_weight_decay=decoupled_weight_decay,
                                      maximize=maximize, foreach=foreach, capturable=capturable,
                                      differentiable=differentiable))

    def _init_state(self, p, group):
        return {"step": _scalar_tensor(0.0), "mu_product": _scalar_tensor(1.0),
                "exp_avg": zeros_like(p), "exp_avg_sq": zeros_like(p)}

    def _update(self, xp, p, g, s, step, group, ex):
        b1, b2 = group["betas"]
        g = _weight_decay(p, g, group, group["decoupled_weight_decay"])
        md, lr = group["momentum_decay"], group["lr"]
        mu = per_tensor(lambda t: b1 * (1.0 - 0.5 * 0.96 ** (t * md)), step)
        mu_next = per_tensor(lambda t: b1 * (1.0 - 0.5 * 0.96 ** ((t + 1) * md)), step)
        mp = s["mu_product"].reshape(-1)
        mp[...] = per_tensor(lambda a, b: float(np.float32(a) * np.float32(b)), mp, mu)
        m, v = s["exp_avg"], s["exp_avg_sq"]
        m += (g - m) * (1 - b1)
        v *= b2
        v += (1 - b2) * g * g
        denom = xp.sqrt(v / ex(per_tensor(lambda t: 1 - b2 ** t, step))) + group["eps"]
        p -= ex(per_tensor(lambda u, q: lr * (1.0 - u) / (1.0 - q), mu, mp)) * g / denom
        p -= ex(per_tensor(lambda un, q: lr * un / (1.0 - q * un), mu_next, mp)) * m / denom

    def step(self, closure=None):
        return self._step_impl(closure)


class RAdam(Optimizer):
    _state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 decoupled_weight_decay=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False):
        _check(lr, eps, betas, weight_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, maximize=maximize,
                                      foreach=foreach, capturable=capturable,
                                      decoupled_weight_decay=decoupled_weight_decay, differentiable=differentiable))

    def _update(self, xp, p, g, s, step, group, ex):
        b1, b2 = group["betas"]
        g = _weight_decay(p, g, group, group["decoupled_weight_decay"])
        m, v = s["exp_avg"], s["exp_avg_sq"]
        m += (g - m) * (1 - b1)
        v *= b2
        v += (1 - b2) * g * g
        rho_inf = 2 / (1 - b2) - 1
        rho_t = per_tensor(lambda t: rho_inf - 2 * t * (b2 ** t) / (1 - b2 ** t), step)
        ok = rho_t > 5
        rect = per_tensor(lambda r: math.sqrt((r - 4) * (r - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * r))
                          if r > 5 else 0.0, rho_t)
        adaptive = ex(per_tensor(lambda t: math.sqrt(1 - b2 ** t), step)) / (xp.sqrt(v) + group["eps"])
        scale = xp.where(ex(ok), adaptive * ex(rect), 1.0)
        p -= (m / ex(per_tensor(lambda t: 1 - b1 ** t, step))) * group["lr"] * scale

    def step(self, closure=None):
        return self._step_impl(closure)
