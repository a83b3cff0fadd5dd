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
