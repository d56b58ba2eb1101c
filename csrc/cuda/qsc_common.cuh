/* Shared by the device kernels and their host emulation: type ids, the repacked weight layout, and the per-block
 * decode + int8 dot math as __host__ __device__ functions. The host build of this math is what tests/test_cuda.py
 * checks against the CPU kernels on machines without a GPU; the device build is the same source.
 *
 * Numeric scheme = the CPU's (csrc/qs_quant.c, spec §3.2-3.3): activations are quantized exactly like ggml's
 * reference quantizers (Q8_0 / Q8_1 for 32-element weight blocks, Q8_K for 256-element superblocks), dots are
 * exact int32 sums (dp4a: four int8 x int8 products added to an int32 in one instruction) scaled by one float
 * product per unit, so results match the CPU to float rounding. */
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "../qs_api_nn.h" /* qs_weight, qs_vec, qs_block: the forward description the CPU block reads too */
#include "qsc_api.h"
}

#define HD __host__ __device__ __forceinline__

#include "qsc_arch.cuh" /* the dense architecture features' per-element math (RoPE, soft-caps, GLUs, ...) */

/* ggml type ids */
enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q8_0 = 8, T_Q8_1 = 9, T_Q4_K = 12, T_Q6_K = 14,
       T_Q8_K = 15 };
/* the types of qsc_types.cuh */
enum { T_Q5_1 = 7, T_Q2_K = 10, T_Q3_K = 11, T_Q5_K = 13, T_IQ2_XXS = 16, T_IQ2_XS = 17, T_IQ3_XXS = 18, T_IQ1_S = 19,
       T_IQ4_NL = 20, T_IQ3_S = 21, T_IQ2_S = 22, T_IQ4_XS = 23, T_IQ1_M = 29, T_BF16 = 30, T_TQ1_0 = 34, T_TQ2_0 = 35,
       T_MXFP4 = 39, T_NVFP4 = 40 };

/* Activation formats a matrix consumes: floats, 32-element int8 blocks (Q8_0/Q8_1), 256-element (Q8_K). */
enum { ACT_F = 0, ACT_32 = 1, ACT_256 = 2 };

/* The device's type table (host side; the kernels get a matrix's geometry from its QW): per ggml id, the block
 * (elements, file bytes), the activation format, and the repacked layout below, bytes per block in each section
 * and where the section's bytes sit in the file's block (-1: none; Q4_K's sc are unpacked from its 6-bit
 * fields). An all-zero row is an unsupported type. F32 / F16 count 32-element units, copied as stored. */
struct TypeDesc {
    int qk, raw_bytes, act;
    int field[4]; /* SEC_QS, SEC_QH, SEC_SC, SEC_D bytes per block */
    int src[4];   /* their offsets in the file's block */
    bool k4_scales;
    bool unpack_sc; /* sc made by unpack_scales (qsc_types.cuh) from the file's block */
};

#define QSC_NTYPES 41
static const TypeDesc QSC_TYPES[QSC_NTYPES] = {
    /* T_F32 */ {32, 128, ACT_F, {128, 0, 0, 0}, {0, -1, -1, -1}, false},
    /* T_F16 */ {32, 64, ACT_F, {64, 0, 0, 0}, {0, -1, -1, -1}, false},
    /* T_Q4_0 */ {32, 18, ACT_32, {16, 0, 0, 2}, {2, -1, -1, 0}, false},
    /* T_Q4_1 */ {32, 20, ACT_32, {16, 0, 0, 4}, {4, -1, -1, 0}, false},
    {}, {}, /* 4, 5: no longer ggml types */
    /* T_Q5_0 */ {32, 22, ACT_32, {16, 4, 0, 2}, {6, 2, -1, 0}, false},
    /* T_Q5_1 */ {32, 24, ACT_32, {16, 4, 0, 4}, {8, 4, -1, 0}, false},
    /* T_Q8_0 */ {32, 34, ACT_32, {32, 0, 0, 2}, {2, -1, -1, 0}, false},
    {}, /* Q8_1: an activation format */
    /* T_Q2_K */ {256, 84, ACT_256, {64, 0, 16, 4}, {16, -1, 0, 80}, false},
    /* T_Q3_K */ {256, 110, ACT_256, {64, 32, 16, 2}, {32, 0, -1, 108}, false, true},
    /* T_Q4_K */ {256, 144, ACT_256, {128, 0, 16, 4}, {16, -1, -1, 0}, true},
    /* T_Q5_K */ {256, 176, ACT_256, {128, 32, 16, 4}, {48, 16, -1, 0}, true},
    /* T_Q6_K */ {256, 210, ACT_256, {128, 64, 16, 2}, {0, 128, 192, 208}, false},
    {}, /* Q8_K: an activation format */
    /* T_IQ2_XXS */ {256, 66, ACT_256, {64, 0, 0, 2}, {2, -1, -1, 0}, false},
    /* T_IQ2_XS */ {256, 74, ACT_256, {64, 0, 8, 2}, {2, -1, 66, 0}, false},
    /* T_IQ3_XXS */ {256, 98, ACT_256, {64, 0, 32, 2}, {2, -1, 66, 0}, false},
    /* T_IQ1_S */ {256, 50, ACT_256, {32, 16, 0, 2}, {2, 34, -1, 0}, false},
    /* T_IQ4_NL */ {32, 18, ACT_32, {16, 0, 0, 2}, {2, -1, -1, 0}, false},
    /* T_IQ3_S */ {256, 110, ACT_256, {64, 8, 36, 2}, {2, 66, 74, 0}, false},
    /* T_IQ2_S */ {256, 82, ACT_256, {64, 8, 8, 2}, {2, 66, 74, 0}, false},
    /* T_IQ4_XS */ {256, 136, ACT_256, {128, 0, 8, 2}, {8, -1, -1, 0}, false, true},
    {}, {}, {}, {}, {}, /* I8, I16, I32, I64, F64 */
    /* T_IQ1_M */ {256, 56, ACT_256, {32, 16, 8, 0}, {0, 32, 48, -1}, false},
    /* T_BF16 */ {32, 64, ACT_F, {64, 0, 0, 0}, {0, -1, -1, -1}, false},
    {}, {}, {}, /* 31..33: no longer ggml types */
    /* T_TQ1_0 */ {256, 54, ACT_256, {52, 0, 0, 2}, {0, -1, -1, 52}, false},
    /* T_TQ2_0 */ {256, 66, ACT_256, {64, 0, 0, 2}, {0, -1, -1, 64}, false},
    {}, {}, {}, /* 36..38: no longer ggml types */
    /* T_MXFP4 */ {32, 17, ACT_32, {16, 0, 1, 0}, {1, -1, 0, -1}, false},
    /* T_NVFP4 */ {64, 36, ACT_32, {32, 0, 4, 0}, {4, -1, 0, -1}, false},
};

