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
