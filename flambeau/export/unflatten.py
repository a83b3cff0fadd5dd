"""`flambeau.export.unflatten(ep)`: the module hierarchy of an ExportedProgram rebuilt (PyTorch's).

Export records, on every node, the module calls it was traced in (`meta["nn_module_stack"]`,
outermost first; `_trace._ModuleStack`). `unflatten` cuts the flat graph along those calls: each run
of consecutive nodes inside one call of a submodule becomes that submodule's own graph, called from
its parent's graph with `call_module`. Values a call reads from outside are its placeholders, values
read after it are its outputs (a tuple when several). Parameters, buffers and tensor attributes are
registered under their original fully qualified names, so `named_parameters()` and `state_dict()`
match the original module, and the subgraphs of `cond`/`map` under the module whose code called them
(`blk.true_graph_0`, as PyTorch); a submodule's graph reads its own state with `get_attr`, state of another
branch (a tied weight) comes in as an input.

The result, an `UnflattenedModule`, takes the original (nested) inputs (or, through a
`FlatArgsAdapter`, inputs of another structure), checks their shapes as `ep.module()` does, writes buffer updates back and returns the original output structure. Every
module of the hierarchy is an `InterpreterModule` (a GraphModule: `.graph`, `.code`, readable).

A module called more than once (stack keys `fqn`, `fqn@1`, ...) gets a graph for each call, as
PyTorch's: a later call whose graph equals an earlier call's (same ops, targets and argument wiring)
calls that module again; otherwise it becomes a copy `name@k` registered beside the original in the
caller's module, holding that call's graph and sharing the original's parameters, buffers and
children (so `state_dict()` lists them under `name@k.` as well, `named_parameters()` once). The
metadata survives `run_decompositions` (each decomposed node keeps its module stack) and save/load;
nodes without it stay in the root graph.

A call of a module named in export's `preserve_module_call_signature` keeps its original calling
convention instead (`_call_preserved`): its graph takes the original positional and keyword arguments,
flattens them against the exported pytree, writes its own state updates (`_write_state`) and returns
the original result's structure; the caller builds the arguments from its values and reads the
result's leaves back. So `u.sub = other_module` (an eager module of the same signature) replaces it, as
PyTorch's. A preserved module called several times is an `InterpreterModuleDispatcher` (each call runs
the next call's graph). A value crossing the boundary other than through the signature is a size (read
again from a tensor the graph has), state the call updated (read again from the module), or an error.
"""
from __future__ import annotations

import abc
import operator

from ..fx.graph import Graph
from ..fx.graph_module import GraphModule
from ..fx.node import map_arg
from ..nn.modules.module import Module
from ..nn.parameter import Parameter
from .._tensor import Tensor
from ..autograd.grad_mode import no_grad
from ..fx._symbolic_shapes import SymInt, sym_size
from ..utils import _pytree as pytree
from .exported_program import ExportedProgram, _InputChecker, user_tensors, write_back
from .graph_signature import InputKind, SymIntArgument, TensorArgument

__all__ = ["unflatten", "UnflattenedModule", "InterpreterModule", "InterpreterModuleDispatcher", "FlatArgsAdapter"]

STACK = "nn_module_stack"


class InterpreterModule(GraphModule):
    """One module of an unflattened program: its state and children, and the graph of its call."""

    def __init__(self, graph: Graph | None = None):
        super().__init__({}, Graph())
        if graph is not None:
            self.graph = graph


class InterpreterModuleDispatcher(Module):
    """A preserved module called several times with different graphs (PyTorch's): each call runs the next
    call's InterpreterModule, wrapping around after the last. Its children, parameters and buffers are the
    first call's (all calls share them)."""

    def __init__(self, call_modules: list):
        super().__init__()
        first = call_modules[0]
        self._modules, self._parameters, self._buffers = first._modules, first._parameters, first._buffers
        self._non_persistent_buffers_set = first._non_persistent_buffers_set
        self.__dict__["_call_modules"] = list(call_modules)
        self.__dict__["_num_calls"] = 0

    def call_modules(self) -> list:
        return list(self.__dict__["_call_modules"])

    def forward(self, *args, **kwargs):
        mods = self.__dict__["_call_modules"]
        k = self.__dict__["_num_calls"]
        self.__dict__["_num_calls"] = (k + 1) % len(mods)
        try:
            return mods[k](*args, **kwargs)
        except Exception:
            self.__dict__["_num_calls"] = 0
            raise

    def print_readable(self, print_output: bool = True) -> str:
        return "\n".join(m.print_readable(print_output) for m in self.__dict__["_call_modules"])


