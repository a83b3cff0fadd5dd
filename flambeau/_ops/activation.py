"""Activation functions (relu, gelu, softplus, ...), glu, prelu, rrelu, and distance functions
(normalize, cosine_similarity, pairwise_distance, cdist, pdist) for `flambeau.nn.functional`.

Pointwise activations are declared through `pointwise_family`: one forward op whose kernel runs
in the op-math dtype, plus a `<name>_backward` op computing the fused gradient (as ATen's
`threshold_backward`, `gelu_backward`, ...). The same factory serves elementwise losses.
"""
from __future__ import annotations

import math

import numpy as np

from .. import _dtype as D, random as R
from .._backends import triton_launch, is_cupy, namespace_device
from ._registry import defop, export, make_inplace, Op, register, TensorSpec, NN_FUNCTIONAL, Tag, EXPORTS
from ._helpers import result_type, opmath, round_to, zero_where_negative, broadcast_shapes, shape_of, wrap_dim, pointwise_strides
from .._dispatch import type_name, resize_out
from .memory_format import empty_strided_array
from .._device import canonical
from . import _batching, _sharding


def _np_erf(xp, x):
    if not is_cupy(xp):
        from scipy.special import erf  # deferred: scipy.special is slow to import
    else:
        from cupyx.scipy.special import erf  # deferred: optional dependency, present only where cuda is used
    return erf(x)


def _type_name(dt):
    return type_name(dt)


