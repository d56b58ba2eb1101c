/* Prefill GEMM on int8 tensor cores (mma.sync m16n8k32 / m16n8k16, s8 x s8 -> s32, sm_80+): the math shared by
 * the device kernel (qsc_fast.cuh) and its host emulation (qsc_fast_host.cuh), as __host__ __device__ code.
 *
 * Numeric scheme = k_matmul's (qsc_common.cuh): the same repacked weights, the same int8 activations (Q8_0/Q8_1
 * per 32, Q8_K per 256), exact int32 sums within each scale unit, one float product per (row, column, scale
 * group). Only the order of the float additions differs, so results match k_matmul to float rounding.
 *
 * Tiling: a block of MMA_THREADS = 128 threads (4 warps) computes BM = 64 weight rows x BN = 64 activation columns.
 * K advances in stages of KT = 256 elements: every thread decodes its share of the 64 x 256 weight tile into int8
 * (plus its scales) and copies its share of the 64 x 256 activation tile into shared memory (MmaSmem); then warp w
 * takes rows 32 * (w & 1) .. +31 and columns 32 * (w >> 1) .. +31: 2 x 4 MMA tiles of 16 x 8 per K chunk.
 *
 * The warp-level code (mma_stage, mma_store) is written once for LANES lanes of per-lane state: the device runs it
 * with LANES = 1 (this thread's lane, the MMA an instruction), the host emulation with LANES = 32 (all lanes of a
 * warp, the MMA emulated from the fragment layouts below). */
#pragma once

#include <stdlib.h>

#include "qsc_common.cuh"

/* ------------------------------------------------------------------------------------------------------------------
 * Fragment layouts of mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 (PTX ISA, "Matrix Fragments for mma.m16n8k32
 * with integer type"): g = lane >> 2 (groupID), t = lane & 3 (threadID_in_group).
 *   A (16 x 32, row-major): 16 int8 per thread in 4 registers; element i (register i / 4, byte i % 4) is
 *       row g (+8 for registers 1 and 3), column 4t + i % 4 (+16 for registers 2 and 3).
 *   B (32 x 8, "col": column n's K values contiguous): 8 int8 in 2 registers; element i is
 *       row (K index) 4t + i % 4 (+16 for register 1), column g.
 *   C/D (16 x 8 int32): 4 values; element i is row g (+8 for i >= 2), column 2t + i % 2.
 * m16n8k16 (used for Q6_K, whose scales cover 16 elements) is the first half: A registers 0-1, B register 0, the
 * same C. Every register holds 4 consecutive K values, so a fragment register is one aligned 32-bit load. */
HD int mma_a_row(int lane, int i) { return (lane >> 2) + 8 * ((i >> 2) & 1); }
HD int mma_a_col(int lane, int i) { return 4 * (lane & 3) + (i & 3) + 16 * (i >> 3); }
HD int mma_b_row(int lane, int i) { return 4 * (lane & 3) + (i & 3) + 16 * (i >> 2); }
HD int mma_b_col(int lane, int i) { return (lane >> 2) + 0 * i; }
HD int mma_c_row(int lane, int i) { return (lane >> 2) + 8 * (i >> 1); }
HD int mma_c_col(int lane, int i) { return 2 * (lane & 3) + (i & 1); }

/* Fragments of the KS-wide (16 or 32) K chunk at column k0 of row-major int8 tiles: A rows r0.. of a (stride lda),
 * B = rows n0.. of b read as columns (b[n][k], stride ldb: an activation row is a column of B). */
template <int KS> HD void mma_frag_a(int lane, const int8_t *a, int lda, int r0, int k0, int (&f)[4]) {
#pragma unroll
    for (int r = 0; r < KS / 8; ++r) f[r] = ld_i32(a + (r0 + mma_a_row(lane, 4 * r)) * lda + k0 + mma_a_col(lane, 4 * r));
}
template <int KS> HD void mma_frag_b(int lane, const int8_t *b, int ldb, int n0, int k0, int (&f)[2]) {
#pragma unroll
    for (int r = 0; r < KS / 16; ++r) f[r] = ld_i32(b + (n0 + mma_b_col(lane, 4 * r)) * ldb + k0 + mma_b_row(lane, 4 * r));
}

HD int byte_of(int v, int i) { return (int)(int8_t)(v >> (8 * i)); }

