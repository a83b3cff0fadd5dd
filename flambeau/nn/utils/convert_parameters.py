"""parameters_to_vector and vector_to_parameters."""
from __future__ import annotations

from ..._tensor import Tensor
from ..._ops.shape import cat


def parameters_to_vector(parameters):
    dev = None
    vec = []
    for p in parameters:
        if dev is not None and p.device != dev:
            raise TypeError("Found two parameters on different devices, this is currently not supported.")
        dev = p.device
        vec.append(p.view(-1))
    return cat(vec)


def vector_to_parameters(vec, parameters) -> None:
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected torch.Tensor, but got: {type(vec).__name__}")
    ptr = 0
    for p in parameters:
        n = p.numel()
        p.data = vec[ptr:ptr + n].view_as(p).data
        ptr += n
