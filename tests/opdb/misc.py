"""Op-database entries for dense layers (linear, bilinear) and the core view/copy ops."""
from tests.opdb import OpInfo, S, T, ErrorSample, FLOATS, ALL_REAL, NUMERIC, FLOATS_AND_LOWP, DType, Module


def linear_samples(dtype):
    return [S(T((4, 3)), T((5, 3)), T((5,))), S(T((2, 4, 3)), T((5, 3))), S(T((3,)), T((2, 3)), T((2,))),
            S(T((4, 3), noncontig=True), T((5, 3), noncontig=True), None), S(T((0, 3)), T((2, 3)), T((2,)))]


def linear_errors():
    return [ErrorSample(S(T((4, 3)), T((5, 2))), RuntimeError, "cannot be multiplied")]


def _views(dtype):
    return [S(T((2, 3, 4))), S(T((3, 4), noncontig=True)), S(T((1, 3, 1)))]


OPS = [
    OpInfo("linear", linear_samples, fn="nn.functional.linear", ops=("linear",), dtypes=FLOATS_AND_LOWP,
           errors=linear_errors, tol={"float32": (1e-5, 1e-5)}),
    OpInfo("bilinear", lambda d: [S(T((4, 3)), T((4, 2)), T((5, 3, 2)), T((5,)))], fn="nn.functional.bilinear",
           dtypes=FLOATS, tol={"float32": (1e-5, 1e-5)}),
    OpInfo("view", lambda d: [S(T((2, 3, 4)), 6, 4), S(T((2, 3, 4)), -1), S(T((4,)), 2, 2), S(T(()), 1)],
           call=lambda m, x, *s: x.view(*s), ops=("view",), dtypes=ALL_REAL,
           errors=lambda: [ErrorSample(S(T((3, 4), noncontig=True), 12), RuntimeError, "view size is not compatible"),
                           ErrorSample(S(T((3, 4)), 5), RuntimeError, "invalid for input of size")]),
    OpInfo("transpose", lambda d: [S(T((2, 3, 4)), 0, 2), S(T((3, 4)), -1, 0), S(T(()), 0, -1)],
           ops=("transpose.int",), method="transpose", dtypes=ALL_REAL,
           errors=lambda: [ErrorSample(S(T((3, 4)), 0, 2), IndexError, "Dimension out of range")]),
    OpInfo("permute", lambda d: [S(T((2, 3, 4)), (2, 0, 1)), S(T((3, 4)), (-1, 0))], ops=("permute",),
           method="permute", dtypes=ALL_REAL,
           errors=lambda: [ErrorSample(S(T((3, 4)), (0, 0)), RuntimeError, "duplicate")]),
    OpInfo("expand", lambda d: [S(T((3, 1)), 3, 4), S(T((4,)), 2, 4), S(T((3, 1)), -1, 5), S(T(()), 2, 3)],
           call=lambda m, x, *s: x.expand(*s), ops=("expand",), dtypes=ALL_REAL,
           errors=lambda: [ErrorSample(S(T((3, 2)), 3, 4), RuntimeError, "must match the existing size")]),
    OpInfo("unsqueeze", lambda d: [S(T((2, 3)), 0), S(T((2, 3)), -1), S(T(()), 0)], ops=("unsqueeze",),
           method="unsqueeze", dtypes=ALL_REAL),
    OpInfo("squeeze", lambda d: [S(T((1, 3, 1))), S(T((1, 3, 1)), 0), S(T((1, 3, 1)), (0, 2)), S(T((2, 3)), 1)],
           ops=("squeeze.dims",), method="squeeze", dtypes=ALL_REAL),
    OpInfo("clone", _views, ops=("clone",), method="clone", dtypes=ALL_REAL, check_strides=True),
    OpInfo("contiguous", _views, call=lambda m, x: x.contiguous(), dtypes=ALL_REAL, check_strides=True),
    OpInfo("to_dtype", lambda d: [S(T((3, 4)), DType("float64")), S(T((2,)), DType("int32")), S(T(()), DType("bfloat16"))],
           call=lambda m, x, d: x.to(d), ops=("_to_copy",), dtypes=ALL_REAL,
           fallbacks={"_to_copy": "a bfloat16 result: not a dtype the code generator takes"}),
    OpInfo("reshape", lambda d: [S(T((2, 3, 4)), (4, 6)), S(T((3, 4), noncontig=True), (12,)), S(T((3, 4)), (-1, 2))],
           method="reshape", dtypes=ALL_REAL),
]


def _idx(shape, high):
    return T(shape, dtype="int64", low=0, high=high)


OPS += [
    OpInfo("local_response_norm", lambda d: [S(T((2, 5, 3)), 3), S(T((2, 6, 3, 4)), 2, alpha=1e-2, beta=0.5, k=2.0),
                                             S(T((1, 4, 2, 2, 2)), 3)],
           fn="nn.functional.local_response_norm", dtypes=FLOATS),
    OpInfo("lp_pool2d", lambda d: [S(T((2, 3, 6, 6), low=0.1), 2, 2), S(T((1, 2, 5, 5), low=0.1), 3, (2, 3), 1)],
           fn="nn.functional.lp_pool2d", dtypes=FLOATS),
    OpInfo("lp_pool1d", lambda d: [S(T((2, 3, 8), low=0.1), 2, 3, 2)], fn="nn.functional.lp_pool1d", dtypes=FLOATS),
    OpInfo("channel_shuffle", lambda d: [S(T((2, 6, 3, 3)), 3), S(T((1, 4, 5)), 2)],
           fn="nn.functional.channel_shuffle", dtypes=ALL_REAL, grad=False),
    OpInfo("multi_margin_loss", lambda d: [S(T((4, 5)), _idx((4,), 5)), S(T((4, 5)), _idx((4,), 5), p=2, margin=0.5),
                                           S(T((4, 5)), _idx((4,), 5), weight=T((5,), low=0.1, requires_grad=False),
                                             reduction="sum"),
                                           S(T((5,)), _idx((1,), 5), reduction="none")],
           fn="nn.functional.multi_margin_loss", dtypes=FLOATS),
    OpInfo("multilabel_margin_loss",
           lambda d: [S(T((3, 4)), T((3, 4), dtype="int64", values=[[3, 0, -1, 1], [0, 1, 2, 3], [-1, 0, 0, 0]])),
                      S(T((4,)), T((4,), dtype="int64", values=[1, 2, -1, 0]), reduction="none")],
           fn="nn.functional.multilabel_margin_loss", dtypes=FLOATS),
    OpInfo("triplet_margin_with_distance_loss",
           lambda d: [S(T((4, 3)), T((4, 3)), T((4, 3))), S(T((4, 3)), T((4, 3)), T((4, 3)), swap=True, margin=0.3)],
           fn="nn.functional.triplet_margin_with_distance_loss", dtypes=FLOATS),
]
