"""AOT autograd: trace forward and backward ahead of time, compile each, run them as one op.

`aot_function(fn, fw_compiler, bw_compiler, partition_fn, decompositions)` returns a callable that,
on the first call for given input metadata, does:

1. **Trace.** The inputs become fake tensors (`primals_1..n`, sizes symbolic with `dynamic=True`:
   every dim, or for a graph from dynamo only the dims dynamo made symbolic, parameters static;
   then the trace shares dynamo's ShapeEnv, so a size that tracing specialises, e.g. through
   `arange(n)`, becomes one of dynamo's guards and another size recompiles instead of misusing
   the graph).
   If grad mode is on and an input requires grad, the *joint* function runs under
   functionalization and proxy tracing: `fn(*primals)`, then `autograd.grad` of the differentiable
   outputs with respect to the inputs that require grad, with fresh `tangents_*` placeholders (one
   per differentiable output, same symbolic shape) as the output gradients. The graph returns
   `(*outputs, *final values of mutated inputs, *gradients)`. Otherwise only the forward is traced
   (an inference graph, no backward).
2. **Decompose.** With `decompositions`, the joint graph is traced again through them (the
   backward formulas of step 1 are decomposed too), leaving core ops.
3. **Partition** (`partition_fn`, see `partitioners.py`) into a forward graph returning
   `(*outputs, *mutated inputs, *saved)` and a backward graph `(*saved, *tangents) -> grads`.
4. **Compile** the forward with `fw_compiler(gm, example_inputs)` now and the backward with
   `bw_compiler` at its first use (its example inputs are the real saved values and tangents),
   once per set of absent tangents: an output that receives no gradient (None, not zeros: grads
   are not materialised) is a symbolic zero, pruned from the backward (`symbolic_zeros.py`), so its
   backward never runs, as in eager.
5. **Run** both inside an `autograd.Function`, with autocast off (a trace under autocast holds its
   casts, and the autocast state is part of the cache key); afterwards mutated inputs get their new value
   (`copy_`, no grad) and outputs that alias an input, another output or an intermediate that
   several outputs view (returned as an extra graph output) are regenerated from it by replaying
   their view ops, so they alias it as in eager and an in-place op through one is seen by the others.

`FLAMBEAU_LOGS=aot` prints the joint, forward and backward graphs. `aot_module` lifts a module's
parameters and buffers into inputs; `aot_module_simplified(gm, example_inputs, ...)` is the form
backends use (compile once for these inputs).
"""
from __future__ import annotations

from .. import _logging, _state
from .._compile_lock import compile_lock, gc_paused

from typing import Callable

from .._dtype import FLOATING
from .._backends import MetaArray, contiguous_strides
from .._decomp import DecompositionMode
from .._device import META
from .._tensor import Tensor
from .._dispatch import write_into
from .._ops.creation import empty_strided, zeros
from ..autograd.function import Function
from ..autograd.grad_mode import no_grad
from ..fx.experimental.proxy_tensor import ProxyTorchDispatchMode, _Recorder
from ..fx.graph_module import GraphModule
from ..fx.interpreter import Interpreter
from ..fx._symbolic_shapes import ShapeEnv, SymInt, expr_to_python
from ..fx.passes.example_values import VALUES_DROPPED, drop_values, restore_values
from .._subclasses.fake_tensor import FakeTensorMode
from ..nn.modules.module import Module
from .functionalization import run_functionalized, flat_input_tensors, _apply_step
from .partitioners import default_partition
from . import config
from .compile_utils import fx_graph_cse
from .symbolic_zeros import prune_absent_tangents
from ..autograd import grad
from ..fx.node import Node

log = _logging.get_logger("flambeau._functorch")

__all__ = ["aot_function", "aot_module", "aot_module_simplified", "make_boxed_func", "stateless_call"]


def _dump(title: str, gm: GraphModule) -> None:
    if _logging.enabled("aot"):
        _logging.log_artifact(log, "aot", "===== %s =====\n%s", title, gm.print_readable(print_output=False))


def make_boxed_func(f: Callable) -> Callable:
    return f


