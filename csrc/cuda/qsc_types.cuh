/* The device's weight types beyond the first eight (included by qsc_common.cuh after its own Unit specialisations):
 * Q5_1, the K-quants Q2_K Q3_K Q5_K, BF16, IQ4_NL, IQ4_XS, MXFP4, NVFP4, the i-quants IQ1_S … IQ3_S and the ternary
 * TQ1_0 / TQ2_0. Each type has
 *   - its row in QSC_TYPES (qsc_common.cuh): the repacked sections (structure of arrays, still quantized),
 *   - a Unit<T> (decode one unit of a block into int8 lanes once, dot it with an activation row),
 *   - an element decoder for dequant_elem (embedding lookups), bit-exact with the CPU's reference dequantizers
 *     (csrc/qs_quant.c, csrc/qs_iquants.c): every expression below keeps the CPU's order of float operations and
 *     every product in it is exact in fp32, so a fused multiply-add gives the same bits as the CPU's two roundings.
 * Dots use the activation format the CPU pairs with the type (csrc/qs_traits.c: Q8_1 for Q5_1, Q8_0 for IQ4_NL /
 * MXFP4 / NVFP4, Q8_K for the 256-element types, bf16-rounded floats for BF16) and the CPU's integer sums; only the
 * order in which the per-unit float products are added differs from the CPU (so results agree to float rounding).
 *
 * Repacked sections per block (b = row * nb + i), the file block's offsets in brackets:
 *   Q5_1    qs[16] [8]      qh u32 [4]                           d: half2 (d, m) [0]
 *   Q2_K    qs[64] [16]                 sc[16] [0]              d: half2 (d, dmin) [80]
 *   Q3_K    qs[64] [32]     qh[32] [0]  sc[16] int8, the 6-bit scales minus 32 unpacked from [96]   d [108]
 *   Q5_K    qs[128] [48]    qh[32] [16] sc[16]: 8 scales then 8 mins, unpacked from [4]             d: half2 [0]
 *   BF16    the rows as stored
 *   IQ4_NL  qs[16] [2]                                           d [0]
 *   IQ4_XS  qs[128] [8]                 sc[8] int8 (ls - 32), unpacked from [2..7]                  d [0]
 *   MXFP4   qs[16] [1]                  sc[1]: the E8M0 byte [0]
 *   NVFP4   qs[32] [4]                  sc[4]: the UE4M3 bytes [0]                                   (64 elements)
 *   IQ2_XXS qs[64] [2]                                           d [0]
 *   IQ2_XS  qs[64] [2]                  sc[8] [66]              d [0]
 *   IQ2_S   qs[64] [2] (indices, signs) qh[8] [66]  sc[8] [74]  d [0]
 *   IQ3_XXS qs[64] [2]                  sc[32] [66] (scales and signs)                          d [0]
 *   IQ3_S   qs[64] [2]      qh[8] [66]  sc[36] [74] (signs, then scales)                        d [0]
 *   IQ1_S   qs[32] [2]      qh[16] [34]                                                         d [0]
 *   IQ1_M   qs[32] [0]      qh[16] [32] sc[8] [48] (scales, d in their top nibbles)
 *   TQ1_0   qs[52] [0] (qs and qh)                                                              d [52]
 *   TQ2_0   qs[64] [0]                                                                          d [64] */
#pragma once

/* ------------------------------------------------------------------------------------------------------------------
 * Code books. The i-quant grids are csrc/qs_iq_grids.h's (the CPU's own tables, generated from gguf-py): included once
 * as they are (host copies, static const) and once more with every name mapped to a device copy, so the two are the
 * same text. */
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
HD float bf16_round(float x) {
    unsigned u;
    memcpy(&u, &x, 4);
    unsigned h = (u & 0x7FFFFFFFu) > 0x7F800000u ? ((u >> 16) | 64u) : ((u + (0x7FFFu + ((u >> 16) & 1u))) >> 16);
    return bf16_bits_to_f(h & 0xFFFFu);
}
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

/* Q5_1 (24 B: d, m, qh u32, qs[16]); x = q*d + m, q = nibble | bit e of qh << 4; against Q8_1 as Q4_1. */
template <> struct Unit<T_Q5_1> {
    static constexpr int QK = 32, NU = 2;
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
};

