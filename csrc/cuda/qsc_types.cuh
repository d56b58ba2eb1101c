/* The device's weight types: one list, then one room per type (included by qsc_common.cuh after the shared
 * infrastructure: QW, Act, the load and dp4a helpers, Packing, TypeDesc and the Unit template).
 *
 * The list, QSC_TYPE_LIST, has one row per ggml type the kernels run as stored: its name and id, the activation
 * format its dots read (ACT_F: floats, ACT_32: Q8_0 / Q8_1 blocks, ACT_256: Q8_K superblocks) and its capability
 * bits. Every type has the matmul (k_matmul, and emu_matmul / qsc_host_matmat on the host); GEMV 1: the decode GEMV
 * with batched loads (k_gemv, qsc_gemv.cuh); MMA 1: the int8 tensor-core GEMM (k_matmul_mma, qsc_mma.cuh). Every
 * per-type site is generated from the list:
 *   - the T_* ids and TypeCaps<T> (the row at compile time);
 *   - the host's type table, type_desc (below): packed_layout and repack_host, qsc_type_supported, type_act,
 *     gemv_type_ok, mma_type_ok;
 *   - dequant_elem (below: embedding lookups, qsc_host_dequantize);
 *   - the kernel dispatches, each a switch over QSC_FOR_TYPES (k_matmul, emu_mm_any in qsc_host.cu),
 *     QSC_FOR_GEMV_TYPES (gemv_lane_any) or QSC_FOR_MMA_TYPES (k_matmul_mma, qsc_host_matmat_mma).
 *
 * A room, Unit<T_X>, holds everything about one type:
 *   - its repacked layout: a line describing the sections and PACK (qsc_common.cuh's Packing): the file's block
 *     bytes, each section's bytes per block and its offset in the file's block (the file block's offsets in brackets
 *     in the line), and the upload-time unpacker of scales that are not copied as stored;
 *   - load() / dot(): decode one unit (QK / NU elements) of a block into int8 lanes once, dot it with an activation
 *     row;
 *   - elem(): element j of block b, bit-exact with the CPU's reference dequantizers (csrc/qs_quant.c,
 *     csrc/qs_iquants.c): every expression keeps the CPU's order of float operations and every product in it is exact
 *     in fp32, so a fused multiply-add gives the same bits as the CPU's two roundings;
 *   - with MMA 1: mma_piece() (a 32-element piece of a 256-element stage as int8, with its scales) and the MMA_*
 *     geometry (scale groups per stage, chunk width, Q4_K's mins, Q4_1's Q8_1 sums).
 * Dots use the activation format the CPU pairs with the type (csrc/qs_traits.c: Q8_1 for Q4_1 / Q5_1, Q8_0 for the
 * other 32-element types, IQ4_NL, MXFP4 and NVFP4, Q8_K for the 256-element types, fp16- / bf16-rounded floats for
 * F16 / BF16) and the CPU's integer sums; only the order in which the per-unit float products are added differs from
 * the CPU (so results agree to float rounding).
 *
 * Adding a type = its room (below, in ggml id order) + its row in QSC_TYPE_LIST; a GEMV or MMA bit set on a type
 * whose room lacks what that path needs does not compile. tests/test_cuda_types.py checks a new type against the
 * CPU once its name is in NEW_TYPES there. */
#pragma once

/* ------------------------------------------------------------------------------------------------------------------
 * The list: X(F, name, ggml id, activation format, GEMV, MMA); F passes through to the per-row macro (QSC_ROW_*). */
#define QSC_TYPE_LIST(X, F)                                                                                            \
    /*   name     id  activations  GEMV  MMA */                                                                        \
    X(F, F32,      0, ACT_F,       1,    0)                                                                            \
    X(F, F16,      1, ACT_F,       1,    1)                                                                            \
    X(F, Q4_0,     2, ACT_32,      1,    1)                                                                            \
    X(F, Q4_1,     3, ACT_32,      1,    1)                                                                            \
    X(F, Q5_0,     6, ACT_32,      1,    1)                                                                            \
    X(F, Q5_1,     7, ACT_32,      0,    1)                                                                            \
    X(F, Q8_0,     8, ACT_32,      1,    1)                                                                            \
    X(F, Q2_K,    10, ACT_256,     0,    1)                                                                            \
    X(F, Q3_K,    11, ACT_256,     0,    1)                                                                            \
    X(F, Q4_K,    12, ACT_256,     1,    1)                                                                            \
    X(F, Q5_K,    13, ACT_256,     0,    1)                                                                            \
    X(F, Q6_K,    14, ACT_256,     1,    1)                                                                            \
    X(F, IQ2_XXS, 16, ACT_256,     0,    1)                                                                            \
    X(F, IQ2_XS,  17, ACT_256,     0,    1)                                                                            \
    X(F, IQ3_XXS, 18, ACT_256,     0,    1)                                                                            \
    X(F, IQ1_S,   19, ACT_256,     0,    1)                                                                            \
    X(F, IQ4_NL,  20, ACT_32,      0,    1)                                                                            \
    X(F, IQ3_S,   21, ACT_256,     0,    1)                                                                            \
    X(F, IQ2_S,   22, ACT_256,     0,    1)                                                                            \
    X(F, IQ4_XS,  23, ACT_256,     0,    1)                                                                            \
    X(F, IQ1_M,   29, ACT_256,     0,    1)                                                                            \
    X(F, BF16,    30, ACT_F,       0,    1)                                                                            \
    X(F, TQ1_0,   34, ACT_256,     0,    1)                                                                            \
    X(F, TQ2_0,   35, ACT_256,     0,    1)                                                                            \
    X(F, MXFP4,   39, ACT_32,      0,    1)                                                                            \
    X(F, NVFP4,   40, ACT_32,      0,    1)
/* X-macros over the list: F(T_name) for every type, for the GEMV types, for the MMA types. */
#define QSC_IF_0(...)
#define QSC_IF_1(...) __VA_ARGS__
#define QSC_ROW_ALL(F, N, ID, ACT, GEMV, MMA) F(T_##N)
#define QSC_ROW_GEMV(F, N, ID, ACT, GEMV, MMA) QSC_IF_##GEMV(F(T_##N))
#define QSC_ROW_MMA(F, N, ID, ACT, GEMV, MMA) QSC_IF_##MMA(F(T_##N))
#define QSC_FOR_TYPES(F) QSC_TYPE_LIST(QSC_ROW_ALL, F)
#define QSC_FOR_GEMV_TYPES(F) QSC_TYPE_LIST(QSC_ROW_GEMV, F)
#define QSC_FOR_MMA_TYPES(F) QSC_TYPE_LIST(QSC_ROW_MMA, F)

/* the ids (T_Q4_0 = 2, ...) and the row at compile time */
#define QSC_ROW_ID(F, N, ID, ACT, GEMV, MMA) T_##N = ID,
enum { QSC_TYPE_LIST(QSC_ROW_ID, _) };
#undef QSC_ROW_ID
template <int TYPE> struct TypeCaps;
#define QSC_ROW_CAPS(F, N, ID, ACT, GEMV, MMA)                                                                     \
    template <> struct TypeCaps<T_##N> {                                                                          \
        static constexpr int ACTF = ACT;                                                                          \
        static constexpr bool GEMV_OK = GEMV, MMA_OK = MMA;                                                       \
    };
QSC_TYPE_LIST(QSC_ROW_CAPS, _)
#undef QSC_ROW_CAPS

/* ------------------------------------------------------------------------------------------------------------------
 * Shared by several rooms. Code books. The i-quant grids are csrc/qs_iq_grids.h's (the CPU's own tables, generated
 * from gguf-py): included once as they are (host copies, static const) and once more with every name mapped to a
 * device copy, so the two are the same text. */
#include "../qs_iq_grids.h"
#undef QS_IQ_GRIDS_H
#define QS_GRID_IQ2_XXS QSC_DEV_GRID_IQ2_XXS
#define QS_GRID_IQ2_XS QSC_DEV_GRID_IQ2_XS
#define QS_GRID_IQ2_S QSC_DEV_GRID_IQ2_S
#define QS_GRID_IQ3_XXS QSC_DEV_GRID_IQ3_XXS
#define QS_GRID_IQ3_S QSC_DEV_GRID_IQ3_S
#define QS_GRID_IQ1_S QSC_DEV_GRID_IQ1_S
#define uint8_t __device__ __align__(8) uint8_t
#define int8_t __device__ __align__(8) int8_t
#include "../qs_iq_grids.h"
#undef uint8_t
#undef int8_t
#undef QS_GRID_IQ2_XXS
#undef QS_GRID_IQ2_XS
#undef QS_GRID_IQ2_S
#undef QS_GRID_IQ3_XXS
#undef QS_GRID_IQ3_S
#undef QS_GRID_IQ1_S

/* IQ4_NL / IQ4_XS values and MXFP4 / NVFP4's E2M1 values doubled (ggml's kvalues_iq4nl, kvalues_mxfp4) */
#define QSC_IQ4NL_VALUES {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}
#define QSC_FP4_VALUES {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}
static const __align__(4) int8_t QSC_IQ4NL_H[16] = QSC_IQ4NL_VALUES;
static const __align__(4) int8_t QSC_FP4_H[16] = QSC_FP4_VALUES;
static __device__ const __align__(4) int8_t QSC_IQ4NL_D[16] = QSC_IQ4NL_VALUES;
static __device__ const __align__(4) int8_t QSC_FP4_D[16] = QSC_FP4_VALUES;

#ifdef __CUDA_ARCH__
#define QSC_TABLE(name) QSC_DEV_##name
#define QSC_SMALL(name) QSC_##name##_D
#else
#define QSC_TABLE(name) QS_##name
#define QSC_SMALL(name) QSC_##name##_H
#endif

/* Grid row i as little-endian ints (8 values: two ints; 4 values: one). */
HD int2 grid8(const uint8_t (*g)[8], int i) { return ld_i2(g[i]); }
HD int grid4(const uint8_t (*g)[4], int i) { return ld_i32(g[i]); }
HD int2 grid8s(const int8_t (*g)[8], int i) { return ld_i2(g[i]); }

/* Byte permute and per-byte subtract, the device's __byte_perm / __vsub4 (emulated on the host, as dp4a):
 * byte_perm(x, y, s): byte n of the result = byte (s >> 4n) & 7 of the 8 bytes y:x (selectors 0..7 only). */
HD unsigned byte_perm(unsigned x, unsigned y, unsigned s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    const uint64_t xy = (uint64_t)y << 32 | x;
    unsigned r = 0;
    for (int n = 0; n < 4; ++n) r |= (unsigned)((xy >> (8 * ((s >> (4 * n)) & 7u))) & 0xFFu) << (8 * n);
    return r;
#endif
}
HD unsigned vsub4(unsigned a, unsigned b) {
#ifdef __CUDA_ARCH__
    return __vsub4(a, b);
#else
    unsigned r = 0;
    for (int n = 0; n < 4; ++n) r |= (((a >> (8 * n)) - (b >> (8 * n))) & 0xFFu) << (8 * n);
    return r;
#endif
}

/* A 16-entry int8 table as four little-endian words (entries 4i..4i+3 in word i). */
struct Lut16 {
    unsigned w[4];
};
HD Lut16 lut16_words(const int8_t *t) {
    Lut16 l;
    for (int i = 0; i < 4; ++i) l.w[i] = (unsigned)ld_i32(t + 4 * i);
    return l;
}
/* Four 4-bit indices (one per byte, 0..15) -> the four table values as int8 lanes: two byte permutes (entries 0..7,
 * 8..15) selected per byte by the index's bit 3. */
