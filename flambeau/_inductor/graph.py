"""GraphLowering: walk an FX graph of core operators and build the loop IR.

Each call_function node is lowered by its op's rule (`op.lowering`, see `lowering.py`), which
returns IR values (`ir.Pointwise` stays lazy and is inlined into its consumers; reductions and
values that must live in memory become `ComputedBuffer`s). An op tagged `Tag.extern` with no rule
is an *extern* kernel (its eager kernel called as a library call). A node without a rule, or whose
rule raises `ir.Unsupported` (an unsupported dtype, a cuda tensor...), becomes a *fallback* kernel:
the op's eager kernel is called on realised inputs from the wrapper, so every graph runs; each
fallback is recorded with its reason (`flambeau._dynamo.utils.counters["inductor_fallbacks"]`).

Mutations (`copy_`, see lowering_scatter) are lowered functionally: `self.view_parent` records
which lowered node aliases which (views, and `copy_` returning its destination) so that a write
updates every alias, and `self.mutations` maps the position of each graph input written to its
final value, which the wrapper copies back into the caller's tensor.

The result is `self.buffers` (ComputedBuffers and ExternKernels in a valid execution order),
`self.inputs` (placeholders), `self.constants` (get_attr tensors) and `self.outputs`.

Symbolic sizes: when a placeholder's `meta["val"]` has SymInt sizes (or is a SymInt: a size
passed between forward and backward graphs), the graph is lowered once for every size. Sizes,
strides and size arguments become `sizevars.SizeExpr` polynomials over the symbols; `sym_size`
nodes and integer arithmetic on sizes evaluate to such polynomials. `self.size_inputs` says where
the wrapper reads each symbol at run time (a dim of an input tensor, or an integer input), and
`self.shape_env` holds the tracer's guards, which the wrapper checks for each new size.
"""
from __future__ import annotations

import math
import operator

from .._ops import Op
from .._tags import Tag
from .._device import CPU
from .. import _state
from .._ops.creation import empty_strided
from .._tensor import Tensor
from ..fx.node import Node
from ..fx._symbolic_shapes import SymInt, sym_size
from .._counters import record_fallback
from . import config
from .pad_mm import PAD_MM
from . import lowerings  # noqa: F401  (attaches each core op's `op.lowering`)
from .ir import (Buffer, ComputedBuffer, ExternKernel, InputBuffer, IRNode, Layout, MultiOutput,
                 Pointwise, Reduction, Scatter, StridedView, SUPPORTED_DTYPES, Unsupported, as_strided_view)
from .index import contiguous_strides, dense_strides
from .sizevars import SizeExpr, collect_derived, from_sym, known_nonneg, size_tuple
from ..fx.node import Node
from .lowering_views import _try
from .layout_opt import (CONVOLUTIONS, channels_last_layout, is_channels_last, permuted, reads_channels_last,
                         wants_layout_opt, worth_permuting)
from .sizevars import evaluate, derived_definition


class LoweringException(RuntimeError):
    """An error while lowering one node (a bug of its lowering rule): names the node and its target
    (PyTorch's `torch._inductor.exc.LoweringException`)."""

    def __init__(self, node, inner: BaseException):
        super().__init__(f"{type(inner).__name__}: {inner}\n  target: {node.target}\n  node: {node.format_node()}")
        self.node = node
        self.inner_exception = inner


