"""Op-database entries for activations, distances, normalisation, dropout and losses
(flambeau/_ops/activation.py, norm_loss.py, loss.py). Attention is tested in tests/test_sdpa.py."""
from tests.opdb import OpInfo, S, T, ErrorSample, FLOATS, FLOATS_AND_LOWP

F = "nn.functional."


def unary(dtype):
    return [S(T((3, 4))), S(T(())), S(T((0, 2))), S(T((4, 3), noncontig=True)), S(T((2, 3, 2)))]


def _act(name, ops, kwargs_list=({},), dtypes=FLOATS_AND_LOWP, fn=None, **kw):
    def samples(dtype):
        out = []
        for k in kwargs_list:
            out += [S(*s.args, **k) for s in unary(dtype)]
        return out
    return OpInfo(name, samples, fn=fn or F + name, ops=ops, dtypes=dtypes, **kw)


def _inplace_call(name, **fixed):
    def call(m, x, *a, **k):
        return getattr(m.nn.functional, name)(x.clone(), *a, inplace=True, **fixed, **k)
    return call


ACT = [
    _act("relu", ("relu", "relu_backward", "relu_"), dtypes=FLOATS_AND_LOWP + ("int64", "int32"),
         method="relu", inplace="relu_"),
    _act("relu6", (), ),
    _act("leaky_relu", ("leaky_relu", "leaky_relu_backward", "leaky_relu_"), ({}, {"negative_slope": 0.2})),
    _act("elu", ("elu", "elu_backward", "elu_"), ({}, {"alpha": 0.5})),
    _act("selu", ()), _act("celu", (), ({}, {"alpha": 2.0})),
    _act("gelu", ("gelu", "gelu_backward"), ({}, {"approximate": "tanh"})),
    _act("silu", ("silu", "silu_backward")), _act("mish", ("mish", "mish_backward")),
    _act("hardtanh", ("hardtanh", "hardtanh_backward"), ({}, {"min_val": -0.5, "max_val": 2.0})),
    _act("hardsigmoid", ("hardsigmoid", "hardsigmoid_backward")),
    _act("hardswish", ("hardswish", "hardswish_backward")),
    _act("softplus", ("softplus", "softplus_backward"), ({}, {"beta": 2, "threshold": 1.5})),
    _act("softsign", ()), _act("tanhshrink", ()),            # compositions, in PyTorch as here
    _act("softshrink", ("softshrink", "softshrink_backward"), ({}, {"lambd": 1.0}),
         errors=lambda: [ErrorSample(S(T((3,)), lambd=-1.0), RuntimeError, "lambda must be")]),
    _act("hardshrink", ("hardshrink", "hardshrink_backward"), ({}, {"lambd": 1.0}), method="hardshrink"),
    _act("logsigmoid", ("log_sigmoid", "log_sigmoid_backward")),
    _act("rrelu", ("rrelu_with_noise_functional",)),
    OpInfo("rrelu_train", lambda d: [S(T((3, 4)), training=True)], fn=F + "rrelu", random=True, gradcheck=False),
    OpInfo("threshold", lambda d: [S(T((3, 4)), 0.5, -2.0), S(T(()), 0.0, 1.0), S(T((4, 3), noncontig=True), 1, 0)],
           fn=F + "threshold", ops=("threshold", "threshold_backward", "threshold_"),
           dtypes=FLOATS_AND_LOWP + ("int64",)),
    OpInfo("torch_threshold_", lambda d: [S(T((3, 4)), 0.5, -2.0)], call=lambda m, x, *a: m.threshold_(x.clone(), *a)),
    OpInfo("glu", lambda d: [S(T((3, 4))), S(T((4, 6)), 0), S(T((2, 4, 3), noncontig=True), 1)], fn=F + "glu",
           ops=("glu", "glu_backward"), dtypes=FLOATS_AND_LOWP,
           errors=lambda: [ErrorSample(S(T((3, 5))), RuntimeError, "Halving dimension must be even")]),
    OpInfo("prelu", lambda d: [S(T((3, 4, 2)), T((4,))), S(T((3, 4)), T((1,))), S(T((5,)), T((1,))),
                               S(T((2, 3, 4), noncontig=True), T((3,)))],
           fn=F + "prelu", ops=("prelu", "_prelu_kernel_backward"), method="prelu", dtypes=FLOATS_AND_LOWP,
           errors=lambda: [ErrorSample(S(T((3, 4)), T((3,))), RuntimeError, "Mismatch of parameter numbers")]),
    OpInfo("sigmoid_F", lambda d: [S(T((3, 4)))], fn=F + "sigmoid"),
    OpInfo("tanh_F", lambda d: [S(T((3, 4)))], fn=F + "tanh"),
]
for _n, _extra in (("relu", {}), ("relu6", {}), ("leaky_relu", {}), ("elu", {}), ("selu", {}), ("celu", {}),
                   ("silu", {}), ("mish", {}), ("hardtanh", {}), ("hardsigmoid", {}), ("hardswish", {}),
                   ("rrelu", {})):
    ACT.append(OpInfo(f"{_n}_inplace", lambda d: [S(T((3, 4)))], call=_inplace_call(_n),
                      ops=tuple(f"{o}_" for o in ({"relu6": "hardtanh", "selu": "elu", "celu": "elu",
                                                     "rrelu": "leaky_relu"}.get(_n, _n),))))
