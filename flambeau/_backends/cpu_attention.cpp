// flambeau's fused scaled-dot-product attention for the CPU: flash attention, forward and backward.
//
// Forward, per (batch, head) and block of BQ query rows: scores S = (Q*scale) K^T of one block of BK
// keys at a time, plus the mask, with an online softmax (running row max m and sum l; the output
// accumulator is rescaled by exp(m_old - m_new) when the max grows), so the L x S score matrix is
// never held: memory is O(L + S) per head. Key blocks wholly above the diagonal are skipped when
// causal. The output is acc / l; the log-sum-exp m + log(l) is saved for the backward.
//
// Backward, per (batch, key/value head): for each query block and key block it recomputes
// P = exp(S - lse) and accumulates dV += P^T dO, dS = P * (dO V^T - rowsum(dO * O)), dQ += dS K,
// dK += dS^T Q (scale folded in). One thread owns a key/value head with all the query heads that
// share it (grouped-query attention), so no two threads write the same gradient.
//
// Inputs are float32, bfloat16 or float16 with any element strides; they are converted to float
// when packed (K^T and V once per head, Q per block) and every product accumulates in float. The
// small products run on a register-blocked kernel (RB rows x up to 4 vectors of 16 floats, GCC
// vector extensions) over packed operands zero-padded to multiples of 16 columns. OpenMP runs
// (head, query block) items in the forward and heads in the backward.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef FLM_SIMD_MATH
extern "C" float expf(float) noexcept __attribute__((simd("notinbranch")));
#endif

typedef float v16 __attribute__((vector_size(64), aligned(4)));

enum { BQ = 64, BK = 64, RB = 6, VW = 16 };
enum { F32 = 0, BF16 = 1, F16 = 2 };
// exp of a score this far below its row's max is below float's normal range: clamped there (glibc's
// vector expf takes a slow path for such lanes), the result is ~1e-38 next to a row sum >= 1
static const float MIN_EXP_ARG = -87.0f;
static const float NEG_INF = -std::numeric_limits<float>::infinity();

static inline int64_t pad16(int64_t n) { return (n + VW - 1) / VW * VW; }

#include "lowp.h"     // bfloat16 / float16 <-> float (round to nearest even, as c10::BFloat16 / c10::Half)

template <int DT> struct Elem;
template <> struct Elem<F32> {
    typedef float T;
    static float load(T x) { return x; }
    static T store(float x) { return x; }
};
template <> struct Elem<BF16> {
    typedef uint16_t T;
    static float load(T x) { return fl_bf16_to_f32(x); }
    static T store(float x) { return fl_f32_to_bf16(x); }
};
template <> struct Elem<F16> {
    typedef uint16_t T;
    static float load(T x) { return fl_f16_to_f32(x); }
    static T store(float x) { return fl_f32_to_f16(x); }
};

// A 4-d operand: element (b, h, i, j) at p[b*s0 + h*s1 + i*s2 + j*s3].
struct View {
    const void* p;
    int64_t s0, s1, s2, s3;
};

// ---- the small products ------------------------------------------------------------------------
// C[R x 16*NV] (row stride ldc) (+)= A[R x K] @ B[K x 16*NV]; A(i, k) = a[i*rsa + k*csa], B row-major
// with row stride ldb.
template <int R, int NV>
static inline void tile(int64_t K, const float* a, int64_t rsa, int64_t csa, const float* b, int64_t ldb,
                        float* c, int64_t ldc, bool accumulate) {
    v16 acc[R][NV];
    for (int r = 0; r < R; r++)
        for (int n = 0; n < NV; n++) acc[r][n] = accumulate ? *(const v16*)(c + r * ldc + n * VW) : v16{};
    for (int64_t k = 0; k < K; k++) {
        v16 bv[NV];
        for (int n = 0; n < NV; n++) bv[n] = *(const v16*)(b + k * ldb + n * VW);
        for (int r = 0; r < R; r++) {
            const float av = a[r * rsa + k * csa];
            for (int n = 0; n < NV; n++) acc[r][n] += av * bv[n];
        }
    }
    for (int r = 0; r < R; r++)
        for (int n = 0; n < NV; n++) *(v16*)(c + r * ldc + n * VW) = acc[r][n];
}

