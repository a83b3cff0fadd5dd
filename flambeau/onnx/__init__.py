"""torch.onnx: `export(model, args, f, input_names=, output_names=, dynamic_axes=, opset_version=)` writes an
ONNX model, built on `flambeau.export` (both the classic arguments and `dynamo=True` take this path).

The model is exported (`flambeau.export.export`, under no_grad; call `model.eval()` first for dropout
and batch norm), its graph converted operator by operator (`_graph.py`), the model checked with
`onnx.checker` and written to `f` (a path or binary file). `dynamic_axes` ({input name: {dim: name}}
or {input name: [dims]}) makes those dims dynamic (one `Dim` per name, shared across inputs) and
names them in the model. `onnx` is an optional dependency: without it export raises ImportError.
Returns an `ONNXProgram`-like object with `.model_proto`. `is_in_onnx_export()` is True while exporting.

Layer 14 (export) of tests/test_layers.py's order: built on flambeau.export.
"""
from __future__ import annotations

import io

from .._tensor import Tensor
from ..fx._symbolic_shapes import SymInt
from ..autograd.grad_mode import no_grad
from ..export import Dim, export as _export
from ..export.dynamic_shapes import input_names as forward_names
from ..export.graph_signature import InputKind, OutputKind
from ._graph import Builder, Converter, OnnxExporterError, convert_call, value_info

__all__ = ["export", "dynamo_export", "is_in_onnx_export", "OnnxExporterError", "ONNXProgram"]

DEFAULT_OPSET = 18
MIN_OPSET = 17                     # LayerNormalization
_exporting = [0]


class ONNXProgram:
    """What `export` returns: the model (`model_proto`), savable with `save(path)`."""

    def __init__(self, model_proto, exported_program):
        self.model_proto = model_proto
        self.exported_program = exported_program

    def save(self, destination) -> None:
        data = self.model_proto.SerializeToString()
        if hasattr(destination, "write"):
            destination.write(data)
        else:
            with open(destination, "wb") as fh:
                fh.write(data)


def is_in_onnx_export() -> bool:
    """Whether an ONNX export is running (model code may pick an export-friendly path)."""
    return _exporting[0] > 0


def _import_onnx():
    try:
        import onnx  # deferred: an optional dependency
    except ImportError as e:
        raise ImportError("flambeau.onnx.export needs the `onnx` package (pip install onnx)") from e
    return onnx


def _dynamic_shapes(dynamic_axes, names: list, args: tuple):
    """(export's dynamic_shapes, per input {dim: Dim}) from ONNX's dynamic_axes."""
    if not dynamic_axes:
        return None, []
    dims, spec = {}, []
    for name, a in zip(names, args):
        axes = dynamic_axes.get(name)
        if axes is None or not isinstance(a, Tensor):
            spec.append(None)
            continue
        axes = {int(d): f"{name}_dynamic_axes_{d}" for d in axes} if isinstance(axes, (list, tuple)) \
            else {int(d): str(n) for d, n in axes.items()}
        spec.append({d: dims.setdefault(n, Dim(n)) for d, n in axes.items()})
    return tuple(spec), spec


def export(model, args=(), f=None, *, kwargs=None, input_names=None, output_names=None, opset_version=None,
           dynamic_axes=None, dynamo: bool = False, dynamic_shapes=None, export_params: bool = True,
           do_constant_folding: bool = True, verbose=None, training=None, external_data: bool = False,
           **unused) -> ONNXProgram:
    """Export `model(*args)` to ONNX (see module docstring); writes to `f` when given."""
    onnx = _import_onnx()
    opset = DEFAULT_OPSET if opset_version is None else int(opset_version)
    if opset < MIN_OPSET:
        raise OnnxExporterError(f"flambeau.onnx.export: opset_version {opset} is not supported (minimum {MIN_OPSET})")
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    _exporting[0] += 1
    try:
        names = forward_names(model.forward, args, dict(kwargs or {}))
        in_names = list(input_names or [])
        in_names += [n for n in names[len(in_names):]]
        spec, dims = _dynamic_shapes(dynamic_axes, in_names, args) if dynamic_shapes is None else (dynamic_shapes, [])
        with no_grad():
            ep = _export(model, args, kwargs, dynamic_shapes=spec)
        proto = _to_model(onnx, ep, in_names, output_names, opset, dims)
    finally:
        _exporting[0] -= 1
    onnx.checker.check_model(proto)
    program = ONNXProgram(proto, ep)
    if f is not None:
        program.save(f)
    return program


def _to_model(onnx, ep, in_names: list, output_names, opset: int, dims: list):
    b = Builder(onnx, opset)
    c = Converter(b)
    sig = ep.graph_signature
    updated = [s.target for s in sig.output_specs if s.kind is not OutputKind.USER_OUTPUT]
    if updated:
        raise OnnxExporterError(f"flambeau.onnx.export: the program updates {', '.join(updated)} in place (a model in "
                                "training mode? call model.eval() first); ONNX graphs have no state")
    dim_names = {}
    phs = ep.graph.find_nodes(op="placeholder")
    user_i = 0
    inputs = []
    for ph, spec in zip(phs, sig.input_specs):
        if spec.kind is InputKind.USER_INPUT:
            name = in_names[user_i] if user_i < len(in_names) else ph.name
            axes = dims[user_i] if user_i < len(dims) and dims[user_i] else {}
            user_i += 1
            val = ph.meta["val"]
            for d, s in enumerate(val.shape):
                if isinstance(s, SymInt) and s.expr.is_Symbol and d in axes:
                    dim_names.setdefault(s.expr, getattr(axes[d], "__name__", str(s.expr)))
            inputs.append(value_info(onnx, name, val, dim_names))
            c.env[ph.name] = name
        elif ph.users:
            t = ep.state_dict.get(spec.target) if spec.target in ep.state_dict else ep.constants[spec.target]
            c.env[ph.name] = spec.target
            b.inits.append(onnx.numpy_helper.from_array(t.detach().numpy(), spec.target))
    for node in ep.graph.nodes:
        if node.op == "call_function":
            c.env[node.name] = convert_call(c, node)
        elif node.op == "get_attr":          # a cond branch: read by the If rule
            c.env[node.name] = getattr(ep.graph_module, node.target)
    out_node = ep.graph.output_node()
    outs = []
    vals = list(out_node.args[0])
    user = [(v, s) for v, s in zip(vals, sig.output_specs) if s.kind is OutputKind.USER_OUTPUT]
    for k, (v, _) in enumerate(user):
        if not hasattr(v, "op") or not isinstance(v.meta.get("val"), Tensor):
            raise OnnxExporterError("flambeau.onnx.export: only tensor outputs can be exported")
        name = output_names[k] if output_names and k < len(output_names) else f"output_{k}"
        b.nodes.append(onnx.helper.make_node("Identity", [c.env[v.name]], [name], name=b.fresh("n_out")))
        outs.append(value_info(onnx, name, v.meta["val"], dim_names))
    graph = onnx.helper.make_graph(b.nodes, "main_graph", inputs, outs, initializer=b.inits)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)],
                                   producer_name="flambeau")
    return model


def dynamo_export(model, *args, **kwargs) -> ONNXProgram:
    """`torch.onnx.dynamo_export(model, *args)`: the same exporter."""
    return export(model, args)
