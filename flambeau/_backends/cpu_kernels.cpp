// flambeau's float32 matrix product for the CPU: C = A @ B (or C += A @ B), batched, any strides.
//
// bfloat16 operands (`flm_gemm_bf16`) run the same blocking with AVX-512 BF16 dot products where the
// CPU has them (see the section below).
//
// Blocked the classic way (Goto / BLIS): for each block of KC rows of B and NC columns, B is packed
// into panels NR columns wide (k-major, contiguous, zero-padded at the edge); for each block of MC
// rows of A, A is packed into panels MR rows tall; a register-blocked micro-kernel then multiplies one
// A panel by one B panel into an MR x NR tile of C held in 2*MR vector registers. Packing reads A and
// B through their strides, so transposed operands cost nothing extra. Work is split over OpenMP
// threads by B panels (the N direction) or, for batches of small products, by batch item.
//
// The micro-kernel is written with GCC vector extensions (16 floats = one AVX-512 register): with
// -march=native on an AVX-512 machine it compiles to broadcast-FMA instructions. `flm_gemm_native`
// tells Python whether AVX-512 was available; without it Python keeps NumPy's BLAS.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <vector>
#include <pthread.h>
#include "lowp.h"     // bfloat16 / float16 <-> float
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __AVX512F__
#include <immintrin.h>
#endif

typedef float v16 __attribute__((vector_size(64), aligned(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));

enum { MR = 12, NR = 32, KC = 256, MC = 96, NC = 2048 };

extern "C" int flm_gemm_native() {
#ifdef __AVX512F__
    return 1;
#else
    return 0;
#endif
}

extern "C" int flm_gemm_threads() {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

// Pack rows [0, mc) x cols [0, kc) of A (row stride rsa, column stride csa) into MR-row panels:
// panel p holds A[p*MR + i][k] at dst[p*MR*kc + k*MR + i], rows past mc filled with zeros.
static void pack_a(int64_t mc, int64_t kc, const float* a, int64_t rsa, int64_t csa, float* dst) {
    for (int64_t p = 0; p < mc; p += MR) {
        const int64_t m = std::min<int64_t>(MR, mc - p);
        float* d = dst + p * kc;
        if (csa == 1 && m == MR) {      // transpose 12 rows through a small tile, 16 k at a time
            int64_t k0 = 0;
            for (; k0 + 16 <= kc; k0 += 16) {
                v16 rows[MR];
                for (int i = 0; i < MR; i++) rows[i] = *(const v16u*)(a + (p + i) * rsa + k0);
                for (int k = 0; k < 16; k++)
                    for (int i = 0; i < MR; i++) d[(k0 + k) * MR + i] = rows[i][k];
            }
            for (; k0 < kc; k0++)
                for (int i = 0; i < MR; i++) d[k0 * MR + i] = a[(p + i) * rsa + k0];
        } else if (csa == 1) {
            for (int64_t i = 0; i < m; i++) {
                const float* s = a + (p + i) * rsa;
                for (int64_t k = 0; k < kc; k++) d[k * MR + i] = s[k];
            }
        } else if (rsa == 1 && m == MR) {   // a transposed operand: MR contiguous floats per k
            for (int64_t k = 0; k < kc; k++) {
                const float* s = a + k * csa + p;
#pragma GCC unroll 12
                for (int64_t i = 0; i < MR; i++) d[k * MR + i] = s[i];
            }
        } else {
            for (int64_t k = 0; k < kc; k++) {
                const float* s = a + k * csa + p * rsa;
                for (int64_t i = 0; i < m; i++) d[k * MR + i] = s[i * rsa];
            }
        }
        for (int64_t i = m; i < MR; i++)
            for (int64_t k = 0; k < kc; k++) d[k * MR + i] = 0.0f;
    }
}

// Pack one NR-column panel of B (rows [0, kc), columns [0, n), n <= NR) into dst[k*NR + j].
static void pack_b_panel(int64_t kc, int64_t n, const float* b, int64_t rsb, int64_t csb, float* dst) {
    if (csb == 1 && n == NR) {
        for (int64_t k = 0; k < kc; k++) {
            const v16u* s = (const v16u*)(b + k * rsb);
            v16* d = (v16*)(dst + k * NR);
            d[0] = s[0];
            d[1] = s[1];
        }
        return;
    }
    if (rsb == 1) {
        for (int64_t j = 0; j < n; j++) {
            const float* s = b + j * csb;
            for (int64_t k = 0; k < kc; k++) dst[k * NR + j] = s[k];
        }
    } else {
        for (int64_t k = 0; k < kc; k++)
            for (int64_t j = 0; j < n; j++) dst[k * NR + j] = b[k * rsb + j * csb];
    }
    if (n < NR)
        for (int64_t k = 0; k < kc; k++)
            for (int64_t j = n; j < NR; j++) dst[k * NR + j] = 0.0f;
}

// C[0:m, 0:n] (row stride ldc) = (accumulate ? C : 0) + Ap (MR x kc panel) @ Bp (kc x NR panel).
static inline void micro(int64_t kc, const float* __restrict__ ap, const float* __restrict__ bp,
                         float* __restrict__ c, int64_t ldc, int64_t m, int64_t n, bool accumulate) {
    v16 acc[MR][2];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) { acc[i][0] = v16{}; acc[i][1] = v16{}; }
    for (int64_t k = 0; k < kc; k++) {
        const v16 b0 = *(const v16*)(bp + k * NR);
        const v16 b1 = *(const v16*)(bp + k * NR + 16);
        const float* a = ap + k * MR;
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) {
            acc[i][0] += a[i] * b0;
            acc[i][1] += a[i] * b1;
        }
    }
    if (m == MR && n == NR) {
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) {
            v16u* row = (v16u*)(c + i * ldc);
            if (accumulate) { row[0] += acc[i][0]; row[1] += acc[i][1]; }
            else { row[0] = acc[i][0]; row[1] = acc[i][1]; }
        }
        return;
    }
    alignas(64) float tile[MR][NR];
    for (int i = 0; i < MR; i++) { *(v16*)&tile[i][0] = acc[i][0]; *(v16*)&tile[i][16] = acc[i][1]; }
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            c[i * ldc + j] = accumulate ? c[i * ldc + j] + tile[i][j] : tile[i][j];
}

static float* scratch(float*& buf, int64_t& cap, int64_t need) {
    if (need > cap) {
        std::free(buf);
        buf = (float*)std::aligned_alloc(64, ((need * sizeof(float) + 63) / 64) * 64);
        cap = need;
    }
    return buf;
}

static thread_local float* t_apack = nullptr;
static thread_local int64_t t_apack_cap = 0;
static thread_local float* t_bpack = nullptr;
static thread_local int64_t t_bpack_cap = 0;
static thread_local float* t_copies = nullptr;      // the implicit-GEMM conv's copy table
static thread_local int64_t t_copies_cap = 0;

// ---- bfloat16 operands: AVX-512 BF16 dot products (vdpbf16ps) ------------------------------------
// Packed in pairs along k: an A panel holds, per pair (k, k+1), MR 32-bit words (row i's two values),
// a B panel NR words (column j's two values), zero-padded to an even kc; the micro-kernel multiplies
// a broadcast word of A by the two B vectors of 16 columns, accumulating both products of each pair
// in float (vdpbf16ps flushes subnormal inputs and results, as PyTorch's oneDNN kernels on such
// CPUs). The float tile is stored as the float32 product's.
#ifdef __AVX512BF16__
static void pack_a_bf16(int64_t mc, int64_t kc, const uint16_t* a, int64_t rsa, int64_t csa, uint16_t* dst) {
    const int64_t kp = (kc + 1) & ~int64_t(1);
    for (int64_t p = 0; p < mc; p += MR) {
        const int64_t m = std::min<int64_t>(MR, mc - p);
        uint16_t* d = dst + p * kp;
        for (int64_t k = 0; k < kp; k++)
            for (int64_t i = 0; i < MR; i++)
                d[(k >> 1) * 2 * MR + 2 * i + (k & 1)] = (i < m && k < kc) ? a[(p + i) * rsa + k * csa] : 0;
    }
}

static void pack_b_bf16(int64_t kc, int64_t n, const uint16_t* b, int64_t rsb, int64_t csb, uint16_t* dst) {
    const int64_t kp = (kc + 1) & ~int64_t(1);
    for (int64_t k = 0; k < kp; k++) {
        uint16_t* d = dst + (k >> 1) * 2 * NR + (k & 1);
        if (k >= kc) { for (int64_t j = 0; j < NR; j++) d[2 * j] = 0; continue; }
        const uint16_t* s = b + k * rsb;
        for (int64_t j = 0; j < n; j++) d[2 * j] = s[j * csb];
        for (int64_t j = n; j < NR; j++) d[2 * j] = 0;
    }
}

static inline void micro_bf16(int64_t kc, const uint16_t* __restrict__ ap, const uint16_t* __restrict__ bp,
                              float* __restrict__ c, int64_t ldc, int64_t m, int64_t n, bool accumulate) {
    __m512 acc[MR][2];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) { acc[i][0] = _mm512_setzero_ps(); acc[i][1] = _mm512_setzero_ps(); }
    const int64_t pairs = (kc + 1) >> 1;
    for (int64_t kk = 0; kk < pairs; kk++) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + kk * 2 * NR);
        const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + kk * 2 * NR + NR);
        const uint16_t* a = ap + kk * 2 * MR;
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) {
            int32_t w;
            std::memcpy(&w, a + 2 * i, 4);
            const __m512bh av = (__m512bh)_mm512_set1_epi32(w);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], av, b0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], av, b1);
        }
    }
    alignas(64) float tile[MR][NR];
    for (int i = 0; i < MR; i++) { _mm512_store_ps(&tile[i][0], acc[i][0]); _mm512_store_ps(&tile[i][16], acc[i][1]); }
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            c[i * ldc + j] = accumulate ? c[i * ldc + j] + tile[i][j] : tile[i][j];
}
#endif

