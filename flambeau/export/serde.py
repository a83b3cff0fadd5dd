"""`flambeau.export.save` / `load`: an ExportedProgram as a zip of versioned JSON and safetensors.

The archive holds exactly these entries (anything else is refused on load):

    archive_format                  the text `flambeau-export`
    program.json                    {"schema_version": [major, minor], graph, signature, ranges, call spec}
    weights.safetensors             the state_dict (parameters and persistent buffers)
    constants.safetensors           constants (lifted tensors, non-persistent buffers)

No pickle and no `eval`: an operator is named by its qualified name and looked up in the operator
table (`flambeau._ops.OPS`), the few Python functions a graph may call (getitem, size arithmetic,
`sym_size`, `cond`) come from a fixed table, size expressions are a small JSON tree, pytree specs
may use only tuple/list/dict. Loading checks the schema's major version (a newer major version is
refused, naming both), entry names (no paths, no duplicates, no unknown names), declared sizes,
CRCs (a truncated or altered archive fails) and that each node refers only to earlier nodes.
"""
from __future__ import annotations

import io
import json
import math
import operator
import zipfile

from .. import serialization
from .._strict_zip import read_strict_zip
from .._dtype import BY_NAME as DTYPES_BY_NAME
from .._device import device as Device
from .._ops import OPS, Op
from .._subclasses.fake_tensor import FakeTensorMode
from .._backends import MetaArray, contiguous_strides
from .._device import META
from .._tensor import Tensor, channels_last, channels_last_3d, contiguous_format, preserve_format
from ..fx._symbolic_shapes import ShapeEnv, SymInt, _sp, sym_size
from ..fx.graph import Graph
from ..fx.graph_module import GraphModule
from ..nn.modules.module import Module
from ..nn.parameter import Parameter
from ..utils import _pytree as pytree
from .._higher_order_ops._cond import cond_op
from .._higher_order_ops._map import map_op
from .dynamic_shapes import INT_OO, ValueRanges
from .exported_program import ExportedProgram, ModuleCallSignature
from .graph_signature import (ConstantArgument, ExportGraphSignature, InputKind, InputSpec, OutputKind, OutputSpec,
                              SymIntArgument, TensorArgument)

__all__ = ["save", "load", "SerializeError", "SCHEMA_VERSION"]

# 1.1 adds "dim_names" (the Dim of each size symbol), "state_aliases" (tied weights), "module_fqns" and
# the nodes' "nn_module_stack" (the module tree and calls unflatten rebuilds); 1.2 adds "preserved" (the
# signatures of export's preserve_module_call_signature calls)
SCHEMA_VERSION = (1, 2)
ARCHIVE_FORMAT = b"flambeau-export"
ENTRIES = ("archive_format", "program.json", "weights.safetensors", "constants.safetensors")
MAX_ENTRY_BYTES = 1 << 36               # refuse archives that claim more than 64 GiB in one entry
_FUNCTIONS = {"operator.getitem": operator.getitem, "operator.add": operator.add, "operator.mul": operator.mul,
              "operator.sub": operator.sub, "operator.floordiv": operator.floordiv, "operator.mod": operator.mod,
              "operator.pow": operator.pow, "sym_size": sym_size, "higher_order.cond": cond_op,
              "higher_order.map": map_op}
_FUNCTION_NAMES = {id(v): k for k, v in _FUNCTIONS.items()}
_MEMORY_FORMATS = {f.name: f for f in (contiguous_format, channels_last, channels_last_3d, preserve_format)}
_TREE_TYPES = ("builtins.tuple", "builtins.list", "builtins.dict", "collections.OrderedDict")


class SerializeError(RuntimeError):
    """A program that cannot be saved, or a file that is not a loadable exported program."""


# ---- size expressions ---------------------------------------------------------------------------------
def _expr_to_json(e):
    sp = _sp()
    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        return {"sym": e.name}
    if e.is_Add:
        return {"add": [_expr_to_json(a) for a in e.args]}
    if e.is_Mul:
        return {"mul": [_expr_to_json(a) for a in e.args]}
    if isinstance(e, sp.floor):
        num, den = sp.fraction(sp.together(e.args[0]))
        return {"floordiv": [_expr_to_json(num), _expr_to_json(den)]}
    if isinstance(e, sp.Mod):
        return {"mod": [_expr_to_json(a) for a in e.args]}
    if e.is_Pow and e.args[1].is_Integer and e.args[1] > 0:
        return {"pow": [_expr_to_json(e.args[0]), int(e.args[1])]}
    raise SerializeError(f"flambeau.export.save: cannot serialize the size expression {e}")


