// flambeau's int8 matrix product for the CPU: the quantized linear layer of PT2E-converted and
// dynamically quantized models, out = epilogue(sum_k (a[m,k] - a_zp) * (b[k,n] - b_zp[n])).
//
// A holds u8 or s8 activations (s8 are shifted by 128 into u8, with the zero point shifted alike:
// (a + 128) - (zp + 128) = a - zp exactly), packed per call, MB rows at a time, into rows of K
// rounded up to 4 bytes (kp). B, the int8 weights, comes prepacked once (`onednn::qlinear_prepack`, `pack_weight` in
// cpu_int8.py): panels of NR columns (the last one narrower: its width w), each holding, for each
// group of 4 k, the 4 bytes of each of its columns side by side (4 * w bytes a group, k zero-padded
// to kp); panel p starts at byte p * NR * kp, and the N int32 column sums follow the kp * N bytes of
// panels. The micro-kernel keeps an MR x NR tile of int32 sums in registers and, per group of 4 k,
// broadcasts 4 bytes of an A row against two B vectors (masked loads for a narrow panel) with
// AVX-512 VNNI `vpdpbusd` (u8 x s8 products, 4 summed into each int32 lane, no saturation). Zero
// points are taken out afterwards with the column sums of B and the row sums of A. Without VNNI
// (or AVX-512BW) `flm_int8_vnni` returns 0 and Python computes the same integers with NumPy.
//
// The epilogue is oneDNN's for PyTorch's `onednn::qlinear_pointwise` on x86: v = ((float)acc *
// x_scale) * w_scale[n] + bias[n] (two roundings, no fused multiply-add: this file is compiled
// without -ffp-contract=fast), then ReLU, then either v stored as float, or requantized as
// clamp(nearbyint(v * (1 / out_scale)) + out_zp) into u8/s8; AVX-512, 16 columns at a time. With an
// accum (the sum post-op of `qconv2d_pointwise.binary`), v + (accum - accum_zp) * accum_scale before
// the ReLU.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define FLM_VNNI 1
#endif

#pragma GCC optimize("fp-contract=off")

enum { MR = 12, NR = 32, MB = 16 * MR };   // MB: rows of A packed at a time
enum { OUT_FLOAT32 = 0, OUT_UINT8 = 1, OUT_INT8 = 2 };
enum { ACCUM_NONE = 0, ACCUM_FLOAT32 = 1, ACCUM_UINT8 = 2, ACCUM_INT8 = 3 };   // the sum post-op's operand

// A convolution's A read in place (an implicit im2col): row m is output pixel (n, oh, ow) of an
// N x H x W x C channels-last u8/s8 input, its K = kh kw cg bytes the taps (i, j) in order, each the
// cg channels c0.. of input pixel (oh sh - ph + i dh, ow sw - pw + j dw), or cg copies of the zero
// point where that pixel lies in the padding (oneDNN pads with the zero point).
struct ConvGeom {
    int64_t H, W, C, c0, cg, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW;
    int32_t zp;
};

extern "C" int flm_int8_vnni() {
#ifdef FLM_VNNI
    return 1;
#else
    return 0;
#endif
}

#ifdef FLM_VNNI
// The mask of the first `bytes` bytes of a 64-byte vector (all of it from 64 on).
static inline __mmask64 first_bytes(int64_t bytes) {
    return bytes >= 64 ? ~__mmask64(0) : bytes <= 0 ? __mmask64(0) : (__mmask64(1) << bytes) - 1;
}