// The blocked driver's operations for one element type: packing and the micro-kernel.
struct Float32Ops {
    typedef float In;
    typedef float Packed;
    static int64_t packed_k(int64_t kc) { return kc; }
    static void pack_a(int64_t mc, int64_t kc, const float* a, int64_t rsa, int64_t csa, float* d) {
        ::pack_a(mc, kc, a, rsa, csa, d);
    }
    static void pack_b(int64_t kc, int64_t n, const float* b, int64_t rsb, int64_t csb, float* d) {
        pack_b_panel(kc, n, b, rsb, csb, d);
    }
    static void micro(int64_t kc, const float* ap, const float* bp, float* c, int64_t ldc, int64_t m, int64_t n,
                      bool acc) {
        ::micro(kc, ap, bp, c, ldc, m, n, acc);
    }
};

#ifdef __AVX512BF16__
struct BFloat16Ops {
    typedef uint16_t In;
    typedef uint16_t Packed;
    static int64_t packed_k(int64_t kc) { return (kc + 1) & ~int64_t(1); }
    static void pack_a(int64_t mc, int64_t kc, const uint16_t* a, int64_t rsa, int64_t csa, uint16_t* d) {
        pack_a_bf16(mc, kc, a, rsa, csa, d);
    }
    static void pack_b(int64_t kc, int64_t n, const uint16_t* b, int64_t rsb, int64_t csb, uint16_t* d) {
        pack_b_bf16(kc, n, b, rsb, csb, d);
    }
    static void micro(int64_t kc, const uint16_t* ap, const uint16_t* bp, float* c, int64_t ldc, int64_t m,
                      int64_t n, bool acc) {
        micro_bf16(kc, ap, bp, c, ldc, m, n, acc);
    }
};
#endif

// B packed once for good (a constant weight; flm_pack_b): for each block of KC rows, every NR-column
// panel of all of B's columns, as gemm_serial packs one (jc, pc) block, so block pc starts at
// pc * npad and the panel of column jr at + jr * kc. `n_off`: the first column a call starts at.
struct PackedB {
    const void* data = nullptr;
    int64_t npad = 0, n_off = 0;
};

// One product on the calling thread (no OpenMP inside); B's panels read from `pk` when given.
template <class Ops>
static void gemm_serial(int64_t M, int64_t N, int64_t K, const typename Ops::In* a, int64_t rsa, int64_t csa,
                        const typename Ops::In* b, int64_t rsb, int64_t csb, float* c, int64_t ldc, bool beta,
                        const PackedB& pk = PackedB()) {
    typedef typename Ops::Packed P;
    const int64_t mc_max = std::min<int64_t>(MC, ((M + MR - 1) / MR) * MR);
    P* ap = (P*)scratch(t_apack, t_apack_cap, mc_max * KC);       // (a bfloat16 panel: half the bytes)
    P* bp = pk.data ? nullptr : (P*)scratch(t_bpack, t_bpack_cap, KC * std::min<int64_t>(NC, ((N + NR - 1) / NR) * NR));
    for (int64_t jc = 0; jc < N; jc += NC) {
        const int64_t nc = std::min<int64_t>(NC, N - jc);
        for (int64_t pc = 0; pc < K; pc += KC) {
            const int64_t kc = std::min<int64_t>(KC, K - pc), kp = Ops::packed_k(kc);
            const bool acc = beta || pc > 0;
            if (pk.data)
                bp = (P*)pk.data + pc * pk.npad + (pk.n_off + jc) * kp;
            else
                for (int64_t jr = 0; jr < nc; jr += NR)
                    Ops::pack_b(kc, std::min<int64_t>(NR, nc - jr), b + pc * rsb + (jc + jr) * csb, rsb, csb,
                                bp + jr * kp);
            for (int64_t ic = 0; ic < M; ic += MC) {
                const int64_t mc = std::min<int64_t>(MC, M - ic);
                Ops::pack_a(mc, kc, a + ic * rsa + pc * csa, rsa, csa, ap);
                for (int64_t jr = 0; jr < nc; jr += NR)
                    for (int64_t ir = 0; ir < mc; ir += MR)
                        Ops::micro(kc, ap + ir * kp, bp + jr * kp, c + (ic + ir) * ldc + jc + jr, ldc,
                                   std::min<int64_t>(MR, mc - ir), std::min<int64_t>(NR, nc - jr), acc);
            }
        }
    }
}

// One product split over the OpenMP team with a single fork/join: each thread takes a contiguous
// share of C's column panels (or of its row tiles, when there are more of those) and computes it
// with gemm_serial, packing its own copies (no barriers inside, which matters when idle OpenMP
// threads sleep after a short spin).
template <class Ops>
static void gemm_parallel(int64_t M, int64_t N, int64_t K, const typename Ops::In* a, int64_t rsa, int64_t csa,
                          const typename Ops::In* b, int64_t rsb, int64_t csb, float* c, int64_t ldc, bool beta,
                          int threads, const PackedB& pk = PackedB()) {
    const int64_t col_panels = (N + NR - 1) / NR, row_tiles = (M + MR - 1) / MR;
    const bool by_cols = col_panels >= row_tiles || col_panels >= 4 * threads;
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
#else
        const int64_t nt = 1, t = 0;
#endif
        if (by_cols) {
            const int64_t p0 = col_panels * t / nt, p1 = col_panels * (t + 1) / nt;
            const int64_t n0 = p0 * NR, n1 = std::min<int64_t>(N, p1 * NR);
            PackedB mine = pk;
            mine.n_off = pk.n_off + n0;
            if (n1 > n0) gemm_serial<Ops>(M, n1 - n0, K, a, rsa, csa, b + n0 * csb, rsb, csb, c + n0, ldc, beta, mine);
        } else {
            const int64_t q0 = row_tiles * t / nt, q1 = row_tiles * (t + 1) / nt;
            const int64_t m0 = q0 * MR, m1 = std::min<int64_t>(M, q1 * MR);
            if (m1 > m0)
                gemm_serial<Ops>(m1 - m0, N, K, a + m0 * rsa, rsa, csa, b, rsb, csb, c + m0 * ldc, ldc, beta, pk);
        }
    }
}

// C[t] (+)= A[t] @ B[t] for t < batch; element strides for everything. `threads`: 1 runs on the
// calling thread, otherwise batches of small products go item-per-thread and a single large product
// is split by columns.
template <class Ops>
static void gemm_batched(int64_t batch, int64_t M, int64_t N, int64_t K,
                         const typename Ops::In* a, int64_t sba, int64_t rsa, int64_t csa,
                         const typename Ops::In* b, int64_t sbb, int64_t rsb, int64_t csb,
                         float* c, int64_t sbc, int64_t ldc, int beta, int threads) {
    if (M == 0 || N == 0) return;
    if (K == 0) {
        if (!beta)
            for (int64_t t = 0; t < batch; t++)
                for (int64_t i = 0; i < M; i++) std::memset(c + t * sbc + i * ldc, 0, N * sizeof(float));
        return;
    }
    if (threads <= 1) {
        for (int64_t t = 0; t < batch; t++)
            gemm_serial<Ops>(M, N, K, a + t * sba, rsa, csa, b + t * sbb, rsb, csb, c + t * sbc, ldc, beta);
    } else if (batch >= threads && N <= 4 * NR * threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t t = 0; t < batch; t++)
            gemm_serial<Ops>(M, N, K, a + t * sba, rsa, csa, b + t * sbb, rsb, csb, c + t * sbc, ldc, beta);
    } else {
        for (int64_t t = 0; t < batch; t++)
            gemm_parallel<Ops>(M, N, K, a + t * sba, rsa, csa, b + t * sbb, rsb, csb, c + t * sbc, ldc, beta, threads);
    }
}

extern "C" void flm_sgemm(int64_t batch, int64_t M, int64_t N, int64_t K,
                          const float* a, int64_t sba, int64_t rsa, int64_t csa,
                          const float* b, int64_t sbb, int64_t rsb, int64_t csb,
                          float* c, int64_t sbc, int64_t ldc, int beta, int threads) {
    gemm_batched<Float32Ops>(batch, M, N, K, a, sba, rsa, csa, b, sbb, rsb, csb, c, sbc, ldc, beta, threads);
}

// A constant B (K x N, any strides) packed once: flm_packed_b_floats(N, K) floats at `dst`
// (64-byte aligned), read by flm_sgemm_packed for every product with it (no per-call packing).
extern "C" int64_t flm_packed_b_floats(int64_t N, int64_t K) { return K * (((N + NR - 1) / NR) * NR); }

extern "C" void flm_pack_b(int64_t N, int64_t K, const float* b, int64_t rsb, int64_t csb, float* dst) {
    const int64_t npad = ((N + NR - 1) / NR) * NR;
    for (int64_t pc = 0; pc < K; pc += KC) {
        const int64_t kc = std::min<int64_t>(KC, K - pc);
        for (int64_t jr = 0; jr < N; jr += NR)
            pack_b_panel(kc, std::min<int64_t>(NR, N - jr), b + pc * rsb + jr * csb, rsb, csb, dst + pc * npad + jr * kc);
    }
}