def _expr_from_json(j, symbols: dict):
    sp = _sp()
    if isinstance(j, bool) or not isinstance(j, (int, dict)):
        raise SerializeError(f"flambeau.export.load: bad size expression {j!r}")
    if isinstance(j, int):
        return sp.Integer(j)
    if len(j) != 1:
        raise SerializeError(f"flambeau.export.load: bad size expression {j!r}")
    (k, v), = j.items()
    if k == "sym":
        if v not in symbols:
            raise SerializeError(f"flambeau.export.load: unknown size symbol {v!r}")
        return symbols[v]
    args = [_expr_from_json(a, symbols) for a in v] if isinstance(v, list) else None
    if k == "add" and args:
        return sp.Add(*args)
    if k == "mul" and args:
        return sp.Mul(*args)
    if k == "floordiv" and args and len(args) == 2:
        return sp.floor(args[0] / args[1])
    if k == "mod" and args and len(args) == 2:
        return sp.Mod(*args)
    if k == "pow" and args and len(args) == 2:
        return sp.Pow(*args)
    raise SerializeError(f"flambeau.export.load: bad size expression {j!r}")


# ---- values -------------------------------------------------------------------------------------------
def _size_to_json(s):
    return _expr_to_json(s.expr) if isinstance(s, SymInt) else int(s)


def _val_to_json(v):
    if isinstance(v, Tensor):
        return {"tensor": {"shape": [_size_to_json(s) for s in v.shape], "dtype": v.dtype.name,
                           "device": str(v.device)}}
    if isinstance(v, SymInt):
        return {"symint": _expr_to_json(v.expr)}
    if isinstance(v, (tuple, list)):
        return {"seq": [_val_to_json(x) for x in v]}
    return None


def _arg_to_json(a, where: str):
    if hasattr(a, "op") and hasattr(a, "users"):
        return {"node": a.name}
    if a is None or isinstance(a, (bool, str)):
        return a
    if isinstance(a, int):
        return a
    if isinstance(a, float):
        return a if math.isfinite(a) else {"float": repr(a)}
    if isinstance(a, tuple):
        return {"tuple": [_arg_to_json(x, where) for x in a]}
    if isinstance(a, list):
        return [_arg_to_json(x, where) for x in a]
    if isinstance(a, dict) and all(isinstance(k, str) for k in a):
        return {"dict": {k: _arg_to_json(v, where) for k, v in a.items()}}
    if isinstance(a, slice):
        return {"slice": [_arg_to_json(x, where) for x in (a.start, a.stop, a.step)]}
    if getattr(a, "name", None) in DTYPES_BY_NAME and DTYPES_BY_NAME[a.name] is a:
        return {"dtype": a.name}
    if isinstance(a, Device):
        return {"device": str(a)}
    if isinstance(a, complex):
        return {"complex": [a.real, a.imag]}
    if _MEMORY_FORMATS.get(getattr(a, "name", None)) is a:
        return {"memory_format": a.name}
    raise SerializeError(f"flambeau.export.save: cannot serialize the argument {a!r} ({type(a).__name__}) of {where}")


