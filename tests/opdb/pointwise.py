"""Op-database entries for pointwise operators."""
from tests.opdb import OpInfo, S, T, ErrorSample, FLOATS, ALL_REAL, NUMERIC, FLOATS_AND_LOWP, INTS


def binary_samples(dtype):
    return [
        S(T((3, 4)), T((3, 4))),
        S(T((3, 4)), T((4,))),                        # broadcasting
        S(T((2, 1, 4)), T((3, 1))),                   # broadcasting both ways
        S(T(()), T((2, 3))),                          # 0-dim with dims
        S(T((0, 3)), T((3,))),                        # empty
        S(T((4, 3), noncontig=True), T((4, 3))),      # non-contiguous
        S(T((4, 3)), T((4, 3), expanded_from=(1, 3))),  # expanded
        S(T((3,)), 2),                                # Python scalar
        S(T((3,)), 2.5),
        S(T((3,)), T((), dtype="float64")),           # 0-dim of another dtype
        S(T((3,)), T((3,), dtype="int64")),           # mixed dtypes
    ]


def binary_errors():
    return [ErrorSample(S(T((3,)), T((4,))), RuntimeError, "size of tensor a")]


def unary_samples(dtype):
    return [S(T((3, 4))), S(T(())), S(T((0, 2))), S(T((4, 3), noncontig=True)), S(T((2, 3, 2)))]


OPS = [
    OpInfo("add", binary_samples, ops=("add.Tensor", "add_.Tensor"), dtypes=NUMERIC + FLOATS,
           method="add", inplace="add_", out=True, errors=binary_errors),
    OpInfo("add_alpha", lambda d: [S(T((3,)), T((3,)), alpha=2)], fn="add", dtypes=FLOATS),
    OpInfo("sub", binary_samples, ops=("sub.Tensor", "sub_.Tensor"), dtypes=NUMERIC, method="sub",
           inplace="sub_", out=True),
    OpInfo("mul", binary_samples, ops=("mul.Tensor", "mul_.Tensor"), dtypes=ALL_REAL, method="mul",
           inplace="mul_", out=True),
    OpInfo("div", lambda d: [S(T((3, 4)), T((3, 4), low=0.5, high=2)), S(T((3,)), 2), S(T((2, 3)), T((3,), low=1, high=3))],
           ops=("div.Tensor", "div_.Tensor"), dtypes=NUMERIC, method="div", inplace="div_", out=True),
    OpInfo("neg", unary_samples, ops=("neg", "neg_"), dtypes=NUMERIC, method="neg", inplace="neg_"),
    OpInfo("exp", unary_samples, ops=("exp", "exp_"), dtypes=NUMERIC, method="exp", inplace="exp_"),
    OpInfo("conj_physical", unary_samples, ops=("conj_physical", "conj_physical_"), dtypes=FLOATS + ("complex64",)),
]


# ---- unary math --------------------------------------------------------------------------------
INTS_AND_FLOATS = INTS + FLOATS_AND_LOWP
FLOAT_OUT = ("bool",) + INTS + FLOATS_AND_LOWP       # integral inputs promote to the default float
C64 = ("complex64",)


def U(lo=None, hi=None):
    """Unary samples with values in [lo, hi] (for integer dtypes, the integer range)."""
    def samples(dtype):
        ilo = None if lo is None else int(max(lo, 0 if dtype == "uint8" else lo))
        ihi = None if hi is None else int(hi) + 1
        isint = dtype in INTS
        kw = dict(low=ilo if isint else lo, high=ihi if isint else hi)
        return [S(T((3, 4), **kw)), S(T((), **kw)), S(T((0, 2), **kw)), S(T((4, 3), noncontig=True, **kw)),
                S(T((2, 3, 2), **kw))]
    return samples


def unary(name, dtypes, samples=None, *, inplace=True, grad=True, ops=None, **kw):
    return OpInfo(name, samples or U(), ops=ops or ((name, name + "_") if inplace else (name,)), dtypes=dtypes,
                  method=name, inplace=(name + "_") if inplace else None, out=True, grad=grad, **kw)