HD int lut16(int q, const Lut16 &t) {
    const unsigned u = (unsigned)q;
    const unsigned sel = (u & 7u) | ((u >> 4) & 0x70u) | ((u >> 8) & 0x700u) | ((u >> 12) & 0x7000u);
    const unsigned lo = byte_perm(t.w[0], t.w[1], sel), hi = byte_perm(t.w[2], t.w[3], sel);
    const unsigned m = ((u >> 3) & 0x01010101u) * 0xFFu;
    return (int)((lo & ~m) | (hi & m));
}
/* Bytes of v negated where bit i of s is set (i = 0..3): (v ^ m) - m per byte, m = 0xFF in the negated bytes. */
HD int sign_bytes(int v, unsigned s) {
    const unsigned m = ((s & 1u) | ((s & 2u) << 7) | ((s & 4u) << 14) | ((s & 8u) << 21)) * 0xFFu;
    return (int)vsub4((unsigned)v ^ m, m);
}
/* ggml's ksigns rule: 7 stored sign bits, the 8th makes the count of minus signs even. */
HD unsigned ksign(unsigned i7) {
    i7 &= 127u;
    unsigned p = i7 ^ (i7 >> 4);
    p ^= p >> 2;
    p ^= p >> 1;
    return i7 | ((p & 1u) << 7);
}
/* MXFP4's E8M0 scale halved; NVFP4's UE4M3 scale halved (0 and 0x7F read as 0), both from their bits. */
HD float e8m0_half(unsigned e) {
    unsigned bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
HD float ue4m3_half(unsigned x) {
    if (x == 0 || x == 0x7F) return 0.0f;
    const int ex = (x >> 3) & 15, man = x & 7;
    if (ex == 0) return (float)man * 0x1p-10f;
    const unsigned bits = (unsigned)(ex - 8 + 127) << 23 | (unsigned)man << 20;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
HD float bf16_bits_to_f(unsigned h) {
    unsigned bits = h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
/* fp32 -> bf16 -> fp32 as ggml (NaN -> quiet NaN, otherwise round to nearest even): the CPU's BF16 activations. */
HD unsigned bf16_bits(float x) {
    unsigned u;
    memcpy(&u, &x, 4);
    unsigned h = (u & 0x7FFFFFFFu) > 0x7F800000u ? ((u >> 16) | 64u) : ((u + (0x7FFFu + ((u >> 16) & 1u))) >> 16);
    return h & 0xFFFFu;
}
HD float bf16_round(float x) { return bf16_bits_to_f(bf16_bits(x)); }
/* TQ1_0's digit k of byte q: ((q * 3^k) mod 256) * 3 >> 8 */
HD int trit(unsigned q, int k) {
    const unsigned p3 = k == 0 ? 1u : k == 1 ? 3u : k == 2 ? 9u : k == 3 ? 27u : 81u;
    return (int)((((q * p3) & 255u) * 3u) >> 8);
}
HD unsigned ld_u16(const uint8_t *p) { return (unsigned)p[0] | ((unsigned)p[1] << 8); }

/* int8 dot of 16 / 32 bytes (c: 4 / 8 packed ints) with an activation run (16-byte aligned). */
HD int dot16(const int *c, const int8_t *x) {
    int4 v = ld_i4(x);
    return dp4a(c[3], v.w, dp4a(c[2], v.z, dp4a(c[1], v.y, dp4a(c[0], v.x, 0))));
}

/* A 32-element unit of a 256-element block given as int8 codes with an integer scale per 16 (ls[0], ls[1]; equal
 * for the types with one per 32) and one float multiplier: value = m * ls * code exactly, so the dot is
 * (m * d8) * (ls0 * Σ code·q over the first 16 + ls1 * Σ over the second): qs_iq_dot_codes_scalar, per unit. */
struct Codes256 {
    static constexpr int QK = 256, NU = 8;
    int c[8], ls[2], e0;
    float m;
    HD float dot(const Act &a, int64_t col, int ib) const {
        const int8_t *x = a.qs + col * a.k + ib * 256 + e0;
        const int isum = ls[0] * dot16(c, x) + ls[1] * dot16(c + 4, x + 16);
        return (m * a.d[col * (a.k / 256) + ib]) * (float)isum;
    }
};

/* The MMA stage piece of a Codes256 room (its unit p = elements 32p..32p+31, e0 = 32p): the unit's int8 codes, its two
 * integer scales of 16 (m16n8k16 chunks) and, once per block, its float multiplier m (the same for every unit of a
 * block in every such room): m * d8 * (ls0 * Σ code·q + ls1 * Σ ...), the integer sums on the tensor cores. */
#define QSC_CODES256_MMA(T)                                                                                          \
    static constexpr int MMA_NG = 1, MMA_KS = 16;                                                                  \
    static constexpr bool MMA_MIN = false, MMA_XSUM = false;                                                       \
    template <class S> HD static void mma_piece(const QW &w, int64_t row, int kb, int p, int8_t *dst, S &s, int r) { \
        Unit<T> u;                                                                                                 \
        u.load(w, row * w.nb + kb, p);                                                                             \
        for (int i = 0; i < 8; ++i) st_i32(dst + 4 * i, u.c[i]);                                                   \
        s.isc[r][2 * p] = (int8_t)u.ls[0];                                                                         \
        s.isc[r][2 * p + 1] = (int8_t)u.ls[1];                                                                     \
        if (p == 0) s.wd[r][0] = u.m;                                                                              \
    }

/* The MMA stage piece of a float room (F16, BF16: rows stored as 16-bit values, float activations): a stage is
 * MMA_KT / 2 = 128 elements (the int8 tile's 256 bytes a row), piece p = elements 16p..16p+15 of it, copied as
 * stored; no scales (the tensor cores multiply the 16-bit values and add in fp32). mma_pack2 / mma_unpack: two
 * activations as the room's 16-bit pair, one 16-bit value back (the host emulation of the MMA). */
#define QSC_FLOAT_MMA                                                                                                \
    static constexpr int MMA_NG = 1, MMA_KS = 16;                                                                  \
    static constexpr bool MMA_MIN = false, MMA_XSUM = false;                                                       \
    template <class S> HD static void mma_piece(const QW &w, int64_t row, int kb, int p, int8_t *dst, S &, int) {  \
        const uint8_t *src = w.qs + 2 * (row * w.k + (int64_t)kb * 128 + 16 * p); /* 128: MMA_KT / 2 */          \
        st_i4(dst, ld_i4(src));                                                                                    \
        st_i4(dst + 16, ld_i4(src + 16));                                                                          \
    }

/* element j's sign from a sign mask (bit j set: minus) */
HD float sgnf(unsigned bits, int j) { return (bits >> j) & 1u ? -1.0f : 1.0f; }

/* Q4_K / Q5_K: the 6-bit scales and mins of the 12 bytes at [4] (get_scale_min_k4) as 8 scales then 8 mins, one
 * byte each (on upload, host). */
static inline void unpack_k4_scales(const uint8_t *blk, uint8_t *sc) {
    const uint8_t *s = blk + 4;
    for (int j = 0; j < 8; ++j) {
        if (j < 4) {
            sc[j] = s[j] & 63;
            sc[8 + j] = s[j + 4] & 63;
        } else {
            sc[j] = (uint8_t)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
            sc[8 + j] = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
        }
    }
}

/* ==================================================================================================================
 * The rooms, in ggml id order. */

/* ---- F32 ------------------------------------------------------------------------------------------------------- */
/* F32 rows: "blocks" of 32 elements, units of 8, float activations. */
template <> struct Unit<T_F32> {
    static constexpr int QK = 32, NU = 4;
    /* repacked: the rows as stored, in qs (32-element "blocks") */
    static constexpr Packing PACK = {128, {128, 0, 0, 0}, {0, -1, -1, -1}};
    float4 w0, w1;
    int u;
    HD void load(const QW &w, int64_t b, int u_) {
        u = u_;
        const float *p = (const float *)w.qs + b * 32 + 8 * u;
        w0 = ld_f4(p);
        w1 = ld_f4(p + 4);
    }
    HD float dot(const Act &a, int64_t col, int ib) const {
        const float *x = a.f + col * a.k + ib * 32 + 8 * u;
        float4 x0 = ld_f4(x), x1 = ld_f4(x + 4);
        return w0.x * x0.x + w0.y * x0.y + w0.z * x0.z + w0.w * x0.w + w1.x * x1.x + w1.y * x1.y + w1.z * x1.z +
               w1.w * x1.w;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        return ((const float *)w.qs)[b * 32 + j];
    }
};

/* ---- F16 ------------------------------------------------------------------------------------------------------- */
/* F16 rows: as F32; the activation is rounded to fp16 first, as the CPU's F16 x F16 dot does. */
template <> struct Unit<T_F16> {
    static constexpr int QK = 32, NU = 4;
    /* repacked: the rows as stored, in qs */
    static constexpr Packing PACK = {64, {64, 0, 0, 0}, {0, -1, -1, -1}};
    float wv[8];
    int u;
    HD void load(const QW &w, int64_t b, int u_) {
        u = u_;
        int4 v = ld_i4(w.qs + (b * 32 + 8 * u) * 2);
        unsigned short bits[8];
        memcpy(bits, &v, 16); /* not a pointer cast: that would break strict aliasing in the host build */
        for (int i = 0; i < 8; ++i) {
            __half_raw r;
            r.x = bits[i];
            wv[i] = h2f(__half(r));
        }
    }
    HD float dot(const Act &a, int64_t col, int ib) const {
        const float *x = a.f + col * a.k + ib * 32 + 8 * u;
        float4 x0 = ld_f4(x), x1 = ld_f4(x + 4);
        float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        float s = 0.0f;
        for (int i = 0; i < 8; ++i) s += wv[i] * f16_round(xs[i]);
        return s;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        return h2f(((const __half *)w.qs)[b * 32 + j]);
    }
    /* MMA (fp16 x fp16 -> fp32 tensor cores, m16n8k16): a stage is 128 elements, piece p its elements 16p..16p+15
     * as stored (32 bytes); the activations rounded to fp16 as the dot does (mma_pack2) */
    QSC_FLOAT_MMA
    HD static unsigned mma_pack2(float lo, float hi) {
        const __half_raw l = __float2half_rn(lo), h = __float2half_rn(hi);
        return (unsigned)l.x | (unsigned)h.x << 16;
    }
    HD static float mma_unpack(unsigned h) {
        __half_raw r;
        r.x = (unsigned short)h;
        return h2f(__half(r));
    }
};

/* ---- Q4_0 ------------------------------------------------------------------------------------------------------ */
/* Q4_0 (18 B: d, qs[16]); byte j holds element j (low nibble) and j+16 (high). Unit h (0,1) = bytes 8h..8h+7 =
 * elements 8h..8h+7 and 16+8h..16+8h+7. */
template <> struct Unit<T_Q4_0> {
    static constexpr int QK = 32, NU = 2;
    /* repacked: qs[16] (nibbles as stored) [2]   d: half [0] */
    static constexpr Packing PACK = {18, {16, 0, 0, 2}, {2, -1, -1, 0}};
    int lo[2], hi[2], h;
    float d;
    HD void load(const QW &w, int64_t b, int u) {
        h = u;
        int2 v = ld_i2(w.qs + b * 16 + 8 * h);
        lo[0] = sext4_minus8(v.x & 0x0F0F0F0F);
        hi[0] = sext4_minus8((v.x >> 4) & 0x0F0F0F0F);
        lo[1] = sext4_minus8(v.y & 0x0F0F0F0F);
        hi[1] = sext4_minus8((v.y >> 4) & 0x0F0F0F0F);
        d = h2f(w.d[b]);
    }
    HD float dot(const Act &a, int64_t col, int ib) const {
        const int8_t *x = a.qs + col * a.k + ib * 32;
        int2 xl = ld_i2(x + 8 * h), xh = ld_i2(x + 16 + 8 * h);
        int s = dp4a(lo[0], xl.x, 0);
        s = dp4a(lo[1], xl.y, s);
        s = dp4a(hi[0], xh.x, s);
        s = dp4a(hi[1], xh.y, s);
        return (float)s * (d * a.d[col * (a.k / 32) + ib]);
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        int byte = w.qs[b * 16 + (j & 15)];
        int q = j < 16 ? (byte & 15) : (byte >> 4);
        return (float)(q - 8) * h2f(w.d[b]);
    }
    /* MMA stage piece p (qsc_mma.cuh): block kb * 8 + p as int8, its d */
    static constexpr int MMA_NG = 8, MMA_KS = 32;
    static constexpr bool MMA_MIN = false, MMA_XSUM = false;
    template <class S> HD static void mma_piece(const QW &w, int64_t row, int kb, int p, int8_t *dst, S &s, int r) {
        const int64_t b = row * w.nb + kb * 8 + p;
        const int4 v = ld_i4(w.qs + b * 16);
        const int vw[4] = {v.x, v.y, v.z, v.w};
        for (int j = 0; j < 4; ++j) { /* bytes 4j..4j+3: elements 4j.. (low nibbles) and 16+4j.. (high) */
            int lo = vw[j] & 0x0F0F0F0F, hi = (vw[j] >> 4) & 0x0F0F0F0F;
            lo = sext4_minus8(lo);
            hi = sext4_minus8(hi);
            st_i32(dst + 4 * j, lo);
            st_i32(dst + 16 + 4 * j, hi);
        }
        s.wd[r][p] = h2f(w.d[b]);
    }
};

/* ---- Q4_1 ------------------------------------------------------------------------------------------------------ */
/* Q4_1 (20 B: d, m, qs[16]); x = q*d + m. With Q8_1: d_w*d_x*sum(q*qx) + m_w*s_x (s_x = d_x*sum(qx)); the
 * min term is added once per block, by unit 0. */
template <> struct Unit<T_Q4_1> {
    static constexpr int QK = 32, NU = 2;
    /* repacked: qs[16] [4]   d: half2 (d, m) [0] */
    static constexpr Packing PACK = {20, {16, 0, 0, 4}, {4, -1, -1, 0}};
    int lo[2], hi[2], h;
    float d, m;
    HD void load(const QW &w, int64_t b, int u) {
        h = u;
        int2 v = ld_i2(w.qs + b * 16 + 8 * h);
        lo[0] = v.x & 0x0F0F0F0F;
        hi[0] = (v.x >> 4) & 0x0F0F0F0F;
        lo[1] = v.y & 0x0F0F0F0F;
        hi[1] = (v.y >> 4) & 0x0F0F0F0F;
        d = h2f(w.d[2 * b]);
        m = h2f(w.d[2 * b + 1]);
    }
    HD float dot(const Act &a, int64_t col, int ib) const {
        const int8_t *x = a.qs + col * a.k + ib * 32;
        int2 xl = ld_i2(x + 8 * h), xh = ld_i2(x + 16 + 8 * h);
        int s = dp4a(lo[0], xl.x, 0);
        s = dp4a(lo[1], xl.y, s);
        s = dp4a(hi[0], xh.x, s);
        s = dp4a(hi[1], xh.y, s);
        int64_t xb = col * (a.k / 32) + ib;
        float r = (d * a.d[xb]) * (float)s;
        return h == 0 ? r + m * a.s[xb] : r;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        int byte = w.qs[b * 16 + (j & 15)];
        int q = j < 16 ? (byte & 15) : (byte >> 4);
        return (float)q * h2f(w.d[2 * b]) + h2f(w.d[2 * b + 1]);
    }
    /* MMA stage piece p: block kb * 8 + p as its 0..15 codes, d and m (the min term: m * the Q8_1 sum) */
    static constexpr int MMA_NG = 8, MMA_KS = 32;
    static constexpr bool MMA_MIN = false, MMA_XSUM = true;
    template <class S> HD static void mma_piece(const QW &w, int64_t row, int kb, int p, int8_t *dst, S &s, int r) {
        const int64_t b = row * w.nb + kb * 8 + p;
        const int4 v = ld_i4(w.qs + b * 16);
        const int vw[4] = {v.x, v.y, v.z, v.w};
        for (int j = 0; j < 4; ++j) { /* bytes 4j..4j+3: elements 4j.. (low nibbles) and 16+4j.. (high) */
            const int lo = vw[j] & 0x0F0F0F0F, hi = (vw[j] >> 4) & 0x0F0F0F0F;
            st_i32(dst + 4 * j, lo);
            st_i32(dst + 16 + 4 * j, hi);
        }
        s.wd[r][p] = h2f(w.d[2 * b]);
        s.wm[r][p] = h2f(w.d[2 * b + 1]);
    }
};

/* ---- Q5_0 ------------------------------------------------------------------------------------------------------ */
/* Q5_0 (22 B: d, qh u32, qs[16]); q = nibble | (bit e of qh) << 4, x = (q - 16) * d. */
template <> struct Unit<T_Q5_0> {
    static constexpr int QK = 32, NU = 2;
    /* repacked: qs[16] [6]   qh: u32 (bit e = 5th bit of element e) [2]   d: half [0] */
    static constexpr Packing PACK = {22, {16, 4, 0, 2}, {6, 2, -1, 0}};
    int lo[2], hi[2], h;
    float d;
    HD void load(const QW &w, int64_t b, int u) {
        h = u;
        int2 v = ld_i2(w.qs + b * 16 + 8 * h);
        unsigned qh = (unsigned)ld_i32(w.qh + b * 4);
        unsigned bl = qh >> (8 * h), bh = qh >> (16 + 8 * h); /* fifth bits of elements 8h.. and 16+8h.. */
        lo[0] = sext5_minus16((v.x & 0x0F0F0F0F) | spread4_bit4(bl & 15u));
        lo[1] = sext5_minus16((v.y & 0x0F0F0F0F) | spread4_bit4((bl >> 4) & 15u));
        hi[0] = sext5_minus16(((v.x >> 4) & 0x0F0F0F0F) | spread4_bit4(bh & 15u));
        hi[1] = sext5_minus16(((v.y >> 4) & 0x0F0F0F0F) | spread4_bit4((bh >> 4) & 15u));
        d = h2f(w.d[b]);
    }
    HD float dot(const Act &a, int64_t col, int ib) const {
        const int8_t *x = a.qs + col * a.k + ib * 32;
        int2 xl = ld_i2(x + 8 * h), xh = ld_i2(x + 16 + 8 * h);
        int s = dp4a(lo[0], xl.x, 0);
        s = dp4a(lo[1], xl.y, s);
        s = dp4a(hi[0], xh.x, s);
        s = dp4a(hi[1], xh.y, s);
        return (float)s * (d * a.d[col * (a.k / 32) + ib]);
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        int byte = w.qs[b * 16 + (j & 15)];
        unsigned qh = (unsigned)ld_i32(w.qh + b * 4);
        int q = (j < 16 ? (byte & 15) : (byte >> 4)) | (int)(((qh >> j) & 1u) << 4);
        return (float)(q - 16) * h2f(w.d[b]);
    }
    /* MMA stage piece p: block kb * 8 + p as int8, its d */
    static constexpr int MMA_NG = 8, MMA_KS = 32;
    static constexpr bool MMA_MIN = false, MMA_XSUM = false;
    template <class S> HD static void mma_piece(const QW &w, int64_t row, int kb, int p, int8_t *dst, S &s, int r) {
        const int64_t b = row * w.nb + kb * 8 + p;
        const int4 v = ld_i4(w.qs + b * 16);
        const int vw[4] = {v.x, v.y, v.z, v.w};
        const unsigned qh = (unsigned)ld_i32(w.qh + b * 4);
        for (int j = 0; j < 4; ++j) { /* bytes 4j..4j+3: elements 4j.. (low nibbles) and 16+4j.. (high) */
            int lo = vw[j] & 0x0F0F0F0F, hi = (vw[j] >> 4) & 0x0F0F0F0F;
            lo = sext5_minus16(lo | spread4_bit4((qh >> (4 * j)) & 15u));
            hi = sext5_minus16(hi | spread4_bit4((qh >> (16 + 4 * j)) & 15u));
            st_i32(dst + 4 * j, lo);
            st_i32(dst + 16 + 4 * j, hi);
        }
        s.wd[r][p] = h2f(w.d[b]);
    }
};

/* ---- Q5_1 ------------------------------------------------------------------------------------------------------ */
/* Q5_1 (24 B: d, m, qh u32, qs[16]); x = q*d + m, q = nibble | bit e of qh << 4; against Q8_1 as Q4_1. */
template <> struct Unit<T_Q5_1> {
    static constexpr int QK = 32, NU = 2;
    /* repacked: qs[16] [8]   qh: u32 [4]   d: half2 (d, m) [0] */
    static constexpr Packing PACK = {24, {16, 4, 0, 4}, {8, 4, -1, 0}};
    int lo[2], hi[2], h;
    float d, m;
    HD void load(const QW &w, int64_t b, int u) {
        h = u;
        int2 v = ld_i2(w.qs + b * 16 + 8 * h);
        unsigned qh = (unsigned)ld_i32(w.qh + b * 4);
        unsigned bl = qh >> (8 * h), bh = qh >> (16 + 8 * h);
        lo[0] = (v.x & 0x0F0F0F0F) | spread4_bit4(bl & 15u);
        lo[1] = (v.y & 0x0F0F0F0F) | spread4_bit4((bl >> 4) & 15u);
        hi[0] = ((v.x >> 4) & 0x0F0F0F0F) | spread4_bit4(bh & 15u);
        hi[1] = ((v.y >> 4) & 0x0F0F0F0F) | spread4_bit4((bh >> 4) & 15u);
        d = h2f(w.d[2 * b]);
        m = h2f(w.d[2 * b + 1]);
    }
    HD float dot(const Act &a, int64_t col, int ib) const {
        const int8_t *x = a.qs + col * a.k + ib * 32;
        int2 xl = ld_i2(x + 8 * h), xh = ld_i2(x + 16 + 8 * h);
        int s = dp4a(lo[0], xl.x, 0);
        s = dp4a(lo[1], xl.y, s);
        s = dp4a(hi[0], xh.x, s);
        s = dp4a(hi[1], xh.y, s);
        int64_t xb = col * (a.k / 32) + ib;
        float r = (d * a.d[xb]) * (float)s;
        return h == 0 ? r + m * a.s[xb] : r;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        int byte = w.qs[b * 16 + (j & 15)];
        unsigned qh = (unsigned)ld_i32(w.qh + b * 4);
        int q = (j < 16 ? (byte & 15) : (byte >> 4)) | (int)(((qh >> j) & 1u) << 4);
        return (float)q * h2f(w.d[2 * b]) + h2f(w.d[2 * b + 1]);
    }
    /* MMA stage piece p: block kb * 8 + p as its 0..31 codes, d and m (the min term: m * the Q8_1 sum, as Q4_1) */
    static constexpr int MMA_NG = 8, MMA_KS = 32;
    static constexpr bool MMA_MIN = false, MMA_XSUM = true;
    template <class S> HD static void mma_piece(const QW &w, int64_t row, int kb, int p, int8_t *dst, S &s, int r) {
        const int64_t b = row * w.nb + kb * 8 + p;
        const int4 v = ld_i4(w.qs + b * 16);
        const int vw[4] = {v.x, v.y, v.z, v.w};
        const unsigned qh = (unsigned)ld_i32(w.qh + b * 4);
        for (int j = 0; j < 4; ++j) { /* bytes 4j..4j+3: elements 4j.. (low nibbles) and 16+4j.. (high) */
            st_i32(dst + 4 * j, (vw[j] & 0x0F0F0F0F) | spread4_bit4((qh >> (4 * j)) & 15u));
            st_i32(dst + 16 + 4 * j, ((vw[j] >> 4) & 0x0F0F0F0F) | spread4_bit4((qh >> (16 + 4 * j)) & 15u));
        }
        s.wd[r][p] = h2f(w.d[2 * b]);
        s.wm[r][p] = h2f(w.d[2 * b + 1]);
    }
};

/* ---- Q8_0 ------------------------------------------------------------------------------------------------------ */
/* Q8_0 (34 B: d, qs[32] int8); unit h = elements 16h..16h+15. */
template <> struct Unit<T_Q8_0> {
    static constexpr int QK = 32, NU = 2;
    /* repacked: qs[32] int8 [2]   d: half [0] */
    static constexpr Packing PACK = {34, {32, 0, 0, 2}, {2, -1, -1, 0}};
    int4 q;
    int h;
    float d;
    HD void load(const QW &w, int64_t b, int u) {
        h = u;
        q = ld_i4(w.qs + b * 32 + 16 * h);
        d = h2f(w.d[b]);
    }
    HD float dot(const Act &a, int64_t col, int ib) const {
        int4 x = ld_i4(a.qs + col * a.k + ib * 32 + 16 * h);
        int s = dp4a(q.x, x.x, 0);
        s = dp4a(q.y, x.y, s);
        s = dp4a(q.z, x.z, s);
        s = dp4a(q.w, x.w, s);
        return (float)s * (d * a.d[col * (a.k / 32) + ib]);
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        return (float)(int8_t)w.qs[b * 32 + j] * h2f(w.d[b]);
    }
    /* MMA stage piece p: block kb * 8 + p as stored, its d */
    static constexpr int MMA_NG = 8, MMA_KS = 32;
    static constexpr bool MMA_MIN = false, MMA_XSUM = false;
    template <class S> HD static void mma_piece(const QW &w, int64_t row, int kb, int p, int8_t *dst, S &s, int r) {
        const int64_t b = row * w.nb + kb * 8 + p;
        st_i4(dst, ld_i4(w.qs + b * 32));
        st_i4(dst + 16, ld_i4(w.qs + b * 32 + 16));
        s.wd[r][p] = h2f(w.d[b]);
    }
};

/* ---- Q2_K ------------------------------------------------------------------------------------------------------ */
/* Q2_K (84 B: scales[16], qs[64], d, dmin): element 128n + 32j + l = (qs[32n + l] >> 2j) & 3 under scale byte
 * 8n + 2j + l/16 (low nibble: scale, high: min). Unit u = (n, j) = (u/4, u%4): 32 elements, two scale groups g0, g0+1.
 * With Q8_K: d8 * d * Σ sc*Σq·x  -  d8 * dmin * Σ m*bsum, as the CPU. */
template <> struct Unit<T_Q2_K> {
    static constexpr int QK = 256, NU = 8;
    /* repacked: qs[64] [16]   sc[16] [0]   d: half2 (d, dmin) [80] */
    static constexpr Packing PACK = {84, {64, 0, 16, 4}, {16, -1, 0, 80}};
    int q[8], sc0, sc1, g0;
    float d, dmin;
    HD void load(const QW &w, int64_t b, int u) {
        const int n = u >> 2, j = u & 3;
        g0 = 8 * n + 2 * j;
        int4 A = ld_i4(w.qs + b * 64 + 32 * n), B = ld_i4(w.qs + b * 64 + 32 * n + 16);
        const int v[8] = {A.x, A.y, A.z, A.w, B.x, B.y, B.z, B.w};
        for (int i = 0; i < 8; ++i) q[i] = (v[i] >> (2 * j)) & 0x03030303;
        sc0 = w.sc[b * 16 + g0];
        sc1 = w.sc[b * 16 + g0 + 1];
        d = h2f(w.d[2 * b]);
        dmin = h2f(w.d[2 * b + 1]);
    }
    HD float dot(const Act &a, int64_t col, int ib) const {
        const int8_t *x = a.qs + col * a.k + ib * 256 + 16 * g0;
        const int *bs = a.bs + col * (a.k / 16) + ib * 16;
        const int isum = (sc0 & 15) * dot16(q, x) + (sc1 & 15) * dot16(q + 4, x + 16);
        const int summs = (sc0 >> 4) * bs[g0] + (sc1 >> 4) * bs[g0 + 1];
        const float d8 = a.d[col * (a.k / 256) + ib];
        return d8 * d * (float)isum - d8 * dmin * (float)summs;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        const int n = j / 128, jj = (j % 128) / 32, l = j % 32;
        const unsigned s = w.sc[b * 16 + 8 * n + 2 * jj + l / 16];
        const int q = (w.qs[b * 64 + 32 * n + l] >> (2 * jj)) & 3;
        return h2f(w.d[2 * b]) * (float)(s & 15) * (float)q - h2f(w.d[2 * b + 1]) * (float)(s >> 4);
    }
    /* MMA stage piece p = unit p (elements 32p..32p+31): its 2-bit codes, two 4-bit scales of 16 (m16n8k16 chunks)
     * and their 4-bit mins (MMA_MIN: times the Q8_K block sums, as Q4_K's) */
    static constexpr int MMA_NG = 1, MMA_KS = 16;
    static constexpr bool MMA_MIN = true, MMA_XSUM = false;
    template <class S> HD static void mma_piece(const QW &w, int64_t row, int kb, int p, int8_t *dst, S &s, int r) {
        const int64_t b = row * w.nb + kb;
        const uint8_t *q = w.qs + b * 64 + 32 * (p >> 2);
        const int sh = 2 * (p & 3);
        for (int j = 0; j < 8; ++j) st_i32(dst + 4 * j, (ld_i32(q + 4 * j) >> sh) & 0x03030303);
        const int sc0 = w.sc[b * 16 + 2 * p], sc1 = w.sc[b * 16 + 2 * p + 1]; /* scale byte 8n + 2j + l/16 = 2p + l/16 */
        s.isc[r][2 * p] = (int8_t)(sc0 & 15);
        s.isc[r][2 * p + 1] = (int8_t)(sc1 & 15);
        s.imin[r][2 * p] = (int8_t)(sc0 >> 4);
        s.imin[r][2 * p + 1] = (int8_t)(sc1 >> 4);
        if (p == 0) { s.wd[r][0] = h2f(w.d[2 * b]); s.wm[r][0] = h2f(w.d[2 * b + 1]); }
    }
};

/* ---- Q3_K ------------------------------------------------------------------------------------------------------ */
/* Q3_K's sixteen 6-bit scales minus 32, one signed byte each (on upload, host) */
static inline void unpack_q3k_scales(const uint8_t *blk, uint8_t *sc) {
    const uint8_t *s = blk + 96;
    for (int j = 0; j < 16; ++j) {
        int low = j < 8 ? (s[j] & 15) : (s[j - 8] >> 4);
        int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        sc[j] = (uint8_t)(int8_t)((low | (high << 4)) - 32);
    }
}

/* Q3_K (110 B: hmask[32], qs[64], scales[12], d): code = low 2 bits (as Q2_K) | hmask bit (4n + j of byte l) << 2,
 * value (code - 4) * scale; with Q8_K: d8 * d * Σ sc * (Σ code·x - 4 * bsum), as the CPU. */
template <> struct Unit<T_Q3_K> {
    static constexpr int QK = 256, NU = 8;
    /* repacked: qs[64] [32]   qh[32] [0]   sc[16] int8: the 6-bit scales minus 32, unpacked from [96]   d [108] */
    static constexpr Packing PACK = {110, {64, 32, 16, 2}, {32, 0, -1, 108}, unpack_q3k_scales};
    int q[8], sc0, sc1, g0;
    float d;
    HD void load(const QW &w, int64_t b, int u) {
        const int n = u >> 2, j = u & 3;
        g0 = 8 * n + 2 * j;
        int4 A = ld_i4(w.qs + b * 64 + 32 * n), B = ld_i4(w.qs + b * 64 + 32 * n + 16);
        int4 H = ld_i4(w.qh + b * 32), G = ld_i4(w.qh + b * 32 + 16);
        const int v[8] = {A.x, A.y, A.z, A.w, B.x, B.y, B.z, B.w}, hm[8] = {H.x, H.y, H.z, H.w, G.x, G.y, G.z, G.w};
        for (int i = 0; i < 8; ++i)
            q[i] = ((v[i] >> (2 * j)) & 0x03030303) | (((hm[i] >> (4 * n + j)) & 0x01010101) << 2);
        sc0 = (int8_t)w.sc[b * 16 + g0];
        sc1 = (int8_t)w.sc[b * 16 + g0 + 1];
        d = h2f(w.d[b]);
    }
    HD float dot(const Act &a, int64_t col, int ib) const {
        const int8_t *x = a.qs + col * a.k + ib * 256 + 16 * g0;
        const int *bs = a.bs + col * (a.k / 16) + ib * 16;
        const int isum = sc0 * (dot16(q, x) - 4 * bs[g0]) + sc1 * (dot16(q + 4, x + 16) - 4 * bs[g0 + 1]);
        return a.d[col * (a.k / 256) + ib] * d * (float)isum;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        const int n = j / 128, jj = (j % 128) / 32, l = j % 32;
        const int low = (w.qs[b * 64 + 32 * n + l] >> (2 * jj)) & 3;
        const int q = low - (((w.qh[b * 32 + l] >> (4 * n + jj)) & 1) ? 0 : 4);
        return h2f(w.d[b]) * (float)(int8_t)w.sc[b * 16 + 8 * n + 2 * jj + l / 16] * (float)q;
    }
    /* MMA stage piece p = unit p (elements 32p..32p+31): code - 4 (-4..3) as int8, two signed scales of 16
     * (m16n8k16 chunks) */
    static constexpr int MMA_NG = 1, MMA_KS = 16;
    static constexpr bool MMA_MIN = false, MMA_XSUM = false;
    template <class S> HD static void mma_piece(const QW &w, int64_t row, int kb, int p, int8_t *dst, S &s, int r) {
        const int64_t b = row * w.nb + kb;
        const int n = p >> 2, j = p & 3;
        const uint8_t *q = w.qs + b * 64 + 32 * n, *qh = w.qh + b * 32;
        for (int i = 0; i < 8; ++i) {
            const int code = ((ld_i32(q + 4 * i) >> (2 * j)) & 0x03030303) |
                             (((ld_i32(qh + 4 * i) >> (4 * n + j)) & 0x01010101) << 2); /* 0..7 per byte */
            st_i32(dst + 4 * i, sext4_minus8(code + 0x04040404));                     /* code - 4 */
        }
        s.isc[r][2 * p] = (int8_t)w.sc[b * 16 + 2 * p];
        s.isc[r][2 * p + 1] = (int8_t)w.sc[b * 16 + 2 * p + 1];
        if (p == 0) s.wd[r][0] = h2f(w.d[b]);
    }
};

/* ---- Q4_K ------------------------------------------------------------------------------------------------------ */
/* Q4_K (144 B superblock of 256): chunk c (0..3) stores elements 64c..64c+31 in the low nibbles of qs[32c..+31]
 * (sub-block 2c) and 64c+32..64c+63 in the high nibbles (sub-block 2c+1). Unit u: c = u/2, half s = u%2 -> bytes
 * 32c+16s..+15 = elements 64c+16s.. (low) and 64c+32+16s.. (high). With Q8_K (bsums per 16 elements):
 * d8 * (d * (sc_lo*sum_lo + sc_hi*sum_hi) - dmin * (m_lo*bsum[4c+s] + m_hi*bsum[4c+2+s])). */
template <> struct Unit<T_Q4_K> {
    static constexpr int QK = 256, NU = 8;
    /* repacked: qs[128] [16]   sc[16]: 8 scales then 8 mins, the 6-bit fields unpacked from [4]
     *           d: half2 (d, dmin) [0] */
    static constexpr Packing PACK = {144, {128, 0, 16, 4}, {16, -1, -1, 0}, unpack_k4_scales};
    int lo[4], hi[4], c, s, sc_lo, sc_hi, m_lo, m_hi;
    float d, dmin;
    HD void load(const QW &w, int64_t b, int u) {
        c = u >> 1;
        s = u & 1;
        int4 v = ld_i4(w.qs + b * 128 + 32 * c + 16 * s);
        lo[0] = v.x & 0x0F0F0F0F; hi[0] = (v.x >> 4) & 0x0F0F0F0F;
        lo[1] = v.y & 0x0F0F0F0F; hi[1] = (v.y >> 4) & 0x0F0F0F0F;
        lo[2] = v.z & 0x0F0F0F0F; hi[2] = (v.z >> 4) & 0x0F0F0F0F;
        lo[3] = v.w & 0x0F0F0F0F; hi[3] = (v.w >> 4) & 0x0F0F0F0F;
        const uint8_t *sc = w.sc + b * 16;
        sc_lo = sc[2 * c];
        sc_hi = sc[2 * c + 1];
        m_lo = sc[8 + 2 * c];
        m_hi = sc[8 + 2 * c + 1];
        d = h2f(w.d[2 * b]);
        dmin = h2f(w.d[2 * b + 1]);
    }
    HD float dot(const Act &a, int64_t col, int ib) const {
        const int8_t *x = a.qs + col * a.k + ib * 256 + 64 * c + 16 * s;
        int4 xl = ld_i4(x), xh = ld_i4(x + 32);
        int sl = dp4a(lo[0], xl.x, 0);
        sl = dp4a(lo[1], xl.y, sl);
        sl = dp4a(lo[2], xl.z, sl);
        sl = dp4a(lo[3], xl.w, sl);
        int sh = dp4a(hi[0], xh.x, 0);
        sh = dp4a(hi[1], xh.y, sh);
        sh = dp4a(hi[2], xh.z, sh);
        sh = dp4a(hi[3], xh.w, sh);
        const int *bs = a.bs + col * (a.k / 16) + ib * 16;
        int sumi = sc_lo * sl + sc_hi * sh;
        int msum = m_lo * bs[4 * c + s] + m_hi * bs[4 * c + 2 + s];
        float d8 = a.d[col * (a.k / 256) + ib];
        return d * d8 * (float)sumi - dmin * d8 * (float)msum;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        int c = j / 64, l = j % 64, s = 2 * c + (l >= 32);
        int byte = w.qs[b * 128 + 32 * c + (l & 31)];
        int q = l < 32 ? (byte & 15) : (byte >> 4);
        float d = h2f(w.d[2 * b]) * (float)w.sc[b * 16 + s], mm = h2f(w.d[2 * b + 1]) * (float)w.sc[b * 16 + 8 + s];
        return d * (float)q - mm;
    }
    /* MMA stage piece p = sub-block p of block kb: nibble p & 1 of qs[32 (p / 2) ..], its scale and its min (for
     * each of its two 16s: MMA_MIN multiplies them with the Q8_K block sums) */
    static constexpr int MMA_NG = 1, MMA_KS = 32;
    static constexpr bool MMA_MIN = true, MMA_XSUM = false;
    template <class S> HD static void mma_piece(const QW &w, int64_t row, int kb, int p, int8_t *dst, S &s, int r) {
        const int64_t b = row * w.nb + kb;
        const uint8_t *q = w.qs + b * 128 + 32 * (p >> 1);
        const int sh = 4 * (p & 1);
        for (int j = 0; j < 8; ++j) st_i32(dst + 4 * j, (ld_i32(q + 4 * j) >> sh) & 0x0F0F0F0F);
        s.isc[r][p] = (int8_t)w.sc[b * 16 + p];
        s.imin[r][2 * p] = s.imin[r][2 * p + 1] = (int8_t)w.sc[b * 16 + 8 + p];
        if (p == 0) { s.wd[r][0] = h2f(w.d[2 * b]); s.wm[r][0] = h2f(w.d[2 * b + 1]); }
    }
};

/* ---- Q5_K ------------------------------------------------------------------------------------------------------ */
/* Q5_K (176 B: d, dmin, scales[12], qh[32], qs[128]): Q4_K's nibbles with a fifth bit, qh[l] bit 2c (low nibbles of
 * chunk c) or 2c + 1 (high). Unit u = (c, s) = (u/2, u%2) as Q4_K's. */
template <> struct Unit<T_Q5_K> {
    static constexpr int QK = 256, NU = 8;
    /* repacked: qs[128] [48]   qh[32] [16]   sc[16]: 8 scales then 8 mins, unpacked from [4]
     *           d: half2 (d, dmin) [0] */
    static constexpr Packing PACK = {176, {128, 32, 16, 4}, {48, 16, -1, 0}, unpack_k4_scales};
    int lo[4], hi[4], c, s, sc_lo, sc_hi, m_lo, m_hi;
    float d, dmin;
    HD void load(const QW &w, int64_t b, int u) {
        c = u >> 1;
        s = u & 1;
        int4 v = ld_i4(w.qs + b * 128 + 32 * c + 16 * s), hv = ld_i4(w.qh + b * 32 + 16 * s);
        const int q4[4] = {v.x, v.y, v.z, v.w}, h4[4] = {hv.x, hv.y, hv.z, hv.w};
        for (int i = 0; i < 4; ++i) {
            lo[i] = (q4[i] & 0x0F0F0F0F) | (((h4[i] >> (2 * c)) & 0x01010101) << 4);
            hi[i] = ((q4[i] >> 4) & 0x0F0F0F0F) | (((h4[i] >> (2 * c + 1)) & 0x01010101) << 4);
        }
        const uint8_t *sc = w.sc + b * 16;
        sc_lo = sc[2 * c];
        sc_hi = sc[2 * c + 1];
        m_lo = sc[8 + 2 * c];
        m_hi = sc[8 + 2 * c + 1];
        d = h2f(w.d[2 * b]);
        dmin = h2f(w.d[2 * b + 1]);
    }
    HD float dot(const Act &a, int64_t col, int ib) const {
        const int8_t *x = a.qs + col * a.k + ib * 256 + 64 * c + 16 * s;
        const int *bs = a.bs + col * (a.k / 16) + ib * 16;
        int sumi = sc_lo * dot16(lo, x) + sc_hi * dot16(hi, x + 32);
        int msum = m_lo * bs[4 * c + s] + m_hi * bs[4 * c + 2 + s];
        float d8 = a.d[col * (a.k / 256) + ib];
        return d * d8 * (float)sumi - dmin * d8 * (float)msum;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        const int c = j / 64, l = j % 64, s = 2 * c + (l >= 32);
        const int byte = w.qs[b * 128 + 32 * c + (l & 31)];
        const int q = (l < 32 ? (byte & 15) : (byte >> 4)) | (((w.qh[b * 32 + (l & 31)] >> s) & 1) << 4);
        const float d = h2f(w.d[2 * b]) * (float)w.sc[b * 16 + s];
        const float mm = h2f(w.d[2 * b + 1]) * (float)w.sc[b * 16 + 8 + s];
        return d * (float)q - mm;
    }
    /* MMA stage piece p = sub-block p of block kb: Q4_K's nibble with the fifth bit p of qh[l], its scale and min
     * (as Q4_K's) */
    static constexpr int MMA_NG = 1, MMA_KS = 32;
    static constexpr bool MMA_MIN = true, MMA_XSUM = false;
    template <class S> HD static void mma_piece(const QW &w, int64_t row, int kb, int p, int8_t *dst, S &s, int r) {
        const int64_t b = row * w.nb + kb;
        const uint8_t *q = w.qs + b * 128 + 32 * (p >> 1), *qh = w.qh + b * 32;
        const int sh = 4 * (p & 1);
        for (int j = 0; j < 8; ++j)
            st_i32(dst + 4 * j, ((ld_i32(q + 4 * j) >> sh) & 0x0F0F0F0F) | (((ld_i32(qh + 4 * j) >> p) & 0x01010101) << 4));
        s.isc[r][p] = (int8_t)w.sc[b * 16 + p];
        s.imin[r][2 * p] = s.imin[r][2 * p + 1] = (int8_t)w.sc[b * 16 + 8 + p];
        if (p == 0) { s.wd[r][0] = h2f(w.d[2 * b]); s.wm[r][0] = h2f(w.d[2 * b + 1]); }
    }
};

/* ---- Q6_K ------------------------------------------------------------------------------------------------------ */
/* Q6_K (210 B: ql[128], qh[64], scales[16] int8, d). Half hh (0,1) of 128 elements, l = 0..31:
 *   128hh+l: lo(ql[64hh+l]) | (qh[32hh+l]&3)<<4      128hh+32+l: lo(ql[64hh+32+l]) | ((qh>>2)&3)<<4
 *   128hh+64+l: hi(ql[64hh+l]) | ((qh>>4)&3)<<4      128hh+96+l: hi(ql[64hh+32+l]) | ((qh>>6)&3)<<4
 * minus 32; scale index = element / 16. Unit u: hh = u/4, l = 8(u%4)..+7 -> 4 groups g of 8 elements at
 * 128hh + 32g + l, each under scale 8hh + 2g + (l >= 16). */
template <> struct Unit<T_Q6_K> {
    static constexpr int QK = 256, NU = 8;
    /* repacked: qs[128] = ql [0]   qh[64] [128]   sc[16] int8 [192]   d: half [208] */
    static constexpr Packing PACK = {210, {128, 64, 16, 2}, {0, 128, 192, 208}};
    int q[4][2], sc[4], hh, l0;
    float d;
    HD void load(const QW &w, int64_t b, int u) {
        hh = u >> 2;
        l0 = 8 * (u & 3);
        int2 A = ld_i2(w.qs + b * 128 + 64 * hh + l0), B = ld_i2(w.qs + b * 128 + 64 * hh + 32 + l0);
        int2 H = ld_i2(w.qh + b * 64 + 32 * hh + l0);
        int av[2] = {A.x, A.y}, bv[2] = {B.x, B.y}, hv[2] = {H.x, H.y};
        for (int i = 0; i < 2; ++i) {
            q[0][i] = sext6_minus32((av[i] & 0x0F0F0F0F) | ((hv[i] & 0x03030303) << 4));
            q[1][i] = sext6_minus32((bv[i] & 0x0F0F0F0F) | (((hv[i] >> 2) & 0x03030303) << 4));
            q[2][i] = sext6_minus32(((av[i] >> 4) & 0x0F0F0F0F) | (((hv[i] >> 4) & 0x03030303) << 4));
            q[3][i] = sext6_minus32(((bv[i] >> 4) & 0x0F0F0F0F) | (((hv[i] >> 6) & 0x03030303) << 4));
        }
        const int8_t *s = (const int8_t *)(w.sc + b * 16) + 8 * hh + (l0 >> 4);
        for (int g = 0; g < 4; ++g) sc[g] = s[2 * g];
        d = h2f(w.d[b]);
    }
    HD float dot(const Act &a, int64_t col, int ib) const {
        const int8_t *x = a.qs + col * a.k + ib * 256 + 128 * hh + l0;
        int sumi = 0;
        for (int g = 0; g < 4; ++g) {
            int2 xv = ld_i2(x + 32 * g);
            sumi += sc[g] * dp4a(q[g][1], xv.y, dp4a(q[g][0], xv.x, 0));
        }
        return d * a.d[col * (a.k / 256) + ib] * (float)sumi;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        int hh = j / 128, r = j % 128, g = r / 32, l = r % 32;
        int byte = w.qs[b * 128 + 64 * hh + (g & 1) * 32 + l];
        int low = g >= 2 ? (byte >> 4) : (byte & 15);
        int high = (w.qh[b * 64 + 32 * hh + l] >> (2 * g)) & 3;
        int sc = (int8_t)w.sc[b * 16 + 8 * hh + 2 * g + l / 16];
        return h2f(w.d[b]) * (float)sc * (float)((low | (high << 4)) - 32);
    }
    /* MMA stage piece p = elements 32p + l of block kb: half hh = p / 4, group g = p % 4 (as load's), two scales of 16
     * (m16n8k16 chunks) */
    static constexpr int MMA_NG = 1, MMA_KS = 16;
    static constexpr bool MMA_MIN = false, MMA_XSUM = false;
    template <class S> HD static void mma_piece(const QW &w, int64_t row, int kb, int p, int8_t *dst, S &s, int r) {
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
};

/* ---- IQ2_XXS --------------------------------------------------------------------------------------------------- */
/* IQ2_XXS (66 B: d, qs[64]): group u of 32 = 8 bytes: 4 grid indices, then a u32 of 4 x 7 sign bits and the scale in
 * its top 4 bits; value d/8 * (2 sc + 1) * ±grid. */
template <> struct Unit<T_IQ2_XXS> : Codes256 {
    /* repacked: qs[64] [2]   d [0] */
    static constexpr Packing PACK = {66, {64, 0, 0, 2}, {2, -1, -1, 0}};
    HD void load(const QW &w, int64_t b, int u) {
        int2 q = ld_i2(w.qs + b * 64 + 8 * u);
        const unsigned aux = (unsigned)q.y;
        for (int l = 0; l < 4; ++l) {
            int2 g = grid8(QSC_TABLE(GRID_IQ2_XXS), (q.x >> (8 * l)) & 255);
            const unsigned s = ksign(aux >> (7 * l));
            c[2 * l] = sign_bytes(g.x, s);
            c[2 * l + 1] = sign_bytes(g.y, s >> 4);
        }
        ls[0] = ls[1] = 2 * (int)(aux >> 28) + 1;
        m = h2f(w.d[b]) * 0.125f;
        e0 = 32 * u;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        const int g = j / 32, l = (j % 32) / 8, e = j % 8;
        const uint8_t *q = w.qs + b * 64 + 8 * g;
        const unsigned aux = (unsigned)ld_i32(q + 4);
        const float db = h2f(w.d[b]) * (0.5f + (float)(aux >> 28)) * 0.25f;
        return db * (float)QSC_TABLE(GRID_IQ2_XXS)[q[l]][e] * sgnf(ksign(aux >> (7 * l)), e);
    }
    QSC_CODES256_MMA(T_IQ2_XXS)
};

/* ---- IQ2_XS ---------------------------------------------------------------------------------------------------- */
/* IQ2_XS (74 B: d, qs u16[32]: 9-bit grid index | 7 sign bits, scales[8]: a 4-bit scale per 16). */
template <> struct Unit<T_IQ2_XS> : Codes256 {
    /* repacked: qs[64] [2]   sc[8] [66]   d [0] */
    static constexpr Packing PACK = {74, {64, 0, 8, 2}, {2, -1, 66, 0}};
    HD void load(const QW &w, int64_t b, int u) {
        int2 q = ld_i2(w.qs + b * 64 + 8 * u);
        const unsigned e[4] = {(unsigned)q.x & 0xFFFFu, (unsigned)q.x >> 16, (unsigned)q.y & 0xFFFFu,
                               (unsigned)q.y >> 16};
        for (int l = 0; l < 4; ++l) {
            int2 g = grid8(QSC_TABLE(GRID_IQ2_XS), e[l] & 511);
            const unsigned s = ksign(e[l] >> 9);
            c[2 * l] = sign_bytes(g.x, s);
            c[2 * l + 1] = sign_bytes(g.y, s >> 4);
        }
        const int sc = w.sc[b * 8 + u];
        ls[0] = 2 * (sc & 15) + 1;
        ls[1] = 2 * (sc >> 4) + 1;
        m = h2f(w.d[b]) * 0.125f;
        e0 = 32 * u;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        const int en = j / 8, e = j % 8;
        const unsigned q = ld_u16(w.qs + b * 64 + 2 * en);
        const int sc = (w.sc[b * 8 + en / 4] >> (4 * ((en / 2) & 1))) & 15;
        const float db = h2f(w.d[b]) * (0.5f + (float)sc) * 0.25f;
        return db * (float)QSC_TABLE(GRID_IQ2_XS)[q & 511][e] * sgnf(ksign(q >> 9), e);
    }
    QSC_CODES256_MMA(T_IQ2_XS)
};

/* ---- IQ3_XXS --------------------------------------------------------------------------------------------------- */
/* IQ3_XXS (98 B: d, qs[64]: a 4-value grid index per byte, then u32[8]: 4 x 7 sign bits and a 4-bit scale);
 * value d/4 * (2 sc + 1) * ±grid. */
template <> struct Unit<T_IQ3_XXS> : Codes256 {
    /* repacked: qs[64] [2]   sc[32] (scales and signs) [66]   d [0] */
    static constexpr Packing PACK = {98, {64, 0, 32, 2}, {2, -1, 66, 0}};
    HD void load(const QW &w, int64_t b, int u) {
        int2 q = ld_i2(w.qs + b * 64 + 8 * u);
        const unsigned aux = (unsigned)ld_i32(w.sc + b * 32 + 4 * u);
        for (int l = 0; l < 4; ++l) {
            const int idx = l < 2 ? q.x >> (16 * l) : q.y >> (16 * (l - 2));
            const unsigned s = ksign(aux >> (7 * l));
            c[2 * l] = sign_bytes(grid4(QSC_TABLE(GRID_IQ3_XXS), idx & 255), s);
            c[2 * l + 1] = sign_bytes(grid4(QSC_TABLE(GRID_IQ3_XXS), (idx >> 8) & 255), s >> 4);
        }
        ls[0] = ls[1] = 2 * (int)(aux >> 28) + 1;
        m = h2f(w.d[b]) * 0.25f;
        e0 = 32 * u;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        const int g = j / 32, e = j % 32, l = e / 8;
        const unsigned aux = (unsigned)ld_i32(w.sc + b * 32 + 4 * g);
        const float db = h2f(w.d[b]) * (0.5f + (float)(aux >> 28)) * 0.5f;
        const int idx = w.qs[b * 64 + 8 * g + e / 4];
        return db * (float)QSC_TABLE(GRID_IQ3_XXS)[idx][e % 4] * sgnf(ksign(aux >> (7 * l)), e % 8);
    }
    QSC_CODES256_MMA(T_IQ3_XXS)
};

/* ---- IQ1_S ----------------------------------------------------------------------------------------------------- */
/* Four IQ1 grid values (-1, 0, 1 per byte) -> 8 * value + delta per byte (delta = ±1): the bytes times 8 have their
 * low three bits clear, so +1 is an or and -1 a per-byte subtract. */
HD int iq1_codes(int g, int delta) {
    const unsigned x = ((unsigned)g << 3) & 0xF8F8F8F8u;
    return (int)(delta > 0 ? x | 0x01010101u : vsub4(x, 0x01010101u));
}

/* IQ1_S (50 B: d, qs[32] index low bytes, qh u16[8]: 3 high index bits per 8 elements, a 3-bit scale, the delta's
 * sign): code 8 * grid ± 1, value d/8 * (2 sc + 1) * code. */
template <> struct Unit<T_IQ1_S> : Codes256 {
    /* repacked: qs[32] [2]   qh[16] [34]   d [0] */
    static constexpr Packing PACK = {50, {32, 16, 0, 2}, {2, 34, -1, 0}};
    HD void load(const QW &w, int64_t b, int u) {
        const unsigned qh = ld_u16(w.qh + b * 16 + 2 * u);
        const int delta = qh & 0x8000u ? -1 : 1;
        for (int l = 0; l < 4; ++l) {
            int2 g = grid8s(QSC_TABLE(GRID_IQ1_S), w.qs[b * 32 + 4 * u + l] | (int)(((qh >> (3 * l)) & 7u) << 8));
            c[2 * l] = iq1_codes(g.x, delta);
            c[2 * l + 1] = iq1_codes(g.y, delta);
        }
        ls[0] = ls[1] = 2 * (int)((qh >> 12) & 7u) + 1;
        m = h2f(w.d[b]) * 0.125f;
        e0 = 32 * u;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        const int g = j / 32, l = (j % 32) / 8;
        const unsigned qh = ld_u16(w.qh + b * 16 + 2 * g);
        const float dl = h2f(w.d[b]) * (2.0f * (float)((qh >> 12) & 7u) + 1.0f);
        const float delta = qh & 0x8000u ? -0.125f : 0.125f;
        const int idx = w.qs[b * 32 + 4 * g + l] | (int)(((qh >> (3 * l)) & 7u) << 8);
        return dl * ((float)QSC_TABLE(GRID_IQ1_S)[idx][j % 8] + delta);
    }
    QSC_CODES256_MMA(T_IQ1_S)
};

/* ---- IQ4_NL ---------------------------------------------------------------------------------------------------- */
/* IQ4_NL (18 B: d, qs[16]): Q4_0's nibble layout, values from the code book; against Q8_0. */
template <> struct Unit<T_IQ4_NL> {
    static constexpr int QK = 32, NU = 2;
    /* repacked: qs[16] [2]   d [0] */
    static constexpr Packing PACK = {18, {16, 0, 0, 2}, {2, -1, -1, 0}};
    int lo[2], hi[2], h;
    float d;
    HD void load(const QW &w, int64_t b, int u) {
        h = u;
        int2 v = ld_i2(w.qs + b * 16 + 8 * h);
        const Lut16 t = lut16_words(QSC_SMALL(IQ4NL));
        lo[0] = lut16(v.x & 0x0F0F0F0F, t);
        hi[0] = lut16((v.x >> 4) & 0x0F0F0F0F, t);
        lo[1] = lut16(v.y & 0x0F0F0F0F, t);
        hi[1] = lut16((v.y >> 4) & 0x0F0F0F0F, t);
        d = h2f(w.d[b]);
    }
    HD float dot(const Act &a, int64_t col, int ib) const {
        const int8_t *x = a.qs + col * a.k + ib * 32;
        int2 xl = ld_i2(x + 8 * h), xh = ld_i2(x + 16 + 8 * h);
        int s = dp4a(lo[0], xl.x, 0);
        s = dp4a(lo[1], xl.y, s);
        s = dp4a(hi[0], xh.x, s);
        s = dp4a(hi[1], xh.y, s);
        return (float)s * (d * a.d[col * (a.k / 32) + ib]);
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        const int byte = w.qs[b * 16 + (j & 15)];
        return h2f(w.d[b]) * (float)QSC_SMALL(IQ4NL)[j < 16 ? (byte & 15) : (byte >> 4)];
    }
    /* MMA stage piece p: block kb * 8 + p's code book values as int8, its d */
    static constexpr int MMA_NG = 8, MMA_KS = 32;
    static constexpr bool MMA_MIN = false, MMA_XSUM = false;
    template <class S> HD static void mma_piece(const QW &w, int64_t row, int kb, int p, int8_t *dst, S &s, int r) {
        const int64_t b = row * w.nb + kb * 8 + p;
        const int4 v = ld_i4(w.qs + b * 16);
        const int vw[4] = {v.x, v.y, v.z, v.w};
        const Lut16 t = lut16_words(QSC_SMALL(IQ4NL));
        for (int j = 0; j < 4; ++j) { /* bytes 4j..4j+3: elements 4j.. (low nibbles) and 16+4j.. (high) */
            st_i32(dst + 4 * j, lut16(vw[j] & 0x0F0F0F0F, t));
            st_i32(dst + 16 + 4 * j, lut16((vw[j] >> 4) & 0x0F0F0F0F, t));
        }
        s.wd[r][p] = h2f(w.d[b]);
    }
};

/* ---- IQ3_S ----------------------------------------------------------------------------------------------------- */
/* IQ3_S (110 B: d, qs[64] index low bytes, qh[8] ninth bits, signs[32] one bit per element, scales[4] 4 bits per
 * 32); value d * (2 sc + 1) * ±grid. */
template <> struct Unit<T_IQ3_S> : Codes256 {
    /* repacked: qs[64] [2]   qh[8] [66]   sc[36] (signs, then scales) [74]   d [0] */
    static constexpr Packing PACK = {110, {64, 8, 36, 2}, {2, 66, 74, 0}};
    HD void load(const QW &w, int64_t b, int u) {
        const uint8_t *qs = w.qs + b * 64 + 8 * u, *sg = w.sc + b * 36;
        const unsigned qh = w.qh[b * 8 + u];
        for (int l = 0; l < 8; ++l) {
            const int idx = qs[l] | (int)(((qh >> l) & 1u) << 8);
            c[l] = sign_bytes(grid4(QSC_TABLE(GRID_IQ3_S), idx), (unsigned)sg[4 * u + l / 2] >> (4 * (l & 1)));
        }
        const int sc = (sg[32 + u / 2] >> (4 * (u & 1))) & 15;
        ls[0] = ls[1] = 2 * sc + 1;
        m = h2f(w.d[b]);
        e0 = 32 * u;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        const int g = j / 32, en = j / 4;
        const uint8_t *sg = w.sc + b * 36;
        const int sc = (sg[32 + g / 2] >> (4 * (g & 1))) & 15;
        const float db = h2f(w.d[b]) * (float)(1 + 2 * sc);
        const int idx = w.qs[b * 64 + en] | (((w.qh[b * 8 + en / 8] >> (en % 8)) & 1) << 8);
        return db * (float)QSC_TABLE(GRID_IQ3_S)[idx][j % 4] * sgnf(sg[j / 8], j % 8);
    }
    QSC_CODES256_MMA(T_IQ3_S)
};

/* ---- IQ2_S ----------------------------------------------------------------------------------------------------- */
/* IQ2_S (82 B: d, qs[32] grid index low bytes, signs[32], qh[8] 2 high index bits each, scales[8]). */
template <> struct Unit<T_IQ2_S> : Codes256 {
    /* repacked: qs[64] (indices, signs) [2]   qh[8] [66]   sc[8] [74]   d [0] */
    static constexpr Packing PACK = {82, {64, 8, 8, 2}, {2, 66, 74, 0}};
    HD void load(const QW &w, int64_t b, int u) {
        const uint8_t *qs = w.qs + b * 64;
        const unsigned qh = w.qh[b * 8 + u];
        for (int l = 0; l < 4; ++l) {
            const int e = 4 * u + l;
            int2 g = grid8(QSC_TABLE(GRID_IQ2_S), qs[e] | (int)(((qh >> (2 * l)) & 3u) << 8));
            const unsigned s = qs[32 + e];
            c[2 * l] = sign_bytes(g.x, s);
            c[2 * l + 1] = sign_bytes(g.y, s >> 4);
        }
        const int sc = w.sc[b * 8 + u];
        ls[0] = 2 * (sc & 15) + 1;
        ls[1] = 2 * (sc >> 4) + 1;
        m = h2f(w.d[b]) * 0.125f;
        e0 = 32 * u;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        const int en = j / 8, e = j % 8;
        const uint8_t *qs = w.qs + b * 64;
        const int idx = qs[en] | (((w.qh[b * 8 + en / 4] >> (2 * (en % 4))) & 3) << 8);
        const int sc = (w.sc[b * 8 + en / 4] >> (4 * ((en / 2) & 1))) & 15;
        const float db = h2f(w.d[b]) * (0.5f + (float)sc) * 0.25f;
        return db * (float)QSC_TABLE(GRID_IQ2_S)[idx][e] * sgnf(qs[32 + en], e);
    }
    QSC_CODES256_MMA(T_IQ2_S)
};

/* ---- IQ4_XS ---------------------------------------------------------------------------------------------------- */
/* IQ4_XS's eight ls - 32, one signed byte each (on upload, host) */
static inline void unpack_iq4xs_scales(const uint8_t *blk, uint8_t *sc) {
    const unsigned sh = ld_u16(blk + 2);
    for (int s = 0; s < 8; ++s) {
        int ls = ((blk[4 + s / 2] >> (4 * (s % 2))) & 15) | (int)(((sh >> (2 * s)) & 3u) << 4);
        sc[s] = (uint8_t)(int8_t)(ls - 32);
    }
}

/* IQ4_XS (136 B: d, scales_h u16, scales_l[4], qs[128]): sub-block u of 32 = bytes 16u..16u+15 (low nibbles:
 * elements 32u.., high: 32u+16..) under ls - 32 (unpacked on upload); against Q8_K. */
template <> struct Unit<T_IQ4_XS> {
    static constexpr int QK = 256, NU = 8;
    /* repacked: qs[128] [8]   sc[8] int8 (ls - 32), unpacked from [2..7]   d [0] */
    static constexpr Packing PACK = {136, {128, 0, 8, 2}, {8, -1, -1, 0}, unpack_iq4xs_scales};
    int lo[4], hi[4], u, ls;
    float d;
    HD void load(const QW &w, int64_t b, int u_) {
        u = u_;
        int4 v = ld_i4(w.qs + b * 128 + 16 * u);
        const int q4[4] = {v.x, v.y, v.z, v.w};
        const Lut16 t = lut16_words(QSC_SMALL(IQ4NL));
        for (int i = 0; i < 4; ++i) {
            lo[i] = lut16(q4[i] & 0x0F0F0F0F, t);
            hi[i] = lut16((q4[i] >> 4) & 0x0F0F0F0F, t);
        }
        ls = (int8_t)w.sc[b * 8 + u];
        d = h2f(w.d[b]);
    }
    HD float dot(const Act &a, int64_t col, int ib) const {
        const int8_t *x = a.qs + col * a.k + ib * 256 + 32 * u;
        const int p = dot16(lo, x) + dot16(hi, x + 16);
        return (float)(p * ls) * (d * a.d[col * (a.k / 256) + ib]);
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        const int s = j / 32, l = j % 32;
        const float dl = h2f(w.d[b]) * (float)(int8_t)w.sc[b * 8 + s];
        const int byte = w.qs[b * 128 + 16 * s + (l & 15)];
        return dl * (float)QSC_SMALL(IQ4NL)[l < 16 ? (byte & 15) : (byte >> 4)];
    }
    /* MMA stage piece p = sub-block p: its code book values as int8 (bytes 16p..: low nibbles first), ls - 32 */
    static constexpr int MMA_NG = 1, MMA_KS = 32;
    static constexpr bool MMA_MIN = false, MMA_XSUM = false;
    template <class S> HD static void mma_piece(const QW &w, int64_t row, int kb, int p, int8_t *dst, S &s, int r) {
        const int64_t b = row * w.nb + kb;
        const int4 v = ld_i4(w.qs + b * 128 + 16 * p);
        const int vw[4] = {v.x, v.y, v.z, v.w};
        const Lut16 t = lut16_words(QSC_SMALL(IQ4NL));
        for (int j = 0; j < 4; ++j) {
            st_i32(dst + 4 * j, lut16(vw[j] & 0x0F0F0F0F, t));
            st_i32(dst + 16 + 4 * j, lut16((vw[j] >> 4) & 0x0F0F0F0F, t));
        }
        s.isc[r][p] = (int8_t)w.sc[b * 8 + p];
        if (p == 0) s.wd[r][0] = h2f(w.d[b]);
    }
};

/* ---- IQ1_M ----------------------------------------------------------------------------------------------------- */
/* IQ1_M (56 B: qs[32], qh[16]: per 8 elements 3 high index bits and the delta's sign, scales u16[4]: 3 bits per 16
 * and fp16 d in their top nibbles). */
HD float iq1m_d(const uint8_t *sw) {
    const unsigned s0 = ld_u16(sw), s1 = ld_u16(sw + 2), s2 = ld_u16(sw + 4), s3 = ld_u16(sw + 6);
    __half_raw r;
    r.x = (unsigned short)((s0 >> 12) | ((s1 >> 8) & 0x00F0u) | ((s2 >> 4) & 0x0F00u) | (s3 & 0xF000u));
    return h2f(__half(r));
}
template <> struct Unit<T_IQ1_M> : Codes256 {
    /* repacked: qs[32] [0]   qh[16] [32]   sc[8] (scales, d in their top nibbles) [48] */
    static constexpr Packing PACK = {56, {32, 16, 8, 0}, {0, 32, 48, -1}};
    HD void load(const QW &w, int64_t b, int u) {
        const uint8_t *sw = w.sc + b * 8;
        for (int l = 0; l < 4; ++l) {
            const int e = 4 * u + l;
            const unsigned nib = (w.qh[b * 16 + e / 2] >> (4 * (e & 1))) & 15u;
            const int delta = nib & 8u ? -1 : 1;
            int2 g = grid8s(QSC_TABLE(GRID_IQ1_S), w.qs[b * 32 + e] | (int)((nib & 7u) << 8));
            c[2 * l] = iq1_codes(g.x, delta);
            c[2 * l + 1] = iq1_codes(g.y, delta);
        }
        const unsigned word = ld_u16(sw + 2 * (u / 2));
        ls[0] = 2 * (int)((word >> (3 * (2 * (u & 1)))) & 7u) + 1;
        ls[1] = 2 * (int)((word >> (3 * (2 * (u & 1) + 1))) & 7u) + 1;
        m = iq1m_d(sw) * 0.125f;
        e0 = 32 * u;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        const int e = j / 8, s = e / 2;
        const uint8_t *sw = w.sc + b * 8;
        const unsigned nib = (w.qh[b * 16 + e / 2] >> (4 * (e & 1))) & 15u;
        const int sc = (int)((ld_u16(sw + 2 * (s / 4)) >> (3 * (s % 4))) & 7u);
        const float dl = iq1m_d(sw) * (2.0f * (float)sc + 1.0f);
        const float delta = nib & 8u ? -0.125f : 0.125f;
        return dl * ((float)QSC_TABLE(GRID_IQ1_S)[w.qs[b * 32 + e] | (int)((nib & 7u) << 8)][j % 8] + delta);
    }
    QSC_CODES256_MMA(T_IQ1_M)
};

/* ---- BF16 ------------------------------------------------------------------------------------------------------ */
/* BF16 rows: as F16, the activation rounded to bf16 first (the CPU's BF16 x BF16 dot). */
template <> struct Unit<T_BF16> {
    static constexpr int QK = 32, NU = 4;
    /* repacked: the rows as stored, in qs */
    static constexpr Packing PACK = {64, {64, 0, 0, 0}, {0, -1, -1, -1}};
    float wv[8];
    int u;
    HD void load(const QW &w, int64_t b, int u_) {
        u = u_;
        int4 v = ld_i4(w.qs + (b * 32 + 8 * u) * 2);
        const unsigned p[4] = {(unsigned)v.x, (unsigned)v.y, (unsigned)v.z, (unsigned)v.w};
        for (int i = 0; i < 4; ++i) {
            wv[2 * i] = bf16_bits_to_f(p[i] & 0xFFFFu);
            wv[2 * i + 1] = bf16_bits_to_f(p[i] >> 16);
        }
    }
    HD float dot(const Act &a, int64_t col, int ib) const {
        const float *x = a.f + col * a.k + ib * 32 + 8 * u;
        float4 x0 = ld_f4(x), x1 = ld_f4(x + 4);
        const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        float s = 0.0f;
        for (int i = 0; i < 8; ++i) s += wv[i] * bf16_round(xs[i]);
        return s;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        return bf16_bits_to_f(ld_u16(w.qs + 2 * (b * 32 + j)));
    }
    /* MMA (bf16 x bf16 -> fp32 tensor cores): as F16's, the activations rounded to bf16 as the dot does */
    QSC_FLOAT_MMA
    HD static unsigned mma_pack2(float lo, float hi) { return bf16_bits(lo) | bf16_bits(hi) << 16; }
    HD static float mma_unpack(unsigned h) { return bf16_bits_to_f(h & 0xFFFFu); }
};

/* ---- TQ1_0 ----------------------------------------------------------------------------------------------------- */
/* TQ1_0 (54 B: qs[48], qh[4], d): base-3 digits; element 32k + j = trit(qs[j], k) (k < 5), 160 + 16k + j =
 * trit(qs[32 + j], k) (k < 5), 240 + 4k + j = trit(qh[j], k) (k < 4); value d * (trit - 1). */
HD int tq1_code(const uint8_t *q, int e) {
    if (e < 160) return trit(q[e & 31], e >> 5) - 1;
    if (e < 240) return trit(q[32 + ((e - 160) & 15)], (e - 160) >> 4) - 1;
    return trit(q[48 + ((e - 240) & 3)], (e - 240) >> 2) - 1;
}
template <> struct Unit<T_TQ1_0> : Codes256 {
    /* repacked: qs[52] (qs and qh) [0]   d [52] */
    static constexpr Packing PACK = {54, {52, 0, 0, 2}, {0, -1, -1, 52}};
    HD void load(const QW &w, int64_t b, int u) {
        const uint8_t *q = w.qs + b * 52;
        for (int i = 0; i < 8; ++i) {
            unsigned r = 0;
            for (int j = 0; j < 4; ++j) r |= (unsigned)(tq1_code(q, 32 * u + 4 * i + j) & 0xFF) << (8 * j);
            c[i] = (int)r;
        }
        ls[0] = ls[1] = 1;
        m = h2f(w.d[b]);
        e0 = 32 * u;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        return h2f(w.d[b]) * (float)tq1_code(w.qs + b * 52, j);
    }
    QSC_CODES256_MMA(T_TQ1_0)
};

/* ---- TQ2_0 ----------------------------------------------------------------------------------------------------- */
/* TQ2_0 (66 B: qs[64], d): element 128h + 32k + j = ((qs[32h + j] >> 2k) & 3) - 1, value d * that. */
template <> struct Unit<T_TQ2_0> : Codes256 {
    /* repacked: qs[64] [0]   d [64] */
    static constexpr Packing PACK = {66, {64, 0, 0, 2}, {0, -1, -1, 64}};
    HD void load(const QW &w, int64_t b, int u) {
        const int h = u >> 2, k = u & 3;
        int4 A = ld_i4(w.qs + b * 64 + 32 * h), B = ld_i4(w.qs + b * 64 + 32 * h + 16);
        const int v[8] = {A.x, A.y, A.z, A.w, B.x, B.y, B.z, B.w};
        for (int i = 0; i < 8; ++i) {
            const int t = (v[i] >> (2 * k)) & 0x03030303;                /* 0..2 per byte */
            c[i] = (int)(((unsigned)t | 0x80808080u) - 0x01010101u) ^ (int)0x80808080u; /* t - 1, no borrows */
        }
        ls[0] = ls[1] = 1;
        m = h2f(w.d[b]);
        e0 = 32 * u;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        const int h = j / 128, k = (j % 128) / 32, l = j % 32;
        return h2f(w.d[b]) * (float)(((w.qs[b * 64 + 32 * h + l] >> (2 * k)) & 3) - 1);
    }
    QSC_CODES256_MMA(T_TQ2_0)
};

/* ---- MXFP4 ----------------------------------------------------------------------------------------------------- */
/* MXFP4 (17 B: E8M0 e, qs[16]): Q4_0's nibble layout, E2M1 values doubled, scale 2^(e-128); against Q8_0 with the
 * CPU's (scale * d8) * Σ. */
template <> struct Unit<T_MXFP4> {
    static constexpr int QK = 32, NU = 2;
    /* repacked: qs[16] [1]   sc[1]: the E8M0 byte [0] */
    static constexpr Packing PACK = {17, {16, 0, 1, 0}, {1, -1, 0, -1}};
    int lo[2], hi[2], h;
    float d;
    HD void load(const QW &w, int64_t b, int u) {
        h = u;
        int2 v = ld_i2(w.qs + b * 16 + 8 * h);
        const Lut16 t = lut16_words(QSC_SMALL(FP4));
        lo[0] = lut16(v.x & 0x0F0F0F0F, t);
        hi[0] = lut16((v.x >> 4) & 0x0F0F0F0F, t);
        lo[1] = lut16(v.y & 0x0F0F0F0F, t);
        hi[1] = lut16((v.y >> 4) & 0x0F0F0F0F, t);
        d = e8m0_half(w.sc[b]);
    }
    HD float dot(const Act &a, int64_t col, int ib) const {
        const int8_t *x = a.qs + col * a.k + ib * 32;
        int2 xl = ld_i2(x + 8 * h), xh = ld_i2(x + 16 + 8 * h);
        int s = dp4a(lo[0], xl.x, 0);
        s = dp4a(lo[1], xl.y, s);
        s = dp4a(hi[0], xh.x, s);
        s = dp4a(hi[1], xh.y, s);
        return (d * a.d[col * (a.k / 32) + ib]) * (float)s;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        const int byte = w.qs[b * 16 + (j & 15)];
        return e8m0_half(w.sc[b]) * (float)QSC_SMALL(FP4)[j < 16 ? (byte & 15) : (byte >> 4)];
    }
    /* MMA stage piece p: block kb * 8 + p's doubled E2M1 values as int8, its scale (the dot's (d * d8) * Σ) */
    static constexpr int MMA_NG = 8, MMA_KS = 32;
    static constexpr bool MMA_MIN = false, MMA_XSUM = false;
    template <class S> HD static void mma_piece(const QW &w, int64_t row, int kb, int p, int8_t *dst, S &s, int r) {
        const int64_t b = row * w.nb + kb * 8 + p;
        const int4 v = ld_i4(w.qs + b * 16);
        const int vw[4] = {v.x, v.y, v.z, v.w};
        const Lut16 t = lut16_words(QSC_SMALL(FP4));
        for (int j = 0; j < 4; ++j) { /* bytes 4j..4j+3: elements 4j.. (low nibbles) and 16+4j.. (high) */
            st_i32(dst + 4 * j, lut16(vw[j] & 0x0F0F0F0F, t));
            st_i32(dst + 16 + 4 * j, lut16((vw[j] >> 4) & 0x0F0F0F0F, t));
        }
        s.wd[r][p] = e8m0_half(w.sc[b]);
    }
};

/* ---- NVFP4 ----------------------------------------------------------------------------------------------------- */
/* NVFP4 (36 B: 4 UE4M3 scales, qs[32]) over 64 elements: sub-block s of 16 = bytes 8s..8s+7 (low nibbles: elements
 * 16s.., high: 16s+8..), one unit each; against Q8_0 (two activation blocks per weight block). */
template <> struct Unit<T_NVFP4> {
    static constexpr int QK = 64, NU = 4;
    /* repacked: qs[32] [4]   sc[4]: the UE4M3 bytes [0]   (64 elements) */
    static constexpr Packing PACK = {36, {32, 0, 4, 0}, {4, -1, 0, -1}};
    int lo[2], hi[2], s;
    float d;
    HD void load(const QW &w, int64_t b, int u) {
        s = u;
        int2 v = ld_i2(w.qs + b * 32 + 8 * s);
        const Lut16 t = lut16_words(QSC_SMALL(FP4));
        lo[0] = lut16(v.x & 0x0F0F0F0F, t);
        lo[1] = lut16(v.y & 0x0F0F0F0F, t);
        hi[0] = lut16((v.x >> 4) & 0x0F0F0F0F, t);
        hi[1] = lut16((v.y >> 4) & 0x0F0F0F0F, t);
        d = ue4m3_half(w.sc[b * 4 + s]);
    }
    HD float dot(const Act &a, int64_t col, int ib) const {
        const int8_t *x = a.qs + col * a.k + ib * 64 + 16 * s;
        int4 xv = ld_i4(x);
        int p = dp4a(lo[0], xv.x, 0);
        p = dp4a(lo[1], xv.y, p);
        p = dp4a(hi[0], xv.z, p);
        p = dp4a(hi[1], xv.w, p);
        return (d * a.d[col * (a.k / 32) + 2 * ib + (s >> 1)]) * (float)p;
    }
    HD static float elem(const QW &w, int64_t b, int j) {
        const int s = j / 16, l = j % 16;
        const int byte = w.qs[b * 32 + 8 * s + (l & 7)];
        return ue4m3_half(w.sc[b * 4 + s]) * (float)QSC_SMALL(FP4)[l < 8 ? (byte & 15) : (byte >> 4)];
    }
    /* MMA stage piece p: block kb * 4 + p / 2's sub-blocks 2 (p & 1) and + 1, each 16 doubled E2M1 values in element
     * order under its own scale: 16 scale groups of 16 per stage (m16n8k16), the dot's (d * d8) * Σ per group */
    static constexpr int MMA_NG = 16, MMA_KS = 16;
    static constexpr bool MMA_MIN = false, MMA_XSUM = false;
    template <class S> HD static void mma_piece(const QW &w, int64_t row, int kb, int p, int8_t *dst, S &s, int r) {
        const int64_t b = row * w.nb + kb * 4 + (p >> 1);
        const int4 v = ld_i4(w.qs + b * 32 + 16 * (p & 1)); /* sub-blocks 2 (p & 1), + 1: 8 bytes each */
        const int vw[4] = {v.x, v.y, v.z, v.w};
        const Lut16 t = lut16_words(QSC_SMALL(FP4));
        for (int h = 0; h < 2; ++h) { /* sub-block h: low nibbles = its elements 0..7, high = 8..15 */
            st_i32(dst + 16 * h, lut16(vw[2 * h] & 0x0F0F0F0F, t));
            st_i32(dst + 16 * h + 4, lut16(vw[2 * h + 1] & 0x0F0F0F0F, t));
            st_i32(dst + 16 * h + 8, lut16((vw[2 * h] >> 4) & 0x0F0F0F0F, t));
            st_i32(dst + 16 * h + 12, lut16((vw[2 * h + 1] >> 4) & 0x0F0F0F0F, t));
            s.wd[r][2 * p + h] = ue4m3_half(w.sc[b * 4 + 2 * (p & 1) + h]);
        }
    }
};

/* ==================================================================================================================
 * Generated from the list. */

/* The host's type table, indexed by ggml id (an all-zero row: not a device type). */
#define QSC_ROW_NTYPES(F, N, ID, ACT, GEMV, MMA) n = n > ID ? n : ID + 1;
constexpr int qsc_ntypes() {
    int n = 0;
    QSC_TYPE_LIST(QSC_ROW_NTYPES, _)
    return n;
}
#undef QSC_ROW_NTYPES
constexpr int QSC_NTYPES = qsc_ntypes();

template <int TYPE> constexpr TypeDesc type_row() {
    using U = Unit<TYPE>;
    using C = TypeCaps<TYPE>;
    constexpr Packing P = U::PACK;
    return TypeDesc{U::QK,
                    P.raw_bytes,
                    C::ACTF,
                    {P.field[0], P.field[1], P.field[2], P.field[3]},
                    {P.src[0], P.src[1], P.src[2], P.src[3]},
                    P.unpack,
                    C::GEMV_OK,
                    C::MMA_OK};
}
struct TypeTable {
    TypeDesc t[QSC_NTYPES];
};
constexpr TypeTable make_type_table() {
    TypeTable tt = {};
#define QSC_ROW_DESC(F, N, ID, ACT, GEMV, MMA) tt.t[ID] = type_row<T_##N>();
    QSC_TYPE_LIST(QSC_ROW_DESC, _)
#undef QSC_ROW_DESC
    return tt;
}
static constexpr TypeTable QSC_TYPE_TABLE = make_type_table();

static inline const TypeDesc &type_desc(int type) {
    static const TypeDesc none = {};
    return type >= 0 && type < QSC_NTYPES ? QSC_TYPE_TABLE.t[type] : none;
}

/* Element e of row `row` from the repacked layout (embedding lookup): the type's elem(). */
HD float dequant_elem(const QW &w, int64_t row, int64_t e) {
    const int qk = (int)(w.k / w.nb);
    const int64_t b = row * w.nb + e / qk;
    const int j = (int)(e % qk);
    switch (w.type) {
#define QSC_ELEM(T) case T: return Unit<T>::elem(w, b, j);
        QSC_FOR_TYPES(QSC_ELEM)
#undef QSC_ELEM
    default: return 0.0f;
    }
}
