/* Prefill GEMM on tensor cores (mma.sync m16n8k32 / m16n8k16, s8 x s8 -> s32, and for F16 / BF16 weights
 * m16n8k16 f16 / bf16 -> f32, sm_80+): the math shared by the device kernel (qsc_fast.cuh) and its host emulation
 * (qsc_fast_host.cuh), as __host__ __device__ code.
 *
 * Numeric scheme = k_matmul's (qsc_common.cuh): the same repacked weights, the same int8 activations (Q8_0/Q8_1
 * per 32, Q8_K per 256), exact int32 sums within each scale unit, one float product per (row, column, scale
 * group). Only the order of the float additions differs, so results match k_matmul to float rounding.
 *
 * Float types (F16, BF16: their room's QSC_FLOAT_MMA) keep the weights as stored and round the float activations
 * to the same 16-bit format (the CPU dot's rounding); products of two 16-bit values are exact in fp32, so only the
 * order of the fp32 additions differs from k_matmul. Their tiles are the int8 tiles' bytes: a stage is 128
 * elements (256 bytes a row), and the f16 m16n8k16 fragments are the s8 m16n8k32 fragments of the same bytes
 * (register r of A: row g + 8 (r & 1), bytes 4t + 16 (r >> 1); of B: bytes 4t + 16 r), so one fragment load serves
 * both.
 *
 * Tiling: a block of MMA_THREADS = 128 threads (4 warps) computes BM = 64 weight rows x BN = 64 activation columns.
 * K advances in stages of KT = 256 elements (float types: 128): every thread decodes its share of the 64 x 256 weight tile into int8
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
 * B = rows n0.. of b read as columns (b[n][k], stride ldb: an activation row is a column of B).
 * LDM (device, sm_80+, shared memory): the same registers by ldmatrix (m8n8 .b16, no .trans: register j of lane L
 * = word L & 3 of row L >> 2 of 8 x 16-byte matrix j, whose rows' addresses lanes 8j..8j+7 give). A register j is
 * row g + 8 (j & 1), bytes 16 (j >> 1) + 4t: matrix j = rows r0 + 8 (j & 1).., bytes k0 + 16 (j >> 1) (x4; KS 16:
 * the first two, x2); B register j = column g, bytes 16 j + 4t: matrix j = rows n0.., bytes k0 + 16 j (x2; x1).
 * Rows and k0 are 16-byte aligned (MMA_LD = 272). */
template <int KS, bool LDM = false> HD void mma_frag_a(int lane, const int8_t *a, int lda, int r0, int k0, int (&f)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (LDM) {
        const unsigned p = (unsigned)__cvta_generic_to_shared(a + (r0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * lda + k0 +
                                                              (KS == 32 ? 16 * (lane >> 4) : 0));
        if (KS == 32)
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3]) : "r"(p));
        else asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(f[0]), "=r"(f[1]) : "r"(p));
    } else
#endif
    {
#pragma unroll
        for (int r = 0; r < KS / 8; ++r) f[r] = ld_i32(a + (r0 + mma_a_row(lane, 4 * r)) * lda + k0 + mma_a_col(lane, 4 * r));
    }
}
template <int KS, bool LDM = false> HD void mma_frag_b(int lane, const int8_t *b, int ldb, int n0, int k0, int (&f)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (LDM) {
        const unsigned p =
            (unsigned)__cvta_generic_to_shared(b + (n0 + (lane & 7)) * ldb + k0 + (KS == 32 ? 16 * ((lane >> 3) & 1) : 0));
        if (KS == 32) asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(f[0]), "=r"(f[1]) : "r"(p));
        else asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(f[0]) : "r"(p));
    } else
#endif
    {
#pragma unroll
        for (int r = 0; r < KS / 16; ++r) f[r] = ld_i32(b + (n0 + mma_b_col(lane, 4 * r)) * ldb + k0 + mma_b_row(lane, 4 * r));
    }
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

/* C += A x B for one 16 x 8 tile of 16-bit floats (m16n8k16, fp32 accumulators; BF: bf16, else f16), on the
 * fragments of the s8 m16n8k32 layout read as pairs of 16-bit values; U::mma_unpack turns one back into a float
 * (host emulation: the 16 exact products added in K order in fp32, then added to C). */