template <int R>
static inline void tile_nv(int nv, int64_t K, const float* a, int64_t rsa, int64_t csa, const float* b,
                           int64_t ldb, float* c, int64_t ldc, bool accumulate) {
    switch (nv) {
        case 1: tile<R, 1>(K, a, rsa, csa, b, ldb, c, ldc, accumulate); break;
        case 2: tile<R, 2>(K, a, rsa, csa, b, ldb, c, ldc, accumulate); break;
        case 3: tile<R, 3>(K, a, rsa, csa, b, ldb, c, ldc, accumulate); break;
        default: tile<R, 4>(K, a, rsa, csa, b, ldb, c, ldc, accumulate); break;
    }
}

// C[M x N] (+)= A[M x K] @ B[K x N], N a multiple of 16 (operands padded with zeros).
static void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t rsa, int64_t csa, const float* b,
                 int64_t ldb, float* c, int64_t ldc, bool accumulate) {
    for (int64_t n0 = 0; n0 < N; n0 += 4 * VW) {
        const int nv = (int)std::min<int64_t>(4, (N - n0) / VW);
        int64_t i = 0;
        for (; i + RB <= M; i += RB)
            tile_nv<RB>(nv, K, a + i * rsa, rsa, csa, b + n0, ldb, c + i * ldc + n0, ldc, accumulate);
        const float* ai = a + i * rsa;
        float* ci = c + i * ldc + n0;
        switch (M - i) {
            case 1: tile_nv<1>(nv, K, ai, rsa, csa, b + n0, ldb, ci, ldc, accumulate); break;
            case 2: tile_nv<2>(nv, K, ai, rsa, csa, b + n0, ldb, ci, ldc, accumulate); break;
            case 3: tile_nv<3>(nv, K, ai, rsa, csa, b + n0, ldb, ci, ldc, accumulate); break;
            case 4: tile_nv<4>(nv, K, ai, rsa, csa, b + n0, ldb, ci, ldc, accumulate); break;
            case 5: tile_nv<5>(nv, K, ai, rsa, csa, b + n0, ldb, ci, ldc, accumulate); break;
            default: break;
        }
    }
}

// ---- packing ------------------------------------------------------------------------------------
// rows [r0, r0+n) x cols [0, w) of operand (b, h) into dst[r][c] (row stride ld), times `mul`;
// columns [w, ld) zero
template <int DT>
static void pack_rows(const View& v, int64_t b, int64_t h, int64_t r0, int64_t n, int64_t w, float mul,
                      float* dst, int64_t ld) {
    typedef typename Elem<DT>::T T;
    const T* base = (const T*)v.p + b * v.s0 + h * v.s1;
    for (int64_t r = 0; r < n; r++) {
        const T* s = base + (r0 + r) * v.s2;
        float* d = dst + r * ld;
        if (v.s3 == 1) {
#pragma omp simd
            for (int64_t c = 0; c < w; c++) d[c] = Elem<DT>::load(s[c]) * mul;
        } else {
            for (int64_t c = 0; c < w; c++) d[c] = Elem<DT>::load(s[c * v.s3]) * mul;
        }
        for (int64_t c = w; c < ld; c++) d[c] = 0.0f;
    }
}

// all n rows x w cols of operand (b, h) transposed, block by block of BK rows: block jb is
// dst[jb*w*BK + c*BK + r] = operand[jb*BK + r][c] (rows past n zero), so the product with one
// block reads contiguous memory (a row stride of the whole length puts every row of a block in
// the same cache sets)
template <int DT>
static void pack_transposed(const View& v, int64_t b, int64_t h, int64_t n, int64_t w, float* dst) {
    typedef typename Elem<DT>::T T;
    const T* base = (const T*)v.p + b * v.s0 + h * v.s1;
    for (int64_t j0 = 0; j0 < n; j0 += BK) {
        float* d = dst + j0 * w;
        const int64_t nk = std::min<int64_t>(BK, n - j0);
        for (int64_t r = 0; r < nk; r++) {
            const T* s = base + (j0 + r) * v.s2;
            for (int64_t c = 0; c < w; c++) d[c * BK + r] = Elem<DT>::load(s[c * v.s3]);
        }
        for (int64_t c = 0; c < w; c++)
            for (int64_t r = nk; r < BK; r++) d[c * BK + r] = 0.0f;
    }
}

static inline int64_t blocks_len(int64_t n) { return (n + BK - 1) / BK * BK; }

