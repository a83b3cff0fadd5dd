"""Fake quantization modules for quantization-aware training (PyTorch's
`torch.ao.quantization.fake_quantize`): observe, then round to the quantization grid in float with a
straight-through gradient (`fake_quantize_per_tensor_affine` / `_per_channel_affine`)."""
from __future__ import annotations

import functools

import numpy as np

from ... import _dtype as D
from ... import _ops
from ..._tensor import Tensor
from ...nn.modules.module import Module
from .observer import MovingAverageMinMaxObserver, _PartialWrapper
from .utils import choose_qparams, is_per_channel

F = _ops.EXPORTS


class FakeQuantize(Module):
    """An observer (`activation_post_process`) whose qparams are refreshed on every call while
    `observer_enabled`, and a fake quantization with them while `fake_quant_enabled`."""

    def __init__(self, observer=MovingAverageMinMaxObserver, quant_min=None, quant_max=None, is_dynamic: bool = False,
                 **observer_kwargs):
        super().__init__()
        if quant_min is not None and quant_max is not None and quant_min > quant_max:
            raise AssertionError("quant_min must be less than or equal to quant_max")
        observer_kwargs.update(quant_min=quant_min, quant_max=quant_max, is_dynamic=is_dynamic)
        self.activation_post_process = observer(**observer_kwargs)
        obs = self.activation_post_process
        self.quant_min, self.quant_max = obs.quant_min, obs.quant_max
        self.is_dynamic = is_dynamic
        self.register_buffer("fake_quant_enabled", F["tensor"]([1], dtype=D.uint8))
        self.register_buffer("observer_enabled", F["tensor"]([1], dtype=D.uint8))
        self.register_buffer("scale", F["tensor"]([1.0]))
        self.register_buffer("zero_point", F["tensor"]([0], dtype=D.int32))
        self.dtype, self.qscheme = obs.dtype, obs.qscheme
        self.ch_axis = getattr(obs, "ch_axis", -1)
        self.is_per_channel = is_per_channel(self.qscheme)

    @classmethod
    def with_args(cls, **kwargs) -> _PartialWrapper:
        return _PartialWrapper(functools.partial(cls, **kwargs))

    def enable_fake_quant(self, enabled: bool = True) -> "FakeQuantize":
        self.fake_quant_enabled = F["tensor"]([int(enabled)], dtype=D.uint8)
        return self

    def disable_fake_quant(self) -> "FakeQuantize":
        return self.enable_fake_quant(False)

    def enable_observer(self, enabled: bool = True) -> "FakeQuantize":
        self.observer_enabled = F["tensor"]([int(enabled)], dtype=D.uint8)
        return self

    def disable_observer(self) -> "FakeQuantize":
        return self.enable_observer(False)

    def calculate_qparams(self):
        return self.activation_post_process.calculate_qparams()

    def forward(self, x: Tensor) -> Tensor:
        if int(self.observer_enabled[0]) == 1:
            self.activation_post_process(x.detach())
            scale, zero_point = self.calculate_qparams()
            self.scale, self.zero_point = scale.to(D.float32), zero_point.to(D.int32)
        if int(self.fake_quant_enabled[0]) == 1:
            if self.is_per_channel:
                return F["fake_quantize_per_channel_affine"](x, self.scale, self.zero_point, self.ch_axis,
                                                             self.quant_min, self.quant_max)
            return F["fake_quantize_per_tensor_affine"](x, self.scale, self.zero_point, self.quant_min,
                                                        self.quant_max)
        return x

    def extra_repr(self) -> str:
        return (f"fake_quant_enabled={self.fake_quant_enabled}, observer_enabled={self.observer_enabled}, "
                f"quant_min={self.quant_min}, quant_max={self.quant_max}, dtype={self.dtype}, "
                f"qscheme={self.qscheme}, ch_axis={self.ch_axis}, scale={self.scale}, zero_point={self.zero_point}")


class FusedMovingAvgObsFakeQuantize(FakeQuantize):
    """PyTorch's fused observer + fake quantization (`fused_moving_avg_obs_fake_quant`), computed
    unfused: a moving-average observer (per channel for weights), then the qparams the fused op picks,
    FBGEMM's ChooseQuantizationParams over the running range (sparsity preserved for symmetric
    qschemes), which differ from the observer's own `calculate_qparams` (what `convert_pt2e` uses)."""

    def __init__(self, observer=MovingAverageMinMaxObserver, quant_min: int = 0, quant_max: int = 255,
                 **observer_kwargs):
        super().__init__(observer, quant_min, quant_max, **observer_kwargs)

    def forward(self, x: Tensor) -> Tensor:
        obs = self.activation_post_process
        if int(self.observer_enabled[0]) == 1:
            obs(x.detach())
        if int(self.fake_quant_enabled[0]) != 1:
            return x.clone()
        symmetric = self.qscheme in (D.per_tensor_symmetric, D.per_channel_symmetric)
        lo, hi = np.atleast_1d(obs.min_val.numpy()), np.atleast_1d(obs.max_val.numpy())
        qparams = [choose_qparams(a, b, obs.quant_min, obs.quant_max, symmetric) for a, b in zip(lo, hi)]
        self.scale = F["tensor"]([q[0] for q in qparams], dtype=D.float32)
        self.zero_point = F["tensor"]([q[1] for q in qparams], dtype=D.int32)
        if self.is_per_channel:
            return F["fake_quantize_per_channel_affine"](x, self.scale, self.zero_point, self.ch_axis,
                                                         obs.quant_min, obs.quant_max)
        return F["fake_quantize_per_tensor_affine"](x, self.scale, self.zero_point, obs.quant_min, obs.quant_max)
