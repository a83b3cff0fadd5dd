"""How `export` captures a module: one functional graph over lifted state and user inputs.

Non-strict (the default): the module runs on fake tensors under AOT autograd's tracer (make_fx's
recorder, `_functorch.aot_autograd._Trace`) and functionalization (`run_functionalized`). Its
parameters, buffers and tensor attributes are swapped for fake inputs named `p_<fqn>`, `b_<fqn>`
(placeholders in that order), user tensors follow under their parameter names (`x`, `y`, or
`<name>_<i>` inside containers), with the sizes `dynamic_shapes` names made symbolic. A tensor the
program makes from nothing (`torch.tensor(...)` in forward) becomes a lifted constant `c_lifted_tensor_<i>`.
In-place updates of buffers and inputs become graph outputs (BUFFER_MUTATION, USER_INPUT_MUTATION)
placed before the user outputs, as in `torch.export`.

Strict: the module's forward is first captured by dynamo with `fullgraph=True` (so graph breaks and
data-dependent branches are errors of dynamo's, naming file and line); dynamo's size guards are
checked against the Dims; then dynamo's graph is traced as above, its state matched to the module's
by identity, so the result has the same signature as non-strict export.

`preserve_module_call_signature=("sub", ...)`: each call of those submodules keeps its boundary, as
PyTorch's: forward hooks record the graph values of its flat `(args, kwargs)` and result and their
pytrees (`ep.module_call_graph` signatures; a later call is `sub@1`), those values survive dead-code
elimination (an unused output too), and the state the call updated is listed (`state_writes`), so
`unflatten` can rebuild the module with its original calling convention.

A data-dependent branch in non-strict mode raises `GuardOnDataDependentSymNode` naming the user's
file and line; violated Dims raise `UserError` (dynamic_shapes.check_constraints).
"""
from __future__ import annotations

import operator
import os
import re
import traceback

from .. import _state
from .._backends import MetaArray, contiguous_strides
from .._device import META
from .._dynamo.eval_frame import optimize_for_compiler, reset as dynamo_reset
from .._dynamo.exc import Unsupported, UserError, UserErrorType
from .._functorch.aot_autograd import _Trace
from .._functorch.functionalization import run_functionalized
from .._subclasses.fake_tensor import DataDependentOutputException
from .._tensor import Tensor
from ..autograd.grad_mode import no_grad
from ..fx._symbolic_shapes import ShapeEnv, SymInt, sym_size
from ..fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from ..fx.graph_module import GraphModule
from ..nn.modules.module import Module
from ..nn.parameter import Parameter
from ..utils import _pytree as pytree
from .dynamic_shapes import SymbolTable, check_constraints, dim_info, input_names, parse_dynamic_shapes
from .exported_program import ExportedProgram, ModuleCallSignature
from .graph_signature import (ConstantArgument, ExportGraphSignature, InputKind, InputSpec, OutputKind, OutputSpec,
                              SymIntArgument, TensorArgument)

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ident(text: str) -> str:
    return re.sub(r"[^0-9a-zA-Z_]", "_", text)


def _user_frame(tb) -> str:
    """'file:line in fn\n    code' of the innermost frame of `tb` outside flambeau."""
    frames = [f for f in traceback.extract_tb(tb) if not os.path.abspath(f.filename).startswith(_PACKAGE_DIR)]
    if not frames:
        return "<unknown location>"
    f = frames[-1]
    return f'File "{f.filename}", line {f.lineno}, in {f.name}\n    {f.line or ""}'


class _State:
    """The module's parameters, buffers and tensor attributes, in signature order."""

    def __init__(self, mod: Module):
        self.params = list(mod.named_parameters(remove_duplicate=True))
        self.buffers = [(n, b) for n, b in mod.named_buffers(remove_duplicate=True) if b is not None]
        first = {id(t): n for n, t in self.params + self.buffers}
        self.aliases = {n: first[id(t)] for n, t in [*mod.named_parameters(remove_duplicate=False),
                                                     *mod.named_buffers(remove_duplicate=False)]
                        if t is not None and first[id(t)] != n}     # a tied weight's other name -> its first
        self.non_persistent = set()
        self.attr_constants: dict = {}      # id(tensor) -> fqn of a plain tensor attribute
        for prefix, m in mod.named_modules(remove_duplicate=True):
            pre = f"{prefix}." if prefix else ""
            self.non_persistent |= {pre + n for n in m._non_persistent_buffers_set}
            for k, v in vars(m).items():
                if isinstance(v, Tensor) and not isinstance(v, Parameter):
                    self.attr_constants.setdefault(id(v), (pre + k, v))

    @property
    def named(self) -> list:
        return self.params + self.buffers