// C (M x N, row stride ldc) = A (M x K, strides rsa, csa) @ B, B packed by flm_pack_b.
extern "C" void flm_sgemm_packed(int64_t M, int64_t N, int64_t K, const float* a, int64_t rsa, int64_t csa,
                                 const float* bpacked, float* c, int64_t ldc, int threads) {
    if (M == 0 || N == 0) return;
    if (K == 0) {
        for (int64_t i = 0; i < M; i++) std::memset(c + i * ldc, 0, N * sizeof(float));
        return;
    }
    PackedB pk;
    pk.data = bpacked;
    pk.npad = ((N + NR - 1) / NR) * NR;
    if (threads <= 1)
        gemm_serial<Float32Ops>(M, N, K, a, rsa, csa, nullptr, 0, 0, c, ldc, false, pk);
    else
        gemm_parallel<Float32Ops>(M, N, K, a, rsa, csa, nullptr, 0, 0, c, ldc, false, threads, pk);
}

extern "C" int flm_gemm_bf16_native() {
#ifdef __AVX512BF16__
    return 1;
#else
    return 0;
#endif
}

// A bfloat16 operand (batch x rows x cols, element strides) widened into a contiguous float copy.
static float* widen_bf16(int64_t batch, int64_t rows, int64_t cols, const uint16_t* x, int64_t sb, int64_t rs,
                         int64_t cs) {
    float* w = (float*)std::malloc(sizeof(float) * std::max<int64_t>(1, batch * rows * cols));
    for (int64_t t = 0; t < batch; t++)
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++)
                w[(t * rows + i) * cols + j] = fl_bf16_to_f32(x[t * sb + i * rs + j * cs]);
    return w;
}

// out (batch x M x N contiguous, bfloat16) = A[t] @ B[t] of bfloat16 operands (element strides),
// accumulated in float in `work` (batch x M x N floats), then rounded to nearest even. Built without
// AVX-512 BF16 (a portable AOTInductor package), the operands are widened to float copies and
// multiplied by the float32 kernel: the same float sums, rounded the same way.
extern "C" void flm_gemm_bf16(int64_t batch, int64_t M, int64_t N, int64_t K,
                              const uint16_t* a, int64_t sba, int64_t rsa, int64_t csa,
                              const uint16_t* b, int64_t sbb, int64_t rsb, int64_t csb,
                              float* work, uint16_t* out, int threads) {
#ifdef __AVX512BF16__
    gemm_batched<BFloat16Ops>(batch, M, N, K, a, sba, rsa, csa, b, sbb, rsb, csb, work, M * N, N, 0, threads);
#else
    float* fa = widen_bf16(batch, M, K, a, sba, rsa, csa);
    float* fb = widen_bf16(batch, K, N, b, sbb, rsb, csb);
    gemm_batched<Float32Ops>(batch, M, N, K, fa, M * K, K, 1, fb, K * N, N, 1, work, M * N, N, 0, threads);
    std::free(fa);
    std::free(fb);
#endif
    const int64_t n = batch * M * N;
#pragma omp parallel for simd schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; i++) out[i] = fl_f32_to_bf16(work[i]);
}

// A product planned once for fixed shapes and layouts (the compiled graphs' externs): the arrays come
// as NumPy array objects, whose data pointer this reads at byte offset plan[PLAN_DATA_OFFSET], so a
// call converts three objects instead of seventeen integers and pointers. The plan's element offsets
// and strides are relative to each array's data pointer. In a forked child the product runs on the
// calling thread (libgomp's team does not survive fork; a parallel region there would hang).
enum { PLAN_BATCH, PLAN_M, PLAN_N, PLAN_K, PLAN_A_OFFSET, PLAN_SBA, PLAN_RSA, PLAN_CSA, PLAN_B_OFFSET, PLAN_SBB,
       PLAN_RSB, PLAN_CSB, PLAN_SBC, PLAN_LDC, PLAN_THREADS, PLAN_DATA_OFFSET, PLAN_SIZE };

static int flm_forked = 0;
static void flm_mark_forked() { flm_forked = 1; }
__attribute__((constructor)) static void flm_register_fork_handler() {
    pthread_atfork(nullptr, nullptr, flm_mark_forked);
}

extern "C" int flm_plan_size() { return PLAN_SIZE; }

extern "C" void flm_sgemm_planned(const int64_t* p, const char* a, const char* b, const char* c) {
    const int64_t off = p[PLAN_DATA_OFFSET];
    const float* pa = *(const float* const*)(a + off) + p[PLAN_A_OFFSET];
    const float* pb = *(const float* const*)(b + off) + p[PLAN_B_OFFSET];
    float* pc = *(float* const*)(c + off);
    flm_sgemm(p[PLAN_BATCH], p[PLAN_M], p[PLAN_N], p[PLAN_K], pa, p[PLAN_SBA], p[PLAN_RSA], p[PLAN_CSA],
              pb, p[PLAN_SBB], p[PLAN_RSB], p[PLAN_CSB], pc, p[PLAN_SBC], p[PLAN_LDC], 0,
              flm_forked ? 1 : (int)p[PLAN_THREADS]);
}

// A planned product (plan as flm_sgemm_planned's, batch 1; its B fields unused) whose B was packed once
// by flm_pack_b: a constant weight of a frozen graph.
extern "C" void flm_sgemm_packed_planned(const int64_t* p, const char* a, const float* bpacked, const char* c) {
    const int64_t off = p[PLAN_DATA_OFFSET];
    const float* pa = *(const float* const*)(a + off) + p[PLAN_A_OFFSET];
    float* pc = *(float* const*)(c + off);
    flm_sgemm_packed(p[PLAN_M], p[PLAN_N], p[PLAN_K], pa, p[PLAN_RSA], p[PLAN_CSA], bpacked, pc, p[PLAN_LDC],
                     flm_forked ? 1 : (int)p[PLAN_THREADS]);
}

// ---- 2-D convolution as an implicit GEMM ---------------------------------------------------------
// y[n] (O x L, L = OH*OW) = W (O x C*KH*KW) @ cols(x[n]) (+ bias), where cols is never built: the B
// panels are packed straight from the input. A panel of NR consecutive output positions splits into
// runs that lie in one output row; for each row k = (c, kh, kw) of B, a run reads one input row
// (contiguous when the stride is 1) and is zero outside the image (the padding). Weights are packed
// once per call (flm_conv2d), or once for all calls (flm_conv_pack_w + flm_conv2d_packed); the work items (image, block of NCONV output positions) are split over the OpenMP team.
enum { NCONV = 256 };

struct Conv2d {
    int64_t C, H, W, O, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW;
};

// Runs of output positions [l0, l0+nc) that lie in one output row, cut at panel boundaries:
// (destination offset in the panel-major layout / kc, length, output row, first output column).
struct Runs {
    int64_t n = 0;
    int64_t panel[NCONV + NCONV / NR], j[NCONV + NCONV / NR], len[NCONV + NCONV / NR],
            oh[NCONV + NCONV / NR], ow[NCONV + NCONV / NR];
};

static void make_runs(const Conv2d& g, int64_t l0, int64_t nc, Runs& r) {
    r.n = 0;
    for (int64_t p = 0; p * NR < nc; p++) {
        const int64_t n = std::min<int64_t>(NR, nc - p * NR);
        for (int64_t j = 0; j < n;) {
            const int64_t l = l0 + p * NR + j, oh = l / g.OW, ow = l % g.OW;
            const int64_t len = std::min<int64_t>(n - j, g.OW - ow);
            r.panel[r.n] = p; r.j[r.n] = j; r.len[r.n] = len; r.oh[r.n] = oh; r.ow[r.n] = ow; r.n++;
            j += len;
        }
    }
}

#ifdef __AVX512F__
// For stride-1 convolutions, what a run copies for each kernel position (kh, kw) depends only on
// the run, not on the channel: one table per work item holds, per (kh, kw) and run, the source
// offset in a channel plane (-1: the run lies in a padding row) and the load/store masks of its
// two 16-lane chunks. Packing is then two masked copies per run and row of B.
struct RunCopy {
    int64_t off;
    __mmask16 valid[2], keep[2];
};

static void make_copies(const Conv2d& g, const Runs& runs, RunCopy* table) {
    for (int64_t kh = 0; kh < g.KH; kh++)
        for (int64_t kw = 0; kw < g.KW; kw++) {
            RunCopy* e = table + (kh * g.KW + kw) * runs.n;
            for (int64_t q = 0; q < runs.n; q++) {
                const int64_t len = runs.len[q];
                const int64_t ih = runs.oh[q] * g.sh - g.ph + kh * g.dh;
                const int64_t iw0 = runs.ow[q] - g.pw + kw * g.dw;
                const int64_t lo = std::min<int64_t>(len, std::max<int64_t>(0, -iw0));
                const int64_t hi = std::max<int64_t>(lo, std::min<int64_t>(len, g.W - iw0));
                const bool row = ih >= 0 && ih < g.H;
                e[q].off = row ? ih * g.W + iw0 : -1;
                for (int t = 0; t < 2; t++) {
                    const int64_t a = std::max<int64_t>(lo - 16 * t, 0), z = std::min<int64_t>(hi - 16 * t, 16);
                    const int64_t n = std::max<int64_t>(0, std::min<int64_t>(len - 16 * t, 16));
                    e[q].valid[t] = (row && z > a) ? (__mmask16)(((1u << z) - 1) & ~((1u << a) - 1)) : 0;
                    e[q].keep[t] = (__mmask16)((1u << n) - 1);
                }
            }
        }
}

