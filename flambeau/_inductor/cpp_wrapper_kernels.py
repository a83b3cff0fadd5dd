"""The C++ helpers of the C++ wrapper (cpp_wrapper.py): the extern steps it runs with code of its own.

`KERNELS` is C++ that every generated wrapper holds (after the kernels' prelude, codegen_cpp.HELPERS,
whose lowp.h conversions it uses):

- `fl_max_pool2d<T>`: max_pool2d_with_indices on contiguous planes, as PyTorch's CPU kernel;
- `fl_col2im<T>`: a transposed convolution's columns added into its output;
- `fl_taps_axis<T>`: one axis of `_taps_gather` (interpolate, average pooling, pads);
- `fl_conv3d<T>` / `fl_conv_transpose3d<T>` / `fl_max_pool3d<T>`: 3-D convolutions (grouped, transposed)
  and max pooling (direct loops);
- `fl_sort<T>`: `sort` and `topk` along a dim (stable, NaN as the largest value);
- `fl_cumsum<TI, TO, A>`: `cumsum` along a dim (PyTorch's CPU accumulation types);
- `fl_adaptive_max_pool<T>`: adaptive_max_pool{1,2,3}d (PyTorch's windows and indices);
- `fl_mask_float`: a bool or low-precision attention mask as the float additive mask the fused
  attention reads;
- `fl_dgemm` / `fl_conv2d_f64`: float64 products and convolutions with double sums (the signatures of
  flambeau's float32 `flm_sgemm` / `flm_conv2d`, so one emitter serves both dtypes; loops blocked
  for the cache, rows or images over OpenMP: correct and moderate, float64 models are rare in
  deployment);
- `fl_widen` / `fl_narrow`: a bfloat16/float16 operand widened to float (any strides, into a
  contiguous copy) and a float result rounded once into bfloat16/float16, so the float32 paths run
  low-precision convolutions, poolings, resamplings and float16 products with float sums, as
  PyTorch's CPU kernels accumulate them.

`GEMM` and `CONV2D` name the product and convolution function of each dtype.
"""
from __future__ import annotations

from .. import _dtype as D

GEMM = {D.float32: "fl_sgemm", D.float64: "fl_dgemm"}
CONV2D = {D.float32: "fl_conv2d", D.float64: "fl_conv2d_f64"}
LOWP_CODE = {D.bfloat16: 1, D.float16: 2}          # fl_widen / fl_narrow's dtype codes
DGEMM_BLOCK = 64                                   # fl_dgemm's k-block (a 64 x N panel of B stays in cache)