class _Swap:
    """Module state replaced by fake tensors for the duration of a trace (by fully qualified name; a
    tensor registered under several names, a tied weight, is replaced under each of them)."""

    def __init__(self, mod: Module, names: list, values: list):
        self.mod, self.names, self.values, self.saved = mod, names, values, []

    def __enter__(self):
        fake_of = {}
        for name, v in zip(self.names, self.values):
            *path, leaf = name.split(".")
            m = self.mod
            for p in path:
                m = m._modules[p]
            store = m._parameters if leaf in m._parameters else m._buffers
            fake_of[id(store[leaf])] = v
        for _, m in self.mod.named_modules(remove_duplicate=False):
            for store in (m._parameters, m._buffers):
                for leaf, t in store.items():
                    if t is not None and id(t) in fake_of:
                        self.saved.append((store, leaf, t))
                        store[leaf] = fake_of[id(t)]
        return self

    def __exit__(self, *exc):
        for store, leaf, old in reversed(self.saved):
            store[leaf] = old
        return False


class _ModuleStack:
    """Stamps each node the trace records with `meta["nn_module_stack"]`: {call key: (fqn, module type)}
    of the module calls it was recorded in, outermost first (PyTorch's metadata, read by `unflatten`).
    A module's second call gets the key `fqn@1`. Forward (pre-)hooks on every submodule mark the calls,
    and are removed afterwards. For the modules of `preserve` (export's `preserve_module_call_signature`)
    it also records each call's boundary: the pytree of its `(args, kwargs)` and of its result, and the
    graph value (node, size node or constant) of every leaf (`calls`: call key -> _Boundary)."""

    def __init__(self, mod: Module, rec, preserve: tuple = ()):
        self.mod, self.rec, self.graph = mod, rec, rec.graph
        self.preserve = set(preserve)
        self.stack: list = []
        self.counts: dict = {}
        self.calls: dict = {}
        self.handles: list = []
        self.done: set = set()

    def _stamp(self) -> None:
        meta = {key: value for key, value in self.stack}
        for n in reversed(self.graph.nodes):
            if n in self.done:
                break
            self.done.add(n)
            if n.op != "placeholder":
                n.meta["nn_module_stack"] = dict(meta)

    def _values(self, tree) -> tuple:
        """(spec, [graph value of each leaf]) of a call's inputs or outputs."""
        leaves, spec = pytree.tree_flatten(tree)
        out = []
        for v in leaves:
            if isinstance(v, Tensor):
                out.append(self.rec.node_of(v))
            elif isinstance(v, SymInt):
                out.append(self.rec.expr_node(v.expr))
            else:
                out.append(v)
        return spec, out

    def _enter(self, fqn: str, m: Module, args=None, kwargs=None) -> None:
        k = self.counts.get(fqn, 0)
        key = fqn if k == 0 else f"{fqn}@{k}"
        if fqn in self.preserve:               # (size nodes for the inputs belong to the caller)
            self.calls[key] = _Boundary(*self._values((tuple(args), dict(kwargs))), self._state_nodes(fqn, m))
        self._stamp()
        self.counts[fqn] = k + 1
        cls = type(m)
        self.stack.append((key, (fqn, f"{cls.__module__}.{cls.__qualname__}")))

    def _state_nodes(self, fqn: str, m: Module) -> dict:
        """{fqn: current graph value} of the state of `m`'s subtree."""
        return {f"{fqn}.{n}": self.rec.node_of(t) for n, t in [*m.named_parameters(), *m.named_buffers()]
                if isinstance(t, Tensor)}

    def _exit(self, m: Module, out=None) -> None:
        key, (fqn, _) = self.stack[-1]
        b = self.calls.get(key)
        if b is not None:
            b.out_spec, b.outputs = self._values(out)
            b.writes = {n: v for n, v in self._state_nodes(fqn, m).items() if b.writes.get(n) is not v}
        self._stamp()
        self.stack.pop()

    def __enter__(self):
        for fqn, m in self.mod.named_modules(remove_duplicate=True):
            if not fqn:
                continue
            if fqn in self.preserve:
                self.handles.append(m.register_forward_pre_hook(
                    lambda mod, args, kwargs, fqn=fqn: self._enter(fqn, mod, args, kwargs), with_kwargs=True))
                self.handles.append(m.register_forward_hook(lambda mod, args, out: self._exit(mod, out)))
                continue
            self.handles.append(m.register_forward_pre_hook(lambda mod, args, fqn=fqn: self._enter(fqn, mod)))
            self.handles.append(m.register_forward_hook(lambda mod, args, out: self._exit(mod)))
        return self

    def __exit__(self, *exc):
        self._stamp()
        for h in self.handles:
            h.remove()
        return False


