"""`ExportedProgram`: an exported graph with its signature, state and dynamic-size ranges.

`graph_module` takes every input explicitly (parameters, buffers, constants, then user inputs) and
returns the new values of mutated state first, then the user outputs. `module()` gives the
callable a user wants: an `nn.Module` holding the state under its original names, taking the
original (nested) arguments, checking their shapes against the export's (static sizes, Dim ranges,
equal and derived Dims; `AssertionError("Guard failed: ...")` as PyTorch's unlifted module raises),
applying buffer updates, and returning the original output structure. Calling the ExportedProgram
itself raises, as in PyTorch. `run_decompositions()` retraces the graph through the decomposition
table (default: every non-core op that has a decomposition) into core operators; each new node keeps
the module stack of the node it came from (`KEPT_NODE_META`), so `unflatten` works on the result.
"""
from __future__ import annotations

import dataclasses

from .._decomp import core_aten_decompositions
from .._functorch.aot_autograd import retrace
from .._tensor import Tensor
from ..autograd.grad_mode import no_grad
from ..fx._symbolic_shapes import SymInt, _sp, expr_to_python
from ..fx.graph import Graph
from ..fx.graph_module import GraphModule
from ..nn.modules.module import Module
from ..nn.parameter import Parameter
from ..utils import _pytree as pytree
from .dynamic_shapes import INT_OO
from .graph_signature import (ConstantArgument, ExportGraphSignature, InputKind, OutputKind, OutputSpec, SymIntArgument,
                              TensorArgument)

__all__ = ["ExportedProgram", "ModuleCallSignature", "ModuleCallEntry"]

# node metadata run_decompositions carries from each node to the nodes it decomposes into (unflatten
# reads the module stacks of a decomposed program, as PyTorch's)
KEPT_NODE_META = ("nn_module_stack", "stack_trace")


@dataclasses.dataclass
class ModuleCallSignature:
    """How a module was called (PyTorch's): `inputs`/`outputs` are the graph values of its flat inputs and
    outputs (TensorArgument, SymIntArgument or ConstantArgument, in pytree order), `in_spec` the pytree
    of its `(args, kwargs)` and `out_spec` of its result; `forward_arg_names` the root's parameter names
    (None for a submodule). The root's `inputs`/`outputs` are empty, as PyTorch's. flambeau's graph is
    functional, so a call's updates of its own state are listed too (`state_writes`: FQN -> the new
    value's TensorArgument): `unflatten` writes them inside the call's module."""
    inputs: list
    outputs: list
    in_spec: object
    out_spec: object
    forward_arg_names: list | None = None
    state_writes: dict = dataclasses.field(default_factory=dict)

    @property
    def input_names(self) -> list:
        return self.forward_arg_names or []


@dataclasses.dataclass
class ModuleCallEntry:
    """One module of the exported module's tree (`ep.module_call_graph`, in `named_modules()` order)."""
    fqn: str
    signature: ModuleCallSignature | None = None