# ---- tracing --------------------------------------------------------------------------------------
class _Trace:
    """make_fx's recorder driven by hand, so that tangent placeholders can be added mid-trace."""

    def __init__(self, tracing_mode: str, fake_mode: FakeTensorMode | None = None, shape_env: ShapeEnv | None = None):
        self.symbolic = tracing_mode == "symbolic"
        self.fake_mode = fake_mode or FakeTensorMode(allow_non_fake_inputs=True,
                                                     shape_env=(shape_env or ShapeEnv()) if self.symbolic else None)
        self.rec = _Recorder(self.fake_mode)
        self.last_ph = None

    def _placeholder(self, name: str):
        g = self.rec.graph
        if self.last_ph is None:
            with g.inserting_before(None):
                ph = g.placeholder(name)
        else:
            with g.inserting_after(self.last_ph):
                ph = g.placeholder(name)
        self.last_ph = ph
        return ph

    def input(self, t: Tensor, name: str, dims: set | None = None) -> Tensor:
        """A placeholder for `t`; in symbolic mode its sizes are symbolic, all of them or `dims`."""
        ph = self._placeholder(name)
        if t._device.type == "meta":
            f = t
        elif self.symbolic and dims is not None:
            f = self._fake_with_dims(t, dims, name)
        else:
            f = self.fake_mode.from_tensor(t, symbolic=self.symbolic, source=name)
        self.rec.bind(f, ph)
        ph.meta["val"] = self.rec.fake_of(f)
        self.rec.note_sizes(ph, f)
        return f

    def _fake_with_dims(self, t: Tensor, dims: set, name: str) -> Tensor:
        hit = self.fake_mode._memo.get(id(t))
        if hit is not None:
            return hit[1]
        if not dims or not t.is_contiguous():
            return self.fake_mode.from_tensor(t)
        env = self.fake_mode.shape_env
        shape = tuple(env.create_symbol(int(s), (name, d)) if d in dims else int(s) for d, s in enumerate(t.shape))
        f = Tensor._make(MetaArray(shape, t._dtype.np, contiguous_strides(shape), 0), META, t._dtype)
        self.fake_mode._register(f, t.device)
        if t._requires_grad:
            f._requires_grad = True
        self.fake_mode._memo[id(t)] = (t, f)
        return f

    def input_like(self, o: Tensor, name: str) -> Tensor:
        """A fresh contiguous fake input with the (symbolic) shape, dtype and device of `o`."""
        shape = tuple(o.shape)
        f = Tensor._make(MetaArray(shape, o._dtype.np, contiguous_strides(shape), 0), META, o._dtype)
        self.fake_mode._register(f, o.device)
        ph = self._placeholder(name)
        self.rec.bind(f, ph)
        ph.meta["val"] = f
        return f

    def run(self, fn: Callable, *args):
        with self.fake_mode, ProxyTorchDispatchMode(self.rec):
            return fn(*args)

    def finish(self, outputs: list) -> GraphModule:
        self.rec.graph.output(tuple(self.rec.to_arg(o) for o in outputs))
        gm = GraphModule(self.rec.root, self.rec.graph)
        gm.meta["fake_mode"] = self.fake_mode
        if self.fake_mode.shape_env is not None:
            gm.meta["shape_env"] = self.fake_mode.shape_env
        return gm


def fakes_with_dynamic_dims(args: list, dynamic_dims: list) -> tuple:
    """(fake tensors like `args` with the sizes `dynamic_dims[i]` of input i symbolic, their
    ShapeEnv): the example values a front end gives a backend for a dynamic graph."""
    tr = _Trace("symbolic")
    fakes = [tr._fake_with_dims(a, set(d), f"arg{i}") if isinstance(a, Tensor) else a
             for i, (a, d) in enumerate(zip(args, dynamic_dims))]
    return fakes, tr.fake_mode.shape_env


def trace_with_dynamic_dims(fn: Callable, args: list, dynamic_dims: list) -> GraphModule:
    """`make_fx(fn, tracing_mode="symbolic")(*args)` with only the sizes `dynamic_dims[i]` of tensor
    input i symbolic, as a front end marked them (the minifier's repro scripts replay a dynamic graph
    this way); other sizes and non-tensor inputs stay as given."""
    tr = _Trace("symbolic")
    inner = []
    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            inner.append(tr.input(a, f"arg{i}_1", set(dynamic_dims[i])))
        else:
            tr._placeholder(f"arg{i}_1").meta["val"] = a
            inner.append(a)
    with no_grad():
        out = tr.run(fn, *inner)
    return tr.finish(list(out) if isinstance(out, (list, tuple)) else [out])


def _differentiable(t: Tensor) -> bool:
    return t._requires_grad and t._dtype.category >= FLOATING


