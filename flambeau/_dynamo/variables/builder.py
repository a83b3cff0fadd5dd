"""Turning real Python values the frame reads into trackers, with the guards that justify them.

`build(tx, value, source)` is called for every argument, global, closure cell and attribute the
traced code reads. Each kind of value gets the guard that makes the trace valid for later calls:
tensors become graph inputs with a TENSOR_MATCH guard (and may get dynamic sizes), Python scalars
are specialised with an EQUALS_MATCH, containers are unpacked with length/key guards, modules,
functions and classes are guarded by identity, other objects by type (their attributes are guarded
when read). The same object reached twice gives the same tracker (aliasing is kept).
`wrap_constant_like` does the same for values created at trace time (no source, no guards).
"""
from __future__ import annotations

import collections
import types

import numpy as np

from ... import _state
from ..._device import canonical
from ..exc import Unsupported
from ..compiled_state import unwrap_compiled
from .base import VariableTracker, ConstantVariable, is_constant_value, const
from .containers import TupleVariable, ListVariable, DictVariable, RangeVariable, SetVariable
from ...nn.modules.module import Module
from ..._tensor import Size, Tensor
from .objects import ClassVariable, PythonModuleVariable, ObjectVariable
from .torch import (torch_functions, TorchFunctionVariable, special_function, TorchSpecialVariable, GradModeExit,
                    GradModeExitVariable, AutocastVariable, OpNamespaceVariable, operator_target, is_op_namespace,
                    FUNC_TRANSFORMS, FUNC_CALLS, FUNC_MODULE_CALLS, FuncTransformVariable, FuncCallVariable,
                    FuncModuleCallVariable)
from ...fx._aten import OpOverloadPacket
from ...amp.autocast_mode import autocast
from .tensor import NumpyVariable, NumpyNdarrayVariable, numpy_function_name, np_wrappers
from ..guards import Source
from .. import config
from .. import variables as kinds  # the kinds imported after this one, read at call time (see __init__)


def _is_namedtuple(v) -> bool:
    return isinstance(v, tuple) and hasattr(type(v), "_fields")


def wrap_constant_like(v) -> VariableTracker:
    """A tracker for a value computed at trace time (not read from the frame)."""
    if isinstance(v, VariableTracker):
        return v
    if type(v) is range:
        return RangeVariable(v)
    if is_constant_value(v):
        return ConstantVariable(v)
    if type(v) is tuple or type(v) is Size or _is_namedtuple(v):
        items = [wrap_constant_like(x) for x in v]
        return TupleVariable(items, cls=type(v))
    if type(v) is list:
        return ListVariable([wrap_constant_like(x) for x in v])
    if type(v) is dict or type(v) is types.MappingProxyType:      # a signature's `parameters` is a proxy
        return DictVariable({k: wrap_constant_like(x) for k, x in v.items()})
    if isinstance(v, type):
        return ClassVariable(v)
    if isinstance(v, types.ModuleType):
        return PythonModuleVariable(v)
    return _callable_without_source(v)


def _callable_without_source(v):
    if isinstance(v, types.FunctionType) and v in FUNC_TRANSFORMS:
        return FuncTransformVariable(v)
    if isinstance(v, types.FunctionType) and v in FUNC_CALLS:
        return FuncCallVariable(v)
    if isinstance(v, types.FunctionType) and v in FUNC_MODULE_CALLS:
        return FuncModuleCallVariable(v)
    np_name = numpy_function_name(v)
    if np_name is not None:
        return NumpyVariable(v, *np_name)
    if is_op_namespace(v):
        return OpNamespaceVariable(v)
    target = operator_target(v)
    if target is not None:
        return TorchFunctionVariable(target, repr(target))
    if isinstance(v, OpOverloadPacket):
        return TorchFunctionVariable(v, repr(v))       # the overload is picked per call
    kind = special_function(v) if callable(v) else None
    if kind is not None:
        return TorchSpecialVariable(v, kind)
    hit = torch_functions().get(id(v))
    if hit is not None and hit[1] is v:
        return TorchFunctionVariable(v, hit[0])
    if callable(v) and kinds.builtin.is_builtin_callable(v):
        return kinds.builtin.BuiltinVariable(v)
    if kinds.tensor.tensor_method_name(v) is not None:
        return kinds.tensor.TensorMethodVariable(v)
    if isinstance(v, types.FunctionType):
        return kinds.functions.UserFunctionVariable(v)
    raise Unsupported(f"value of type {type(v).__name__} created while tracing")


def build(tx, value, source) -> VariableTracker:
    """The tracker for `value`, read from `source` (None: a trusted library value, no guards)."""
    if source is None:
        return wrap_constant_like(value) if not _needs_source(value) else _build(tx, value, None)
    out = tx.output
    hit = out.built.get(id(value))
    if hit is not None and hit[0] is value and not is_constant_value(value):
        vt = hit[1]
        if vt.source is not None and vt.source.expr != source.expr and _identity_matters(value):
            out.guards.add(source, f"{{S}} is {vt.source.expr}", f"{source.name()} is {vt.source.name()}")
        return vt
    vt = _build(tx, value, source)
    if not is_constant_value(value):
        out.built[id(value)] = (value, vt)
    return vt


def _identity_matters(v) -> bool:
    return isinstance(v, (Tensor, list, dict))


def _needs_source(v) -> bool:
    return isinstance(v, (Tensor, Module, np.ndarray))