/* Q2_K (84 B: scales[16], qs[64], d, dmin): element 128n + 32j + l = (qs[32n + l] >> 2j) & 3 under scale byte
 * 8n + 2j + l/16 (low nibble: scale, high: min). Unit u = (n, j) = (u/4, u%4): 32 elements, two scale groups g0, g0+1.
 * With Q8_K: d8 * d * Σ sc*Σq·x  -  d8 * dmin * Σ m*bsum, as the CPU. */
template <> struct Unit<T_Q2_K> {
    static constexpr int QK = 256, NU = 8;
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
};

/* Q3_K (110 B: hmask[32], qs[64], scales[12], d): code = low 2 bits (as Q2_K) | hmask bit (4n + j of byte l) << 2,
 * value (code - 4) * scale; with Q8_K: d8 * d * Σ sc * (Σ code·x - 4 * bsum), as the CPU. */
template <> struct Unit<T_Q3_K> {
    static constexpr int QK = 256, NU = 8;
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
};

/* Q5_K (176 B: d, dmin, scales[12], qh[32], qs[128]): Q4_K's nibbles with a fifth bit, qh[l] bit 2c (low nibbles of
 * chunk c) or 2c + 1 (high). Unit u = (c, s) = (u/2, u%2) as Q4_K's. */
template <> struct Unit<T_Q5_K> {
    static constexpr int QK = 256, NU = 8;
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
};

/* BF16 rows: as F16, the activation rounded to bf16 first (the CPU's BF16 x BF16 dot). */
template <> struct Unit<T_BF16> {
    static constexpr int QK = 32, NU = 4;
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
};

/* IQ4_NL (18 B: d, qs[16]): Q4_0's nibble layout, values from the code book; against Q8_0. */
template <> struct Unit<T_IQ4_NL> {
    static constexpr int QK = 32, NU = 2;
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
};

/* MXFP4 (17 B: E8M0 e, qs[16]): Q4_0's nibble layout, E2M1 values doubled, scale 2^(e-128); against Q8_0 with the
 * CPU's (scale * d8) * Σ. */
template <> struct Unit<T_MXFP4> {
    static constexpr int QK = 32, NU = 2;
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
};

/* NVFP4 (36 B: 4 UE4M3 scales, qs[32]) over 64 elements: sub-block s of 16 = bytes 8s..8s+7 (low nibbles: elements
 * 16s.., high: 16s+8..), one unit each; against Q8_0 (two activation blocks per weight block). */
template <> struct Unit<T_NVFP4> {
    static constexpr int QK = 64, NU = 4;
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
};

/* IQ4_XS (136 B: d, scales_h u16, scales_l[4], qs[128]): sub-block u of 32 = bytes 16u..16u+15 (low nibbles:
 * elements 32u.., high: 32u+16..) under ls - 32 (unpacked on upload); against Q8_K. */
template <> struct Unit<T_IQ4_XS> {
    static constexpr int QK = 256, NU = 8;
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
};

/* IQ2_XXS (66 B: d, qs[64]): group u of 32 = 8 bytes: 4 grid indices, then a u32 of 4 x 7 sign bits and the scale in
 * its top 4 bits; value d/8 * (2 sc + 1) * ±grid. */
template <> struct Unit<T_IQ2_XXS> : Codes256 {
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
};

/* IQ2_XS (74 B: d, qs u16[32]: 9-bit grid index | 7 sign bits, scales[8]: a 4-bit scale per 16). */
template <> struct Unit<T_IQ2_XS> : Codes256 {
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
};

/* IQ2_S (82 B: d, qs[32] grid index low bytes, signs[32], qh[8] 2 high index bits each, scales[8]). */
template <> struct Unit<T_IQ2_S> : Codes256 {
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
};

/* IQ3_XXS (98 B: d, qs[64]: a 4-value grid index per byte, then u32[8]: 4 x 7 sign bits and a 4-bit scale);
 * value d/4 * (2 sc + 1) * ±grid. */
template <> struct Unit<T_IQ3_XXS> : Codes256 {
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
};

