"""Batch and instance normalisation: BatchNorm1d/2d/3d (running statistics, cumulative average when
momentum is None, num_batches_tracked) and InstanceNorm1d/2d/3d."""
from __future__ import annotations

from ... import _ops
from ..._backends import array_namespaces, cuda_binary
from ..._compile_lock import is_compiling
from ..._ops._helpers import direct_device
from ...autograd.grad_mode import no_grad
from ... import _dtype as D
from .. import functional as F
from .. import init
from ..parameter import Parameter
from .module import Module

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"]


class _NormBase(Module):
    _version = 2

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 device=None, dtype=None, bias=True):
        super().__init__()
        E = _ops.EXPORTS
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = Parameter(E["empty"](num_features, device=device, dtype=dtype))
            self.bias = Parameter(E["empty"](num_features, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", E["zeros"](num_features, device=device, dtype=dtype))
            self.register_buffer("running_var", E["ones"](num_features, device=device, dtype=dtype))
            self.register_buffer("num_batches_tracked", E["tensor"](0, dtype=D.int64, device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            init.zeros_(self.running_mean)
            init.ones_(self.running_var)
            init.zeros_(self.num_batches_tracked)

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def _check_input_dim(self, input):
        raise NotImplementedError

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"bias={self.affine}, track_running_stats={self.track_running_stats}")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs, assign=False):
        version = local_metadata.get("version", None)
        key = prefix + "num_batches_tracked"
        if (version is None or version < 2) and self.track_running_stats and key not in state_dict:
            state_dict[key] = _ops.EXPORTS["tensor"](0, dtype=D.int64)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs, assign)


class _BatchNorm(_NormBase):
    _dims = ()

    def _check_input_dim(self, input):
        if input.dim() not in self._dims:
            raise ValueError(f"expected {' or '.join(f'{d}D' for d in self._dims)} input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        eaf = 0.0 if self.momentum is None else self.momentum
        # the parameters and buffers read from their stores (`_stored`): Module.__getattr__, the fallback of a
        # failed attribute lookup, costs ~0.9 us a name, six names a call
        # (while a frame is captured, the attributes: capture knows `self.weight` as the module's parameter,
        # which freezing folds as a constant; an entry read from `_parameters` becomes a graph input)
        params, bufs = (None, None) if is_compiling() else (self._parameters, self._buffers)
        rm, rv = _stored(self, bufs, "running_mean"), _stored(self, bufs, "running_var")
        if self.training and self.track_running_stats:
            nbt = _stored(self, bufs, "num_batches_tracked")
            if nbt is not None:
                with no_grad():             # graph capture models the public add_ (is_compiling: True there)
                    if is_compiling() or not _count_batch(nbt):
                        nbt.add_(1)
                if self.momentum is None and rm is not None and rv is not None:
                    return self._cumulative_average(input)
        bn_training = self.training or (rm is None and rv is None)
        use_stats = not self.training or self.track_running_stats
        return F.batch_norm(input, rm if use_stats else None, rv if use_stats else None,
                            _stored(self, params, "weight"), _stored(self, params, "bias"), bn_training, eaf, self.eps)

    def _cumulative_average(self, input):
        """momentum=None in training: the running statistics become the mean of all batches' statistics,
        factor 1/num_batches_tracked. PyTorch reads the factor as a Python float (`float(tensor)`, a graph
        break under compile); here it stays a tensor: batch_norm with momentum 1 writes the batch's mean and
        unbiased variance into fresh buffers, blended into the running ones with the tensor factor, so
        capture keeps the whole forward in one graph."""
        rm, rv = self.running_mean, self.running_var
        E = _ops.EXPORTS
        batch_mean, batch_var = E["zeros_like"](rm), E["ones_like"](rv)
        out = F.batch_norm(input, batch_mean, batch_var, self.weight, self.bias, True, 1.0, self.eps)
        with no_grad():
            factor = 1.0 / self.num_batches_tracked.to(rm.dtype)
            rm.mul_(1 - factor).add_(batch_mean * factor)
            rv.mul_(1 - factor).add_(batch_var * factor)
        return out


def _stored(module, store: dict, name: str):
    """`getattr(module, name)` for a parameter or buffer: its entry in `store` (the module's `_parameters`
    or `_buffers`; None while a frame is captured), else the attribute lookup (a name moved out of the store,
    e.g. by parametrize)."""
    if store is not None and name in store:
        return store[name]
    return getattr(module, name)


def _count_batch(counter) -> bool:
    """num_batches_tracked += 1 as one in-place kernel, grad mode off: for a cuda int64 counter that
    nothing observes (`direct_device`: no dispatch mode, FX hook or tangent), an add kernel writing over
    the counter itself (`cuda_binary`, `into=`) and the version bump an in-place op makes, instead of the
    dispatched add_'s new array, launch and device-to-device copy back (53 of those copies in an eager
    ResNet-50 step). False where it did nothing: the caller then takes the public add_ (modes, fake
    tensors and tracing see that)."""
    dev = direct_device(counter)
    if dev is None or dev.type != "cuda" or counter._dtype is not D.int64:
        return False
    a = counter._data
    if cuda_binary.binary(array_namespaces["cuda"], a, 1, "add", into=a) is None:
        return False
    counter._version[0] += 1
    return True


class BatchNorm1d(_BatchNorm):
    _dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    _dims = (4,)


class BatchNorm3d(_BatchNorm):
    _dims = (5,)


class _InstanceNorm(_NormBase):
    _ndim = 2

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False, track_running_stats=False,
                 device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)

    def forward(self, input):
        nd = self._ndim
        if input.dim() not in (nd + 1, nd + 2):
            raise ValueError(f"expected {nd + 1}D or {nd + 2}D input (got {input.dim()}D input)")
        unbatched = input.dim() == nd + 1
        if unbatched:
            input = input.unsqueeze(0)
        ch = input.size(1)
        if ch != self.num_features and self.affine:
            raise ValueError(f"expected input's size at dim=1 to match num_features ({self.num_features}), "
                             f"but got: {ch}.")
        out = F.instance_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                              self.training or not self.track_running_stats, self.momentum if self.momentum is not None
                              else 0.0, self.eps)
        return out.squeeze(0) if unbatched else out


class InstanceNorm1d(_InstanceNorm):
    _ndim = 1


class InstanceNorm2d(_InstanceNorm):
    _ndim = 2


class InstanceNorm3d(_InstanceNorm):
    _ndim = 3