// n floats of the workspace at p, used as the vectors they replace
struct Span {
    float* p;
    int64_t n;
    Span(float* p_, int64_t n_) : p(p_), n(n_) {}
    float* data() const { return p; }
    float* begin() const { return p; }
    float* end() const { return p + n; }
    float& operator[](int64_t i) const { return p[i]; }
};

struct Problem {
    int64_t B, H, Hk, L, S, E, Ev;
    View q, k, v;
    const float* mask;              // additive float mask or null; element (b, h, i, j) at
    int64_t m0, m1, m2, m3;         // mask[b*m0 + h*m1 + i*m2 + j*m3]
    int causal;
    float scale;
};

// The scores of query rows [i0, i0+nq) against keys [j0, j0+nk) (in s, row stride ld) plus the
// additive mask, if any (the causal mask is not written: `causal_keys` bounds each row instead).
static void mask_scores(const Problem& p, int64_t b, int64_t h, int64_t i0, int64_t nq, int64_t j0, int64_t nk,
                        float* s, int64_t ld) {
    if (!p.mask) return;
    for (int64_t i = 0; i < nq; i++) {
        const float* m = p.mask + b * p.m0 + h * p.m1 + (i0 + i) * p.m2 + j0 * p.m3;
        for (int64_t j = 0; j < nk; j++) s[i * ld + j] += m[j * p.m3];
    }
}

// How many of the keys [j0, j0+nk) query row i sees: all, or those up to the diagonal when causal.
static inline int64_t causal_keys(const Problem& p, int64_t i, int64_t j0, int64_t nk) {
    return p.causal ? std::max<int64_t>(0, std::min<int64_t>(nk, i + 1 - j0)) : nk;
}

typedef int32_t vi16 __attribute__((vector_size(64), aligned(4)));
static const vi16 LANES = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static const float EXP_ROUND = 12582912.0f;     // 1.5 * 2^23: x + EXP_ROUND - EXP_ROUND rounds x to an integer
static const float LOG2E = 1.44269504088896341f;
static const float LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;   // ln 2 = LN2_HI + LN2_LO (Cephes)

// exp of 16 floats of at most ~88, inline (so a row's exps run without a library call per 16 lanes):
// arguments below MIN_EXP_ARG are clamped there; x = n ln2 + r, |r| <= ln2/2, exp(r) by Cephes' expf
// polynomial, 2^n put in the exponent bits. Within 2 ulp of expf; NaN stays NaN.
static inline v16 exp16(v16 x) {
    const v16 lo = v16{} + MIN_EXP_ARG;
    x = x < lo ? lo : x;
    const v16 t = x * LOG2E + EXP_ROUND;
    const v16 n = t - EXP_ROUND;
    const v16 r = x - n * LN2_HI - n * LN2_LO;
    v16 y = r * 1.9875691500e-4f + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    const vi16 pow2 = ((vi16)t - (vi16)(v16{} + EXP_ROUND) + 127) << 23;
    return y * (v16)pow2;
}

// The largest of s[0, n) and m.
static inline float row_max(const float* s, int64_t n, float m) {
#pragma omp simd reduction(max:m)
    for (int64_t j = 0; j < n; j++) m = std::max(m, s[j]);
    return m;
}

// p = exp(s - m) in place for s[0, n) (0 where s is -inf), s[n, padded) set to 0 (padded: n rounded
// up to 16 lanes, within the row's storage); returns the row's sum.
static inline float exp_row(float* s, int64_t n, int64_t padded, float m) {
    v16 sum = v16{};
    const v16 ninf = v16{} + NEG_INF;
    for (int64_t j = 0; j < padded; j += VW) {
        const v16 x = *(const v16*)(s + j);
        const vi16 off = (x == ninf) | (LANES >= (int32_t)(n - j));
        const v16 e = off ? v16{} : exp16(x - m);
        *(v16*)(s + j) = e;
        sum += e;
    }
    float total = 0.0f;
    for (int k = 0; k < VW; k++) total += sum[k];
    return total;
}

// the key blocks query rows [i0, i0+nq) attend to: all of them, or up to the diagonal when causal
static inline int64_t key_end(const Problem& p, int64_t i0, int64_t nq) {
    return p.causal ? std::min<int64_t>(p.S, i0 + nq) : p.S;
}