/* IQ3_S (110 B: d, qs[64] index low bytes, qh[8] ninth bits, signs[32] one bit per element, scales[4] 4 bits per
 * 32); value d * (2 sc + 1) * ±grid. */
template <> struct Unit<T_IQ3_S> : Codes256 {
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
};

/* Four IQ1 grid values (-1, 0, 1 per byte) -> 8 * value + delta per byte (delta = ±1): the bytes times 8 have their
 * low three bits clear, so +1 is an or and -1 a per-byte subtract. */
HD int iq1_codes(int g, int delta) {
    const unsigned x = ((unsigned)g << 3) & 0xF8F8F8F8u;
    return (int)(delta > 0 ? x | 0x01010101u : vsub4(x, 0x01010101u));
}

/* IQ1_S (50 B: d, qs[32] index low bytes, qh u16[8]: 3 high index bits per 8 elements, a 3-bit scale, the delta's
 * sign): code 8 * grid ± 1, value d/8 * (2 sc + 1) * code. */
template <> struct Unit<T_IQ1_S> : Codes256 {
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
};

/* IQ1_M (56 B: qs[32], qh[16]: per 8 elements 3 high index bits and the delta's sign, scales u16[4]: 3 bits per 16
 * and fp16 d in their top nibbles). */
HD float iq1m_d(const uint8_t *sw) {
    const unsigned s0 = ld_u16(sw), s1 = ld_u16(sw + 2), s2 = ld_u16(sw + 4), s3 = ld_u16(sw + 6);
    __half_raw r;
    r.x = (unsigned short)((s0 >> 12) | ((s1 >> 8) & 0x00F0u) | ((s2 >> 4) & 0x0F00u) | (s3 & 0xF000u));
    return h2f(__half(r));
}
template <> struct Unit<T_IQ1_M> : Codes256 {
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
};

/* TQ1_0 (54 B: qs[48], qh[4], d): base-3 digits; element 32k + j = trit(qs[j], k) (k < 5), 160 + 16k + j =
 * trit(qs[32 + j], k) (k < 5), 240 + 4k + j = trit(qh[j], k) (k < 4); value d * (trit - 1). */
HD int tq1_code(const uint8_t *q, int e) {
    if (e < 160) return trit(q[e & 31], e >> 5) - 1;
    if (e < 240) return trit(q[32 + ((e - 160) & 15)], (e - 160) >> 4) - 1;
    return trit(q[48 + ((e - 240) & 3)], (e - 240) >> 2) - 1;
}
template <> struct Unit<T_TQ1_0> : Codes256 {
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
};

/* TQ2_0 (66 B: qs[64], d): element 128h + 32k + j = ((qs[32h + j] >> 2k) & 3) - 1, value d * that. */
template <> struct Unit<T_TQ2_0> : Codes256 {
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
};

/* ------------------------------------------------------------------------------------------------------------------
 * Element decode of the types above from the repacked layout, in the CPU reference dequantizers' float order.
 * b: block, j: element within it. */
HD float sgnf(unsigned bits, int j) { return (bits >> j) & 1u ? -1.0f : 1.0f; }

