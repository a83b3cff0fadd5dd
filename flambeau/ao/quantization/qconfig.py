"""`QConfig`: how a module's activations and weights are observed (PyTorch's
`torch.ao.quantization.qconfig`), with the default dynamic configuration."""
from __future__ import annotations

from typing import NamedTuple

from ... import _dtype as D
from .observer import MinMaxObserver, PlaceholderObserver, PerChannelMinMaxObserver


class QConfig(NamedTuple):
    """Observer constructors (classes or `with_args` partials) for activations and weights."""
    activation: object
    weight: object


default_dynamic_qconfig = QConfig(
    activation=PlaceholderObserver.with_args(dtype=D.quint8, quant_min=0, quant_max=255, is_dynamic=True),
    weight=MinMaxObserver.with_args(dtype=D.qint8, qscheme=D.per_tensor_symmetric))
per_channel_dynamic_qconfig = QConfig(
    activation=default_dynamic_qconfig.activation,
    weight=PerChannelMinMaxObserver.with_args(dtype=D.qint8, qscheme=D.per_channel_symmetric))
