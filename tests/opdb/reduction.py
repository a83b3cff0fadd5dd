"""Op-database entries for reductions, scans, softmax, sorting and selection."""
import numpy as np

from tests.opdb import (OpInfo, S, T, DType, ErrorSample, FLOATS, ALL_REAL, NUMERIC, FLOATS_AND_LOWP, INTS,
                        LOWP)

NO_BOOL = NUMERIC


def red_samples(dtype):
    """Samples for `op(x, dim, keepdim)`-style reductions with optional dims."""
    return [
        S(T((3, 4))),
        S(T((3, 4)), 1),
        S(T((3, 4)), -1, True),
        S(T((2, 3, 4)), (0, 2)),
        S(T((2, 3, 4)), [-1, 0], keepdim=True),
        S(T(())),
        S(T(()), 0),
        S(T((0, 3)), 1),
        S(T((0, 3))),
        S(T((4, 3), noncontig=True), 0),
    ]


def dim_samples(dtype):
    """Samples for ops with one required int dim (and keepdim)."""
    return [
        S(T((3, 4)), 1),
        S(T((3, 4)), 0, True),
        S(T((2, 3, 4)), -1),
        S(T(()), 0),
        S(T((0, 3)), 1),
        S(T((4, 3), noncontig=True), 0),
        S(T((6,)), 0, keepdim=True),
    ]


def scan_samples(dtype):
    return [S(T((3, 4)), 1), S(T((3, 4)), 0), S(T((2, 3, 4)), -2), S(T(()), 0), S(T((0, 3)), 1),
            S(T((4, 3), noncontig=True), 0)]


def dim_errors():
    return [ErrorSample(S(T((3,)), 2), IndexError, "Dimension out of range")]


def scan_errors():
    return [ErrorSample(S(T((3,)), 1), IndexError, "Dimension out of range")]