class ExportedProgram:
    """See module docstring."""

    def __init__(self, root: GraphModule, graph, graph_signature: ExportGraphSignature, state_dict: dict,
                 range_constraints: dict, constants: dict, call_signature: ModuleCallSignature,
                 example_inputs=None, strict: bool = False, dim_names: dict | None = None,
                 state_aliases: dict | None = None, module_fqns: list | None = None,
                 preserved: dict | None = None):
        self._graph_module = root
        root.graph = graph
        self._graph_signature = graph_signature
        self._state_dict = state_dict
        self._range_constraints = range_constraints
        self._constants = constants
        self._call_signature = call_signature
        self.example_inputs = example_inputs
        self._strict = strict
        self._dim_names = dict(dim_names or {})     # size symbol name -> the user's Dim name
        self.state_aliases = dict(state_aliases or {})  # other FQN of a tied weight -> its FQN in the signature
        self._module_fqns = list(module_fqns or [])      # the submodules, in named_modules() order
        self._preserved = dict(preserved or {})          # call key ('sub', 'sub@1') -> ModuleCallSignature

    # ---- PyTorch's read-only views ---------------------------------------------------------------
    @property
    def graph_module(self) -> GraphModule:
        return self._graph_module

    @property
    def graph(self):
        return self._graph_module.graph

    @property
    def graph_signature(self) -> ExportGraphSignature:
        return self._graph_signature

    @property
    def state_dict(self) -> dict:
        return self._state_dict

    @property
    def constants(self) -> dict:
        return self._constants

    @property
    def tensor_constants(self) -> dict:
        return self._constants

    @property
    def range_constraints(self) -> dict:
        return self._range_constraints

    @property
    def dim_names(self) -> dict:
        """{size symbol name ('s0'): the name of the user's Dim ('batch')} (flambeau's: error messages
        of `module()`, AOTInductor packages and save/load name the Dim rather than the symbol)."""
        return self._dim_names

    @property
    def module_call_graph(self) -> list:
        """[ModuleCallEntry]: the root (with the call signature), then each submodule in `named_modules()`
        order, the calls of `preserve_module_call_signature`'s modules with their signatures (later calls,
        `sub@1`, after the modules, in call order), as PyTorch's."""
        first = [ModuleCallEntry(f, self._preserved.get(f)) for f in self._module_fqns]
        later = [ModuleCallEntry(k, s) for k, s in self._preserved.items() if k not in self._module_fqns]
        return [ModuleCallEntry("", self._call_signature)] + first + later

    @property
    def call_spec(self) -> ModuleCallSignature:
        return self._call_signature

    @property
    def dialect(self) -> str:
        return "ATEN"

    def parameters(self):
        for n in self._graph_signature.parameters:
            yield self._state_dict[n]

    def named_parameters(self):
        for n in self._graph_signature.parameters:
            yield n, self._state_dict[n]

    def buffers(self):
        for _, b in self.named_buffers():
            yield b

    def named_buffers(self):
        for s in self._graph_signature.input_specs:
            if s.kind is InputKind.BUFFER:
                yield s.target, self._state_dict.get(s.target, self._constants.get(s.target))

    # ---- running ---------------------------------------------------------------------------------
    def _state_inputs(self) -> list:
        out = []
        for s in self._graph_signature.input_specs:
            if s.kind is InputKind.PARAMETER:
                out.append(self._state_dict[s.target])
            elif s.kind is InputKind.BUFFER:
                out.append(self._state_dict[s.target] if s.persistent is not False else self._constants[s.target])
            elif s.kind is InputKind.CONSTANT_TENSOR:
                out.append(self._constants[s.target])
        return out

    def __call__(self, *args, **kwargs):
        raise RuntimeError("Unable to call ExportedProgram directly. You should use `exported_program.module()` "
                           "instead.")

    def module(self) -> Module:
        """An nn.Module running this program with the original calling convention (see module docstring)."""
        return _UnliftedModule(self)

    def run_decompositions(self, decomp_table: dict | None = None) -> "ExportedProgram":
        """A new ExportedProgram whose graph is retraced through `decomp_table` (default: core operators)."""
        table = core_aten_decompositions() if decomp_table is None else decomp_table
        gm = self._graph_module
        fake_mode = gm.meta.get("fake_mode")
        symbolic = fake_mode is not None and fake_mode.shape_env is not None
        keep = _boundary_nodes(gm, self._preserved)
        if keep:                     # preserved calls' inputs and outputs: extra outputs while retracing
            gm = _with_outputs(gm, keep)
        new = retrace(gm, symbolic, fake_mode, table, keep_meta=KEPT_NODE_META)
        preserved = self._preserved
        if keep:
            out = new.graph.output_node()
            values = list(out.args[0])
            renamed = {n.name: v for n, v in zip(keep, values[len(values) - len(keep):])}
            out.args = (tuple(values[:len(values) - len(keep)]),)
            preserved = {k: _renamed_signature(s, renamed) for k, s in preserved.items()}
            kept = set(v for v in renamed.values() if hasattr(v, "op"))
            new.graph.eliminate_dead_code(lambda n: n.is_impure() or n in kept)
        else:
            new.graph.eliminate_dead_code()
        for name, sub in gm.named_children():
            if isinstance(sub, GraphModule):
                setattr(new, name, sub)
        new.recompile()
        outs = list(new.graph.output_node().args[0])
        specs = [OutputSpec(s.kind, _rename(s.arg, v), s.target)
                 for s, v in zip(self._graph_signature.output_specs, outs)]
        sig = ExportGraphSignature(list(self._graph_signature.input_specs), specs)
        return ExportedProgram(new, new.graph, sig, self._state_dict, self._range_constraints, self._constants,
                               self._call_signature, self.example_inputs, self._strict, self._dim_names,
                               self.state_aliases, self._module_fqns, preserved)

    def __str__(self) -> str:
        code = self._graph_module.print_readable(print_output=False).replace("\n", "\n    ")
        sig = str(self._graph_signature).replace("\n", "\n    ")
        return (f"ExportedProgram:\n    {code}\nGraph signature: {sig}\nRange constraints: "
                f"{self._range_constraints}\n")

    __repr__ = __str__