class _Meta:
    """What the runtime needs to know about one compiled function (filled while tracing)."""

    def __init__(self):
        self.n_outs = 0            # flat user outputs
        self.aliases = []          # per user output: what it is a view of (functionalization.output_aliases) or None
        self.graph_outs = []       # positions of user outputs the graph returns
        self.n_bases = 0           # intermediate bases the graph returns after them (views regenerated from)
        self.mutated = []          # input positions mutated, in the order their values are returned
        self.diff_outs = []        # graph-output positions (among the user outputs) that get tangents
        self.grad_inputs = []      # input positions that receive gradients
        self.nondiff_outs = []     # graph-output positions never differentiable
        self.size_sources = None   # {size symbol: (input, dim)} when an alias chain has symbolic arguments


def _size_sources(prims: list) -> dict:
    """{size symbol: (input position, dim)} for the input dims whose size is a plain symbol."""
    sources = {}
    for i, p in enumerate(prims):
        for d, sz in enumerate(p.shape if isinstance(p, Tensor) else ()):
            if isinstance(sz, SymInt) and sz.expr.is_Symbol:
                sources.setdefault(sz.expr, (i, d))
    return sources


def _chain_symints(chain) -> list:
    out = []
    for _, b, _ in chain:
        for a in b[1:]:
            out += [x for x in (a if isinstance(a, (list, tuple)) else [a]) if isinstance(x, SymInt)]
    return out


def _check_alias_chain(chain, sources: dict) -> bool:
    """Whether the view chain of an output that aliases an input has symbolic arguments (replayed
    with the sizes of the actual inputs); raises when a size can't be read from the inputs."""
    syms = _chain_symints(chain)
    for x in syms:
        if not x.expr.free_symbols <= set(sources):
            raise NotImplementedError("aot_autograd: an output that is a view of an input with symbolic sizes "
                                      f"({x.expr}) that can't be read from the inputs")
    return bool(syms)


def _concrete_chain(chain, sources: dict, args) -> list:
    """`chain` with each SymInt argument evaluated at the sizes of `args`."""
    values = {s: args[i].shape[d] for s, (i, d) in sources.items()}

    def conc(a):
        if isinstance(a, SymInt):
            return int(a.expr.xreplace(values))
        if isinstance(a, (list, tuple)):
            return type(a)(conc(x) for x in a)
        return a
    return [(func, (b[0],) + tuple(conc(a) for a in b[1:]), idx) for func, b, idx in chain]


def _decomposed(fn: Callable, decompositions: dict | None) -> Callable:
    """`fn` run under DecompositionMode (innermost, so functionalization sees only what remains)."""
    if not decompositions:
        return fn

    def run(*args):
        with DecompositionMode(decompositions):
            return fn(*args)
    return run


def _trace_graph(flat_fn: Callable, flat_args: list, *, joint: bool, tracing_mode: str,
                 decompositions: dict | None, dynamic_dims: list | None = None, shape_env: ShapeEnv | None = None):
    tr = _Trace(tracing_mode, shape_env=shape_env)
    prims = [tr.input(a, f"primals_{i + 1}", dynamic_dims[i] if dynamic_dims else None)
             for i, a in enumerate(flat_args)]
    originals = [p._data for p in prims]
    wrt = [i for i, p in enumerate(prims) if p._requires_grad]
    meta = _Meta()

    def backward(out, mode, aliases, bases):
        outs = flat_input_tensors(out)
        returned = [outs[k] for k in range(len(outs)) if aliases[k] is None] + bases
        diff = [j for j, o in enumerate(returned) if _differentiable(o)]
        for i in wrt:
            if prims[i]._data is not originals[i]:
                raise NotImplementedError("aot_autograd: an input that requires grad is mutated in place")
        tangents = [tr.input_like(returned[j], f"tangents_{n + 1}") for n, j in enumerate(diff)]
        grads = [None] * len(wrt)
        if diff and wrt:
            grads = list(grad([returned[j] for j in diff], [prims[i] for i in wrt], tangents, allow_unused=True))
        return diff, wrt, grads

    fn = flat_fn if joint else _decomposed(flat_fn, decompositions)
    res = tr.run(lambda *a: run_functionalized(fn, a, then=backward if joint else None), *prims)
    outs = flat_input_tensors(res.out)
    meta.n_outs = len(outs)
    meta.aliases = res.aliases
    if any(a is not None and _check_alias_chain(a[2], _size_sources(prims)) for a in res.aliases):
        meta.size_sources = _size_sources(prims)
    meta.graph_outs = [k for k in range(len(outs)) if res.aliases[k] is None]
    meta.n_bases = len(res.bases)
    meta.mutated = [i for i, _ in res.mutations]
    returned = [outs[k] for k in meta.graph_outs] + res.bases
    graph_outputs = returned + [v for _, v in res.mutations]
    meta.nondiff_outs = [j for j, o in enumerate(returned) if not _differentiable(o)]
    meta.nondiff_outs += list(range(len(returned), len(graph_outputs)))
    if joint:
        meta.diff_outs, meta.grad_inputs, grads = res.extra
        graph_outputs += grads
    gm = tr.finish(graph_outputs)
    return gm, meta, tr


