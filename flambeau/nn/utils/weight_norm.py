"""Weight normalisation (the hook-based `nn.utils.weight_norm`): w = g * v / ||v||, recomputed before
every forward from the parameters `<name>_g` and `<name>_v`."""
from __future__ import annotations

from ..parameter import Parameter


def _norm_except_dim(v, dim):
    if dim is None or dim == -1 and v.dim() == 0:
        return (v * v).sum().sqrt()
    dim = dim % v.dim()
    dims = [d for d in range(v.dim()) if d != dim]
    return (v * v).sum(dims, keepdim=True).sqrt() if dims else v.abs()


def _weight(g, v, dim):
    return v * (g / _norm_except_dim(v, dim))


class WeightNorm:
    def __init__(self, name: str, dim: int):
        self.name = name
        self.dim = -1 if dim is None else dim

    def compute_weight(self, module):
        return _weight(getattr(module, self.name + "_g"), getattr(module, self.name + "_v"),
                       None if self.dim == -1 else self.dim)

    @staticmethod
    def apply(module, name: str, dim: int):
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, WeightNorm) and hook.name == name:
                raise RuntimeError(f"Cannot register two weight_norm hooks on the same parameter {name}")
        fn = WeightNorm(name, dim)
        weight = getattr(module, name)
        del module._parameters[name]
        g = _norm_except_dim(weight.detach(), None if fn.dim == -1 else fn.dim)
        module.register_parameter(name + "_g", Parameter(g.detach()))
        module.register_parameter(name + "_v", Parameter(weight.detach()))
        setattr(module, name, fn.compute_weight(module))
        module.register_forward_pre_hook(fn)
        return fn

    def remove(self, module):
        weight = self.compute_weight(module)
        delattr(module, self.name)
        del module._parameters[self.name + "_g"]
        del module._parameters[self.name + "_v"]
        setattr(module, self.name, Parameter(weight.detach()))

    def __call__(self, module, inputs):
        setattr(module, self.name, self.compute_weight(module))


def weight_norm(module, name: str = "weight", dim: int = 0):
    WeightNorm.apply(module, name, dim)
    return module


def remove_weight_norm(module, name: str = "weight"):
    for k, hook in list(module._forward_pre_hooks.items()):
        if isinstance(hook, WeightNorm) and hook.name == name:
            hook.remove(module)
            del module._forward_pre_hooks[k]
            return module
    raise ValueError(f"weight_norm of '{name}' not found in {module}")