class GraphLowering:
    def __init__(self, gm, example_inputs=None, device=CPU, dtypes=SUPPORTED_DTYPES):
        self.gm = gm
        self.device = device          # where every tensor of the graph lives (see graph_device)
        self.dtypes = dtypes          # the dtypes the chosen code generator takes
        self.triton = device.type == "cuda" or config.backend == "triton"   # lowered for codegen_triton
        self.example_inputs = example_inputs
        self.buffers: list = []
        self.inputs: list = []
        self.constants: dict = {}
        self.outputs: list = []
        self.env: dict = {}
        self.node = None              # the FX node being lowered
        self.pad_views: set = set()   # ids of the slices of padded products/operands (pad_mm.py)
        self.fallback_ops: list = []
        self._n = 0
        self.dynamic = _is_dynamic(gm)
        self.size_inputs: list = []   # (input position, dim or None for an integer input, int | SizeExpr)
        self.shape_env = _shape_env(gm) if self.dynamic else None
        self.derived_names: set = set()   # derived size symbols (floor divisions) met while lowering
        self.view_parent: dict = {}       # node -> the node it aliases (a view's input, copy_'s destination)
        self.mutations: dict = {}         # graph input position -> its value after the graph's copy_s
        self.layout_opt = wants_layout_opt(gm, self.triton, self.dynamic)   # run channels-last (layout_opt.py)
        self.permuted: dict = {}          # name of a buffer computed (N, H, W, C) -> its channels-last view

    # ---- naming and realisation ------------------------------------------------------------
    def new_name(self, prefix="buf") -> str:
        self._n += 1
        return f"{prefix}{self._n - 1}"

    def realize(self, x, channels_last: bool | None = None) -> IRNode:
        """Make `x` live in memory: a Buffer, or a StridedView of one. In a channels-last graph
        (`self.layout_opt`) a 4-d value is computed channels-last when `channels_last` says so or,
        when it is None, when it reads mostly channels-last memory (layout_opt.py)."""
        if isinstance(x, (Buffer, StridedView)):
            return x
        if isinstance(x, Pointwise) and x.realized is not None:
            return x.realized
        if self.layout_opt and isinstance(x, (Pointwise, Reduction)) and \
                (reads_channels_last(x) if channels_last is None else channels_last and worth_permuting(x.ranges)):
            p = permuted(x)
            buf = ComputedBuffer(self.new_name(), Layout(p.ranges, x.dtype), p)
            self.buffers.append(buf)
            view = self.permuted[buf.name] = StridedView(buf, channels_last_layout(x.ranges, x.dtype))
            if isinstance(x, Pointwise):
                x.realized = view
            return view
        if isinstance(x, Pointwise):
            buf = ComputedBuffer(self.new_name(), Layout(x.ranges, x.dtype), x)
            self.buffers.append(buf)
            x.realized = buf
            return buf
        if isinstance(x, (Reduction, Scatter)):
            buf = ComputedBuffer(self.new_name(), Layout(x.ranges, x.dtype), x)
            self.buffers.append(buf)
            return buf
        raise TypeError(f"cannot realise {x!r}")

    def storage_order(self, base: Buffer, node) -> Buffer:
        """`base` as an op reading the storage of its input `node` (as_strided) must see it: laid out as
        eager lays out that value. A buffer the layout optimization computed (N, H, W, C) is copied into
        its value's (N, C, H, W) order first, unless eager's value is channels-last too."""
        view = self.permuted.get(base.name)
        v = node.meta.get("val") if isinstance(node, Node) else None
        if view is None or (isinstance(v, Tensor) and v.ndim == 4 and v.shape[1] != 1 and
                            is_channels_last(Layout(v.shape, v.dtype, v.stride()))):
            return base
        return self.realize(Pointwise(view.shape, view.dtype, view.make_loader()), channels_last=False)

    def _channels_last_operand(self, x) -> IRNode:
        """A convolution's 4-d operand in a channels-last graph: channels-last memory (a value in
        another layout, a graph input or a weight, copied into it by a kernel)."""
        if not isinstance(x, IRNode) or len(x.shape) != 4:
            return x
        if isinstance(x, Pointwise) and x.realized is None and as_strided_view(x) is None:
            return self.realize(x, channels_last=True)
        m = self._realize_or_view(x)
        if is_channels_last(m.layout):
            return m
        return self.realize(Pointwise(m.shape, m.dtype, m.make_loader()), channels_last=True)

    def _realize_or_view(self, x) -> IRNode:
        """An extern's input: a lazy value that only re-indexes memory is passed as a strided view
        of that memory (no copy kernel), anything else is realised."""
        if isinstance(x, Pointwise) and x.realized is None:
            v = as_strided_view(x)
            if v is not None:
                return v
            src = getattr(x, "view_of", None)          # a view of all of a lazy value: realise that value
            if src is not None and known_nonneg(math.prod(x.shape) - math.prod(src[0].shape)):
                mem = self._realize_or_view(src[0])
                r = _try(src[1], mem.layout)
                if r is not None:
                    base = mem.base if isinstance(mem, StridedView) else mem
                    return StridedView(base, Layout(x.shape, x.dtype, r[0], r[1]))
        return self.realize(x)

    def flat_outputs(self) -> list:
        """The outputs, and the final values of mutated inputs (both must be kept in memory)."""
        return (self.outputs if isinstance(self.outputs, list) else [self.outputs]) + list(self.mutations.values())

    # ---- the walk ----------------------------------------------------------------------------
    def run(self):
        with collect_derived() as self.derived_names:
            return self._run()

    def _run(self):
        nodes = list(self.gm.graph.nodes)
        check = _check_sizes if self.dynamic else _check_static
        for node in nodes:
            for v in _tensors(node.meta.get("val")):
                check(v)
        live = _live_nodes(nodes)
        n_inputs = 0
        for node in nodes:
            self.node = node
            if node.op == "placeholder":
                self.env[node] = self._placeholder(node, n_inputs)
                n_inputs += 1
            elif node.op == "get_attr":
                self.env[node] = self._constant(node)
            elif node.op == "call_function":
                if node not in live:
                    continue
                try:
                    self.env[node] = self._call(node)
                except (Unsupported, LoweringException):
                    raise
                except Exception as e:
                    raise LoweringException(node, e) from e
                self._note_alias(node)
                if node.meta.get(PAD_MM) == "pad":
                    self.realize(self.env[node])
                elif node.meta.get(PAD_MM) == "view":
                    self.pad_views.add(id(self.env[node]))
                self._maybe_realize(node)
            elif node.op == "output":
                self.outputs = self._outputs(node.args[0])
            else:
                raise Unsupported(f"node {node.op} {node.target} is not supported by the code generator")
        return self

    def _placeholder(self, node, position):
        v = node.meta.get("val")
        if self.dynamic:
            if isinstance(v, (SymInt, int)) and not isinstance(v, bool):
                e = from_sym(v)
                self.size_inputs.append((position, None, e))
                return e
        elif self.example_inputs is not None and position < len(self.example_inputs):
            v = self.example_inputs[position]
        if not isinstance(v, Tensor):
            raise Unsupported(f"input {node.name} is not a tensor ({type(v).__name__})")
        if v.device != self.device:
            raise Unsupported(f"input {node.name} is on {v.device}, the graph on {self.device}")
        if self.dynamic:
            shape = size_tuple(v.shape)
            strides = size_tuple(v.stride())
            ex = self.example_inputs[position] if self.example_inputs is not None and \
                position < len(self.example_inputs) else None
            if isinstance(ex, Tensor):
                strides = self._strides_like(shape, strides, tuple(ex.shape), tuple(ex.stride()))
            layout = Layout(shape, v.dtype, strides)
            for d, e in enumerate(shape):
                self.size_inputs.append((position, d, e))
        else:
            _check_static(v)
            layout = Layout(v.shape, v.dtype, v.stride())
        buf = InputBuffer(f"arg{position}", layout, position=position)
        self.inputs.append(buf)
        return buf

    def _strides_like(self, shape, strides, ex_shape, ex_strides):
        """Symbolic strides matching the example input's real layout (a saved activation may be
        contiguous where the trace saw a transposed view): the traced strides, contiguous ones, or
        contiguous in the order of the example's strides, whichever agrees with the example at the
        symbols' example values. An empty input keeps the traced strides: the wrapper does not check
        an empty array's strides (they are arbitrary, e.g. 0 for an expanded empty gradient)."""
        if self.shape_env is None or 0 in ex_shape:   # (no elements: the strides are never read)
            return strides
        hints = {s.name: v for s, v in self.shape_env.var_to_val.items()}
        for name in self.derived_names:
            hints[name] = int(derived_definition(name).xreplace(self.shape_env.var_to_val))
        try:
            if tuple(evaluate(s, hints) for s in shape) != ex_shape:
                return strides
        except KeyError:
            return strides
        order = sorted(range(len(shape)), key=lambda d: -ex_strides[d])
        permuted = [0] * len(shape)
        acc = 1
        for d in reversed(order):
            permuted[d] = acc
            acc = acc * shape[d]
        for cand in (strides, contiguous_strides(shape), tuple(permuted)):
            if all(evaluate(c, hints) == e for c, e, n in zip(cand, ex_strides, ex_shape) if n != 1):
                return cand
        raise Unsupported(f"input strides {ex_strides} are not expressible in the symbolic sizes")

    def _constant(self, node):
        obj = self.gm
        for part in node.target.split("."):
            obj = getattr(obj, part)
        if not isinstance(obj, Tensor):
            return obj
        if obj.device != self.device:
            raise Unsupported(f"constant {node.target} is on {obj.device}, the graph on {self.device}")
        name = self.new_name("const")
        buf = InputBuffer(name, Layout(obj.shape, obj.dtype, obj.stride()), constant=obj)
        self.constants[name] = buf
        return buf

    def _note_alias(self, node):
        t = node.target
        if (getattr(t, "is_view", False) or getattr(t, "name", None) == "copy_") and node.args and \
                isinstance(node.args[0], Node):
            self.view_parent[node] = node.args[0]

    def lower_node(self, node) -> IRNode:
        """Lower `node` again on the current environment (an alias after a write to its root)."""
        prev, self.node = self.node, node
        try:
            return self._call(node)
        finally:
            self.node = prev

    def map_args(self, node) -> tuple:
        """(args, kwargs) of `node` with nodes replaced by their IR values."""
        return _map_nodes(node.args, self.env), _map_nodes(node.kwargs, self.env)

    def _call(self, node):
        target = node.target
        args, kwargs = self.map_args(node)
        if target is operator.getitem:
            return args[0][args[1]]
        if target is sym_size:
            return args[0].shape[args[1]]
        if target in _SIZE_ARITH:
            if not all(isinstance(a, (int, SizeExpr)) and not isinstance(a, bool) for a in args) or kwargs:
                raise Unsupported(f"{target.__name__} of {[type(a).__name__ for a in args]}")
            try:
                return _SIZE_ARITH[target](*args)
            except (TypeError, ArithmeticError) as e:
                raise Unsupported(f"{target.__name__}{tuple(args)}: {e}") from e
        if kwargs.get("out", 0) is None:
            kwargs = {k: v for k, v in kwargs.items() if k != "out"}
        rule = target.lowering if isinstance(target, Op) else None
        dtypes_ok = _dtypes_ok(node, args, kwargs, self.dtypes, self.device)
        if rule is None and isinstance(target, Op) and Tag.extern in target.tags and dtypes_ok:
            return self.fallback(node, target, args, kwargs, kind="extern")
        if rule is None:
            reason = "no lowering"
        elif not dtypes_ok:
            reason = "a dtype or device the code generator does not take"
        else:
            try:
                return rule(self, *target.bind(*args, **kwargs))
            except Unsupported as e:
                reason = str(e)
        return self.fallback(node, target, args, kwargs, reason=reason)

    def fallback(self, node, target, args, kwargs, kind="fallback", reason=""):
        """Call `target` eagerly in the wrapper on realised inputs (its kernel over NumPy); a
        `kind="fallback"` (not an extern kernel by design) is recorded with its `reason`."""
        if not hasattr(target, "kernel") or target.kernel is None:
            raise Unsupported(f"{target} has no eager kernel to fall back to")
        if kind == "fallback":
            op = getattr(target, "name", str(target))
            self.fallback_ops.append(op)
            record_fallback(op, reason)
        if self.layout_opt and getattr(target, "name", None) in CONVOLUTIONS:
            args = tuple(self._channels_last_operand(a) if i < 2 else a for i, a in enumerate(args))
        args = _map_ir(args, self._realize_or_view)
        kwargs = _map_ir(kwargs, self._realize_or_view)
        val = node.meta.get("val")
        name = self.new_name()
        check = _check_sizes if self.dynamic else _check_static
        metas = self._meta_outputs(target, args, kwargs)
        if isinstance(val, Tensor):
            check(val)
            ek = ExternKernel(name, self._extern_layout(val, metas), target, args, kwargs, kind)
            self.buffers.append(ek)
            return ek
        if isinstance(val, (tuple, list)):
            ek = ExternKernel(name, None, target, args, kwargs, kind)
            ek.n_outputs = len(val)
            self.buffers.append(ek)
            outs = []
            for i, v in enumerate(val):
                if isinstance(v, Tensor):
                    check(v)
                    meta = metas[i] if isinstance(metas, (tuple, list)) and len(metas) == len(val) else None
                    mo = MultiOutput(f"{name}_{i}", self._extern_layout(v, meta), ek, i)
                    ek.outputs.append(mo)
                    outs.append(mo)
                else:
                    outs.append(v)
            return type(val)(outs) if type(val) in (tuple, list) else tuple(outs)
        raise Unsupported(f"cannot fall back on {target}: unknown output {type(val).__name__}")

    def _meta_outputs(self, target, args, kwargs):
        """For the Triton code generator with static sizes: the op's outputs as its meta function gives
        them for inputs laid out as the extern will get them (`args`' buffers and views: a value the
        trace saw as a strided view may be realised contiguous here), on meta tensors, autocast off;
        None when that cannot be computed."""
        if not self.triton or self.dynamic:
            return None

        def meta(a):
            if isinstance(a, (Buffer, StridedView)):
                return empty_strided(a.layout.shape, a.layout.strides, dtype=a.dtype, device="meta")
            return a
        saved = _state.set_autocast({})
        try:
            return target(*_map_ir(args, meta), **_map_ir(kwargs, meta))
        except Exception:                   # a meta function that needs values, an op without one: contiguous
            return None
        finally:
            _state.set_autocast(saved)

    def _extern_layout(self, val, meta) -> Layout:
        """The layout an extern's output is taken in: for the Triton code generator the strides its meta
        function gives for the inputs as laid out in this graph (`_meta_outputs`), when they are dense (a
        permutation of contiguous strides: attention's (B, H, L, E) views of (B, L, H, E) memory), so
        consumers read the kernel's output in place; the wrapper copies an output that comes back
        otherwise (`wrapper.conform`). Else contiguous."""
        if isinstance(meta, Tensor) and tuple(meta.shape) == tuple(val.shape):
            strides = tuple(meta.stride())
            if all(type(s) is int for s in strides) and dense_strides(tuple(val.shape), strides):
                return Layout(val.shape, val.dtype, strides)
        return Layout(val.shape, val.dtype)

    def _maybe_realize(self, node):
        """Inline a pointwise value into its consumers unless recomputing it would be costly. For the
        Triton code generator a transcendental (exp, tanh) alone is no reason to store a value with
        several users: a GPU kernel is bound by memory, so writing and re-reading the value (a
        softmax's exp(x - max) over GPT-2's logits: 1.65 GB of float32) costs more than computing
        it twice.

        A value with several users of which one is the graph's output (an activation the forward saves
        for the backward: a residual stream) is stored anyway, so it is stored where it is computed and
        the other users read it (PyTorch's GraphLowering.run_node does the same) instead of recomputing
        it: otherwise every layer norm of a residual stream re-adds all earlier layers' outputs. For the
        same reason a value with several users that reads more than `config.realize_reads_threshold` large
        buffers (`_large_reads`; PyTorch has a threshold on all reads) is stored: GPT-2's residual stream, which its layer
        norms' backward does not need (they save the normalized values), grows by two buffers a layer,
        and every consumer inlining it re-read the embeddings and all earlier layers' outputs. The op count
        above which a value with several users is stored is `config.realize_opcount_threshold` (30, PyTorch's)
        for the Triton generator: with 12, GELU's tanh, recomputed in the backward for its two uses in one
        kernel, was stored as float32 for all twelve GPT-2 layers at the backward's start (1.2 GB, 0.6 ms)."""
        x = self.env[node]
        if not isinstance(x, Pointwise) or x.realized is not None:
            return
        st = x.stats()
        users = len(node.users)
        heavy = st.heavy > 0 and not self.triton
        if st.ops > config.max_inline_ops or \
                (users > 1 and (heavy or st.ops > (config.realize_opcount_threshold if self.triton
                                                       else config.inline_ops_multi_use)
                                or _large_reads(st.loads, x.ranges) > config.realize_reads_threshold
                                or (config.realize_saved_outputs and any(u.op == "output" for u in node.users)))):
            self.realize(x, channels_last=True if self.layout_opt and _feeds_convolution(node) else None)

    def _outputs(self, out):
        """The graph's outputs in memory. In a channels-last graph, an output the caller sees (all of
        them but a forward graph's saved activations, `gm.meta["num_fwd_outputs"]`) whose FX value is
        contiguous is made contiguous (a copy of a channels-last value): the layout eager gives."""
        flat = isinstance(out, (tuple, list))
        nodes = out if flat else [out]
        visible = self.gm.meta.get("num_fwd_outputs", len(nodes)) if hasattr(self.gm, "meta") else len(nodes)

        def one(node, x, i):
            if id(x) in self.pad_views:          # a slice of a padded product or operand: a strided view
                return self._realize_or_view(x)
            if self.layout_opt and i < visible and isinstance(node, Node) and _fx_contiguous(node) and \
                    isinstance(x, IRNode) and len(x.shape) == 4:
                if isinstance(x, Pointwise) and x.realized is None:
                    return self.realize(x, channels_last=False)
                m = self._realize_or_view(x) if isinstance(x, Pointwise) else self.realize(x)
                if is_channels_last(m.layout) and not m.layout.is_contiguous():
                    return self.realize(Pointwise(m.shape, m.dtype, m.make_loader()), channels_last=False)
                return m
            if isinstance(x, (Pointwise, Reduction)):
                return self.realize(x)
            return x
        vals = [one(n, _map_nodes(n, self.env), i) for i, n in enumerate(nodes)]
        return vals if flat else vals[0]