class _MetaCarrier(Interpreter):
    """Runs a graph node by node (inside a retrace) and copies the `keys` of each node's meta onto the
    nodes the retrace recorded while it ran (export's nn_module_stack survives run_decompositions)."""

    def __init__(self, gm: GraphModule, graph, keys: tuple):
        super().__init__(gm)
        self.out_graph, self.keys = graph, keys
        self.done = set(graph.nodes)

    def run_node(self, n: Node):
        result = super().run_node(n)
        meta = {k: n.meta[k] for k in self.keys if k in n.meta}
        for new in reversed(self.out_graph.nodes):
            if new in self.done:
                break
            self.done.add(new)
            new.meta.update({k: dict(v) if isinstance(v, dict) else v for k, v in meta.items()})
        return result


def retrace(gm: GraphModule, symbolic: bool, fake_mode, decompositions: dict, keep_meta: tuple = ()) -> GraphModule:
    """Trace `gm` again, functionalized, through `decompositions`, on its placeholders' fake values
    (`fake_mode` and its shape environment; `symbolic` keeps sizes symbolic): AOT autograd's joint
    graph and `ExportedProgram.run_decompositions` both retrace this way. Each new node gets the
    `keep_meta` entries of the node whose run recorded it."""
    tr2 = _Trace("symbolic" if symbolic else "fake", fake_mode)
    vals = []
    for n in gm.graph.find_nodes(op="placeholder"):
        v = n.meta["val"]
        ph = tr2._placeholder(n.target)
        tr2.rec.bind(v, ph)
        ph.meta["val"] = v
        tr2.rec.note_sizes(ph, v)
        vals.append(v)
    fn = _MetaCarrier(gm, tr2.rec.graph, keep_meta).run if keep_meta else gm.forward
    with no_grad():
        out = tr2.run(lambda *a: run_functionalized(_decomposed(fn, decompositions), a).out, *vals)
    return tr2.finish(list(out))


# ---- compilation ------------------------------------------------------------------------------------
def _compile(flat_fn: Callable, flat_args: list, fw_compiler: Callable, bw_compiler: Callable | None,
             partition_fn: Callable, decompositions: dict | None, inference_compiler: Callable | None,
             dynamic: bool, dynamic_dims: list | None = None, shape_env: ShapeEnv | None = None) -> Callable:
    mode = "symbolic" if dynamic else "fake"
    needs_grad = _state.tls.grad_enabled and any(isinstance(a, Tensor) and a._requires_grad for a in flat_args)
    if not needs_grad:
        gm, meta, _ = _trace_graph(flat_fn, flat_args, joint=False, tracing_mode=mode, decompositions=decompositions,
                                   dynamic_dims=dynamic_dims, shape_env=shape_env)
        gm.graph.eliminate_dead_code()
        gm.recompile()
        _dump("AOT inference graph", gm)
        gm.meta["mutated_inputs"] = list(meta.mutated)     # what freezing must leave an input (inductor)
        gm.meta["input_writes"] = _input_writes(meta)
        compiled = (inference_compiler or fw_compiler)(gm, list(flat_args))
        return _InferenceRuntime(compiled, meta)
    joint, meta, tr = _trace_graph(flat_fn, flat_args, joint=True, tracing_mode=mode, decompositions=None,
                                   dynamic_dims=dynamic_dims, shape_env=shape_env)
    if decompositions:
        joint = retrace(joint, tr.symbolic, tr.fake_mode, decompositions)
    if config.cse:
        joint = fx_graph_cse(joint)
    _dump("AOT joint graph", joint)
    num_fwd = len(meta.graph_outs) + meta.n_bases + len(meta.mutated)
    fw_gm, bw_gm = partition_fn(joint, flat_args, num_fwd_outputs=num_fwd)
    _dump("AOT forward graph", fw_gm)
    _dump("AOT backward graph", bw_gm)
    fw_gm.meta["input_writes"] = _input_writes(meta)
    compiled_fw = fw_compiler(fw_gm, list(flat_args))
    rt = _TrainingRuntime(compiled_fw, bw_gm, bw_compiler or fw_compiler, meta, num_fwd, joint.meta.get("fake_mode"))
    if config.force_non_lazy_backward_lowering:
        rt.compile_backward_now(getattr(compiled_fw, "output_strides", None), num_fwd)
    return rt


