"""`flambeau.func.functional_call` and `stack_module_state`: a module called with parameters and
buffers given as tensors (PyTorch's semantics: tied weights follow, `strict` checks the keys), and
the weights of several identical modules stacked along a new leading dimension for `vmap`."""
from __future__ import annotations

from typing import Any

from .._tensor import Tensor
from .._ops.shape import stack


def _owner(module, name: str):
    parts = name.split(".")
    for p in parts[:-1]:
        module = getattr(module, p)
    return module, parts[-1]


class _Swapped:
    """Swap named tensors of a module for the given ones while the block runs."""

    def __init__(self, module, tensors: dict):
        self.module, self.tensors, self.saved = module, tensors, []

    def __enter__(self):
        for name, value in self.tensors.items():
            owner, attr = _owner(self.module, name)
            for store in ("_parameters", "_buffers"):
                d = owner.__dict__.get(store)
                if d is not None and attr in d:
                    self.saved.append((d, attr, d[attr]))
                    d[attr] = value
                    break
            else:
                self.saved.append((owner.__dict__, attr, owner.__dict__.get(attr, _MISSING)))
                owner.__dict__[attr] = value
        return self

    def __exit__(self, *exc):
        for d, attr, old in reversed(self.saved):
            if old is _MISSING:
                d.pop(attr, None)
            else:
                d[attr] = old
        return False


_MISSING = object()


def functional_call(module, parameter_and_buffer_dicts, args: Any = None, kwargs: dict | None = None, *,
                    tie_weights: bool = True, strict: bool = False):
    """Call `module(*args, **kwargs)` with its parameters and buffers replaced by the given tensors."""
    if isinstance(parameter_and_buffer_dicts, dict):
        given = dict(parameter_and_buffer_dicts)
    elif isinstance(parameter_and_buffer_dicts, (list, tuple)):
        if not all(isinstance(d, dict) for d in parameter_and_buffer_dicts):
            raise ValueError("Expected all elements of parameter_and_buffer_dicts to be dictionaries")
        counts: dict = {}
        for d in parameter_and_buffer_dicts:
            for k in d:
                counts[k] = counts.get(k, 0) + 1
        repeated = [k for k, n in counts.items() if n > 1]
        if repeated:
            raise ValueError(f"{repeated} appeared in multiple dictionaries; behavior of functional call is ambiguous")
        given = {k: v for d in parameter_and_buffer_dicts for k, v in d.items()}
    else:
        raise ValueError("Expected parameter_and_buffer_dicts to be a dict, or a list/tuple of dicts, but got "
                         f"{type(parameter_and_buffer_dicts)}")
    named = list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False))
    if strict:
        known = {n for n, _ in named}
        missing = sorted(known - set(given))
        unexpected = sorted(set(given) - known)
        if missing or unexpected:
            parts = []
            if unexpected:
                parts.append("Unexpected key(s): " + ", ".join(repr(k) for k in unexpected) + ".")
            if missing:
                parts.append("Missing key(s): " + ", ".join(repr(k) for k in missing) + ".")
            raise RuntimeError(f"Error(s) in reparametrizing for {type(module).__name__}:\n\t" + "\n\t".join(parts))
    if tie_weights:
        by_tensor: dict = {}
        for n, t in named:
            by_tensor.setdefault(id(t), []).append(n)
        for names in by_tensor.values():
            supplied = [n for n in names if n in given]
            if not supplied:
                continue
            first = given[supplied[0]]
            for n in supplied[1:]:
                if given[n] is not first:
                    raise ValueError(f"functional_call got multiple values for keys {supplied}, which are tied. "
                                     "Consider using tie_weights=False")
            for n in names:
                given.setdefault(n, first)
    if args is None:
        args = ()
    elif not isinstance(args, tuple):
        args = (args,)
    with _Swapped(module, given):
        return module(*args, **(kwargs or {}))


def _stacked_leaf(tensors, name: str) -> Tensor:
    rg = [t.requires_grad for t in tensors]
    if any(rg) and not all(rg):
        raise RuntimeError(f"Expected {name} from each model to have the same .requires_grad")
    out = stack([t.detach() for t in tensors])
    if all(rg):
        out = out.requires_grad_()
    return out


def stack_module_state(models) -> tuple[dict, dict]:
    """`(params, buffers)`: each model's parameters and buffers stacked along a new dimension 0."""
    models = list(models)
    if len(models) == 0:
        raise RuntimeError("stack_module_state: Expected at least one model, got 0.")
    if not (all(m.training for m in models) or all(not m.training for m in models)):
        raise RuntimeError("stack_module_state: Expected all models to have the same training/eval mode.")
    if not all(type(m) is type(models[0]) for m in models):
        raise RuntimeError("stack_module_state: Expected all models to be of the same class.")
    all_params = [dict(m.named_parameters()) for m in models]
    params = {k: _stacked_leaf([p[k] for p in all_params], k) for k in all_params[0]}
    all_buffers = [dict(m.named_buffers()) for m in models]
    buffers = {k: _stacked_leaf([b[k] for b in all_buffers], k) for k in all_buffers[0]}
    return params, buffers
