"""The state one translation builds: the FX graph, its inputs, guards, side effects; and the compiled entry.

`OutputGraph` records tensor operations as nodes (`call_in_graph`, `call_module`), computing each
output's metadata by running the operation on fake tensors under a `FakeTensorMode` (with a
`ShapeEnv` when some sizes are dynamic). Tensors read from the frame become placeholders with a
TENSOR_MATCH guard; parameters and buffers become get_attr nodes on the graph's root.

When the frame returns (`compile_return`) or breaks (`graph_break`), `_finish` chooses the graph's
outputs (everything the rest of the program will see), gives the GraphModule to the backend,
generates the entry function (graph call, side-effect replay, the return value or the jump into
the break code) and the guard function, and stores them as `self.result`.
"""
from __future__ import annotations

import operator
import types
from inspect import CO_VARARGS, CO_VARKEYWORDS

from .. import _state
from .._code_cache import compile_source
from .._backends import MetaArray, contiguous_strides
from .._device import META
from .._tensor import Tensor
from ..fx.graph import Graph
from ..fx.graph_module import GraphModule
from ..fx._symbolic_shapes import ShapeEnv, SymInt, expr_to_python
from .._subclasses.fake_tensor import FakeTensorMode
from .._counters import counters, record_fallback
from ..autograd.function import autograd_function_apply
from .autograd_function import NotTraceable, trace_function
from . import _logging, bytecode as bc, config, resume
from .codegen import EntryCodegen
from .exc import BackendCompilerFailed, Unsupported, SkipFrame
from .guards import GuardSet, GlobalSource, Source, graph_input_name, local_name
from .variables import TensorVariable, SymNodeVariable, ConstantVariable, NULL, TupleVariable, ListVariable
from .variables.base import VariableTracker
from .variables.tensor import np_wrappers
from .variables.torch import _set_grad_enabled, _enter_autocast, _exit_autocast, GradModeExitVariable
from .repro.after_dynamo import call_backend
from .backends.distributed import for_active_ddp
from ..nn.parameter import UninitializedParameter
from .repro.debug_utils import AccuracyError
from .variables.containers import DictVariable, SetVariable, SliceVariable
from .variables import wrap_constant_like
from .variables.functions import UserFunctionVariable, UserMethodVariable, NestedUserFunctionVariable
from .variables.nn_module import NNModuleVariable, is_leaf_module
from .utils import is_disabled

_STATE_FNS = (_set_grad_enabled, _enter_autocast, _exit_autocast)


class SideEffects:
    """Writes the traced code made to objects that outlive the frame, replayed in order after the graph."""

    def __init__(self):
        self.attrs: dict = {}        # (id(obj tracker), name) -> (obj tracker, name, value tracker)
        self.globals_: dict = {}     # (id(globals), name) -> (globals dict, name, value)
        self.cells: dict = {}        # id(cell) -> (RealCellVariable, value)
        self.containers: list = []   # mutated lists/dicts/sets that have a source

    def store_attr(self, obj, name, value):
        self.attrs.pop((id(obj), name), None)
        self.attrs[(id(obj), name)] = (obj, name, value)

    def pending_attr(self, obj, name):
        hit = self.attrs.get((id(obj), name))
        return hit[2] if hit is not None else None

    def store_global(self, g, name, value):
        self.globals_[(id(g), name)] = (g, name, value)

    def pending_global(self, g, name):
        hit = self.globals_.get((id(g), name))
        return hit[2] if hit is not None else None

    def store_cell(self, cell_vt, value):
        self.cells[id(cell_vt.cell)] = (cell_vt, value)

    def pending_cell(self, cell_vt):
        hit = self.cells.get(id(cell_vt.cell))
        return hit[1] if hit is not None else None

    def note_container(self, vt):
        if vt.source is not None and all(c is not vt for c in self.containers):
            self.containers.append(vt)

    def empty(self) -> bool:
        return not (self.attrs or self.globals_ or self.cells or self.containers)

    def codegen(self, cg: EntryCodegen, output) -> None:
        for vt in self.containers:
            target = vt.source.expr
            if isinstance(vt, ListVariable):
                cg.statements.append(f"{target}[:] = [{', '.join(cg.reconstruct(x) for x in vt.items)}]")
            elif isinstance(vt, DictVariable):
                body = ", ".join(f"{cg.const(k)}: {cg.reconstruct(v)}" for k, v in vt.items.items())
                cg.statements.append(f"{target}.clear(); {target}.update({{{body}}})")
            elif isinstance(vt, SetVariable):
                body = ", ".join(cg.reconstruct(v) for v in vt.items.values())
                cg.statements.append(f"{target}.clear(); {target}.update([{body}])")
        for obj, name, value in self.attrs.values():
            cg.statements.append(f"setattr({cg.reconstruct(obj)}, {name!r}, {cg.reconstruct(value)})")
        for g, name, value in self.globals_.values():
            cg.statements.append(f"{cg.const(g)}[{name!r}] = {cg.reconstruct(value)}")
        for cell_vt, value in self.cells.values():
            cg.statements.append(f"{cell_vt.source.expr} = {cg.reconstruct(value)}")