def _large_reads(loads: list, ranges: tuple) -> int:
    """How many distinct buffers of at least an eighth of the value's element count `loads` reads: the
    reads that cost a pass (a residual stream's earlier products and embeddings), not per-channel or
    per-row vectors (BatchNorm's statistics and weights). A symbolic size counts as large."""
    def numel(shape):
        n = 1
        for d in shape:
            if not isinstance(d, int):
                return None
            n *= d
        return n
    want = numel(ranges)
    seen = set()
    for b, _ in loads:
        if id(b) in seen:
            continue
        have = numel(b.layout.shape) if want is not None else None
        if have is None or 8 * have >= want:
            seen.add(id(b))
    return len(seen)


def _feeds_convolution(node) -> bool:
    """Whether `node` is a convolution's operand (an autocast weight cast also saved for the backward:
    realised channels-last where it is computed, not copied again for the convolution)."""
    return any(getattr(u.target, "name", None) in CONVOLUTIONS and node in u.args[:2] for u in node.users)


def _fx_contiguous(node) -> bool:
    v = node.meta.get("val")
    return isinstance(v, Tensor) and all(st == c for s, st, c in zip(v.shape, v.stride(), contiguous_strides(tuple(v.shape)))
                                         if s != 1)


def _live_nodes(nodes) -> set:
    """Nodes that an output depends on (dead pure nodes are not lowered)."""
    live = set()
    for node in reversed(nodes):
        if node.op == "output" or node in live or (node.op == "call_function" and _impure(node)):
            live.add(node)
            stack = [node]
            while stack:
                n = stack.pop()
                for inp in getattr(n, "all_input_nodes", ()):
                    if inp not in live:
                        live.add(inp)
                        stack.append(inp)
    return live


