"""The exported graph as an ONNX graph: one rule per operator, named after it, in `RULES`.

`to_onnx(ep, input_names, output_names, opset, dim_names)` walks an `ExportedProgram` (inference: no
buffer updates) and builds an `onnx.ModelProto` with the `onnx` package: module state becomes
initializers (named by its fully qualified name), user inputs graph inputs with `dim_param` names
for the dynamic dims, every call a few ONNX nodes. A size read in the graph (`sym_size`, size
arithmetic) is a 1-element int64 tensor (`Shape(x, start=d, end=d+1)`), so a `view` to a shape with
dynamic entries is a `Reshape` to a `Concat` of them. `flambeau.cond` becomes an `If` whose branches
are the two subgraphs (reading the operands from the outer scope). An operator without a rule raises
`OnnxExporterError` naming it.
"""
from __future__ import annotations

import math
import operator

import numpy as np

from .._higher_order_ops._cond import cond_op
from ..fx._symbolic_shapes import SymInt, sym_size
from .._tensor import Tensor


class OnnxExporterError(RuntimeError):
    """Raised when a program cannot be written as ONNX (the message names the operator)."""


_NP_OF = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "int64": np.int64,
          "int32": np.int32, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_, "int16": np.int16}
INT64_MAX = 2 ** 63 - 1
ONNX_FLOAT, ONNX_BOOL = 1, 9          # onnx.TensorProto.FLOAT, .BOOL