def _input_writes(meta: _Meta) -> dict:
    """{graph output index: input position} of the mutated inputs' final values (after the outputs and
    the aliased bases): a compiler may store such a value into the input itself (the inductor's
    `wrapper.in_place_writes`), and `_write_back` then has nothing to copy."""
    n = len(meta.graph_outs) + meta.n_bases
    return {n + k: i for k, i in enumerate(meta.mutated)}


def _write_back(x: Tensor, final: Tensor):
    """Copy the final value of a mutated input into it, unless the compiled graph stored it there itself
    (`_input_writes`: `final` holds the input's own array). The in-place ops that wrote it were checked
    when decomposed (an expanded input may be written by fill_/zero_ only), so an expanded `x` is
    allowed here."""
    if final._data is x._data and final._dtype is x._dtype:
        x._version[0] += 1
        return
    with no_grad():
        write_into(x, final, "copy_", overlap_ok=True)


def _finish(meta: _Meta, args, graph_vals) -> list:
    """Copy mutated inputs back, regenerate outputs that alias inputs, other outputs or intermediate
    bases (returned after the outputs), return the flat outputs."""
    n = len(meta.graph_outs) + meta.n_bases
    if meta.mutated:
        for i, v in zip(meta.mutated, graph_vals[n:n + len(meta.mutated)]):
            _write_back(args[i], v)
    outs = [None] * meta.n_outs
    for j, k in enumerate(meta.graph_outs):
        outs[k] = graph_vals[j]
    sources = {"input": args, "output": outs, "base": graph_vals[len(meta.graph_outs):n]}
    for k, a in enumerate(meta.aliases):
        if a is not None:
            kind, i, chain = a
            x = sources[kind][i]
            chain = chain if meta.size_sources is None else _concrete_chain(chain, meta.size_sources, args)
            for step in chain:
                x = _apply_step(step, x)
            outs[k] = x
    return outs


def _without_autocast(compiled: Callable, args) -> list:
    """Run a compiled graph with autocast off: its casts were traced into it (PyTorch's rule), so
    they must not be applied a second time to the graph's own ops."""
    saved = _state.set_autocast({})
    if not saved:
        return compiled(*args)
    try:
        return compiled(*args)
    finally:
        _state.set_autocast(saved)


class _InferenceRuntime:
    def __init__(self, compiled: Callable, meta: _Meta):
        self.compiled, self.meta = compiled, meta

    def __call__(self, *args):
        with no_grad():
            vals = _without_autocast(self.compiled, args)
        return _finish(self.meta, args, list(vals))