_FAST_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def fit(xp, r, shape, npdt, inputs=()):
    """A fresh array of `shape`/`npdt` holding `r` (broadcast), laid out as PyTorch lays out a pointwise
    result of `inputs` (`pointwise_perm`: C order unless the inputs' strides order the dims otherwise,
    e.g. a channels-last activation)."""
    want = pointwise_strides(shape, *inputs) if inputs else None
    if want is None:
        if getattr(r, "base", 0) is None and r.shape == tuple(shape) and r.dtype == npdt and r.flags.c_contiguous:
            return r                                   # already a fresh array of the right kind
        out = xp.empty(shape, dtype=npdt)
    else:
        if getattr(r, "base", 0) is None and r.shape == tuple(shape) and r.dtype == npdt and \
                all(b // r.itemsize == w for b, w, n in zip(r.strides, want, shape) if n != 1):
            return r
        out = empty_strided_array(xp, shape, want, npdt)
    out[...] = r
    return out


def _prepare(name, ins, ints):
    dt = result_type(*ins)
    if dt.category < D.FLOATING and not (ints and dt.category == D.INTEGER):
        raise RuntimeError(f"\"{name}\" not implemented for '{_type_name(dt)}'")
    cd = opmath(dt)
    arrs = []
    for x in ins:
        x = round_to(x, dt)
        arrs.append(x if type(x) in (int, float, bool) else x.astype(cd, copy=False))
    return dt, cd, arrs


_FUSED_GELU = {"none": 0, "tanh": 1}     # triton_pointwise.GELU_ERF, GELU_TANH (not imported: it loads Triton)
_FUSED_SILU = 2                          # triton_pointwise.SILU
_FUSED_RELU = 3                          # triton_pointwise.RELU


def _fused_pointwise(xp, kind, arrays):
    """`_backends.triton_pointwise` when kernel `kind` can take these arrays on cuda, else None."""
    if kind is None or getattr(xp, "__name__", "") != "cupy" or not triton_launch.available():
        return None
    nd = xp.ndarray
    for a in arrays:
        if not isinstance(a, nd):
            return None
    tp = pointwise_kernels()
    return tp if tp.supported(*arrays) else None


def pointwise_kernels():
    """`_backends.triton_pointwise` (activations, half-precision arithmetic, dropout), imported at the
    first fused call: it imports Triton."""
    if not _triton_pointwise:
        from .._backends import triton_pointwise  # deferred: imports Triton, optional (cuda only)
        _triton_pointwise.append(triton_pointwise)
    return _triton_pointwise[0]


_triton_pointwise: list = []      # the module, imported at the first fused call


def pointwise_family(name, params="", *, fwd, bwd, tensors=("self",), ints=False, method=False,
                     function=False, inplace=False, namespace=None, grads=None, tags=(), backward_tags=(),
                     fused_kind=None, from_result=False):
    """Declare `name(Tensor <tensors>..., <params>) -> Tensor` and `name_backward`.

    fwd(xp, *arrays, *params) -> array; bwd(xp, grad, *arrays, *params) -> grad per tensor input
    (a tuple when several). `grads` limits which inputs get gradients (names), default all.
    `fused_kind(*params)`: the `_backends.triton_pointwise` kernel kind serving these parameters on
    cuda (one kernel each way), or None. `from_result`: `bwd` gives the same gradient from the output
    as from the input (ReLU), so autograd saves the output (as PyTorch's threshold_backward(grad,
    result, 0)): the input need not stay alive when the next layer keeps the output anyway.
    """
    nin = len(tensors)
    tsig = ", ".join(f"Tensor {t}" for t in tensors)
    sig = tsig + (", " + params if params else "")
    op = Op(f"{name}({sig}) -> Tensor", tags=tags)
    rets = "Tensor" if nin == 1 else "(" + ", ".join(["Tensor"] * nin) + ")"
    bop = Op(f"{name}_backward(Tensor grad_output, {sig}) -> {rets}", tags=backward_tags)

    def kernel(xp, *a, **k):
        if not params and nin == 1 and len(a) == 1 and not k and type(a[0]) is np.ndarray \
                and a[0].dtype in _FAST_FLOATS:
            x = a[0]                               # fast path: one float32/64 array, default params
            r = fwd(xp, x)                         # a fresh array of x's shape and dtype (ufuncs of x)
            return r if r.flags.c_contiguous and x.flags.c_contiguous else fit(xp, r, x.shape, x.dtype, (x,))
        b = op.bind(*a, **k)
        fused = fused_kind and _fused_pointwise(xp, fused_kind(*b[nin:]), b[:nin])
        if fused:
            return fused.forward(b[0], fused_kind(*b[nin:]))
        dt, cd, arrs = _prepare(name, b[:nin], ints)
        r = fwd(xp, *arrs, *b[nin:])
        return fit(xp, r, broadcast_shapes(*(shape_of(x) for x in b[:nin])), dt.np, b[:nin])

    def meta(*a, **k):
        b = op.bind(*a, **k)
        dt = result_type(*b[:nin])
        if dt.category < D.FLOATING and not (ints and dt.category == D.INTEGER):
            raise RuntimeError(f"\"{name}\" not implemented for '{_type_name(dt)}'")
        shape = broadcast_shapes(*(shape_of(x) for x in b[:nin]))
        return TensorSpec(shape, dt, pointwise_strides(shape, *b[:nin]))

    def bkernel(xp, *a, **k):
        if not params and nin == 1 and len(a) == 2 and not k and type(a[0]) is np.ndarray \
                and type(a[1]) is np.ndarray and a[0].dtype in _FAST_FLOATS and a[1].dtype == a[0].dtype \
                and a[0].shape == a[1].shape:
            r = bwd(xp, *a)                        # fast path: gradient and input of one float32/64 shape
            return r if r.flags.c_contiguous and a[0].flags.c_contiguous and a[1].flags.c_contiguous \
                else fit(xp, r, r.shape, r.dtype, a)
        b = bop.bind(*a, **k)
        g, ins = b[0], b[1:1 + nin]
        fused = fused_kind and _fused_pointwise(xp, fused_kind(*b[1 + nin:]), (g, *ins))
        if fused:
            return fused.backward(g, ins[0], fused_kind(*b[1 + nin:]))
        dt, cd, arrs = _prepare(name, ins, ints)
        shape = broadcast_shapes(shape_of(g), *(shape_of(x) for x in ins))
        r = bwd(xp, g.astype(cd, copy=False), *arrs, *b[1 + nin:])
        if nin == 1:
            return fit(xp, r, shape, dt.np, (g, *ins))
        return tuple(None if x is None else fit(xp, x, shape, dt.np, (g, *ins)) for x in r)

    def bmeta(*a, **k):
        b = bop.bind(*a, **k)
        shape = broadcast_shapes(*(shape_of(x) for x in b[:1 + nin]))
        dt = result_type(*b[1:1 + nin])
        st = pointwise_strides(shape, *b[:1 + nin])
        return TensorSpec(shape, dt, st) if nin == 1 else tuple(TensorSpec(shape, dt, st) for _ in range(nin))

    names = [x.name for x in op._schema.args]
    want = set(grads or tensors)

    def derivative(grad, **kw):
        r = bop(grad, *[kw[n] for n in tensors], **{n: kw[n] for n in names[nin:]})
        if nin == 1:
            return r
        return tuple(g if t in want else None for g, t in zip(r, tensors))

    def derivative_from_result(grad, **kw):
        return bop(grad, kw["result"], **{n: kw[n] for n in names[nin:]})

    op.kernel, op.meta = kernel, meta
    bop.kernel, bop.meta = bkernel, bmeta
    if from_result:
        op.derivative, op.saved_names = derivative_from_result, ("result",) + tuple(names[nin:])
    else:
        op.derivative, op.saved_names = derivative, tuple(names)
    op.def_batching_rule(_batching.pointwise_rule(op))
    bop.def_batching_rule(_batching.pointwise_rule(bop))
    register(op, method=method, function=function)
    register(bop, function=False)
    if namespace:
        NN_FUNCTIONAL[name] = op
    if inplace:
        make_inplace(op, method=method)
    return op


def _hardtanh(xp, x, lo, hi):
    """clamp(x, lo, hi) where a tie keeps x: hardtanh(-0.0, 0.0, 6.0) is -0.0, as PyTorch's."""
    x = xp.where(x < lo, lo, x)
    return xp.where(x > hi, hi, x)


def _sigmoid(xp, x):
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _softplus(xp, x):
    return xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))