static void pack_cols_s1(const Conv2d& g, const float* x, int64_t k0, int64_t kc, int64_t nc, const Runs& runs,
                         const RunCopy* table, float* dst) {
    const int64_t khw = g.KH * g.KW, panels = (nc + NR - 1) / NR, tail = nc - (panels - 1) * NR;
    int64_t c = k0 / khw, r = k0 % khw;
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        const float* xc = x + c * g.H * g.W;
        const RunCopy* e = table + r * runs.n;
        float* row = dst + k * NR;
        for (int64_t q = 0; q < runs.n; q++) {
            float* out = row + runs.panel[q] * NR * kc + runs.j[q];
            const float* src = xc + e[q].off;
            _mm512_mask_storeu_ps(out, e[q].keep[0], _mm512_maskz_loadu_ps(e[q].valid[0], src));
            if (e[q].keep[1])
                _mm512_mask_storeu_ps(out + 16, e[q].keep[1], _mm512_maskz_loadu_ps(e[q].valid[1], src + 16));
        }
        if (tail < NR) {                     // zero the last panel's columns past nc
            float* last = row + (panels - 1) * NR * kc;
            if (tail < 16) {
                _mm512_mask_storeu_ps(last, (__mmask16)~((1u << tail) - 1), zero);
                _mm512_storeu_ps(last + 16, zero);
            } else {
                _mm512_mask_storeu_ps(last + 16, (__mmask16)~((1u << (tail - 16)) - 1), zero);
            }
        }
        if (++r == khw) { r = 0; c++; }
    }
}
#endif

// Pack rows [k0, k0+kc) of the implicit column matrix of image `x` (C x H x W), positions
// [l0, l0+nc) (described by `runs`), into NR-wide panels at dst (panel p at dst + p*NR*kc, row k at
// + k*NR); columns past nc are zero.
static void pack_cols(const Conv2d& g, const float* x, int64_t k0, int64_t kc, int64_t nc, const Runs& runs,
                      float* dst) {
    const int64_t khw = g.KH * g.KW, panels = (nc + NR - 1) / NR, tail = nc - (panels - 1) * NR;
    int64_t c = k0 / khw, kh = (k0 % khw) / g.KW, kw = k0 % g.KW;
    for (int64_t k = 0; k < kc; k++) {
        const float* xc = x + c * g.H * g.W;
        for (int64_t q = 0; q < runs.n; q++) {
            float* out = dst + runs.panel[q] * NR * kc + k * NR + runs.j[q];
            const int64_t len = runs.len[q];
            const int64_t ih = runs.oh[q] * g.sh - g.ph + kh * g.dh;
            if (ih < 0 || ih >= g.H) {
                for (int64_t t = 0; t < len; t++) out[t] = 0.0f;
                continue;
            }
            const float* xr = xc + ih * g.W;
            const int64_t iw0 = runs.ow[q] * g.sw - g.pw + kw * g.dw;
            if (g.sw == 1) {
                const int64_t lo = std::min<int64_t>(len, std::max<int64_t>(0, -iw0));
                const int64_t hi = std::max<int64_t>(lo, std::min<int64_t>(len, g.W - iw0));
                const float* src = xr + iw0;
#ifdef __AVX512F__
                // masked loads: lanes outside [lo, hi) read nothing and give 0 (the padding)
                for (int64_t t = 0; t < len; t += 16) {
                    const int64_t a = std::max<int64_t>(lo - t, 0), e = std::min<int64_t>(hi - t, 16);
                    const __mmask16 valid = e > a ? (__mmask16)(((1u << e) - 1) & ~((1u << a) - 1)) : 0;
                    const __mmask16 keep = (__mmask16)((1u << std::min<int64_t>(len - t, 16)) - 1);
                    _mm512_mask_storeu_ps(out + t, keep, _mm512_maskz_loadu_ps(valid, src + t));
                }
#else
                for (int64_t t = 0; t < lo; t++) out[t] = 0.0f;
                for (int64_t t = lo; t < hi; t++) out[t] = src[t];
                for (int64_t t = hi; t < len; t++) out[t] = 0.0f;
#endif
            } else {
                for (int64_t t = 0; t < len; t++) {
                    const int64_t iw = iw0 + t * g.sw;
                    out[t] = (iw >= 0 && iw < g.W) ? xr[iw] : 0.0f;
                }
            }
        }
        if (tail < NR) {
            float* row = dst + (panels - 1) * NR * kc + k * NR;
            for (int64_t t = tail; t < NR; t++) row[t] = 0.0f;
        }
        if (++kw == g.KW) { kw = 0; if (++kh == g.KH) { kh = 0; c++; } }
    }
}

// Floats of a convolution's packed weights (O x K, K = C*KH*KW): k-block b, tile q at
// b*tiles*MR*KC + q*MR*kc. flm_conv_pack_w packs them (contiguous weights); a constant weight of a
// compiled graph or package is packed once and read by every flm_conv2d_packed call.
extern "C" int64_t flm_conv_packed_w_floats(int64_t O, int64_t K) {
    return ((K + KC - 1) / KC) * ((O + MR - 1) / MR) * MR * KC;
}

extern "C" void flm_conv_pack_w(int64_t O, int64_t K, const float* w, float* wp) {
    const int64_t tiles = (O + MR - 1) / MR;
    for (int64_t b = 0; b * KC < K; b++)
        pack_a(O, std::min<int64_t>(KC, K - b * KC), w + b * KC, K, 1, wp + b * tiles * MR * KC);
}

extern "C" void flm_conv2d_packed(int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW,
                                  int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                                  int64_t OH, int64_t OW, const float* x, const float* wp, const float* bias,
                                  float* y, int threads) {
    const Conv2d g{C, H, W, O, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW};
    const int64_t K = C * KH * KW, L = OH * OW;
    const int64_t tiles = (O + MR - 1) / MR, kblocks = (K + KC - 1) / KC;
    if (L == 0 || O == 0 || N == 0) return;
    const int64_t lblocks = (L + NCONV - 1) / NCONV, items = N * lblocks;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t it = 0; it < items; it++) {
        const int64_t n = it / lblocks, l0 = (it % lblocks) * NCONV, nc = std::min<int64_t>(NCONV, L - l0);
        float* bp = scratch(t_bpack, t_bpack_cap, KC * NCONV);
        Runs runs;
        make_runs(g, l0, nc, runs);
#ifdef __AVX512F__
        RunCopy* copies = nullptr;
        if (sw == 1) {
            copies = (RunCopy*)scratch(t_copies, t_copies_cap,
                                       (int64_t)((KH * KW * runs.n * sizeof(RunCopy) + sizeof(float) - 1) / sizeof(float)));
            make_copies(g, runs, copies);
        }
#endif
        float* yn = y + n * O * L + l0;
        const float* xn = x + n * C * H * W;
        if (bias)
            for (int64_t o = 0; o < O; o++)
                for (int64_t j = 0; j < nc; j++) yn[o * L + j] = bias[o];
        for (int64_t b = 0; b < kblocks; b++) {
            const int64_t kc = std::min<int64_t>(KC, K - b * KC);
            const bool acc = bias != nullptr || b > 0;
#ifdef __AVX512F__
            if (copies)
                pack_cols_s1(g, xn, b * KC, kc, nc, runs, copies, bp);
            else
#endif
                pack_cols(g, xn, b * KC, kc, nc, runs, bp);
            const float* ap = wp + b * tiles * MR * KC;
            for (int64_t p = 0; p * NR < nc; p++)
                for (int64_t q = 0; q < tiles; q++)
                    micro(kc, ap + q * MR * kc, bp + p * NR * kc, yn + q * MR * L + p * NR, L,
                          std::min<int64_t>(MR, O - q * MR), std::min<int64_t>(NR, nc - p * NR), acc);
        }
    }
}

extern "C" void flm_conv2d(int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW,
                           int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                           int64_t OH, int64_t OW, const float* x, const float* w, const float* bias, float* y,
                           int threads) {
    if (OH * OW == 0 || O == 0 || N == 0) return;
    const int64_t K = C * KH * KW;
    float* wp = (float*)std::aligned_alloc(64, ((flm_conv_packed_w_floats(O, K) * sizeof(float) + 63) / 64) * 64);
    flm_conv_pack_w(O, K, w, wp);          // the weights packed once per call
    flm_conv2d_packed(N, C, H, W, O, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, x, wp, bias, y, threads);
    std::free(wp);
}

// ---- weight gradient of a grouped 2-D convolution (vmap's per-example weight gradients) -------------
// gw[g] (Og x Cg*KH*KW) = sum over images n and output positions l of gy[n, g] (Og x L) times the
// column matrix of x[n, g] (Cg*KH*KW x L) transposed; x is already padded. Under vmap(grad) the
// examples are the groups and each group's product is small (16 x 121 by 121 x 72 for bench/func.py's
// second layer): packed GEMMs spend their time packing. Here a group's gy is transposed once into
// L rows of Og lanes (padded to 8 or 16), and each column (c, kh, kw) is a sum over l of one broadcast
// input value times that row: up to WG_J columns at a time in as many accumulator registers, the input read in
// place (no column buffer). Groups are split over the OpenMP team.
enum { WG_J = 8 };
typedef float v8 __attribute__((vector_size(32), aligned(32)));
static thread_local float* t_gyt = nullptr;
static thread_local int64_t t_gyt_cap = 0;

// Columns [0, J) (input offsets koff) of one group's weight gradient, V-wide chunks of output channels.
template <typename V, int J>
static void weight_grad_columns(int64_t L, int64_t opad, const float* gyt, const float* xg, const int64_t* base,
                                const int64_t* koff, float* acc_out) {
    constexpr int lanes = sizeof(V) / sizeof(float);
    for (int64_t o0 = 0; o0 < opad; o0 += lanes) {
        V acc[J];
#pragma GCC unroll 8
        for (int jj = 0; jj < J; jj++) acc[jj] = (V){};
        for (int64_t l = 0; l < L; l++) {
            const V gv = *(const V*)(gyt + l * opad + o0);
            const float* xl = xg + base[l];
#pragma GCC unroll 8
            for (int jj = 0; jj < J; jj++) acc[jj] += gv * xl[koff[jj]];
        }
#pragma GCC unroll 8
        for (int jj = 0; jj < J; jj++) *(V*)(acc_out + jj * opad + o0) += acc[jj];
    }
}