static inline const TypeDesc &type_desc(int type) {
    static const TypeDesc none = {};
    return type >= 0 && type < QSC_NTYPES ? QSC_TYPES[type] : none;
}
static inline int type_act(int type) { return type_desc(type).act; }
static inline int type_qk(int type) { return type_desc(type).qk; }
static inline int raw_block_bytes(int type) { return type_desc(type).raw_bytes; }
static inline bool type_supported(int type) { return type_desc(type).raw_bytes > 0; }

/* ------------------------------------------------------------------------------------------------------------------
 * Repacked weight layout. GGUF blocks are 18..210 bytes, so their int8 payload is only 2-byte aligned; the device
 * wants aligned 8/16-byte loads and coalesced warps. On upload every block's fields are split into field arrays
 * (structure of arrays), each starting on a 256-byte boundary; block b of the matrix (b = row * nb + i) owns:
 *   Q4_0  qs[16]        (nibbles as stored)                    d: half
 *   Q4_1  qs[16]                                               d: half2 (d, m)
 *   Q5_0  qs[16]  qh: u32 (bit e = 5th bit of element e)      d: half
 *   Q8_0  qs[32]  int8                                         d: half
 *   Q4_K  qs[128]             sc[16]: 8 scales then 8 mins (the 6-bit fields unpacked to bytes)   d: half2 (d, dmin)
 *   Q6_K  qs[128] = ql  qh[64]  sc[16] int8                    d: half
 *   F32 / F16: the rows as stored, in the qs section.
 *   the other types: qsc_types.cuh.
 * Nothing is expanded to floats: the device bytes are within 4% of the file's (Q3_K: 114 for 110). */
enum { SEC_QS = 0, SEC_QH = 1, SEC_SC = 2, SEC_D = 3 };

struct PackedLayout {
    int64_t off[4], total;
};

/* Layout of a rows x k matrix; false for unsupported types or k not a multiple of the block size. */
static inline bool packed_layout(int type, int64_t rows, int64_t k, PackedLayout *L) {
    if (!type_supported(type) || rows <= 0 || k <= 0 || k % type_qk(type)) return false;
    const int *fb = type_desc(type).field;
    int64_t nblocks = rows * (k / type_qk(type)), pos = 0;
    for (int s = 0; s < 4; ++s) {
        L->off[s] = pos;
        pos += (fb[s] * nblocks + 255) / 256 * 256;
    }
    L->total = pos;
    return true;
}

/* A weight matrix on the device (or, for the host emulation, in host memory), already repacked. */
struct QW {
    int type, nb;       /* nb: blocks per row (k / 32 or k / 256) */
    int64_t rows, k;
    const uint8_t *qs, *qh, *sc;
    const __half *d;
};

static inline QW make_qw(int type, int64_t rows, int64_t k, const uint8_t *base, const PackedLayout &L) {
    QW w;
    w.type = type;
    w.rows = rows;
    w.k = k;
    w.nb = (int)(k / type_qk(type));
    w.qs = base + L.off[SEC_QS];
    w.qh = base + L.off[SEC_QH];
    w.sc = base + L.off[SEC_SC];
    w.d = (const __half *)(base + L.off[SEC_D]);
    return w;
}

