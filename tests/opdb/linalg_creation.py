"""Op-database entries for linear algebra, factories and random operators."""
import numpy as np

from tests.opdb import OpInfo, S, T, ErrorSample, DType, FLOATS, INTS, FLOATS_AND_LOWP

MM_DTYPES = FLOATS + ("float16", "bfloat16", "int64", "int32")
LOWP_TOL = {"float16": (1e-2, 1e-2), "bfloat16": (3e-2, 5e-2)}


def _spd(n, batch=()):
    """A symmetric positive-definite matrix, as explicit values."""
    rng = np.random.default_rng(n + len(batch))
    a = rng.standard_normal(batch + (n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


def _sym(n, batch=()):
    rng = np.random.default_rng(10 + n)
    a = rng.standard_normal(batch + (n, n))
    return a + np.swapaxes(a, -1, -2)


def _well(n, batch=()):
    rng = np.random.default_rng(20 + n)
    return rng.standard_normal(batch + (n, n)) + 3 * np.eye(n)


mm_samples = lambda d: [S(T((2, 3)), T((3, 4))), S(T((3, 3), noncontig=True), T((3, 2))), S(T((0, 3)), T((3, 2))),
                        S(T((2, 0)), T((0, 2)))]
bmm_samples = lambda d: [S(T((2, 2, 3)), T((2, 3, 4))), S(T((1, 3, 3), noncontig=True), T((1, 3, 2)))]
mv_samples = lambda d: [S(T((2, 3)), T((3,))), S(T((3, 3), noncontig=True), T((3,), noncontig=True))]
dot_samples = lambda d: [S(T((3,)), T((3,))), S(T((0,)), T((0,))), S(T((4,), noncontig=True), T((4,)))]
matmul_samples = lambda d: [S(T((3,)), T((3,))), S(T((2, 3)), T((3,))), S(T((3,)), T((3, 2))),
                            S(T((2, 1, 2, 3)), T((3, 3, 2))), S(T((3, 3), noncontig=True), T((3, 3)))]


def mm_errors():
    return [ErrorSample(S(T((2, 3)), T((4, 5))), RuntimeError, r"\(2x3 and 4x5\)"),
            ErrorSample(S(T((2, 3)), T((3, 5), dtype="float64")), RuntimeError, "same dtype"),
            ErrorSample(S(T((2, 3)), T((3,))), RuntimeError, "matrix")]


def bmm_errors():
    return [ErrorSample(S(T((2, 2, 3)), T((2, 4, 5))), RuntimeError, "batch2"),
            ErrorSample(S(T((2, 3)), T((2, 3))), RuntimeError, "3D")]


def addmm_samples(d):
    return [S(T((2, 4)), T((2, 3)), T((3, 4))), S(T((4,)), T((2, 3)), T((3, 4)), beta=0.5, alpha=2),
            S(T((2, 1)), T((2, 3), noncontig=True), T((3, 4)), beta=0)]


def einsum_samples(d):
    return [S("ij,jk->ik", T((2, 3)), T((3, 4))), S("ij,jk", T((2, 3)), T((3, 4))),
            S("ii->i", T((3, 3))), S("ii", T((3, 3))), S("i,j->ij", T((3,)), T((2,))),
            S("bij,bjk->bik", T((2, 2, 3)), T((2, 3, 2))), S("...ij,...jk", T((2, 1, 2, 3)), T((3, 3, 2))),
            S("ij->", T((2, 3))), S("ij->j", T((2, 3), noncontig=True)), S("i,i,i->", T((3,)), T((3,)), T((3,))),
            S("ij,ij->ij", T((1, 3)), T((2, 3))), S("iij->ji", T((2, 2, 3))), S("ab,bc,cd->ad", T((2, 3)), T((3, 4)),
                                                                               T((4, 2)))]


def einsum_errors():
    return [ErrorSample(S("ij,jk", T((2, 3))), RuntimeError, "fewer operands"),
            ErrorSample(S("ij", T((2, 3, 4))), RuntimeError, "number of subscripts"),
            ErrorSample(S("ij,jk", T((2, 3)), T((4, 2))), RuntimeError, "subscript j"),
            ErrorSample(S("ij->ii", T((2, 3))), RuntimeError, "more than once")]


def _call(f):
    return lambda mod, *a, **k: f(mod, *a, **k)


ANY = FLOATS + ("float16", "bfloat16", "uint8", "int8", "int16", "int32", "int64", "bool")
FACT = FLOATS + ("int64", "int32", "float16", "bfloat16")

OPS = [
    # ---- products ----
    OpInfo("matmul", matmul_samples, ops=("matmul",), dtypes=MM_DTYPES, method="matmul", tol=LOWP_TOL,
           errors=lambda: [ErrorSample(S(T((2, 3)), T((4, 5))), RuntimeError, r"2x3 and 4x5")]),
    OpInfo("mm", mm_samples, ops=("mm",), dtypes=MM_DTYPES, method="mm", out=True, errors=mm_errors, tol=LOWP_TOL),
    OpInfo("bmm", bmm_samples, ops=("bmm",), dtypes=MM_DTYPES, method="bmm", out=True, errors=bmm_errors,
           tol=LOWP_TOL),
    OpInfo("mv", mv_samples, ops=("mv",), dtypes=MM_DTYPES, method="mv", tol=LOWP_TOL,
           errors=lambda: [ErrorSample(S(T((2, 3)), T((4,))), RuntimeError, "size mismatch")]),
    OpInfo("dot", dot_samples, ops=("dot",), dtypes=MM_DTYPES, method="dot", tol=LOWP_TOL,
           errors=lambda: [ErrorSample(S(T((3,)), T((4,))), RuntimeError, "inconsistent"),
                           ErrorSample(S(T((3,)), T((3,), dtype="float64")), RuntimeError, "same dtype")]),
    OpInfo("vdot", dot_samples, ops=("vdot",), dtypes=FLOATS + ("complex64",), method="vdot"),
    OpInfo("inner", lambda d: [S(T((2, 3)), T((4, 3))), S(T(()), T((2,))), S(T((3,)), T((3,)))], method="inner"),
    OpInfo("outer", lambda d: [S(T((3,)), T((2,))), S(T((0,)), T((2,)))], method="outer", dtypes=FLOATS + INTS,
           errors=lambda: [ErrorSample(S(T((3, 2)), T((2,))), RuntimeError, "1-D")]),
    OpInfo("ger", lambda d: [S(T((3,)), T((2,)))], method="ger"),
    OpInfo("addmm", addmm_samples, ops=("addmm", "addmm_"), method="addmm", inplace=None, dtypes=FLOATS + ("int64",)),
    OpInfo("addmm_", lambda d: [S(T((2, 4)), T((2, 3)), T((3, 4)), beta=0.5)], fn="addmm", inplace="addmm_"),
    OpInfo("addmv", lambda d: [S(T((2,)), T((2, 3)), T((3,))), S(T(()), T((2, 3)), T((3,)), beta=2, alpha=0.5)],
           ops=("addmv", "addmv_"), method="addmv"),
    OpInfo("baddbmm", lambda d: [S(T((2, 2, 4)), T((2, 2, 3)), T((2, 3, 4))),
                                 S(T((2, 4)), T((2, 2, 3)), T((2, 3, 4)), beta=0.5, alpha=-1)],
           ops=("baddbmm", "baddbmm_"), method="baddbmm"),
    OpInfo("addbmm", lambda d: [S(T((2, 4)), T((3, 2, 3)), T((3, 3, 4))), S(T((4,)), T((3, 2, 3)), T((3, 3, 4)),
                                                                            alpha=2)],
           ops=("addbmm", "addbmm_"), method="addbmm"),
    OpInfo("addr", lambda d: [S(T((3, 2)), T((3,)), T((2,))), S(T((2,)), T((3,)), T((2,)), beta=2, alpha=3)],
           ops=("addr", "addr_"), method="addr", inplace=None),
    OpInfo("einsum", einsum_samples, ops=("einsum",), dtypes=FLOATS + ("int64", "bfloat16"), errors=einsum_errors,
           tol=LOWP_TOL),
    OpInfo("tensordot", lambda d: [S(T((2, 3, 4)), T((3, 4, 2))), S(T((2, 3)), T((3, 2)), dims=1),
                                   S(T((2, 3, 4)), T((4, 3)), dims=([1, 2], [1, 0])), S(T((2,)), T((3,)), dims=0)]),
    OpInfo("kron", lambda d: [S(T((2, 3)), T((2, 2))), S(T((2,)), T((3, 2))), S(T((2, 1, 2)), T((3,)))],
           dtypes=FLOATS + ("int64",)),
    OpInfo("multi_dot", lambda d: [S([T((2, 3)), T((3, 4)), T((4, 2))]), S([T((3,)), T((3, 4)), T((4,))])],
           fn="linalg.multi_dot", errors=lambda: [ErrorSample(S([T((2, 3))]), RuntimeError, "at least 2")]),
    OpInfo("chain_matmul", lambda d: [S(T((2, 3)), T((3, 4)), T((4, 2)))]),
    OpInfo("linalg.cross", lambda d: [S(T((4, 3)), T((4, 3))), S(T((3, 2)), T((3, 1)), dim=0),
                                      S(T((2, 3)), T((1, 3)))], ops=("linalg_cross",), dtypes=FLOATS + ("int64",),
           errors=lambda: [ErrorSample(S(T((4,)), T((4,))), RuntimeError, "length 3")]),
    OpInfo("cross", lambda d: [S(T((4, 3)), T((4, 3)), dim=1), S(T((3, 2)), T((3, 2)), dim=0)], method="cross"),
    # ---- linalg namespace ----
    OpInfo("linalg.vector_norm", lambda d: [S(T((3, 4))), S(T((3, 4)), 1), S(T((3, 4)), 3, dim=1),
                                            S(T((3, 4)), float("inf"), dim=0, keepdim=True),
                                            S(T((3, 4)), -float("inf")), S(T((3, 4)), 0), S(T((2, 3, 2)), dim=(0, 2)),
                                            S(T(())), S(T((0, 3)), dim=1), S(T((3, 2), noncontig=True), 1.5),
                                            S(T((3,)), dtype=DType("float64"))],
           ops=("linalg_vector_norm",), dtypes=FLOATS_AND_LOWP, tol=LOWP_TOL,
           errors=lambda: [ErrorSample(S(T((3,), dtype="int64")), RuntimeError, "floating point")]),
    OpInfo("linalg.matrix_norm", lambda d: [S(T((3, 4))), S(T((3, 4)), "nuc"), S(T((2, 3, 3)), 2), S(T((3, 4)), -2),
                                            S(T((3, 4)), 1), S(T((3, 4)), float("inf"), keepdim=True),
                                            S(T((3, 4)), -1, dim=(1, 0))],
           errors=lambda: [ErrorSample(S(T((3,))), RuntimeError, "at least 2")]),
    OpInfo("linalg.norm", lambda d: [S(T((3, 4))), S(T((3,)), 3), S(T((3, 4)), "fro"), S(T((3, 4)), 1),
                                     S(T((2, 3, 4)), dim=(1, 2)), S(T((2, 3, 4)), 1, dim=2)]),
    OpInfo("linalg.det", lambda d: [S(T((3, 3), values=_well(3))), S(T((2, 2, 2), values=_well(2, (2,)))),
                                    S(T((0, 0)))],
           ops=("linalg_det",), errors=lambda: [ErrorSample(S(T((3, 2))), RuntimeError, "square"),
                                                ErrorSample(S(T((3, 3), dtype="int64")), RuntimeError, "floating")]),
    OpInfo("det", lambda d: [S(T((3, 3), values=_well(3)))], method="det"),
    OpInfo("linalg.slogdet", lambda d: [S(T((3, 3), values=_well(3))), S(T((2, 2, 2), values=-_well(2, (2,))))],
           ops=("linalg_slogdet",)),
    OpInfo("logdet", lambda d: [S(T((3, 3), values=_spd(3)))], method="logdet"),
    OpInfo("linalg.inv", lambda d: [S(T((3, 3), values=_well(3))), S(T((2, 2, 2), values=_well(2, (2,))))],
           ops=("linalg_inv",), dtypes=FLOATS + ("complex64",),
           errors=lambda: [ErrorSample(S(T((3, 2))), RuntimeError, "square")]),
    OpInfo("inverse", lambda d: [S(T((3, 3), values=_well(3)))], method="inverse"),
    OpInfo("linalg.solve", lambda d: [S(T((3, 3), values=_well(3)), T((3,))), S(T((3, 3), values=_well(3)), T((3, 2))),
                                      S(T((2, 3, 3), values=_well(3, (2,))), T((3, 2))),
                                      S(T((2, 3, 3), values=_well(3, (2,))), T((2, 3))),
                                      S(T((3, 3), values=_well(3)), T((2, 3)), left=False)],
           ops=("linalg_solve",),
           errors=lambda: [ErrorSample(S(T((3, 3)), T((4,))), RuntimeError, "Incompatible"),
                           ErrorSample(S(T((3, 3)), T((3,), dtype="float64")), RuntimeError, "same dtype")]),
    OpInfo("linalg.cholesky", lambda d: [S(T((3, 3), values=_spd(3))), S(T((2, 3, 3), values=_spd(3, (2,)))),
                                         S(T((3, 3), values=_spd(3)), upper=True)],
           ops=("linalg_cholesky",), skip={"gradcheck": "reads only the lower triangle; finite differences on "
                                                        "the full matrix differ from the symmetrised gradient"}),
    OpInfo("linalg.eigh", lambda d: [S(T((3, 3), values=_sym(3))), S(T((2, 3, 3), values=_sym(3, (2,))))],
           ops=("linalg_eigh",), tol={"float32": (1e-4, 1e-4)},
           skip={"forward": "eigenvectors are unique only up to sign; checked through eigvalsh and reconstruction",
                 "grad": "eigenvector sign is arbitrary; checked through eigvalsh",
                 "gradcheck": "reads one triangle only",
                 "cuda": "eigenvector signs differ between LAPACK and cuSOLVER; eigvalsh covers cuda"}),
    OpInfo("linalg.eigvalsh", lambda d: [S(T((3, 3), values=_sym(3))), S(T((2, 3, 3), values=_sym(3, (2,))))],
           tol={"float32": (1e-4, 1e-4)}, skip={"gradcheck": "reads one triangle only"}),
    OpInfo("linalg.svdvals", lambda d: [S(T((3, 2))), S(T((2, 2, 4)))], ops=("linalg_svdvals",),
           tol={"float32": (1e-4, 1e-5)}),
    OpInfo("linalg.svd", lambda d: [S(T((3, 2)))], ops=("linalg_svd",), call=lambda m, a: _svd_recon(m, a),
           tol={"float32": (1e-4, 1e-5)}),
    OpInfo("linalg.qr", lambda d: [S(T((4, 3))), S(T((3, 3))), S(T((2, 3, 3)), "complete")], ops=("linalg_qr",),
           call=lambda m, a, mode="reduced": _qr_recon(m, a, mode), tol={"float32": (1e-4, 1e-5)}),
    OpInfo("linalg.pinv", lambda d: [S(T((3, 2))), S(T((2, 4)))], tol={"float32": (1e-4, 1e-5)}),
    OpInfo("linalg.matrix_rank", lambda d: [S(T((3, 2))), S(T((3, 3), values=np.ones((3, 3))))], grad=False),
    # ---- factories ----
    OpInfo("arange", lambda d: [S(5, dtype=DType(d)), S(1, 7, 2, dtype=DType(d)), S(5), S(0, 1, 0.1), S(1.0, 4),
                                S(5, 0, -1), S(0, 5.5, 1.5, dtype=DType("int64"))],
           ops=("arange.start_step",), dtypes=FACT, skip={"meta": "no tensor inputs; device='meta' factories are tested in tests/test_random.py"}, grad=False, out=True,
           errors=lambda: [ErrorSample(S(0, 5, -1), RuntimeError, "step sign"),
                           ErrorSample(S(0, 5, 0), RuntimeError, "nonzero")]),
    OpInfo("linspace", lambda d: [S(0, 1, 5, dtype=DType(d)), S(-1, 1, 7), S(0, 10, 5, dtype=DType("int64")),
                                  S(3, 3, 1), S(0, 1, 0)],
           ops=("linspace",), skip={"meta": "no tensor inputs; device='meta' factories are tested in tests/test_random.py"}, grad=False, dtypes=FLOATS + ("bfloat16",),
           errors=lambda: [ErrorSample(S(0, 1, -1), RuntimeError, "non-negative")]),
    OpInfo("logspace", lambda d: [S(0, 2, 3, dtype=DType(d)), S(-1, 1, 4), S(0, 3, 4, base=2)],
           ops=("logspace",), skip={"meta": "no tensor inputs; device='meta' factories are tested in tests/test_random.py"}, grad=False, tol={"float32": (1e-6, 1e-5)}),
    OpInfo("eye", lambda d: [S(3, dtype=DType(d)), S(2, 4, dtype=DType(d)), S(0)], ops=("eye.m",), skip={"meta": "no tensor inputs; device='meta' factories are tested in tests/test_random.py"}, grad=False,
           dtypes=FLOATS + ("bool", "int64"), errors=lambda: [ErrorSample(S(-1), RuntimeError, "n must be")]),
    OpInfo("empty_strided", lambda d: [S((2, 3), (1, 2), dtype=DType(d))], ops=("empty_strided",), grad=False,
           call=lambda m, *a, **k: m.empty_strided(*a, **k).stride()),
    OpInfo("zeros", lambda d: [S(2, 3, dtype=DType(d)), S((2, 3)), S(size=(1, 2)), S(0)], ops=("full", "empty"),
           skip={"meta": "no tensor inputs; device='meta' factories are tested in tests/test_random.py"}, grad=False, dtypes=ANY),
    OpInfo("tensor", lambda d: [S([[1, 2], [3, 4]]), S([1.5, 2]), S([True, False]), S([1, 2.5j]), S([]),
                                S([[], []]), S(3), S([np.float32(1), 2]), S([np.int32(1)])], skip={"meta": "no tensor inputs; device='meta' factories are tested in tests/test_random.py"}, grad=False),
    OpInfo("tensor_of_tensors", lambda d: [S([T(()), T(())]), S([[T(())], [T(())]])],
           call=lambda m, *a: m.tensor(*a), grad=False, dtypes=FLOATS + ("int32",),
           skip={"meta": "tensor() copies data: meta tensors have none",
                 "cuda": "tensor() of cuda tensors lands on the default device (cpu), as in PyTorch"}),
    OpInfo("tensor_errors", lambda d: [], call=lambda m, *a: m.tensor(*a), grad=False,
           errors=lambda: [ErrorSample(S([[1, 2], [3]]), ValueError, "expected sequence of length 2 at dim 1"),
                           ErrorSample(S([[1, 2], 3]), TypeError, "not a sequence"),
                           ErrorSample(S(["a"]), ValueError)]),
    # ---- random (shape/dtype only; statistics in tests/test_random.py) ----
    OpInfo("rand", lambda d: [S(2, 3, dtype=DType(d)), S((0, 2), dtype=DType(d))], ops=("rand",), random=True,
           skip={"meta": "no tensor inputs; device='meta' factories are tested in tests/test_random.py"}, grad=False, dtypes=FLOATS_AND_LOWP,
           errors=lambda: [ErrorSample(S(2, dtype=DType("int64")), NotImplementedError)]),
    OpInfo("randn", lambda d: [S(2, 3, dtype=DType(d)), S(size=(4,))], ops=("randn",), random=True, skip={"meta": "no tensor inputs; device='meta' factories are tested in tests/test_random.py"}, grad=False,
           dtypes=FLOATS_AND_LOWP),
    OpInfo("randint", lambda d: [S(5, (3,)), S(2, 9, (2, 2), dtype=DType(d))], ops=("randint.low",), random=True,
           skip={"meta": "no tensor inputs; device='meta' factories are tested in tests/test_random.py"}, grad=False, dtypes=("int64", "int32", "uint8", "float32"),
           errors=lambda: [ErrorSample(S(3, 2, (3,)), RuntimeError, "from")]),
    OpInfo("randperm", lambda d: [S(5), S(0), S(4, dtype=DType(d))], ops=("randperm",), random=True, skip={"meta": "no tensor inputs; device='meta' factories are tested in tests/test_random.py"}, grad=False,
           dtypes=("int64", "float32"), errors=lambda: [ErrorSample(S(-1), RuntimeError, "negative")]),
    OpInfo("rand_like", lambda d: [S(T((2, 3)))], random=True, grad=False),
    OpInfo("randn_like", lambda d: [S(T((2, 3)))], random=True, grad=False),
    OpInfo("randint_like", lambda d: [S(T((2, 3)), 5), S(T((2,)), 1, 4)], random=True, grad=False,
           dtypes=FLOATS + ("int64",)),
    OpInfo("normal", lambda d: [S(T((3,)), T((2, 3), low=0.5, high=1)), S(T((3,)), 2.0), S(0.0, T((3,), low=0, high=1)),
                                S(1.0, 2.0, (2, 2))],
           ops=("normal.Tensor_Tensor", "normal.float_float"), random=True, gradcheck=False,
           skip={"grad": "depends on the random draw", "meta": "the float/float form has no tensor inputs"},
           errors=lambda: [ErrorSample(S(T((3,)), T((3,), low=-2, high=-1)), RuntimeError, "std >= 0")]),
    OpInfo("normal_", lambda d: [S(T((3, 2))), S(T((3,)), 2.0, 0.5)], ops=("normal.self", "normal_.self"),
           call=lambda m, x, *a, **k: x.clone().normal_(*a, **k), random=True, grad=False,
           dtypes=FLOATS_AND_LOWP),
    OpInfo("uniform_", lambda d: [S(T((3, 2))), S(T((3,)), 2.0, 5.0)], ops=("uniform", "uniform_"),
           call=lambda m, x, *a: x.clone().uniform_(*a), random=True, grad=False, dtypes=FLOATS_AND_LOWP,
           errors=lambda: [ErrorSample(S(T((3,)), 2.0, 1.0), RuntimeError, "from")]),
    OpInfo("exponential_", lambda d: [S(T((3, 2))), S(T((3,)), 2.0)], ops=("exponential", "exponential_"),
           call=lambda m, x, *a: x.clone().exponential_(*a), random=True, grad=False,
           errors=lambda: [ErrorSample(S(T((3,)), -1.0), RuntimeError, "lambda")]),
    OpInfo("geometric_", lambda d: [S(T((3, 2)), 0.3)], ops=("geometric", "geometric_"),
           call=lambda m, x, *a: x.clone().geometric_(*a), random=True, grad=False, dtypes=FLOATS + ("int64",)),
    OpInfo("log_normal_", lambda d: [S(T((3, 2))), S(T((3,)), 0.0, 0.5)], ops=("log_normal", "log_normal_"),
           call=lambda m, x, *a: x.clone().log_normal_(*a), random=True, grad=False),
    OpInfo("cauchy_", lambda d: [S(T((3, 2))), S(T((3,)), 1.0, 0.5)], ops=("cauchy", "cauchy_"),
           call=lambda m, x, *a: x.clone().cauchy_(*a), random=True, grad=False),
    OpInfo("random_", lambda d: [S(T((3, 2))), S(T((3,)), 5), S(T((3,)), -3, 5)], ops=("random", "random_"),
           call=lambda m, x, *a: x.clone().random_(*a), random=True, grad=False, dtypes=FLOATS + ("int64", "uint8")),
    OpInfo("bernoulli", lambda d: [S(T((3, 2), low=0, high=1)), S(T((3,)), 0.3)],
           ops=("bernoulli", "bernoulli.p", "bernoulli.Tensor", "bernoulli_.p", "bernoulli_.Tensor"),
           method="bernoulli", random=True, gradcheck=False,
           skip={"grad": "PyTorch raises 'derivative for aten::bernoulli is not implemented' in backward"}),
    OpInfo("bernoulli_", lambda d: [S(T((3, 2)), 0.3), S(T((3,)), T((3,), low=0, high=1))],
           call=lambda m, x, *a: x.clone().bernoulli_(*a), random=True, grad=False),
    OpInfo("poisson", lambda d: [S(T((3, 2), low=0, high=5))], ops=("poisson",), random=True, gradcheck=False),
    OpInfo("multinomial", lambda d: [S(T((5,), low=0.1, high=1), 3), S(T((2, 4), low=0.1, high=1), 6, True)],
           ops=("multinomial",), method="multinomial", random=True, grad=False,
           errors=lambda: [ErrorSample(S(T((3,), low=0, high=1), 5), RuntimeError, "without replacement"),
                           ErrorSample(S(T((3,), low=-1, high=-0.5), 2), RuntimeError, "probability")]),
]


def _svd_recon(m, a):
    U, S_, Vh = m.linalg.svd(a, full_matrices=False)
    return S_, (U * S_.unsqueeze(-2)) @ Vh


def _qr_recon(m, a, mode):
    Q, R = m.linalg.qr(a, mode)
    return Q @ R, R.abs()