def _boundary_nodes(gm: GraphModule, preserved: dict) -> list:
    """The graph nodes the preserved calls' signatures name (each once, in graph order)."""
    names = {a.name for s in preserved.values() for a in (*s.inputs, *s.outputs, *s.state_writes.values())
             if isinstance(a, (TensorArgument, SymIntArgument))}
    return [n for n in gm.graph.nodes if n.name in names and n.op != "output"]


def _with_outputs(gm: GraphModule, extra: list) -> GraphModule:
    """A copy of `gm` returning `extra` after its outputs (so a retrace keeps and renames them)."""
    g = Graph()
    env: dict = {}
    for n in gm.graph.nodes:
        if n.op == "output":
            g.output(tuple(env[o] if hasattr(o, "op") else o for o in n.args[0]) + tuple(env[e] for e in extra))
        else:
            env[n] = g.node_copy(n, lambda a: env[a])
    out = GraphModule(gm, g)
    out.meta.update(gm.meta)
    return out


def _renamed_signature(sig: ModuleCallSignature, renamed: dict) -> ModuleCallSignature:
    def arg(a):
        if not isinstance(a, (TensorArgument, SymIntArgument)):
            return a
        v = renamed[a.name]
        return _rename(a, v) if hasattr(v, "op") else ConstantArgument("", v)
    return ModuleCallSignature([arg(a) for a in sig.inputs], [arg(a) for a in sig.outputs], sig.in_spec,
                               sig.out_spec, sig.forward_arg_names,
                               {k: arg(a) for k, a in sig.state_writes.items()})


def _rename(arg, value):
    if hasattr(value, "op"):
        return type(arg)(value.name) if isinstance(arg, (TensorArgument, SymIntArgument)) else arg
    return arg


class _InputChecker:
    """The shape checks of an unlifted module: static sizes, Dim ranges, equal and derived Dims."""

    def __init__(self, ep: ExportedProgram):
        self.names = [s.arg.name for s in ep.graph_signature.input_specs if s.kind is InputKind.USER_INPUT]
        phs = {n.name: n for n in ep.graph.find_nodes(op="placeholder")}
        self.shapes = [tuple(phs[n].meta["val"].shape) for n in self.names]
        self.ranges = ep.range_constraints
        self.dim_names = ep.dim_names

    def _named(self, expr) -> str:
        """`expr` with its size symbols spelt as the user's Dim names ('batch + 1')."""
        sp = _sp()
        names = {s: sp.Symbol(self.dim_names[s.name]) for s in expr.free_symbols if s.name in self.dim_names}
        return str(expr.xreplace(names)) if names else ""

    def _range(self, sym) -> str:
        r = self.ranges[sym]
        hi = "inf" if r.upper == INT_OO else r.upper
        name = self.dim_names.get(sym.name)
        return f": the Dim {name} ranges over [{r.lower}, {hi}]" if name else ""

    def check(self, tensors: list) -> None:
        values: dict = {}
        where: dict = {}
        for name, shape, t in zip(self.names, self.shapes, tensors):
            if not isinstance(t, Tensor):
                raise AssertionError(f"Guard failed: {name} is a Tensor (got {type(t).__name__})")
            if t.dim() != len(shape):
                raise AssertionError(f"Guard failed: {name}.dim() == {len(shape)} (got {t.dim()})")
            for d, (want, got) in enumerate(zip(shape, t.shape)):
                if isinstance(want, int):
                    if want != got:
                        raise AssertionError(f"Guard failed: {name}.size()[{d}] == {want} (got {got})")
                    continue
                expr = want.expr
                src = f"{name}.size()[{d}]"
                if not expr.is_Symbol and len(expr.free_symbols) == 1:    # a derived dim a*s + b binds s
                    (sym,) = expr.free_symbols
                    a, b = expr.coeff(sym), expr.subs(sym, 0)
                    if a.is_Integer and b.is_Integer and sym not in values and (got - int(b)) % int(a) == 0:
                        values[sym] = (got - int(b)) // int(a)
                        shifted = f"{src} - {int(b)}" if int(b) else src
                        where[sym] = shifted if int(a) == 1 else f"({shifted}) // {int(a)}"
                if expr.is_Symbol:
                    if expr in values and values[expr] != got:
                        name = self._named(expr)
                        both = f": both are the Dim {name}" if name else ""
                        raise AssertionError(f"Guard failed: {src} == {where[expr]} (got {got} and {values[expr]}"
                                             f"{both})")
                    values.setdefault(expr, got)
                    where.setdefault(expr, src)
        for name, shape, t in zip(self.names, self.shapes, tensors):
            for d, (want, got) in enumerate(zip(shape, t.shape)):
                if isinstance(want, SymInt) and not want.expr.is_Symbol:
                    expected = _eval(want.expr, values)
                    if expected is not None and expected != got:
                        text = expr_to_python(want.expr, where)
                        dim = self._named(want.expr)
                        raise AssertionError(f"Guard failed: {name}.size()[{d}] == {text} (got {got}, expected "
                                             f"{expected}{f': the Dim {dim}' if dim else ''})")
        for sym, val in values.items():
            r = self.ranges.get(sym)
            if r is not None:
                if val < r.lower:
                    raise AssertionError(f"Guard failed: {where[sym]} >= {r.lower} (got {val}{self._range(sym)})")
                if val > r.upper:
                    raise AssertionError(f"Guard failed: {where[sym]} <= {r.upper} (got {val}{self._range(sym)})")