/* C += A x B for one 16 x 8 tile, a warp-wide operation on LANES lanes' fragments (a[l], b[l], c[l]). */
template <int KS, int LANES>
HD void mma_tile(const int (&a)[LANES][4], const int (&b)[LANES][2], int (&c)[LANES][4]) {
#ifdef __CUDA_ARCH__
#if __CUDA_ARCH__ >= 800
    /* LANES == 1 (one lane per thread); other instantiations come from host-only callers and never run here */
    if (LANES != 1) __trap();
    else if (KS == 32)
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+r"(c[0][0]), "+r"(c[0][1]), "+r"(c[0][2]), "+r"(c[0][3])
                     : "r"(a[0][0]), "r"(a[0][1]), "r"(a[0][2]), "r"(a[0][3]), "r"(b[0][0]), "r"(b[0][1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                     : "+r"(c[0][0]), "+r"(c[0][1]), "+r"(c[0][2]), "+r"(c[0][3])
                     : "r"(a[0][0]), "r"(a[0][1]), "r"(b[0][0]));
#else
    __trap(); /* never launched: mma_available() sees this image's PTX version */
#endif
#else
    if (LANES != 32) abort(); /* the host emulates whole warps */
    int A[16][32], B[32][8];
    for (int l = 0; l < 32; ++l) {
        for (int i = 0; i < KS / 2; ++i) A[mma_a_row(l, i)][mma_a_col(l, i)] = byte_of(a[l][i >> 2], i & 3);
        for (int i = 0; i < KS / 4; ++i) B[mma_b_row(l, i)][mma_b_col(l, i)] = byte_of(b[l][i >> 2], i & 3);
    }
    for (int l = 0; l < 32; ++l)
        for (int i = 0; i < 4; ++i) {
            int s = 0;
            for (int k = 0; k < KS; ++k) s += A[mma_c_row(l, i)][k] * B[k][mma_c_col(l, i)];
            c[l][i] += s;
        }
#endif
}

/* ------------------------------------------------------------------------------------------------------------------
 * Tile geometry, shared memory and the per-type traits. */
constexpr int MMA_BM = 64, MMA_BN = 64, MMA_KT = 256, MMA_THREADS = 128, MMA_LD = MMA_KT + 16;
/* LD: a row is 272 bytes = 68 words, so the 8 rows x 4 words of a fragment load fall in 32 different banks. */

struct __align__(16) MmaSmem {
    int8_t a[MMA_BM][MMA_LD]; /* weights, decoded to int8 */
    int8_t b[MMA_BN][MMA_LD]; /* activations */
    int8_t isc[MMA_BM][16];   /* integer scale per K chunk (Q4_K: 8 sub-blocks of 32, Q6_K: 16 of 16) */
    int8_t imin[MMA_BM][8];   /* Q4_K: 6-bit min per sub-block */
    float wd[MMA_BM][8];      /* per (row, group): d (all types) */
    float wm[MMA_BM][8];      /* Q4_1: m; Q4_K: dmin */
    float ad[MMA_BN][8];      /* per (column, group): activation scale */
    float as[MMA_BN][8];      /* Q4_1: Q8_1 sum d * sum(q) */
};

/* NG scale groups of GK elements per stage, each of GK / KS chunks of KS elements under one integer scale. */
template <int TYPE> struct MmaTraits {
    static constexpr bool ok = false;
};
#define QSC_MMA_TRAITS(T, ng, ks)                                                                                  \
    template <> struct MmaTraits<T> {                                                                             \
        static constexpr bool ok = true;                                                                          \
        static constexpr int NG = ng, GK = MMA_KT / ng, KS = ks, CPG = GK / ks;                                   \
    };
QSC_MMA_TRAITS(T_Q4_0, 8, 32)
QSC_MMA_TRAITS(T_Q4_1, 8, 32)
QSC_MMA_TRAITS(T_Q5_0, 8, 32)
QSC_MMA_TRAITS(T_Q8_0, 8, 32)
QSC_MMA_TRAITS(T_Q4_K, 1, 32)
QSC_MMA_TRAITS(T_Q6_K, 1, 16)
#undef QSC_MMA_TRAITS

/* Host side: does a matrix of this type and width run on the MMA path? */
static inline bool mma_type_ok(int type, int64_t k) {
    const bool t = type == T_Q4_0 || type == T_Q4_1 || type == T_Q5_0 || type == T_Q8_0 || type == T_Q4_K ||
                   type == T_Q6_K;
    return t && k > 0 && k % MMA_KT == 0;
}

/* ------------------------------------------------------------------------------------------------------------------
 * Stage loads: thread tid of nthr decodes 32-element pieces (piece p of row r = elements 32p..32p+31 of the stage;
 * consecutive threads take consecutive pieces, so a warp reads consecutive bytes of the repacked fields). */
HD void st_i32(int8_t *p, int v) {
#ifdef __CUDA_ARCH__
    *(int *)p = v;
#else
    memcpy(p, &v, 4);
#endif
}
HD void st_i4(int8_t *p, int4 v) {
#ifdef __CUDA_ARCH__
    *(int4 *)p = v;
#else
    memcpy(p, &v, 16);
#endif
}

template <int TYPE>
HD void mma_decode_piece(const QW &w, int64_t row, int kb, int p, int8_t *dst, MmaSmem &s, int r) {
    if (TYPE == T_Q4_0 || TYPE == T_Q4_1 || TYPE == T_Q5_0) {
        const int64_t b = row * w.nb + kb * 8 + p;
        const int4 v = ld_i4(w.qs + b * 16);
        const int vw[4] = {v.x, v.y, v.z, v.w};
        const unsigned qh = TYPE == T_Q5_0 ? (unsigned)ld_i32(w.qh + b * 4) : 0u;
        for (int j = 0; j < 4; ++j) { /* bytes 4j..4j+3: elements 4j.. (low nibbles) and 16+4j.. (high) */
            int lo = vw[j] & 0x0F0F0F0F, hi = (vw[j] >> 4) & 0x0F0F0F0F;
            if (TYPE == T_Q4_0) { lo = sext4_minus8(lo); hi = sext4_minus8(hi); }
            if (TYPE == T_Q5_0) {
                lo = sext5_minus16(lo | spread4_bit4((qh >> (4 * j)) & 15u));
                hi = sext5_minus16(hi | spread4_bit4((qh >> (16 + 4 * j)) & 15u));
            }
            st_i32(dst + 4 * j, lo);
            st_i32(dst + 16 + 4 * j, hi);
        }
        s.wd[r][p] = TYPE == T_Q4_1 ? h2f(w.d[2 * b]) : h2f(w.d[b]);
        if (TYPE == T_Q4_1) s.wm[r][p] = h2f(w.d[2 * b + 1]);
    } else if (TYPE == T_Q8_0) {
        const int64_t b = row * w.nb + kb * 8 + p;
        st_i4(dst, ld_i4(w.qs + b * 32));
        st_i4(dst + 16, ld_i4(w.qs + b * 32 + 16));
        s.wd[r][p] = h2f(w.d[b]);
    } else if (TYPE == T_Q4_K) { /* sub-block p: nibble p & 1 of qs[32 (p / 2) ..] */
        const int64_t b = row * w.nb + kb;
        const uint8_t *q = w.qs + b * 128 + 32 * (p >> 1);
        const int sh = 4 * (p & 1);
        for (int j = 0; j < 8; ++j) st_i32(dst + 4 * j, (ld_i32(q + 4 * j) >> sh) & 0x0F0F0F0F);
        s.isc[r][p] = (int8_t)w.sc[b * 16 + p];
        s.imin[r][p] = (int8_t)w.sc[b * 16 + 8 + p];
        if (p == 0) { s.wd[r][0] = h2f(w.d[2 * b]); s.wm[r][0] = h2f(w.d[2 * b + 1]); }
    } else if (TYPE == T_Q6_K) { /* elements 32p + l: half hh = p / 4, group g = p % 4 (see Unit<T_Q6_K>) */
        const int64_t b = row * w.nb + kb;
        const int hh = p >> 2, g = p & 3;
        const uint8_t *ql = w.qs + b * 128 + 64 * hh + 32 * (g & 1), *qh = w.qh + b * 64 + 32 * hh;
        for (int j = 0; j < 8; ++j) {
            const int lo = (ld_i32(ql + 4 * j) >> (4 * (g >> 1))) & 0x0F0F0F0F;
            const int hi = ((ld_i32(qh + 4 * j) >> (2 * g)) & 0x03030303) << 4;
            st_i32(dst + 4 * j, sext6_minus32(lo | hi));
        }
        const int8_t *sc = (const int8_t *)(w.sc + b * 16);
        s.isc[r][2 * p] = sc[2 * p];
        s.isc[r][2 * p + 1] = sc[2 * p + 1];
        if (p == 0) s.wd[r][0] = h2f(w.d[b]);
    }
}

/* The stage-kb weight tile: rows row0..row0+BM-1 (rows past the matrix: zeros). */
template <int TYPE> HD void mma_load_w(const QW &w, int64_t row0, int kb, MmaSmem &s, int tid, int nthr) {
    for (int idx = tid; idx < MMA_BM * 8; idx += nthr) {
        const int r = idx >> 3, p = idx & 7;
        int8_t *dst = &s.a[r][32 * p];
        if (row0 + r < w.rows) {
            mma_decode_piece<TYPE>(w, row0 + r, kb, p, dst, s, r);
        } else {
            st_i4(dst, make_int4(0, 0, 0, 0));
            st_i4(dst + 16, make_int4(0, 0, 0, 0));
            s.wd[r][p] = 0.0f;
            s.wm[r][p] = 0.0f;
            s.isc[r][2 * p] = s.isc[r][2 * p + 1] = 0;
            s.imin[r][p] = 0;
        }
    }
}

/* The stage-kb activation tile: columns col0..col0+BN-1 of a (columns past ncols: zeros). */
template <bool K256> HD void mma_load_x(const Act &a, int64_t col0, int ncols, int kb, MmaSmem &s, int tid, int nthr) {
    for (int idx = tid; idx < MMA_BN * 8; idx += nthr) {
        const int c = idx >> 3, p = idx & 7;
        int8_t *dst = &s.b[c][32 * p];
        if (c < ncols) {
            const int64_t col = col0 + c;
            const int8_t *x = a.qs + col * a.k + (int64_t)kb * MMA_KT + 32 * p;
            st_i4(dst, ld_i4(x));
            st_i4(dst + 16, ld_i4(x + 16));
            if (K256) {
                if (p == 0) s.ad[c][0] = a.d[col * (a.k / 256) + kb];
            } else {
                const int64_t xb = col * (a.k / 32) + kb * 8 + p;
                s.ad[c][p] = a.d[xb];
                s.as[c][p] = a.s ? a.s[xb] : 0.0f;
            }
        } else {
            st_i4(dst, make_int4(0, 0, 0, 0));
            st_i4(dst + 16, make_int4(0, 0, 0, 0));
            s.ad[c][p] = s.as[c][p] = 0.0f;
        }
    }
}

/* ------------------------------------------------------------------------------------------------------------------
 * Warp compute. Per lane: acc[mt][nt][i] (float) for C element i of tile (mt, nt): row 32 wm + 16 mt + c_row,
 * column 32 wn + 8 nt + c_col of the block tile. */
struct MmaLane {
    float acc[2][4][4];
};

template <int LANES> HD void mma_zero(MmaLane (&st)[LANES]) {
    for (int l = 0; l < LANES; ++l)
        for (int m = 0; m < 2; ++m)
            for (int n = 0; n < 4; ++n)
                for (int i = 0; i < 4; ++i) st[l].acc[m][n][i] = 0.0f;
}

/* One stage of warp `warp`; lane0 = the first lane of the LANES held (device: this thread's lane, host: 0).
 * A lane's 32 C elements lie in 4 rows (tile m, C half h: row rb + 16 m + mma_c_row(lane, 2 h)) and 8 columns
 * (tile n, j: cb + 8 n + mma_c_col(lane, j)), so the scales are read from shared memory once per row / column. */
template <int TYPE, int LANES> HD void mma_stage(const MmaSmem &s, int warp, int lane0, MmaLane (&st)[LANES]) {
    using TR = MmaTraits<TYPE>;
    const int rb = 32 * (warp & 1), cb = 32 * (warp >> 1);
    for (int g = 0; g < TR::NG; ++g) {
        constexpr bool MINS = TYPE == T_Q4_K;
        int sumi[LANES][2][4][4], msum[2][4][LANES][4]; /* msum: accumulated by the MMA itself */
        for (int l = 0; l < LANES; ++l)
            for (int m = 0; m < 2; ++m)
                for (int n = 0; n < 4; ++n)
                    for (int i = 0; i < 4; ++i) sumi[l][m][n][i] = msum[m][n][l][i] = 0;
        for (int ch = 0; ch < TR::CPG; ++ch) {
            const int k0 = g * TR::GK + ch * TR::KS, chunk = k0 / TR::KS;
            /* fm: Q4_K's min term on the tensor cores too: the sub-block's 6-bit min in every byte of an A
             * fragment, times the activations, is min x (their sum over the sub-block) = min x bsum */
            int fa[2][LANES][4], fm[2][LANES][4], fb[4][LANES][2], isc[LANES][2][2];
#pragma unroll
            for (int l = 0; l < LANES; ++l) {
#pragma unroll
                for (int m = 0; m < 2; ++m) {
                    mma_frag_a<TR::KS>(lane0 + l, &s.a[0][0], MMA_LD, rb + 16 * m, k0, fa[m][l]);
                    for (int h = 0; h < 2; ++h)
                        isc[l][m][h] = TR::CPG > 1 ? (int)s.isc[rb + 16 * m + mma_c_row(lane0 + l, 2 * h)][chunk] : 1;
                    for (int r = 0; r < 4; ++r)
                        fm[m][l][r] = MINS ? (int)s.imin[rb + 16 * m + mma_a_row(lane0 + l, 4 * r)][chunk] * 0x01010101
                                           : 0;
                }
#pragma unroll
                for (int n = 0; n < 4; ++n) mma_frag_b<TR::KS>(lane0 + l, &s.b[0][0], MMA_LD, cb + 8 * n, k0, fb[n][l]);
            }
#pragma unroll
            for (int m = 0; m < 2; ++m)
#pragma unroll
                for (int n = 0; n < 4; ++n) {
                    int c[LANES][4];
                    for (int l = 0; l < LANES; ++l)
                        for (int i = 0; i < 4; ++i) c[l][i] = 0;
                    mma_tile<TR::KS, LANES>(fa[m], fb[n], c);
                    for (int l = 0; l < LANES; ++l)
                        for (int i = 0; i < 4; ++i) sumi[l][m][n][i] += isc[l][m][i >> 1] * c[l][i];
                    if (MINS) mma_tile<TR::KS, LANES>(fm[m], fb[n], msum[m][n]); /* exact: |msum| < 2^21 */
                }
        }
        /* the group's float epilogue: acc += d_w d_x sumi (+ Q4_1's m_w s_x, - Q4_K's dmin d_x msum) */
        for (int l = 0; l < LANES; ++l) {
            float wd[2][2], wm[2][2], ad[4][2], as[4][2];
            for (int m = 0; m < 2; ++m)
                for (int h = 0; h < 2; ++h) {
                    const int row = rb + 16 * m + mma_c_row(lane0 + l, 2 * h);
                    wd[m][h] = s.wd[row][g];
                    wm[m][h] = s.wm[row][g];
                }
            for (int n = 0; n < 4; ++n)
                for (int j = 0; j < 2; ++j) {
                    const int col = cb + 8 * n + mma_c_col(lane0 + l, j);
                    ad[n][j] = s.ad[col][g];
                    as[n][j] = s.as[col][g];
                }
            for (int m = 0; m < 2; ++m)
                for (int n = 0; n < 4; ++n)
                    for (int i = 0; i < 4; ++i) {
                        const int h = i >> 1, j = i & 1;
                        float v = wd[m][h] * ad[n][j] * (float)sumi[l][m][n][i];
                        if (TYPE == T_Q4_1) v += wm[m][h] * as[n][j];
                        if (MINS) v -= wm[m][h] * ad[n][j] * (float)msum[m][n][l][i];
                        st[l].acc[m][n][i] += v;
                    }
        }
    }
}

/* y[col][row] = acc (+ bias[row]) for the rows < rows and columns < ncols of the block tile at (row0, col0). */
template <int LANES>
HD void mma_store(const MmaLane (&st)[LANES], int warp, int lane0, int64_t row0, int64_t col0, int64_t rows,
                  int ncols, float *y, int64_t ldy, const float *bias) {
    const int rb = 32 * (warp & 1), cb = 32 * (warp >> 1);
    for (int l = 0; l < LANES; ++l)
        for (int m = 0; m < 2; ++m)
            for (int n = 0; n < 4; ++n)
                for (int i = 0; i < 4; ++i) {
                    const int64_t row = row0 + rb + 16 * m + mma_c_row(lane0 + l, i);
                    const int c = cb + 8 * n + mma_c_col(lane0 + l, i);
                    if (row < rows && c < ncols) y[(col0 + c) * ldy + row] = st[l].acc[m][n][i] + (bias ? bias[row] : 0.0f);
                }
}