def _arg_from_json(j, env: dict):
    if j is None or isinstance(j, (bool, int, float, str)):
        return j
    if isinstance(j, list):
        return [_arg_from_json(x, env) for x in j]
    if not isinstance(j, dict) or len(j) != 1:
        raise SerializeError(f"flambeau.export.load: bad argument {j!r}")
    (k, v), = j.items()
    if k == "node":
        if v not in env:
            raise SerializeError(f"flambeau.export.load: a node refers to {v!r}, which is not an earlier node")
        return env[v]
    if k == "tuple":
        return tuple(_arg_from_json(x, env) for x in v)
    if k == "dict":
        return {str(a): _arg_from_json(b, env) for a, b in v.items()}
    if k == "slice":
        return slice(*(_arg_from_json(x, env) for x in v))
    if k == "float":
        if v not in ("inf", "-inf", "nan"):
            raise SerializeError(f"flambeau.export.load: bad float {v!r}")
        return float(v)
    if k == "dtype":
        if v not in DTYPES_BY_NAME:
            raise SerializeError(f"flambeau.export.load: unknown dtype {v!r}")
        return DTYPES_BY_NAME[v]
    if k == "device":
        return Device(v)
    if k == "complex":
        return complex(*v)
    if k == "memory_format" and v in _MEMORY_FORMATS:
        return _MEMORY_FORMATS[v]
    raise SerializeError(f"flambeau.export.load: bad argument {j!r}")


# ---- graphs -------------------------------------------------------------------------------------------
def _target_to_json(node) -> str:
    t = node.target
    if node.op in ("placeholder", "get_attr", "output"):
        return t
    if isinstance(t, Op) and OPS.get(t.name) is t:
        return "aten." + t.name
    name = _FUNCTION_NAMES.get(id(t))
    if name is None:
        raise SerializeError(f"flambeau.export.save: node {node.name} calls {t!r}, which has no serialized form "
                             "(only operators of flambeau.ops.aten and size arithmetic can be saved)")
    return name


def _target_from_json(op: str, t: str):
    if op in ("placeholder", "get_attr", "output"):
        return t
    if t.startswith("aten."):
        hit = OPS.get(t[len("aten."):])
        if hit is None:
            raise SerializeError(f"flambeau.export.load: unknown operator {t!r}")
        return hit
    if t not in _FUNCTIONS:
        raise SerializeError(f"flambeau.export.load: unknown function {t!r}")
    return _FUNCTIONS[t]


def _graph_to_json(gm: GraphModule) -> dict:
    nodes, subgraphs = [], {}
    for n in gm.graph.nodes:
        if n.op == "call_module":
            raise SerializeError(f"flambeau.export.save: call_module node {n.name} cannot be saved")
        if n.op == "get_attr":
            sub = getattr(gm, n.target)
            if not isinstance(sub, GraphModule):
                raise SerializeError(f"flambeau.export.save: get_attr {n.target} is not a subgraph")
            subgraphs[n.target] = _graph_to_json(sub)
        nodes.append({"name": n.name, "op": n.op, "target": _target_to_json(n),
                      "args": _arg_to_json(tuple(n.args), n.name)["tuple"],
                      "kwargs": _arg_to_json(dict(n.kwargs), n.name)["dict"],
                      "val": _val_to_json(n.meta.get("val"))})
        if n.meta.get("nn_module_stack"):
            nodes[-1]["nn_module_stack"] = [[k, fqn, cls] for k, (fqn, cls) in n.meta["nn_module_stack"].items()]
    return {"nodes": nodes, "subgraphs": subgraphs}


def _module_stack(j) -> dict:
    """A node's module calls ([[key, fqn, type name], ...]: strings only) as node.meta holds them."""
    if not (isinstance(j, list) and all(isinstance(e, list) and len(e) == 3 and all(isinstance(x, str) for x in e)
                                        for e in j)):
        raise SerializeError(f"flambeau.export.load: bad nn_module_stack {str(j)[:80]}")
    return {k: (fqn, cls) for k, fqn, cls in j}