template <typename V>
static void weight_grad_block(int J, int64_t L, int64_t opad, const float* gyt, const float* xg, const int64_t* base,
                              const int64_t* koff, float* acc_out) {
    switch (J) {
        case 1: weight_grad_columns<V, 1>(L, opad, gyt, xg, base, koff, acc_out); break;
        case 2: weight_grad_columns<V, 2>(L, opad, gyt, xg, base, koff, acc_out); break;
        case 3: weight_grad_columns<V, 3>(L, opad, gyt, xg, base, koff, acc_out); break;
        case 4: weight_grad_columns<V, 4>(L, opad, gyt, xg, base, koff, acc_out); break;
        case 5: weight_grad_columns<V, 5>(L, opad, gyt, xg, base, koff, acc_out); break;
        case 6: weight_grad_columns<V, 6>(L, opad, gyt, xg, base, koff, acc_out); break;
        case 7: weight_grad_columns<V, 7>(L, opad, gyt, xg, base, koff, acc_out); break;
        default: weight_grad_columns<V, 8>(L, opad, gyt, xg, base, koff, acc_out); break;
    }
}

extern "C" void flm_conv2d_weight_grad_f32(int64_t N, int64_t G, int64_t Cg, int64_t H, int64_t W, int64_t Og,
                                           int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                                           int64_t OH, int64_t OW, const float* x, const float* gy, float* gw,
                                           int threads) {
    // 8 lanes for at most 8 output channels a group (a first layer's 1 -> 8), else 16
    const int64_t L = OH * OW, CK = Cg * KH * KW, lanes = Og <= 8 ? 8 : 16, opad = (Og + lanes - 1) / lanes * lanes;
    const int64_t blocks = (CK + WG_J - 1) / WG_J;       // columns split evenly: no lone latency-bound column
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t g = 0; g < G; g++) {
        // per thread: gy transposed (L x opad), the column sums (CK x opad), input offsets per l and per column
        float* gyt = scratch(t_gyt, t_gyt_cap, L * opad + CK * opad + 2 * (L + CK));
        float* acc = gyt + L * opad;
        int64_t* base = (int64_t*)(acc + CK * opad);      // 64-byte aligned: opad is a multiple of 16
        int64_t* koff = base + L;
        for (int64_t oh = 0, l = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++, l++) base[l] = oh * sh * W + ow * sw;
        for (int64_t c = 0, j = 0; c < Cg; c++)
            for (int64_t kh = 0; kh < KH; kh++)
                for (int64_t kw = 0; kw < KW; kw++, j++) koff[j] = c * H * W + kh * dh * W + kw * dw;
        std::memset(acc, 0, sizeof(float) * CK * opad);
        for (int64_t n = 0; n < N; n++) {
            const float* gyg = gy + (n * G + g) * Og * L;
            for (int64_t o = 0; o < opad; o++) {          // read along l, a channel at a time
                if (o < Og)
                    for (int64_t l = 0; l < L; l++) gyt[l * opad + o] = gyg[o * L + l];
                else
                    for (int64_t l = 0; l < L; l++) gyt[l * opad + o] = 0.0f;
            }
            const float* xg = x + (n * G + g) * Cg * H * W;
            for (int64_t b = 0; b < blocks; b++) {
                const int64_t j0 = b * CK / blocks, j1 = (b + 1) * CK / blocks;
                if (lanes == 8)
                    weight_grad_block<v8>((int)(j1 - j0), L, opad, gyt, xg, base, koff + j0, acc + j0 * opad);
                else
                    weight_grad_block<v16>((int)(j1 - j0), L, opad, gyt, xg, base, koff + j0, acc + j0 * opad);
            }
        }
        float* out = gw + g * Og * CK;
        for (int64_t o = 0; o < Og; o++)
            for (int64_t j = 0; j < CK; j++) out[o * CK + j] = acc[j * opad + o];
    }
}

// ---- direct 2-D convolution for few output channels (column stride 1) ------------------------------
// The implicit GEMM above packs every image's column matrix (C*KH*KW x OH*OW) into panels; with few
// output channels that packing is most of the time (bench/func.py's 64 examples: the same 0.19 ms for
// 4, 8 or 12 channels, 8->16 channels 3x3 on 13x13). Here nothing is packed but the weights: for each
// output row, 16 output columns at a time, every (c, kh, kw) loads 16 input values once (masked at the
// padding) and adds them, times a broadcast weight, into one accumulator register per output channel.
#ifdef __AVX512F__
template <int OB>
static void conv2d_direct_rows(const Conv2d& g, const float* xn, const float* wt, const float* bias, int64_t o0,
                               int64_t ob, float* yn, int64_t oh) {
    const int64_t L = g.OH * g.OW;
    for (int64_t ow0 = 0; ow0 < g.OW; ow0 += 16) {
        const int64_t n = std::min<int64_t>(16, g.OW - ow0);
        __m512 acc[OB];
#pragma GCC unroll 16
        for (int o = 0; o < OB; o++) acc[o] = _mm512_set1_ps(bias && o < ob ? bias[o0 + o] : 0.0f);
        const float* wk = wt;
        for (int64_t c = 0; c < g.C; c++)
            for (int64_t kh = 0; kh < g.KH; kh++) {
                const int64_t ih = oh * g.sh - g.ph + kh * g.dh;
                if (ih < 0 || ih >= g.H) { wk += g.KW * OB; continue; }
                const float* xr = xn + (c * g.H + ih) * g.W;
                for (int64_t kw = 0; kw < g.KW; kw++, wk += OB) {
                    const int64_t iw0 = ow0 - g.pw + kw * g.dw;       // the column of lane 0
                    const int64_t lo = std::max<int64_t>(0, -iw0), hi = std::min<int64_t>(n, g.W - iw0);
                    if (hi <= lo) continue;
                    const __mmask16 valid = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
                    const __m512 xv = _mm512_maskz_loadu_ps(valid, xr + iw0);
#pragma GCC unroll 16
                    for (int o = 0; o < OB; o++) acc[o] = _mm512_fmadd_ps(_mm512_set1_ps(wk[o]), xv, acc[o]);
                }
            }
        const __mmask16 keep = (__mmask16)((1u << n) - 1);
#pragma GCC unroll 16
        for (int o = 0; o < OB; o++)
            if (o < ob) _mm512_mask_storeu_ps(yn + (o0 + o) * L + oh * g.OW + ow0, keep, acc[o]);
    }
}

template <int OB>
static void conv2d_direct(const Conv2d& g, int64_t N, const float* x, const float* w, const float* bias, float* y,
                          int threads) {
    const int64_t CK = g.C * g.KH * g.KW, blocks = (g.O + OB - 1) / OB;
    // weights as [block][c, kh, kw][OB] (channels past O zero): a block's weights for one (c, kh, kw) are
    // OB consecutive floats
    float* wt = (float*)std::aligned_alloc(64, ((blocks * CK * OB * sizeof(float) + 63) / 64) * 64);
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t j = 0; j < CK; j++)
            for (int64_t o = 0; o < OB; o++)
                wt[(b * CK + j) * OB + o] = b * OB + o < g.O ? w[(b * OB + o) * CK + j] : 0.0f;
    const int64_t items = N * g.OH;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t it = 0; it < items; it++) {
        const int64_t n = it / g.OH, oh = it % g.OH;
        for (int64_t b = 0; b < blocks; b++)
            conv2d_direct_rows<OB>(g, x + n * g.C * g.H * g.W, wt + b * CK * OB, bias, b * OB,
                                   std::min<int64_t>(OB, g.O - b * OB), y + n * g.O * g.OH * g.OW, oh);
    }
    std::free(wt);
}
#endif

// Returns 0 when it did not run (no AVX-512, or a column stride other than 1): the caller then runs
// the implicit GEMM.
extern "C" int flm_conv2d_direct(int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW,
                                 int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                                 int64_t OH, int64_t OW, const float* x, const float* w, const float* bias,
                                 float* y, int threads) {
#ifdef __AVX512F__
    if (sw != 1) return 0;
    if (OH * OW == 0 || O == 0 || N == 0) return 1;
    const Conv2d g{C, H, W, O, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW};
    if (O <= 4) conv2d_direct<4>(g, N, x, w, bias, y, threads);
    else if (O <= 8) conv2d_direct<8>(g, N, x, w, bias, y, threads);
    else conv2d_direct<16>(g, N, x, w, bias, y, threads);
    return 1;
#else
    return 0;
#endif
}

// ---- softmax / log_softmax over the last dim (float32 rows) ----------------------------------------
// Three passes over a row that stays in cache: max, exp(x - max) and its sum, then the scale (or,
// for log_softmax, x - max - log(sum)); float accumulation as in PyTorch's CPU kernel. With
// FLM_SIMD_MATH the compiler vectorises expf/logf through glibc's libmvec.
#ifdef FLM_SIMD_MATH
extern "C" float expf(float) noexcept __attribute__((simd("notinbranch")));
extern "C" float logf(float) noexcept __attribute__((simd("notinbranch")));
#endif

// One row of a softmax-like kernel: its max, and the sum of exp(x - m) (stored in `e` when given).
static inline float flm_row_max(const float* __restrict__ xr, int64_t cols) {
    float m = -__builtin_inff();
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < cols; j++) m = xr[j] > m ? xr[j] : m;
    return m;
}

static inline float flm_exp_sum(const float* __restrict__ xr, int64_t cols, float m, float* __restrict__ e) {
    float s = 0.0f;
    if (e) {
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < cols; j++) {
            e[j] = expf(xr[j] - m);
            s += e[j];
        }
    } else {
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < cols; j++) s += expf(xr[j] - m);
    }
    return s;
}