template <int TYPE, int LANES>
HD void mma_tile_f(const int (&a)[LANES][4], const int (&b)[LANES][2], float (&c)[LANES][4]) {
#ifdef __CUDA_ARCH__
#if __CUDA_ARCH__ >= 800
    if (LANES != 1) __trap();
    else if (TYPE == T_BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(c[0][0]), "+f"(c[0][1]), "+f"(c[0][2]), "+f"(c[0][3])
                     : "r"(a[0][0]), "r"(a[0][1]), "r"(a[0][2]), "r"(a[0][3]), "r"(b[0][0]), "r"(b[0][1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(c[0][0]), "+f"(c[0][1]), "+f"(c[0][2]), "+f"(c[0][3])
                     : "r"(a[0][0]), "r"(a[0][1]), "r"(a[0][2]), "r"(a[0][3]), "r"(b[0][0]), "r"(b[0][1]));
#else
    __trap();
#endif
#else
    if (LANES != 32) abort();
    uint8_t A[16][32], B[32][8]; /* the bytes, placed as the s8 m16n8k32 fragments place them */
    for (int l = 0; l < 32; ++l) {
        for (int i = 0; i < 16; ++i) A[mma_a_row(l, i)][mma_a_col(l, i)] = (uint8_t)(a[l][i >> 2] >> (8 * (i & 3)));
        for (int i = 0; i < 8; ++i) B[mma_b_row(l, i)][mma_b_col(l, i)] = (uint8_t)(b[l][i >> 2] >> (8 * (i & 3)));
    }
    using U = Unit<TYPE>;
    for (int l = 0; l < 32; ++l)
        for (int i = 0; i < 4; ++i) {
            const int r = mma_c_row(l, i), n = mma_c_col(l, i);
            float s = 0.0f;
            for (int k = 0; k < 16; ++k)
                s += U::mma_unpack(A[r][2 * k] | (unsigned)A[r][2 * k + 1] << 8) *
                     U::mma_unpack(B[2 * k][n] | (unsigned)B[2 * k + 1][n] << 8);
            c[l][i] += s;
        }
#endif
}

/* ------------------------------------------------------------------------------------------------------------------
 * Tile geometry, shared memory and the per-type traits. */
constexpr int MMA_BM = 64, MMA_BN = 64, MMA_KT = 256, MMA_THREADS = 128, MMA_LD = MMA_KT + 16;
/* LD: a row is 272 bytes = 68 words, so the 8 rows x 4 words of a fragment load fall in 32 different banks. */

struct __align__(16) MmaSmem {
    int8_t a[MMA_BM][MMA_LD]; /* weights, decoded to int8 (float types: 128 16-bit values a row) */
    int8_t b[MMA_BN][MMA_LD]; /* activations (float types: rounded to the weights' 16-bit format) */
    int8_t isc[MMA_BM][16];   /* integer scale per K chunk (Q4_K: 8 sub-blocks of 32, Q6_K: 16 of 16) */
    int8_t imin[MMA_BM][16];  /* MINS: the min of each 16 elements (Q4_K, Q5_K: a sub-block's, twice; Q2_K) */
    float wd[MMA_BM][16];     /* per (row, group): d (all integer types; NVFP4 has 16 groups of 16) */
    float wm[MMA_BM][8];      /* Q4_1: m; Q4_K: dmin */
    float ad[MMA_BN][8];      /* per (column, group): activation scale */
    float as[MMA_BN][8];      /* Q4_1: Q8_1 sum d * sum(q) */
    int8_t bsh[MMA_BN][16];   /* Q8_K activations: the stage's 16 block sums bs = 16 bsh + bsl (bsh -128..127, */
    int8_t bsl[MMA_BN][16];   /* bsl 0..15), so that the mins' products with them are two int8 MMAs */
};

/* A type's MMA geometry, from its room (qsc_types.cuh): NG scale groups of GK elements per stage, each of GK / KS
 * chunks of KS elements under one integer scale; MINS: an integer min per 16 elements times the Q8_K block sums (Q2_K,
 * Q4_K, Q5_K), XSUM: m times the Q8_1 sum (Q4_1, Q5_1); FLOAT: 16-bit float weights and activations, SK elements a
 * stage (128; the integer types 256). Group g's activation scale is ad[col][g * 8 / NG] (Q8_0 blocks of 32: NVFP4's
 * two groups of 16 share one). Only the types of QSC_FOR_MMA_TYPES instantiate it. */
template <int TYPE> struct MmaTraits {
    using U = Unit<TYPE>;
    static constexpr bool FLOAT = TypeCaps<TYPE>::ACTF == ACT_F;
    static constexpr int NG = U::MMA_NG, GK = MMA_KT / NG, KS = U::MMA_KS, CPG = GK / KS, SK = FLOAT ? MMA_KT / 2 : MMA_KT;
    static constexpr bool MINS = U::MMA_MIN, XSUM = U::MMA_XSUM, K256 = TypeCaps<TYPE>::ACTF == ACT_256;
    static_assert(!MINS || (NG == 1 && K256), "the mins' term is one per stage, from the Q8_K block sums");
    static_assert(NG <= 16 && (K256 || FLOAT || NG >= 8), "wd holds 16 groups; a Q8_0 block's d covers 32");
};

/* Host side: does a matrix of this type and width run on the MMA path? */
static inline bool mma_type_ok(int type, int64_t k) { return type_desc(type).mma && k > 0 && k % MMA_KT == 0; }

/* ------------------------------------------------------------------------------------------------------------------
 * A launch of up to three products over the same ncols activation columns (q, k and v of one projection step, or
 * gate and up): segment i owns blockIdx.x seg[i].blk0 .. seg[i + 1].blk0 - 1, rows_per_block rows per block
 * (k_matmul_mma: MMA_BM, k_gemv: GEMV_WARPS), and writes y[col * ldy + row] (+ bias[row]). The device launchers
 * (qsc_fast.cuh) and the host twins (qsc_fast_host.cuh) lay the segments out and find a block's segment with the
 * same two functions, so the emulated model runs the device's bookkeeping. */
struct MmaSeg {
    QW w;
    Act a;
    float *y;
    int64_t ldy;
    const float *bias;
    int blk0; /* first blockIdx.x of this segment */
};
struct MmaArgs {
    MmaSeg seg[3];
    int nseg, ncols;
};

/* Sets each segment's blk0, end to end; returns the blocks along x. */
static inline int mma_lay_out(MmaArgs &args, int rows_per_block) {
    int blocks = 0;
    for (int i = 0; i < args.nseg; ++i) {
        args.seg[i].blk0 = blocks;
        blocks += (int)((args.seg[i].w.rows + rows_per_block - 1) / rows_per_block);
    }
    return blocks;
}

/* The segment block bx belongs to (block-uniform). */
HD int mma_seg_of(const MmaArgs &args, int bx) {
    int si = 0;
    if (args.nseg > 1 && bx >= args.seg[1].blk0) si = 1;
    if (args.nseg > 2 && bx >= args.seg[2].blk0) si = 2;
    return si;
}

/* k_matmul_mma's grid on the host: every block of every segment through the tile loop below, with LANES = 32
 * (qsc_fast_host.cuh; args as given to launch_matmul_mma, blk0 laid out here). */
void emu_matmul_mma(MmaArgs args);

/* ------------------------------------------------------------------------------------------------------------------
 * Stage loads: thread tid of nthr decodes 32-element pieces (piece p of row r = elements 32p..32p+31 of the stage;
 * consecutive threads take consecutive pieces, so a warp reads consecutive bytes of the repacked fields): the type's
 * mma_piece (its room in qsc_types.cuh) writes the piece's int8 values and its scales into MmaSmem.
 * The stage-kb weight tile: rows row0..row0+BM-1 (rows past the matrix: zeros). */
template <int TYPE> HD void mma_load_w(const QW &w, int64_t row0, int kb, MmaSmem &s, int tid, int nthr) {
    for (int idx = tid; idx < MMA_BM * 8; idx += nthr) {
        const int r = idx >> 3, p = idx & 7;
        int8_t *dst = &s.a[r][32 * p];
        if (row0 + r < w.rows) {
            Unit<TYPE>::mma_piece(w, row0 + r, kb, p, dst, s, r);
        } else {
            st_i4(dst, make_int4(0, 0, 0, 0));
            st_i4(dst + 16, make_int4(0, 0, 0, 0));
            s.wd[r][2 * p] = s.wd[r][2 * p + 1] = 0.0f;
            s.wm[r][p] = 0.0f;
            s.isc[r][2 * p] = s.isc[r][2 * p + 1] = 0;
            s.imin[r][2 * p] = s.imin[r][2 * p + 1] = 0;
        }
    }
}

/* The stage-kb activation tile: columns col0..col0+BN-1 of a (columns past ncols: zeros). Float types: piece p =
 * the stage's 16 floats 16p.., as the room's 16-bit values. */
template <int TYPE> HD void mma_load_xf(const Act &a, int64_t col0, int ncols, int kb, MmaSmem &s, int tid, int nthr) {
    for (int idx = tid; idx < MMA_BN * 8; idx += nthr) {
            const int c = idx >> 3, p = idx & 7;
            int v[8] = {};
            if (c < ncols) {
                const float *x = a.f + (col0 + c) * a.k + (int64_t)kb * (MMA_KT / 2) + 16 * p;
                for (int i = 0; i < 4; ++i) {
                    const float4 f = ld_f4(x + 4 * i);
                    v[2 * i] = (int)Unit<TYPE>::mma_pack2(f.x, f.y);
                    v[2 * i + 1] = (int)Unit<TYPE>::mma_pack2(f.z, f.w);
                }
            }
            st_i4(&s.b[c][32 * p], make_int4(v[0], v[1], v[2], v[3]));
            st_i4(&s.b[c][32 * p + 16], make_int4(v[4], v[5], v[6], v[7]));
        }
}
/* RAW false: the scales only (the pipelined kernel copies the int8 values with cp.async). */
template <bool K256, bool RAW = true>
HD void mma_load_xq(const Act &a, int64_t col0, int ncols, int kb, MmaSmem &s, int tid, int nthr) {
    for (int idx = tid; idx < MMA_BN * 8; idx += nthr) {
        const int c = idx >> 3, p = idx & 7;
        int8_t *dst = &s.b[c][32 * p];
        if (c < ncols) {
            const int64_t col = col0 + c;
            const int8_t *x = a.qs + col * a.k + (int64_t)kb * MMA_KT + 32 * p;
            if (RAW) {
                st_i4(dst, ld_i4(x));
                st_i4(dst + 16, ld_i4(x + 16));
            }
            if (K256) {
                if (p == 0) s.ad[c][0] = a.d[col * (a.k / 256) + kb];
                for (int i = 2 * p; i < 2 * p + 2; ++i) {
                    const int bs = a.bs ? a.bs[col * (a.k / 16) + (int64_t)kb * 16 + i] : 0;
                    s.bsh[c][i] = (int8_t)(bs >> 4); /* floor(bs / 16): |bs| <= 16 * 128 */
                    s.bsl[c][i] = (int8_t)(bs & 15);
                }
            } else {
                const int64_t xb = col * (a.k / 32) + kb * 8 + p;
                s.ad[c][p] = a.d[xb];
                s.as[c][p] = a.s ? a.s[xb] : 0.0f;
            }
        } else {
            if (RAW) {
                st_i4(dst, make_int4(0, 0, 0, 0));
                st_i4(dst + 16, make_int4(0, 0, 0, 0));
            }
            s.ad[c][p] = s.as[c][p] = 0.0f;
            s.bsh[c][2 * p] = s.bsh[c][2 * p + 1] = s.bsl[c][2 * p] = s.bsl[c][2 * p + 1] = 0;
        }
    }
}
template <int TYPE> HD void mma_load_x(const Act &a, int64_t col0, int ncols, int kb, MmaSmem &s, int tid, int nthr) {
    if constexpr (MmaTraits<TYPE>::FLOAT) mma_load_xf<TYPE>(a, col0, ncols, kb, s, tid, nthr);
    else mma_load_xq<MmaTraits<TYPE>::K256>(a, col0, ncols, kb, s, tid, nthr);
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
/* Float types: 8 chunks of 16 values (32 bytes) a stage, each MMA adding into the accumulators. */
template <int TYPE, int LANES, bool LDM>
HD void mma_stage_f(const MmaSmem &s, const int8_t *bt, int warp, int lane0, MmaLane (&st)[LANES]) {
    const int rb = 32 * (warp & 1), cb = 32 * (warp >> 1);
    for (int ch = 0; ch < 8; ++ch) {
        int fa[2][LANES][4], fb[4][LANES][2];
        for (int l = 0; l < LANES; ++l) {
            for (int m = 0; m < 2; ++m) mma_frag_a<32, LDM>(lane0 + l, &s.a[0][0], MMA_LD, rb + 16 * m, 32 * ch, fa[m][l]);
            for (int n = 0; n < 4; ++n) mma_frag_b<32, LDM>(lane0 + l, bt, MMA_LD, cb + 8 * n, 32 * ch, fb[n][l]);
        }
        for (int m = 0; m < 2; ++m)
            for (int n = 0; n < 4; ++n) {
                float c[LANES][4];
                for (int l = 0; l < LANES; ++l)
                    for (int i = 0; i < 4; ++i) c[l][i] = st[l].acc[m][n][i];
                mma_tile_f<TYPE, LANES>(fa[m], fb[n], c);
                for (int l = 0; l < LANES; ++l)
                    for (int i = 0; i < 4; ++i) st[l].acc[m][n][i] = c[l][i];
            }
    }
}
/* Integer types: per scale group the chunks' int32 sums times their integer scales, then the group's float epilogue. */
template <int TYPE, int LANES, bool LDM>
HD void mma_stage_q(const MmaSmem &s, const int8_t *bt, int warp, int lane0, MmaLane (&st)[LANES]) {
    using TR = MmaTraits<TYPE>;
    const int rb = 32 * (warp & 1), cb = 32 * (warp >> 1);
    for (int g = 0; g < TR::NG; ++g) {
        constexpr bool MINS = TR::MINS;
        int sumi[LANES][2][4][4], msum[2][4][LANES][4]; /* msum: the mins times the block sums (MINS) */
        for (int l = 0; l < LANES; ++l)
            for (int m = 0; m < 2; ++m)
                for (int n = 0; n < 4; ++n)
                    for (int i = 0; i < 4; ++i) sumi[l][m][n][i] = msum[m][n][l][i] = 0;
        if (MINS) { /* NG = 1: the stage's min term Σ_j min_j bs_j (j: 16 elements) as 2 m16n8k16 MMAs, bsh and bsl */
            int fn[2][LANES][4], fh[4][LANES][2], fl[4][LANES][2];
            for (int l = 0; l < LANES; ++l) {
                for (int m = 0; m < 2; ++m) mma_frag_a<16>(lane0 + l, &s.imin[0][0], 16, rb + 16 * m, 0, fn[m][l]);
                for (int n = 0; n < 4; ++n) {
                    mma_frag_b<16>(lane0 + l, &s.bsh[0][0], 16, cb + 8 * n, 0, fh[n][l]);
                    mma_frag_b<16>(lane0 + l, &s.bsl[0][0], 16, cb + 8 * n, 0, fl[n][l]);
                }
            }
            for (int m = 0; m < 2; ++m)
                for (int n = 0; n < 4; ++n) {
                    int hi[LANES][4];
                    for (int l = 0; l < LANES; ++l)
                        for (int i = 0; i < 4; ++i) hi[l][i] = 0;
                    mma_tile<16, LANES>(fn[m], fh[n], hi);
                    mma_tile<16, LANES>(fn[m], fl[n], msum[m][n]);
                    for (int l = 0; l < LANES; ++l)
                        for (int i = 0; i < 4; ++i) msum[m][n][l][i] += 16 * hi[l][i]; /* exact: |msum| < 2^21 */
                }
        }
        for (int ch = 0; ch < TR::CPG; ++ch) {
            const int k0 = g * TR::GK + ch * TR::KS, chunk = k0 / TR::KS;
            int fa[2][LANES][4], fb[4][LANES][2], isc[LANES][2][2];
#pragma unroll
            for (int l = 0; l < LANES; ++l) {
#pragma unroll
                for (int m = 0; m < 2; ++m) {
                    mma_frag_a<TR::KS, LDM>(lane0 + l, &s.a[0][0], MMA_LD, rb + 16 * m, k0, fa[m][l]);
                    for (int h = 0; h < 2; ++h)
                        isc[l][m][h] = TR::CPG > 1 ? (int)s.isc[rb + 16 * m + mma_c_row(lane0 + l, 2 * h)][chunk] : 1;
                }
#pragma unroll
                for (int n = 0; n < 4; ++n) mma_frag_b<TR::KS, LDM>(lane0 + l, bt, MMA_LD, cb + 8 * n, k0, fb[n][l]);
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
                    ad[n][j] = s.ad[col][g * 8 / TR::NG];
                    as[n][j] = s.as[col][g * 8 / TR::NG];
                }
            for (int m = 0; m < 2; ++m)
                for (int n = 0; n < 4; ++n)
                    for (int i = 0; i < 4; ++i) {
                        const int h = i >> 1, j = i & 1;
                        float v = wd[m][h] * ad[n][j] * (float)sumi[l][m][n][i];
                        if (TR::XSUM) v += wm[m][h] * as[n][j];
                        if (MINS) v -= wm[m][h] * ad[n][j] * (float)msum[m][n][l][i];
                        st[l].acc[m][n][i] += v;
                    }
        }
    }
}

/* The stage of either kind; bt: the activation tile (s.b, or the pipelined kernel's other buffer), LDM: ldmatrix
 * fragment loads (device only; the same registers). */
template <int TYPE, int LANES, bool LDM = false>
HD void mma_stage(const MmaSmem &s, int warp, int lane0, MmaLane (&st)[LANES], const int8_t *bt = nullptr) {
    if (!bt) bt = &s.b[0][0];
    if constexpr (MmaTraits<TYPE>::FLOAT) mma_stage_f<TYPE, LANES, LDM>(s, bt, warp, lane0, st);
    else mma_stage_q<TYPE, LANES, LDM>(s, bt, warp, lane0, st);
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