/* ------------------------------------------------------------------------------------------------------------------
 * Activations, quantized once per vector. Row j of an activation matrix with k elements per row:
 *   f[j*k ..]            floats (always present; F32/F16 weights read these)
 *   qs[j*k ..]           int8 (ACT_32: Q8_0 values; ACT_256: Q8_K values), 16-byte aligned
 *   d[j*k/32 ..]         ACT_32: fp16-rounded block scale as float;  ACT_256: d[j*k/256 ..] float32 scale
 *   s[j*k/32 ..]         ACT_32 only: fp16(d * sum(q)), the Q8_1 sum used by Q4_1's min term
 *   bs[j*k/16 ..]        ACT_256 only: sums of 16 consecutive q (Q8_K bsums, as int32) */
struct Act {
    const int8_t *qs;
    const float *d, *s;
    const int *bs;
    const float *f;
    int64_t k;
};

struct ActOut { /* where a producer writes both int8 formats (either may be absent: NULL qs) */
    int8_t *qs32, *qs256;
    float *d32, *s32, *d256;
    int *bs256;
};

/* ------------------------------------------------------------------------------------------------------------------
 * Small helpers. On the device the loads are aligned vector loads (the layout above guarantees alignment); on the
 * host they are memcpy. dp4a(a, b, c) = c + sum of the four signed byte products of a and b. */
HD int ld_i32(const void *p) {
#ifdef __CUDA_ARCH__
    return *(const int *)p;
#else
    int v;
    memcpy(&v, p, 4);
    return v;
#endif
}
HD int2 ld_i2(const void *p) {
#ifdef __CUDA_ARCH__
    return *(const int2 *)p;
#else
    int2 v;
    memcpy(&v, p, 8);
    return v;
#endif
}
HD int4 ld_i4(const void *p) {
#ifdef __CUDA_ARCH__
    return *(const int4 *)p;
#else
    int4 v;
    memcpy(&v, p, 16);
    return v;
#endif
}
HD float4 ld_f4(const float *p) {
#ifdef __CUDA_ARCH__
    return *(const float4 *)p;
#else
    float4 v;
    memcpy(&v, p, 16);
    return v;
#endif
}
HD int dp4a(int a, int b, int c) {
#ifdef __CUDA_ARCH__
    return __dp4a(a, b, c);
#else
    for (int i = 0; i < 4; ++i) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
#endif
}
HD float h2f(__half h) { return __half2float(h); }
HD float f16_round(float x) { return __half2float(__float2half_rn(x)); }

/* Per-byte "q - 2^(n-1)" for four unsigned n-bit values packed in bytes, giving signed int8 lanes without carries
 * between bytes: flipping the top bit subtracts 2^(n-1) from values >= 2^(n-1) and adds it to the others, which then
 * still need the sign bits above bit n-1 set (the multiply spreads the flipped bit into them). */