def _eval(expr, values: dict):
    if not expr.free_symbols <= set(values):
        return None
    return int(expr.xreplace(values))


class _UnliftedModule(Module):
    """What `ExportedProgram.module()` returns (see module docstring)."""

    def __init__(self, ep: ExportedProgram):
        super().__init__()
        self.__dict__["_ep"] = ep
        self.__dict__["_checker"] = _InputChecker(ep)
        for s in ep.graph_signature.input_specs:
            if s.kind is InputKind.PARAMETER:
                self._place(s.target, ep.state_dict[s.target], "param")
            elif s.kind is InputKind.BUFFER:
                persistent = s.persistent is not False
                value = ep.state_dict[s.target] if persistent else ep.constants[s.target]
                self._place(s.target, value, "buffer", persistent)

    def _place(self, fqn: str, t: Tensor, kind: str, persistent: bool = True) -> None:
        *path, leaf = fqn.split(".")
        m = self
        for p in path:
            if p not in m._modules:
                m._modules[p] = Module()
            m = m._modules[p]
        if kind == "param":
            m.register_parameter(leaf, t if isinstance(t, Parameter) else Parameter(t))
        else:
            m.register_buffer(leaf, t, persistent=persistent)

    @property
    def graph(self):
        return self.__dict__["_ep"].graph

    def _get(self, fqn: str) -> Tensor:
        """The parameter or buffer at `fqn` (read from the stores: export swaps them for fakes when retracing)."""
        *path, leaf = fqn.split(".")
        m = self
        for p in path:
            m = m._modules[p]
        return m._parameters[leaf] if leaf in m._parameters else m._buffers[leaf]

    def _state(self) -> list:
        ep = self.__dict__["_ep"]
        out = []
        for s in ep.graph_signature.input_specs:
            if s.kind in (InputKind.PARAMETER, InputKind.BUFFER):
                out.append(self._get(s.target))
            elif s.kind is InputKind.CONSTANT_TENSOR:
                out.append(ep.constants[s.target])
        return out

    def forward(self, *args, **kwargs):
        ep = self.__dict__["_ep"]
        tensors = user_tensors(ep, args, kwargs)
        self.__dict__["_checker"].check(tensors)
        outs = ep.graph_module(*self._state(), *tensors)
        return write_back(ep, self._get, tensors, outs)


def user_tensors(ep: ExportedProgram, args: tuple, kwargs: dict) -> list:
    """The tensor leaves of a call's (args, kwargs) in the program's input order (its pytree checked)."""
    try:
        leaves = ep.call_spec.in_spec.flatten_up_to((args, kwargs))
    except ValueError as e:
        raise TypeError(f"The exported program was called with inputs of a different structure than it was "
                        f"exported with ({e})") from None
    flat = [leaf for sub in leaves for leaf in pytree.tree_leaves(sub)]
    return [x for x in flat if isinstance(x, Tensor)]


def write_back(ep: ExportedProgram, get_state, tensors: list, outs) -> object:
    """Apply the graph's state and input updates (`get_state(fqn)` gives the tensor to write) and return
    the user outputs in the program's output pytree."""
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind is InputKind.USER_INPUT]
    n_mut = 0
    for spec, v in zip(ep.graph_signature.output_specs, outs):
        if v is None:                    # (unflatten: a preserved call wrote it itself)
            n_mut += spec.kind is not OutputKind.USER_OUTPUT
        elif spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION):
            with no_grad():
                get_state(spec.target).copy_(v)
            n_mut += 1
        elif spec.kind is OutputKind.USER_INPUT_MUTATION:
            with no_grad():
                tensors[user.index(spec.target)].copy_(v)
            n_mut += 1
    return ep.call_spec.out_spec.unflatten(outs[n_mut:])