class Builder:
    """Nodes, initializers and value names of the ONNX graph being built."""

    def __init__(self, onnx, opset: int):
        self.onnx, self.helper, self.opset = onnx, onnx.helper, opset
        self.nodes, self.inits, self.names = [], [], {}
        self._n = 0

    def fresh(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def op(self, kind: str, inputs: list, n_out: int = 1, **attrs) -> list:
        outs = [self.fresh(kind) for _ in range(n_out)]
        self.nodes.append(self.helper.make_node(kind, inputs, outs, name=self.fresh(f"n_{kind}"), **attrs))
        return outs

    def op1(self, kind: str, inputs: list, **attrs) -> str:
        return self.op(kind, inputs, 1, **attrs)[0]

    def const(self, value, dtype=None, hint: str = "const") -> str:
        arr = np.asarray(value, dtype=dtype)
        name = self.fresh(hint)
        self.inits.append(self.onnx.numpy_helper.from_array(arr, name))
        return name

    def ints(self, values) -> str:
        """A 1-d int64 tensor of `values` (ints, or names of 1-element int64 tensors)."""
        if all(isinstance(v, int) for v in values):
            return self.const(list(values), np.int64)
        parts = [self.const([v], np.int64) if isinstance(v, int) else v for v in values]
        return self.op1("Concat", parts, axis=0)


def _np_dtype(t: Tensor):
    dt = _NP_OF.get(t.dtype.name)
    if dt is None:
        raise OnnxExporterError(f"flambeau.onnx.export: dtype {t.dtype} has no ONNX spelling here")
    return dt


class Converter:
    """Walks the graph; `value(arg)` gives the ONNX name (or Python value) of a node argument."""

    def __init__(self, b: Builder):
        self.b = b
        self.env: dict = {}

    def value(self, a):
        if hasattr(a, "op") and hasattr(a, "users"):
            return self.env[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(self.value(x) for x in a)
        return a

    def scalar_like(self, v, like_node) -> str:
        return self.b.const(v, _np_dtype(like_node.meta["val"]))

    def tensor(self, a, like_node) -> str:
        """An ONNX name for a tensor argument or a Python scalar (as a constant of `like_node`'s dtype)."""
        if hasattr(a, "op"):
            return self.env[a.name]
        return self.scalar_like(a, like_node)

    def size_list(self, sizes) -> str:
        return self.b.ints([self.env[s.name] if hasattr(s, "op") else int(s) for s in sizes])


RULES: dict = {}


def rule(*names):
    def wrap(fn):
        for n in names:
            RULES[n] = fn
        return fn
    return wrap


def _rank(node) -> int:
    return len(node.meta["val"].shape)


# ---- pointwise ----------------------------------------------------------------------------------------
_UNARY = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "exp": "Exp", "log": "Log", "neg": "Neg",
          "sqrt": "Sqrt", "erf": "Erf", "abs": "Abs", "clone": "Identity", "alias": "Identity", "sin": "Sin",
          "cos": "Cos", "reciprocal": "Reciprocal", "floor": "Floor", "ceil": "Ceil", "logical_not": "Not"}


@rule(*_UNARY)
def _unary_rule(c: Converter, node, x, *rest, **kw):
    return c.b.op1(_UNARY[node.target.name], [c.value(x)])


_BINARY = {"add.Tensor": "Add", "sub.Tensor": "Sub", "mul.Tensor": "Mul", "div.Tensor": "Div",
           "pow.Tensor_Tensor": "Pow", "maximum": "Max", "minimum": "Min",
           "eq.Tensor": "Equal", "gt.Tensor": "Greater", "lt.Tensor": "Less"}


@rule(*_BINARY)
def _binary_rule(c: Converter, node, a, b, alpha=1):
    like = a if hasattr(a, "op") else b
    ta, tb = c.tensor(a, like), c.tensor(b, like)
    if alpha != 1:
        tb = c.b.op1("Mul", [tb, c.scalar_like(alpha, like)])
    return c.b.op1(_BINARY[node.target.name], [ta, tb])


@rule("rsqrt")
def _rsqrt_rule(c: Converter, node, x):
    return c.b.op1("Reciprocal", [c.b.op1("Sqrt", [c.value(x)])])


@rule("gelu")
def _gelu_rule(c: Converter, node, x, approximate="none"):
    v = c.value(x)
    half, one = c.scalar_like(0.5, x), c.scalar_like(1.0, x)
    if approximate == "tanh":
        inner = c.b.op1("Mul", [c.scalar_like(math.sqrt(2 / math.pi), x), c.b.op1("Add", [v, c.b.op1(
            "Mul", [c.scalar_like(0.044715, x), c.b.op1("Pow", [v, c.scalar_like(3.0, x)])])])])
        t = c.b.op1("Tanh", [inner])
    else:
        t = c.b.op1("Erf", [c.b.op1("Div", [v, c.scalar_like(math.sqrt(2.0), x)])])
    return c.b.op1("Mul", [c.b.op1("Mul", [half, v]), c.b.op1("Add", [one, t])])


@rule("where.self")
def _where_rule(c: Converter, node, cond, a, b):
    return c.b.op1("Where", [c.value(cond), c.tensor(a, node), c.tensor(b, node)])


# ---- linear algebra, nn ---------------------------------------------------------------------------------
@rule("linear")
def _linear_rule(c: Converter, node, x, w, bias=None):
    y = c.b.op1("MatMul", [c.value(x), c.b.op1("Transpose", [c.value(w)], perm=[1, 0])])
    return y if bias is None else c.b.op1("Add", [y, c.value(bias)])


@rule("matmul", "mm", "bmm")
def _matmul_rule(c: Converter, node, a, b):
    return c.b.op1("MatMul", [c.value(a), c.value(b)])


@rule("addmm")
def _addmm_rule(c: Converter, node, bias, a, b, beta=1, alpha=1):
    return c.b.op1("Gemm", [c.value(a), c.value(b), c.value(bias)], alpha=float(alpha), beta=float(beta))


@rule("convolution")
def _conv_rule(c: Converter, node, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    inputs = [c.value(x), c.value(w)] + ([c.value(bias)] if bias is not None else [])
    attrs = dict(strides=list(stride), pads=list(padding) * 2, dilations=list(dilation), group=int(groups))
    if transposed:
        return c.b.op1("ConvTranspose", inputs, output_padding=list(output_padding), **attrs)
    return c.b.op1("Conv", inputs, **attrs)


@rule("native_batch_norm")
def _batch_norm_rule(c: Converter, node, x, w, b, mean, var, training, momentum, eps):
    if training:
        raise OnnxExporterError("flambeau.onnx.export: batch_norm in training mode (call model.eval() first)")
    return [c.b.op1("BatchNormalization", [c.value(x), c.value(w), c.value(b), c.value(mean), c.value(var)],
                    epsilon=float(eps)), None, None]


@rule("native_layer_norm")
def _layer_norm_rule(c: Converter, node, x, shape, w, b, eps):
    ins = [c.value(x), c.value(w) if w is not None else c.b.const(np.ones(list(shape), _np_dtype(x.meta["val"])))]
    if b is not None:
        ins.append(c.value(b))
    return [c.b.op1("LayerNormalization", ins, axis=-len(shape), epsilon=float(eps)), None, None]


@rule("max_pool2d_with_indices")
def _max_pool_rule(c: Converter, node, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    def pair(v):
        return list(v) if isinstance(v, (list, tuple)) else [int(v)] * 2
    k = pair(kernel)
    s = pair(stride) if stride not in ((), []) else k
    p, d = pair(padding), pair(dilation)
    return [c.b.op1("MaxPool", [c.value(x)], kernel_shape=k, strides=s, pads=p * 2, dilations=d,
                    ceil_mode=int(ceil_mode)), None]


@rule("softmax.int")
def _softmax_rule(c: Converter, node, x, dim, dtype=None):
    return c.b.op1("Softmax", [c.value(x)], axis=int(dim))


@rule("log_softmax.int")
def _log_softmax_rule(c: Converter, node, x, dim, dtype=None):
    return c.b.op1("LogSoftmax", [c.value(x)], axis=int(dim))


@rule("embedding")
def _embedding_rule(c: Converter, node, w, idx, *rest):
    return c.b.op1("Gather", [c.value(w), c.value(idx)], axis=0)


@rule("mean.dim", "sum.dim_IntList")
def _reduce_rule(c: Converter, node, x, dim=None, keepdim=False, dtype=None):
    kind = "ReduceMean" if node.target.name == "mean.dim" else "ReduceSum"
    ins = [c.value(x)] + ([c.b.ints(list(dim))] if dim else [])
    return c.b.op1(kind, ins, keepdims=int(keepdim))


@rule("_sdpa_math")
def _sdpa_rule(c: Converter, node, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
    out, probs = _attention(c, q, k, v, attn_mask, is_causal, scale)
    return [out, probs, None]


@rule("_sdpa_flash_cpu")
def _sdpa_flash_cpu_rule(c: Converter, node, q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    return [_attention(c, q, k, v, attn_mask, is_causal, scale)[0], None]


def _attention(c: Converter, q, k, v, attn_mask, is_causal, scale):
    """(output, probabilities) of scaled-dot-product attention as ONNX MatMul/Softmax nodes."""
    qv = q.meta["val"]
    e = qv.shape[-1]
    sc = scale if scale is not None else 1.0 / math.sqrt(int(e))
    kt = c.b.op1("Transpose", [c.value(k)], perm=list(range(_rank(k) - 2)) + [_rank(k) - 1, _rank(k) - 2])
    scores = c.b.op1("Mul", [c.b.op1("MatMul", [c.value(q), kt]), c.scalar_like(sc, q)])
    if is_causal:
        shape = c.b.op1("Concat", [c.b.op1("Shape", [c.value(q)], start=-2, end=-1),
                                   c.b.op1("Shape", [c.value(k)], start=-2, end=-1)], axis=0)
        ones = c.b.op1("ConstantOfShape", [shape], value=c.b.onnx.helper.make_tensor("one", ONNX_FLOAT, [1], [1.0]))
        keep = c.b.op1("Cast", [c.b.op1("Trilu", [ones], upper=0)], to=ONNX_BOOL)
        scores = c.b.op1("Where", [keep, scores, c.scalar_like(-np.inf, q)])
    if attn_mask is not None:
        m = attn_mask.meta["val"]
        if m.dtype.name == "bool":
            scores = c.b.op1("Where", [c.value(attn_mask), scores, c.scalar_like(-np.inf, q)])
        else:
            scores = c.b.op1("Add", [scores, c.value(attn_mask)])
    probs = c.b.op1("Softmax", [scores], axis=-1)
    return c.b.op1("MatMul", [probs, c.value(v)]), probs


@rule("_taps_gather")
def _taps_gather_rule(c: Converter, node, x, indices, weights):
    """Per trailing axis: the sum over taps t of x gathered at indices[:, t] times weights[:, t] (pooling and
    resampling tables, constants of the program)."""
    r = _rank(x)
    v = c.value(x)
    for i, idx in enumerate(indices):
        ax = r - len(indices) + i
        taps = int(idx.meta["val"].shape[1])
        total = None
        for t in range(taps):
            col = c.b.op1("Gather", [c.value(idx), c.b.const(t, np.int64)], axis=1)
            term = c.b.op1("Gather", [v, col], axis=ax)
            if weights:
                w = c.b.op1("Gather", [c.value(weights[i]), c.b.const(t, np.int64)], axis=1)
                w = c.b.op1("Reshape", [c.b.op1("Cast", [w], to=_onnx_type(c, x)), c.b.ints([-1] + [1] * (r - ax - 1))])
                term = c.b.op1("Mul", [term, w])
            total = term if total is None else c.b.op1("Add", [total, term])
        v = total
    return v


def _onnx_type(c: Converter, node) -> int:
    return c.b.helper.np_dtype_to_tensor_dtype(np.dtype(_np_dtype(node.meta["val"])))


# ---- shapes ---------------------------------------------------------------------------------------------
@rule("view")
def _view_rule(c: Converter, node, x, size):
    return c.b.op1("Reshape", [c.value(x), c.size_list(size)])


@rule("transpose.int")
def _transpose_rule(c: Converter, node, x, d0, d1):
    r = _rank(x)
    perm = list(range(r))
    perm[d0 % r], perm[d1 % r] = perm[d1 % r], perm[d0 % r]
    return c.b.op1("Transpose", [c.value(x)], perm=perm)


@rule("permute")
def _permute_rule(c: Converter, node, x, dims):
    r = _rank(x)
    return c.b.op1("Transpose", [c.value(x)], perm=[d % r for d in dims])


@rule("unsqueeze")
def _unsqueeze_rule(c: Converter, node, x, dim):
    return c.b.op1("Unsqueeze", [c.value(x), c.b.ints([dim % (_rank(x) + 1)])])


@rule("expand")
def _expand_rule(c: Converter, node, x, size, implicit=False):
    return c.b.op1("Expand", [c.value(x), c.size_list([s if s != -1 else o for s, o in
                                                         zip(size, node.meta["val"].shape)])])


@rule("slice.Tensor")
def _slice_rule(c: Converter, node, x, dim=0, start=None, end=None, step=1):
    def bound(v, default):
        if v is None:
            return c.b.ints([default])
        return c.env[v.name] if hasattr(v, "op") else c.b.ints([min(int(v), INT64_MAX)])
    return c.b.op1("Slice", [c.value(x), bound(start, 0), bound(end, INT64_MAX), c.b.ints([dim]), c.b.ints([step])])


@rule("select.int")
def _select_rule(c: Converter, node, x, dim, index):
    idx = c.b.const(int(index), np.int64) if not hasattr(index, "op") else c.b.op1(
        "Squeeze", [c.env[index.name], c.b.ints([0])])
    return c.b.op1("Gather", [c.value(x), idx], axis=int(dim))


@rule("split_with_sizes")
def _split_rule(c: Converter, node, x, sizes, dim=0):
    n = len(node.meta["val"])
    if isinstance(sizes, int):
        sizes = [int(v.shape[dim]) for v in node.meta["val"]]
    return c.b.op("Split", [c.value(x), c.size_list(sizes)], n, axis=int(dim))


@rule("cat")
def _cat_rule(c: Converter, node, tensors, dim=0):
    return c.b.op1("Concat", [c.value(t) for t in tensors], axis=int(dim) % _rank(node))


@rule("full")
def _full_rule(c: Converter, node, size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    value = np.array([fill_value], _np_dtype(node.meta["val"]))
    return c.b.op1("ConstantOfShape", [c.size_list(size)], value=c.b.onnx.numpy_helper.from_array(value))


# ---- control flow: flambeau.cond as an If of two subgraphs ----------------------------------------------
def _branch(c: Converter, gm, operands, name: str):
    """The GraphProto of a cond branch: its placeholders are the operands (outer-scope names), its
    constants go to the main graph's initializers (visible inside)."""
    sub = Converter(c.b)
    saved, c.b.nodes = c.b.nodes, []
    try:
        for ph, v in zip(gm.graph.find_nodes(op="placeholder"), operands):
            sub.env[ph.name] = v
        for n in gm.graph.nodes:
            if n.op == "call_function":
                sub.env[n.name] = convert_call(sub, n)
        outs = []
        for v in gm.graph.output_node().args[0]:
            out = c.b.fresh(f"{name}_out")
            c.b.nodes.append(c.b.helper.make_node("Identity", [sub.env[v.name]], [out], name=c.b.fresh("n_out")))
            val = v.meta["val"]
            outs.append(c.b.helper.make_tensor_value_info(out, _onnx_type(c, v), [None] * len(val.shape)))
        return c.b.helper.make_graph(c.b.nodes, name, [], outs)
    finally:
        c.b.nodes = saved


def _cond_rule(c: Converter, node, pred, true_gm, false_gm, operands):
    ops = [c.value(o) for o in operands]
    then_g = _branch(c, c.env[true_gm.name], ops, c.b.fresh("then"))
    else_g = _branch(c, c.env[false_gm.name], ops, c.b.fresh("else"))
    cond = c.b.op1("Cast", [c.value(pred)], to=ONNX_BOOL)
    return c.b.op("If", [cond], len(then_g.output), then_branch=then_g, else_branch=else_g)


# ---- Python-level nodes ---------------------------------------------------------------------------------
_SIZE_OPS = {operator.add: "Add", operator.sub: "Sub", operator.mul: "Mul", operator.floordiv: "Div"}


def convert_call(c: Converter, node):
    t = node.target
    if t is operator.getitem:
        return c.env[node.args[0].name][node.args[1]]
    if t is cond_op:
        return _cond_rule(c, node, *node.args)
    if t is sym_size:
        return c.b.op1("Shape", [c.env[node.args[0].name]], start=node.args[1], end=node.args[1] + 1)
    if t in _SIZE_OPS:
        a, b = (c.env[x.name] if hasattr(x, "op") else c.b.ints([int(x)]) for x in node.args)
        return c.b.op1(_SIZE_OPS[t], [a, b])
    name = getattr(t, "name", None)
    fn = RULES.get(name)
    if fn is None:
        raise OnnxExporterError(f"flambeau.onnx.export: no ONNX rule for the operator {name or t!r} (node "
                                f"{node.name}); supported: {', '.join(sorted(RULES))}")
    return fn(c, node, *node.args, **node.kwargs)


def value_info(onnx, name: str, val, dim_names: dict):
    dims = []
    for s in val.shape:
        if isinstance(s, SymInt):
            dims.append(dim_names.get(s.expr, str(s.expr)))
        else:
            dims.append(int(s))
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(_np_dtype(val)))
    return onnx.helper.make_tensor_value_info(name, elem, dims)
