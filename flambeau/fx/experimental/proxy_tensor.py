"""make_fx: trace a function to an aten-level GraphModule by recording dispatched operators.

`make_fx(fn, tracing_mode="real"|"fake"|"symbolic")(*args)` runs `fn` under
`ProxyTorchDispatchMode`, a dispatch mode that records every operator reaching the dispatcher as
a call_function node whose target is the `Op` (`flambeau.ops.aten.add.Tensor`). Autograd sits
below the modes, so `flambeau.autograd.grad` called inside `fn` runs its derivative formulas
through the dispatcher and the backward ops are recorded too (the joint graph AOT autograd uses).

Tensors are matched to nodes by their array object (`Tensor._data`): op outputs have fresh arrays,
and the Tensor objects autograd makes for saved tensors or `detach()` share them. A tensor the
mode has never seen (a closure parameter, a tensor built without an op inside `fn`) becomes a
get_attr constant (`_tensor_constant0`, `_param_constant0`) stored on the GraphModule.

With "fake" the inputs are FakeTensors and operators run only their meta functions; "symbolic"
also makes input sizes SymInts, so one graph serves every size that satisfies the recorded guards
(`gm.meta["shape_env"]`). Every node's `meta["val"]` is a FakeTensor (or SymInt / Python value).
With `record_module_stack=True` (and `fn` a Module) every node also gets `meta["nn_module_stack"]`:
{call key: (fqn, module type name)} of the submodule calls it was recorded in, outermost first.
"""
from __future__ import annotations

import operator
from typing import Callable

from ... import _state
from ..._device import META
from ..._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from ..._tensor import Tensor
from ...nn.modules.module import Module
from ...nn.parameter import Parameter
from ...utils._python_dispatch import TorchDispatchMode
from .._symbolic_shapes import ShapeEnv, SymInt, sym_size, _sp
from ..graph import Graph
from ..graph_module import GraphModule
from ..node import Node
from ..._backends import MetaArray