HD float dequant_elem_ext(const QW &w, int64_t b, int j) {
    switch (w.type) {
    case T_Q5_1: {
        int byte = w.qs[b * 16 + (j & 15)];
        unsigned qh = (unsigned)ld_i32(w.qh + b * 4);
        int q = (j < 16 ? (byte & 15) : (byte >> 4)) | (int)(((qh >> j) & 1u) << 4);
        return (float)q * h2f(w.d[2 * b]) + h2f(w.d[2 * b + 1]);
    }
    case T_Q2_K: {
        const int n = j / 128, jj = (j % 128) / 32, l = j % 32;
        const unsigned s = w.sc[b * 16 + 8 * n + 2 * jj + l / 16];
        const int q = (w.qs[b * 64 + 32 * n + l] >> (2 * jj)) & 3;
        return h2f(w.d[2 * b]) * (float)(s & 15) * (float)q - h2f(w.d[2 * b + 1]) * (float)(s >> 4);
    }
    case T_Q3_K: {
        const int n = j / 128, jj = (j % 128) / 32, l = j % 32;
        const int low = (w.qs[b * 64 + 32 * n + l] >> (2 * jj)) & 3;
        const int q = low - (((w.qh[b * 32 + l] >> (4 * n + jj)) & 1) ? 0 : 4);
        return h2f(w.d[b]) * (float)(int8_t)w.sc[b * 16 + 8 * n + 2 * jj + l / 16] * (float)q;
    }
    case T_Q5_K: {
        const int c = j / 64, l = j % 64, s = 2 * c + (l >= 32);
        const int byte = w.qs[b * 128 + 32 * c + (l & 31)];
        const int q = (l < 32 ? (byte & 15) : (byte >> 4)) | (((w.qh[b * 32 + (l & 31)] >> s) & 1) << 4);
        const float d = h2f(w.d[2 * b]) * (float)w.sc[b * 16 + s];
        const float mm = h2f(w.d[2 * b + 1]) * (float)w.sc[b * 16 + 8 + s];
        return d * (float)q - mm;
    }
    case T_IQ4_NL: {
        const int byte = w.qs[b * 16 + (j & 15)];
        return h2f(w.d[b]) * (float)QSC_SMALL(IQ4NL)[j < 16 ? (byte & 15) : (byte >> 4)];
    }
    case T_IQ4_XS: {
        const int s = j / 32, l = j % 32;
        const float dl = h2f(w.d[b]) * (float)(int8_t)w.sc[b * 8 + s];
        const int byte = w.qs[b * 128 + 16 * s + (l & 15)];
        return dl * (float)QSC_SMALL(IQ4NL)[l < 16 ? (byte & 15) : (byte >> 4)];
    }
    case T_MXFP4: {
        const int byte = w.qs[b * 16 + (j & 15)];
        return e8m0_half(w.sc[b]) * (float)QSC_SMALL(FP4)[j < 16 ? (byte & 15) : (byte >> 4)];
    }
    case T_NVFP4: {
        const int s = j / 16, l = j % 16;
        const int byte = w.qs[b * 32 + 8 * s + (l & 7)];
        return ue4m3_half(w.sc[b * 4 + s]) * (float)QSC_SMALL(FP4)[l < 8 ? (byte & 15) : (byte >> 4)];
    }
    case T_IQ2_XXS: {
        const int g = j / 32, l = (j % 32) / 8, e = j % 8;
        const uint8_t *q = w.qs + b * 64 + 8 * g;
        const unsigned aux = (unsigned)ld_i32(q + 4);
        const float db = h2f(w.d[b]) * (0.5f + (float)(aux >> 28)) * 0.25f;
        return db * (float)QSC_TABLE(GRID_IQ2_XXS)[q[l]][e] * sgnf(ksign(aux >> (7 * l)), e);
    }
    case T_IQ2_XS: {
        const int en = j / 8, e = j % 8;
        const unsigned q = ld_u16(w.qs + b * 64 + 2 * en);
        const int sc = (w.sc[b * 8 + en / 4] >> (4 * ((en / 2) & 1))) & 15;
        const float db = h2f(w.d[b]) * (0.5f + (float)sc) * 0.25f;
        return db * (float)QSC_TABLE(GRID_IQ2_XS)[q & 511][e] * sgnf(ksign(q >> 9), e);
    }
    case T_IQ2_S: {
        const int en = j / 8, e = j % 8;
        const uint8_t *qs = w.qs + b * 64;
        const int idx = qs[en] | (((w.qh[b * 8 + en / 4] >> (2 * (en % 4))) & 3) << 8);
        const int sc = (w.sc[b * 8 + en / 4] >> (4 * ((en / 2) & 1))) & 15;
        const float db = h2f(w.d[b]) * (0.5f + (float)sc) * 0.25f;
        return db * (float)QSC_TABLE(GRID_IQ2_S)[idx][e] * sgnf(qs[32 + en], e);
    }
    case T_IQ3_XXS: {
        const int g = j / 32, e = j % 32, l = e / 8;
        const unsigned aux = (unsigned)ld_i32(w.sc + b * 32 + 4 * g);
        const float db = h2f(w.d[b]) * (0.5f + (float)(aux >> 28)) * 0.5f;
        const int idx = w.qs[b * 64 + 8 * g + e / 4];
        return db * (float)QSC_TABLE(GRID_IQ3_XXS)[idx][e % 4] * sgnf(ksign(aux >> (7 * l)), e % 8);
    }
    case T_IQ3_S: {
        const int g = j / 32, en = j / 4;
        const uint8_t *sg = w.sc + b * 36;
        const int sc = (sg[32 + g / 2] >> (4 * (g & 1))) & 15;
        const float db = h2f(w.d[b]) * (float)(1 + 2 * sc);
        const int idx = w.qs[b * 64 + en] | (((w.qh[b * 8 + en / 8] >> (en % 8)) & 1) << 8);
        return db * (float)QSC_TABLE(GRID_IQ3_S)[idx][j % 4] * sgnf(sg[j / 8], j % 8);
    }
    case T_IQ1_S: {
        const int g = j / 32, l = (j % 32) / 8;
        const unsigned qh = ld_u16(w.qh + b * 16 + 2 * g);
        const float dl = h2f(w.d[b]) * (2.0f * (float)((qh >> 12) & 7u) + 1.0f);
        const float delta = qh & 0x8000u ? -0.125f : 0.125f;
        const int idx = w.qs[b * 32 + 4 * g + l] | (int)(((qh >> (3 * l)) & 7u) << 8);
        return dl * ((float)QSC_TABLE(GRID_IQ1_S)[idx][j % 8] + delta);
    }
    case T_IQ1_M: {
        const int e = j / 8, s = e / 2;
        const uint8_t *sw = w.sc + b * 8;
        const unsigned nib = (w.qh[b * 16 + e / 2] >> (4 * (e & 1))) & 15u;
        const int sc = (int)((ld_u16(sw + 2 * (s / 4)) >> (3 * (s % 4))) & 7u);
        const float dl = iq1m_d(sw) * (2.0f * (float)sc + 1.0f);
        const float delta = nib & 8u ? -0.125f : 0.125f;
        return dl * ((float)QSC_TABLE(GRID_IQ1_S)[w.qs[b * 32 + e] | (int)((nib & 7u) << 8)][j % 8] + delta);
    }
    case T_TQ1_0: return h2f(w.d[b]) * (float)tq1_code(w.qs + b * 52, j);
    case T_TQ2_0: {
        const int h = j / 128, k = (j % 128) / 32, l = j % 32;
        return h2f(w.d[b]) * (float)(((w.qs[b * 64 + 32 * h + l] >> (2 * k)) & 3) - 1);
    }
    default: return 0.0f;
    }
}