class _Loader:
    """Rebuilds graphs, their fake values and the program's symbols from JSON."""

    def __init__(self, symbols: dict):
        self.env = ShapeEnv(duck_shape=False)
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=self.env)
        sp = _sp()
        self.symbols = {}
        for name, hint in symbols.items():
            s = sp.Symbol(str(name), integer=True, positive=True)
            self.symbols[name] = s
            self.env.var_to_val[s] = int(hint)

    def size(self, j):
        e = _expr_from_json(j, self.symbols)
        return int(e) if e.is_Integer else SymInt(e, self.env)

    def val(self, j):
        if j is None:
            return None
        (k, v), = j.items()
        if k == "tensor":
            if v["dtype"] not in DTYPES_BY_NAME:
                raise SerializeError(f"flambeau.export.load: unknown dtype {v['dtype']!r}")
            dt = DTYPES_BY_NAME[v["dtype"]]
            shape = tuple(self.size(s) for s in v["shape"])
            f = Tensor._make(MetaArray(shape, dt.np, contiguous_strides(shape), 0), META, dt)
            self.fake_mode._register(f, Device(v["device"]))
            return f
        if k == "symint":
            return self.size(v)
        if k == "seq":
            return tuple(self.val(x) for x in v)
        raise SerializeError(f"flambeau.export.load: bad value {j!r}")

    def graph(self, j: dict) -> GraphModule:
        g = Graph()
        root = Module()
        env: dict = {}
        for name, sub in j["subgraphs"].items():
            if not isinstance(name, str) or not name.isidentifier():
                raise SerializeError(f"flambeau.export.load: bad subgraph name {name!r}")
            setattr(root, name, self.graph(sub))
        for nj in j["nodes"]:
            op = nj["op"]
            if op not in ("placeholder", "call_function", "get_attr", "output"):
                raise SerializeError(f"flambeau.export.load: bad node kind {op!r}")
            target = _target_from_json(op, nj["target"])
            args = tuple(_arg_from_json(a, env) for a in nj["args"])
            kwargs = {str(k): _arg_from_json(v, env) for k, v in nj["kwargs"].items()}
            if op == "placeholder":
                node = g.placeholder(target)
            elif op == "get_attr":
                if target not in j["subgraphs"]:
                    raise SerializeError(f"flambeau.export.load: get_attr of unknown subgraph {target!r}")
                node = g.get_attr(target)
            elif op == "output":
                node = g.output(args[0])
            else:
                name = nj["name"]
                if not (isinstance(name, str) and name.isidentifier()):
                    raise SerializeError(f"flambeau.export.load: invalid node name {name!r}")
                node = g.create_node("call_function", target, args, kwargs, name=name)
            if node.name != nj["name"]:
                raise SerializeError(f"flambeau.export.load: duplicate or invalid node name {nj['name']!r}")
            node.meta["val"] = self.val(nj["val"])
            if "nn_module_stack" in nj:
                node.meta["nn_module_stack"] = _module_stack(nj["nn_module_stack"])
            env[node.name] = node
        gm = GraphModule(root, g)
        gm.meta["fake_mode"] = self.fake_mode
        gm.meta["shape_env"] = self.env
        return gm


# ---- program ------------------------------------------------------------------------------------------
def _arg_json(a) -> dict:
    if isinstance(a, ConstantArgument):
        return {"constant": _arg_to_json(a.value, "a constant output")}
    return {"symint" if isinstance(a, SymIntArgument) else "tensor": a.name}


def _arg_back(j):
    (k, v), = j.items()
    if k == "constant":
        return ConstantArgument("", _arg_from_json(v, {}))
    return SymIntArgument(v) if k == "symint" else TensorArgument(v)


def _check_tree(j) -> None:
    if not isinstance(j, dict):
        raise SerializeError("flambeau.export.load: bad pytree spec")
    if j.get("type") is not None and j.get("type") not in _TREE_TYPES:
        raise SerializeError(f"flambeau.export.load: pytree node type {j.get('type')!r} is not allowed "
                             f"(only {', '.join(_TREE_TYPES)})")
    for c in j.get("children_spec", []):
        _check_tree(c)


def _spec_loads(text: str):
    try:
        proto, tree = json.loads(text)
    except (ValueError, TypeError) as e:
        raise SerializeError(f"flambeau.export.load: bad pytree spec ({e})") from None
    _check_tree(tree)
    return pytree.treespec_loads(text)


