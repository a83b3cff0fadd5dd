"""Op-database entries for convolution, pooling, interpolation, padding, embedding and one_hot."""
import numpy as np

from tests.opdb import OpInfo, S, T, ErrorSample, FLOATS, FLOATS_AND_LOWP, INTS

LOWP_TOL = {"float16": (2e-3, 2e-3), "bfloat16": (2e-2, 2e-2), "float32": (1e-5, 1e-5)}


def conv1d_samples(d):
    return [S(T((2, 4, 9)), T((6, 4, 3)), T((6,))),
            S(T((4, 9)), T((6, 4, 3)), None, stride=2, padding=1),
            S(T((2, 4, 9)), T((6, 2, 2)), None, padding="same", groups=2, dilation=2),
            S(T((2, 4, 9), noncontig=True), T((6, 4, 1)), padding="valid")]


def conv2d_samples(d):
    return [S(T((2, 3, 7, 6)), T((4, 3, 3, 3)), T((4,))),
            S(T((2, 4, 7, 6)), T((6, 2, 3, 2)), T((6,)), stride=(2, 1), padding=(1, 2), groups=2),
            S(T((3, 7, 6)), T((4, 3, 3, 3)), None, dilation=2, padding=1),
            S(T((1, 3, 6, 6), noncontig=True), T((4, 3, 2, 2)), None, padding="same"),
            S(T((0, 3, 5, 5)), T((4, 3, 3, 3)), T((4,))),
            S(T((2, 3, 5, 5)), T((4, 3, 1, 1)), T((4,)), stride=2)]


def conv3d_samples(d):
    return [S(T((1, 2, 4, 5, 4)), T((3, 2, 2, 3, 2)), T((3,)), stride=(1, 2, 1), padding=1),
            S(T((2, 4, 3, 3)), T((2, 2, 2, 2, 2)), None, groups=2)]


def conv_t1d_samples(d):
    return [S(T((2, 4, 5)), T((4, 3, 3)), T((3,)), stride=2, padding=1, output_padding=1),
            S(T((4, 5)), T((4, 2, 2)), None, groups=2, dilation=2)]


def conv_t2d_samples(d):
    return [S(T((2, 4, 5, 4)), T((4, 3, 3, 3)), T((3,))),
            S(T((2, 4, 5, 4)), T((4, 3, 3, 2)), T((6,)), stride=(2, 3), padding=1, output_padding=(1, 0), groups=2),
            S(T((4, 3, 3)), T((4, 2, 2, 2)), None, stride=2, dilation=(2, 1)),
            S(T((1, 4, 3, 3), noncontig=True), T((4, 2, 3, 3)), None, padding=1)]


def conv_errors():
    return [ErrorSample(S(T((1, 4, 5, 5)), T((8, 3, 3, 3))), RuntimeError, r"expected input\[1, 4, 5, 5\] to have 3 channels"),
            ErrorSample(S(T((1, 3, 2, 2)), T((8, 3, 3, 3))), RuntimeError, "Kernel size can't be greater"),
            ErrorSample(S(T((3, 5)), T((8, 3, 3, 3))), RuntimeError, "Expected 3D"),
            ErrorSample(S(T((1, 4, 5, 5)), T((3, 2, 3, 3)), groups=2), RuntimeError, "divisible by 2"),
            ErrorSample(S(T((1, 3, 5, 5)), T((8, 3, 3, 3)), stride=2, padding="same"), RuntimeError, "strided"),
            ErrorSample(S(T((1, 3, 5, 5)), T((8, 3, 3, 3)), padding="foo"), RuntimeError, "Invalid padding"),
            ErrorSample(S(T((1, 3, 5, 5)), T((8, 3, 3, 3)), stride=0), RuntimeError, "non-positive stride"),
            ErrorSample(S(T((1, 3, 5, 5)), T((8, 3, 3, 3)), T((8,), dtype="float64")), RuntimeError, "bias type")]


def conv_t_errors():
    return [ErrorSample(S(T((1, 3, 5, 5)), T((2, 3, 3, 3))), RuntimeError, "transposed=1"),
            ErrorSample(S(T((1, 2, 5, 5)), T((2, 3, 3, 3)), output_padding=1), RuntimeError, "output padding")]


def max_pool1d_samples(d):
    return [S(T((2, 3, 9)), 3), S(T((3, 10)), 3, 2, 1, 2, True, True), S(T((2, 3, 8), noncontig=True), 2)]