// The float workspace (the caller allocates it, so that its size is visible and tested): the forward
// packs K^T and V of every key/value head once, then each thread has a query block, its scores and
// its output accumulator; the backward gives each thread whole-head copies of K, K^T, V^T, Q, dO and
// the gradients. O(L + S) per head or thread, never L x S.
static int64_t forward_shared(const Problem& p) {
    return p.B * p.Hk * (p.E * blocks_len(p.S) + p.S * pad16(p.Ev));
}
static int64_t forward_per_thread(const Problem& p) { return BQ * (pad16(p.E) + pad16(BK) + pad16(p.Ev)); }
static int64_t backward_per_thread(const Problem& p) {
    const int64_t Ep = pad16(p.E), Evp = pad16(p.Ev), Sb = blocks_len(p.S);
    return 2 * p.S * Ep + (p.E + p.Ev) * Sb + p.S * Evp + 2 * p.L * Ep + p.L * Evp + p.L + 2 * BQ * pad16(BK);
}

static inline int thread_id() {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

template <int DT>
static void forward(const Problem& p, void* out, float* lse, float* work, int threads) {
    typedef typename Elem<DT>::T T;
    const int64_t Ep = pad16(p.E), Evp = pad16(p.Ev), Sb = blocks_len(p.S), nqb = (p.L + BQ - 1) / BQ;
    const int64_t heads = p.B * p.Hk, rep = p.H / p.Hk;
    // K^T (by blocks, E x Sb) and V (S x Evp) of every key/value head, in float: packed once
    float* kt = work;
    float* vv = work + heads * p.E * Sb;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t bh = 0; bh < heads; bh++) {
        pack_transposed<DT>(p.k, bh / p.Hk, bh % p.Hk, p.S, p.E, kt + bh * p.E * Sb);
        pack_rows<DT>(p.v, bh / p.Hk, bh % p.Hk, 0, p.S, p.Ev, 1.0f, vv + bh * p.S * Evp, Evp);
    }
#pragma omp parallel num_threads(threads)
    {
        float* qs = work + forward_shared(p) + thread_id() * forward_per_thread(p);
        float* s = qs + BQ * Ep;
        float* acc = s + BQ * pad16(BK);
        float m[BQ], l[BQ];
#pragma omp for schedule(dynamic)
        for (int64_t item = 0; item < p.B * p.H * nqb; item++) {
            const int64_t bh = item / nqb, b = bh / p.H, h = bh % p.H, i0 = (item % nqb) * BQ;
            const int64_t nq = std::min<int64_t>(BQ, p.L - i0), kvh = b * p.Hk + h / rep;
            const float* KT = kt + kvh * p.E * Sb;
            const float* V = vv + kvh * p.S * Evp;
            pack_rows<DT>(p.q, b, h, i0, nq, p.E, p.scale, qs, Ep);
            std::fill(acc, acc + BQ * Evp, 0.0f);
            for (int64_t i = 0; i < nq; i++) { m[i] = NEG_INF; l[i] = 0.0f; }
            const int64_t end = key_end(p, i0, nq);
            for (int64_t j0 = 0; j0 < end; j0 += BK) {
                const int64_t nk = std::min<int64_t>(BK, end - j0), nkp = pad16(nk), ld = pad16(BK);
                gemm(nq, nkp, p.E, qs, Ep, 1, KT + j0 * p.E, BK, s, ld, false);
                mask_scores(p, b, h, i0, nq, j0, nk, s, ld);
                for (int64_t i = 0; i < nq; i++) {
                    float* row = s + i * ld;
                    const int64_t seen = causal_keys(p, i0 + i, j0, nk);
                    const float mx = row_max(row, seen, m[i]);
                    const float msafe = mx == NEG_INF ? 0.0f : mx;
                    const float alpha = m[i] == NEG_INF ? 0.0f : expf(m[i] - msafe);
                    l[i] = l[i] * alpha + exp_row(row, seen, nkp, msafe);
                    m[i] = mx;
                    if (alpha != 1.0f) {
                        float* a = acc + i * Evp;
#pragma omp simd
                        for (int64_t c = 0; c < Evp; c++) a[c] *= alpha;
                    }
                }
                gemm(nq, Evp, nk, s, ld, 1, V + j0 * Evp, Evp, acc, Evp, true);
            }
            T* o = (T*)out + (bh * p.L + i0) * p.Ev;
            for (int64_t i = 0; i < nq; i++) {
                const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
                for (int64_t c = 0; c < p.Ev; c++) o[i * p.Ev + c] = Elem<DT>::store(acc[i * Evp + c] * inv);
                lse[bh * p.L + i0 + i] = l[i] > 0.0f ? m[i] + std::log(l[i]) : NEG_INF;
            }
        }
    }
}

