"""SGD with momentum, dampening, Nesterov, weight decay and maximize."""
from __future__ import annotations

import numpy as np

from .optimizer import Optimizer, required
from .._ops.creation import zeros_like
from . import _foreach as FE

__all__ = ["SGD"]


class SGD(Optimizer):
    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False, fused=None):
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize, foreach=foreach,
                                      differentiable=differentiable, fused=fused))

    def _init_state(self, p, group) -> dict:
        return {}

    def _step_groups(self):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            mom = group["momentum"]
            if mom != 0:
                fresh = np.asarray([self.state[p].get("momentum_buffer") is None for p in params])
                for p in params:
                    if self.state[p].get("momentum_buffer") is None:
                        self.state[p]["momentum_buffer"] = zeros_like(p)
            else:
                fresh = np.zeros(len(params), dtype=bool)
            if self._foreach_default(group):
                for idx in FE.group_by_device_dtype(range(len(params)), params):
                    ps = [params[i] for i in idx]
                    xp = FE.xp_of(ps[0])
                    counts = FE.sizes(ps)
                    P = FE.gather(xp, [p._data for p in ps])
                    G = FE.gather(xp, [p.grad._data for p in ps])
                    buf = None
                    if mom != 0:
                        key = ("sgd", id(group), str(ps[0].device), ps[0].dtype)
                        flat = self._flat.setdefault(key, FE.FlatState())
                        buf = flat.get(xp, [self.state[p]["momentum_buffer"] for p in ps])
                        new = FE.expand(xp, fresh[idx], counts)
                    else:
                        new = None
                    self._sgd(xp, P, G, buf, new, group)
                    FE.scatter(P, ps)
            else:
                for i, p in enumerate(params):
                    xp = FE.xp_of(p)
                    buf = self.state[p]["momentum_buffer"]._data if mom != 0 else None
                    self._sgd(xp, p._data, p.grad._data, buf, xp.asarray(fresh[i]), group)
                    p._version[0] += 1
            if mom != 0:
                for p in params:
                    self.state[p]["momentum_buffer"]._version[0] += 1

    @staticmethod
    def _sgd(xp, p, g, buf, new, group):
        if group["maximize"]:
            g = -g
        wd = group["weight_decay"]
        if wd != 0:
            g = g + wd * p
        mom = group["momentum"]
        if mom != 0:
            buf[...] = xp.where(new, g, mom * buf + (1 - group["dampening"]) * g)
            g = g + mom * buf if group["nesterov"] else buf
        p -= group["lr"] * g

    def step(self, closure=None):
        return self._step_impl(closure)