def _impure(node) -> bool:
    t = node.target
    return bool(getattr(t, "is_inplace", False)) or bool(getattr(t, "nondeterministic", False))


def _tensors(v) -> list:
    if isinstance(v, Tensor):
        return [v]
    if isinstance(v, (tuple, list)):
        return [x for y in v for x in _tensors(y)]
    return []


def _check_static(v):
    for s in tuple(v.shape) + tuple(v.stride()):
        if type(s) is not int:
            raise Unsupported("symbolic sizes are not supported by the code generator")


def _check_sizes(v):
    """Sizes and strides that the code generator can express (polynomials in the size symbols)."""
    size_tuple(tuple(v.shape) + tuple(v.stride()))


def _is_dynamic(gm) -> bool:
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            v = node.meta.get("val")
            if isinstance(v, SymInt) or (isinstance(v, Tensor) and
                                         any(isinstance(s, SymInt) for s in tuple(v.shape) + tuple(v.stride()))):
                return True
    return False


def _shape_env(gm):
    env = gm.meta.get("shape_env") if hasattr(gm, "meta") else None
    if env is not None:
        return env
    for node in gm.graph.nodes:
        v = node.meta.get("val")
        for s in ([v] if isinstance(v, SymInt) else list(v.shape) if isinstance(v, Tensor) else []):
            if isinstance(s, SymInt):
                return s.env
    return None