def max_pool2d_samples(d):
    return [S(T((2, 3, 7, 6)), 2), S(T((2, 3, 7, 6)), (3, 2), (2, 1), 1, return_indices=True),
            S(T((3, 7, 7)), 3, 2, 1, 2, True, True), S(T((1, 2, 6, 5), noncontig=True), 2, ceil_mode=True),
            S(T((0, 2, 4, 4)), 2)]


def max_pool3d_samples(d):
    return [S(T((1, 2, 5, 4, 5)), 2, return_indices=True), S(T((2, 4, 5, 5)), (2, 3, 2), 2, 1, 1, True)]


def pool_errors():
    return [ErrorSample(S(T((1, 3, 5, 5)), 2, padding=2), RuntimeError, "pad should be at most half"),
            ErrorSample(S(T((1, 3, 2, 2)), 3), RuntimeError, "Output size is too small"),
            ErrorSample(S(T((3, 5)), 2), RuntimeError),
            ErrorSample(S(T((1, 3, 5, 5)), 2, stride=0), RuntimeError, "stride should not be zero")]


def avg_pool1d_samples(d):
    return [S(T((2, 3, 9)), 3), S(T((3, 10)), 3, 2, 1, True, False), S(T((2, 3, 8), noncontig=True), 2, 1)]


def avg_pool2d_samples(d):
    return [S(T((2, 3, 7, 6)), 2), S(T((2, 3, 7, 6)), (3, 2), (2, 1), 1),
            S(T((3, 7, 7)), 3, 2, 1, True, False), S(T((1, 2, 6, 5), noncontig=True), 3, 2, 1, True, True),
            S(T((1, 2, 6, 5)), 3, 2, 1, divisor_override=5), S(T((1, 2, 6, 5)), 3, 2, 1, True, False, 3)]


def avg_pool3d_samples(d):
    return [S(T((1, 2, 5, 4, 5)), 2), S(T((2, 4, 5, 5)), (2, 3, 2), 2, 1, True, False)]


def adaptive_samples(nd):
    def f(d):
        if nd == 1:
            return [S(T((2, 3, 10)), 4), S(T((3, 7)), 7), S(T((2, 3, 5), noncontig=True), 8)]
        if nd == 2:
            return [S(T((2, 3, 10, 9)), (4, 5)), S(T((3, 7, 7)), 3), S(T((1, 3, 5, 6), noncontig=True), (None, 4)),
                    S(T((1, 2, 4, 4)), 1)]
        return [S(T((1, 2, 5, 6, 4)), (2, 3, 2)), S(T((2, 4, 4, 4)), 3)]
    return f


def adaptive_max_samples(nd):
    def f(d):
        return [s if i % 2 else S(*s.args, return_indices=True, **s.kwargs) for i, s in enumerate(adaptive_samples(nd)(d))]
    return f


def interp_samples(d):
    out = [S(T((2, 3, 5, 4)), scale_factor=2), S(T((2, 3, 5, 4)), size=(7, 3)),
           S(T((2, 3, 5, 4)), size=(9, 10), mode="nearest-exact"), S(T((2, 3, 5, 4)), scale_factor=1.7, mode="nearest"),
           S(T((2, 3, 6)), size=11, mode="linear"), S(T((2, 3, 6)), size=4, mode="linear", align_corners=True),
           S(T((2, 3, 5, 4)), scale_factor=(1.5, 2.3), mode="bilinear"),
           S(T((2, 3, 5, 4)), size=(3, 7), mode="bilinear", align_corners=True),
           S(T((1, 3, 5, 4), noncontig=True), scale_factor=2.5, mode="bicubic"),
           S(T((1, 3, 5, 4)), size=(8, 3), mode="bicubic", align_corners=True),
           S(T((1, 2, 3, 4, 3)), scale_factor=2, mode="trilinear"),
           S(T((1, 2, 3, 4, 3)), size=(2, 5, 4), mode="nearest"),
           S(T((2, 3, 9, 7)), size=(4, 3), mode="area"),
           S(T((2, 3, 5, 4)), scale_factor=1.7, mode="bilinear", recompute_scale_factor=True),
           S(T((2, 3, 5, 4)), scale_factor=0.6, mode="bilinear")]
    return out