KERNELS = r"""
#include <numeric>
#include <vector>
// max_pool2d_with_indices on contiguous planes, as PyTorch's CPU kernel: each window's max (a NaN
// wins), the flat index (ih * W + iw) of the element taken, padding never taken; planes split over threads
template <typename T>
static void fl_max_pool2d(int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t kh, int64_t kw,
                          int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, const T* x,
                          T* y, int64_t* idx, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < planes; p++)
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t h0 = oh * sh - ph, w0 = ow * sw - pw;
                while (h0 < 0) h0 += dh;
                while (w0 < 0) w0 += dw;
                int64_t best = h0 * W + w0;
                T m = -std::numeric_limits<T>::infinity();
                for (int64_t ih = oh * sh - ph, i = 0; i < kh; i++, ih += dh)
                    for (int64_t iw = ow * sw - pw, j = 0; j < kw; j++, iw += dw) {
                        if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                        const T v = x[p * H * W + ih * W + iw];
                        if (v > m || v != v) { m = v; best = ih * W + iw; }
                    }
                y[(p * OH + oh) * OW + ow] = m;
                idx[(p * OH + oh) * OW + ow] = best;
            }
}

// a transposed convolution's output plane by plane: y[o] = bias[o] + every column entry (o, kh, kw, ih, iw)
// of cols (O*KH*KW x H*W) added at (ih*sh - ph + kh*dh, iw*sw - pw + kw*dw) where that lies in the output
template <typename T>
static void fl_col2im(int64_t O, int64_t H, int64_t W, int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t ph,
                      int64_t pw, int64_t dh, int64_t dw, int64_t OH, int64_t OW, const T* cols, const T* bias,
                      T* y, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t o = 0; o < O; o++) {
        T* yo = y + o * OH * OW;
        for (int64_t i = 0; i < OH * OW; i++) yo[i] = bias ? bias[o] : T(0);
        for (int64_t kh = 0; kh < KH; kh++)
            for (int64_t kw = 0; kw < KW; kw++) {
                const T* row = cols + ((o * KH + kh) * KW + kw) * H * W;
                for (int64_t ih = 0; ih < H; ih++) {
                    const int64_t oh = ih * sh - ph + kh * dh;
                    if (oh < 0 || oh >= OH) continue;
                    for (int64_t iw = 0; iw < W; iw++) {
                        const int64_t ow = iw * sw - pw + kw * dw;
                        if (ow >= 0 && ow < OW) yo[oh * OW + ow] += row[ih * W + iw];
                    }
                }
            }
    }
}

// one axis of _taps_gather (nn_resample.py) on a contiguous array seen as (outer, nin, inner):
// y[p, o, :] = sum over taps t of x[p, idx[o, t], :] * w[o, t] (w null: the pure gather x[p, idx[o, 0], :])
template <typename T>
static void fl_taps_axis(int64_t outer, int64_t nin, int64_t nout, int64_t inner, int64_t taps, const T* x,
                         const int64_t* idx, const T* w, T* y, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < outer; p++)
        for (int64_t o = 0; o < nout; o++) {
            T* yo = y + (p * nout + o) * inner;
            for (int64_t t = 0; t < (w ? taps : 1); t++) {
                const T* xs = x + (p * nin + idx[o * taps + t]) * inner;
                const T wt = w ? w[o * taps + t] : T(1);
                for (int64_t i = 0; i < inner; i++) yo[i] = t == 0 ? xs[i] * wt : yo[i] + xs[i] * wt;
            }
        }
}

// 3-D convolutions ((N, C, D, H, W) input, contiguous), sums in T, direct loops, (image, output channel)
// volumes over threads. g: N, C, D, H, W, O (output channels), KD, KH, KW, stride, padding, dilation (3
// each), OD, OH, OW, groups. fl_conv3d: weight (O, C/groups, KD, KH, KW), output channel o reads the input
// channels of its group. fl_conv_transpose3d: weight (C, O/groups, KD, KH, KW); each output gathers the
// inputs whose taps reach it (od = id * stride - padding + kd * dilation), so no two threads write one
// place. max_pool3d_with_indices as the 2-D one (a NaN wins, flat indices (id * H + ih) * W + iw, padding
// never taken)
template <typename T>
static void fl_conv3d(const int64_t* g, const T* x, const T* w, const T* bias, T* y, int threads) {
    const int64_t N = g[0], C = g[1], D = g[2], H = g[3], W = g[4], O = g[5], KD = g[6], KH = g[7], KW = g[8];
    const int64_t OD = g[18], OH = g[19], OW = g[20], cg = C / g[21], og = O / g[21];
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++) {
            T* yo = y + (n * O + o) * OD * OH * OW;
            for (int64_t i = 0; i < OD * OH * OW; i++) yo[i] = bias ? bias[o] : T(0);
            for (int64_t cl = 0; cl < cg; cl++)
                for (int64_t kd = 0; kd < KD; kd++)
                    for (int64_t kh = 0; kh < KH; kh++)
                        for (int64_t kw = 0; kw < KW; kw++) {
                            const T wv = w[(((o * cg + cl) * KD + kd) * KH + kh) * KW + kw];
                            const T* xc = x + (n * C + o / og * cg + cl) * D * H * W;
                            for (int64_t od = 0; od < OD; od++) {
                                const int64_t id = od * g[9] - g[12] + kd * g[15];
                                if (id < 0 || id >= D) continue;
                                for (int64_t oh = 0; oh < OH; oh++) {
                                    const int64_t ih = oh * g[10] - g[13] + kh * g[16];
                                    if (ih < 0 || ih >= H) continue;
                                    for (int64_t ow = 0; ow < OW; ow++) {
                                        const int64_t iw = ow * g[11] - g[14] + kw * g[17];
                                        if (iw >= 0 && iw < W) yo[(od * OH + oh) * OW + ow] += wv * xc[(id * H + ih) * W + iw];
                                    }
                                }
                            }
                        }
        }
}

// the input position a transposed convolution's output position o reads through tap k (-1: none)
static inline int64_t fl_tap_source(int64_t o, int64_t k, int64_t stride, int64_t pad, int64_t dil, int64_t n) {
    const int64_t t = o + pad - k * dil;
    if (t < 0 || t % stride) return -1;
    return t / stride < n ? t / stride : -1;
}

template <typename T>
static void fl_conv_transpose3d(const int64_t* g, const T* x, const T* w, const T* bias, T* y, int threads) {
    const int64_t N = g[0], C = g[1], D = g[2], H = g[3], W = g[4], O = g[5], KD = g[6], KH = g[7], KW = g[8];
    const int64_t OD = g[18], OH = g[19], OW = g[20], cg = C / g[21], og = O / g[21];
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++) {
            T* yo = y + (n * O + o) * OD * OH * OW;
            for (int64_t i = 0; i < OD * OH * OW; i++) yo[i] = bias ? bias[o] : T(0);
            for (int64_t cl = 0; cl < cg; cl++) {
                const int64_t c = o / og * cg + cl;
                const T* xc = x + (n * C + c) * D * H * W;
                for (int64_t kd = 0; kd < KD; kd++)
                    for (int64_t kh = 0; kh < KH; kh++)
                        for (int64_t kw = 0; kw < KW; kw++) {
                            const T wv = w[(((c * og + o % og) * KD + kd) * KH + kh) * KW + kw];
                            for (int64_t od = 0; od < OD; od++) {
                                const int64_t id = fl_tap_source(od, kd, g[9], g[12], g[15], D);
                                if (id < 0) continue;
                                for (int64_t oh = 0; oh < OH; oh++) {
                                    const int64_t ih = fl_tap_source(oh, kh, g[10], g[13], g[16], H);
                                    if (ih < 0) continue;
                                    for (int64_t ow = 0; ow < OW; ow++) {
                                        const int64_t iw = fl_tap_source(ow, kw, g[11], g[14], g[17], W);
                                        if (iw >= 0) yo[(od * OH + oh) * OW + ow] += wv * xc[(id * H + ih) * W + iw];
                                    }
                                }
                            }
                        }
            }
        }
}

// g: planes, D, H, W, OD, OH, OW, then kernel, stride, padding, dilation (3 each)
template <typename T>
static void fl_max_pool3d(const int64_t* g, const T* x, T* y, int64_t* idx, int threads) {
    const int64_t P = g[0], D = g[1], H = g[2], W = g[3], OD = g[4], OH = g[5], OW = g[6];
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < P; p++)
        for (int64_t od = 0; od < OD; od++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    int64_t d0 = od * g[10] - g[13], h0 = oh * g[11] - g[14], w0 = ow * g[12] - g[15];
                    while (d0 < 0) d0 += g[16];
                    while (h0 < 0) h0 += g[17];
                    while (w0 < 0) w0 += g[18];
                    int64_t best = (d0 * H + h0) * W + w0;
                    T m = -std::numeric_limits<T>::infinity();
                    for (int64_t a = 0, id = od * g[10] - g[13]; a < g[7]; a++, id += g[16])
                        for (int64_t b = 0, ih = oh * g[11] - g[14]; b < g[8]; b++, ih += g[17])
                            for (int64_t c = 0, iw = ow * g[12] - g[15]; c < g[9]; c++, iw += g[18]) {
                                if (id < 0 || id >= D || ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                const T v = x[p * D * H * W + (id * H + ih) * W + iw];
                                if (v > m || v != v) { m = v; best = (id * H + ih) * W + iw; }
                            }
                    const int64_t at = ((p * OD + od) * OH + oh) * OW + ow;
                    y[at] = m;
                    idx[at] = best;
                }
}

// float64 C[t] = A[t] @ B[t] (flm_sgemm's arguments: element strides per batch item, row and column;
// ldc C's row stride; beta 1 adds to C): double sums, k blocked, rows over threads
static void fl_dgemm(int64_t batch, int64_t M, int64_t N, int64_t K, const double* a, int64_t sba, int64_t rsa,
                     int64_t csa, const double* b, int64_t sbb, int64_t rsb, int64_t csb, double* c, int64_t sbc,
                     int64_t ldc, int beta, int threads) {
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
    for (int64_t t = 0; t < batch; t++)
        for (int64_t i = 0; i < M; i++) {
            double* ci = c + t * sbc + i * ldc;
            if (!beta) for (int64_t j = 0; j < N; j++) ci[j] = 0.0;
            for (int64_t k0 = 0; k0 < K; k0 += DGEMM_BLOCK)
                for (int64_t k = k0; k < std::min<int64_t>(K, k0 + DGEMM_BLOCK); k++) {
                    const double aik = a[t * sba + i * rsa + k * csa];
                    const double* bk = b + t * sbb + k * rsb;
                    for (int64_t j = 0; j < N; j++) ci[j] += aik * bk[j * csb];
                }
        }
}

// float64 2-D convolution of groups 1 (flm_conv2d's arguments): y[n, o] = bias[o] + sum over (c, kh, kw)
// of w[o, c, kh, kw] * x[n, c, ih, iw], double sums; (image, output channel) planes over threads
static void fl_conv2d_f64(int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW, int64_t sh,
                          int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t OH, int64_t OW,
                          const double* x, const double* w, const double* bias, double* y, int threads) {
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++) {
            double* yo = y + (n * O + o) * OH * OW;
            for (int64_t i = 0; i < OH * OW; i++) yo[i] = bias ? bias[o] : 0.0;
            for (int64_t c = 0; c < C; c++)
                for (int64_t kh = 0; kh < KH; kh++)
                    for (int64_t kw = 0; kw < KW; kw++) {
                        const double wv = w[((o * C + c) * KH + kh) * KW + kw];
                        const double* xc = x + (n * C + c) * H * W;
                        for (int64_t oh = 0; oh < OH; oh++) {
                            const int64_t ih = oh * sh - ph + kh * dh;
                            if (ih < 0 || ih >= H) continue;
                            for (int64_t ow = 0; ow < OW; ow++) {
                                const int64_t iw = ow * sw - pw + kw * dw;
                                if (iw >= 0 && iw < W) yo[oh * OW + ow] += wv * xc[ih * W + iw];
                            }
                        }
                    }
        }
}

// adaptive_max_pool{1,2,3}d on contiguous planes seen as 3-D ones (missing leading dims of size 1). g: planes,
// D, H, W, OD, OH, OW. Output (od, oh, ow) is the max of the input window [od * D / OD, ceil((od + 1) * D / OD))
// x ... (PyTorch's windows), a NaN wins, its flat index in the plane ((d * H + h) * W + w); planes over threads
template <typename T>
static void fl_adaptive_max_pool(const int64_t* g, const T* x, T* y, int64_t* idx, int threads) {
    const int64_t P = g[0], D = g[1], H = g[2], W = g[3], OD = g[4], OH = g[5], OW = g[6];
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < P; p++)
        for (int64_t od = 0; od < OD; od++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    const int64_t d0 = od * D / OD, d1 = ((od + 1) * D + OD - 1) / OD;
                    const int64_t h0 = oh * H / OH, h1 = ((oh + 1) * H + OH - 1) / OH;
                    const int64_t w0 = ow * W / OW, w1 = ((ow + 1) * W + OW - 1) / OW;
                    int64_t best = (d0 * H + h0) * W + w0;
                    T m = -std::numeric_limits<T>::infinity();
                    for (int64_t d = d0; d < d1; d++)
                        for (int64_t h = h0; h < h1; h++)
                            for (int64_t w = w0; w < w1; w++) {
                                const T v = x[p * D * H * W + (d * H + h) * W + w];
                                if (v > m || v != v) { m = v; best = (d * H + h) * W + w; }
                            }
                    const int64_t at = ((p * OD + od) * OH + oh) * OW + ow;
                    y[at] = m;
                    idx[at] = best;
                }
}

// cumsum along one dim of a contiguous array seen as (outer, n, inner): a running sum in A from +0 (double
// for a floating result, int64_t for an integer one: PyTorch's CPU accumulation types), each prefix stored
// as TO; lines over threads
template <typename TI, typename TO, typename A>
static void fl_cumsum(int64_t outer, int64_t n, int64_t inner, const TI* x, TO* y, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < outer * inner; p++) {
        const int64_t o = p / inner, i = p % inner;
        A acc = A(0);
        for (int64_t j = 0; j < n; j++) {
            const int64_t at = (o * n + j) * inner + i;
            acc += A(x[at]);
            y[at] = TO(acc);
        }
    }
}

// sort / topk along one dim of a contiguous array seen as (outer, n, inner): for each line the first k of
// its elements in stable order (ascending: NaN last; descending: NaN first; ties in their original order,
// as flambeau's eager sort and PyTorch's stable sort), values into y and positions into idx ((outer, k, inner))
template <typename T>
static void fl_sort(int64_t outer, int64_t n, int64_t inner, int64_t k, const T* x, T* y, int64_t* idx,
                    int descending, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < outer * inner; p++) {
        const int64_t o = p / inner, i = p % inner;
        const T* xs = x + o * n * inner + i;
        std::vector<int64_t> order(n);
        std::iota(order.begin(), order.end(), int64_t(0));
        if (descending)
            std::stable_sort(order.begin(), order.end(), [xs, inner](int64_t a, int64_t b) {
                const T u = xs[a * inner], v = xs[b * inner];
                return (u != u && v == v) || u > v; });
        else
            std::stable_sort(order.begin(), order.end(), [xs, inner](int64_t a, int64_t b) {
                const T u = xs[a * inner], v = xs[b * inner];
                return (u == u && v != v) || u < v; });
        for (int64_t j = 0; j < k; j++) {
            y[(o * k + j) * inner + i] = xs[order[j] * inner];
            idx[(o * k + j) * inner + i] = order[j];
        }
    }
}

// dst (contiguous float) = the bfloat16 (code 1) or float16 (code 2) strided view (shape, element strides) at src
static void fl_widen(float* dst, const uint16_t* src, int ndim, const int64_t* shape, const int64_t* st, int code) {
    if (ndim == 0) { *dst = code == 1 ? fl_bf16_to_f32(*src) : fl_f16_to_f32(*src); return; }
    int64_t inner = 1;
    for (int d = 1; d < ndim; d++) inner *= shape[d];
    for (int64_t i = 0; i < shape[0]; i++) fl_widen(dst + i * inner, src + i * st[0], ndim - 1, shape + 1, st + 1, code);
}

// dst (contiguous float) = an attention mask as the fused kernel reads it: a bool mask (code 0) as 0 where
// true and -inf where false, a bfloat16 (1) or float16 (2) additive one widened; src a strided view
static void fl_mask_float(float* dst, const char* src, int ndim, const int64_t* shape, const int64_t* st, int code) {
    const int64_t item = code == 0 ? 1 : 2;
    if (ndim == 0) {
        uint16_t h = 0;
        std::memcpy(&h, src, item);
        *dst = code == 0 ? (h ? 0.0f : -std::numeric_limits<float>::infinity())
                         : code == 1 ? fl_bf16_to_f32(h) : fl_f16_to_f32(h);
        return;
    }
    int64_t inner = 1;
    for (int d = 1; d < ndim; d++) inner *= shape[d];
    for (int64_t i = 0; i < shape[0]; i++)
        fl_mask_float(dst + i * inner, src + i * st[0] * item, ndim - 1, shape + 1, st + 1, code);
}

// dst[i] = src[i] rounded to bfloat16 (code 1) or float16 (code 2), i < n
static void fl_narrow(uint16_t* dst, const float* src, int64_t n, int code) {
    for (int64_t i = 0; i < n; i++) dst[i] = code == 1 ? fl_f32_to_bf16(src[i]) : fl_f32_to_f16(src[i]);
}
""".replace("DGEMM_BLOCK", str(DGEMM_BLOCK))