// A (M x K, row stride lda, contiguous along k) into rows of kp bytes as u8, with each row's sum; the
// rows up to a multiple of MR are zeros (the micro-kernel always computes MR rows). 64 bytes a step:
// masked load (k from K to kp reads as 0), the sign flip, store, and the byte sum by vpsadbw.
static void pack_a(int64_t M, int64_t K, const uint8_t* a, int64_t lda, int is_signed, uint8_t* dst, int32_t* rowsum) {
    const int64_t kp = (K + 3) & ~int64_t(3), rows = (M + MR - 1) / MR * MR;
    const __m512i flip = _mm512_set1_epi8(is_signed ? char(0x80) : 0), zero = _mm512_setzero_si512();
    for (int64_t m = 0; m < rows; m++) {
        uint8_t* d = dst + m * kp;
        if (m >= M) { std::memset(d, 0, kp); continue; }
        const uint8_t* s = a + m * lda;
        __m512i sums = zero;
        for (int64_t k = 0; k < kp; k += 64) {
            const __mmask64 in = first_bytes(K - k), out = first_bytes(kp - k);
            const __m512i v = _mm512_xor_si512(_mm512_maskz_loadu_epi8(in, s + k), flip);
            const __m512i kept = _mm512_maskz_mov_epi8(in, v);
            _mm512_mask_storeu_epi8(d + k, out, kept);
            sums = _mm512_add_epi64(sums, _mm512_sad_epu8(kept, zero));
        }
        rowsum[m] = int32_t(_mm512_reduce_add_epi64(sums));
    }
}

// Rows [m0, m0 + M) of a convolution's A (ConvGeom) into rows of kp bytes as u8, with each row's sum, as
// pack_a: the taps gathered into the row, then the flip and the byte sums over the whole row. Stores are
// whole vectors (masked stores are slow on some x86 CPUs): a tap's spill is overwritten by the next
// tap or row, the last row's lands in the 64 bytes of slack after dst's rows.
static void pack_a_conv(const ConvGeom& g, const uint8_t* x, int64_t m0, int64_t M, int64_t K, int is_signed,
                        uint8_t* dst, int32_t* rowsum) {
    const int64_t kp = (K + 3) & ~int64_t(3), rows = (M + MR - 1) / MR * MR;
    const __m512i flip = _mm512_set1_epi8(is_signed ? char(0x80) : 0), zero = _mm512_setzero_si512();
    const __m512i pad = _mm512_set1_epi8(char(g.zp));
    for (int64_t m = 0; m < rows; m++) {
        uint8_t* d = dst + m * kp;
        if (m >= M) { std::memset(d, 0, kp); continue; }
        const int64_t r = m0 + m, n = r / (g.OH * g.OW), oh = r / g.OW % g.OH, ow = r % g.OW;
        uint8_t* t = d;
        const int64_t iw0 = ow * g.sw - g.pw, span = g.kw * g.cg;
        const bool row_inside = g.dw == 1 && g.cg == g.C && iw0 >= 0 && iw0 + g.kw <= g.W;
        for (int64_t i = 0; i < g.kh; i++) {
            const int64_t ih = oh * g.sh - g.ph + i * g.dh;
            if (row_inside && ih >= 0 && ih < g.H) {      // the kw taps are kw cg contiguous input bytes
                const uint8_t* s = x + ((n * g.H + ih) * g.W + iw0) * g.C;
                for (int64_t c = 0; c < span; c += 64)
                    _mm512_storeu_si512(t + c, _mm512_maskz_loadu_epi8(first_bytes(span - c), s + c));
                t += span;
                continue;
            }
            for (int64_t j = 0; j < g.kw; j++, t += g.cg) {
                const int64_t iw = ow * g.sw - g.pw + j * g.dw;
                const bool inside = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W;
                const uint8_t* s = x + ((n * g.H + ih) * g.W + iw) * g.C + g.c0;
                for (int64_t c = 0; c < g.cg; c += 64)      // whole-vector stores: the next tap overwrites the spill
                    _mm512_storeu_si512(t + c, inside ? _mm512_maskz_loadu_epi8(first_bytes(g.cg - c), s + c) : pad);
            }
        }
        __m512i sums = zero;
        for (int64_t k = 0; k < kp; k += 64) {
            const __mmask64 in = first_bytes(K - k), out = first_bytes(kp - k);
            const __m512i kept = _mm512_maskz_mov_epi8(in, _mm512_xor_si512(_mm512_maskz_loadu_epi8(in, d + k), flip));
            if (k + 64 <= kp) _mm512_storeu_si512(d + k, kept);
            else _mm512_mask_storeu_epi8(d + k, out, kept);
            sums = _mm512_add_epi64(sums, _mm512_sad_epu8(kept, zero));
        }
        rowsum[m] = int32_t(_mm512_reduce_add_epi64(sums));
    }
}