template <int DT>
static void backward(const Problem& p, const View& dout, const View& o, const float* lse, void* dq, void* dk,
                     void* dv, float* work, int threads) {
    typedef typename Elem<DT>::T T;
    const int64_t Ep = pad16(p.E), Evp = pad16(p.Ev), Sb = blocks_len(p.S), ld = pad16(BK), rep = p.H / p.Hk;
#pragma omp parallel num_threads(threads)
    {
        float* w = work + thread_id() * backward_per_thread(p);
        Span K(w, p.S * Ep), dK(K.end(), p.S * Ep), KT(dK.end(), p.E * Sb), VT(KT.end(), p.Ev * Sb);
        Span dV(VT.end(), p.S * Evp), Q(dV.end(), p.L * Ep), dQ(Q.end(), p.L * Ep), dO(dQ.end(), p.L * Evp);
        Span D(dO.end(), p.L), P(D.end(), BQ * ld), dS(P.end(), BQ * ld);
#pragma omp for schedule(dynamic)
        for (int64_t kvh = 0; kvh < p.B * p.Hk; kvh++) {
            const int64_t b = kvh / p.Hk, hk = kvh % p.Hk;
            pack_rows<DT>(p.k, b, hk, 0, p.S, p.E, 1.0f, K.data(), Ep);
            pack_transposed<DT>(p.k, b, hk, p.S, p.E, KT.data());
            pack_transposed<DT>(p.v, b, hk, p.S, p.Ev, VT.data());
            std::fill(dK.begin(), dK.end(), 0.0f);
            std::fill(dV.begin(), dV.end(), 0.0f);
            for (int64_t h = hk * rep; h < (hk + 1) * rep; h++) {
                const int64_t bh = b * p.H + h;
                pack_rows<DT>(p.q, b, h, 0, p.L, p.E, p.scale, Q.data(), Ep);
                pack_rows<DT>(dout, b, h, 0, p.L, p.Ev, 1.0f, dO.data(), Evp);
                std::fill(dQ.begin(), dQ.end(), 0.0f);
                const T* ob = (const T*)o.p + b * o.s0 + h * o.s1;
                for (int64_t i = 0; i < p.L; i++) {
                    float d = 0.0f;
                    for (int64_t c = 0; c < p.Ev; c++) d += dO[i * Evp + c] * Elem<DT>::load(ob[i * o.s2 + c * o.s3]);
                    D[i] = d;
                }
                for (int64_t i0 = 0; i0 < p.L; i0 += BQ) {
                    const int64_t nq = std::min<int64_t>(BQ, p.L - i0), end = key_end(p, i0, nq);
                    const float* Qi = Q.data() + i0 * Ep;
                    const float* dOi = dO.data() + i0 * Evp;
                    for (int64_t j0 = 0; j0 < end; j0 += BK) {
                        const int64_t nk = std::min<int64_t>(BK, end - j0), nkp = pad16(nk);
                        gemm(nq, nkp, p.E, Qi, Ep, 1, KT.data() + j0 * p.E, BK, P.data(), ld, false);
                        mask_scores(p, b, h, i0, nq, j0, nk, P.data(), ld);
                        for (int64_t i = 0; i < nq; i++) {
                            const float li = lse[bh * p.L + i0 + i];
                            float* row = P.data() + i * ld;
                            if (li == NEG_INF) { std::fill(row, row + nkp, 0.0f); continue; }
                            exp_row(row, causal_keys(p, i0 + i, j0, nk), nkp, li);
                        }
                        // dV[j0:] += P^T dO_i
                        gemm(nk, Evp, nq, P.data(), 1, ld, dOi, Evp, dV.data() + j0 * Evp, Evp, true);
                        // dS = P * (dO_i V^T - D)
                        gemm(nq, nkp, p.Ev, dOi, Evp, 1, VT.data() + j0 * p.Ev, BK, dS.data(), ld, false);
                        for (int64_t i = 0; i < nq; i++) {
                            const float di = D[i0 + i];
                            float* ds = dS.data() + i * ld;
                            const float* pr = P.data() + i * ld;
#pragma omp simd
                            for (int64_t j = 0; j < nkp; j++) ds[j] = pr[j] * (ds[j] - di);
                        }
                        // dQ_i += dS K[j0:] (scaled at the end); dK[j0:] += dS^T (Q_i * scale)
                        gemm(nq, Ep, nk, dS.data(), ld, 1, K.data() + j0 * Ep, Ep, dQ.data() + i0 * Ep, Ep, true);
                        gemm(nk, Ep, nq, dS.data(), 1, ld, Qi, Ep, dK.data() + j0 * Ep, Ep, true);
                    }
                }
                T* dqo = (T*)dq + bh * p.L * p.E;
                for (int64_t i = 0; i < p.L; i++)
                    for (int64_t c = 0; c < p.E; c++) dqo[i * p.E + c] = Elem<DT>::store(dQ[i * Ep + c] * p.scale);
            }
            T* dko = (T*)dk + kvh * p.S * p.E;
            T* dvo = (T*)dv + kvh * p.S * p.Ev;
            for (int64_t j = 0; j < p.S; j++) {
                for (int64_t c = 0; c < p.E; c++) dko[j * p.E + c] = Elem<DT>::store(dK[j * Ep + c]);
                for (int64_t c = 0; c < p.Ev; c++) dvo[j * p.Ev + c] = Elem<DT>::store(dV[j * Evp + c]);
            }
        }
    }
}