def interp_errors():
    return [ErrorSample(S(T((1, 3, 5, 5)), scale_factor=2, mode="linear"), NotImplementedError, "linear mode needs 3D"),
            ErrorSample(S(T((1, 3, 5, 5)), scale_factor=2, align_corners=True), ValueError, "align_corners"),
            ErrorSample(S(T((1, 3, 5, 5))), ValueError, "either size or scale_factor"),
            ErrorSample(S(T((1, 3, 5, 5)), size=3, scale_factor=2), ValueError, "only one of"),
            ErrorSample(S(T((1, 3, 5, 5)), size=(3,), mode="bilinear"), ValueError, "same number of spatial")]


def pad_samples(d):
    return [S(T((2, 3, 4)), (1, 2)), S(T((2, 3, 4)), (1, 2, 0, 1), value=1.5), S(T((2, 3, 4)), (-1, 2, 1, -2)),
            S(T((2, 3, 4, 5)), (2, 1, 1, 3), mode="reflect"), S(T((3, 4)), (3, 2), mode="reflect"),
            S(T((2, 3, 4, 5), noncontig=True), (2, 1, 1, 3), mode="replicate"),
            S(T((1, 2, 3, 4, 3)), (1, 1, 2, 0, 1, 2), mode="replicate"),
            S(T((2, 3, 4, 5)), (2, 1, 1, 3), mode="circular"), S(T((2, 3, 4)), (-1, 2), mode="circular"),
            S(T((0, 3, 4)), (1, 1)), S(T(()), ())]


def pad_errors():
    return [ErrorSample(S(T((1, 3, 3, 3)), (3, 3), mode="reflect"), RuntimeError),
            ErrorSample(S(T((1, 3, 3, 3)), (3, 3, 1, 1), mode="reflect"), RuntimeError, "Padding size should be less"),
            ErrorSample(S(T((1, 3)), (1, 2, 3)), RuntimeError, "divisible by 2"),
            ErrorSample(S(T((1, 3)), (-2, -2)), RuntimeError, "negative output size")]


def pixel_samples(d):
    return [S(T((2, 8, 3, 4)), 2), S(T((9, 2, 2)), 3), S(T((2, 1, 4, 3, 2)), 1)]


def unshuffle_samples(d):
    return [S(T((2, 2, 6, 4)), 2), S(T((1, 3, 3)), 3)]


def unfold_samples(d):
    return [S(T((2, 3, 6, 5)), 2), S(T((3, 6, 5)), (2, 3), dilation=(2, 1), padding=1, stride=(2, 1)),
            S(T((1, 2, 5, 5), noncontig=True), 3, stride=2)]


def fold_samples(d):
    return [S(T((2, 12, 20)), (6, 5), 2), S(T((18, 16)), (7, 6), (2, 3), dilation=(2, 1), padding=1, stride=(2, 1)),
            S(T((1, 8, 4)), (5, 5), 2, stride=3)]


def fold_errors():
    return [ErrorSample(S(T((2, 11, 20)), (6, 5), 2), RuntimeError, "divisible by the product"),
            ErrorSample(S(T((2, 12, 19)), (6, 5), 2), RuntimeError, "sliding blocks")]


def emb_samples(d):
    idx = T((4, 5), dtype="int64", low=0, high=10)
    return [S(idx, T((10, 3))), S(T((3, 2), dtype="int64", low=0, high=10), T((10, 4), noncontig=True)),
            S(T((6,), dtype="int64", values=[1, 2, 2, 3, 1, 0]), T((10, 3)), padding_idx=2),
            S(T((6,), dtype="int64", values=[1, 1, 2, 3, 1, 0]), T((10, 3)), scale_grad_by_freq=True),
            S(T((6,), dtype="int64", values=[1, 1, 2, 3, 1, 0]), T((10, 3)), padding_idx=-9),
            S(T((0,), dtype="int64"), T((10, 3))), S(T((), dtype="int64", values=4), T((10, 3)))]


def emb_errors():
    return [ErrorSample(S(T((3,), dtype="int64", values=[1, 10, 2]), T((10, 3))), IndexError, "index out of range"),
            ErrorSample(S(T((3,), dtype="float32"), T((10, 3))), RuntimeError, "indices")]


def _emb_max_norm(mod, idx, w):
    w = w.detach().clone()
    out = mod.nn.functional.embedding(idx, w, max_norm=1.0)
    return out, w