ACT += [
    OpInfo("F_relu_", lambda d: [S(T((3, 4)))], call=lambda m, x: m.nn.functional.relu_(x.clone())),
    OpInfo("F_elu_", lambda d: [S(T((3, 4)))], call=lambda m, x: m.nn.functional.elu_(x.clone())),
    OpInfo("F_leaky_relu_", lambda d: [S(T((3, 4)))], call=lambda m, x: m.nn.functional.leaky_relu_(x.clone())),
    OpInfo("F_hardtanh_", lambda d: [S(T((3, 4)))], call=lambda m, x: m.nn.functional.hardtanh_(x.clone())),
    OpInfo("F_threshold_", lambda d: [S(T((3, 4)), 0.1, 2.0)],
           call=lambda m, x, *a: m.nn.functional.threshold_(x.clone(), *a)),
    OpInfo("torch_selu_celu", lambda d: [S(T((3, 4)))], call=lambda m, x: m.selu(x) + m.celu(x, 0.7)),
]

DIST = [
    OpInfo("normalize", lambda d: [S(T((3, 4))), S(T((3, 4)), p=1.0, dim=0), S(T((2, 3, 4)), p=3.0, dim=-1),
                                   S(T((4, 3), noncontig=True), p=float("inf")), S(T((3,)), dim=0)],
           fn=F + "normalize", ops=("normalize", "normalize_backward")),
    OpInfo("cosine_similarity", lambda d: [S(T((3, 4)), T((3, 4))), S(T((3, 4)), T((4,)), dim=-1),
                                           S(T((2, 3, 4)), T((2, 3, 4), noncontig=True), 0)],
           fn=F + "cosine_similarity", ops=("cosine_similarity", "cosine_similarity_backward"),
           errors=lambda: [ErrorSample(S(T((3, 4)), T((3, 5))), RuntimeError)]),
    OpInfo("pairwise_distance", lambda d: [S(T((3, 4)), T((3, 4))), S(T((3, 4)), T((4,)), p=1.0),
                                           S(T((3, 4)), T((3, 4)), p=3.0, keepdim=True), S(T((5,)), T((5,)))],
           fn=F + "pairwise_distance", ops=("pairwise_distance", "pairwise_distance_backward")),
    OpInfo("cdist", lambda d: [S(T((3, 4)), T((5, 4))), S(T((2, 3, 4)), T((2, 5, 4)), p=1.0),
                               S(T((3, 4)), T((2, 4)), p=3.0), S(T((3, 4), noncontig=True), T((5, 4)), p=float("inf"))],
           fn="cdist", ops=("cdist", "cdist_backward"),
           errors=lambda: [ErrorSample(S(T((3, 4)), T((3, 5))), RuntimeError, "same number of columns"),
                           ErrorSample(S(T((4,)), T((3, 4))), RuntimeError, "at least 2D")]),
    OpInfo("pdist", lambda d: [S(T((5, 3))), S(T((4, 2)), 1.0), S(T((4, 3)), 3.0)], fn=F + "pdist",
           ops=("pdist", "pdist_backward")),
]