// The int32 tile of MR packed rows and a panel of w <= NR columns: tile[i][j] = sum over kp of
// a'[i, k] * b[k, j] (columns from w on: 0).
static inline void micro(int64_t kp, const uint8_t* __restrict__ ap, const int8_t* __restrict__ bp, int64_t w,
                         int32_t tile[MR][NR]) {
    const __mmask64 mask0 = first_bytes(4 * w), mask1 = first_bytes(4 * w - 64);
    __m512i acc[MR][2];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) { acc[i][0] = _mm512_setzero_si512(); acc[i][1] = _mm512_setzero_si512(); }
    for (int64_t g = 0; g < kp / 4; g++) {
        const __m512i b0 = _mm512_maskz_loadu_epi8(mask0, bp + g * 4 * w);
        const __m512i b1 = _mm512_maskz_loadu_epi8(mask1, bp + g * 4 * w + 64);
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) {
            int32_t w;
            std::memcpy(&w, ap + i * kp + 4 * g, 4);
            const __m512i av = _mm512_set1_epi32(w);
            acc[i][0] = _mm512_dpbusd_epi32(acc[i][0], av, b0);
            acc[i][1] = _mm512_dpbusd_epi32(acc[i][1], av, b1);
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        _mm512_store_si512(&tile[i][0], acc[i][0]);
        _mm512_store_si512(&tile[i][16], acc[i][1]);
    }
}
#endif

struct Epilogue {
    int32_t a_zp;                 // the activations' zero point (shifted by 128 for s8)
    const int32_t* b_zp;          // the weights' zero points per column, or null (all 0)
    int64_t K;
    float x_scale;
    const float* w_scale;         // per column
    const float* bias;            // per column, or null
    int relu;
    int out_kind;                 // OUT_*
    float out_inv_scale;
    float out_zp;
    void* out;
    int64_t ldc;
    const void* accum;            // the sum post-op's operand (M x N, row stride ld_accum), or null
    int accum_kind;               // ACCUM_*
    float accum_scale, accum_zp;
    int64_t ld_accum;
};

#ifdef FLM_VNNI
// The tile's rows m0.. and columns n0.. of the output; rs/cs: the tile's row and column sums. 16
// columns a step (masked at the panel's edge), each lane the scalar recipe of the header: the same
// float32 operations in the same order (no FMA), nearbyint as round-to-nearest-even, the clamp in
// float, then an exact conversion to u8/s8.
static inline void finish(const Epilogue& e, int64_t m0, int64_t m, int64_t n0, int64_t n, int32_t tile[MR][NR],
                          const int32_t* rs, const int32_t* cs) {
    const __m512 lo = _mm512_set1_ps(e.out_kind == OUT_INT8 ? -128.f : 0.f);
    const __m512 hi = _mm512_set1_ps(e.out_kind == OUT_INT8 ? 127.f : 255.f);
    const __m512 x_scale = _mm512_set1_ps(e.x_scale), inv = _mm512_set1_ps(e.out_inv_scale);
    const __m512 out_zp = _mm512_set1_ps(e.out_zp), fzero = _mm512_setzero_ps();
    const __m512i a_zp = _mm512_set1_epi32(e.a_zp), K = _mm512_set1_epi32(int32_t(e.K));
    const __m512 accum_scale = _mm512_set1_ps(e.accum_scale), accum_zp = _mm512_set1_ps(e.accum_zp);
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        const __mmask16 lanes = n - j0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - j0)) - 1);
        const int64_t c = n0 + j0;
        const __m512i colsum = _mm512_maskz_loadu_epi32(lanes, cs + j0);
        const __m512i bz = e.b_zp ? _mm512_maskz_loadu_epi32(lanes, e.b_zp + c) : _mm512_setzero_si512();
        const __m512 w_scale = _mm512_maskz_loadu_ps(lanes, e.w_scale + c);
        const __m512 bias = e.bias ? _mm512_maskz_loadu_ps(lanes, e.bias + c) : fzero;
        // acc - a_zp * colsum + K * a_zp * bz, then - bz * rowsum per row (int32, wrapping as the scalar)
        const __m512i fixed = _mm512_sub_epi32(_mm512_mullo_epi32(_mm512_mullo_epi32(K, a_zp), bz),
                                               _mm512_mullo_epi32(a_zp, colsum));
        for (int64_t i = 0; i < m; i++) {
            const __m512i row = _mm512_sub_epi32(_mm512_loadu_si512(&tile[i][j0]),
                                                 _mm512_mullo_epi32(bz, _mm512_set1_epi32(rs[i])));
            __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(row, fixed)), x_scale),
                                     w_scale);
            if (e.bias) v = _mm512_add_ps(v, bias);
            if (e.accum_kind != ACCUM_NONE) {       // + (accum - accum_zp) * accum_scale, as oneDNN's sum
                const int64_t ai = (m0 + i) * e.ld_accum + c;
                const __m512 a = e.accum_kind == ACCUM_FLOAT32 ? _mm512_maskz_loadu_ps(lanes, (const float*)e.accum + ai)
                    : _mm512_cvtepi32_ps(e.accum_kind == ACCUM_UINT8
                        ? _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(lanes, (const uint8_t*)e.accum + ai))
                        : _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(lanes, (const int8_t*)e.accum + ai)));
                v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_sub_ps(a, accum_zp), accum_scale));
            }
            if (e.relu) v = _mm512_mask_mov_ps(fzero, _mm512_cmp_ps_mask(v, fzero, _CMP_GT_OQ), v);
            const int64_t at = (m0 + i) * e.ldc + c;
            if (e.out_kind == OUT_FLOAT32) {
                _mm512_mask_storeu_ps((float*)e.out + at, lanes, v);
                continue;
            }
            const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m512i q = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_add_ps(r, out_zp), lo), hi));
            if (e.out_kind == OUT_UINT8) _mm_mask_storeu_epi8((uint8_t*)e.out + at, lanes, _mm512_cvtusepi32_epi8(q));
            else _mm_mask_storeu_epi8((int8_t*)e.out + at, lanes, _mm512_cvtsepi32_epi8(q));
        }
    }
}
#endif