# ---- pointwise activations ----------------------------------------------------------------
# A backward that masks selects (`where(mask, 0, g)`, as ATen's kernels), never multiplies by the
# mask: an inf or NaN gradient outside the mask gives 0, not NaN. A NaN input passes the gradient
# where ATen's formula (its CUDA kernel, its CPU scalar loop) compares `x <= lo`-style; PyTorch's
# CPU vector blocks of hardtanh/hardswish/hard- and softshrink give 0 or NaN there instead, by layout.
relu = pointwise_family("relu", fwd=lambda xp, x: zero_where_negative(xp, x, x, False),   # relu(-0.0) is -0.0
                        bwd=lambda xp, g, x: zero_where_negative(xp, x, g, True), ints=True, method=True, function=True,
                        inplace=True, tags=(Tag.recomputable, Tag.no_fp_errors), fused_kind=lambda: _FUSED_RELU,
                        from_result=True)

leaky_relu = pointwise_family(
    "leaky_relu", "Scalar negative_slope=0.01",
    fwd=lambda xp, x, s: xp.where(x > 0, x, x * s),
    bwd=lambda xp, g, x, s: xp.where(x > 0, g, g * s), inplace=True)


def _elu_fwd(xp, x, alpha, scale, input_scale):
    neg = alpha * xp.expm1(xp.where(x > 0, 0, x) * input_scale)     # elu(-0.0) is -0.0
    return scale * xp.where(x > 0, x, neg)


def _elu_bwd(xp, g, x, alpha, scale, input_scale):
    d = alpha * input_scale * xp.exp(xp.minimum(x, 0) * input_scale)
    return g * scale * xp.where(x > 0, 1, d)


elu = pointwise_family("elu", "Scalar alpha=1, Scalar scale=1, Scalar input_scale=1", fwd=_elu_fwd,
                       bwd=_elu_bwd, inplace=True)


def _gelu_fwd(xp, x, approximate):
    """The cube as x * x * x, as ATen's kernel (NumPy's float32 `x ** 3` calls powf: ~300x slower)."""
    if approximate == "tanh":
        k = math.sqrt(2 / math.pi)
        return 0.5 * x * (1 + xp.tanh(k * (x + 0.044715 * (x * x * x))))
    return 0.5 * x * (1 + _np_erf(xp, x / math.sqrt(2)))


def _gelu_bwd(xp, g, x, approximate):
    if approximate == "tanh":
        k = math.sqrt(2 / math.pi)
        x2 = x * x
        t = xp.tanh(k * (x + 0.044715 * (x2 * x)))
        return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x2))
    cdf = 0.5 * (1 + _np_erf(xp, x / math.sqrt(2)))
    pdf = xp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return g * (cdf + x * pdf)


gelu = pointwise_family("gelu", "*, str approximate='none'", fwd=_gelu_fwd, bwd=_gelu_bwd, tags=(Tag.recomputable,),
                        fused_kind=lambda approximate="none": _FUSED_GELU.get(approximate))


def _silu_bwd(xp, g, x):
    s = _sigmoid(xp, x)
    return g * s * (1 + x * (1 - s))


def _silu_fwd(xp, x):
    """x / (1 + exp(-x)), one rounding less than x * sigmoid(x), as PyTorch's CPU kernel (its
    result to the bit; exp(-x) overflows to inf for very negative x, giving -0, and NaN at -inf)."""
    return x / (1 + xp.exp(-x))


silu = pointwise_family("silu", fwd=_silu_fwd, bwd=_silu_bwd, inplace=True,
                        tags=(Tag.recomputable,), fused_kind=lambda: _FUSED_SILU)


def _mish_bwd(xp, g, x):
    t = xp.tanh(_softplus(xp, x))
    return g * (t + x * _sigmoid(xp, x) * (1 - t * t))


mish = pointwise_family("mish", fwd=lambda xp, x: x * xp.tanh(_softplus(xp, x)), bwd=_mish_bwd,
                        inplace=True)

hardtanh = pointwise_family(
    "hardtanh", "Scalar min_val=-1, Scalar max_val=1",
    fwd=lambda xp, x, lo, hi: _hardtanh(xp, x, lo, hi),
    bwd=lambda xp, g, x, lo, hi: xp.where((x <= lo) | (x >= hi), 0, g), inplace=True)

hardsigmoid = pointwise_family(
    "hardsigmoid", fwd=lambda xp, x: xp.minimum(xp.maximum(x / 6 + 0.5, 0), 1),
    bwd=lambda xp, g, x: xp.where((x > -3) & (x < 3), g / 6, 0), inplace=True)

hardswish = pointwise_family(
    "hardswish", fwd=lambda xp, x: x * xp.minimum(xp.maximum(x + 3, 0), 6) / 6,
    bwd=lambda xp, g, x: xp.where(x <= -3, 0, xp.where(x < 3, g * (x / 3 + 0.5), g)), inplace=True)


def _softplus_fwd(xp, x, beta, threshold):
    bx = x * beta
    return xp.where(bx > threshold, x, _softplus(xp, bx) / beta)


softplus = pointwise_family(
    "softplus", "Scalar beta=1, Scalar threshold=20", fwd=_softplus_fwd,
    bwd=lambda xp, g, x, beta, th: xp.where(x * beta > th, g, g * _sigmoid(xp, x * beta)),
    namespace="nn.functional", tags=(Tag.autocast_fp32,))