def _distinct(shape, noncontig=False):
    """Distinct values (ties in indices would be implementation-defined in torch)."""
    n = int(np.prod(shape))
    return T(shape, values=np.random.default_rng(n).permutation(n).reshape(shape) - n // 2, noncontig=noncontig)


def distinct_dim_samples(dtype):
    return [S(_distinct((3, 4)), 1), S(_distinct((3, 4)), 0, True), S(_distinct((2, 3, 4)), -1),
            S(_distinct(()), 0), S(_distinct((0, 3)), 1), S(_distinct((4, 3), noncontig=True), 0)]


def sum_samples(dtype):
    return red_samples(dtype) + [S(T((3, 4)), 1, dtype=DType("float64")), S(T((3, 4)), [])]


def mean_samples(dtype):
    return red_samples(dtype) + [S(T((3, 4)), 1, dtype=DType("float64"))]


def mean_errors():
    return [ErrorSample(S(T((3,), dtype="int64")), RuntimeError, "could not infer output dtype"),
            ErrorSample(S(T((3,)), 1), IndexError, "Dimension out of range")]


def nan_samples(dtype):
    v = np.array([[1.0, np.nan, 2.0, 3.0], [np.nan, np.nan, 1.0, -1.0], [0.5, 1.5, 2.5, np.nan]])
    return red_samples(dtype) + [S(T((3, 4), values=v)), S(T((3, 4), values=v), 1), S(T((3, 4), values=v), 0, True)]


def prod_samples(dtype):
    z = np.array([[1.0, 0.0, 2.0], [3.0, 0.5, -1.0], [0.0, 2.0, 0.0]])
    return [S(T((3, 4))), S(T((3, 4)), 1), S(T((3, 4)), -1, True), S(T(())), S(T(()), 0), S(T((0, 3)), 1),
            S(T((4, 3), noncontig=True), 0), S(T((3, 3), values=z), 1), S(T((3, 3), values=z)),
            S(T((3, 3), values=z), 0, dtype=DType("float64"))]


def var_samples(dtype):
    return [S(T((3, 4))), S(T((3, 4)), 1), S(T((3, 4)), -1, True), S(T((2, 3, 4)), (0, 2)),
            S(T((3, 4)), 1, correction=0), S(T((3, 4)), 1, False, True), S(T((3, 4)), False),
            S(T((3, 4)), dim=0, unbiased=False, keepdim=True), S(T((4, 3), noncontig=True), 0),
            S(T((5,)), correction=2)]


def var_errors():
    return [ErrorSample(S(T((3,), dtype="int64")), RuntimeError, "floating point"),
            ErrorSample(S(T((3,)), 1), IndexError, "Dimension out of range")]


def maxmin_samples(dtype):
    return [S(T((3, 4))), S(T((3, 4)), 1), S(T((3, 4)), -1, True), S(T(())), S(T(()), 0),
            S(T((0, 3)), 1), S(T((4, 3), noncontig=True), 0), S(T((3, 4)), T((3, 4))), S(T((3, 4)), dim=0)]


def maxmin_errors():
    return [ErrorSample(S(T((0,))), RuntimeError, "Expected reduction dim"),
            ErrorSample(S(T((0, 3)), 0), IndexError, "non-zero size"),
            ErrorSample(S(T((3,)), 1), IndexError, "Dimension out of range")]


def amax_samples(dtype):
    ties = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    return [S(T((3, 4))), S(T((3, 4)), 1), S(T((3, 4)), -1, True), S(T((2, 3, 4)), (0, 2)), S(T(())),
            S(T((0, 3)), 1), S(T((4, 3), noncontig=True), 0), S(T((2, 3), values=ties), 1), S(T((2, 3), values=ties))]


def amax_errors():
    return [ErrorSample(S(T((0, 3)), 0), IndexError, "non-zero size")]


def aminmax_samples(dtype):
    return [S(T((3, 4))), S(T((3, 4)), dim=1), S(T((3, 4)), dim=-1, keepdim=True), S(T(())),
            S(T((4, 3), noncontig=True), dim=0), S(T((0, 3)), dim=1)]


def argmax_samples(dtype):
    return [S(T((3, 4))), S(T((3, 4)), 1), S(T((3, 4)), -1, True), S(T(())), S(T((3, 4)), keepdim=True),
            S(T((0, 3)), 1), S(T((4, 3), noncontig=True), 0), S(T((2, 3), values=[[1, 5, 5], [2, 2, 0]]), 1)]


def argmax_errors():
    return [ErrorSample(S(T((0, 3))), IndexError, "Expected reduction dim"),
            ErrorSample(S(T((3,), dtype="bool")), RuntimeError, "bool")]


def lse_samples(dtype):
    big = np.array([[1000.0, 1000.0], [-1000.0, -np.inf]])
    return [S(T((3, 4)), 1), S(T((3, 4)), (0, 1)), S(T((3, 4)), -1, True), S(T(()), 0), S(T((0, 3)), 1),
            S(T((4, 3), noncontig=True), 0), S(T((2, 2), values=big), 1)]


def norm_samples(dtype):
    return [S(T((3, 4))), S(T((3, 4)), 1), S(T((3, 4)), 3, 1), S(T((3, 4)), float("inf"), 0),
            S(T((3, 4)), -float("inf"), 1), S(T((3, 4)), 1, (0, 1), True), S(T((3, 4)), 0),
            S(T((3, 4)), "fro", (0, 1)), S(T((3, 4)), 2.5, -1), S(T(())), S(T((0, 3)), 2, 1),
            S(T((4, 3), noncontig=True), 2, 0), S(T((3,)), dtype=DType("float64"))]


def norm_errors():
    return [ErrorSample(S(T((3,), dtype="int64")), RuntimeError, "floating point"),
            ErrorSample(S(T((0,)), float("inf")), RuntimeError, "inf norm on an empty tensor")]


def logical_samples(dtype):
    return [S(T((3, 4))), S(T((3, 4)), 1), S(T((3, 4)), -1, True), S(T((2, 3, 4)), (0, 2)), S(T(())),
            S(T((0, 3)), 1), S(T((0, 3))), S(T((4, 3), noncontig=True), 0),
            S(T((2, 3), values=[[0, 0, 1], [1, 1, 1]]), 1)]


def cnz_samples(dtype):
    return [S(T((3, 4))), S(T((3, 4)), 1), S(T((2, 3, 4)), (0, 2)), S(T(())), S(T((0, 3)), 1),
            S(T((4, 3), noncontig=True), 0), S(T((2, 3), values=[[0, 0, 1], [1, 0, 1]]), -1)]


def cumsum_samples(dtype):
    return scan_samples(dtype) + [S(T((3, 4)), 1, dtype=DType("float64"))]


def cumprod_samples(dtype):
    z = np.array([[1.0, 0.0, 2.0, 3.0], [0.0, 0.5, 0.0, 2.0], [1.5, -1.0, 2.0, 0.0]])
    return scan_samples(dtype) + [S(T((3, 4), values=z), 1), S(T((3, 4), values=z), 0)]


def cummax_samples(dtype):
    t = np.array([[1, 1, 0, 1], [3, 2, 3, 5]])
    out = scan_samples(dtype) + [S(T((2, 4), values=t), 1)]
    if dtype in FLOATS_AND_LOWP:
        out.append(S(T((5,), values=[1.0, np.nan, 2.0, np.nan, 0.0]), 0))
    return out


def lcse_samples(dtype):
    return scan_samples(dtype) + [S(T((4,), values=[-1000.0, 0.0, 1000.0, -np.inf]), 0)]


def diff_samples(dtype):
    return [S(T((3, 4))), S(T((3, 4)), 2, 0), S(T((3, 4)), 1, -1, T((3, 1)), T((3, 2))),
            S(T((5,)), 3), S(T((4, 3), noncontig=True), dim=0), S(T((0, 3)), dim=0), S(T((3, 4)), 5)]


def softmax_samples(dtype):
    big = np.array([[1000.0, 0.0, -1000.0], [1.0, 2.0, 3.0]])
    return [S(T((3, 4)), 1), S(T((3, 4)), 0), S(T((2, 3, 4)), -1), S(T(()), 0), S(T((0, 3)), 1),
            S(T((4, 3), noncontig=True), 0), S(T((2, 3), values=big), 1), S(T((3, 4)), 1, dtype=DType("float64"))]


def softmax_errors():
    return [ErrorSample(S(T((3,)), 1), IndexError, "Dimension out of range")]


def f_softmax_samples(dtype):
    return softmax_samples(dtype) + [S(T((3, 4)), dim=1, dtype=DType("float64"))]


def sort_samples(dtype):
    ties = np.array([[2, 1, 2, 1, 3], [0, 0, 0, 1, 1]])
    out = [S(T((3, 4))), S(T((3, 4)), 0), S(T((3, 4)), 1, True), S(T((2, 3, 4)), -2, descending=True),
           S(T(())), S(T((0, 3)), 1), S(T((4, 3), noncontig=True), 0), S(T((2, 5), values=ties), 1),
           S(T((2, 5), values=ties), 1, True), S(T((2, 5), values=ties), stable=True, descending=True)]
    if dtype in FLOATS_AND_LOWP:
        nan = [3.0, np.nan, 1.0, np.nan, 2.0]
        out += [S(T((5,), values=nan)), S(T((5,), values=nan), 0, True)]
    return out


def topk_samples(dtype):
    return [S(_distinct((3, 4)), 2), S(_distinct((3, 4)), 2, 0), S(_distinct((3, 4)), 3, largest=False),
            S(_distinct((2, 3, 4)), 1, -2), S(_distinct(()), 1), S(_distinct((0, 3)), 0, 0),
            S(_distinct((4, 3), noncontig=True), 4, 0), S(_distinct((5,)), 0)]


def topk_errors():
    return [ErrorSample(S(T((3,)), 4), RuntimeError, "k out of range")]


def kth_samples(dtype):
    return [S(_distinct((3, 4)), 2), S(_distinct((3, 4)), 3, 0), S(_distinct((3, 4)), 1, -1, True),
            S(_distinct(()), 1), S(_distinct((4, 3), noncontig=True), 4, 0)]


def kth_errors():
    return [ErrorSample(S(T((3,)), 4), RuntimeError, "out of range"),
            ErrorSample(S(T((3,)), 0), RuntimeError, "out of range")]


def median_samples(dtype):
    out = [S(_distinct((3, 4))), S(_distinct((3, 4)), 1), S(_distinct((3, 4)), 0, True), S(_distinct((2, 3, 4)), -1),
           S(_distinct(())), S(_distinct(()), 0), S(_distinct((5,))), S(_distinct((4, 3), noncontig=True), 0),
           S(T((0,)))]
    if dtype in FLOATS_AND_LOWP:
        v = np.array([[1.0, np.nan, 2.0, np.nan], [3.0, 1.0, 2.0, 0.0], [np.nan, 5.0, np.nan, np.nan]])
        out += [S(T((3, 4), values=v), 1), S(T((2, 4), values=v[:2]))]
    return out


def median_errors():
    return [ErrorSample(S(T((0, 3)), 0), IndexError, "non-zero size")]


def mode_samples(dtype):
    v = np.array([[1, 2, 2, 1, 3], [3, 1, 1, 2, 3], [4, 4, 4, 0, 0]])
    return [S(T((3, 5), values=v)), S(T((3, 5), values=v), 0), S(T((3, 5), values=v), 1, True),
            S(_distinct(())), S(T((5, 3), values=v.T.copy(), noncontig=True), 0), S(_distinct((2, 3, 4)), 1)]


def unique_samples(dtype):
    v = np.array([[1, 2, 2, 1], [3, 1, 1, 2], [1, 2, 2, 1]])
    return [S(T((3, 4), values=v)), S(T((3, 4), values=v), return_inverse=True),
            S(T((3, 4), values=v), return_counts=True, return_inverse=True), S(T((3, 4), values=v), dim=0),
            S(T((3, 4), values=v), dim=1, return_inverse=True, return_counts=True), S(T(())),
            S(T((0,))), S(T((7,), low=0, high=3), return_counts=True)]


def unique_consecutive_samples(dtype):
    v = np.array([[1, 1, 2, 2], [3, 1, 1, 2], [3, 1, 1, 2]])
    return [S(T((3, 4), values=v)), S(T((3, 4), values=v), return_inverse=True, return_counts=True),
            S(T((3, 4), values=v), dim=0, return_counts=True), S(T((3, 4), values=v), dim=1, return_inverse=True),
            S(T(())), S(T((8,), low=0, high=2), return_counts=True)]


def _values_sorted(mod, x, k, **kw):
    v, i = mod.topk(x, k, sorted=False, **kw)
    return mod.sort(v).values


# torch's half/bfloat16 last-dim log_softmax kernel rounds differently from a float32 computation
LSM_TOL = {"float16": (1e-3, 1e-3), "bfloat16": (1.6e-2, 1e-2)}

OPS = [
    OpInfo("sum", sum_samples, ops=("sum.dim_IntList",), dtypes=ALL_REAL, method="sum", out=True,
           errors=dim_errors),
    OpInfo("nansum", nan_samples, ops=("nansum",), dtypes=NUMERIC, method="nansum", out=True),
    OpInfo("mean", mean_samples, ops=("mean.dim",), dtypes=FLOATS_AND_LOWP, method="mean", out=True,
           errors=mean_errors),
    OpInfo("nanmean", nan_samples, ops=("nanmean",), dtypes=FLOATS_AND_LOWP, method="nanmean", out=True),
    OpInfo("prod", prod_samples, ops=("prod.dim_int",), dtypes=ALL_REAL, method="prod", out=True,
           tol={"float16": (2e-3, 1e-3), "bfloat16": (3e-2, 1e-2)}),
    OpInfo("var", var_samples, ops=("var.correction",), dtypes=FLOATS_AND_LOWP, method="var", out=True,
           errors=var_errors),
    OpInfo("std", var_samples, ops=("std.correction",), dtypes=FLOATS_AND_LOWP, method="std", out=True),
    OpInfo("var_mean", var_samples, ops=("var_mean.correction",), dtypes=FLOATS_AND_LOWP),
    OpInfo("std_mean", var_samples, ops=("std_mean.correction",), dtypes=FLOATS_AND_LOWP),
    OpInfo("max", maxmin_samples, ops=("max", "max.dim"), dtypes=ALL_REAL, method="max", errors=maxmin_errors),
    OpInfo("min", maxmin_samples, ops=("min", "min.dim"), dtypes=ALL_REAL, method="min", errors=maxmin_errors),
    OpInfo("amax", amax_samples, ops=("amax",), dtypes=ALL_REAL, method="amax", out=True, errors=amax_errors),
    OpInfo("amin", amax_samples, ops=("amin",), dtypes=ALL_REAL, method="amin", out=True, errors=amax_errors),
    OpInfo("aminmax", aminmax_samples, ops=("aminmax",), dtypes=ALL_REAL, method="aminmax"),
    OpInfo("argmax", argmax_samples, ops=("argmax",), dtypes=NUMERIC, method="argmax", out=True, grad=False,
           errors=argmax_errors),
    OpInfo("argmin", argmax_samples, ops=("argmin",), dtypes=NUMERIC, method="argmin", out=True, grad=False,
           errors=argmax_errors),
    OpInfo("logsumexp", lse_samples, ops=("logsumexp",), dtypes=NUMERIC, method="logsumexp", out=True),
    OpInfo("norm", norm_samples, ops=("norm.ScalarOpt_dim_dtype",), dtypes=FLOATS_AND_LOWP, method="norm",
           errors=norm_errors),
    OpInfo("all", logical_samples, ops=("all.dims",), dtypes=ALL_REAL, method="all", out=True, grad=False),
    OpInfo("any", logical_samples, ops=("any.dims",), dtypes=ALL_REAL, method="any", out=True, grad=False),
    OpInfo("count_nonzero", cnz_samples, ops=("count_nonzero.dim_IntList",), dtypes=ALL_REAL,
           method="count_nonzero", grad=False),
    OpInfo("cumsum", cumsum_samples, ops=("cumsum", "cumsum_"), dtypes=ALL_REAL, method="cumsum",
           inplace="cumsum_", out=True, errors=scan_errors),
    OpInfo("cumprod", cumprod_samples, ops=("cumprod", "cumprod_"), dtypes=ALL_REAL, method="cumprod",
           inplace="cumprod_", out=True, tol={"float16": (2e-3, 1e-3), "bfloat16": (3e-2, 1e-2)}),
    OpInfo("cummax", cummax_samples, ops=("cummax",), dtypes=ALL_REAL, method="cummax", errors=scan_errors),
    OpInfo("cummin", cummax_samples, ops=("cummin",), dtypes=ALL_REAL, method="cummin"),
    OpInfo("logcumsumexp", lcse_samples, ops=("logcumsumexp",), dtypes=FLOATS_AND_LOWP, method="logcumsumexp",
           out=True),
    OpInfo("diff", diff_samples, dtypes=ALL_REAL, method="diff"),
    OpInfo("softmax", softmax_samples, ops=("softmax.int",), dtypes=FLOATS_AND_LOWP, method="softmax",
           errors=softmax_errors),
    OpInfo("log_softmax", softmax_samples, ops=("log_softmax.int",), dtypes=FLOATS_AND_LOWP,
           method="log_softmax", tol=LSM_TOL),
    OpInfo("nn.functional.softmax", f_softmax_samples, dtypes=FLOATS_AND_LOWP),
    OpInfo("nn.functional.log_softmax", f_softmax_samples, dtypes=FLOATS_AND_LOWP, tol=LSM_TOL),
    OpInfo("nn.functional.softmin", f_softmax_samples, dtypes=FLOATS_AND_LOWP),
    OpInfo("sort", sort_samples, ops=("sort",), dtypes=ALL_REAL, method="sort", errors=dim_errors),
    OpInfo("argsort", sort_samples, dtypes=ALL_REAL, method="argsort", grad=False),
    OpInfo("msort", lambda d: [S(T((3, 4))), S(T((5,))), S(T((4, 3), noncontig=True))], dtypes=ALL_REAL,
           method="msort", out=True),
    OpInfo("topk", topk_samples, ops=("topk",), dtypes=NUMERIC, method="topk", errors=topk_errors),
    OpInfo("topk_unsorted", lambda d: [S(_distinct((6,)), 3), S(_distinct((6,)), 2, largest=False)],
           call=_values_sorted, dtypes=NUMERIC),
    OpInfo("kthvalue", kth_samples, ops=("kthvalue",), dtypes=NUMERIC, method="kthvalue", errors=kth_errors),
    OpInfo("median", median_samples, ops=("median", "median.dim"), dtypes=NUMERIC, method="median",
           errors=median_errors),
    OpInfo("nanmedian", median_samples, ops=("nanmedian", "nanmedian.dim"), dtypes=NUMERIC, method="nanmedian"),
    OpInfo("mode", mode_samples, ops=("mode",), dtypes=NUMERIC, method="mode",
           skip={"gradcheck": "the mode is defined by ties, which finite differences break"}),
    OpInfo("unique", unique_samples, ops=("_unique2", "unique_dim"), dtypes=ALL_REAL, method="unique",
           grad=False, meta=False),
    OpInfo("unique_consecutive", unique_consecutive_samples, ops=("unique_consecutive",), dtypes=ALL_REAL,
           method="unique_consecutive", grad=False, meta=False),
]