def _flatten_to_spec(tree, spec) -> list:
    """The leaves of a preserved call's `(args, kwargs)` or result, in the exported pytree's order (a
    module swapped in must keep that structure)."""
    leaves, got = pytree.tree_flatten(tree)
    if got != spec:
        raise TypeError(f"unflatten: a preserved module's call has the structure {got}, but the program was "
                        f"exported with {spec}; a module swapped in must take and return the same structure")
    return leaves


def _write_state(state: Tensor, value: Tensor) -> None:
    """A preserved module's buffer update, done inside its own graph (so a module swapped in owns its own)."""
    with no_grad():
        state.copy_(value)


class FlatArgsAdapter(abc.ABC):
    """PyTorch's `torch.export.FlatArgsAdapter`: turns the flat inputs of a call whose structure differs
    from the exported one (`input_spec`) into the exported program's flat inputs (`target_spec`)."""

    @abc.abstractmethod
    def adapt(self, target_spec: pytree.TreeSpec, input_spec: pytree.TreeSpec, input_args: list,
              metadata: dict | None = None, obj=None) -> list:
        """The flat inputs for `target_spec` (may change `input_args`)."""

    def get_flat_arg_paths(self) -> list:
        """The paths of the adapted flat inputs (names for error messages); none by default."""
        return []


class UnflattenedModule(InterpreterModule):
    """The root of an unflattened program (see module docstring)."""

    def __init__(self, ep: ExportedProgram, flat_args_adapter: FlatArgsAdapter | None = None):
        super().__init__()
        self.__dict__["_ep"] = ep
        self.__dict__["_checker"] = _InputChecker(ep)
        self.__dict__["flat_args_adapter"] = flat_args_adapter
        self.__dict__["adapted"] = False

    def __call__(self, *args, **kwargs):
        ep = self.__dict__["_ep"]
        tensors = self._user_tensors(ep, args, kwargs)
        self.__dict__["_checker"].check(tensors)
        return write_back(ep, self.get_submodule_state, tensors, self.forward(*tensors))

    def _user_tensors(self, ep: ExportedProgram, args: tuple, kwargs: dict) -> list:
        """The call's tensor inputs in the program's order; inputs of another structure are adapted by
        the `flat_args_adapter` (PyTorch's TypeErrors without one, or when it returns too few or many)."""
        try:
            return user_tensors(ep, args, kwargs)
        except TypeError:
            pass
        target = ep.call_spec.in_spec
        flat, spec = pytree.tree_flatten((args, kwargs))
        if not self.__dict__["adapted"]:              # (printed as PyTorch's, until a call was adapted)
            print(f"Input treespec does not match with exported module's: \nInput treespec: {spec}. ",
                  f"Exported module treespec: {target}")
            print("Adapting flat arg to match exported module's treespec")
        adapter = self.__dict__["flat_args_adapter"]
        if adapter is None:
            raise TypeError("There is no flat args adapter specified. Are you sure you are calling this "
                            "with the right arguments? ")
        flat = adapter.adapt(target_spec=target, input_spec=spec, input_args=flat, metadata=self.meta, obj=args)
        if len(flat) != target.num_leaves:
            raise TypeError(f"Flat args adaption failed, number of args mismatch Adapted: {len(flat)} \n"
                            f"Exported module: {target.num_leaves}")
        self.__dict__["adapted"] = True
        return [x for x in flat if isinstance(x, Tensor)]

    def get_submodule_state(self, fqn: str):
        """The parameter or buffer at `fqn`."""
        *path, leaf = fqn.split(".")
        m = self.get_submodule(".".join(path)) if path else self
        return m._parameters[leaf] if leaf in m._parameters else m._buffers[leaf]