LOWTOL = {"float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1e-2)}
OPS += [
    unary("abs", NUMERIC + C64),
    unary("sign", ALL_REAL, grad=True),
    unary("sgn", ALL_REAL + C64, skip={"grad": "torch returns a ZeroTensor gradient for real inputs"}),
    unary("sqrt", FLOAT_OUT + C64, U(0.1, 5)),
    unary("rsqrt", FLOAT_OUT, U(0.5, 5)),
    unary("log", FLOAT_OUT + C64, U(0.5, 5)),
    unary("log2", FLOAT_OUT, U(0.5, 5)),
    unary("log10", FLOAT_OUT, U(0.5, 5)),
    unary("log1p", FLOAT_OUT, U(0, 5)),
    unary("expm1", FLOAT_OUT, U(-2, 2)),
    unary("exp2", FLOAT_OUT, U(-3, 3)),
    unary("sin", FLOAT_OUT + C64), unary("cos", FLOAT_OUT + C64), unary("tan", FLOAT_OUT, U(-1.2, 1.2)),
    unary("asin", FLOAT_OUT, U(-0.9, 0.9)), unary("acos", FLOAT_OUT, U(-0.9, 0.9)), unary("atan", FLOAT_OUT),
    unary("sinh", FLOAT_OUT), unary("cosh", FLOAT_OUT), unary("tanh", FLOAT_OUT + C64),
    unary("asinh", FLOAT_OUT), unary("acosh", FLOAT_OUT, U(1.2, 4)), unary("atanh", FLOAT_OUT, U(-0.9, 0.9)),
    unary("sigmoid", FLOAT_OUT + C64),
    unary("erf", FLOAT_OUT), unary("erfc", FLOAT_OUT), unary("erfinv", FLOAT_OUT, U(-0.9, 0.9)),
    unary("lgamma", FLOAT_OUT, U(0.2, 4)), unary("digamma", FLOAT_OUT, U(0.5, 4)),
    unary("i0", FLOAT_OUT, U(-3, 3)),
    unary("sinc", FLOAT_OUT), unary("deg2rad", FLOAT_OUT), unary("rad2deg", FLOAT_OUT),
    unary("floor", ALL_REAL + C64), unary("ceil", ALL_REAL), unary("trunc", ALL_REAL),
    unary("frac", ALL_REAL), unary("reciprocal", FLOAT_OUT + C64, U(0.5, 3)),
    unary("round", ALL_REAL, ops=("round", "round_")),
    OpInfo("round_decimals", lambda d: [S(T((3, 4), low=-50, high=50), decimals=2),
                                        S(T((5,), low=-500, high=500), decimals=-1)],
           fn="round", ops=("round.decimals", "round_.decimals"), dtypes=("float32", "float64"),
           method="round", inplace="round_", out=True),
    unary("fix", ALL_REAL, ops=()), unary("arcsin", FLOATS, U(-0.9, 0.9), ops=()),
    unary("arctanh", FLOATS, U(-0.9, 0.9), ops=()), unary("negative", NUMERIC, ops=()),
    unary("nan_to_num", FLOATS_AND_LOWP + INTS + ("bool",), lambda d: [
        S(T((6,), values=[float("nan"), float("inf"), -float("inf"), 1.5, -2.0, 0.0])),
        S(T((6,), values=[float("nan"), float("inf"), -float("inf"), 1.5, -2.0, 0.0]), nan=1.0, posinf=9.0),
        S(T((3, 4)), neginf=-5.0)] if d not in INTS + ("bool",) else [S(T((3, 4)))]),
    *[unary(n, ALL_REAL + C64, inplace=False, grad=False) for n in ("isnan", "isinf", "isfinite")],
    OpInfo("isnan_special", lambda d: [S(T((6,), values=[float("nan"), float("inf"), -float("inf"), 1.5, -2.0, -0.0]))],
           fn="isnan", dtypes=FLOATS_AND_LOWP, grad=False),
    *[unary(n, ALL_REAL, lambda d: [S(T((6,), values=[float("nan"), float("inf"), -float("inf"), 1.5, -2.0, -0.0]))]
            if d in FLOATS_AND_LOWP else [S(T((3, 4)))], inplace=False, grad=False,
            errors=lambda: [ErrorSample(S(T((3,), dtype="complex64")), RuntimeError)])
      for n in ("isposinf", "isneginf")],
    unary("signbit", ALL_REAL, inplace=False, grad=False),
    unary("angle", FLOAT_OUT + C64, inplace=False),
    OpInfo("real", lambda d: [S(T((3, 4))), S(T((2, 3), noncontig=True)), S(T((3,), dtype="complex128"))],
           ops=("_pw_real",),
           dtypes=FLOATS + C64 + ("complex128",), skip={"gradcheck": "complex inputs"}),
    OpInfo("imag", lambda d: [S(T((3, 4), dtype="complex128")), S(T((2, 3), noncontig=True, dtype="complex64"))],
           ops=("_pw_imag",),
           dtypes=("complex64", "complex128"), skip={"gradcheck": "complex inputs"},
           errors=lambda: [ErrorSample(S(T((3,), dtype="float32")), RuntimeError, "imag")]),
    OpInfo("view_as_real", lambda d: [S(T((3, 4))), S(T((2, 3), noncontig=True)), S(T(()))], ops=("view_as_real",),
           dtypes=("complex64", "complex128"),
           fallbacks={"view_as_real": "the code generators take no complex dtype: the op runs eagerly inside compiled code"},
           skip={"grad": "complex inputs (the gradient harness draws real ones): tests/test_complex_views.py "
                         "compares its gradient with PyTorch's", "gradcheck": "complex inputs"},
           errors=lambda: [ErrorSample(S(T((3,), dtype="float32")), RuntimeError,
                                       "view_as_real is only supported for complex tensors")]),
    OpInfo("view_as_complex", lambda d: [S(T((3, 4, 2))), S(T((2,)))], ops=("view_as_complex",), dtypes=FLOATS,
           fallbacks={"view_as_complex": "the code generators take no complex dtype: the op runs eagerly inside compiled code"},
           skip={"gradcheck": "complex outputs: test_grad compares the gradients with PyTorch's"},
           errors=lambda: [ErrorSample(S(T((3, 3), dtype="float32")), RuntimeError, "last dimension of size 2")]),
    OpInfo("complex", lambda d: [S(T((3, 4)), T((3, 4))), S(T((4, 1)), T((3,)))], ops=("complex",), dtypes=FLOATS,
           fallbacks={"complex": "the code generators take no complex dtype: the op runs eagerly inside compiled code"},
           skip={"gradcheck": "complex outputs: test_grad compares the gradients with PyTorch's"},
           errors=lambda: [ErrorSample(S(T((3,), dtype="float32"), T((3,), dtype="float64")), RuntimeError)]),
    OpInfo("polar", lambda d: [S(T((3, 4), low=0.1, high=2.0), T((3, 4)))], dtypes=FLOATS,
           fallbacks={"complex": "the code generators take no complex dtype: the op runs eagerly inside compiled code"},
           skip={"gradcheck": "complex outputs: test_grad compares the gradients with PyTorch's"}),
    unary("bitwise_not", ("bool",) + INTS + FLOATS, grad=False),
    unary("logical_not", ALL_REAL, grad=False),
    OpInfo("positive", lambda d: [S(T((3,)))], dtypes=ALL_REAL, method="positive"),
    OpInfo("square", U(), dtypes=ALL_REAL, method="square", inplace="square_", out=True),
    unary("logit", FLOAT_OUT, U(0.05, 0.95), ops=("logit", "logit_"), tol=LOWTOL),
    OpInfo("logit_eps", lambda d: [S(T((3, 4), low=0.0, high=1.0), eps=0.2)], fn="logit", dtypes=FLOATS,
           method="logit", inplace="logit_"),
    OpInfo("polygamma", lambda d: [S(1, T((3, 4), low=0.5, high=3)), S(2, T((5,), low=0.5, high=3)),
                                   S(0, T((2, 2), low=0.5, high=3))],
           ops=("polygamma",), dtypes=FLOAT_OUT, out=True, tol=LOWTOL),
    OpInfo("special.i1", U(-3, 3), fn="special.i1", ops=("special_i1",), dtypes=FLOATS),
]


# ---- binary and ternary ops --------------------------------------------------------------------
def B(lo=None, hi=None, olo=None, ohi=None, scalars=(2, 2.5)):
    """Binary samples: broadcasting, 0-dim, empty, non-contiguous, scalars, mixed dtypes."""
    def samples(dtype):
        a = dict(low=lo, high=hi)
        b = dict(low=olo if olo is not None else lo, high=ohi if ohi is not None else hi)
        out = [S(T((3, 4), **a), T((3, 4), **b)), S(T((3, 4), **a), T((4,), **b)),
               S(T((2, 1, 4), **a), T((3, 1), **b)), S(T((), **a), T((2, 3), **b)), S(T((0, 3), **a), T((3,), **b)),
               S(T((4, 3), noncontig=True, **a), T((4, 3), **b)), S(T((3,), **a), T((), dtype="float64", **b))]
        out += [S(T((3,), **a), s) for s in scalars]
        return out
    return samples


def binary(name, dtypes, samples=None, *, ops=None, inplace=True, grad=True, **kw):
    return OpInfo(name, samples or B(), ops=ops or ((name, name + "_") if inplace else (name,)), dtypes=dtypes,
                  method=name, inplace=(name + "_") if inplace else None, out=True, grad=grad, **kw)


def _ops(base, overload):
    return (f"{base}.{overload}", f"{base}_.{overload}")


INT_DIV = lambda d: [S(T((3, 4)), T((3, 4), low=1, high=5)), S(T((3, 4), low=-9, high=9), T((4,), low=-4, high=-1)),
                     S(T((3,)), 3), S(T((3,)), -2), S(T((0, 3)), T((3,), low=1, high=4)),
                     S(T((4, 3), noncontig=True), T((4, 3), low=1, high=5))]
DIV_ERRORS = lambda: [ErrorSample(S(T((3,), dtype="int64"), T((3,), dtype="int64", values=[1, 0, 2])),
                                  RuntimeError, "ZeroDivisionError")]
OPS += [
    OpInfo("div_trunc", lambda d: [S(T((3, 4)), T((3, 4), low=0.5, high=2), rounding_mode="trunc"),
                                   S(T((3, 4), low=-9, high=9), T((4,), low=-4, high=-1), rounding_mode="trunc"),
                                   S(T((3,)), 2, rounding_mode="trunc")],
           fn="div", ops=_ops("div", "Tensor_mode") + ("_div_trunc",), dtypes=NUMERIC, method="div",
           inplace="div_", out=True, errors=lambda: [
               ErrorSample(S(T((3,)), T((3,)), rounding_mode="bad"), RuntimeError, "rounding_mode")]),
    OpInfo("div_floor", lambda d: [S(T((3, 4)), T((3, 4), low=0.5, high=2), rounding_mode="floor"),
                                   S(T((3, 4), low=-9, high=9), T((4,), low=-4, high=-1), rounding_mode="floor"),
                                   S(T((3,)), T((3,)), rounding_mode=None)],
           fn="div", dtypes=NUMERIC, method="div", inplace="div_", out=True),
    OpInfo("true_divide", lambda d: [S(T((3, 4)), T((3, 4), low=1, high=3)), S(T((3,)), 2)], dtypes=ALL_REAL,
           method="true_divide", inplace="true_divide_", out=True),
    binary("floor_divide", NUMERIC, INT_DIV, grad=False, errors=DIV_ERRORS),
    binary("remainder", NUMERIC, INT_DIV, ops=_ops("remainder", "Tensor"), errors=DIV_ERRORS),
    binary("fmod", NUMERIC, INT_DIV, ops=_ops("fmod", "Tensor"), errors=DIV_ERRORS),
    OpInfo("floordiv_op", INT_DIV, call=lambda m, a, b: a // b, dtypes=NUMERIC, grad=False),
    OpInfo("mod_op", INT_DIV, call=lambda m, a, b: a % b, dtypes=NUMERIC),
    OpInfo("rfloordiv_op", lambda d: [S(T((3, 4), low=1, high=5))], call=lambda m, a: 7 // a, dtypes=NUMERIC,
           grad=False),
    binary("pow", NUMERIC, lambda d: [S(T((3, 4), low=0.5, high=2), T((3, 4), low=0, high=3)),
                                      S(T((3, 4), low=0.5, high=2), T((4,), low=-2, high=3)),
                                      S(T((3,), low=0.5, high=2), 2), S(T((3,), low=0.5, high=2), 0.5),
                                      S(T((3,), low=0.5, high=2), 0), S(T((), low=0.5, high=2), T((2, 2), low=0, high=3)),
                                      S(T((3,), low=-3, high=3), T((3,), low=-3, high=3, dtype="int64"))],
           ops=_ops("pow", "Tensor_Tensor"),
           errors=lambda: [ErrorSample(S(T((3,), dtype="int64"), -1), RuntimeError, "negative integer powers")]),
    OpInfo("pow_scalar_base", lambda d: [S(2, T((3, 4), low=0, high=3)), S(2.5, T((3,), low=-2, high=2))],
           fn="pow", dtypes=NUMERIC),
    OpInfo("pow_ops", lambda d: [S(T((3, 4), low=0, high=3))],
           call=lambda m, a: (a ** 2, 2 ** a, a ** 0.5 if a.is_floating_point() else a ** 3, 1.5 ** a),
           dtypes=ALL_REAL),
    OpInfo("pow_int_negative", lambda d: [S(T((6,), values=[1, -1, 2, -2, 0, 3]), T((6,), values=[-1, -3, -2, -1, 2, 2]))],
           fn="pow", dtypes=INTS[1:]),
    OpInfo("float_power", lambda d: [S(T((3, 4), low=0.5, high=2), T((3, 4), low=-1, high=2)), S(T((3,), low=0.5, high=2), 2),
                                     S(2, T((3,), low=-1, high=1))],
           ops=("float_power.Tensor_Tensor",), dtypes=NUMERIC, method="float_power", inplace="float_power_",
           out=True),
    binary("atan2", FLOAT_OUT), binary("arctan2", FLOATS, ops=()),
    binary("hypot", FLOATS_AND_LOWP),
    *[binary(n, ALL_REAL, inplace=False, errors=lambda: [ErrorSample(S(T((2,), dtype="complex64"), T((2,), dtype="complex64")))])
      for n in ("maximum", "minimum", "fmax", "fmin")],
    OpInfo("maximum_ties", lambda d: [S(T((4,), values=[1.0, 2.0, float("nan"), 3.0]), T((4,), values=[1.0, 3.0, 1.0, float("nan")]))],
           fn="maximum", dtypes=FLOATS, skip={"gradcheck": "ties and NaNs are not differentiable points"}),
    OpInfo("fmin_nan", lambda d: [S(T((4,), values=[1.0, 2.0, float("nan"), 3.0]), T((4,), values=[1.0, 3.0, 1.0, float("nan")]))],
           fn="fmin", dtypes=FLOATS, skip={"gradcheck": "ties and NaNs are not differentiable points"}),
    binary("copysign", FLOAT_OUT, ops=_ops("copysign", "Tensor")),
    binary("xlogy", FLOAT_OUT, B(0, 3, 0.5, 3), ops=_ops("xlogy", "Tensor")),
    binary("ldexp", FLOAT_OUT, B(-3, 3, -3, 3, scalars=(2,)), ops=_ops("ldexp", "Tensor")),
    binary("logaddexp", FLOATS_AND_LOWP, inplace=False), binary("logaddexp2", FLOATS_AND_LOWP, inplace=False),
    binary("nextafter", FLOATS_AND_LOWP, B(scalars=()), skip={"gradcheck": "piecewise constant step"}),
    *[binary(n, ALL_REAL, ops=_ops(n, "Tensor"), grad=False) for n in ("eq", "ne", "lt", "le", "gt", "ge")],
    *[binary(n, ALL_REAL, ops=(), grad=False) for n in ("greater", "less_equal", "not_equal")],
    binary("eq_complex", C64, fn="eq", ops=(), inplace=False, grad=False,
           fallbacks={"eq.Tensor": "complex64 operands: the code generator takes no complex dtype"}),
    OpInfo("compare_ops", lambda d: [S(T((3, 4)), T((3, 4))), S(T((3,)), 1)],
           call=lambda m, a, b: (a == b, a != b, a < b, a <= b, a > b, a >= b, 1 == a, a > 0.5), dtypes=ALL_REAL, grad=False),
    *[binary(n, ALL_REAL + C64, grad=False) for n in ("logical_and", "logical_or", "logical_xor")],
    *[binary(n, ("bool",) + INTS + FLOATS, ops=_ops(n, "Tensor"), grad=False) for n in
      ("bitwise_and", "bitwise_or", "bitwise_xor")],
    *[binary(n, ("bool",) + INTS + FLOATS, lambda d: [S(T((3, 4), low=0, high=9), T((3, 4), low=-2, high=80)),
                                                      S(T((3,)), 2), S(T((3,), low=-9, high=9), T((), low=0, high=4))],
             ops=_ops(n, "Tensor"), grad=False) for n in ("bitwise_left_shift", "bitwise_right_shift")],
    OpInfo("bit_ops", lambda d: [S(T((3, 4), low=0, high=5), T((3, 4), low=0, high=5))],
           call=lambda m, a, b: (a & b, a | b, a ^ b, ~a, a << 1, a >> 1, a & True if a.dtype == m.bool else a & 3),
           dtypes=("bool",) + INTS, grad=False),
    *[binary(n, ("bool",) + INTS + FLOATS, grad=False) for n in ("gcd", "lcm")],
    OpInfo("rsub", B(), ops=("rsub.Tensor",), dtypes=ALL_REAL),
    OpInfo("rsub_ops", lambda d: [S(T((3, 4)))], call=lambda m, a: (1 - a, 2.5 * a, 1 + a, 3 / a.abs().add(1)),
           dtypes=ALL_REAL),
    binary("heaviside", ALL_REAL, lambda d: [S(T((6,), values=[-1, 0, 2, 0, 3, -2]), T((6,))),
                                             S(T((2, 3), low=-1, high=1), T((3,)))], grad=False,
           errors=lambda: [ErrorSample(S(T((3,)), T((3,), dtype="float64")), RuntimeError, "different dtypes")]),
    OpInfo("isclose", lambda d: [S(T((3, 4)), T((3, 4))), S(T((4,), values=[1.0, 1.0 + 1e-9, float("nan"), 2.0]),
                                                         T((4,), values=[1.0, 1.0, float("nan"), 3.0]), equal_nan=True),
                                 S(T((3,)), T((2, 3)), rtol=0.5, atol=1.0)],
           ops=("isclose",), dtypes=ALL_REAL, method="isclose", grad=False,
           errors=lambda: [ErrorSample(S(T((3,)), T((3,), dtype="float64")), RuntimeError, "did not match")]),
    OpInfo("allclose", lambda d: [S(T((3, 4)), T((3, 4))), S(T((3,), values=[1.0, 2.0, 3.0]), T((3,), values=[1.0, 2.0, 3.0]))],
           dtypes=FLOATS, method="allclose", grad=False, meta=False),
    OpInfo("equal", lambda d: [S(T((3, 4)), T((3, 4))), S(T((3,), values=[1, 2, 3]), T((3,), values=[1, 2, 3])),
                               S(T((3,)), T((4,)))],
           dtypes=ALL_REAL, method="equal", grad=False, meta=False),
    OpInfo("where", lambda d: [S(T((3, 4), dtype="bool"), T((3, 4)), T((3, 4))),
                               S(T((3, 1), dtype="bool"), T((4,)), T((2, 1, 1))),
                               S(T((3,), dtype="bool"), T((3,)), 0), S(T((3,), dtype="bool"), 2, 1.5),
                               S(T((3,), dtype="bool"), T((3,)), T((), dtype="float64"))],
           ops=("where.self",), dtypes=ALL_REAL + C64, out=True,
           errors=lambda: [ErrorSample(S(T((3,), dtype="float32"), T((3,)), T((3,))), RuntimeError, "boolean")]),
    OpInfo("where_method", lambda d: [S(T((3, 4)), T((3, 4), dtype="bool"), T((3, 4))), S(T((3,)), T((3,), dtype="bool"), 0)],
           call=lambda m, x, c, y: x.where(c, y), dtypes=FLOATS),
    OpInfo("clamp", lambda d: [S(T((3, 4)), -1, 1), S(T((3, 4)), min=0.5), S(T((3, 4)), max=-0.5),
                               S(T((3, 4)), T((4,), low=-3, high=-0.5), T((3, 1), low=0.5, high=3)),
                               S(T((3, 4)), min=T((), low=-1, high=0)), S(T((3,), dtype="int64"), min=1.5)],
           ops=("clamp.Tensor", "clamp_.Tensor"), dtypes=NUMERIC, method="clamp", inplace="clamp_", out=True,
           errors=lambda: [ErrorSample(S(T((3,))), RuntimeError, "At least one")]),
    OpInfo("clip", lambda d: [S(T((3, 4)), -1, 1)], dtypes=NUMERIC, method="clip", inplace="clip_", out=True),
    OpInfo("clamp_min", lambda d: [S(T((3, 4)), 0.5), S(T((3, 4)), T((4,)))], dtypes=FLOATS, method="clamp_min",
           inplace="clamp_min_", out=True),
    OpInfo("clamp_max", lambda d: [S(T((3, 4)), 0.5), S(T((3, 4)), T((4,)))], dtypes=FLOATS, method="clamp_max",
           inplace="clamp_max_", out=True),
    OpInfo("lerp", lambda d: [S(T((3, 4)), T((3, 4)), 0.3), S(T((3, 4)), T((4,)), 0.8), S(T((3, 4)), T((3, 4)), T((3, 4), low=0, high=1)),
                              S(T((3, 1)), T((4,)), T((), low=0, high=1))],
           ops=("lerp.Tensor", "lerp_.Tensor"), dtypes=FLOATS_AND_LOWP + C64, tol=LOWTOL, method="lerp", inplace="lerp_", out=True,
           errors=lambda: [ErrorSample(S(T((3,)), T((3,), dtype="float64"), 0.5), RuntimeError, "expected dtype")]),
    OpInfo("addcmul", lambda d: [S(T((3, 4)), T((3, 4)), T((3, 4))), S(T((3, 4)), T((4,)), T((3, 1)), value=0.5),
                                 S(T(()), T((2, 3)), T((3,)), value=2)],
           ops=("addcmul", "addcmul_"), dtypes=NUMERIC + C64, method="addcmul", inplace="addcmul_", out=True),
    OpInfo("addcdiv", lambda d: [S(T((3, 4)), T((3, 4)), T((3, 4), low=0.5, high=2)),
                                 S(T((3, 4)), T((4,)), T((3, 1), low=0.5, high=2), value=0.5)],
           ops=("addcdiv", "addcdiv_"), dtypes=FLOATS_AND_LOWP + C64, method="addcdiv", inplace="addcdiv_", out=True,
           errors=lambda: [ErrorSample(S(T((3,)), T((3,), dtype="int64"), T((3,), dtype="int64")), RuntimeError, "Integer division")]),
]