extern "C" void flm_softmax_f32(int64_t rows, int64_t cols, const float* x, float* y, int log_softmax, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < rows; r++) {
        const float* __restrict__ xr = x + r * cols;
        float* __restrict__ yr = y + r * cols;
        float m = flm_row_max(xr, cols);
        if (log_softmax) {
            const float ls = logf(flm_exp_sum(xr, cols, m, nullptr));   // (x - max) - log(sum), as PyTorch
#pragma omp simd
            for (int64_t j = 0; j < cols; j++) yr[j] = (xr[j] - m) - ls;
        } else {
            const float inv = 1.0f / flm_exp_sum(xr, cols, m, yr);
#pragma omp simd
            for (int64_t j = 0; j < cols; j++) yr[j] *= inv;
        }
    }
}

// ---- cross-entropy over class-index targets (float32 rows; no class weight, no label smoothing) ----
// What flambeau/_ops/loss.py's NumPy path computes, in one pass per row instead of six array passes.
// Forward: y[r] = (x[r, t] - m) - log(sum_j exp(x[r, j] - m)), the log-softmax at the target, m the
// row's max (0 where it is -inf, as loss.py's _shifted). Backward: g[r, j] = exp(x[r, j] - m) /
// sum * a[r], then b[r] taken off at j == t[r] (loss.py's _class_backward, in its order).
extern "C" void flm_ce_forward_f32(int64_t rows, int64_t cols, const float* x, const int64_t* t, float* y,
                                   int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < rows; r++) {
        const float* __restrict__ xr = x + r * cols;
        float m = flm_row_max(xr, cols);
        if (m == -__builtin_inff()) m = 0.0f;   // a +inf max leaves the row nan, as PyTorch's
        y[r] = (xr[t[r]] - m) - logf(flm_exp_sum(xr, cols, m, nullptr));
    }
}

extern "C" void flm_ce_backward_f32(int64_t rows, int64_t cols, const float* x, const int64_t* t, const float* a,
                                    const float* b, float* g, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < rows; r++) {
        const float* __restrict__ xr = x + r * cols;
        float* __restrict__ gr = g + r * cols;
        float m = flm_row_max(xr, cols);
        if (m == -__builtin_inff()) m = 0.0f;   // a +inf max leaves the row nan, as PyTorch's
        const float s = flm_exp_sum(xr, cols, m, gr);
        const float ar = a[r];
#pragma omp simd
        for (int64_t j = 0; j < cols; j++) gr[j] = gr[j] / s * ar;
        gr[t[r]] -= b[r];
    }
}

// ---- LayerNorm over the last `cols` elements of each contiguous row (float32 / float64) ----------
// What flambeau/_ops/norm_loss.py's NumPy path computes, in T (float for float32, as ATen's CPU
// kernel accumulates float32 rows in float), one row at a time while it is in cache, instead of ~10
// array passes with temporaries. Forward: mean = sum(x)/n, var = sum((x - mean)^2)/n (two passes over
// the row: at least as accurate as ATen's Welford moments), rstd = 1/sqrt(var + eps), y = (x - mean)
// * rstd * w + b (centred, as norm_loss.py: a constant row gives exactly b, where ATen's x*rstd -
// mean*rstd under FMA contraction leaves a rounding residue). w, b may be null.
// No FMA contraction here: dy*w - mean(dy*w) fused would leave a rounding residue where the exact
// result is 0 (a constant row, a 1-wide norm), as would x*rstd - mean*rstd in the forward.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
template <typename T>
static void ln_forward(int64_t rows, int64_t cols, const T* x, const T* w, const T* b, T eps, T* y, T* mean,
                       T* rstd, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < rows; r++) {
        const T* __restrict__ xr = x + r * cols;
        T* __restrict__ yr = y + r * cols;
        T s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < cols; j++) s += xr[j];
        const T m = s / (T)cols;
        T q = 0;
#pragma omp simd reduction(+ : q)
        for (int64_t j = 0; j < cols; j++) q += (xr[j] - m) * (xr[j] - m);
        const T a = T(1) / std::sqrt(q / (T)cols + eps);
        mean[r] = m;
        rstd[r] = a;
        if (w && b) {
#pragma omp simd
            for (int64_t j = 0; j < cols; j++) yr[j] = (xr[j] - m) * a * w[j] + b[j];
        } else if (w) {
#pragma omp simd
            for (int64_t j = 0; j < cols; j++) yr[j] = (xr[j] - m) * a * w[j];
        } else if (b) {
#pragma omp simd
            for (int64_t j = 0; j < cols; j++) yr[j] = (xr[j] - m) * a + b[j];
        } else {
#pragma omp simd
            for (int64_t j = 0; j < cols; j++) yr[j] = (xr[j] - m) * a;
        }
    }
}

// Backward, the NumPy path's fused formula per row (xhat = (x - mean) * rstd, g = dy * w):
// dx = rstd * (g - sum(g)/n - xhat * sum(g*xhat)/n), centred as norm_loss.py's (no cancellation
// against a large mean, unlike ATen's a*g + b*x + c); the column sums dw = sum_rows(dy * xhat),
// db = sum_rows(dy) in the same pass. Any of dx, dw, db may be null (not computed). With several
// threads each sums its rows' dw/db into its own 2*cols slice of `scratch` (zeroed by the caller),
// and the slices are added in thread order after the loop; with one, straight into dw/db (zeroed here).
template <typename T>
static void ln_backward(int64_t rows, int64_t cols, const T* dy, const T* x, const T* mean, const T* rstd,
                        const T* w, T* dx, T* dw, T* db, T* scratch, int threads) {
    const bool colsums = dw || db;
    if (threads <= 1 || (colsums && !scratch)) threads = 1;
    if (threads == 1) {
        if (dw) std::memset(dw, 0, sizeof(T) * cols);
        if (db) std::memset(db, 0, sizeof(T) * cols);
    }
    const T inv_n = T(1) / (T)cols;
#pragma omp parallel num_threads(threads)
    {
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
#endif
        T* __restrict__ pw = threads == 1 ? dw : (dw ? scratch + (int64_t)t * 2 * cols : nullptr);
        T* __restrict__ pb = threads == 1 ? db : (db ? scratch + (int64_t)t * 2 * cols + cols : nullptr);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const T* __restrict__ dyr = dy + r * cols;
            const T* __restrict__ xr = x + r * cols;
            const T m = mean[r], a = rstd[r];
            if (dx && w && pw && pb) {          // the common case: every output, in two passes over the row
                T* __restrict__ dxr = dx + r * cols;
                T s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
                for (int64_t j = 0; j < cols; j++) {
                    const T g = dyr[j] * w[j];
                    s1 += g;
                    s2 += g * ((xr[j] - m) * a);
                }
                const T c1 = s1 * inv_n, c2 = s2 * inv_n;
#pragma omp simd
                for (int64_t j = 0; j < cols; j++) {
                    const T xh = (xr[j] - m) * a;
                    dxr[j] = a * (dyr[j] * w[j] - c1 - xh * c2);
                    pw[j] += dyr[j] * xh;
                    pb[j] += dyr[j];
                }
                continue;
            }
            if (dx) {
                T* __restrict__ dxr = dx + r * cols;
                T s1 = 0, s2 = 0;
                if (w) {
#pragma omp simd reduction(+ : s1, s2)
                    for (int64_t j = 0; j < cols; j++) {
                        const T g = dyr[j] * w[j];
                        s1 += g;
                        s2 += g * ((xr[j] - m) * a);
                    }
                    const T c1 = s1 * inv_n, c2 = s2 * inv_n;
#pragma omp simd
                    for (int64_t j = 0; j < cols; j++) dxr[j] = a * (dyr[j] * w[j] - c1 - ((xr[j] - m) * a) * c2);
                } else {
#pragma omp simd reduction(+ : s1, s2)
                    for (int64_t j = 0; j < cols; j++) {
                        s1 += dyr[j];
                        s2 += dyr[j] * ((xr[j] - m) * a);
                    }
                    const T c1 = s1 * inv_n, c2 = s2 * inv_n;
#pragma omp simd
                    for (int64_t j = 0; j < cols; j++) dxr[j] = a * (dyr[j] - c1 - ((xr[j] - m) * a) * c2);
                }
            }
            if (pw) {
#pragma omp simd
                for (int64_t j = 0; j < cols; j++) pw[j] += dyr[j] * ((xr[j] - m) * a);
            }
            if (pb) {
#pragma omp simd
                for (int64_t j = 0; j < cols; j++) pb[j] += dyr[j];
            }
        }
    }
    if (colsums && threads > 1) {
        for (int64_t j = 0; j < cols; j++) {
            T sw = 0, sb = 0;
            for (int t = 0; t < threads; t++) {
                sw += scratch[(int64_t)t * 2 * cols + j];
                sb += scratch[(int64_t)t * 2 * cols + cols + j];
            }
            if (dw) dw[j] = sw;
            if (db) db[j] = sb;
        }
    }
}

// The entry points take the arrays as NumPy array objects (ctypes.py_object) and read each data pointer
// at byte offset `off` (cpu_kernels.DATA_OFFSET): `x.ctypes.data` costs ~1 us an array in Python, more
// than the kernel on a 64x256 block. `has` says which optional arrays were given (the others are
// placeholders): LN_W, LN_B; LN_DX, LN_DW, LN_DB, LN_SCRATCH for the backward.
enum { LN_W = 1, LN_B = 2, LN_DX = 4, LN_DW = 8, LN_DB = 16, LN_SCRATCH = 32 };

template <typename T>
static inline T* ln_data(void* obj, int64_t off, int has, int bit) {
    return (has & bit) ? *reinterpret_cast<T**>(static_cast<char*>(obj) + off) : nullptr;
}