softshrink = pointwise_family(
    "softshrink", "Scalar lambd=0.5",
    fwd=lambda xp, x, l: xp.where(xp.abs(x) <= l, 0, xp.where(x > l, x - l, x + l)),   # NaN kept; see decomposition
    bwd=lambda xp, g, x, l: xp.where((x >= -l) & (x <= l), 0, g))

hardshrink = pointwise_family(
    "hardshrink", "Scalar lambd=0.5", fwd=lambda xp, x, l: xp.where((x >= -l) & (x <= l), 0, x),  # NaN kept
    bwd=lambda xp, g, x, l: xp.where((x >= -l) & (x <= l), 0, g), method=True, function=True, namespace="nn.functional")

threshold = pointwise_family(
    "threshold", "Scalar threshold, Scalar value", fwd=lambda xp, x, th, v: xp.where(x <= th, v, x),  # NaN kept
    bwd=lambda xp, g, x, th, v: xp.where(x <= th, 0, g), ints=True, function=True, inplace=True,
    backward_tags=(Tag.recomputable,))

log_sigmoid = pointwise_family(
    "log_sigmoid", fwd=lambda xp, x: xp.minimum(x, 0) - xp.log1p(xp.exp(-xp.abs(x))),   # +0.0 at inf
    bwd=lambda xp, g, x: g * _sigmoid(xp, -x))



# softsign and tanhshrink are compositions in PyTorch (`torch.nn.functional`), not operators: their
# gradients are those of the composition (softsign's inf gradient meets -inf through abs: NaN).
@export("softsign", namespace="nn.functional", function=False)
def softsign(input):
    return input / (input.abs() + 1)


@export("tanhshrink", namespace="nn.functional", function=False)
def tanhshrink(input):
    return input - input.tanh()


# ---- nn.functional wrappers (inplace= flags, legacy names) --------------------------------
def _maybe_inplace(op, input, inplace, *args, **kwargs):
    return op.inplace(input, *args, **kwargs) if inplace else op(input, *args, **kwargs)


@export("relu", namespace="nn.functional", function=False)
def F_relu(input, inplace=False):
    return _maybe_inplace(relu, input, inplace)


@export("relu_", namespace="nn.functional", function=False)
def F_relu_(input):
    return relu.inplace(input)


@export("relu6", namespace="nn.functional", function=False)
def relu6(input, inplace=False):
    return _maybe_inplace(hardtanh, input, inplace, 0.0, 6.0)


@export("leaky_relu", namespace="nn.functional", function=False)
def F_leaky_relu(input, negative_slope=0.01, inplace=False):
    return _maybe_inplace(leaky_relu, input, inplace, negative_slope)


@export("leaky_relu_", namespace="nn.functional", function=False)
def F_leaky_relu_(input, negative_slope=0.01):
    return leaky_relu.inplace(input, negative_slope)


@export("elu", namespace="nn.functional", function=False)
def F_elu(input, alpha=1.0, inplace=False):
    return _maybe_inplace(elu, input, inplace, alpha)


@export("elu_", namespace="nn.functional", function=False)
def F_elu_(input, alpha=1.0):
    return elu.inplace(input, alpha)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


@export("selu")
def selu(input):
    return elu(input, _SELU_ALPHA, _SELU_SCALE)


@export("selu_")
def selu_(input):
    return elu.inplace(input, _SELU_ALPHA, _SELU_SCALE)


@export("selu", namespace="nn.functional", function=False)
def F_selu(input, inplace=False):
    return selu_(input) if inplace else selu(input)


@export("celu")
def celu(input, alpha=1.0):
    if alpha == 0:
        raise RuntimeError("ZeroDivisionError")
    return elu(input, alpha, 1.0, 1.0 / alpha)


@export("celu_")
def celu_(input, alpha=1.0):
    return elu.inplace(input, alpha, 1.0, 1.0 / alpha)


@export("celu", namespace="nn.functional", function=False)
def F_celu(input, alpha=1.0, inplace=False):
    return celu_(input, alpha) if inplace else celu(input, alpha)