HD int sext4_minus8(int v) {   /* q in 0..15 -> q - 8 */
    int t = v ^ 0x08080808;
    return t | ((t & 0x08080808) * 0x1E);
}
HD int sext5_minus16(int v) {  /* q in 0..31 -> q - 16 */
    int t = v ^ 0x10101010;
    return t | ((t & 0x10101010) * 0x0E);
}
HD int sext6_minus32(int v) {  /* q in 0..63 -> q - 32 */
    int t = v ^ 0x20202020;
    return t | ((t & 0x20202020) * 0x06);
}
/* Four bits b0..b3 -> bit 4 of bytes 0..3 (Q5_0's fifth bits). */
HD int spread4_bit4(unsigned b) {
    return (int)(((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25));
}

/* ------------------------------------------------------------------------------------------------------------------
 * Unit decode + dot, one specialisation per weight type. A warp lane handles one unit at a time (QK / NU elements of
 * one block): load() decodes its weights into int8 lanes once, dot() multiplies them with one activation row and
 * returns the float contribution. b = global block index (row * nb + ib), ib = block index within the row. */
template <int TYPE> struct Unit;

/* Q4_0 (18 B: d, qs[16]); byte j holds element j (low nibble) and j+16 (high). Unit h (0,1) = bytes 8h..8h+7 =
 * elements 8h..8h+7 and 16+8h..16+8h+7. */
template <> struct Unit<T_Q4_0> {
    static constexpr int QK = 32, NU = 2;
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
};

/* Q4_1 (20 B: d, m, qs[16]); x = q*d + m. With Q8_1: d_w*d_x*sum(q*qx) + m_w*s_x (s_x = d_x*sum(qx)); the
 * min term is added once per block, by unit 0. */
template <> struct Unit<T_Q4_1> {
    static constexpr int QK = 32, NU = 2;
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
};

/* Q5_0 (22 B: d, qh u32, qs[16]); q = nibble | (bit e of qh) << 4, x = (q - 16) * d. */
template <> struct Unit<T_Q5_0> {
    static constexpr int QK = 32, NU = 2;
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
};

/* Q8_0 (34 B: d, qs[32] int8); unit h = elements 16h..16h+15. */
template <> struct Unit<T_Q8_0> {
    static constexpr int QK = 32, NU = 2;
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
};

/* Q4_K (144 B superblock of 256): chunk c (0..3) stores elements 64c..64c+31 in the low nibbles of qs[32c..+31]
 * (sub-block 2c) and 64c+32..64c+63 in the high nibbles (sub-block 2c+1). Unit u: c = u/2, half s = u%2 -> bytes
 * 32c+16s..+15 = elements 64c+16s.. (low) and 64c+32+16s.. (high). With Q8_K (bsums per 16 elements):
 * d8 * (d * (sc_lo*sum_lo + sc_hi*sum_hi) - dmin * (m_lo*bsum[4c+s] + m_hi*bsum[4c+2+s])). */
template <> struct Unit<T_Q4_K> {
    static constexpr int QK = 256, NU = 8;
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
};

/* Q6_K (210 B: ql[128], qh[64], scales[16] int8, d). Half hh (0,1) of 128 elements, l = 0..31:
 *   128hh+l: lo(ql[64hh+l]) | (qh[32hh+l]&3)<<4      128hh+32+l: lo(ql[64hh+32+l]) | ((qh>>2)&3)<<4
 *   128hh+64+l: hi(ql[64hh+l]) | ((qh>>4)&3)<<4      128hh+96+l: hi(ql[64hh+32+l]) | ((qh>>6)&3)<<4
 * minus 32; scale index = element / 16. Unit u: hh = u/4, l = 8(u%4)..+7 -> 4 groups g of 8 elements at
 * 128hh + 32g + l, each under scale 8hh + 2g + (l >= 16). */
template <> struct Unit<T_Q6_K> {
    static constexpr int QK = 256, NU = 8;
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
};

/* F32 rows: "blocks" of 32 elements, units of 8, float activations. */
template <> struct Unit<T_F32> {
    static constexpr int QK = 32, NU = 4;
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
};

/* F16 rows: as F32; the activation is rounded to fp16 first, as the CPU's F16 x F16 dot does. */
template <> struct Unit<T_F16> {
    static constexpr int QK = 32, NU = 4;
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
};

#include "qsc_types.cuh" /* the other weight types' units and element decoders */

/* ------------------------------------------------------------------------------------------------------------------
 * Element dequantization from the repacked layout (embedding lookup; bit-exact with the reference dequantizers:
 * every product below is exact in fp32, spec §2.2). */
HD float dequant_elem(const QW &w, int64_t row, int64_t e) {
    if (w.type == T_F32) return ((const float *)w.qs)[row * w.k + e];
    if (w.type == T_F16) return h2f(((const __half *)w.qs)[row * w.k + e]);
    if (w.type == T_BF16) return bf16_bits_to_f(ld_u16(w.qs + 2 * (row * w.k + e)));
    int qk = (int)(w.k / w.nb);
    int64_t b = row * w.nb + e / qk;
    int j = (int)(e % qk);
    switch (w.type) {
    case T_Q4_0: {
        int byte = w.qs[b * 16 + (j & 15)];
        int q = j < 16 ? (byte & 15) : (byte >> 4);
        return (float)(q - 8) * h2f(w.d[b]);
    }
    case T_Q4_1: {
        int byte = w.qs[b * 16 + (j & 15)];
        int q = j < 16 ? (byte & 15) : (byte >> 4);
        return (float)q * h2f(w.d[2 * b]) + h2f(w.d[2 * b + 1]);
    }
    case T_Q5_0: {
        int byte = w.qs[b * 16 + (j & 15)];
        unsigned qh = (unsigned)ld_i32(w.qh + b * 4);
        int q = (j < 16 ? (byte & 15) : (byte >> 4)) | (int)(((qh >> j) & 1u) << 4);
        return (float)(q - 16) * h2f(w.d[b]);
    }
    case T_Q8_0: return (float)(int8_t)w.qs[b * 32 + j] * h2f(w.d[b]);
    case T_Q4_K: {
        int c = j / 64, l = j % 64, s = 2 * c + (l >= 32);
        int byte = w.qs[b * 128 + 32 * c + (l & 31)];
        int q = l < 32 ? (byte & 15) : (byte >> 4);
        float d = h2f(w.d[2 * b]) * (float)w.sc[b * 16 + s], mm = h2f(w.d[2 * b + 1]) * (float)w.sc[b * 16 + 8 + s];
        return d * (float)q - mm;
    }
    case T_Q6_K: {
        int hh = j / 128, r = j % 128, g = r / 32, l = r % 32;
        int byte = w.qs[b * 128 + 64 * hh + (g & 1) * 32 + l];
        int low = g >= 2 ? (byte >> 4) : (byte & 15);
        int high = (w.qh[b * 64 + 32 * hh + l] >> (2 * g)) & 3;
        int sc = (int8_t)w.sc[b * 16 + 8 * hh + 2 * g + l / 16];
        return h2f(w.d[b]) * (float)sc * (float)((low | (high << 4)) - 32);
    }
    default: return dequant_elem_ext(w, b, j);
    }
}

/* ------------------------------------------------------------------------------------------------------------------
 * Activation quantizers, one block (host reference of what the device's warp versions compute). */
HD void quant_block32(const float *v, int8_t *qs, float *d_out, float *s_out) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(v[j]));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
        int q = (int)roundf(v[j] * id);
        qs[j] = (int8_t)q;
        sum += q;
    }
    *d_out = f16_round(d);
    *s_out = f16_round((float)sum * d);
}