class _Recorder:
    """The state of one make_fx trace: graph, tensor -> node map, constants, size sources."""

    def __init__(self, fake_mode: FakeTensorMode | None):
        self.graph = Graph()
        self.root = Module()
        self.fake_mode = fake_mode
        self._snap_mode = fake_mode or FakeTensorMode()
        self.data_to_node: dict = {}     # id(array) -> (array, node)
        self.sym_sources: dict = {}      # sympy.Symbol -> (placeholder node, dim)
        self._expr_nodes: dict = {}
        self._n_const = {"_tensor_constant": 0, "_param_constant": 0}

    # ---- tensors <-> nodes ----------------------------------------------------------------------
    def bind(self, t: Tensor, node: Node) -> None:
        self.data_to_node[id(t._data)] = (t._data, node)

    def fake_of(self, t: Tensor) -> Tensor:
        """A metadata-only copy for meta["val"]."""
        if t._device.type == "meta":
            return t
        m = self._snap_mode
        f = Tensor._make(_meta_array_of(t), META, t._dtype)
        m._register(f, t.device)
        return f

    def node_of(self, t: Tensor) -> Node:
        hit = self.data_to_node.get(id(t._data))
        if hit is not None:
            return hit[1]
        if isinstance(t, FakeTensor) or t._device.type == "meta" and self.fake_mode is not None:
            raise RuntimeError(f"make_fx: a fake tensor of shape {list(t.shape)} was not produced by a traced "
                               "operation (was it created under another FakeTensorMode?)")
        return self.constant(t)

    def constant(self, t: Tensor) -> Node:
        prefix = "_param_constant" if isinstance(t, Parameter) else "_tensor_constant"
        name = f"{prefix}{self._n_const[prefix]}"
        self._n_const[prefix] += 1
        if isinstance(t, Parameter):
            setattr(self.root, name, t)
        else:
            self.root.register_buffer(name, t)
        node = self.graph.get_attr(name)
        self.bind(t, node)
        if self.fake_mode is not None:
            fake = self.fake_mode.from_tensor(t)
            self.bind(fake, node)
            node.meta["val"] = fake
        else:
            node.meta["val"] = self.fake_of(t)
        return node

    # ---- symbolic sizes -------------------------------------------------------------------------
    def note_sizes(self, node: Node, t: Tensor) -> None:
        for d, s in enumerate(t.shape):
            if isinstance(s, SymInt) and s.expr.is_Symbol and s.expr not in self.sym_sources:
                self.sym_sources[s.expr] = (node, d)

    def expr_node(self, e):
        """A node (or int) computing the sympy expression `e` from the inputs' sizes at run time."""
        if e.is_Integer:
            return int(e)
        hit = self._expr_nodes.get(e)
        if hit is not None:
            return hit
        sp = _sp()
        if e.is_Symbol:
            src = self.sym_sources.get(e)
            if src is None:
                raise RuntimeError(f"make_fx: size symbol {e} has no input it can be read from")
            n = self.graph.call_function(sym_size, src)
        elif e.is_Add or e.is_Mul:
            fn = operator.add if e.is_Add else operator.mul
            terms = [self.expr_node(a) for a in e.args]
            n = terms[0]
            for x in terms[1:]:
                n = self.graph.call_function(fn, (n, x))
        elif isinstance(e, sp.floor):
            num, den = sp.fraction(sp.together(e.args[0]))     # floor(s/2 - 1/2) -> (s - 1) // 2
            n = self.graph.call_function(operator.floordiv, (self.expr_node(num), self.expr_node(den)))
        elif isinstance(e, sp.Mod):
            n = self.graph.call_function(operator.mod, tuple(self.expr_node(a) for a in e.args))
        elif e.is_Pow and e.args[1].is_Integer and e.args[1] > 0:
            n = self.graph.call_function(operator.pow, (self.expr_node(e.args[0]), int(e.args[1])))
        else:
            raise NotImplementedError(f"make_fx: cannot compute the size expression {e} in the graph")
        if isinstance(n, Node):
            n.meta["val"] = SymInt(e, self.fake_mode.shape_env)
        self._expr_nodes[e] = n
        return n

    # ---- arguments ----------------------------------------------------------------------------
    def to_arg(self, a):
        """A node argument for a runtime value: tensors -> nodes, SymInts -> size nodes."""
        if isinstance(a, Tensor):
            return self.node_of(a)
        if isinstance(a, SymInt):
            return self.expr_node(a.expr)
        t = type(a)
        if t is list or t is tuple:
            return t(self.to_arg(x) for x in a)
        if isinstance(a, tuple) and not hasattr(a, "_fields"):
            return tuple(self.to_arg(x) for x in a)
        if t is dict:
            return {k: self.to_arg(v) for k, v in a.items()}
        return a

    def track(self, out, node: Node) -> None:
        """Bind op outputs to `node` (multiple outputs to getitem nodes) and set meta['val']."""
        if isinstance(out, Tensor):
            self.bind(out, node)
            node.meta["val"] = self.fake_of(out)
        elif isinstance(out, (tuple, list)):
            vals = []
            for i, o in enumerate(out):
                if isinstance(o, Tensor):
                    g = self.graph.call_function(operator.getitem, (node, i))
                    self.bind(o, g)
                    g.meta["val"] = self.fake_of(o)
                    vals.append(g.meta["val"])
                else:
                    vals.append(o)
            node.meta["val"] = tuple(vals)
        else:
            node.meta["val"] = out


def _meta_array_of(t: Tensor):
    return MetaArray(tuple(t.shape), t._dtype.np, t.stride(), t.storage_offset())


def _meta_to(dev, a):
    if a is META or (type(a) is type(META) and a.type == "meta"):
        return dev
    if type(a) in (list, tuple):
        return type(a)(_meta_to(dev, x) for x in a)
    return a