@export("gelu", namespace="nn.functional", function=False)
def F_gelu(input, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise RuntimeError("approximate argument must be either none or tanh.")
    return gelu(input, approximate=approximate)


@export("silu", namespace="nn.functional", function=False)
def F_silu(input, inplace=False):
    return _maybe_inplace(silu, input, inplace)


@export("mish", namespace="nn.functional", function=False)
def F_mish(input, inplace=False):
    return _maybe_inplace(mish, input, inplace)


@export("hardtanh", namespace="nn.functional", function=False)
def F_hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    if min_val > max_val:
        raise ValueError("min_val cannot be greater than max_val")
    return _maybe_inplace(hardtanh, input, inplace, min_val, max_val)


@export("hardtanh_", namespace="nn.functional", function=False)
def F_hardtanh_(input, min_val=-1.0, max_val=1.0):
    return hardtanh.inplace(input, min_val, max_val)


@export("hardsigmoid", namespace="nn.functional", function=False)
def F_hardsigmoid(input, inplace=False):
    return _maybe_inplace(hardsigmoid, input, inplace)


@export("hardswish", namespace="nn.functional", function=False)
def F_hardswish(input, inplace=False):
    return _maybe_inplace(hardswish, input, inplace)


@export("softshrink", namespace="nn.functional", function=False)
def F_softshrink(input, lambd=0.5):
    if lambd < 0:
        raise RuntimeError(f"lambda must be greater or equal to 0, but found to be {lambd}.")
    return softshrink(input, lambd)


@export("threshold", namespace="nn.functional", function=False)
def F_threshold(input, threshold, value, inplace=False):
    return _maybe_inplace(globals()["threshold"], input, inplace, threshold, value)


@export("threshold_", namespace="nn.functional", function=False)
def F_threshold_(input, threshold, value):
    return globals()["threshold"].inplace(input, threshold, value)


@export("logsigmoid", namespace="nn.functional", function=False)
def logsigmoid(input):
    return log_sigmoid(input)


@export("sigmoid", namespace="nn.functional", function=False)
def F_sigmoid(input):
    return EXPORTS["sigmoid"](input)


@export("tanh", namespace="nn.functional", function=False)
def F_tanh(input):
    return EXPORTS["tanh"](input)


# ---- glu, prelu, rrelu ----------------------------------------------------------------------
def _float_check(name, a):
    dt = D.FROM_NP[a.dtype]
    if dt.category < D.FLOATING:
        raise RuntimeError(f"\"{name}\" not implemented for '{_type_name(dt)}'")
    return dt, opmath(dt)


def _glu_halves(self, dim):
    d = wrap_dim(dim, len(self.shape))
    n = self.shape[d] if len(self.shape) else 0
    if len(self.shape) == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    if n % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {d} is size {n}")
    return d, n // 2


@defop("glu(Tensor self, int dim=-1) -> Tensor", function=False, namespace="nn.functional")
def glu(xp, self, dim=-1):
    dt, cd = _float_check("glu", self)
    d, h = _glu_halves(self, dim)
    x = self.astype(cd, copy=False)
    a, b = xp.split(x, 2, axis=d)
    return (a * _sigmoid(xp, b)).astype(dt.np)


@glu.def_meta
def _(self, dim=-1):
    d, h = _glu_halves(self, dim)
    shape = tuple(h if i == d else s for i, s in enumerate(self.shape))
    return TensorSpec(shape, self.dtype, pointwise_strides(shape, self))    # the halves keep self's strides


@defop("glu_backward(Tensor grad_output, Tensor self, int dim) -> Tensor", function=False)
def glu_backward(xp, grad_output, self, dim):
    dt, cd = _float_check("glu", self)
    d, h = _glu_halves(self, dim)
    a, b = xp.split(self.astype(cd, copy=False), 2, axis=d)
    g = grad_output.astype(cd, copy=False)
    s = _sigmoid(xp, b)
    return xp.concatenate([g * s, g * a * s * (1 - s)], axis=d).astype(dt.np)


glu_backward.def_meta(lambda grad_output, self, dim: TensorSpec(self.shape, self.dtype))


@glu.def_derivative
def _(grad, self, dim):
    return glu_backward(grad, self, dim)


def _prelu_weight(xp, x, w):
    if w.ndim > 1 or (w.size != 1 and (x.ndim < 2 or w.size != x.shape[1])):
        c = x.shape[1] if x.ndim >= 2 else 1
        raise RuntimeError(f"Mismatch of parameter numbers and input channel size. Found parameter "
                           f"numbers = {w.size} and channel size = {c}.")
    if w.size == 1 or x.ndim < 2:
        return w.reshape(())
    return w.reshape((-1,) + (1,) * (x.ndim - 2))


@defop("prelu(Tensor self, Tensor weight) -> Tensor", method=True, namespace="nn.functional",
       tags=(Tag.autocast_lower_precision, Tag.cpu_autocast_lower_precision))
def prelu(xp, self, weight):
    dt, cd, (x, w) = _prepare("prelu", (self, weight), False)
    w = _prelu_weight(xp, x, w)
    return xp.where(x > 0, x, w * x).astype(dt.np)


prelu.def_meta(lambda self, weight: TensorSpec(self.shape, result_type(self, weight),
                                                pointwise_strides(self.shape, self)))


@defop("_prelu_kernel_backward(Tensor grad_output, Tensor self, Tensor weight) -> (Tensor, Tensor)",
       function=False)
def _prelu_kernel_backward(xp, grad_output, self, weight):
    dt, cd, (x, w) = _prepare("prelu", (self, weight), False)
    wb = _prelu_weight(xp, x, w)
    g = grad_output.astype(cd, copy=False)
    gx = xp.where(x > 0, g, wb * g)
    gw = xp.where(x > 0, 0, g * x)
    if w.size == 1 or x.ndim < 2:
        gw = gw.sum().reshape(weight.shape)
    else:
        gw = gw.sum(axis=tuple(i for i in range(x.ndim) if i != 1)).reshape(weight.shape)
    return gx.astype(dt.np), gw.astype(weight.dtype)


_prelu_kernel_backward.def_meta(lambda grad_output, self, weight: (TensorSpec(self.shape, self.dtype),
                                                                  TensorSpec(weight.shape, weight.dtype)))


@prelu.def_derivative
def _(grad, self, weight):
    return _prelu_kernel_backward(grad, self, weight)


def _rng(xp):
    if not is_cupy(xp):
        return R.generator_for(namespace_device(xp)).xp_generator(xp)
    return R.generator_for(canonical("cuda")).xp_generator(xp)


@defop("rrelu_with_noise_functional(Tensor self, Scalar lower, Scalar upper) -> (Tensor, Tensor noise)",
       function=False, tags=(Tag.nondeterministic_seeded,))
def rrelu_with_noise_functional(xp, self, lower, upper):
    dt, cd = _float_check("rrelu", self)
    x = self.astype(cd, copy=False)
    slope = (lower + (upper - lower) * _rng(xp).random(x.shape)).astype(cd)     # (CuPy's generator: no uniform)
    noise = xp.where(x > 0, 1, slope).astype(dt.np)
    return (x * noise).astype(dt.np), noise


rrelu_with_noise_functional.def_meta(
    lambda self, lower, upper: (TensorSpec(self.shape, self.dtype), TensorSpec(self.shape, self.dtype)))


@rrelu_with_noise_functional.def_derivative
def _(grad, result):
    return grad[0] * result[1]


@export("rrelu")
def rrelu(input, lower=1.0 / 8, upper=1.0 / 3, training=False, generator=None):
    if training:
        return rrelu_with_noise_functional(input, lower, upper)[0]
    return leaky_relu(input, (lower + upper) / 2)


@export("rrelu_")
def rrelu_(input, lower=1.0 / 8, upper=1.0 / 3, training=False, generator=None):
    if training:
        return input.mul_(rrelu_with_noise_functional(input.detach(), lower, upper)[1])
    return leaky_relu.inplace(input, (lower + upper) / 2)


@export("rrelu", namespace="nn.functional", function=False)
def F_rrelu(input, lower=1.0 / 8, upper=1.0 / 3, training=False, inplace=False):
    return (rrelu_ if inplace else rrelu)(input, lower, upper, training)


# ---- p-norm distances -----------------------------------------------------------------------
def _pnorm(xp, d, p, axis, keepdims=False):
    a = xp.abs(d)
    if p == 2:
        return xp.sqrt((a * a).sum(axis=axis, keepdims=keepdims))
    if p == 1:
        return a.sum(axis=axis, keepdims=keepdims)
    if p == math.inf:
        if a.size:
            return a.max(axis=axis, keepdims=keepdims)
        return xp.zeros(np.zeros(a.shape).max(axis=axis, keepdims=keepdims, initial=0).shape, a.dtype)
    if p == 0:
        return (a != 0).sum(axis=axis, keepdims=keepdims).astype(d.dtype)
    return (a ** p).sum(axis=axis, keepdims=keepdims) ** (1.0 / p)


def _pnorm_grad(xp, d, n, p, axis):
    """d||d||_p / dd, with n the norm kept over `axis`; zero where the norm is zero."""
    safe = xp.where(n == 0, 1, n)
    if p == 2:
        r = d / safe
    elif p == 1:
        r = xp.sign(d)
    elif p == math.inf:
        hit = (xp.abs(d) == n)
        r = xp.sign(d) * hit / hit.sum(axis=axis, keepdims=True)
    elif p == 0:
        r = xp.zeros_like(d)
    else:
        r = xp.sign(d) * xp.abs(d) ** (p - 1) / safe ** (p - 1)
    return xp.where(n == 0, 0, r)


@defop("normalize(Tensor self, float p=2.0, int dim=1, float eps=1e-12) -> Tensor", function=False)
def _normalize(xp, self, p=2.0, dim=1, eps=1e-12):
    dt, cd = _float_check("normalize", self)
    d = wrap_dim(dim, self.ndim)
    x = self.astype(cd, copy=False)
    n = _pnorm(xp, x, p, d, True) if self.ndim else xp.abs(x)
    return (x / xp.maximum(n, eps)).astype(dt.np)


_normalize.def_meta(lambda self, p=2.0, dim=1, eps=1e-12: TensorSpec(self.shape, self.dtype,
                                                                     pointwise_strides(self.shape, self)))


@defop("normalize_backward(Tensor grad_output, Tensor self, float p, int dim, float eps) -> Tensor",
       function=False)
def _normalize_backward(xp, grad_output, self, p, dim, eps):
    dt, cd = _float_check("normalize", self)
    d = wrap_dim(dim, self.ndim)
    x = self.astype(cd, copy=False)
    g = grad_output.astype(cd, copy=False)
    if not self.ndim:
        x, g, d = x.reshape(1), g.reshape(1), 0
    n = _pnorm(xp, x, p, d, True)
    den = xp.maximum(n, eps)
    gx = g / den - xp.where(n > eps, (g * x).sum(axis=d, keepdims=True) / (den * den), 0) * \
        _pnorm_grad(xp, x, n, p, d)
    return gx.reshape(self.shape).astype(dt.np)


_normalize_backward.def_meta(lambda grad_output, self, p, dim, eps: TensorSpec(self.shape, self.dtype))


@_normalize.def_derivative
def _(grad, self, p, dim, eps):
    return _normalize_backward(grad, self, p, dim, eps)


@export("normalize", namespace="nn.functional", function=False,
        tags=(Tag.autocast_fp32,))   # on cuda PyTorch's composite divides by a float32 norm
def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    r = _normalize(input, float(p), dim, eps)
    if out is not None:
        resize_out(out, r)
        return out
    return r


def _two(name, x1, x2):
    dt, cd, (a, b) = _prepare(name, (x1, x2), False)
    return dt, cd, a, b


@defop("cosine_similarity(Tensor x1, Tensor x2, int dim=1, float eps=1e-08) -> Tensor",
       namespace="nn.functional", tags=(Tag.autocast_fp32,))
def cosine_similarity(xp, x1, x2, dim=1, eps=1e-8):
    broadcast_shapes(shape_of(x1), shape_of(x2))
    dt, cd, a, b = _two("cosine_similarity", x1, x2)
    a, b = xp.broadcast_arrays(a, b)
    d = wrap_dim(dim, a.ndim)
    n1 = xp.maximum(_pnorm(xp, a, 2, d, True), eps)
    n2 = xp.maximum(_pnorm(xp, b, 2, d, True), eps)
    return xp.asarray(((a / n1) * (b / n2)).sum(axis=d)).astype(dt.np)


@cosine_similarity.def_meta
def _(x1, x2, dim=1, eps=1e-8):
    shape = broadcast_shapes(x1.shape, x2.shape)
    d = wrap_dim(dim, len(shape))
    return TensorSpec(tuple(s for i, s in enumerate(shape) if i != d), result_type(x1, x2))


@defop("cosine_similarity_backward(Tensor grad_output, Tensor x1, Tensor x2, int dim, float eps) -> "
       "(Tensor, Tensor)", function=False)
def _cos_backward(xp, grad_output, x1, x2, dim, eps):
    dt, cd, a, b = _two("cosine_similarity", x1, x2)
    a, b = xp.broadcast_arrays(a, b)
    d = wrap_dim(dim, a.ndim)
    r1, r2 = _pnorm(xp, a, 2, d, True), _pnorm(xp, b, 2, d, True)
    n1, n2 = xp.maximum(r1, eps), xp.maximum(r2, eps)
    y = ((a / n1) * (b / n2)).sum(axis=d, keepdims=True)
    g = xp.expand_dims(grad_output.astype(cd, copy=False), d)
    ga = g * (b / (n1 * n2) - xp.where(r1 > eps, y * a / (n1 * n1), 0))
    gb = g * (a / (n1 * n2) - xp.where(r2 > eps, y * b / (n2 * n2), 0))
    return ga.astype(dt.np), gb.astype(dt.np)


@_cos_backward.def_meta
def _(grad_output, x1, x2, dim, eps):
    shape = broadcast_shapes(x1.shape, x2.shape)
    dt = result_type(x1, x2)
    return TensorSpec(shape, dt), TensorSpec(shape, dt)


@cosine_similarity.def_derivative
def _(grad, x1, x2, dim, eps):
    return _cos_backward(grad, x1, x2, dim, eps)


@defop("pairwise_distance(Tensor x1, Tensor x2, float p=2, float eps=1e-06, bool keepdim=False) -> Tensor",
       namespace="nn.functional", tags=(Tag.autocast_fp32,))
def pairwise_distance(xp, x1, x2, p=2.0, eps=1e-6, keepdim=False):
    dt, cd, a, b = _two("pairwise_distance", x1, x2)
    d = a - b + eps
    if d.ndim == 0:
        return xp.abs(d).astype(dt.np) if p != 0 else (d != 0).astype(dt.np)
    return xp.asarray(_pnorm(xp, d, p, -1, keepdim)).astype(dt.np)


@pairwise_distance.def_meta
def _(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    shape = broadcast_shapes(x1.shape, x2.shape)
    out = shape if not shape else (shape[:-1] + ((1,) if keepdim else ()))
    return TensorSpec(out, result_type(x1, x2))


@defop("pairwise_distance_backward(Tensor grad_output, Tensor x1, Tensor x2, float p, float eps, "
       "bool keepdim) -> (Tensor, Tensor)", function=False)
def _pd_backward(xp, grad_output, x1, x2, p, eps, keepdim):
    dt, cd, a, b = _two("pairwise_distance", x1, x2)
    d = a - b + eps
    g = grad_output.astype(cd, copy=False)
    if d.ndim == 0:
        gd = g * _pnorm_grad(xp, d, xp.abs(d), p, None)
    else:
        n = _pnorm(xp, d, p, -1, True)
        gd = (g if keepdim else g[..., None]) * _pnorm_grad(xp, d, n, p, -1)
    return gd.astype(dt.np), (-gd).astype(dt.np)


@_pd_backward.def_meta
def _(grad_output, x1, x2, p, eps, keepdim):
    shape = broadcast_shapes(x1.shape, x2.shape)
    dt = result_type(x1, x2)
    return TensorSpec(shape, dt), TensorSpec(shape, dt)


@pairwise_distance.def_derivative
def _(grad, x1, x2, p, eps, keepdim):
    return _pd_backward(grad, x1, x2, p, eps, keepdim)


def _cdist_check(x1, x2, p):
    if len(x1.shape) < 2:
        raise RuntimeError(f"cdist only supports at least 2D tensors, X1 got: {len(x1.shape)}D")
    if len(x2.shape) < 2:
        raise RuntimeError(f"cdist only supports at least 2D tensors, X2 got: {len(x2.shape)}D")
    if x1.shape[-1] != x2.shape[-1]:
        raise RuntimeError(f"X1 and X2 must have the same number of columns. X1: {x1.shape[-1]} "
                           f"X2: {x2.shape[-1]}")
    if p < 0:
        raise RuntimeError("cdist only supports non-negative p values")


@defop("cdist(Tensor x1, Tensor x2, float p=2.0, int? compute_mode=None) -> Tensor",
       tags=(Tag.autocast_fp32, Tag.cpu_autocast_fp32))
def cdist(xp, x1, x2, p=2.0, compute_mode=None):
    _cdist_check(x1, x2, p)
    dt, cd, a, b = _two("cdist", x1, x2)
    d = a[..., :, None, :] - b[..., None, :, :]
    return xp.asarray(_pnorm(xp, d, p, -1)).astype(dt.np, order="C")    # torch: C order, whatever x1's layout


@cdist.def_meta
def _(x1, x2, p=2.0, compute_mode=None):
    _cdist_check(x1, x2, p)
    batch = broadcast_shapes(tuple(x1.shape[:-2]), tuple(x2.shape[:-2]))
    return TensorSpec(batch + (x1.shape[-2], x2.shape[-2]), result_type(x1, x2))


@defop("cdist_backward(Tensor grad_output, Tensor x1, Tensor x2, float p) -> (Tensor, Tensor)",
       function=False)
def _cdist_backward(xp, grad_output, x1, x2, p):
    dt, cd, a, b = _two("cdist", x1, x2)
    d = a[..., :, None, :] - b[..., None, :, :]
    n = _pnorm(xp, d, p, -1, True)
    gd = grad_output.astype(cd, copy=False)[..., None] * _pnorm_grad(xp, d, n, p, -1)
    return gd.sum(axis=-2).astype(dt.np), (-gd.sum(axis=-3)).astype(dt.np)


@_cdist_backward.def_meta
def _(grad_output, x1, x2, p):
    batch = tuple(grad_output.shape[:-2])
    dt = result_type(x1, x2)
    return TensorSpec(batch + tuple(x1.shape[-2:]), dt), TensorSpec(batch + tuple(x2.shape[-2:]), dt)


@cdist.def_derivative
def _(grad, x1, x2, p):
    return _cdist_backward(grad, x1, x2, p)


@defop("pdist(Tensor self, float p=2) -> Tensor", tags=(Tag.autocast_fp32,))
def pdist(xp, self, p=2.0):
    if self.ndim != 2:
        raise RuntimeError(f"pdist only supports 2D tensors, got: {self.ndim}D")
    dt, cd = _float_check("pdist", self)
    x = self.astype(cd, copy=False)
    i, j = np.triu_indices(x.shape[0], 1)
    i, j = xp.asarray(i), xp.asarray(j)
    return xp.asarray(_pnorm(xp, x[i] - x[j], p, -1)).astype(dt.np)


@pdist.def_meta
def _(self, p=2.0):
    if len(self.shape) != 2:
        raise RuntimeError(f"pdist only supports 2D tensors, got: {len(self.shape)}D")
    n = self.shape[0]
    return TensorSpec((n * (n - 1) // 2,), self.dtype)


@defop("pdist_backward(Tensor grad, Tensor self, float p) -> Tensor", function=False)
def _pdist_backward(xp, grad, self, p):
    dt, cd = _float_check("pdist", self)
    x = self.astype(cd, copy=False)
    n = x.shape[0]
    i, j = np.triu_indices(n, 1)
    i, j = xp.asarray(i), xp.asarray(j)
    d = x[i] - x[j]
    gd = grad.astype(cd, copy=False)[:, None] * _pnorm_grad(xp, d, _pnorm(xp, d, p, -1, True), p, -1)
    dense = xp.zeros((n, n, x.shape[1]), dtype=cd)
    dense[i, j] = gd
    return (dense.sum(axis=1) - dense.sum(axis=0)).astype(dt.np)


_pdist_backward.def_meta(lambda grad, self, p: TensorSpec(self.shape, self.dtype))


@pdist.def_derivative
def _(grad, self, p):
    return _pdist_backward(grad, self, p)


NN_FUNCTIONAL["pdist"] = pdist
_EXTRA = {"relu_": relu.inplace, "threshold_": threshold.inplace}
from ._registry import EXPORTS as _EXPORTS  # noqa: E402
_EXPORTS.update(_EXTRA)


# ---- vmap batching rules ----------------------------------------------------------------------------
glu.def_batching_rule(_batching.dim_rule(glu, "dim"))
_normalize.def_batching_rule(_batching.dim_rule(_normalize, "dim"))


# ---- DTensor sharding rules (elementwise, not tagged pointwise) ----------------------------------------
for _elementwise in (gelu, relu, silu):
    _elementwise.def_sharding_rule(_sharding.pointwise_rule)