_SIZE_ARITH = {operator.add: operator.add, operator.sub: operator.sub, operator.mul: operator.mul,
               operator.neg: operator.neg, operator.floordiv: operator.floordiv, operator.mod: operator.mod,
               operator.pow: operator.pow}


def _map_nodes(a, env):
    if isinstance(a, SymInt):
        return from_sym(a)
    if isinstance(a, Node):
        return env[a]
    if isinstance(a, tuple):
        return tuple(_map_nodes(x, env) for x in a)
    if isinstance(a, list):
        return [_map_nodes(x, env) for x in a]
    if isinstance(a, dict):
        return {k: _map_nodes(v, env) for k, v in a.items()}
    return a


def _map_ir(a, fn):
    if isinstance(a, IRNode):
        return fn(a)
    if isinstance(a, tuple):
        return tuple(_map_ir(x, fn) for x in a)
    if isinstance(a, list):
        return [_map_ir(x, fn) for x in a]
    if isinstance(a, dict):
        return {k: _map_ir(v, fn) for k, v in a.items()}
    return a


def graph_device(gm, example_inputs=None):
    """The one device of every tensor of the graph (cpu for a graph without tensors); raises
    Unsupported for a graph spanning devices (it runs eagerly)."""
    devices = set()
    for node in gm.graph.nodes:
        for v in _tensors(node.meta.get("val")):
            devices.add(v.device)
    for a in example_inputs or ():
        if isinstance(a, Tensor):
            devices.add(a.device)
    if len(devices) > 1:
        raise Unsupported(f"the graph's tensors are on several devices: {sorted(map(str, devices))}")
    return devices.pop() if devices else CPU


def _dtypes_ok(node, args, kwargs, dtypes=SUPPORTED_DTYPES, device=CPU) -> bool:
    vals = node.meta.get("val")
    vals = vals if isinstance(vals, (tuple, list)) else [vals]
    for v in vals:
        if isinstance(v, Tensor) and (v.dtype not in dtypes or v.device != device):
            return False
    ok = [True]

    def visit(a):
        if isinstance(a, IRNode) and a.dtype not in dtypes:
            ok[0] = False
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)
        elif isinstance(a, complex):
            ok[0] = False
    visit(args)
    visit(list(kwargs.values()))
    return ok[0]