template <typename T>
static void ln_forward_objs(int64_t rows, int64_t cols, void* x, void* w, void* b, double eps, void* y, void* mean,
                            void* rstd, int64_t off, int has, int threads) {
    const int all = -1;
    ln_forward<T>(rows, cols, ln_data<T>(x, off, all, 1), ln_data<T>(w, off, has, LN_W), ln_data<T>(b, off, has, LN_B),
                  (T)eps, ln_data<T>(y, off, all, 1), ln_data<T>(mean, off, all, 1), ln_data<T>(rstd, off, all, 1),
                  threads);
}

template <typename T>
static void ln_backward_objs(int64_t rows, int64_t cols, void* dy, void* x, void* mean, void* rstd, void* w, void* dx,
                             void* dw, void* db, void* scratch, int64_t off, int has, int threads) {
    const int all = -1;
    ln_backward<T>(rows, cols, ln_data<T>(dy, off, all, 1), ln_data<T>(x, off, all, 1), ln_data<T>(mean, off, all, 1),
                   ln_data<T>(rstd, off, all, 1), ln_data<T>(w, off, has, LN_W), ln_data<T>(dx, off, has, LN_DX),
                   ln_data<T>(dw, off, has, LN_DW), ln_data<T>(db, off, has, LN_DB),
                   ln_data<T>(scratch, off, has, LN_SCRATCH), threads);
}

extern "C" void flm_layer_norm_f32(int64_t rows, int64_t cols, void* x, void* w, void* b, double eps, void* y,
                                   void* mean, void* rstd, int64_t off, int has, int threads) {
    ln_forward_objs<float>(rows, cols, x, w, b, eps, y, mean, rstd, off, has, threads);
}

extern "C" void flm_layer_norm_f64(int64_t rows, int64_t cols, void* x, void* w, void* b, double eps, void* y,
                                   void* mean, void* rstd, int64_t off, int has, int threads) {
    ln_forward_objs<double>(rows, cols, x, w, b, eps, y, mean, rstd, off, has, threads);
}

extern "C" void flm_layer_norm_backward_f32(int64_t rows, int64_t cols, void* dy, void* x, void* mean, void* rstd,
                                            void* w, void* dx, void* dw, void* db, void* scratch, int64_t off,
                                            int has, int threads) {
    ln_backward_objs<float>(rows, cols, dy, x, mean, rstd, w, dx, dw, db, scratch, off, has, threads);
}

extern "C" void flm_layer_norm_backward_f64(int64_t rows, int64_t cols, void* dy, void* x, void* mean, void* rstd,
                                            void* w, void* dx, void* dw, void* db, void* scratch, int64_t off,
                                            int has, int threads) {
    ln_backward_objs<double>(rows, cols, dy, x, mean, rstd, w, dx, dw, db, scratch, off, has, threads);
}
#pragma GCC pop_options

// ---- Adam / AdamW step (float32, one parameter) -------------------------------------------------
// The same float32 operations, in the same order and with the same rounding of the scalars, as the
// NumPy update rule in flambeau/optim/adam.py -- so the results are bitwise equal -- but in one pass
// over the arrays instead of ten with temporaries. No FMA contraction here (it would change the
// rounding).
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
extern "C" void flm_adam_f32(int64_t n, float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, float* __restrict__ vmax, float decay, float wd, float one_minus_b1,
                             float b2, float one_minus_b2, float bc2_sqrt, float eps, float step_size, int threads) {
#pragma omp parallel for simd schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; i++) {
        float pi = p[i], gi = g[i];
        if (decay != 1.0f) pi = pi * decay;                 // decoupled weight decay (AdamW)
        if (wd != 0.0f) gi = gi + wd * pi;                  // L2 weight decay (Adam)
        const float mi = m[i] + (gi - m[i]) * one_minus_b1;
        const float vi = v[i] * b2 + one_minus_b2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float den = vi;
        if (vmax) { den = (vmax[i] > vi || vmax[i] != vmax[i]) ? vmax[i] : vi; vmax[i] = den; }   // np.maximum
        den = std::sqrt(den) / bc2_sqrt + eps;
        p[i] = pi - step_size * mi / den;
    }
}
#pragma GCC pop_options

// ---- 2-D max pooling with indices (float32 planes, windows inside the plane) -------------------
// ATen's CPU loop: a larger value or a NaN takes the place (ties keep the first position, a NaN the
// last); the index is the flat position in the plane. An output row at a time, kernel position by
// kernel position, branch-free selects over the row (vectorised). With a column stride above 1 the
// compiler's row loop gathers lane by lane (1 ms for bench/func.py's 64x8x26x26, 2x2 windows of
// stride 2): `max_pool_row_strided` takes 16 outputs at a time, a stride-2 row as two loads and one
// even-lane permute, a wider stride as one gather.
#ifdef __AVX512F__
// The lanes of `keep` of 16 int32 flat positions, stored as int64 indices from ir (both pooling kernels).
static inline void store_positions(int64_t* ir, __m512i at, __mmask16 keep) {
    _mm512_mask_storeu_epi64(ir, (__mmask8)(keep & 0xff), _mm512_cvtepi32_epi64(_mm512_castsi512_si256(at)));
    if (keep >> 8)
        _mm512_mask_storeu_epi64(ir + 8, (__mmask8)(keep >> 8), _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(at, 1)));
}

static inline __m512 strided_load(const float* src, int64_t sw, int64_t n, __m512i lanes_sw, __m512i evens) {
    const __mmask16 keep = (__mmask16)((1u << n) - 1);
    if (sw == 2) {
        const int64_t need = 2 * (n - 1) + 1;         // floats read: lanes 0, 2, ..., 2(n-1)
        const __m512 lo = _mm512_maskz_loadu_ps((__mmask16)((1u << std::min<int64_t>(need, 16)) - 1), src);
        const __m512 hi = need > 16 ? _mm512_maskz_loadu_ps((__mmask16)((1u << (need - 16)) - 1), src + 16)
                                    : _mm512_setzero_ps();
        return _mm512_permutex2var_ps(lo, evens, hi);
    }
    return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), keep, lanes_sw, src, 4);
}

static void max_pool_row_strided(const float* xp, int64_t W, int64_t OW, int64_t kh, int64_t kw, int64_t row0,
                                 int64_t sw, int64_t dh, int64_t dw, float* yr, int64_t* ir) {
    const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i lanes_sw = _mm512_mullo_epi32(lanes, _mm512_set1_epi32((int)sw));
    const __m512i evens = _mm512_add_epi32(lanes, lanes);
    for (int64_t ow0 = 0; ow0 < OW; ow0 += 16) {
        const int64_t n = std::min<int64_t>(16, OW - ow0);
        __m512 m = _mm512_setzero_ps();
        __m512i at = _mm512_setzero_si512();            // int32 flat positions in the plane
        for (int64_t i = 0; i < kh; i++)
            for (int64_t j = 0; j < kw; j++) {
                const int64_t q = row0 + i * dh * W + ow0 * sw + j * dw;
                const __m512 v = strided_load(xp + q, sw, n, lanes_sw, evens);
                const __m512i pos = _mm512_add_epi32(_mm512_set1_epi32((int)q), lanes_sw);
                if (i == 0 && j == 0) { m = v; at = pos; continue; }
                const __mmask16 take = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
                m = _mm512_mask_blend_ps(take, m, v);
                at = _mm512_mask_blend_epi32(take, at, pos);
            }
        const __mmask16 keep = (__mmask16)((1u << n) - 1);
        _mm512_mask_storeu_ps(yr + ow0, keep, m);
        store_positions(ir + ow0, at, keep);
    }
}
#endif

// One plane's max pooling, window by window over output rows: a larger value (or a NaN) takes the place,
// so ties keep the first position and a NaN the last (ATen's loop).
template <typename T>
static void max_pool2d_plane(const T* xp, int64_t W, int64_t OH, int64_t OW, int64_t kh, int64_t kw, int64_t sh,
                             int64_t sw, int64_t dh, int64_t dw, T* y, int64_t* idx) {
    for (int64_t oh = 0; oh < OH; oh++) {
        T* __restrict__ yr = y + oh * OW;
        int64_t* __restrict__ ir = idx + oh * OW;
        const int64_t h0 = oh * sh;
        for (int64_t i = 0; i < kh; i++)
            for (int64_t j = 0; j < kw; j++) {
                const int64_t row = (h0 + i * dh) * W + j * dw;
                const T* __restrict__ xr = xp + row;
                if (i == 0 && j == 0) {
#pragma omp simd
                    for (int64_t ow = 0; ow < OW; ow++) { yr[ow] = xr[ow * sw]; ir[ow] = row + ow * sw; }
                    continue;
                }
#pragma omp simd
                for (int64_t ow = 0; ow < OW; ow++) {
                    const T v = xr[ow * sw], m = yr[ow];
                    const bool take = v > m || v != v;
                    yr[ow] = take ? v : m;
                    ir[ow] = take ? row + ow * sw : ir[ow];
                }
            }
    }
}

extern "C" void flm_max_pool2d_f32(int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t kh,
                                   int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, const float* x,
                                   float* y, int64_t* idx, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < planes; p++) {
        const float* xp = x + p * H * W;
#ifdef __AVX512F__
        if (sw != 1 && H * W < (int64_t(1) << 31)) {
            for (int64_t oh = 0; oh < OH; oh++)
                max_pool_row_strided(xp, W, OW, kh, kw, oh * sh * W, sw, dh, dw, y + (p * OH + oh) * OW,
                                     idx + (p * OH + oh) * OW);
            continue;
        }
#endif
        max_pool2d_plane(xp, W, OH, OW, kh, kw, sh, sw, dh, dw, y + p * OH * OW, idx + p * OH * OW);
    }
}

