"""RMSprop (centered, momentum), Adagrad (lr decay, initial accumulator) and Adadelta."""
from __future__ import annotations

from .optimizer import Optimizer, _scalar_tensor, per_tensor
from .._ops.creation import zeros_like, full_like

__all__ = ["RMSprop", "Adagrad", "Adadelta"]


class RMSprop(Optimizer):
    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False,
                 capturable=False, foreach=None, maximize=False, differentiable=False):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= momentum:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= alpha:
            raise ValueError(f"Invalid alpha value: {alpha}")
        super().__init__(params, dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered,
                                      weight_decay=weight_decay, capturable=capturable, foreach=foreach,
                                      maximize=maximize, differentiable=differentiable))

    def _init_state(self, p, group):
        st = {"step": _scalar_tensor(0.0), "square_avg": zeros_like(p)}
        if group["momentum"] > 0:
            st["momentum_buffer"] = zeros_like(p)
        if group["centered"]:
            st["grad_avg"] = zeros_like(p)
        return st

    def _update(self, xp, p, g, s, step, group, ex):
        wd, alpha = group["weight_decay"], group["alpha"]
        if wd != 0:
            g = g + wd * p
        sq = s["square_avg"]
        sq *= alpha
        sq += (1 - alpha) * g * g
        if group["centered"]:
            ga = s["grad_avg"]
            ga += (g - ga) * (1 - alpha)
            avg = xp.sqrt(sq - ga * ga) + group["eps"]
        else:
            avg = xp.sqrt(sq) + group["eps"]
        if group["momentum"] > 0:
            buf = s["momentum_buffer"]
            buf *= group["momentum"]
            buf += g / avg
            p -= group["lr"] * buf
        else:
            p -= group["lr"] * g / avg

    def step(self, closure=None):
        return self._step_impl(closure)


class Adagrad(Optimizer):
    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10,
                 foreach=None, *, maximize=False, differentiable=False, fused=None):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= lr_decay:
            raise ValueError(f"Invalid lr_decay value: {lr_decay}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= initial_accumulator_value:
            raise ValueError(f"Invalid initial_accumulator_value value: {initial_accumulator_value}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value, foreach=foreach,
                                      maximize=maximize, differentiable=differentiable, fused=fused))
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p].update(self._init_state(p, group))

    def _init_state(self, p, group):
        return {"step": _scalar_tensor(0.0), "sum": full_like(p, group["initial_accumulator_value"])}

    def _update(self, xp, p, g, s, step, group, ex):
        wd = group["weight_decay"]
        if wd != 0:
            g = g + wd * p
        lr, decay = group["lr"], group["lr_decay"]
        clr = ex(per_tensor(lambda t: lr / (1 + (t - 1) * decay), step))
        acc = s["sum"]
        acc += g * g
        p -= clr * g / (xp.sqrt(acc) + group["eps"])

    def step(self, closure=None):
        return self._step_impl(closure)


class Adadelta(Optimizer):
    """Zeiler's ADADELTA: steps scaled by the ratio of running RMS of updates and of gradients."""

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0, foreach=None, *, capturable=False,
                 maximize=False, differentiable=False):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize,
                                      capturable=capturable, foreach=foreach, differentiable=differentiable))

    def _init_state(self, p, group):
        return {"step": _scalar_tensor(0.0), "square_avg": zeros_like(p), "acc_delta": zeros_like(p)}

    def _update(self, xp, p, g, s, step, group, ex):
        wd, rho, eps = group["weight_decay"], group["rho"], group["eps"]
        if wd != 0:
            g = g + wd * p
        sq, acc = s["square_avg"], s["acc_delta"]
        sq *= rho
        sq += (1 - rho) * g * g
        delta = xp.sqrt(acc + eps) / xp.sqrt(sq + eps) * g
        acc *= rho
        acc += (1 - rho) * delta * delta
        p -= group["lr"] * delta

    def step(self, closure=None):
        return self._step_impl(closure)