# ---- normalisation ----------------------------------------------------------------------------
def ln_samples(d):
    return [S(T((3, 4)), (4,)), S(T((2, 3, 4)), (3, 4), T((3, 4)), T((3, 4))), S(T((2, 5)), [5], T((5,)), None, eps=1e-3),
            S(T((4, 3), noncontig=True), (3,), None, T((3,)))]


def bn_samples(d):
    return [S(T((4, 3)), T((3,), requires_grad=False), T((3,), low=0.5, high=2, requires_grad=False), training=True),
            S(T((4, 3, 5)), T((3,), requires_grad=False), T((3,), low=0.5, high=2, requires_grad=False), T((3,)), T((3,)),
              training=True, momentum=0.3),
            S(T((2, 3, 2, 2)), T((3,), requires_grad=False), T((3,), low=0.5, high=2, requires_grad=False), T((3,)), T((3,))),
            S(T((4, 3)), None, None, T((3,)), T((3,)), training=True)]


NORM = [
    OpInfo("layer_norm", ln_samples, fn=F + "layer_norm", ops=("native_layer_norm", "native_layer_norm_backward"),
           dtypes=FLOATS_AND_LOWP, tol={"float32": (1e-5, 1e-5), "float16": (5e-3, 1e-3)},
           errors=lambda: [ErrorSample(S(T((2, 3)), (4,)), RuntimeError, "normalized_shape")]),
    OpInfo("torch_layer_norm", lambda d: [S(T((3, 4)), (4,))], fn="layer_norm"),
    OpInfo("rms_norm", lambda d: [S(T((3, 4)), (4,)), S(T((2, 3, 4)), (3, 4), T((3, 4))), S(T((2, 5)), [5], eps=1e-3)],
           fn=F + "rms_norm", ops=("_fused_rms_norm", "_fused_rms_norm_backward"), dtypes=FLOATS,
           tol={"float32": (1e-5, 1e-5)}),
    OpInfo("batch_norm", bn_samples, fn=F + "batch_norm", ops=("native_batch_norm", "native_batch_norm_backward"),
           dtypes=FLOATS, tol={"float32": (1e-5, 1e-5)},
           errors=lambda: [ErrorSample(S(T((1, 3)), None, None, training=True), ValueError, "more than 1 value")]),
    OpInfo("batch_norm_running_stats", lambda d: [S(T((4, 3, 2)), T((3,)), T((3,), low=0.5, high=2), momentum=0.2)],
           call=lambda m, x, rm, rv, **k: (m.nn.functional.batch_norm(x, rm, rv, training=True, **k), rm, rv),
           grad=False),
    OpInfo("torch_batch_norm", lambda d: [S(T((4, 3)), T((3,)), T((3,)), None, None, True, 0.1, 1e-5, False)],
           fn="batch_norm"),
    OpInfo("group_norm", lambda d: [S(T((2, 4, 3)), 2), S(T((2, 6, 2, 2)), 3, T((6,)), T((6,))), S(T((3, 4)), 4),
                                    S(T((2, 4, 3), noncontig=True), 1, T((4,)))],
           fn=F + "group_norm", ops=("native_group_norm", "native_group_norm_backward"), dtypes=FLOATS,
           dynamic_fallbacks={"whole graph": "a floor division by a derived size (channels // groups) the code "
                                            "generator cannot express"},
           tol={"float32": (1e-5, 1e-5)},
           errors=lambda: [ErrorSample(S(T((2, 3, 4)), 2), RuntimeError, "divisible by num_groups")]),
    OpInfo("instance_norm", lambda d: [S(T((2, 3, 4))), S(T((2, 3, 2, 2)), weight=T((3,)), bias=T((3,))),
                                       S(T((2, 3, 4)), T((3,), requires_grad=False),
                                         T((3,), low=0.5, high=2, requires_grad=False))],
           fn=F + "instance_norm", tol={"float32": (1e-5, 1e-5)}),
    OpInfo("instance_norm_running_stats", lambda d: [S(T((2, 3, 4)), T((3,)), T((3,), low=0.5, high=2))],
           call=lambda m, x, rm, rv: (m.nn.functional.instance_norm(x, rm, rv), rm, rv), grad=False),
]