#ifdef FLM_VNNI
// Rows [m0, m1) x columns [n0, n1) (n0 a multiple of NR) of the output on the calling thread, packing
// its rows of A (rows of stride lda, or a convolution's taps when geom is given) a block of MB rows at
// a time (the block stays in L2 while every column panel passes over it; one small buffer, so a large
// A costs no fresh pages); bp/colsum: the prepacked weight's panels and column sums (all N columns).
static void qlinear_part(int64_t K, int64_t N, const uint8_t* a, int64_t lda, int a_signed, const int8_t* bp,
                         const int32_t* colsum, const Epilogue& e, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
                         const ConvGeom* geom) {
    const int64_t kp = (K + 3) & ~int64_t(3);
    const int64_t block = std::min<int64_t>(MB, (m1 - m0 + MR - 1) / MR * MR);
    std::vector<uint8_t> pa(block * kp + 64);        // + the slack pack_a_conv's whole-vector stores use
    std::vector<int32_t> rowsum(block);
    alignas(64) int32_t tile[MR][NR];
    for (int64_t mb = m0; mb < m1; mb += MB) {
        const int64_t M = std::min<int64_t>(MB, m1 - mb), rows = (M + MR - 1) / MR * MR;
        if (geom) pack_a_conv(*geom, a, mb, M, K, a_signed, pa.data(), rowsum.data());
        else pack_a(M, K, a + mb * lda, lda, a_signed, pa.data(), rowsum.data());
        for (int64_t c = n0; c < n1; c += NR) {
            const int64_t w = std::min<int64_t>(NR, N - c);
            for (int64_t r = 0; r < rows; r += MR) {
                micro(kp, pa.data() + r * kp, bp + c * kp, w, tile);
                finish(e, mb + r, std::min<int64_t>(MR, M - r), c, std::min<int64_t>(w, n1 - c), tile,
                       rowsum.data() + r, colsum + c);
            }
        }
    }
}
#endif