class _TrainingRuntime:
    """Runs the compiled forward/backward pair as an autograd.Function."""

    def __init__(self, compiled_fw, bw_gm, bw_compiler, meta: _Meta, num_fwd: int, fake_mode=None):
        self.meta = meta
        rt = self
        self.bw_gm, self.bw_compiler, self.fake_mode = bw_gm, bw_compiler, fake_mode
        self.compiled_bw: dict = {}     # frozenset of absent tangents -> (compiled backward, tangents it takes)
        n_saved = bw_gm.meta["num_saved"]
        saved_is_tensor = [isinstance(n.meta.get("val"), Tensor)
                           for n in bw_gm.graph.find_nodes(op="placeholder")[:n_saved]]
        mutated = set(meta.mutated)
        all_tensors = all(saved_is_tensor)      # (the usual case: no per-value sorting of what is saved)
        grad_inputs = list(meta.grad_inputs)
        every_input = grad_inputs == list(range(len(grad_inputs)))      # input k takes gradient k

        class CompiledFunction(Function):
            @staticmethod
            def forward(ctx, *args):
                vals = list(_without_autocast(compiled_fw, args))
                saved = vals[num_fwd:]
                if mutated:             # a saved input the forward also mutates keeps its old value for the backward
                    written = {id(args[i]) for i in mutated}
                    saved = [s.clone() if id(s) in written and isinstance(s, Tensor) else s for s in saved]
                if all_tensors:
                    ctx.to_save = saved         # (`save_for_backward(*saved)`)
                    ctx.scalars = ()
                else:
                    ctx.save_for_backward(*[s for s, t in zip(saved, saved_is_tensor) if t])
                    ctx.scalars = [s for s, t in zip(saved, saved_is_tensor) if not t]
                outs = vals[:num_fwd]
                ctx.mark_non_differentiable(*[outs[j] for j in meta.nondiff_outs])
                # an output that receives no gradient gets no zero tangent: the backward is specialised on it
                ctx.set_materialize_grads(False)
                ctx.tangent_meta = [(tuple(outs[j].shape), outs[j].dtype, outs[j].device) for j in meta.diff_outs]
                return tuple(outs)

            @staticmethod
            def backward(ctx, *grads):
                if all_tensors:
                    saved = list(ctx.saved_tensors)
                else:
                    tensors, scalars = iter(ctx.saved_tensors), iter(ctx.scalars)
                    saved = [next(tensors) if t else next(scalars) for t in saved_is_tensor]
                # ctx and its graph node refer to each other, so ctx lives until a garbage collection:
                # drop its own references to the saved activations now (they are packed in _saved)
                ctx.to_save = ()
                out = [None] * len(ctx.needs_input_grad)
                given = [grads[j] for j in meta.diff_outs]
                absent = frozenset(k for k, g in enumerate(given) if g is None)
                if len(absent) == len(given):
                    return tuple(out)
                tangents = [g.contiguous() if g is not None else _zeros_like_meta(*ctx.tangent_meta[k])
                            for k, g in enumerate(given)]
                hit = rt.compiled_bw.get(absent)
                if hit is None:
                    hit = rt.compile_backward(absent, saved, tangents)
                compiled_bw, kept = hit
                res = compiled_bw(*saved, *[tangents[k] for k in kept])
                if every_input and len(out) == len(grad_inputs) == len(res):
                    return tuple(res)
                for i, g in zip(grad_inputs, res):
                    out[i] = g
                return tuple(out)

        self.fn = CompiledFunction

    def compile_backward(self, absent: frozenset, saved: list, tangents: list) -> tuple:
        """(the backward compiled for these absent tangents, the tangent numbers it takes), compiled
        at its first use and kept; threads running it for the first time at once compile it once."""
        with compile_lock:
            hit = self.compiled_bw.get(absent)
            if hit is None:
                with gc_paused():
                    hit = self.compiled_bw[absent] = self._compile_backward(absent, saved, tangents)
        return hit

    def compile_backward_now(self, fw_strides, num_fwd: int) -> bool:
        """Compile the backward for every tangent present before its first use (`config.
        force_non_lazy_backward_lowering`), from the traced values of its inputs, a saved value taking the
        strides the compiled forward gives it (`fw_strides`: each forward output's, None where unknown).
        Whether it did: not for symbolic sizes or a graph without its values, nor when the compile fails or
        its compiler would run it eagerly (the first use then compiles it from the real values, as usual).
        A first use whose inputs are laid out otherwise is compiled again by the graph's compiler."""
        vals = [n.meta.get("val") for n in self.bw_gm.graph.find_nodes(op="placeholder")]
        if self.bw_gm.meta.get(VALUES_DROPPED) or not all(
                isinstance(v, Tensor) and all(type(d) is int for d in tuple(v.shape) + tuple(v.stride()))
                for v in vals):
            return False
        n_saved = self.bw_gm.meta["num_saved"]
        saved, tangents = vals[:n_saved], vals[n_saved:]
        if fw_strides is not None and self.fake_mode is not None:
            for j, v in enumerate(saved):
                st = fw_strides[num_fwd + j] if num_fwd + j < len(fw_strides) else None
                if st is not None and st != tuple(v.stride()):
                    with self.fake_mode:
                        saved[j] = empty_strided(tuple(v.shape), st, dtype=v.dtype, device=v.device)
        try:
            compiled, _ = self.compile_backward(frozenset(), saved, tangents)
        except Exception as e:          # compiled at its first use instead, from the real values
            _logging.trace("aot", "backward not compiled ahead of its first use: %s: %s", type(e).__name__, e)
            self.compiled_bw.pop(frozenset(), None)
            return False
        if getattr(compiled, "artifact", True) is None:     # its compiler would run it eagerly: decide on real values
            self.compiled_bw.pop(frozenset(), None)
            return False
        return True

    def _compile_backward(self, absent: frozenset, saved: list, tangents: list) -> tuple:
        if absent:
            gm, kept = self._pruned(absent, saved, tangents)
            _dump(f"AOT backward graph without tangents {sorted(k + 1 for k in absent)}", gm)
        else:
            gm, kept = self.bw_gm, list(range(len(tangents)))
        compiled = self.bw_compiler(gm, saved + [tangents[k] for k in kept])
        if self.bw_gm.meta.get(VALUES_DROPPED):
            self.fake_mode = None       # its fakes were the graph's values; a later pruning makes a new mode
        return compiled, kept

    def _pruned(self, absent: frozenset, saved: list, tangents: list) -> tuple:
        """prune_absent_tangents of the backward graph, whose example values are recomputed first for
        these inputs if its compiler dropped them (absent tangents as dense zeros, as traced)."""
        if not self.bw_gm.meta.get(VALUES_DROPPED):
            return prune_absent_tangents(self.bw_gm, absent, self.fake_mode)
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        dense = [t if k not in absent else zeros(t.shape, dtype=t.dtype, device=t.device)
                 for k, t in enumerate(tangents)]
        restore_values(self.bw_gm, saved + dense, fake_mode)
        try:
            return prune_absent_tangents(self.bw_gm, absent, fake_mode)
        finally:
            drop_values(self.bw_gm)

    def __call__(self, *args):
        vals = self.fn.apply(*args)
        return _finish(self.meta, args, list(vals))