class _Boundary:
    """One call of a preserved module: its input pytree and leaves, then its output pytree and leaves, and
    the new values of the state of its subtree it updated (`writes`; at entry: the state's values)."""

    def __init__(self, in_spec, inputs: list, state: dict):
        self.in_spec, self.inputs, self.writes = in_spec, inputs, state
        self.out_spec, self.outputs = None, []

    def nodes(self) -> list:
        return [v for v in (*self.inputs, *self.outputs, *self.writes.values()) if hasattr(v, "op")]

    def signature(self, replaced: dict) -> ModuleCallSignature:
        def arg(v):
            v = replaced.get(v, v) if hasattr(v, "op") else v
            return _argument(v) if hasattr(v, "op") else ConstantArgument("", v)
        return ModuleCallSignature([arg(v) for v in self.inputs], [arg(v) for v in self.outputs], self.in_spec,
                                   self.out_spec, state_writes={n: arg(v) for n, v in self.writes.items()})


def _fake_input(tr: _Trace, t: Tensor, name: str, shape: tuple) -> Tensor:
    ph = tr._placeholder(name)
    if all(isinstance(s, int) for s in shape):
        f = tr.fake_mode.from_tensor(t)
    else:
        f = Tensor._make(MetaArray(shape, t._dtype.np, contiguous_strides(shape), 0), META, t._dtype)
        tr.fake_mode._register(f, t.device)
        f._requires_grad = t._requires_grad
    tr.rec.bind(f, ph)
    ph.meta["val"] = tr.rec.fake_of(f)
    tr.rec.note_sizes(ph, f)
    for d, size in enumerate(shape):
        if isinstance(size, SymInt) and not size.expr.is_Symbol:
            _root_from_derived(tr, ph, d, size)
    return f


def _root_from_derived(tr: _Trace, ph, d: int, size: SymInt) -> None:
    """A root Dim seen only through a derived dim `a*s + b` is read in the graph as `(size - b) // a`."""
    rec, e = tr.rec, size.expr
    if len(e.free_symbols) != 1:
        return
    (sym,) = e.free_symbols
    a, b = e.coeff(sym), e.subs(sym, 0)
    if sym in rec.sym_sources or sym in rec._expr_nodes or not (a.is_Integer and b.is_Integer):
        return
    n = rec.graph.call_function(sym_size, (ph, d))
    if int(b):
        n = rec.graph.call_function(operator.sub, (n, int(b)))
    if int(a) != 1:
        n = rec.graph.call_function(operator.floordiv, (n, int(a)))
    n.meta["val"] = SymInt(sym, size.env)
    rec._expr_nodes[sym] = n


def _leaf_name(path, names: list) -> str:
    top = path[1].idx if hasattr(path[1], "idx") else path[1].key
    base = names[top] if isinstance(top, int) else str(top)
    rest = "".join(f"_{getattr(k, 'idx', getattr(k, 'key', getattr(k, 'name', '')))}" for k in path[2:])
    return _ident(base + rest)


def _leaf_source(path, names: list) -> str:
    top = path[1].idx if hasattr(path[1], "idx") else path[1].key
    base = names[top] if isinstance(top, int) else str(top)
    return f"{base}{pytree.keystr(path[2:])}"