def _module_at(root: Module, fqn: str) -> Module:
    m = root
    for p in fqn.split(".") if fqn else ():
        if p not in m._modules:
            m._modules[p] = InterpreterModule()
        m = m._modules[p]
    return m


def _place_state(root: UnflattenedModule, ep: ExportedProgram) -> dict:
    """Register every parameter, buffer and constant at its FQN; {placeholder name: FQN}."""
    where = {}
    for s in ep.graph_signature.input_specs:
        if s.kind is InputKind.USER_INPUT:
            continue
        where[s.arg.name] = s.target
        owner, _, leaf = s.target.rpartition(".")
        m = _module_at(root, owner)
        if s.kind is InputKind.PARAMETER:
            p = ep.state_dict[s.target]
            m.register_parameter(leaf, p if isinstance(p, Parameter) else Parameter(p))
        elif s.kind is InputKind.BUFFER:
            persistent = s.persistent is not False
            m.register_buffer(leaf, ep.state_dict[s.target] if persistent else ep.constants[s.target],
                              persistent=persistent)
        else:
            m.__dict__[leaf] = ep.constants[s.target]
    targets = set(where.values())
    for alias, target in ep.state_aliases.items():       # a tied weight under its other names too
        if target in targets:
            owner, _, leaf = alias.rpartition(".")
            m = _module_at(root, owner)
            t = root.get_submodule_state(target)
            if isinstance(t, Parameter):
                m.register_parameter(leaf, t)
            else:
                m.register_buffer(leaf, t)
    return where


def _inside(fqn: str, owner: str) -> bool:
    return not owner or fqn.startswith(owner + ".")


def _relative(fqn: str, owner: str) -> str:
    return fqn[len(owner) + 1:] if owner else fqn


def _attach(parent: Module, name: str, child: Module) -> None:
    """Register `child` at the dotted `name` under `parent` (missing levels become empty modules)."""
    *path, leaf = name.split(".")
    _module_at(parent, ".".join(path))._modules[leaf] = child


def _graph_key(graph: Graph) -> list:
    """What makes two call graphs interchangeable: each node's op, target and argument wiring (node
    names and placeholder targets aside), as PyTorch's `_check_graph_equivalence`."""
    index: dict = {}
    key = []
    for i, n in enumerate(graph.nodes):
        wire = map_arg((n.args, n.kwargs), lambda a: f"%{index[a]}")
        key.append((n.op, "" if n.op in ("placeholder", "output") else str(n.target), repr(wire)))
        index[n] = i
    return key


def _share_state(copy: Module, original: Module, graph: Graph) -> None:
    """Give `copy` (a later call's module) every attribute its graph reads and every child of
    `original`: the same Parameter, buffer and module objects, not clones."""
    for n in graph.find_nodes(op="get_attr"):
        *path, leaf = n.target.split(".")
        m, o = copy, original
        for p in path:
            if p not in m._modules:
                m._modules[p] = o._modules[p]
            m, o = m._modules[p], o._modules[p]
        if m is o or leaf in m.__dict__ or leaf in m._modules:   # (a copy's own pytree specs and calls)
            continue
        if leaf in o._parameters:
            m.register_parameter(leaf, o._parameters[leaf])
        elif leaf in o._buffers:
            m.register_buffer(leaf, o._buffers[leaf], persistent=leaf not in o._non_persistent_buffers_set)
        elif leaf in o._modules:             # a cond/map subgraph
            m._modules[leaf] = o._modules[leaf]
        else:
            m.__dict__[leaf] = getattr(o, leaf)
    for name, child in original._modules.items():   # and all the original's children, as PyTorch's copies
        copy._modules.setdefault(name, child)