DROPOUT = [
    OpInfo("dropout", lambda d: [S(T((30, 4))), S(T((3, 4)), 0.0), S(T((3, 4)), 1.0), S(T((3, 4)), 0.3, False)],
           fn=F + "dropout", ops=("native_dropout",), random=True, gradcheck=False,
           errors=lambda: [ErrorSample(S(T((3,)), 1.5), ValueError, "dropout probability")]),
    OpInfo("dropout_p0_exact", lambda d: [S(T((3, 4)), 0.0), S(T((3, 4)), 0.5, False)], fn=F + "dropout"),
    OpInfo("dropout_inplace", lambda d: [S(T((3, 4)), 0.5, True, True)],
           call=lambda m, x, *a: m.nn.functional.dropout(x.clone(), *a), random=True, gradcheck=False),
    OpInfo("dropout2d", lambda d: [S(T((2, 3, 4, 4))), S(T((3, 4, 4)))], fn=F + "dropout2d", random=True,
           gradcheck=False),
    OpInfo("dropout1d", lambda d: [S(T((2, 3, 4))), S(T((3, 4)))], fn=F + "dropout1d", random=True, gradcheck=False,
           errors=lambda: [ErrorSample(S(T((2, 3, 4, 5))), RuntimeError, "dropout1d")]),
    OpInfo("dropout3d", lambda d: [S(T((2, 3, 2, 2, 2)))], fn=F + "dropout3d", random=True, gradcheck=False),
    OpInfo("alpha_dropout", lambda d: [S(T((3, 4)), 0.3, True), S(T((3, 4)), 0.3, False), S(T((3, 4)), 1.0, True)],
           fn=F + "alpha_dropout", random=True, gradcheck=False),
    OpInfo("feature_alpha_dropout", lambda d: [S(T((2, 3, 4)), 0.3, True)], fn=F + "feature_alpha_dropout",
           random=True, gradcheck=False),
    OpInfo("torch_dropout", lambda d: [S(T((3, 4)), 0.3, True)], fn="dropout", random=True, gradcheck=False),
]


# ---- losses ---------------------------------------------------------------------------------------
def _idx(shape, high, values=None):
    return T(shape, dtype="int64", low=0, high=high, values=values)