def _zeros_like_meta(shape: tuple, dtype, device) -> Tensor:
    """A zero tangent for an absent one that a specialised backward still reads sizes from: one
    element, expanded (no memory)."""
    return zeros((), dtype=dtype, device=device).expand(shape)


# ---- public entry points ---------------------------------------------------------------------------
def _key(args) -> tuple:
    return (_state.tls.grad_enabled, tuple(_state.tls.autocast.items())) + tuple(
        (tuple(a.shape), a.stride(), a._dtype, str(a.device), a._requires_grad) if isinstance(a, Tensor)
        else (type(a), a) for a in args)


def _flatten_out(out):
    if isinstance(out, Tensor):
        return [out], None
    if isinstance(out, (tuple, list)) and all(isinstance(o, Tensor) for o in out):
        return list(out), type(out)
    raise NotImplementedError("aot_function: the function must return a Tensor or a tuple/list of Tensors")


def aot_function(fn: Callable, fw_compiler: Callable, bw_compiler: Callable | None = None,
                 partition_fn: Callable = default_partition, decompositions: dict | None = None,
                 num_params_buffers: int = 0, keep_inference_input_mutations: bool = False,
                 inference_compiler: Callable | None = None, *, dynamic: bool = False) -> Callable:
    """Compile `fn` ahead of time on its first call per input metadata (see module docstring).
    Positional Tensor and Python-value arguments; returns a Tensor or a tuple/list of Tensors."""
    cache: dict = {}

    def returned(*args):
        key = _key(args)
        entry = cache.get(key)
        if entry is None:
            tpos = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
            consts = list(args)
            spec = []

            def flat_fn(*tensors):
                full = list(consts)
                for i, t in zip(tpos, tensors):
                    full[i] = t
                outs, kind = _flatten_out(fn(*full))
                spec[:] = [kind]
                return outs
            rt = _compile(flat_fn, [args[i] for i in tpos], fw_compiler, bw_compiler, partition_fn,
                          decompositions, inference_compiler, dynamic)
            entry = cache[key] = (rt, tpos, spec[0])
        rt, tpos, kind = entry
        outs = rt(*[args[i] for i in tpos])
        return outs[0] if kind is None else kind(outs)
    returned.__name__ = getattr(fn, "__name__", "aot_fn")
    returned.__wrapped__ = fn
    return returned


class stateless_call:
    """`with stateless_call(module, {name: tensor}):` the module's parameters and buffers named in
    the dict are replaced by the given tensors for the duration (PyTorch's functional_call)."""

    def __init__(self, module: Module, tensors: dict):
        self.module, self.tensors, self.saved = module, tensors, []

    def __enter__(self):
        for name, t in self.tensors.items():
            *path, leaf = name.split(".")
            m = self.module
            for p in path:
                m = m._modules[p]
            store = m._parameters if leaf in m._parameters else m._buffers
            self.saved.append((store, leaf, store[leaf], t))
            store[leaf] = t
        return self

    def __exit__(self, *exc):
        replaced = [leaf for store, leaf, _, t in self.saved if store.get(leaf) is not t]
        for store, leaf, old, _ in reversed(self.saved):
            store[leaf] = old
        if replaced and exc[0] is None:
            raise NotImplementedError(f"forward reassigns the parameter or buffer '{replaced[0]}' (only in-place "
                                      "updates of module state can be compiled)")
        return False


def named_state(module: Module) -> list:
    """[(name, tensor)] of the module's parameters then buffers (shared ones once)."""
    out = list(module.named_parameters(remove_duplicate=True))
    out += [(n, b) for n, b in module.named_buffers(remove_duplicate=True) if b is not None]
    return out