class _Capture:
    """One export: inputs, the traced graph, and what the signature needs to know."""

    def __init__(self, mod: Module, args: tuple, kwargs: dict, dynamic_shapes, preserve: tuple = ()):
        self.mod, self.args, self.kwargs, self.preserve = mod, args, kwargs, tuple(preserve)
        self.names = input_names(mod.forward, args, kwargs)
        self.paths, self.in_spec = pytree.tree_flatten_with_path((args, kwargs))
        self.leaves = [leaf for _, leaf in self.paths]
        self.dims = parse_dynamic_shapes(dynamic_shapes, self.names, args, kwargs, lambda x: isinstance(x, Tensor))
        self.env = ShapeEnv(duck_shape=False)
        self.table = SymbolTable(self.env)
        self.state = _State(mod)
        self.tensor_pos = [i for i, v in enumerate(self.leaves) if isinstance(v, Tensor)]
        self.user_names = [_leaf_name(self.paths[i][0], self.names) for i in self.tensor_pos]
        self.sources = [_leaf_source(self.paths[i][0], self.names) for i in self.tensor_pos]

    def symbolic_shape(self, k: int) -> tuple:
        i = self.tensor_pos[k]
        t, spec = self.leaves[i], self.dims[i]
        return tuple(self.table.size(spec[d], int(s), f"{self.sources[k]}.size()[{d}]", (str(k), d))
                     if d in spec else int(s) for d, s in enumerate(t.shape))

    def trace(self, call) -> tuple:
        """Trace `call(state_values, args, kwargs)`; returns (GraphModule, graph outputs info)."""
        tr = _Trace("symbolic", shape_env=self.env)
        state_names = [n for n, _ in self.state.named]
        prims = [_fake_input(tr, t, ("p_" if i < len(self.state.params) else "b_") + _ident(n), tuple(t.shape))
                 for i, (n, t) in enumerate(self.state.named)]
        user = [_fake_input(tr, self.leaves[i], name, self.symbolic_shape(k))
                for k, (i, name) in enumerate(zip(self.tensor_pos, self.user_names))]
        # the graph may rename a placeholder (`input` is a builtin: `input_1`); the signature uses its name
        self.user_names = [tr.rec.data_to_node[id(u._data)][1].name for u in user]
        out_spec = []
        leaves, n_state, pos = list(self.leaves), len(prims), self.tensor_pos

        def flat_fn(*flat):
            full = list(leaves)
            for i, t in zip(pos, flat[n_state:]):
                full[i] = t
            a, kw = self.in_spec.unflatten(full)
            out = call(state_names, list(flat[:n_state]), a, kw)
            out_leaves, spec = pytree.tree_flatten(out)
            out_spec.append(spec)
            return out_leaves

        self.stack = _ModuleStack(self.mod, tr.rec, self.preserve)
        try:
            with no_grad(), self.stack:
                res = tr.run(lambda *a: run_functionalized(flat_fn, a), *prims, *user)
        except DataDependentOutputException as e:
            raise GuardOnDataDependentSymNode(
                f"Could not guard on data-dependent expression: {e}. Data-dependent control flow cannot be "
                f"exported; write it with flambeau.cond.\nThe following call raised this error:\n  "
                f"{_user_frame(e.__traceback__)}") from None
        return tr, res, out_spec[0], n_state

    def finish(self, tr: _Trace, res, out_spec, n_state: int, strict: bool) -> ExportedProgram:
        check_constraints(self.env, self.table)
        n_params = len(self.state.params)
        mutated = []
        for i, final in res.mutations:
            if i < n_params:
                kind, target = OutputKind.PARAMETER_MUTATION, self.state.params[i][0]
            elif i < n_state:
                kind, target = OutputKind.BUFFER_MUTATION, self.state.named[i][0]
            else:
                kind, target = OutputKind.USER_INPUT_MUTATION, self.user_names[i - n_state]
            mutated.append((kind, target, final))
        gm = tr.finish([f for _, _, f in mutated] + list(res.out))
        boundary = {n for b in self.stack.calls.values() for n in b.nodes()}   # kept, used or not (PyTorch's)
        gm.graph.eliminate_dead_code(lambda n: n.is_impure() or n in boundary)
        constants = self._lift_constants(gm)
        self._order_placeholders(gm)
        input_specs = self._input_specs(gm)
        out_node = gm.graph.output_node()
        vals = list(out_node.args[0])
        output_specs = [OutputSpec(kind, _argument(v), target) for (kind, target, _), v in zip(mutated, vals)]
        output_specs += [OutputSpec(OutputKind.USER_OUTPUT, _argument(v), None) for v in vals[len(mutated):]]
        gm.recompile()
        sig = ExportGraphSignature(input_specs, output_specs)
        state_dict = {n: t for n, t in self.state.named if n not in self.state.non_persistent}
        for n, t in self.state.buffers:
            if n in self.state.non_persistent:
                constants[n] = t
        call_sig = ModuleCallSignature([], [], self.in_spec, out_spec, [_ident(n) for n in self.names])
        preserved = {key: b.signature(self.replaced) for key, b in self.stack.calls.items()}
        return ExportedProgram(gm, gm.graph, sig, state_dict, self.table.range_constraints(), constants,
                               call_sig, example_inputs=(self.args, self.kwargs), strict=strict,
                               dim_names=self.table.dim_names(), state_aliases=self.state.aliases,
                               module_fqns=[n for n, _ in self.mod.named_modules() if n], preserved=preserved)

    def _lift_constants(self, gm: GraphModule) -> dict:
        """get_attr tensors the trace made (tensor attributes, tensors built in forward) -> placeholders."""
        constants = {}
        self.const_targets = {}             # placeholder name -> the constant's fully qualified name
        self.replaced = {}                  # get_attr node -> its placeholder
        first_user = next((n for n in gm.graph.nodes if n.op == "placeholder" and n.name in set(self.user_names)), None)
        n_lifted = 0
        for node in list(gm.graph.nodes):
            if node.op != "get_attr":
                continue
            value = getattr(gm, node.target)
            if not isinstance(value, Tensor):
                continue
            hit = self.state.attr_constants.get(id(value))
            if hit is not None and hit[1] is value:
                target = hit[0]
            else:
                target = f"lifted_tensor_{n_lifted}"
                n_lifted += 1
            with gm.graph.inserting_before(first_user if first_user is not None else gm.graph.output_node()):
                ph = gm.graph.placeholder("c_" + _ident(target))
            ph.meta["val"] = node.meta.get("val")
            self.const_targets[ph.name] = target
            node.replace_all_uses_with(ph)
            self.replaced[node] = ph
            gm.graph.erase_node(node)
            delattr(gm, node.target)
            constants[target] = value
        return constants

    def _order_placeholders(self, gm: GraphModule) -> None:
        """torch.export's order: parameters, then per module (in traversal order) its buffers and then its
        tensor attributes, then constants made in forward, then user inputs."""
        rank = {}
        for n, _ in self.state.params:
            rank["p_" + _ident(n)] = len(rank)
        module_of = {}
        for n, _ in self.state.buffers:
            module_of.setdefault(n.rpartition(".")[0], []).append("b_" + _ident(n))
        for fqn, _ in self.state.attr_constants.values():
            module_of.setdefault(fqn.rpartition(".")[0], []).append("c_" + _ident(fqn))
        for prefix, _ in self.mod.named_modules(remove_duplicate=True):
            for name in module_of.get(prefix, ()):
                rank.setdefault(name, len(rank))
        phs = gm.graph.find_nodes(op="placeholder")
        user = set(self.user_names)
        n_user = len(phs)

        def key(ph):
            if ph.name in user:
                return 2 * n_user + 1 + len(rank) + self.user_names.index(ph.name)
            return rank.get(ph.name, len(rank) + phs.index(ph))
        first = next(n for n in gm.graph.nodes if n.op != "placeholder")
        for ph in sorted(phs, key=key):
            first.prepend(ph)

    def _input_specs(self, gm: GraphModule) -> list:
        specs = []
        kinds = {}
        for n, _ in self.state.params:
            kinds["p_" + _ident(n)] = (InputKind.PARAMETER, n, None)
        for n, _ in self.state.buffers:
            kinds["b_" + _ident(n)] = (InputKind.BUFFER, n, n not in self.state.non_persistent)
        user = set(self.user_names)
        for node in gm.graph.find_nodes(op="placeholder"):
            if node.name in kinds:
                kind, target, persistent = kinds[node.name]
                specs.append(InputSpec(kind, TensorArgument(node.name), target, persistent))
            elif node.name in user:
                specs.append(InputSpec(InputKind.USER_INPUT, TensorArgument(node.name), None))
            else:
                specs.append(InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(node.name),
                                       self.const_targets[node.name]))
        return specs