class _Builder:
    """Cuts the program's graph along its module calls (see module docstring)."""

    def __init__(self, ep: ExportedProgram, root: UnflattenedModule, state: dict):
        self.ep, self.root = ep, root
        self.attr_of: dict = {}            # original node -> the FQNs (a tied weight has several) it reads
        self.versions: dict = {}           # fqn -> [(graph key, module, call index)] of its distinct calls
        nodes = list(ep.graph.nodes)
        for n in nodes:
            if n.op == "placeholder" and n.name in state:
                target = state[n.name]
                self.attr_of[n] = [target] + [a for a, t in ep.state_aliases.items() if t == target]
            elif n.op == "get_attr":         # a cond/map subgraph: an attribute of the module that called it
                calls = self._calls(n)
                owner = calls[-1][1][0] if calls else ""
                self.attr_of[n] = [f"{owner}.{n.target}" if owner else n.target]
                setattr(_module_at(root, owner), n.target, getattr(ep.graph_module, n.target))
        self.body = [n for n in nodes if n.op not in ("placeholder", "output", "get_attr")]
        self.position = {n: i for i, n in enumerate(nodes)}
        self._init_preserved(nodes)

    def _init_preserved(self, nodes: list) -> None:
        """The calls of `preserve_module_call_signature`'s modules: their signatures' values, the nodes
        computed inside them that only they see (`hidden`), and the state updates they make."""
        by_name = {n.name: n for n in nodes}
        self.preserved: dict = {}          # call key -> (signature, input values, output values)
        for e in self.ep.module_call_graph[1:]:
            if e.signature is not None:
                s = e.signature
                vals = [[by_name[a.name] if isinstance(a, (TensorArgument, SymIntArgument)) else a.value
                         for a in args] for args in (s.inputs, s.outputs, s.state_writes.values())]
                self.preserved[e.fqn] = (s, *vals)
        outs = {key: {v for v in p[2] if hasattr(v, "op")} for key, p in self.preserved.items()}
        self.hidden: dict = {}             # node -> depth of the outermost preserved call hiding it
        for n in self.body:
            depths = [d for d, (key, _) in enumerate(self._calls(n)) if key in outs and n not in outs[key]]
            if depths:
                self.hidden[n] = depths[0]
        self.written = {v: fqn for s, _, _, writes in self.preserved.values()   # state values a preserved
                        for fqn, v in zip(s.state_writes, writes) if hasattr(v, "op")}  # call writes itself
        self.dispatch: dict = {}           # fqn -> {"calls": [module per call], "sites": [(parent, name)]}

    @staticmethod
    def _calls(n) -> list:
        return list(n.meta.get(STACK, {}).items())

    def build(self) -> Graph:
        g = Graph()
        env = {}
        for n in self.ep.graph.find_nodes(op="placeholder"):
            if n not in self.attr_of:
                env[n] = g.node_copy(n)
        self._emit(self.body, 0, g, env, "", self.root)
        out = self.ep.graph.output_node()
        g.output(tuple(None if a in self.written else map_arg(a, lambda x: self._lookup(x, g, env, ""))
                       for a in out.args[0]))
        for info in self.dispatch.values():
            calls = info["calls"]
            if len(calls) > 1:             # a preserved module called again: a dispatcher, as PyTorch's
                disp = InterpreterModuleDispatcher(calls)
                for parent, name in info["sites"]:
                    _attach(parent, name, disp)
        return g

    def _lookup(self, a, g: Graph, env: dict, owner: str):
        if a not in env:                   # state or an attribute inside this module's subtree
            fqn = next((f for f in self.attr_of.get(a, ()) if _inside(f, owner)), None)
            if fqn is None:
                return self._outside(a, g, env, owner)
            node = g.get_attr(_relative(fqn, owner))
            node.meta = dict(a.meta)
            env[a] = node
        return env[a]

    def _outside(self, a, g: Graph, env: dict, owner: str):
        """A value this graph can't be handed (it crosses a preserved call's boundary): a size is read
        again from a tensor the graph has; anything else is an error naming the call."""
        target = self.written.get(a)
        if target is not None and _inside(target, owner):     # state a preserved call updated: read it again
            env[a] = g.get_attr(_relative(target, owner))
            env[a].meta = dict(a.meta)
            return env[a]
        val = a.meta.get("val")
        if isinstance(val, SymInt):
            for orig, new in list(env.items()):
                t = orig.meta.get("val")
                for d, size in enumerate(t.shape if isinstance(t, Tensor) else ()):
                    if isinstance(size, SymInt) and size.expr == val.expr:
                        env[a] = g.call_function(sym_size, (new, d))
                        env[a].meta = dict(a.meta)
                        return env[a]
        inside = [k for k, _ in self._calls(a) if k in self.preserved]
        where = f"the module {owner!r}" if owner else "the root module"
        if inside:
            raise RuntimeError(f"unflatten: {where} reads {a.name}, a value computed inside the preserved call "
                               f"{inside[-1]!r} that is not one of its outputs (does the call write its input or "
                               "another module's state in place?); export without preserving it")
        raise RuntimeError(f"unflatten: the preserved call of {owner!r} reads {a.name}, a value from outside its "
                           "inputs (another module's state or an outer tensor); pass it as an argument or export "
                           "without preserving it")

    def _groups(self, nodes: list, depth: int) -> list:
        """Consecutive runs of `nodes`: (call key, fqn, nodes) for a submodule call, (None, None, [node])
        for a node of this level."""
        out = []
        for n in nodes:
            calls = self._calls(n)
            if len(calls) <= depth:
                out.append((None, None, [n]))
                continue
            key, (fqn, _) = calls[depth]
            if out and out[-1][0] == key:
                out[-1][2].append(n)
            else:
                out.append((key, fqn, [n]))
        return out

    def _emit(self, nodes: list, depth: int, g: Graph, env: dict, owner: str, module: Module) -> None:
        """Emit `nodes` into `g`, the graph of `module` (at `owner`); submodule calls become calls."""
        for key, fqn, group in self._groups(nodes, depth):
            if key is not None and _inside(fqn, owner):
                self._call(key, fqn, group, depth, g, env, owner, module)
                continue
            for n in group:                  # this level's nodes (or a call of a module outside `owner`)
                env[n] = g.node_copy(n, lambda a: self._lookup(a, g, env, owner))

    def _call(self, key: str, fqn: str, group: list, depth: int, g: Graph, env: dict, owner: str,
              parent: Module) -> None:
        if key in self.preserved:
            return self._call_preserved(key, fqn, group, depth, g, env, owner, parent)
        members = set(group)
        inputs = []
        for n in group:
            for a in n.all_input_nodes:
                if a in members or a in inputs:
                    continue
                if a in self.attr_of and any(_inside(f, fqn) for f in self.attr_of[a]):
                    continue                 # read inside with get_attr
                inputs.append(a)
        outputs = [n for n in group if self.hidden.get(n, 0) <= depth and any(u not in members for u in n.users)]
        index = int(key[len(fqn) + 1:]) if key != fqn else 0
        versions = self.versions.setdefault(fqn, [])
        original = _module_at(self.root, fqn)
        child = original if not versions else InterpreterModule()
        sub = Graph()
        sub_env = {}
        for a in inputs:
            ph = sub.placeholder(a.name)
            ph.meta = dict(a.meta)
            sub_env[a] = ph
        self._emit(group, depth + 1, sub, sub_env, fqn, child)
        result = [sub_env[o] for o in outputs]
        sub.output(result[0] if len(result) == 1 else tuple(result))
        graph_key = _graph_key(sub)
        same = next((v for v in versions if v[0] == graph_key), None)
        if same is None:
            child.graph = sub
            if child is not original:
                _share_state(child, original, sub)
            same = (graph_key, child, index)
            versions.append(same)
        name = _relative(fqn, owner) + (f"@{same[2]}" if same[2] else "")
        _attach(parent, name, same[1])
        call = g.call_module(name, tuple(self._lookup(a, g, env, owner) for a in inputs))
        if len(outputs) == 1:
            env[outputs[0]] = call
            call.meta = dict(outputs[0].meta)
            return
        for k, o in enumerate(outputs):
            item = g.call_function(operator.getitem, (call, k))
            item.meta = dict(o.meta)
            env[o] = item


    def _call_preserved(self, key: str, fqn: str, group: list, depth: int, g: Graph, env: dict, owner: str,
                        parent: Module) -> None:
        """A preserved call: the child's graph takes the original `(args, kwargs)` and returns the original
        result's structure (so an eager module with that signature can replace it); the caller builds the
        arguments from its values and reads the result's leaves back (PyTorch's calling convention)."""
        sig, ins, outs, writes = self.preserved[key]
        info = self.dispatch.setdefault(fqn, {"calls": [], "sites": []})
        original = _module_at(self.root, fqn)
        child = original if not info["calls"] else InterpreterModule()
        args_spec, kwargs_spec = sig.in_spec.children_specs
        kw_names = list(kwargs_spec.context)
        sub = Graph()
        pos = tuple(sub.placeholder(f"_positional_arg_{i}") for i in range(args_spec.num_children))
        kws = {k: sub.placeholder(k) for k in kw_names}
        flat = sub.call_function(_flatten_to_spec, ((pos, kws), sub.get_attr(_spec_attr(child, sig.in_spec))))
        sub_env: dict = {}
        for i, v in enumerate(ins):
            if hasattr(v, "op") and v not in sub_env:
                sub_env[v] = sub.call_function(operator.getitem, (flat, i))
                sub_env[v].meta = dict(v.meta)
        self._emit(group, depth + 1, sub, sub_env, fqn, child)
        for target, v in zip(sig.state_writes, writes):      # its own state's updates, by its own graph
            if hasattr(v, "op"):
                sub.call_function(_write_state, (sub.get_attr(_relative(target, fqn)),
                                                 self._lookup(v, sub, sub_env, fqn)))
        result = [self._lookup(v, sub, sub_env, fqn) if hasattr(v, "op") else v for v in outs]
        sub.output(sub.call_function(pytree.tree_unflatten, (result, sub.get_attr(_spec_attr(child, sig.out_spec)))))
        graph_key = (_graph_key(sub), repr(sig.in_spec), repr(sig.out_spec))
        same = next((m for k, m in info.get("keys", []) if k == graph_key), None)
        if same is None:
            specs = {n.target: getattr(child, n.target) for n in sub.find_nodes(op="get_attr")
                     if n.target.startswith("_spec_")}
            child.graph = sub
            if child is not original:
                _share_state(child, original, sub)
            child.__dict__.update(specs)
            info.setdefault("keys", []).append((graph_key, child))
            same = child
        info["calls"].append(same)
        name = _relative(fqn, owner)
        info["sites"].append((parent, name))
        _attach(parent, name, same)
        leaves = [self._lookup(v, g, env, owner) if hasattr(v, "op") else v for v in ins]
        tree = g.call_function(pytree.tree_unflatten, (leaves, g.get_attr(_spec_attr(parent, sig.in_spec))))
        args, kwargs = (g.call_function(operator.getitem, (tree, i)) for i in (0, 1))
        call = g.call_module(name, tuple(g.call_function(operator.getitem, (args, i)) for i in range(len(pos))),
                             {k: g.call_function(operator.getitem, (kwargs, k)) for k in kw_names})
        flat_out = g.call_function(_flatten_to_spec, (call, g.get_attr(_spec_attr(parent, sig.out_spec))))
        for i, v in enumerate(outs):
            if hasattr(v, "op"):
                env[v] = g.call_function(operator.getitem, (flat_out, i))
                env[v].meta = dict(v.meta)


def _spec_attr(module: Module, spec) -> str:
    """A new attribute `_spec_<i>` of `module` holding a pytree spec (read by the graph with get_attr)."""
    i = 0
    while f"_spec_{i}" in module.__dict__:
        i += 1
    module.__dict__[f"_spec_{i}"] = spec
    return f"_spec_{i}"


def unflatten(module: ExportedProgram, flat_args_adapter: FlatArgsAdapter | None = None) -> UnflattenedModule:
    """`torch.export.unflatten`: the module hierarchy of `module` rebuilt (see module docstring);
    `flat_args_adapter` adapts calls whose input structure differs from the exported one."""
    if not isinstance(module, ExportedProgram):
        raise TypeError(f"unflatten expects an ExportedProgram, got {type(module).__name__}")
    root = UnflattenedModule(module, flat_args_adapter)
    root.training = False
    for entry in module.module_call_graph[1:]:          # the original's module order (not later calls)
        if "@" not in entry.fqn:
            _module_at(root, entry.fqn)
    state = _place_state(root, module)
    root.graph = _Builder(module, root, state).build()
    return root