class CompiledEntry:
    """One cache entry: its guard function and the entry to call when the guards hold."""
    __slots__ = ("guard", "entry", "guards", "guard_src", "entry_src", "argnames", "globals", "__weakref__")

    def __init__(self, guard, entry, guards, guard_src, entry_src, argnames, globals_):
        self.guard = guard
        self.entry = entry
        self.guards = guards
        self.guard_src = guard_src
        self.entry_src = entry_src
        self.argnames = argnames
        self.globals = globals_


def _cause(reason):
    """The exception a graph break's reason is (its user stack goes into the skipped frame's report), or None."""
    return reason if isinstance(reason, BaseException) else None


def _hop_function(vt):
    """The Python callable a function argument of a higher-order op stands for, or None."""
    if isinstance(vt, NestedUserFunctionVariable):
        return vt.real_function()
    if isinstance(vt, UserMethodVariable) and hasattr(vt.obj, "value"):
        return types.MethodType(vt.value, vt.obj.value)
    if isinstance(vt, NNModuleVariable):
        return vt.value
    return None


class OutputGraph:
    def __init__(self, code, fn, f_globals, backend, *, one_graph: bool, dynamic, dynamic_dims: dict,
                 frame_sizes: dict,
                 compile_resume, compile_callee, stats):
        self.code = code
        self.fn = fn
        self.f_globals = f_globals
        self.backend = backend
        self.one_graph = one_graph
        self.dynamic = dynamic                 # True / False / None (automatic)
        self.dynamic_dims = dynamic_dims       # source name -> dims made symbolic by earlier recompiles
        self.frame_sizes = frame_sizes         # source name -> sizes seen (for automatic dynamic)
        self.compile_resume = compile_resume   # fn(code, globals, closure) -> compiled resume callable
        self.compile_callee = compile_callee   # fn(function or module) -> compiled callable (same settings)
        self.stats = stats
        self.graph = Graph()
        self.shape_env = ShapeEnv()
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=self.shape_env)
        self.guards = GuardSet()
        self.guards.grad_mode()
        self.side_effects = SideEffects()
        self.built: dict = {}
        self.inputs: list = []                 # (placeholder node, source, real tensor)
        self.moved_inputs: dict = {}           # node -> (device, fake, its version) of inputs copied to a device
        self.input_by_node: dict = {}
        self.attrs: dict = {}                  # get_attr target -> object
        self._attr_names: dict = {}
        self.grad_enabled = _state.tls.grad_enabled
        self.initial_grad = _state.tls.grad_enabled
        self.root_tx = None
        self.result: CompiledEntry | None = None
        self.sym_sources: dict = {}            # sympy symbol -> [source expr of a size]
        self.entered: list = []                # real context managers entered for the trace (exited on failure)

    # ---- sources --------------------------------------------------------------------------------
    def global_source(self, f_globals, name):
        if f_globals is self.f_globals:
            return GlobalSource(name)
        gname = self.guards.const(f_globals)
        return Source(f"{gname}[{name!r}]", None, f"{f_globals.get('__name__', '?')}.{name}")

    def note_mutation(self, vt):
        self.side_effects.note_container(vt)

    # ---- inputs and attributes -----------------------------------------------------------------
    def add_graph_input(self, t: Tensor, source, device=None) -> TensorVariable:
        """A placeholder for the tensor at `source`, guarded by TENSOR_MATCH. With `device` (a NumPy
        array's host view under a device context) the guards read `t` but the graph gets, at every call,
        a copy on `device` (`moved_inputs`), written back to the array when the graph mutates it."""
        self._check_initialized(t)
        name = source.name()
        dims = self._dynamic_dims_for(t, name)
        self.guards.tensor_match(source, t, tuple(dims))
        if device is not None:
            t = t.to(device)
        fake = self._fake(t, dims, source)
        node = self.graph.placeholder(graph_input_name(source))
        node.meta["grapharg"] = source
        self.inputs.append((node, source, t))
        self.input_by_node[node] = source
        if device is not None:
            self.moved_inputs[node] = (device, fake, fake._version[0])
        return TensorVariable(node, fake, source, cls=type(t))

    def _dynamic_dims_for(self, t: Tensor, name: str) -> set:
        shape = tuple(t._data.shape)
        marked = set(getattr(t, "_dynamo_dynamic_indices", ()))
        policy = self.dynamic
        if policy is False:
            dims = set()
        elif policy is True:
            dims = set(range(len(shape)))
        else:
            dims = set(marked) | set(self.dynamic_dims.get(name, ()))
        seen = self.frame_sizes.get(name)
        if policy is None and config.automatic_dynamic_shapes and seen is not None and len(seen) == len(shape):
            dims |= {d for d, (a, b) in enumerate(zip(seen, shape)) if a != b}
        dims = {d for d in dims if d < len(shape) and shape[d] not in (0, 1)}
        if dims and not t.is_contiguous():
            dims = set()
        self.frame_sizes.setdefault(name, shape)
        if policy is None and dims:
            self.dynamic_dims.setdefault(name, set()).update(dims)
        return dims

    def _fake(self, t: Tensor, dims: set, source) -> Tensor:
        if not dims:
            return self.fake_mode.from_tensor(t)
        shape = []
        for d, s in enumerate(t._data.shape):
            if d in dims:
                sym = self.shape_env.create_symbol(int(s), (source.expr, d))
                if isinstance(sym, SymInt) and sym.expr.is_Symbol:
                    self.sym_sources.setdefault(sym.expr, []).append(f"{source.expr}._data.shape[{d}]")
                shape.append(sym)
            else:
                shape.append(int(s))
        shape = tuple(shape)
        arr = MetaArray(shape, t._dtype.np, contiguous_strides(shape), 0)
        f = Tensor._make(arr, META, t._dtype)
        self.fake_mode._register(f, t.device)
        if t._requires_grad:
            f._requires_grad = True
        self.fake_mode._memo[id(t)] = (t, f)
        return f

    @staticmethod
    def _check_initialized(t: Tensor) -> None:
        if isinstance(t, UninitializedParameter):
            raise SkipFrame("an uninitialized (lazy) parameter: this call runs eagerly", permanent=False)

    def module_tensor(self, t: Tensor, source, is_param: bool) -> TensorVariable:
        self._check_initialized(t)
        self._guard_state_tensor(source, t)
        hit = self.built.get(id(t))
        if hit is not None and hit[0] is t:
            return hit[1]
        name = self._attr_names.get(id(t))
        if name is None:
            base = graph_input_name(source).strip("_").replace("_modules_", "").replace("_parameters_", "") \
                .replace("_buffers_", "")
            name = base or "attr"
            while name in self.attrs:
                name += "_"
            self.attrs[name] = t
            self._attr_names[id(t)] = name
        node = self.graph.get_attr(name)
        node.meta["is_param"] = is_param
        vt = TensorVariable(node, self.fake_mode.from_tensor(t), None, cls=type(t))
        vt.attr_source = source
        self.built[id(t)] = (t, vt)
        return vt

    # ---- recording operations ----------------------------------------------------------------------
    def _node_arg(self, vt, functions_ok: bool = False):
        if isinstance(vt, (TensorVariable, SymNodeVariable)):
            return vt.node
        if isinstance(vt, (TupleVariable, ListVariable)):
            items = [self._node_arg(x) for x in vt.items]
            return list(items) if isinstance(vt, ListVariable) else tuple(items)
        if isinstance(vt, SliceVariable):
            return slice(*(self._node_arg(p) for p in vt.parts))
        if isinstance(vt, DictVariable):
            return {k: self._node_arg(v) for k, v in vt.items.items()}
        fn = _hop_function(vt) if functions_ok else None
        if fn is not None:
            return fn
        if vt.is_python_constant():
            v = vt.as_python_constant()
            if isinstance(v, types.ModuleType) or isinstance(v, types.FunctionType) and not functions_ok:
                raise Unsupported(f"passing {v!r} to a tensor operation")
            return v
        raise Unsupported(f"argument {vt} of a tensor operation")

    def _example(self, vt):
        fn = _hop_function(vt)
        if fn is not None:
            return fn
        if isinstance(vt, TensorVariable):
            return vt.example
        if isinstance(vt, SymNodeVariable):
            return vt.sym
        if isinstance(vt, (TupleVariable, ListVariable)):
            items = [self._example(x) for x in vt.items]
            return list(items) if isinstance(vt, ListVariable) else (
                vt.cls(items) if vt.cls is not tuple and not hasattr(vt.cls, "_fields") else tuple(items))
        if isinstance(vt, SliceVariable):
            return slice(*(self._example(p) for p in vt.parts))
        if isinstance(vt, DictVariable):
            return {k: self._example(v) for k, v in vt.items.items()}
        return vt.as_python_constant()

    def _run_fake(self, fn):
        saved = _state.tls.grad_enabled
        _state.tls.grad_enabled = self.grad_enabled
        try:
            with self.fake_mode:
                return fn()
        except Unsupported:
            raise
        except Exception as e:
            raise Unsupported(f"{type(e).__name__} while tracing: {e}")
        finally:
            _state.tls.grad_enabled = saved

    def call_in_graph(self, tx, kind: str, target, args: list, kwargs: dict) -> VariableTracker:
        """One node calling `target`. A higher-order op (`flambeau.cond`, `map`) takes its functions as they
        are: AOT autograd traces them into subgraphs (`flambeau._higher_order_ops`)."""
        hop = getattr(target, "_flambeau_higher_order", False)
        node_args = tuple(self._node_arg(a, functions_ok=hop) for a in args)
        node_kwargs = {k: self._node_arg(v) for k, v in kwargs.items()}
        ex_args = [self._example(a) for a in args]
        ex_kwargs = {k: self._example(v) for k, v in kwargs.items()}
        if kind == "call_method":
            out = self._run_fake(lambda: getattr(ex_args[0], target)(*ex_args[1:], **ex_kwargs))
        else:
            out = self._run_fake(lambda: target(*ex_args, **ex_kwargs))
        node = self.graph.create_node(kind, target, node_args, node_kwargs)
        return self._wrap_output(node, out, args)

    def _guard_state_tensor(self, source, t: Tensor) -> None:
        """A parameter/buffer baked into the graph: same object, same requires_grad (a backend traces
        its gradient)."""
        g = self.guards
        g.add(source, f"{{S}} is {g.const(t)} and {{S}}._requires_grad is {bool(t._requires_grad)}",
              f"ID_MATCH: {source.name()} is the same tensor, requires_grad={t.requires_grad}")

    def call_module(self, tx, mod_vt, args, kwargs) -> VariableTracker:
        m = mod_vt.value
        for p in m.parameters():
            self._check_initialized(p)
        self.guards.module_state(m)
        name = self._attr_names.get(id(m))
        if name is None:
            name = graph_input_name(mod_vt.source).strip("_").replace("_modules_", "") or "mod"
            while name in self.attrs:
                name += "_"
            self.attrs[name] = m
            self._attr_names[id(m)] = name
        node_args = tuple(self._node_arg(a) for a in args)
        node_kwargs = {k: self._node_arg(v) for k, v in kwargs.items()}
        ex_args = [self._example(a) for a in args]
        ex_kwargs = {k: self._example(v) for k, v in kwargs.items()}
        out = self._run_fake(lambda: m(*ex_args, **ex_kwargs))
        node = self.graph.call_module(name, node_args, node_kwargs)
        return self._wrap_output(node, out, args)

    def add_submodule(self, base: str, module) -> object:
        """A get_attr node of `module`, stored on the graph module as `<base>_<k>` (the first k free)."""
        k = 0
        while f"{base}_{k}" in self.attrs:
            k += 1
        self.attrs[f"{base}_{k}"] = module
        return self.graph.get_attr(f"{base}_{k}")

    def call_autograd_function(self, tx, cls, args: list, kwargs: dict) -> VariableTracker:
        """`cls.apply(*args)`: one `autograd_function_apply` node over the traced forward and backward
        graphs (`autograd_function.py`); a Function that cannot be traced is one opaque `cls.apply`
        node, and the reason is recorded as a fallback (FLAMBEAU_LOGS=fallbacks)."""
        ex_args = [self._example(a) for a in args]
        try:
            if kwargs:
                raise NotTraceable("keyword arguments to apply")
            saved = _state.tls.grad_enabled
            _state.tls.grad_enabled = self.grad_enabled
            try:
                traced, pos = trace_function(cls, ex_args, self.fake_mode)
            finally:
                _state.tls.grad_enabled = saved
        except NotTraceable as e:
            record_fallback(f"{cls.__name__}.apply", f"autograd.Function not traced, called as one opaque node: {e}")
            return self.call_in_graph(tx, "call_function", cls.apply, args, kwargs)
        fwd = self.add_submodule("fwd_body", traced.fwd)
        bwd = self.add_submodule("bwd_body", traced.bwd)
        opts = {"n_outputs": traced.n_outputs, "non_differentiable": traced.non_differentiable,
                "materialize": traced.materialize, "once": traced.once, "replay": traced.replay}
        tensor_args = [args[i] for i in pos]
        node_args = (fwd, bwd) + tuple(self._node_arg(a) for a in tensor_args)
        ex = [ex_args[i] for i in pos]
        out = self._run_fake(lambda: autograd_function_apply(traced.fwd, traced.bwd, *ex, **opts))
        node = self.graph.create_node("call_function", autograd_function_apply, node_args, opts)
        outs = self._wrap_output(node, out, args)            # a tuple, each output read by getitem
        return outs.items[0] if traced.single else outs

    def _wrap_output(self, node, out, args) -> VariableTracker:
        if isinstance(out, Tensor):
            for a in args:
                if isinstance(a, TensorVariable) and a.example is out:
                    node.meta["example_value"] = out
                    return a
            return TensorVariable(node, out)
        if isinstance(out, SymInt):
            return SymNodeVariable(node, out)
        if isinstance(out, (tuple, list)) and _holds_tensors(out):
            node.meta["example_value"] = out
            items = []
            for i, o in enumerate(out):
                if isinstance(o, Tensor):
                    items.append(TensorVariable(self.graph.call_function(operator.getitem, (node, i)), o))
                elif isinstance(o, SymInt):
                    items.append(SymNodeVariable(self.graph.call_function(operator.getitem, (node, i)), o))
                elif isinstance(o, (tuple, list, dict)) and _holds_tensors(o):  # nested: grad_and_value(has_aux=True)
                    items.append(self._wrap_output(self.graph.call_function(operator.getitem, (node, i)), o, ()))
                else:
                    items.append(wrap_constant_like(o))
            if isinstance(out, list):
                return ListVariable(items)
            return TupleVariable(items, cls=type(out))
        if type(out) is dict and _holds_tensors(out):        # flambeau.func.grad of a dict of parameters
            node.meta["example_value"] = out
            return DictVariable({k: self._wrap_output(self.graph.call_function(operator.getitem, (node, k)), o, ())
                                 for k, o in out.items()})
        if out is None and node.op == "call_function" and node.target not in _STATE_FNS:
            return ConstantVariable(None)       # ops with effects (e.g. in-place) keep their node
        self.graph.erase_node(node)
        return wrap_constant_like(out)

    # ---- finishing ---------------------------------------------------------------------------------
    def compile_return(self, tx, value) -> None:
        cg = self._codegen()
        expr = cg.reconstruct(value)
        self._finish(tx, cg, expr)

    def graph_break(self, tx, start: int, reason) -> None:
        code = tx.code
        instrs = tx.instrs
        end = start
        while instrs[end].opname in ("KW_NAMES", "PRECALL"):
            end += 1
        if set(code.co_cellvars) & set(code.co_varnames):
            raise SkipFrame(f"graph break in {code.co_name}, whose arguments are closure cells ({reason})") from _cause(reason)
        self._check_loop(tx, start, end, reason)
        self._check_blocks(tx, start, reason)
        layout = tuple(x is NULL for x in tx.stack)
        bound = [v for v in code.co_varnames if v in tx.locals]
        unbound = frozenset(v for v in code.co_varnames if v not in tx.locals)
        bcode, exits = resume.break_code(code, start, end, layout, unbound, bound)
        cg = self._codegen()
        local_exprs = [cg.reconstruct(tx.locals[v]) if v in tx.locals else "None" for v in code.co_varnames]
        callee = self._callee_slot(tx, instrs[end])
        stack_exprs = [self._compiled_callee(cg, v) if k == callee else cg.reconstruct(v)
                       for k, v in enumerate(tx.stack) if v is not NULL]
        closure = "F.__closure__"
        if code.co_cellvars:
            cells = [cg.reconstruct(tx.cells[name]) for name in code.co_cellvars]
            closure = cg.new_temp("(" + "".join(c + ", " for c in cells) + ") + (F.__closure__ or ())")
        resume_exprs = []
        for kind, target_off, after in exits:
            rcode = resume.resume_code(code, target_off, after, unbound)
            resume_exprs.append(f"{cg.const(self.compile_resume)}({cg.const(rcode)}, G, {closure})")
        bfn = f"{cg.const(types.FunctionType)}({cg.const(bcode)}, G, {code.co_name!r}, None, {closure})"
        tail = f"{bfn}({', '.join(local_exprs + stack_exprs + resume_exprs)})"
        self.stats.break_reasons.append(reason)
        counters["graph_break"][getattr(reason, "msg", str(reason))] += 1
        _logging.trace("graph_breaks", "Graph break in %s at %s: %s", code.co_name,
                       getattr(reason, "location", lambda: "?")(), reason)
        self._finish(tx, cg, tail)

    @staticmethod
    def _callee_slot(tx, ins):
        """Stack index of the function a breaking call calls (None when not a call)."""
        if ins.opname == "CALL":
            k = len(tx.stack) - ins.arg - 2
        elif ins.opname == "CALL_FUNCTION_EX":
            k = len(tx.stack) - 3 - bool(ins.arg & bc.CALL_FUNCTION_EX_KWARGS)
        else:
            return None
        if k < 0:
            return None
        return k + 1 if tx.stack[k] is NULL else k

    def _compiled_callee(self, cg, vt) -> str:
        """The function a graph break calls, compiled as its own frame (what the frame hook would do)."""
        expr = cg.reconstruct(vt)
        if isinstance(vt, (UserFunctionVariable, UserMethodVariable)) and not is_disabled(vt.value):
            return f"{cg.const(self.compile_callee)}({expr})"
        if isinstance(vt, NestedUserFunctionVariable):
            return f"{cg.const(self.compile_callee)}({expr})"
        if isinstance(vt, NNModuleVariable) and not is_leaf_module(vt.value):
            return f"{cg.const(self.compile_callee)}({expr})"
        return expr

    def _check_loop(self, tx, start, end, reason):
        for k in range(end + 1, len(tx.instrs)):
            ins = tx.instrs[k]
            if ins.target is not None and ins.opname in ("JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT") and \
                    tx.index_of[id(ins.target)] <= start:
                raise SkipFrame(f"graph break in a for/while loop ({reason})") from _cause(reason)

    def _check_blocks(self, tx, start, reason):
        ins = tx.instrs[start]
        for e in tx.exc:
            if tx.index_of[id(e.start)] <= start <= tx.index_of[id(e.end)]:
                d = e.depth
                if d >= 1 and d <= len(tx.stack) and isinstance(tx.stack[d - 1], GradModeExitVariable):
                    return
                raise SkipFrame(f"graph break inside a try block or a with-block of an unsupported context "
                                f"manager at {ins.opname} ({reason})") from _cause(reason)

    def _codegen(self) -> EntryCodegen:
        cg = EntryCodegen(self.guards.consts)
        for k, (node, source, _) in enumerate(self.inputs):
            moved = self.moved_inputs.get(node)
            if moved is None:
                cg.input_tensors[node] = source.expr
            else:           # the copy on the device, made once per call (source: from_numpy(array))
                cg.input_tensors[node] = f"___a{k}"
                cg.prelude.append(f"___a{k} = {cg.const(np_wrappers.to_device)}({source.base.expr}, "
                                  f"{cg.const(moved[0])})")
        return cg

    def _write_backs(self, cg: EntryCodegen) -> list:
        """Statements copying each device input the graph mutated back into the caller's NumPy array."""
        out = []
        for node, source, _ in self.inputs:
            moved = self.moved_inputs.get(node)
            if moved is not None and moved[1]._version[0] != moved[2]:
                out.append(f"{cg.const(np_wrappers.write_back)}({source.base.expr}, {cg.input_tensors[node]})")
        return out

    def _finish(self, tx, cg: EntryCodegen, tail: str) -> None:
        cg.statements[:0] = self._write_backs(cg)
        self.side_effects.codegen(cg, self)
        if self.entered:
            raise Unsupported("the frame ends inside an autocast block")
        has_ops = any(n.op in ("call_function", "call_method", "call_module") and n.target not in _STATE_FNS
                      for n in self.graph.nodes)
        gm = None
        graph_call = None
        if self.grad_enabled != self.initial_grad and not has_ops:
            cg.statements.insert(0, f"{cg.const(_set_grad_enabled)}({self.grad_enabled})")
        if has_ops or cg.outputs:
            out_nodes = tuple(cg.outputs)
            self.graph.output(out_nodes)
            gm = GraphModule(self.attrs, self.graph, "GraphModule")
            if self.shape_env.var_to_val:
                gm.meta["shape_env"] = self.shape_env
                gm.meta["fake_mode"] = self.fake_mode
            example_inputs = [t for _, _, t in self.inputs]
            _logging.trace("graph", "graph of %s:\n%s", self.code.co_name, gm.code)
            if self.stats.keep_graphs:
                self.stats.graphs.append(gm)
            counters["stats"]["unique_graphs"] += 1
            try:
                compiled = call_backend(for_active_ddp(self.backend), gm, example_inputs)  # FLAMBEAU_REPRO_AFTER=dynamo
            except AccuracyError:           # the minifier's accuracy check (FLAMBEAU_REPRO_LEVEL=4)
                raise
            except Exception as e:
                name = getattr(self.backend, "compiler_name", None) or \
                    getattr(self.backend, "__name__", type(self.backend).__name__)
                where = f"{self.code.co_name} ({self.code.co_filename}:{self.code.co_firstlineno})"
                raise BackendCompilerFailed(name, e, where, gm.code) from e
            args = ", ".join(cg.input_tensors[node] for node, _, _ in self.inputs)
            graph_call = f"{cg.const(compiled)}({args})"
        self._add_shape_guards()
        argnames = [local_name(v) for v in self._argnames()]
        guard_fn, guard_src = self.guards.build(argnames, self.f_globals)
        src = cg.render(argnames, graph_call, tail)
        ns = cg.ns
        ns["G"] = self.f_globals
        exec(compile_source(src, f"<flambeau._dynamo entry of {self.code.co_name}>"), ns)
        _logging.trace("bytecode", "entry of %s:\n%s", self.code.co_name, src)
        _logging.trace("guards", "guards of %s:\n%s", self.code.co_name,
                       "\n".join(d for _, _, d in self.guards.checks))
        self.result = CompiledEntry(guard_fn, ns["___entry"], self.guards, guard_src, src, argnames,
                                    self.f_globals)

    def _argnames(self) -> list:
        c = self.code
        n = c.co_argcount + c.co_kwonlyargcount + bool(c.co_flags & CO_VARARGS) + bool(c.co_flags & CO_VARKEYWORDS)
        return list(c.co_varnames[:n])

    def _add_shape_guards(self) -> None:
        if not self.sym_sources:
            return
        g = self.guards
        for sym, srcs in self.sym_sources.items():
            first = srcs[0]
            g.raw(f"{first} >= 2", f"SHAPE: {first} >= 2 (sizes 0 and 1 are specialised)")
            for other in srcs[1:]:
                g.raw(f"{other} == {first}", f"SHAPE: {other} == {first}")
        mapping = {s: v[0] for s, v in self.sym_sources.items()}
        for rel in self.shape_env.guards:
            try:
                text = expr_to_python(rel, mapping)
            except NotImplementedError as e:
                raise Unsupported(f"cannot express the shape guard {rel} in Python: {e}")
            g.raw(text, f"SHAPE: {rel}")


def _holds_tensors(x) -> bool:
    if isinstance(x, (Tensor, SymInt)):
        return True
    if type(x) is dict:
        return any(_holds_tensors(o) for o in x.values())
    return isinstance(x, (tuple, list)) and any(_holds_tensors(o) for o in x)