def emb_bag_samples(d):
    idx = T((8,), dtype="int64", values=[1, 2, 4, 5, 4, 3, 2, 9])
    offs = T((3,), dtype="int64", values=[0, 4, 4])
    return [S(idx, T((10, 3)), offs, mode="sum"), S(idx, T((10, 3)), offs), S(idx, T((10, 3)), offs, mode="max"),
            S(T((2, 4), dtype="int64", low=0, high=10), T((10, 3)), mode="mean"),
            S(idx, T((10, 3)), T((3,), dtype="int64", values=[0, 3, 8]), include_last_offset=True, mode="sum"),
            S(idx, T((10, 3)), offs, mode="sum", padding_idx=4),
            S(idx, T((10, 3)), offs, mode="sum", per_sample_weights=T((8,)))]


def one_hot_samples(d):
    return [S(T((3, 4), low=0, high=5)), S(T((3, 4), low=0, high=5), 7), S(T((0,)), 3), S(T(()), 5)]


def one_hot_errors():
    return [ErrorSample(S(T((3,), dtype="int64", values=[0, 5, 1]), 4), RuntimeError, "smaller than num_classes"),
            ErrorSample(S(T((3,), dtype="int64", values=[0, -1, 1]), 4), RuntimeError, "non-negative"),
            ErrorSample(S(T((3,), dtype="float32")), RuntimeError, "LongTensor")]


def _conv_direct(mod, x, w, b, transposed, output_padding=(0, 0)):
    return mod.convolution(x, w, b, (1, 2), (1, 0), (1, 1), transposed, output_padding, 1)


def unpool_call(mod, x, **kw):
    out, idx = mod.nn.functional.max_pool2d(x, 2, return_indices=True)
    return mod.nn.functional.max_unpool2d(out, idx, 2, **kw)