def ce_samples(d):
    return [
        S(T((4, 5)), _idx((4,), 5)),
        S(T((4, 5)), _idx((4,), 5), weight=T((5,), low=0.1, high=2, requires_grad=False)),
        S(T((4, 5)), _idx((4,), 5, [1, -100, 3, 0]), reduction="none"),
        S(T((4, 5)), _idx((4,), 5, [1, -100, 3, 0]), reduction="sum", label_smoothing=0.2),
        S(T((4, 5)), _idx((4,), 5, [1, 7, 3, 0]), ignore_index=7, label_smoothing=0.1,
          weight=T((5,), low=0.1, high=2, requires_grad=False)),
        S(T((2, 3, 4)), _idx((2, 4), 3)),
        S(T((2, 3, 2, 2)), _idx((2, 2, 2), 3), reduction="none", label_smoothing=0.3),
        S(T((5,)), _idx((), 5, 2)),
        S(T((4, 5)), T((4, 5), low=0, high=1)),
        S(T((2, 3, 4)), T((2, 3, 4), low=0, high=1), label_smoothing=0.2, weight=T((3,), low=0.5, high=1.5)),
        S(T((4, 5)), T((4, 5), low=0, high=1), reduction="none"),
        S(T((5, 4), noncontig=True), _idx((5,), 4)),
        S(T((4, 5)), _idx((4,), 5, [1, -100, 3, 0]), label_smoothing=0.25),
        S(T((4, 5)), _idx((4,), 5, [4, 2, 2, 0]), reduction="sum", weight=T((5,), low=0.1, high=2,
                                                                             requires_grad=False)),
        S(T((2, 3, 4)), _idx((2, 4), 3, [[0, -100, 2, 1], [2, 2, -100, 0]]), label_smoothing=0.1,
          weight=T((3,), low=0.5, high=1.5, requires_grad=False)),
        S(T((2, 4, 3), noncontig=True), _idx((2, 3), 4, [[0, 3, -100], [1, 1, 2]]), reduction="none",
          weight=T((4,), low=0.5, high=1.5, requires_grad=False), label_smoothing=0.4),
        S(T((5,)), _idx((), 5, 3), weight=T((5,), low=0.5, high=1.5, requires_grad=False), label_smoothing=0.2),
        S(T((4, 5)), T((4, 5), low=0, high=1), reduction="sum", weight=T((5,), low=0.5, high=1.5)),
        S(T((5,)), T((5,), low=0, high=1), label_smoothing=0.3),
        S(T((3, 4)), _idx((3,), 4, [-100, -100, -100])),
        S(T((3, 4)), _idx((3,), 4, [-100, -100, -100]), label_smoothing=0.2),
    ]


def ce_errors():
    return [ErrorSample(S(T((3, 4)), _idx((3,), 4, [1, 2, 5])), IndexError, "Target 5 is out of bounds"),
            ErrorSample(S(T((3, 4)), _idx((2,), 4)), ValueError, "Expected input batch_size"),
            ErrorSample(S(T((3, 4)), T((3,), dtype="float32")), RuntimeError),
            ErrorSample(S(T((3, 4)), _idx((3,), 4), weight=T((3,))), RuntimeError, "weight tensor"),
            ErrorSample(S(T((3, 4)), _idx((3,), 4), reduction="bad"), ValueError, "not a valid value")]


def nll_samples(d):
    return [s for s in ce_samples(d) if s.args[1].dtype == "int64" and "label_smoothing" not in s.kwargs]


def pair(d, lo=-2, hi=2, tlo=None, thi=None, extra=({},)):
    out = []
    for k in extra:
        out += [S(T((3, 4), low=lo, high=hi), T((3, 4), low=tlo if tlo is not None else lo,
                                                 high=thi if thi is not None else hi), **k),
                S(T((3, 4), low=lo, high=hi), T((3, 4), low=tlo if tlo is not None else lo,
                                                 high=thi if thi is not None else hi), reduction="sum", **k),
                S(T((2, 3), low=lo, high=hi), T((2, 3), low=tlo if tlo is not None else lo,
                                                 high=thi if thi is not None else hi), reduction="none", **k)]
    out.append(S(T((0,), low=lo, high=hi), T((0,), low=lo, high=hi), reduction="sum"))
    return out


def _pm1(shape, vals):
    return T(shape, values=vals)