def _argument(v):
    if hasattr(v, "op"):
        val = v.meta.get("val")
        return SymIntArgument(v.name) if isinstance(val, SymInt) else TensorArgument(v.name)
    return ConstantArgument("", v)


def _call_module(mod: Module):
    def call(state_names, state_values, args, kwargs):
        with _Swap(mod, state_names, state_values):
            return mod(*args, **kwargs)
    return call


def _check_args(mod, args, kwargs) -> None:
    if not isinstance(mod, Module):
        raise ValueError(f"Expected `mod` to be an instance of `torch.nn.Module`, got {type(mod)}.")
    if not isinstance(args, tuple):
        raise UserError(UserErrorType.INVALID_INPUT,
                        f"Expecting `args` to be a tuple of example positional inputs, got {type(args)}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise UserError(UserErrorType.INVALID_INPUT,
                        f"Expecting `kwargs` to be a dict of example keyword inputs, got {type(kwargs)}")


def export_non_strict(mod: Module, args: tuple, kwargs: dict, dynamic_shapes, preserve: tuple = ()) -> ExportedProgram:
    cap = _Capture(mod, args, kwargs, dynamic_shapes, preserve)
    tr, res, out_spec, n_state = cap.trace(_call_module(mod))
    return cap.finish(tr, res, out_spec, n_state, strict=False)