// sizes: B, H, Hk, L, S, E, Ev; strides: q, k, v (4 each), then the mask's 4; dtype: F32/BF16/F16
static Problem problem(const int64_t* sz, const int64_t* st, const void* q, const void* k, const void* v,
                       const float* mask, int causal, float scale) {
    Problem p;
    p.B = sz[0]; p.H = sz[1]; p.Hk = sz[2]; p.L = sz[3]; p.S = sz[4]; p.E = sz[5]; p.Ev = sz[6];
    p.q = View{q, st[0], st[1], st[2], st[3]};
    p.k = View{k, st[4], st[5], st[6], st[7]};
    p.v = View{v, st[8], st[9], st[10], st[11]};
    p.mask = mask;
    p.m0 = st[12]; p.m1 = st[13]; p.m2 = st[14]; p.m3 = st[15];
    p.causal = causal;
    p.scale = scale;
    return p;
}

// out: (B, H, L, Ev) contiguous in the inputs' dtype; lse: (B, H, L) float
// floats of workspace a call with these sizes needs (backward: its own, else the forward's)
extern "C" int64_t flm_attention_workspace(const int64_t* sz, int backward, int threads) {
    const int64_t st[16] = {0};
    const Problem p = problem(sz, st, nullptr, nullptr, nullptr, nullptr, 0, 1.0f);
    return backward ? threads * backward_per_thread(p) : forward_shared(p) + threads * forward_per_thread(p);
}

extern "C" void flm_attention_forward(const int64_t* sz, const int64_t* st, int dtype, const void* q, const void* k,
                                      const void* v, const float* mask, int causal, float scale, void* out,
                                      float* lse, float* work, int threads) {
    const Problem p = problem(sz, st, q, k, v, mask, causal, scale);
    if (dtype == BF16) forward<BF16>(p, out, lse, work, threads);
    else if (dtype == F16) forward<F16>(p, out, lse, work, threads);
    else forward<F32>(p, out, lse, work, threads);
}

// st continues with dout's and out's strides (16..23); dq: (B, H, L, E), dk/dv: (B, Hk, S, E/Ev) contiguous
extern "C" void flm_attention_backward(const int64_t* sz, const int64_t* st, int dtype, const void* q,
                                       const void* k, const void* v, const float* mask, int causal, float scale,
                                       const void* dout, const void* out, const float* lse, void* dq, void* dk,
                                       void* dv, float* work, int threads) {
    const Problem p = problem(sz, st, q, k, v, mask, causal, scale);
    const View d{dout, st[16], st[17], st[18], st[19]}, o{out, st[20], st[21], st[22], st[23]};
    if (dtype == BF16) backward<BF16>(p, d, o, lse, dq, dk, dv, work, threads);
    else if (dtype == F16) backward<F16>(p, d, o, lse, dq, dk, dv, work, threads);
    else backward<F32>(p, d, o, lse, dq, dk, dv, work, threads);
}