/* Scales unpacked on upload (host): Q3_K's sixteen 6-bit scales minus 32; IQ4_XS's eight ls - 32. */
static inline void unpack_scales(int type, const uint8_t *blk, uint8_t *sc) {
    if (type == T_Q3_K) {
        const uint8_t *s = blk + 96;
        for (int j = 0; j < 16; ++j) {
            int low = j < 8 ? (s[j] & 15) : (s[j - 8] >> 4);
            int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
            sc[j] = (uint8_t)(int8_t)((low | (high << 4)) - 32);
        }
    } else if (type == T_IQ4_XS) {
        const unsigned sh = ld_u16(blk + 2);
        for (int s = 0; s < 8; ++s) {
            int ls = ((blk[4 + s / 2] >> (4 * (s % 2))) & 15) | (int)(((sh >> (2 * s)) & 3u) << 4);
            sc[s] = (uint8_t)(int8_t)(ls - 32);
        }
    }
}

/* Every type above, for the per-type dispatch of the matmul kernel and its host emulation. */
#define QSC_EXT_TYPES(X)                                                                                            \
    X(T_Q5_1) X(T_Q2_K) X(T_Q3_K) X(T_Q5_K) X(T_BF16) X(T_IQ4_NL) X(T_IQ4_XS) X(T_MXFP4) X(T_NVFP4) X(T_IQ2_XXS)     \
    X(T_IQ2_XS) X(T_IQ2_S) X(T_IQ3_XXS) X(T_IQ3_S) X(T_IQ1_S) X(T_IQ1_M) X(T_TQ1_0) X(T_TQ2_0)