def export_strict(mod: Module, args: tuple, kwargs: dict, dynamic_shapes, preserve: tuple = ()) -> ExportedProgram:
    """Dynamo captures the forward with fullgraph=True first: its errors (graph breaks, data-dependent
    branches) and its size guards are the program's; then the module is traced as in non-strict mode."""
    cap = _Capture(mod, args, kwargs, dynamic_shapes, preserve)
    aliases = []
    for i in cap.tensor_pos:
        t = cap.leaves[i]
        a = Tensor._make(t._data, t._device, t._dtype)
        a._requires_grad = t._requires_grad
        if cap.dims[i]:
            a.__dict__["_dynamo_dynamic_indices"] = set(cap.dims[i])
        aliases.append(a)
    leaves = list(cap.leaves)
    for i, a in zip(cap.tensor_pos, aliases):
        leaves[i] = a
    d_args, d_kwargs = cap.in_spec.unflatten(leaves)
    captured = []

    def capture_backend(gm, example_inputs):
        captured.append((gm, list(example_inputs)))
        return gm.forward

    state = _State(mod)
    snapshot = [t.detach().clone() for _, t in state.buffers]
    compiled = optimize_for_compiler(mod, capture_backend, fullgraph=True, dynamic=None)
    try:
        with no_grad():
            compiled(*d_args, **d_kwargs)
    except Unsupported as e:
        raise UserError(UserErrorType.DYNAMIC_CONTROL_FLOW,
                        f"{e.msg}\n\nfrom user code:\n   {e.location()}\n\nData-dependent control flow cannot be "
                        "exported; write it with flambeau.cond.") from None
    finally:
        dynamo_reset()
        with no_grad():
            for (_, b), old in zip(state.buffers, snapshot):
                b.copy_(old)                       # the capture ran the program once: undo its buffer updates
    for dgm, example in captured:
        _check_dynamo_guards(dgm, example, aliases, cap)
    tr, res, out_spec, n_state = cap.trace(_call_module(mod))
    return cap.finish(tr, res, out_spec, n_state, strict=True)


def _check_dynamo_guards(dgm, example, aliases, cap: _Capture) -> None:
    """Check dynamo's size guards against the Dims (dynamo decided the Python branches on sizes)."""
    env = getattr(dgm, "meta", {}).get("shape_env")
    if env is None or not env.guards:
        return
    table = SymbolTable(env)
    k_of = {id(a): k for k, a in enumerate(aliases)}
    for ph, ex in zip([n for n in dgm.graph.nodes if n.op == "placeholder"], example):
        k = k_of.get(id(ex))
        val = ph.meta.get("example_value")
        if k is None or not isinstance(val, Tensor):
            continue
        spec = cap.dims[cap.tensor_pos[k]]
        for d, s in enumerate(val.shape):
            if isinstance(s, SymInt) and s.expr.is_Symbol and s.expr not in table.infos and d in spec:
                table.infos[s.expr] = dim_info(spec[d], f"{cap.sources[k]}.size()[{d}]", s.expr)
    check_constraints(env, table)


def export(mod: Module, args: tuple, kwargs: dict | None = None, *, dynamic_shapes=None, strict: bool = False,
           preserve_module_call_signature: tuple = ()) -> ExportedProgram:
    """`torch.export.export`: a sound full-graph capture of `mod(*args, **kwargs)` (see module docstring)."""
    _check_args(mod, args, kwargs)
    preserve = tuple(preserve_module_call_signature)
    for fqn in preserve:
        mod.get_submodule(fqn)                 # an unknown path raises AttributeError, as PyTorch's
    kwargs = dict(kwargs or {})
    saved = _state.tls.grad_enabled
    try:
        if strict:
            return export_strict(mod, args, kwargs, dynamic_shapes, preserve)
        return export_non_strict(mod, args, kwargs, dynamic_shapes, preserve)
    finally:
        _state.tls.grad_enabled = saved