class ProxyTorchDispatchMode(TorchDispatchMode):
    """Records each dispatched operator into the recorder's graph, then runs it below this mode."""

    def __init__(self, recorder: _Recorder, decomposition_table: dict | None = None):
        super().__init__()
        self.recorder = recorder
        self.decomposition_table = decomposition_table or {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        decomp = self.decomposition_table.get(func)
        if decomp is not None:
            _state.push_mode(self)
            try:
                return decomp(*args, **kwargs)
            finally:
                _state.pop_mode()
        rec = self.recorder
        node_args = rec.to_arg(tuple(args))
        node_kwargs = rec.to_arg(dict(kwargs))
        out = func(*args, **kwargs)
        if rec.fake_mode is not None and isinstance(out, FakeTensor):
            # derivatives sometimes pass device=meta (autograd's metadata of a fake tensor): record the real one
            node_args = _meta_to(out.fake_device, node_args)
            node_kwargs = {k: _meta_to(out.fake_device, v) for k, v in node_kwargs.items()}
        node = rec.graph.call_function(func, node_args, node_kwargs)
        rec.track(out, node)
        return out


class _ModuleCalls:
    """Forward (pre-)hooks on every submodule of `root` that stamp the nodes recorded since the last
    hook with the module calls open at the time (`nn_module_stack`, PyTorch's metadata)."""

    def __init__(self, root: Module, graph: Graph):
        self.graph, self.stack, self.counts, self.stamped = graph, [], {}, set()
        self.handles = []
        for fqn, m in root.named_modules():
            if fqn:
                self.handles.append(m.register_forward_pre_hook(lambda mod, args, fqn=fqn: self._enter(fqn, mod)))
                self.handles.append(m.register_forward_hook(lambda mod, args, out: self._exit()))

    def _stamp(self) -> None:
        for n in reversed(self.graph.nodes):
            if n in self.stamped:
                break
            self.stamped.add(n)
            if n.op != "placeholder":
                n.meta["nn_module_stack"] = dict(self.stack)

    def _enter(self, fqn: str, m: Module) -> None:
        self._stamp()
        k = self.counts.get(fqn, 0)
        self.counts[fqn] = k + 1
        cls = type(m)
        self.stack.append((fqn if k == 0 else f"{fqn}@{k}", (fqn, f"{cls.__module__}.{cls.__qualname__}")))

    def _exit(self) -> None:
        self._stamp()
        self.stack.pop()

    def close(self) -> None:
        self._stamp()
        for h in self.handles:
            h.remove()


def make_fx(f: Callable, decomposition_table: dict | None = None, tracing_mode: str = "real",
            _allow_non_fake_inputs: bool = False, *, pre_dispatch: bool = False,
            record_module_stack: bool = False, _allow_fake_constant: bool = False,
            _error_on_data_dependent_ops: bool = True) -> Callable:
    """`make_fx(f, tracing_mode=...)(*args)` -> GraphModule of the operators `f` dispatches."""
    if tracing_mode not in ("real", "fake", "symbolic"):
        raise AssertionError(f"Unexpected tracing type: {tracing_mode}")

    def wrapped(*args):
        fake_mode = None
        if tracing_mode != "real":
            fake_mode = FakeTensorMode(allow_non_fake_inputs=True,
                                       shape_env=ShapeEnv() if tracing_mode == "symbolic" else None)
        rec = _Recorder(fake_mode)
        inner = []
        for i, a in enumerate(args):
            ph = rec.graph.placeholder(f"arg{i}_1")
            if isinstance(a, Tensor):
                t = a if fake_mode is None else fake_mode.from_tensor(
                    a, symbolic=tracing_mode == "symbolic", source=str(i))
                rec.bind(t, ph)
                ph.meta["val"] = rec.fake_of(t)
                rec.note_sizes(ph, t)
                inner.append(t)
            else:
                ph.meta["val"] = a
                inner.append(a)
        mode = ProxyTorchDispatchMode(rec, decomposition_table)
        calls = _ModuleCalls(f, rec.graph) if record_module_stack and isinstance(f, Module) else None
        try:
            if fake_mode is not None:
                with fake_mode, mode:
                    out = f(*inner)
            else:
                with mode:
                    out = f(*inner)
        finally:
            if calls is not None:
                calls.close()
        rec.graph.output(rec.to_arg(out))
        gm = GraphModule(rec.root, rec.graph)
        if fake_mode is not None:
            gm.meta["fake_mode"] = fake_mode
            if fake_mode.shape_env is not None:
                gm.meta["shape_env"] = fake_mode.shape_env
        return gm
    return wrapped


def get_isolated_graphmodule(func: Callable, args, kwargs, tracing_mode: str = "real") -> GraphModule:
    return make_fx(lambda *a: func(*a, **kwargs), tracing_mode=tracing_mode)(*args)