HD void quant_block256(const float *v, int8_t *qs, float *d_out, int *bs) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 256; ++j) {
        float ax = fabsf(v[j]);
        if (ax > amax) { amax = ax; max = v[j]; }
    }
    if (amax == 0.0f) {
        for (int j = 0; j < 256; ++j) qs[j] = 0;
        for (int j = 0; j < 16; ++j) bs[j] = 0;
        *d_out = 0.0f;
        return;
    }
    float iscale = -127.0f / max;
    for (int j = 0; j < 256; ++j) {
        int q = (int)rintf(iscale * v[j]); /* ggml's nearest_int: round half to even */
        qs[j] = (int8_t)(q < 127 ? q : 127);
    }
    for (int j = 0; j < 16; ++j) {
        int s = 0;
        for (int i = 0; i < 16; ++i) s += qs[16 * j + i];
        bs[j] = s;
    }
    *d_out = 1.0f / iscale;
}

/* A one-line reason into err[len] (nothing when err is NULL). */
static inline void set_err(char *err, size_t len, const char *fmt, ...) {
    if (!err || !len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

/* The model-wide sizes the device code works with, read from the forward description; every layer has its own
 * heads, head size, FFN width and policy (check_model checks each), the scratch is sized by the largest. */
struct Dims {
    int n_layers, E, V;
    float eps, embed_scale, final_softcap, logit_scale;
    int64_t max_qd, max_kd, max_f;
    int ple, ple_pad; /* gemma4's per-layer embedding width (0: none), rounded up to the matmul's 32 */
};

static inline bool vec_ok(const qs_vec &v, int64_t n, bool required) {
    if (!v.ptr) return !required && v.len == 0;
    return v.len == n;
}

static inline bool weight_ok(const qs_weight &w, int64_t rows, int64_t k) {
    PackedLayout L;
    if (!w.ptr || w.rows != rows || w.k != k || !packed_layout(w.type, rows, k, &L)) return false;
    return w.bytes == rows * (k / type_qk(w.type)) * raw_block_bytes(w.type);
}

static inline bool is_one(float x) { return x == 0.0f || x == 1.0f; }

#include "qsc_moe.cuh" /* mixture-of-experts: the router math and moe_check */
#include "qsc_gdn.cuh" /* gated delta-net: the recurrence math and gdn_check */

/* The first feature of layer b that the device code does not compute (NULL: none). */
static inline const char *missing_feature(const qs_block &b) {
    const qs_attn_desc &a = b.attn;
    if (!b.gdn.conv && b.gdn.qkv.ptr) return "gated delta-net weights without a conv size";
    if (a.q_gate != 0 && (a.q_gate != 1 || b.gdn.conv)) return "gated attention outputs other than qwen35's";
    if (b.probe.attn || b.probe.wo || b.probe.ffn || b.probe.down || b.probe.exp_count || b.probe.q)
        return "probes";
    return nullptr;
}

/* A layer's RoPE as the device applies it: the description's, its 0-means-1 scales resolved as the CPU block
 * resolves them; factors: where the device (or the host emulation) reads rope.freqs. */
static inline RopeP rope_params(const qs_rope_desc &r, const float *factors) {
    RopeP p = {r.skip ? 1 : 0, r.dim, r.neox ? 1 : 0, r.base, is_one(r.freq_scale) ? 1.0f : r.freq_scale,
               r.ext_factor, r.corr0, r.corr1, is_one(r.mscale) ? 1.0f : r.mscale, r.skip ? nullptr : factors};
    return p;
}

/* The arguments of the qk_post test entry points (device and host): sizes, positions >= 0, a RoPE description
 * the device takes (as check_layer), a temperature with its floor. */
static inline bool qk_post_args_ok(const float *q, const float *k, int n_tokens, int n_head, int n_head_kv,
                                   int head_dim, const int32_t *pos, const qs_rope_desc *r, float temp_scale,
                                   int64_t temp_floor) {
    if (!q || !pos || !r || n_tokens <= 0 || n_head <= 0 || (k && n_head_kv <= 0) || head_dim <= 0 ||
        head_dim > QSC_MAX_HEAD)
        return false;
    if (!r->skip && (r->dim <= 0 || r->dim > head_dim || r->dim % 2 || !(r->base > 0.0f) || !isfinite(r->base) ||
                     !(r->freq_scale >= 0.0f) || !isfinite(r->freq_scale) || !isfinite(r->ext_factor) ||
                     !isfinite(r->corr0) || !isfinite(r->corr1) || !isfinite(r->mscale)))
        return false;
    if (!r->skip && r->freqs.ptr) {
        if (r->freqs.len != r->dim / 2) return false;
        for (int i = 0; i < r->dim / 2; ++i)
            if (!(r->freqs.ptr[i] > 0.0f) || !isfinite(r->freqs.ptr[i])) return false;
    }
    if (!isfinite(temp_scale) || (temp_scale != 0.0f && temp_floor <= 0)) return false;
    for (int i = 0; i < n_tokens; ++i)
        if (pos[i] < 0) return false;
    return true;
}

static inline bool finite_pos(float x) { return x > 0.0f && isfinite(x); }

/* Layer i's policy and vectors beyond its weights: sizes, RoPE, window, scale, caps, multipliers and every
 * vector's length (and the values the device would divide by or exponentiate: frequency factors, sinks). */
static inline int check_layer(int i, const qs_block &b, const Dims &D, char *err, size_t err_len) {
    const qs_attn_desc &a = b.attn;
    const qs_rope_desc &r = b.rope;
    const int H = a.n_head, KV = a.n_head_kv, hd = a.head_dim, F = b.ffn.n_ff;
    if (b.n_embd != D.E) {
        set_err(err, err_len, "layer %d: n_embd %d differs from layer 0's %d", i, b.n_embd, D.E);
        return -1;
    }
    if (H <= 0 || KV <= 0 || H % KV || F <= 0 || F % 32) {
        set_err(err, err_len, "layer %d: sizes n_head %d, n_head_kv %d, n_ff %d invalid (n_ff a multiple of 32)", i,
                H, KV, F);
        return -1;
    }
    if (hd <= 0 || hd > QSC_MAX_HEAD || ((int64_t)H * hd) % 32) {
        set_err(err, err_len, "layer %d: head size %d has no CUDA path (at most %d, n_head x head size a multiple "
                "of 32)", i, hd, QSC_MAX_HEAD);
        return -1;
    }
    if (!r.skip && (r.dim <= 0 || r.dim > hd || r.dim % 2)) {
        set_err(err, err_len, "layer %d: rope_dim %d invalid for head_dim %d", i, r.dim, hd);
        return -1;
    }
    if (a.window < 0 || a.window > 2147483647 || !finite_pos(r.base) || !finite_pos(a.scale) ||
        !(a.softcap >= 0.0f) || !isfinite(a.softcap)) {
        set_err(err, err_len, "layer %d: window %lld / RoPE base %g / scale %g / soft-cap %g out of range", i,
                (long long)a.window, (double)r.base, (double)a.scale, (double)a.softcap);
        return -1;
    }
    if (!(r.freq_scale == 0.0f || finite_pos(r.freq_scale)) || !isfinite(r.ext_factor) || !isfinite(r.corr0) ||
        !isfinite(r.corr1) || !isfinite(r.mscale) || !isfinite(a.temp_scale) ||
        (a.temp_scale != 0.0f && a.temp_floor <= 0)) {
        set_err(err, err_len, "layer %d: RoPE scaling (freq_scale %g, ext_factor %g, corr %g..%g, mscale %g) or "
                "temperature (%g, floor %lld) out of range", i, (double)r.freq_scale, (double)r.ext_factor,
                (double)r.corr0, (double)r.corr1, (double)r.mscale, (double)a.temp_scale, (long long)a.temp_floor);
        return -1;
    }
    if (!isfinite(b.residual_scale) || !isfinite(b.out_scale) || !finite_pos(b.eps)) {
        set_err(err, err_len, "layer %d: residual scale %g / output scale %g / eps %g out of range", i,
                (double)b.residual_scale, (double)b.out_scale, (double)b.eps);
        return -1;
    }
    const int64_t E = D.E, QD = (int64_t)H * hd, KD = (int64_t)KV * hd;
    const struct { const char *name; const qs_vec *v; int64_t n; } vecs[] = {
        {"attn_norm", &b.attn_norm, E}, {"ffn_norm", &b.ffn_norm, E},
        {"post_attn_norm", &b.post_attn_norm, E}, {"post_ffn_norm", &b.post_ffn_norm, E},
        {"attn.bq", &a.bq, QD}, {"attn.bk", &a.bk, KD}, {"attn.bv", &a.bv, KD}, {"attn.bo", &a.bo, E},
        {"attn.q_norm", &a.q_norm, a.qk_norm_full && !a.kv_reuse ? QD : hd},
        {"attn.k_norm", &a.k_norm, a.qk_norm_full ? KD : hd}, {"ple.post_norm", &b.ple.post_norm, E},
        {"attn.sinks", &a.sinks, H}, {"rope.freqs", &r.freqs, r.skip ? r.freqs.len : r.dim / 2}};
    for (const auto &v : vecs)
        if (!vec_ok(*v.v, v.n, false)) {
            set_err(err, err_len, "layer %d: %s has %lld values%s, expected %lld", i, v.name, (long long)v.v->len,
                    v.v->ptr ? "" : " and no data", (long long)v.n);
            return -1;
        }
    if ((a.kv_reuse != 0 && a.kv_reuse != 1) || b.ple.dim < 0 || (b.ple.dim && !b.ple.post_norm.ptr) ||
        (!b.attn_norm.ptr != !b.ffn_norm.ptr) || (!a.kv_reuse && !a.q_norm.ptr != !a.k_norm.ptr)) {
        set_err(err, err_len, "layer %d: kv_reuse %d / per-layer embedding %d (post norm %s) / pre-norms or q/k norms "
                "not both or neither", i, a.kv_reuse, b.ple.dim, b.ple.post_norm.ptr ? "set" : "missing");
        return -1;
    }
    for (int j = 0; a.sinks.ptr && j < H; ++j)
        if (!isfinite(a.sinks.ptr[j])) {
            set_err(err, err_len, "layer %d: attention sink %d is not finite", i, j);
            return -1;
        }
    for (int j = 0; r.freqs.ptr && !r.skip && j < r.dim / 2; ++j)
        if (!finite_pos(r.freqs.ptr[j])) {
            set_err(err, err_len, "layer %d: RoPE frequency factor %d is %g, not a finite positive number", i, j,
                    (double)r.freqs.ptr[j]);
            return -1;
        }
    return 0;
}

/* The whole check of a description, host only (no device call): every feature present has a device path, every
 * layer its sizes and policy in range, every weight its size, type and byte count, every vector its length.
 * Fills *d with the model-wide sizes. 0: usable. */
static inline int check_model(const qsc_model_desc *md, const qs_block *layers, Dims *d, char *err,
                              size_t err_len) {
    if (!md || !layers || md->n_layers <= 0 || md->n_vocab <= 0) {
        set_err(err, err_len, "no model description, no layers or no vocabulary");
        return -1;
    }
    if (!(md->final_softcap >= 0.0f) || !isfinite(md->final_softcap) ||
        !(md->logit_scale == 0.0f || finite_pos(md->logit_scale))) {
        set_err(err, err_len, "final soft-cap %g / logit scale %g out of range", (double)md->final_softcap,
                (double)md->logit_scale);
        return -1;
    }
    Dims D = {md->n_layers, layers[0].n_embd, md->n_vocab, md->eps, md->embed_scale, md->final_softcap,
              is_one(md->logit_scale) ? 1.0f : md->logit_scale, 0, 0, 0, layers[0].ple.dim, 0};
    if (D.E <= 0 || D.E % 32) {
        set_err(err, err_len, "n_embd %d must be a positive multiple of 32", D.E);
        return -1;
    }
    if (!finite_pos(D.eps) || !isfinite(D.embed_scale)) {
        set_err(err, err_len, "eps %g / embed_scale %g out of range", (double)D.eps, (double)D.embed_scale);
        return -1;
    }
    for (int i = 0; i < md->n_layers; ++i) {
        const qs_block &b = layers[i];
        const char *f = missing_feature(b);
        if (f) {
            set_err(err, err_len, "layer %d: %s have no CUDA path", i, f);
            return -1;
        }
        if (check_layer(i, b, D, err, err_len)) return -1;
        if (b.ple.dim != D.ple) {
            set_err(err, err_len, "layer %d: per-layer embedding width %d differs from layer 0's %d", i, b.ple.dim,
                    D.ple);
            return -1;
        }
        const int src = md->kv_source ? md->kv_source[i] : i;
        if (b.attn.kv_reuse ? !(src >= 0 && src < i) || layers[src].attn.kv_reuse ||
                                  layers[src].attn.n_head_kv != b.attn.n_head_kv ||
                                  layers[src].attn.head_dim != b.attn.head_dim
                            : src != i) {
            set_err(err, err_len, "layer %d: kv_source %d is not %s", i, src,
                    b.attn.kv_reuse ? "an earlier layer with a KV cache of its own of the same shape" : "the layer");
            return -1;
        }
        const int64_t QD = (int64_t)b.attn.n_head * b.attn.head_dim, KD = (int64_t)b.attn.n_head_kv * b.attn.head_dim;
        D.max_qd = QD > D.max_qd ? QD : D.max_qd;
        D.max_kd = KD > D.max_kd ? KD : D.max_kd;
        D.max_f = b.ffn.n_ff > D.max_f ? b.ffn.n_ff : D.max_f;
    }
    const int64_t E = D.E, V = D.V;
    for (int i = 0; i < md->n_layers; ++i) {
        const qs_block &b = layers[i];
        const int64_t QD = (int64_t)b.attn.n_head * b.attn.head_dim, KD = (int64_t)b.attn.n_head_kv * b.attn.head_dim;
        const int64_t F = b.ffn.n_ff;
        const int64_t NX = b.moe.n_expert > 0 ? b.moe.n_expert : 1; /* experts: n_expert matrices stacked */
        if ((b.moe.n_expert || b.moe.n_ff_shexp || b.moe.router.ptr) && !moe_check(b, i, D, err, err_len)) return -1;
        GdnDims gd;
        char why[256];
        if (b.gdn.conv && !gdn_check(b, &gd, why, sizeof why)) {
            set_err(err, err_len, "layer %d: %s", i, why);
            return -1;
        }
        const struct { const char *name; const qs_weight *w; int64_t rows, k; } mats[] = {
            {"attn.wq", &b.attn.wq, (b.attn.q_gate ? 2 : 1) * QD, E}, {"attn.wk", &b.attn.wk, KD, E}, {"attn.wv", &b.attn.wv, KD, E},
            {"attn.wo", &b.attn.wo, E, QD}, {"ffn.gate", &b.ffn.gate, NX * F, E}, {"ffn.up", &b.ffn.up, NX * F, E},
            {"ffn.down", &b.ffn.down, NX * E, F}, {"ple.gate", &b.ple.gate, D.ple, E}};
        for (const auto &m : mats)
            if ((m.w == &b.attn.wk || m.w == &b.attn.wv) && b.attn.kv_reuse) continue; /* not read */
            else if (b.gdn.conv && (m.w == &b.attn.wq || m.w == &b.attn.wk || m.w == &b.attn.wv ||
                                    m.w == &b.attn.wo)) continue; /* a delta-net layer has no attention */
            else if (m.w == &b.ple.gate && !D.ple) continue;
            else if (!weight_ok(*m.w, m.rows, m.k)) {
                set_err(err, err_len, "layer %d: %s is %s%lld x %lld of type %d in %lld bytes; the GPU needs %lld x "
                        "%lld of a GPU type with the bytes that make", i, m.name,
                        m.w->ptr ? "" : "missing: ", (long long)m.w->rows, (long long)m.w->k, m.w->type,
                        (long long)m.w->bytes, (long long)m.rows, (long long)m.k);
                return -1;
            }
    }
    D.ple_pad = D.ple;
    for (int i = 0; D.ple && i < md->n_layers; ++i) { /* proj: E x P; F32/F16 rows are padded to 32 on upload */
        const qs_weight &w = layers[i].ple.proj;
        const int es = w.type == T_F32 ? 4 : w.type == T_F16 ? 2 : 0;
        const bool padded = es && D.ple % 32 && w.ptr && w.rows == E && w.k == D.ple && w.bytes == E * D.ple * es;
        if (!padded && !weight_ok(w, E, D.ple)) {
            set_err(err, err_len, "layer %d: ple.proj is %lld x %lld of type %d in %lld bytes; the GPU needs %lld x %d",
                    i, (long long)w.rows, (long long)w.k, w.type, (long long)w.bytes, (long long)E, D.ple);
            return -1;
        }
        if (padded) D.ple_pad = (D.ple + 31) / 32 * 32;
    }
    if (!weight_ok(md->tok_embd, V, E)) {
        set_err(err, err_len, "tok_embd: %lld x %lld of type %d in %lld bytes, expected %lld x %lld of a GPU type",
                (long long)md->tok_embd.rows, (long long)md->tok_embd.k, md->tok_embd.type,
                (long long)md->tok_embd.bytes, (long long)V, (long long)E);
        return -1;
    }
    const bool tied = !md->output.ptr && md->output.rows == 0 && md->output.bytes == 0;
    if (!tied && !weight_ok(md->output, V, E)) {
        set_err(err, err_len, "output: %lld x %lld of type %d in %lld bytes, expected %lld x %lld of a GPU type",
                (long long)md->output.rows, (long long)md->output.k, md->output.type, (long long)md->output.bytes,
                (long long)V, (long long)E);
        return -1;
    }
    if (!vec_ok(md->output_norm, E, true)) {
        set_err(err, err_len, "output_norm has %lld values%s, expected %lld", (long long)md->output_norm.len,
                md->output_norm.ptr ? "" : " and no data", (long long)E);
        return -1;
    }
    if (d) *d = D;
    return 0;
}

/* Device activation formats -> the CPU's byte layouts (Q8_0 34 B, Q8_1 36 B, Q8_K 292 B blocks), for tests. */
static inline bool act_to_cpu_bytes(int act_type, int64_t n, const int8_t *qs, const float *d, const float *s,
                                    const int *bs, uint8_t *out) {
    if (act_type == T_Q8_0 || act_type == T_Q8_1) {
        const int size = act_type == T_Q8_0 ? 34 : 36, off = act_type == T_Q8_0 ? 2 : 4;
        for (int64_t b = 0; b < n / 32; ++b) {
            uint8_t *o = out + b * size;
            __half dh = __float2half_rn(d[b]);
            memcpy(o, &dh, 2);
            if (act_type == T_Q8_1) {
                __half sh = __float2half_rn(s[b]);
                memcpy(o + 2, &sh, 2);
            }
            memcpy(o + off, qs + 32 * b, 32);
        }
        return true;
    }
    if (act_type == T_Q8_K) {
        for (int64_t b = 0; b < n / 256; ++b) {
            uint8_t *o = out + b * 292;
            memcpy(o, &d[b], 4);
            memcpy(o + 4, qs + 256 * b, 256);
            for (int j = 0; j < 16; ++j) {
                int16_t v = (int16_t)bs[16 * b + j];
                memcpy(o + 260 + 2 * j, &v, 2);
            }
        }
        return true;
    }
    return false;
}

/* Repack raw GGUF blocks into the layout above (host side, once per weight at upload). */
int repack_host(int type, const uint8_t *src, int64_t rows, int64_t k, uint8_t *dst, int64_t dst_bytes);