#if defined(__AVX512BW__) && defined(__AVX512VL__)
// A uint8 output row with column stride 2, 16 outputs at a time: the 31 bytes under them loaded at once,
// widened to 16-bit lanes, and the even ones kept as int32 lanes (an AND of each 32-bit pair's low half).
static void max_pool_row_u8_stride2(const uint8_t* xp, int64_t W, int64_t OW, int64_t kh, int64_t kw, int64_t row0,
                                    int64_t dh, int64_t dw, uint8_t* yr, int64_t* ir) {
    const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i lanes2 = _mm512_add_epi32(lanes, lanes);
    const __m512i low16 = _mm512_set1_epi32(0xFFFF);
    for (int64_t ow0 = 0; ow0 < OW; ow0 += 16) {
        const int64_t n = std::min<int64_t>(16, OW - ow0);
        const __mmask32 bytes = (__mmask32)((1u << (2 * (n - 1) + 1)) - 1);
        __m512i m = _mm512_setzero_si512(), at = _mm512_setzero_si512();
        for (int64_t i = 0; i < kh; i++)
            for (int64_t j = 0; j < kw; j++) {
                const int64_t q = row0 + i * dh * W + ow0 * 2 + j * dw;
                const __m512i v = _mm512_and_si512(_mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(bytes, xp + q)), low16);
                const __m512i pos = _mm512_add_epi32(_mm512_set1_epi32((int)q), lanes2);
                if (i == 0 && j == 0) { m = v; at = pos; continue; }
                const __mmask16 take = _mm512_cmpgt_epi32_mask(v, m);
                m = _mm512_mask_blend_epi32(take, m, v);
                at = _mm512_mask_blend_epi32(take, at, pos);
            }
        const __mmask16 keep = (__mmask16)((1u << n) - 1);
        _mm512_mask_cvtepi32_storeu_epi8(yr + ow0, keep, m);
        store_positions(ir + ow0, at, keep);
    }
}
#endif

// uint8 planes (the int8 path of a quantized graph's max pooling: the integers pooled as they are)
extern "C" void flm_max_pool2d_u8(int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t kh,
                                  int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, const uint8_t* x,
                                  uint8_t* y, int64_t* idx, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < planes; p++) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
        if (sw == 2 && H * W < (int64_t(1) << 31)) {
            for (int64_t oh = 0; oh < OH; oh++)
                max_pool_row_u8_stride2(x + p * H * W, W, OW, kh, kw, oh * sh * W, dh, dw, y + (p * OH + oh) * OW,
                                        idx + (p * OH + oh) * OW);
            continue;
        }
#endif
        max_pool2d_plane(x + p * H * W, W, OH, OW, kh, kw, sh, sw, dh, dw, y + p * OH * OW, idx + p * OH * OW);
    }
}

// ---- int8 average pooling (a quantized graph's dequantize -> avg pool -> quantize with one set of qparams) --
// Output (n, c, oh, ow) averages the window rows [hs, hs + hl) x columns [ws, ws + wl) of plane (n, c):
// acc = sum(x) - hl * wl * zp in int32, m = 1.0f / (hd * wd), then nearbyint(float(acc) * m) + zp (PyTorch's
// quantized channels-last avg_pool2d) or, adaptive, nearbyint(fma(acc, 1 / (1 / m), zp)) (its
// adaptive_avg_pool2d, quantize_val with scale 1 / m), clamped to the type's range. Element strides for x (sN, sC, sH, sW) and y; channels innermost runs one vector lane
// per channel (the channels-last layout that int8 convolutions produce).
template <typename T>
static void avg_pool2d_int8(int64_t N, int64_t C, int64_t OH, int64_t OW, const int64_t* xs, const int64_t* ys,
                            const T* x, T* y, const int64_t* hs, const int64_t* hl, const int64_t* hd,
                            const int64_t* ws, const int64_t* wl, const int64_t* wd, int32_t zp, int adaptive,
                            int32_t lo, int32_t hi, int threads) {
#pragma omp parallel num_threads(threads)
    {
        std::vector<int32_t> acc(C);
#pragma omp for schedule(static) collapse(2)
        for (int64_t n = 0; n < N; n++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    const int32_t base = -(int32_t)(hl[oh] * wl[ow]) * zp;
                    for (int64_t c = 0; c < C; c++) acc[c] = base;
                    for (int64_t h = hs[oh]; h < hs[oh] + hl[oh]; h++)
                        for (int64_t w = ws[ow]; w < ws[ow] + wl[ow]; w++) {
                            const T* __restrict__ xp = x + n * xs[0] + h * xs[2] + w * xs[3];
                            int32_t* __restrict__ a = acc.data();
                            if (xs[1] == 1) {
#pragma omp simd
                                for (int64_t c = 0; c < C; c++) a[c] += xp[c];
                            } else {
                                for (int64_t c = 0; c < C; c++) a[c] += xp[c * xs[1]];
                            }
                        }
                    const float m = 1.0f / (float)(hd[oh] * wd[ow]), inv = 1.0f / (1.0f / m);
                    T* yp = y + n * ys[0] + oh * ys[2] + ow * ys[3];
                    for (int64_t c = 0; c < C; c++) {
                        int32_t r = adaptive ? (int32_t)std::nearbyint(std::fma((float)acc[c], inv, (float)zp))
                                             : (int32_t)std::nearbyint((float)acc[c] * m) + zp;
                        yp[c * ys[1]] = (T)std::min(std::max(r, lo), hi);
                    }
                }
    }
}

extern "C" void flm_avg_pool2d_int8(int is_signed, int64_t N, int64_t C, int64_t OH, int64_t OW, const int64_t* xs,
                                    const int64_t* ys, const void* x, void* y, const int64_t* hs, const int64_t* hl,
                                    const int64_t* hd, const int64_t* ws, const int64_t* wl, const int64_t* wd,
                                    int32_t zp, int adaptive, int threads) {
    if (is_signed)
        avg_pool2d_int8<int8_t>(N, C, OH, OW, xs, ys, (const int8_t*)x, (int8_t*)y, hs, hl, hd, ws, wl, wd, zp,
                                adaptive, -128, 127, threads);
    else
        avg_pool2d_int8<uint8_t>(N, C, OH, OW, xs, ys, (const uint8_t*)x, (uint8_t*)y, hs, hl, hd, ws, wl, wd, zp,
                                 adaptive, 0, 255, threads);
}

// ---- ReLU's select: out = (x < 0, or x <= 0 when inclusive) ? +0 : v, one pass -----------------------
// relu (v = x: -0.0 and NaN stay as they are) and its backward (v = the gradient, x the input or result:
// a NaN x passes the gradient, ATen's `x <= 0 ? 0 : g`). A compare and a blend per vector.
template <typename T>
static void zero_where_negative(int64_t n, const T* __restrict__ x, const T* __restrict__ v, T* __restrict__ out,
                                int inclusive, int threads) {
    if (inclusive) {
#pragma omp parallel for simd schedule(static) num_threads(threads)
        for (int64_t i = 0; i < n; i++) out[i] = x[i] <= T(0) ? T(0) : v[i];
    } else {
#pragma omp parallel for simd schedule(static) num_threads(threads)
        for (int64_t i = 0; i < n; i++) out[i] = x[i] < T(0) ? T(0) : v[i];
    }
}

extern "C" void flm_zero_where_negative_f32(int64_t n, const float* x, const float* v, float* out, int inclusive,
                                            int threads) {
    zero_where_negative(n, x, v, out, inclusive, threads);
}

extern "C" void flm_zero_where_negative_f64(int64_t n, const double* x, const double* v, double* out, int inclusive,
                                            int threads) {
    zero_where_negative(n, x, v, out, inclusive, threads);
}

// ---- batched outer products (a product over an inner size of 1: vmap's per-example gradients) -------
// out[p][i][j] = a[p][i] * b[p][j] + 0.0f, out C-contiguous (B, M, N): one pass over the output where
// NumPy takes two (the broadcast product, then + 0 so that a -0.0 product is +0.0, the sum from zero
// of PyTorch's bmm). A contracted FMA with the + 0 rounds the exact product once: the same value.
extern "C" void flm_batched_outer_f32(int64_t B, int64_t M, int64_t N, const float* a, int64_t sab, int64_t sam,
                                      const float* b, int64_t sbb, int64_t sbn, float* out, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < B; p++) {
        const float* __restrict__ bp = b + p * sbb;
        for (int64_t i = 0; i < M; i++) {
            const float s = a[p * sab + i * sam];
            float* __restrict__ o = out + (p * M + i) * N;
            if (sbn == 1) {
#pragma omp simd
                for (int64_t j = 0; j < N; j++) o[j] = s * bp[j] + 0.0f;
            } else {
                for (int64_t j = 0; j < N; j++) o[j] = s * bp[j * sbn] + 0.0f;
            }
        }
    }
}

// ---- scatter-add of each plane's values at flat indices (max pooling's backward) ------------------
// gx (planes x P) = 0, then gx[p][idx[p][j]] += g[p][j] in j order, in float32 (ATen's CPU loop:
// bit for bit also where windows overlap). Returns the first plane holding an index outside
// [0, P) (nothing of it written), or -1.
extern "C" int64_t flm_plane_scatter_add_f32(int64_t planes, int64_t P, int64_t Q, const float* g,
                                             const int64_t* idx, float* gx) {
    for (int64_t p = 0; p < planes; p++) {
        const int64_t* ip = idx + p * Q;
        for (int64_t j = 0; j < Q; j++)
            if (ip[j] < 0 || ip[j] >= P) return p;
    }
    std::memset(gx, 0, sizeof(float) * planes * P);
    for (int64_t p = 0; p < planes; p++) {
        const float* gp = g + p * Q;
        const int64_t* ip = idx + p * Q;
        float* out = gx + p * P;
        for (int64_t j = 0; j < Q; j++) out[ip[j]] += gp[j];
    }
    return -1;
}