LOSS = [
    OpInfo("cross_entropy", ce_samples, fn=F + "cross_entropy", ops=("cross_entropy_loss", "cross_entropy_loss_backward"),
           dtypes=FLOATS_AND_LOWP, errors=ce_errors, tol={"float32": (1e-5, 1e-5), "bfloat16": (3e-2, 3e-2),
                                                          "float16": (2e-3, 2e-3)}),
    OpInfo("nll_loss", nll_samples, fn=F + "nll_loss", ops=("nll_loss_nd", "nll_loss_nd_backward"), dtypes=FLOATS,
           errors=lambda: [e for e in ce_errors()]),
    OpInfo("mse_loss", lambda d: pair(d) + [S(T((3, 4)), T((4,)))], fn=F + "mse_loss",
           ops=("mse_loss", "mse_loss_backward"), dtypes=FLOATS_AND_LOWP),
    OpInfo("l1_loss", pair, fn=F + "l1_loss", ops=("l1_loss", "l1_loss_backward"), dtypes=FLOATS_AND_LOWP),
    OpInfo("smooth_l1_loss", lambda d: pair(d, extra=({}, {"beta": 0.5}, {"beta": 0.0})), fn=F + "smooth_l1_loss",
           ops=("smooth_l1_loss", "smooth_l1_loss_backward")),
    OpInfo("huber_loss", lambda d: pair(d, extra=({}, {"delta": 0.5})), fn=F + "huber_loss",
           ops=("huber_loss", "huber_loss_backward")),
    OpInfo("soft_margin_loss", lambda d: [S(T((3, 4)), T((3, 4), requires_grad=False), reduction=r)
                                          for r in ("mean", "sum", "none")], fn=F + "soft_margin_loss",
           ops=("soft_margin_loss", "soft_margin_loss_backward")),
    OpInfo("binary_cross_entropy",
           lambda d: pair(d, 0.05, 0.95, 0, 1) + [S(T((3, 4), low=0.05, high=0.95), T((3, 4), low=0, high=1),
                                                    T((4,), low=0.5, high=2, requires_grad=False))],
           fn=F + "binary_cross_entropy", ops=("binary_cross_entropy", "binary_cross_entropy_backward"),
           errors=lambda: [ErrorSample(S(T((3,), low=1.5, high=2), T((3,), low=0, high=1)), RuntimeError, "between 0 and 1"),
                           ErrorSample(S(T((3,), low=0, high=1), T((3, 1), low=0, high=1)), ValueError, "target size")]),
    OpInfo("binary_cross_entropy_with_logits",
           lambda d: pair(d, -3, 3, 0, 1) + [S(T((3, 4)), T((3, 4), low=0, high=1), pos_weight=T((4,), low=0.5, high=2)),
                                              S(T((3, 4)), T((3, 4), low=0, high=1), T((3, 4), low=0, high=1),
                                                pos_weight=T((4,), low=0.5, high=2), reduction="none")],
           fn=F + "binary_cross_entropy_with_logits",
           errors=lambda: [ErrorSample(S(T((3,)), T((3, 1))), ValueError, "must be the same as input size")]),
    OpInfo("kl_div", lambda d: [S(T((3, 4)), T((3, 4), low=0.1, high=1)),
                                S(T((3, 4)), T((3, 4), low=0.1, high=1), reduction="batchmean"),
                                S(T((3, 4)), T((3, 4)), reduction="sum", log_target=True),
                                S(T((2, 3)), T((2, 3)), reduction="none", log_target=True)],
           fn=F + "kl_div", ops=("kl_div_elementwise", "kl_div_elementwise_backward")),
    OpInfo("poisson_nll_loss", lambda d: [S(T((3, 4)), T((3, 4), low=0, high=4)),
                                          S(T((3, 4), low=0.5, high=3), T((3, 4), low=0, high=4), log_input=False),
                                          S(T((3, 4)), T((3, 4), low=0, high=4), full=True, reduction="sum"),
                                          S(T((3, 4), low=0.5, high=3), T((3, 4), low=0, high=4), False, True,
                                            reduction="none")],
           fn=F + "poisson_nll_loss", ops=("poisson_nll_loss_elementwise", "poisson_nll_loss_elementwise_backward")),
    OpInfo("gaussian_nll_loss", lambda d: [S(T((3, 4)), T((3, 4)), T((3, 4), low=0.1, high=2)),
                                           S(T((3, 4)), T((3, 4)), T((3,), low=0.1, high=2), full=True),
                                           S(T((3, 4)), T((3, 4)), T((3, 1), low=0.1, high=2), reduction="none")],
           fn=F + "gaussian_nll_loss", ops=("gaussian_nll_loss_elementwise", "gaussian_nll_loss_elementwise_backward"),
           errors=lambda: [ErrorSample(S(T((3, 4)), T((3, 4)), T((3, 2), low=0.1)), ValueError, "incorrect size"),
                           ErrorSample(S(T((3, 4)), T((3, 4)), T((3, 4), low=-2, high=-1)), ValueError, "negative")]),
    OpInfo("hinge_embedding_loss", lambda d: [S(T((3, 4)), _pm1((3, 4), [[1, -1, 1, -1]] * 3)),
                                              S(T((3, 4)), _pm1((3, 4), [[1, 1, -1, -1]] * 3), margin=0.5,
                                                reduction="none")],
           fn=F + "hinge_embedding_loss",
           ops=("hinge_embedding_loss_elementwise", "hinge_embedding_loss_elementwise_backward")),
    OpInfo("margin_ranking_loss", lambda d: [S(T((5,)), T((5,)), _pm1((5,), [1, -1, 1, -1, 1])),
                                             S(T((5,)), T((5,)), _pm1((5,), [1, -1, 1, -1, 1]), margin=0.3,
                                               reduction="none")],
           fn=F + "margin_ranking_loss",
           ops=("margin_ranking_loss_elementwise", "margin_ranking_loss_elementwise_backward")),
    OpInfo("multilabel_soft_margin_loss", lambda d: [S(T((3, 4)), T((3, 4), low=0, high=1)),
                                                     S(T((3, 4)), T((3, 4), low=0, high=1),
                                                       T((4,), low=0.5, high=2), reduction="none")],
           fn=F + "multilabel_soft_margin_loss"),
    OpInfo("cosine_embedding_loss", lambda d: [S(T((4, 5)), T((4, 5)), _pm1((4,), [1, -1, 1, -1])),
                                               S(T((4, 5)), T((4, 5)), _pm1((4,), [1, -1, -1, -1]), margin=0.2,
                                                 reduction="sum")],
           fn=F + "cosine_embedding_loss"),
    OpInfo("triplet_margin_loss", lambda d: [S(T((4, 5)), T((4, 5)), T((4, 5))),
                                             S(T((4, 5)), T((4, 5)), T((4, 5)), swap=True, p=1, reduction="none")],
           fn=F + "triplet_margin_loss",
           errors=lambda: [ErrorSample(S(T((4, 5)), T((5,)), T((4, 5))), RuntimeError, "same number of dimensions")]),
]