// out (M x N, row stride ldc) = epilogue(A @ B) as in the header, B prepacked. One OpenMP fork/join:
// each thread takes a share of the column panels (or of the row tiles, when there are more of those)
// and packs the rows of A it reads itself, so no barrier waits on a descheduled thread of a loaded
// machine.
static void qlinear_run(int64_t M, int64_t N, int64_t K, const uint8_t* a, int64_t lda, int a_signed,
                        int32_t a_zp, const int8_t* packed, const int32_t* b_zp,
                        float x_scale, const float* w_scale, const float* bias, int relu, int out_kind,
                        float out_inv_scale, int32_t out_zp, void* out, int64_t ldc, int threads,
                        const void* accum, int accum_kind, float accum_scale, int32_t accum_zp,
                        int64_t ld_accum, const ConvGeom* geom) {
#ifdef FLM_VNNI
    if (M == 0 || N == 0) return;
    const Epilogue e{a_signed ? a_zp + 128 : a_zp, b_zp, K, x_scale, w_scale, bias, relu, out_kind, out_inv_scale,
                     float(out_zp), out, ldc, accum, accum_kind, accum_scale, float(accum_zp), ld_accum};
    const int64_t kp = (K + 3) & ~int64_t(3), tiles = (M + MR - 1) / MR, panels = (N + NR - 1) / NR;
    const int32_t* colsum = reinterpret_cast<const int32_t*>(packed + kp * N);
    if (threads <= 1) {
        qlinear_part(K, N, a, lda, a_signed, packed, colsum, e, 0, M, 0, N, geom);
        return;
    }
    const bool by_cols = panels >= tiles || panels >= 4 * threads;
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
#else
        const int64_t nt = 1, t = 0;
#endif
        if (by_cols) {
            const int64_t n0 = panels * t / nt * NR, n1 = std::min<int64_t>(N, panels * (t + 1) / nt * NR);
            if (n1 > n0) qlinear_part(K, N, a, lda, a_signed, packed, colsum, e, 0, M, n0, n1, geom);
        } else {
            const int64_t m0 = tiles * t / nt * MR, m1 = std::min<int64_t>(M, tiles * (t + 1) / nt * MR);
            if (m1 > m0) qlinear_part(K, N, a, lda, a_signed, packed, colsum, e, m0, m1, 0, N, geom);
        }
    }
#endif
}

extern "C" void flm_qlinear(int64_t M, int64_t N, int64_t K, const uint8_t* a, int64_t lda, int a_signed,
                            int32_t a_zp, const int8_t* packed, const int32_t* b_zp,
                            float x_scale, const float* w_scale, const float* bias, int relu, int out_kind,
                            float out_inv_scale, int32_t out_zp, void* out, int64_t ldc, int threads,
                            const void* accum, int accum_kind, float accum_scale, int32_t accum_zp,
                            int64_t ld_accum) {
    qlinear_run(M, N, K, a, lda, a_signed, a_zp, packed, b_zp, x_scale, w_scale, bias, relu, out_kind, out_inv_scale,
                out_zp, out, ldc, threads, accum, accum_kind, accum_scale, accum_zp, ld_accum, nullptr);
}

// One group of a 2-D convolution: the product above with A the implicit im2col of x (N x H x W x C
// channels-last; `geom` as ConvGeom's fields in order: H, W, C, c0, cg, kh, kw, sh, sw, ph, pw, dh, dw,
// OH, OW), M = N OH OW rows, K = kh kw cg, the activation zero point also the padding's value.
extern "C" void flm_qconv(int64_t M, int64_t N, int64_t K, const uint8_t* x, const int64_t* geom, int a_signed,
                          int32_t a_zp, const int8_t* packed, const int32_t* b_zp,
                          float x_scale, const float* w_scale, const float* bias, int relu, int out_kind,
                          float out_inv_scale, int32_t out_zp, void* out, int64_t ldc, int threads,
                          const void* accum, int accum_kind, float accum_scale, int32_t accum_zp,
                          int64_t ld_accum) {
    const ConvGeom g{geom[0], geom[1], geom[2], geom[3], geom[4], geom[5], geom[6], geom[7], geom[8], geom[9],
                     geom[10], geom[11], geom[12], geom[13], geom[14], a_zp};
    qlinear_run(M, N, K, x, 0, a_signed, a_zp, packed, b_zp, x_scale, w_scale, bias, relu, out_kind, out_inv_scale,
                out_zp, out, ldc, threads, accum, accum_kind, accum_scale, accum_zp, ld_accum, &g);
}
