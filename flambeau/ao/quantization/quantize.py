"""Eager-mode dynamic quantization (PyTorch's `torch.ao.quantization.quantize_dynamic`): swap the
chosen float modules (nn.Linear, nn.LSTM, nn.GRU, nn.RNNCell, nn.LSTMCell, nn.GRUCell) for their
dynamically quantized versions (`flambeau.ao.nn.quantized.dynamic`)."""
from __future__ import annotations

import copy

from ... import _dtype as D
from ...nn.modules.module import Module
from ...nn.modules.linear import Linear
from ...nn.modules.rnn import GRU, LSTM, GRUCell, LSTMCell, RNNCell
from ..nn.quantized import dynamic as nnqd
from .qconfig import QConfig, default_dynamic_qconfig

DEFAULT_DYNAMIC_QUANT_MODULE_MAPPINGS = {Linear: nnqd.Linear, LSTM: nnqd.LSTM, GRU: nnqd.GRU, RNNCell: nnqd.RNNCell,
                                         LSTMCell: nnqd.LSTMCell, GRUCell: nnqd.GRUCell}


def get_default_dynamic_quant_module_mappings() -> dict:
    return dict(DEFAULT_DYNAMIC_QUANT_MODULE_MAPPINGS)


def _qconfig_spec(qconfig_spec, dtype) -> dict:
    if dtype is not D.qint8:
        raise NotImplementedError(f"quantize_dynamic: dtype {dtype} is not supported yet (qint8 is)")
    if qconfig_spec is None:        # PyTorch's default for qint8
        return {m: default_dynamic_qconfig for m in (Linear, LSTM, GRU, LSTMCell, RNNCell, GRUCell)}
    if isinstance(qconfig_spec, (set, frozenset, list, tuple)):
        return {k: default_dynamic_qconfig for k in qconfig_spec}
    return dict(qconfig_spec)


def _qconfig_for(name: str, mod: Module, spec: dict, inherited):
    """A module's qconfig: its name's entry, else its type's, else its parent's."""
    if name in spec:
        return spec[name]
    return spec.get(type(mod), inherited)


def _swap(module: Module, spec: dict, mapping: dict, prefix: str, inherited) -> None:
    for name, child in list(module.named_children()):
        full = prefix + name
        qconfig = _qconfig_for(full, child, spec, inherited)
        target = mapping.get(type(child))
        if target is not None and isinstance(qconfig, QConfig):
            setattr(module, name, target.from_float(child, weight_observer=qconfig.weight()))
        else:
            _swap(child, spec, mapping, full + ".", qconfig)


def quantize_dynamic(model: Module, qconfig_spec=None, dtype=D.qint8, mapping=None, inplace: bool = False) -> Module:
    """Replace the modules named or typed in `qconfig_spec` (default: every Linear, LSTM, GRU and
    recurrent cell, PyTorch's qint8 default) by dynamically quantized ones with int8 weights; returns
    the model (a copy unless `inplace`)."""
    spec = _qconfig_spec(qconfig_spec, dtype)
    mapping = get_default_dynamic_quant_module_mappings() if mapping is None else mapping
    if not inplace:
        model = copy.deepcopy(model)
    _swap(model, spec, mapping, "", spec.get(type(model)) if type(model) in mapping else None)
    return model