def _program_json(ep: ExportedProgram) -> dict:
    sig = ep.graph_signature
    syms = {}
    for s in ep.range_constraints:
        syms[s.name] = int(ep.graph_module.meta["shape_env"].var_to_val.get(s, 2)) \
            if "shape_env" in ep.graph_module.meta else 2
    return {
        "schema_version": list(SCHEMA_VERSION),
        "graph": _graph_to_json(ep.graph_module),
        "symbols": syms,
        "range_constraints": {s.name: [r.lower, None if r.upper == INT_OO else r.upper]
                              for s, r in ep.range_constraints.items()},
        "input_specs": [{"kind": s.kind.name, "arg": _arg_json(s.arg), "target": s.target,
                         "persistent": s.persistent} for s in sig.input_specs],
        "output_specs": [{"kind": s.kind.name, "arg": _arg_json(s.arg), "target": s.target}
                         for s in sig.output_specs],
        "in_spec": pytree.treespec_dumps(ep.call_spec.in_spec),
        "out_spec": pytree.treespec_dumps(ep.call_spec.out_spec),
        "input_names": list(ep.call_spec.input_names),
        "requires_grad": {k: bool(v.requires_grad) for k, v in ep.state_dict.items()},
        "parameters": [s.target for s in sig.input_specs if s.kind is InputKind.PARAMETER],
        "dim_names": dict(ep.dim_names),
        "state_aliases": dict(ep.state_aliases),
        "module_fqns": [e.fqn for e in ep.module_call_graph[1:] if "@" not in e.fqn],
        "preserved": {e.fqn: {"inputs": [_arg_json(a) for a in e.signature.inputs],
                              "outputs": [_arg_json(a) for a in e.signature.outputs],
                              "in_spec": pytree.treespec_dumps(e.signature.in_spec),
                              "out_spec": pytree.treespec_dumps(e.signature.out_spec),
                              "state_writes": {k: _arg_json(a) for k, a in e.signature.state_writes.items()}}
                      for e in ep.module_call_graph[1:] if e.signature is not None},
    }


def _tensors_bytes(tensors: dict) -> bytes:
    buf = io.BytesIO()
    serialization.save({k: v.detach() for k, v in tensors.items()}, buf, format="safetensors")
    return buf.getvalue()


def save(ep: ExportedProgram, f, *, extra_files: dict | None = None, opset_version: dict | None = None) -> None:
    """Write `ep` to the path or binary file object `f` (see module docstring)."""
    if not isinstance(ep, ExportedProgram):
        raise TypeError(f"The 'ep' parameter must be an instance of 'ExportedProgram', got '{type(ep).__name__}'")
    program = json.dumps(_program_json(ep)).encode()
    weights = _tensors_bytes(ep.state_dict)
    constants = _tensors_bytes(ep.constants)
    target = f if hasattr(f, "write") else open(f, "wb")
    try:
        with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_STORED) as z:
            z.writestr("archive_format", ARCHIVE_FORMAT)
            z.writestr("program.json", program)
            z.writestr("weights.safetensors", weights)
            z.writestr("constants.safetensors", constants)
    finally:
        if target is not f:
            target.close()


def _read_archive(f) -> dict:
    return read_strict_zip(f, ENTRIES, archive_format=ARCHIVE_FORMAT, max_entry_bytes=MAX_ENTRY_BYTES,
                           error=SerializeError, caller="flambeau.export.load", what="exported-program archive")


def _load_tensors(data: bytes) -> dict:
    try:
        return serialization.load(io.BytesIO(data))
    except Exception as e:              # the safetensors reader's own errors: all mean a bad file
        raise SerializeError(f"flambeau.export.load: bad weights ({type(e).__name__}: {e})") from None


def load(f, *, extra_files: dict | None = None, expected_opset_version: dict | None = None) -> ExportedProgram:
    """Read an ExportedProgram written by `save` from a path or binary file object (see module docstring)."""
    entries = _read_archive(f)
    try:
        j = json.loads(entries["program.json"])
    except ValueError as e:
        raise SerializeError(f"flambeau.export.load: program.json is not valid JSON ({e})") from None
    version = j.get("schema_version") if isinstance(j, dict) else None
    if not (isinstance(version, list) and len(version) == 2 and all(type(v) is int for v in version)):
        raise SerializeError("flambeau.export.load: program.json has no schema_version")
    if version[0] != SCHEMA_VERSION[0] or version[1] > SCHEMA_VERSION[1]:
        raise SerializeError(f"flambeau.export.load: the file has schema version {version[0]}.{version[1]}, this "
                             f"flambeau reads {SCHEMA_VERSION[0]}.0 to {SCHEMA_VERSION[0]}.{SCHEMA_VERSION[1]}; "
                             "save it again with a matching flambeau")
    try:
        return _program(j, entries)
    except SerializeError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SerializeError(f"flambeau.export.load: malformed program.json ({type(e).__name__}: {e})") from None