def aot_module(mod: Module, fw_compiler: Callable, bw_compiler: Callable | None = None,
               partition_fn: Callable = default_partition, decompositions: dict | None = None,
               **kwargs) -> Module:
    """A Module running `mod` through `aot_function`, with its parameters and buffers as inputs."""
    names = [n for n, _ in named_state(mod)]

    def flat_fn(*state_and_args):
        with stateless_call(mod, dict(zip(names, state_and_args[:len(names)]))):
            return mod(*state_and_args[len(names):])
    compiled = aot_function(flat_fn, fw_compiler, bw_compiler, partition_fn, decompositions, len(names), **kwargs)

    class AOTModule(Module):
        def __init__(self):
            super().__init__()
            self.orig_module = mod

        def forward(self, *args):
            return compiled(*[t for _, t in named_state(mod)], *args)
    return AOTModule()


def _front_end_dynamic_dims(mod, n_state: int, n_inputs: int) -> list | None:
    """Per flat input, the dims the front end (dynamo) made symbolic, read from its placeholders'
    example values; module state is static. None (every dim symbolic) when the graph doesn't say."""
    graph = getattr(mod, "graph", None)
    if graph is None:
        return None
    vals = [n.meta.get("example_value") for n in graph.nodes if n.op == "placeholder"]
    if len(vals) != n_inputs or not all(isinstance(v, Tensor) for v in vals):
        return None
    return [set() for _ in range(n_state)] + [{d for d, s in enumerate(v.shape) if isinstance(s, SymInt)}
                                              for v in vals]


def aot_module_simplified(mod: Module, example_inputs, fw_compiler: Callable, bw_compiler: Callable | None = None,
                          partition_fn: Callable = default_partition, decompositions: dict | None = None,
                          keep_inference_input_mutations: bool = False,
                          inference_compiler: Callable | None = None, *, dynamic: bool | None = None) -> Callable:
    """Compile `mod` (a GraphModule from a front end) for inputs like `example_inputs`; returns a
    callable taking the same flat inputs and returning a list of outputs. The module's own
    parameters and buffers, if any, are lifted into inputs."""
    state = named_state(mod)
    names = [n for n, _ in state]
    n = len(names)
    if dynamic is None:
        dynamic = "shape_env" in getattr(mod, "meta", {})

    size_outs = _size_outputs(mod, len(example_inputs)) if dynamic else {}

    def flat_fn(*flat):
        if n:
            with stateless_call(mod, dict(zip(names, flat[:n]))):
                out = mod(*flat[n:])
        else:
            out = mod(*flat)
        if size_outs:
            out = [o for i, o in enumerate(out) if i not in size_outs]
        return _flatten_out(out)[0]
    tpos = [i for i, a in enumerate(example_inputs) if isinstance(a, Tensor)]
    if len(tpos) != len(example_inputs):
        raise NotImplementedError("aot_module_simplified: non-Tensor graph inputs")
    dims = _front_end_dynamic_dims(mod, len(state), len(example_inputs)) if dynamic else None
    rt = _compile(flat_fn, [t for _, t in state] + list(example_inputs), fw_compiler, bw_compiler, partition_fn,
                  decompositions, inference_compiler, dynamic, dims,
                  mod.meta.get("shape_env") if dims is not None else None)

    def call(*args):
        out = rt(*[t for _, t in state], *args) if n else rt(*args)
        if size_outs:
            out = list(out)
            for i in sorted(size_outs):
                out.insert(i, size_outs[i](args))
        return out
    call._aot_runtime = rt
    return call


def _size_outputs(mod, n_inputs: int) -> dict:
    """{output position: fn(inputs) -> int} for the outputs of a front-end graph that are symbolic
    sizes (dynamo returns the sizes that the code after a graph break uses): computed from the
    inputs' shapes instead of being traced, as an AOT graph returns only tensors."""
    graph = getattr(mod, "graph", None)
    if graph is None:
        return {}
    phs = [n for n in graph.nodes if n.op == "placeholder"]
    out = [n for n in graph.nodes if n.op == "output"]
    if len(phs) != n_inputs or not out or not isinstance(out[0].args[0], (tuple, list)):
        return {}
    where = {}
    for i, ph in enumerate(phs):
        v = ph.meta.get("example_value")
        for d, sz in enumerate(v.shape if isinstance(v, Tensor) else ()):
            if isinstance(sz, SymInt) and sz.expr.is_Symbol:
                where.setdefault(sz.expr, f"a[{i}].shape[{d}]")
    fns = {}
    for k, o in enumerate(out[0].args[0]):
        v = o.meta.get("example_value") if isinstance(o, Node) else None
        if isinstance(v, SymInt):
            try:
                src = expr_to_python(v.expr, where)
            except NotImplementedError:
                return {}
            fns[k] = eval(f"lambda a: int({src})")
    return fns