F = "nn.functional."
OPS = [
    OpInfo("conv1d", conv1d_samples, fn=F + "conv1d", dtypes=FLOATS_AND_LOWP, tol=LOWP_TOL),
    OpInfo("conv2d", conv2d_samples, fn=F + "conv2d",
           ops=("convolution", "_convolution_weight_grad", "constant_pad_nd"),
           dtypes=FLOATS_AND_LOWP, tol=LOWP_TOL, errors=conv_errors),
    OpInfo("conv3d", conv3d_samples, fn=F + "conv3d", dtypes=FLOATS_AND_LOWP, tol=LOWP_TOL),
    OpInfo("conv_transpose1d", conv_t1d_samples, fn=F + "conv_transpose1d", dtypes=FLOATS_AND_LOWP, tol=LOWP_TOL),
    OpInfo("conv_transpose2d", conv_t2d_samples, fn=F + "conv_transpose2d", dtypes=FLOATS_AND_LOWP, tol=LOWP_TOL,
           errors=conv_t_errors),
    OpInfo("convolution", lambda d: [S(T((2, 3, 5, 6)), T((4, 3, 3, 2)), T((4,)), False),
                                     S(T((2, 4, 5, 6)), T((4, 3, 3, 2)), T((3,)), True, (1, 1))],
           call=_conv_direct),
    OpInfo("max_pool1d", max_pool1d_samples, fn=F + "max_pool1d", ops=("max_pool1d_with_indices",),
           dtypes=FLOATS_AND_LOWP),
    OpInfo("max_pool2d", max_pool2d_samples, fn=F + "max_pool2d",
           ops=("max_pool2d_with_indices", "_max_pool_backward", "_plane_scatter_add", "_plane_gather"),
           dtypes=FLOATS_AND_LOWP + ("int64",), errors=pool_errors),
    OpInfo("max_pool3d", max_pool3d_samples, fn=F + "max_pool3d", ops=("max_pool3d_with_indices",),
           dtypes=FLOATS_AND_LOWP),
    OpInfo("avg_pool1d", avg_pool1d_samples, fn=F + "avg_pool1d", dtypes=FLOATS_AND_LOWP, tol=LOWP_TOL),
    OpInfo("avg_pool2d", avg_pool2d_samples, fn=F + "avg_pool2d", ops=("_taps_gather", "_taps_gather_backward"),
           dtypes=FLOATS_AND_LOWP, tol=LOWP_TOL, errors=pool_errors),
    OpInfo("avg_pool3d", avg_pool3d_samples, fn=F + "avg_pool3d", dtypes=FLOATS_AND_LOWP, tol=LOWP_TOL),
    OpInfo("adaptive_avg_pool1d", adaptive_samples(1), fn=F + "adaptive_avg_pool1d", dtypes=FLOATS_AND_LOWP, tol=LOWP_TOL),
    OpInfo("adaptive_avg_pool2d", adaptive_samples(2), fn=F + "adaptive_avg_pool2d", dtypes=FLOATS_AND_LOWP, tol=LOWP_TOL),
    OpInfo("adaptive_avg_pool3d", adaptive_samples(3), fn=F + "adaptive_avg_pool3d", dtypes=FLOATS_AND_LOWP, tol=LOWP_TOL),
    OpInfo("adaptive_max_pool1d", adaptive_max_samples(1), fn=F + "adaptive_max_pool1d", ops=("adaptive_max_pool1d",),
           dtypes=FLOATS_AND_LOWP),
    OpInfo("adaptive_max_pool2d", adaptive_max_samples(2), fn=F + "adaptive_max_pool2d", ops=("adaptive_max_pool2d",),
           dtypes=FLOATS_AND_LOWP),
    OpInfo("adaptive_max_pool3d", adaptive_max_samples(3), fn=F + "adaptive_max_pool3d", ops=("adaptive_max_pool3d",),
           dtypes=FLOATS_AND_LOWP),
    OpInfo("max_unpool2d", lambda d: [S(T((2, 3, 6, 4))), S(T((2, 3, 5, 5)), output_size=(5, 5))], call=unpool_call),
    OpInfo("interpolate", interp_samples, fn=F + "interpolate", dtypes=FLOATS_AND_LOWP, tol=LOWP_TOL,
           errors=interp_errors),
    OpInfo("interpolate_nearest_uint8", lambda d: [S(T((1, 2, 3, 4)), scale_factor=2), S(T((1, 2, 5)), size=7)],
           fn=F + "interpolate", dtypes=("uint8",), grad=False),
    OpInfo("pad", pad_samples, fn=F + "pad", dtypes=FLOATS_AND_LOWP + ("int64",), errors=pad_errors),
    OpInfo("constant_pad_nd", lambda d: [S(T((2, 3)), (1, -1, 2, 0), 2.0)], dtypes=FLOATS + INTS),
    OpInfo("pixel_shuffle", pixel_samples, fn=F + "pixel_shuffle", dtypes=FLOATS_AND_LOWP + ("int64",),
           errors=lambda: [ErrorSample(S(T((2, 3, 2, 2)), 2), RuntimeError, "divisible by the square")]),
    OpInfo("pixel_unshuffle", unshuffle_samples, fn=F + "pixel_unshuffle", dtypes=FLOATS_AND_LOWP + ("int64",),
           errors=lambda: [ErrorSample(S(T((2, 3, 5, 4)), 2), RuntimeError, "height to be divisible")]),
    OpInfo("unfold", unfold_samples, fn=F + "unfold", ops=("im2col",), dtypes=FLOATS_AND_LOWP, tol=LOWP_TOL),
    OpInfo("fold", fold_samples, fn=F + "fold", ops=("col2im",), dtypes=FLOATS_AND_LOWP, tol=LOWP_TOL,
           errors=fold_errors),
    OpInfo("embedding", lambda d: [S(T((10, 3)), T((4, 5), dtype="int64", low=0, high=10)),
                                   S(T((10, 3), noncontig=True), T((2, 3), dtype="int64", low=0, high=10)),
                                   S(T((10, 3)), T((6,), dtype="int64", values=[1, 1, 2, 3, 1, 0]), 1, True)],
           ops=("embedding", "embedding_dense_backward"), dtypes=FLOATS_AND_LOWP,
           errors=lambda: [ErrorSample(S(*reversed(e.sample.args)), e.exc, e.match) for e in emb_errors()]),
    OpInfo("embedding_fn", emb_samples, fn=F + "embedding", dtypes=FLOATS_AND_LOWP, errors=emb_errors),
    OpInfo("embedding_max_norm", lambda d: [S(T((6,), dtype="int64", values=[1, 1, 2, 3, 1, 0]), T((10, 3)))],
           call=_emb_max_norm, ops=("embedding_renorm", "embedding_renorm_"), grad=False),
    OpInfo("embedding_bag", emb_bag_samples, fn=F + "embedding_bag", dtypes=FLOATS, meta=False),
    OpInfo("one_hot", one_hot_samples, fn=F + "one_hot", ops=("one_hot",), dtypes=("int64",), grad=False,
           errors=one_hot_errors, skip={"meta": "num_classes=-1 is data-dependent"}),
]