def _program(j: dict, entries: dict) -> ExportedProgram:
    loader = _Loader(j["symbols"])
    gm = loader.graph(j["graph"])
    weights = _load_tensors(entries["weights.safetensors"])
    constants = _load_tensors(entries["constants.safetensors"])
    params = set(j["parameters"])
    state_dict = {}
    for k, v in weights.items():
        state_dict[k] = Parameter(v, requires_grad=j["requires_grad"].get(k, True)) if k in params else v
    input_specs = [InputSpec(InputKind[s["kind"]], _arg_back(s["arg"]), s["target"], s["persistent"])
                   for s in j["input_specs"]]
    output_specs = [OutputSpec(OutputKind[s["kind"]], _arg_back(s["arg"]), s["target"]) for s in j["output_specs"]]
    for s in input_specs:
        if s.kind is InputKind.PARAMETER or (s.kind is InputKind.BUFFER and s.persistent is not False):
            if s.target not in state_dict:
                raise SerializeError(f"flambeau.export.load: the weights lack {s.target!r}")
        elif s.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR) and s.target not in constants:
            raise SerializeError(f"flambeau.export.load: the constants lack {s.target!r}")
    ranges = {loader.symbols[k]: ValueRanges(int(lo), INT_OO if hi is None else int(hi))
              for k, (lo, hi) in j["range_constraints"].items()}
    call = ModuleCallSignature([], [], _spec_loads(j["in_spec"]), _spec_loads(j["out_spec"]), list(j["input_names"]))
    dim_names = j.get("dim_names", {})
    if not (isinstance(dim_names, dict) and all(k in loader.symbols and isinstance(v, str)
                                                for k, v in dim_names.items())):
        raise SerializeError("flambeau.export.load: dim_names must map size symbols to Dim names")
    aliases = j.get("state_aliases", {})
    if not (isinstance(aliases, dict) and all(isinstance(k, str) and v in state_dict for k, v in aliases.items())):
        raise SerializeError("flambeau.export.load: state_aliases must map names to entries of the weights")
    fqns = j.get("module_fqns", [])
    if not (isinstance(fqns, list) and all(isinstance(f, str) and all(p.isidentifier() or p.isdigit()
                                                                       for p in f.split(".")) for f in fqns)):
        raise SerializeError("flambeau.export.load: module_fqns must be a list of module paths")
    return ExportedProgram(gm, gm.graph, ExportGraphSignature(input_specs, output_specs), state_dict, ranges,
                           constants, call, dim_names=dim_names, state_aliases=aliases, module_fqns=fqns,
                           preserved=_preserved(j.get("preserved", {}), gm, fqns))


def _preserved(j, gm: GraphModule, fqns: list) -> dict:
    """The preserved calls' signatures: keys are module calls ('sub', 'sub@1'), names are graph values."""
    if not isinstance(j, dict):
        raise SerializeError("flambeau.export.load: preserved must map module calls to signatures")
    names = {n.name for n in gm.graph.nodes}
    out = {}
    for key, sig in j.items():
        fqn, _, k = key.partition("@")
        if fqn not in fqns or (k and not k.isdigit()):
            raise SerializeError(f"flambeau.export.load: preserved call {key[:80]!r} is not a call of a module "
                                 "of the program")
        args = [[_arg_back(a) for a in sig[side]] for side in ("inputs", "outputs")]
        writes = {k: _arg_back(a) for k, a in sig.get("state_writes", {}).items()}
        for a in [*args[0], *args[1], *writes.values()]:
            if isinstance(a, (TensorArgument, SymIntArgument)) and a.name not in names:
                raise SerializeError(f"flambeau.export.load: preserved call {key!r} names {a.name[:80]!r}, "
                                     "which is not a value of the graph")
        if not all(isinstance(k, str) and k.startswith(fqn + ".") for k in writes):
            raise SerializeError(f"flambeau.export.load: preserved call {key!r} writes state outside its module")
        out[key] = ModuleCallSignature(*args, _spec_loads(sig["in_spec"]), _spec_loads(sig["out_spec"]),
                                       state_writes=writes)
    return out