def _sdpa_blocked(m, *a, **k):
    if m.__name__ == "torch":
        return m.nn.functional.scaled_dot_product_attention(*a, **k)
    from flambeau._ops import attention as A
    with A.sdpa_kernel(A.SDPBackend.EFFICIENT_ATTENTION):
        return m.nn.functional.scaled_dot_product_attention(*a, **k)


def sdpa_samples(d):
    return [S(T((2, 3, 5, 4)), T((2, 3, 6, 4)), T((2, 3, 6, 3))),
            S(T((2, 5, 4)), T((2, 5, 4)), T((2, 5, 4)), is_causal=True),
            S(T((2, 3, 5, 4)), T((2, 3, 6, 4)), T((2, 3, 6, 3)), T((5, 6), requires_grad=False), scale=0.5)]


ATTN = [
    OpInfo("scaled_dot_product_attention", sdpa_samples, fn=F + "scaled_dot_product_attention",
           ops=("_sdpa_math", "_sdpa_math_backward", "_sdpa_flash_cpu", "_sdpa_flash_cpu_backward"),
           tol={"float32": (1e-5, 1e-5)}),     # float32 runs the fused cpu kernel, float64 the math path
    OpInfo("scaled_dot_product_attention_blocked", sdpa_samples, call=_sdpa_blocked,
           ops=("_sdpa_blocked", "_sdpa_blocked_backward"), tol={"float32": (1e-5, 1e-5)}),
]

OPS = ACT + DIST + NORM + DROPOUT + LOSS + ATTN