def _numpy_array(tx, value: np.ndarray, source) -> NumpyNdarrayVariable:
    """A numpy.ndarray read from the frame: a graph input holding the Tensor that shares its memory
    (the entry passes `from_numpy(array)`), guarded like a tensor after its type. Under
    `with flambeau.device(d)` (d not cpu; the default device is guarded) the graph gets a copy on d instead
    and computes there, as PyTorch's `torch.as_tensor(array)` input does; the guards still read the array
    in place (see OutputGraph.add_graph_input)."""
    if source is None:
        raise Unsupported("a NumPy array reached without a source")
    try:
        t = np_wrappers.from_numpy(value)
    except (TypeError, ValueError) as e:
        raise Unsupported(f"NumPy array of dtype {value.dtype} with strides {value.strides}: {e}")
    g = tx.output.guards
    g.type_match(source, np.ndarray)
    fn = g.const(np_wrappers.from_numpy)
    tensor_source = Source(f"{fn}({source.expr})", source, f"from_numpy({source.name()})", f"{fn}({{B}})")
    dev = _state.tls.default_device
    device = canonical(dev) if dev is not None else None
    if device is not None and device.type == "cpu":
        device = None
    return NumpyNdarrayVariable(tx.output.add_graph_input(t, tensor_source, device=device), source)


def _build(tx, value, source) -> VariableTracker:
    g = tx.output.guards
    if isinstance(value, Tensor):
        if source is None:
            raise Unsupported("a tensor reached without a source")
        if value._wrapper_owns_autograd:        # sparse COO/CSR and 2:4 tensors run eagerly, as in PyTorch
            raise Unsupported(f"torch.compile does not support sparse Tensors ({type(value).__name__} "
                              f"{source.name()}, layout {value.layout})")
        return tx.output.add_graph_input(value, source)
    if type(value) is np.ndarray and config.trace_numpy:
        return _numpy_array(tx, value, source)
    if is_constant_value(value):
        if source is not None:
            if type(value) in (int, float, bool, str, type(None), bytes):
                g.equals_match(source, value)
            else:
                if isinstance(value, np.generic):        # np.float32(1) == np.float64(1): the type decides the dtype
                    g.type_match(source, type(value))
                g.add(source, f"{{S}} == {g.const(value)}", f"EQUALS_MATCH: {source.name()} == {value!r}")
        if type(value) is range:
            return RangeVariable(value)
        return ConstantVariable(value, source)
    if type(value) in (tuple, list) or type(value) is Size or _is_namedtuple(value):
        if source is not None:
            g.len_match(source, type(value), len(value))
        items = [build(tx, x, source.item(i) if source is not None else None) for i, x in enumerate(value)]
        if type(value) is list:
            return ListVariable(items, source)
        return TupleVariable(items, source, cls=type(value))
    if type(value) in (dict, collections.OrderedDict):
        if not all(is_constant_value(k) for k in value):
            raise Unsupported("dict with non-constant keys")
        if source is not None:
            g.dict_keys(source, type(value), list(value))
        return DictVariable({k: build(tx, v, source.item(k) if source is not None else None)
                             for k, v in value.items()}, source, cls=type(value))
    if isinstance(value, Module):
        g.id_match(source, value)
        return kinds.nn_module.NNModuleVariable(value, source)
    orig = unwrap_compiled(value)
    if orig is not value:
        if source is not None:
            g.id_match(source, value)
        return build(tx, orig, None) if not isinstance(orig, Module) else kinds.nn_module.NNModuleVariable(orig, source)
    if isinstance(value, types.MethodType):
        obj_src = source.attr("__self__") if source is not None else None
        obj = build(tx, value.__self__, obj_src) if obj_src is not None else wrap_constant_like(value.__self__)
        if isinstance(value.__func__, types.FunctionType):
            if source is not None:
                g.add(source.attr("__func__"), f"{{S}} is {g.const(value.__func__)}", f"{source.name()}.__func__")
            return kinds.functions.UserMethodVariable(value.__func__, obj, source)
        raise Unsupported(f"bound method {value!r}")
    if isinstance(value, autocast) and source is not None:
        g.id_match(source, value)
        g.add(source, f"({{S}}.device, {{S}}.fast_dtype, {{S}}._enabled, {{S}}._cache_enabled) == "
              f"{g.const((value.device, value.fast_dtype, value._enabled, value._cache_enabled))}",
              f"AUTOCAST_STATE: {source.name()} is {value!r}")
        return AutocastVariable(value, source)
    if isinstance(value, GradModeExit):
        g.type_match(source, GradModeExit)
        g.add(source, f"{{S}}.prev is {value.prev}", f"{source.name()}.prev")
        return GradModeExitVariable(value.prev, source)
    try:
        vt = _callable_without_source(value) if ((callable(value) or is_op_namespace(value))
                                                 and not isinstance(value, type)) else None
    except Unsupported:
        vt = None
    if isinstance(value, types.FunctionType) and vt is not None:
        if source is not None:
            g.id_match(source, value)
        vt.source = source
        return vt
    if vt is not None:
        if source is not None:
            g.id_match(source, value)
        return vt
    if isinstance(value, type):
        if source is not None:
            g.id_match(source, value)
        return ClassVariable(value, source)
    if isinstance(value, types.ModuleType):
        if source is not None:
            g.id_match(source, value)
        return PythonModuleVariable(value, source)
    if type(value) in (set, frozenset) and all(is_constant_value(x) for x in value):
        if source is not None:
            g.type_match(source, type(value))
            g.add(source, f"{{S}} == {g.const(frozenset(value))}", f"{source.name()} == {value!r}")
        return SetVariable([const(x) for x in value], source)
    if source is None:
        raise Unsupported(f"object of type {type(value).__name__} without a source")
    g.type_match(source, type(value))
    return ObjectVariable(value, source)
