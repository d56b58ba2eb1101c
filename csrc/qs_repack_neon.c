/* NEON (ARMv8.0, level 1) and dot-product (level 2) kernels on the repacked (R16) weights of the 32-element types
 * (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4; k-block 64) and the float layouts (F32, F16, BF16; k-block 16),
 * qs_repack.h: the ports of qs_repack_avx2.c. A 16-byte quarter of a 64-byte chunk holds 4 code bytes of 4 rows
 * (byte 4i + j: row 4q + i, element j), so
 *   - NEON multiplies each quarter by the 4 broadcast activation bytes with SMULL / SMLAL(2) (int16 lanes: row,
 *     element) and reduces per row at the end of each ggml block (SADDLP / SADALP, ADDP);
 *   - dotprod advances 4 rows' int32 sums with one SDOT by element (vdotq_laneq_s32) against 4 activation bytes.
 * Every integer sum is the scalar reference's (qs_repack_rows.c, qs_rp_<name>_scalar) exactly and every float
 * operation per row is the same in the same order (d · d_x, then one fused multiply-add per block; Q4_1 / Q5_1 a
 * second one for the min; the float layouts' two chains per row): bit-identical. The signed kinds (Q8_0 with its
 * codes' 0x80 flipped, IQ4_NL and MXFP4 as code-book values) multiply signed weights and drop the 128 x Σ x offset
 * (ia) that their unsigned codes carry: the same integer. The fp16 scales and F16 weights convert by FCVT, which
 * quiets a signalling NaN where the reference keeps it: any column whose result is not finite is recomputed by
 * the scalar reference (rp_fix), so NaN payloads match too. */
#include "qs_arch.h"

#if QS_ARCH_ARM64
#include <arm_neon.h>

#include "qs.h"
#include "qs_quant_internal.h"
#include "qs_repack.h"
#include "qs_repack_neon.h"

#define AI __attribute__((always_inline)) static inline

/* GCC's pre-allocation scheduler hoists the unrolled chunks' loads and decodes far ahead and spills dozens of vector
 * registers per block; without it the kernels keep their accumulators in registers. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-schedule-insns")
#endif

/* ---------------------------------------------------------------- shared helpers */
/* the 4 bytes at p in every 32-bit lane */
AI int8x16_t bc4(const uint8_t *p) { return vreinterpretq_s8_u32(vdupq_n_u32(qs_load_u32(p))); }

/* 4 fp16 values -> float32 (FCVTL: exact but for signalling NaNs, see rp_fix) */
AI float32x4_t ph4(const uint8_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p))); }

/* A column whose 16 results are not all finite is recomputed by the scalar reference: the only results the FCVT
 * conversions can change are NaN payloads (a signalling NaN weight or scale quieted before, not by, the arithmetic). */
static void rp_fix(qs_rp_kernel ref, const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out,
                   const int nc) {
    const uint32x4_t inf = vdupq_n_u32(0x7F800000u);
    for (int j = 0; j < nc; ++j) {
        uint32x4_t bad = vdupq_n_u32(0);
        for (int q = 0; q < 4; ++q) {
            const uint32x4_t v = vreinterpretq_u32_f32(vld1q_f32(out + 16 * j + 4 * q));
            bad = vorrq_u32(bad, vceqq_u32(vandq_u32(v, inf), inf));
        }
        if (vmaxvq_u32(bad)) ref(g, nb, x, c0 + j, out + 16 * j);
    }
}

/* ---------------------------------------------------------------- 32-element blocks */
/* kinds as the scalar reference's B32 table */
enum { K_Q4_0, K_Q4_1, K_Q8_0, K_Q5_0, K_Q5_1, K_IQ4_NL, K_MXFP4 };
#define HAS_MIN(k) ((k) == K_Q4_1 || (k) == K_Q5_1)
#define HAS_HB(k) ((k) == K_Q5_0 || (k) == K_Q5_1)
#define HAS_LUT(k) ((k) >= K_IQ4_NL)
#define USES_IA(k) ((k) == K_Q4_0 || (k) == K_Q5_0) /* unsigned codes minus the offset; Q4_1 / Q5_1 use the min */
#define UNIT(k) ((k) == K_Q4_1 ? 640 : (k) == K_Q8_0 ? 1088 : (k) == K_Q5_0 ? 704 : (k) == K_Q5_1 ? 768 : 576)
#define QOFF(k) (HAS_MIN(k) ? 128 : 64)         /* code chunks in the unit */
#define PLANES(k) ((k) == K_Q5_0 ? 576 : 640)   /* Q5's high-bit planes in the unit */
#define AB(k) (HAS_MIN(k) ? 36 : 34)            /* activation block bytes (Q8_1 / Q8_0); codes at AB - 32 */

/* columns c0 .. c0+NC-1: activation codes, offsets, scales */
typedef struct {
    const uint8_t *xq[4];
    const int32_t *ia[4];
    const float *fa[4], *fb[4];
} rp_cols;

AI void cols_init(rp_cols *c, const qs_rp_x *x, int64_t c0, const int NC, const int aq) {
    for (int j = 0; j < NC; ++j) {
        c->xq[j] = x->xq + (c0 + j) * x->xq_stride + aq;
        c->ia[j] = x->ia + (c0 + j) * x->ia_stride;
        c->fa[j] = x->fa + (c0 + j) * x->f_stride;
        c->fb[j] = x->fb + (c0 + j) * x->f_stride;
    }
}

/* bit i of each byte -> bit 4 (other bits are cut by the caller's select) */
AI uint8x16_t bit_to4(uint8x16_t h, const int i) { return vshlq_u8(h, vdupq_n_s8((int8_t)(4 - i))); }

/* Nibble chunk c of ggml block hh (elements 8c..8c+7), rows 4q..4q+3: the codes of elements 8c + j (lo) and
 * 8c + 4 + j (hi) at byte 4i + j; Q5 with its fifth bit, IQ4_NL / MXFP4 as signed code-book values */
AI void b32_codes(const uint8_t *g, const int kind, const int hh, const int c, const int q, int8x16_t *lo,
                  int8x16_t *hi) {
    const uint8x16_t v = vld1q_u8(g + QOFF(kind) + 64 * (4 * hh + c) + 16 * q);
    uint8x16_t l = vandq_u8(v, vdupq_n_u8(0x0F)), h = vshrq_n_u8(v, 4);
    if (HAS_HB(kind)) { /* plane hh, byte 4i + j: bit 2c (lo) and 2c + 1 (hi) */
        const uint8x16_t hb = vld1q_u8(g + PLANES(kind) + 64 * hh + 16 * q), m10 = vdupq_n_u8(0x10);
        l = vbslq_u8(m10, bit_to4(hb, 2 * c), l);
        h = vbslq_u8(m10, bit_to4(hb, 2 * c + 1), h);
    }
    if (HAS_LUT(kind)) {
        const int8x16_t book = vld1q_s8(kind == K_MXFP4 ? QS_FP4X2 : QS_IQ4NL);
        *lo = vqtbl1q_s8(book, l);
        *hi = vqtbl1q_s8(book, h);
    } else {
        *lo = vreinterpretq_s8_u8(l);
        *hi = vreinterpretq_s8_u8(h);
    }
}

/* Byte chunk c of ggml block hh (Q8_0, elements 4c..4c+3), rows 4q..4q+3, as the signed q (code - 128) */
AI int8x16_t q8_codes(const uint8_t *g, const int hh, const int c, const int q) {
    return vreinterpretq_s8_u8(veorq_u8(vld1q_u8(g + 64 + 64 * (8 * hh + c) + 16 * q), vdupq_n_u8(0x80)));
}

/* the scales d of rows 4q..4q+3 in ggml block hh (MXFP4: E8M0 exponents in u16 slots, as qs_e8m0_half) */
AI float32x4_t b32_d(const uint8_t *g, const int kind, const int hh, const int q) {
    if (kind != K_MXFP4) return ph4(g + 32 * hh + 8 * q);
    const uint32x4_t e = vmovl_u16(vld1_u16((const uint16_t *)(g + 32 * hh + 8 * q)));
    const uint32x4_t norm = vshlq_n_u32(vsubq_u32(e, vdupq_n_u32(1)), 23);
    const uint32x4_t sub = vshlq_u32(vdupq_n_u32(0x00200000u), vreinterpretq_s32_u32(e));
    return vreinterpretq_f32_u32(vbslq_u32(vcltq_u32(e, vdupq_n_u32(2)), sub, norm));
}

/* A ggml block's end on rows 4q..4q+3 of column j (rp_b32_scalar): P (- ia), acc + P · (d · d_x) fused, then
 * + m · s_x fused for the kinds with a min */
AI float32x4_t b32_end(float32x4_t acc, int32x4_t P, const uint8_t *g, const int kind, const int hh, const int q,
                       const rp_cols *cs, const int j, const int64_t b) {
    if (USES_IA(kind)) P = vsubq_s32(P, vdupq_n_s32(cs->ia[j][b]));
    const float32x4_t dx = vmulq_f32(b32_d(g, kind, hh, q), vdupq_n_f32(cs->fa[j][b]));
    acc = vfmaq_f32(acc, vcvtq_f32_s32(P), dx);
    if (HAS_MIN(kind)) acc = vfmaq_f32(acc, ph4(g + 64 + 32 * hh + 8 * q), vdupq_n_f32(cs->fb[j][b]));
    return acc;
}

/* NEON: rows 4q0 .. 4(q0+NQ)-1 of columns c0 .. c0+NC-1 (NQ · NC <= 8). Per ggml block and (row, element) lane
 * the nibble kinds sum their 8 products in int16 (|code| <= 31 (MXFP4 12) times |x| <= 128: at most 31744);
 * IQ4_NL sums 2 (its values reach 127) and Q8_0 1 per int16 before the pairwise widening into int32. */
AI void b32_neon(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int NC,
                 const int kind, const int q0, const int NQ) {
    const int ab = AB(kind), w32 = kind == K_Q8_0 || kind == K_IQ4_NL;
    rp_cols cs;
    cols_init(&cs, x, c0, NC, ab - 32);
    float32x4_t acc[4][4];
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NC; ++j)
        _Pragma("GCC unroll 4")
        for (int q = 0; q < NQ; ++q) acc[j][q] = vdupq_n_f32(0.0f);
    for (int64_t kb = 0; kb < nb; ++kb, g += UNIT(kind)) {
        _Pragma("GCC unroll 2")
        for (int hh = 0; hh < 2; ++hh) {
            const int64_t b = 2 * kb + hh;
            int16x8_t s16[4][4][2]; /* [column][quarter][rows 4q, 4q+1 | rows 4q+2, 4q+3] */
            int32x4_t s32[4][4][2];
            _Pragma("GCC unroll 4")
            for (int j = 0; j < NC; ++j)
                _Pragma("GCC unroll 4")
                for (int q = 0; q < NQ; ++q) {
                    s16[j][q][0] = s16[j][q][1] = vdupq_n_s16(0);
                    s32[j][q][0] = s32[j][q][1] = vdupq_n_s32(0);
                }
            if (kind == K_Q8_0) {
                _Pragma("GCC unroll 8")
                for (int c = 0; c < 8; ++c)
                    _Pragma("GCC unroll 4")
                    for (int q = 0; q < NQ; ++q) {
                        const int8x16_t w = q8_codes(g, hh, c, q0 + q);
                        _Pragma("GCC unroll 4")
                        for (int j = 0; j < NC; ++j) {
                            const int8x16_t xv = bc4(cs.xq[j] + ab * b + 4 * c);
                            s32[j][q][0] = vpadalq_s16(s32[j][q][0], vmull_s8(vget_low_s8(w), vget_low_s8(xv)));
                            s32[j][q][1] = vpadalq_s16(s32[j][q][1], vmull_high_s8(w, xv));
                        }
                    }
            } else {
                _Pragma("GCC unroll 4")
                for (int c = 0; c < 4; ++c)
                    _Pragma("GCC unroll 4")
                    for (int q = 0; q < NQ; ++q) {
                        int8x16_t lo, hi;
                        b32_codes(g, kind, hh, c, q0 + q, &lo, &hi);
                        _Pragma("GCC unroll 4")
                        for (int j = 0; j < NC; ++j) {
                            const uint8_t *xp = cs.xq[j] + ab * b + 8 * c;
                            const int8x16_t xl = bc4(xp), xh = bc4(xp + 4);
                            if (w32) {
                                const int16x8_t t0 = vmlal_s8(vmull_s8(vget_low_s8(lo), vget_low_s8(xl)),
                                                              vget_low_s8(hi), vget_low_s8(xh));
                                const int16x8_t t1 = vmlal_high_s8(vmull_high_s8(lo, xl), hi, xh);
                                s32[j][q][0] = vpadalq_s16(s32[j][q][0], t0);
                                s32[j][q][1] = vpadalq_s16(s32[j][q][1], t1);
                            } else {
                                s16[j][q][0] = vmlal_s8(vmlal_s8(s16[j][q][0], vget_low_s8(lo), vget_low_s8(xl)),
                                                        vget_low_s8(hi), vget_low_s8(xh));
                                s16[j][q][1] = vmlal_high_s8(vmlal_high_s8(s16[j][q][1], lo, xl), hi, xh);
                            }
                        }
                    }
            }
            _Pragma("GCC unroll 4")
            for (int j = 0; j < NC; ++j)
                _Pragma("GCC unroll 4")
                for (int q = 0; q < NQ; ++q) { /* lanes (row, element) -> one int32 per row */
                    const int32x4_t P = w32 ? vpaddq_s32(s32[j][q][0], s32[j][q][1])
                                            : vpaddq_s32(vpaddlq_s16(s16[j][q][0]), vpaddlq_s16(s16[j][q][1]));
                    acc[j][q] = b32_end(acc[j][q], P, g, kind, hh, q0 + q, &cs, j, b);
                }
        }
    }
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NC; ++j)
        _Pragma("GCC unroll 4")
        for (int q = 0; q < NQ; ++q) vst1q_f32(out + 16 * j + 4 * (q0 + q), acc[j][q]);
}

#if QS_HAVE_DOTPROD
/* SDOT by element: acc + per lane i the 4 bytes of w's lane i times the 4 bytes of x's lane `lane` (a literal for
 * every compiler) */
QS_TARGET_DOTPROD AI int32x4_t sdot_lane(int32x4_t acc, int8x16_t w, int8x16_t x, const int lane) {
    switch (lane) {
    case 0: return vdotq_laneq_s32(acc, w, x, 0);
    case 1: return vdotq_laneq_s32(acc, w, x, 1);
    case 2: return vdotq_laneq_s32(acc, w, x, 2);
    default: return vdotq_laneq_s32(acc, w, x, 3);
    }
}

/* dotprod: as b32_neon with one SDOT per quarter and 4 elements; the int32 lanes are the rows. One column keeps
 * two chains per quarter (lo / hi elements; Q8_0 even / odd chunks). */
QS_TARGET_DOTPROD AI void b32_dot(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int NC,
                                  const int kind, const int q0, const int NQ) {
    const int ab = AB(kind), NCH = NC == 1 ? 2 : 1;
    rp_cols cs;
    cols_init(&cs, x, c0, NC, ab - 32);
    float32x4_t acc[4][4];
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NC; ++j)
        _Pragma("GCC unroll 4")
        for (int q = 0; q < NQ; ++q) acc[j][q] = vdupq_n_f32(0.0f);
    for (int64_t kb = 0; kb < nb; ++kb, g += UNIT(kind)) {
        _Pragma("GCC unroll 2")
        for (int hh = 0; hh < 2; ++hh) {
            const int64_t b = 2 * kb + hh;
            int32x4_t s[4][4][2];
            _Pragma("GCC unroll 4")
            for (int j = 0; j < NC; ++j)
                _Pragma("GCC unroll 4")
                for (int q = 0; q < NQ; ++q) s[j][q][0] = s[j][q][1] = vdupq_n_s32(0);
            if (kind == K_Q8_0) {
                _Pragma("GCC unroll 8")
                for (int c = 0; c < 8; ++c)
                    _Pragma("GCC unroll 4")
                    for (int q = 0; q < NQ; ++q) {
                        const int8x16_t w = q8_codes(g, hh, c, q0 + q);
                        _Pragma("GCC unroll 4")
                        for (int j = 0; j < NC; ++j) {
                            const int8x16_t xv = vld1q_s8((const int8_t *)(cs.xq[j] + ab * b + 16 * (c / 4)));
                            s[j][q][c % NCH] = sdot_lane(s[j][q][c % NCH], w, xv, c % 4);
                        }
                    }
            } else {
                _Pragma("GCC unroll 4")
                for (int c = 0; c < 4; ++c)
                    _Pragma("GCC unroll 4")
                    for (int q = 0; q < NQ; ++q) {
                        int8x16_t lo, hi;
                        b32_codes(g, kind, hh, c, q0 + q, &lo, &hi);
                        _Pragma("GCC unroll 4")
                        for (int j = 0; j < NC; ++j) {
                            /* 16 activation bytes = chunks 2(c/2) and 2(c/2)+1: lanes lo, hi, lo, hi */
                            const int8x16_t xv = vld1q_s8((const int8_t *)(cs.xq[j] + ab * b + 16 * (c / 2)));
                            s[j][q][0] = sdot_lane(s[j][q][0], lo, xv, 2 * (c % 2));
                            s[j][q][NCH - 1] = sdot_lane(s[j][q][NCH - 1], hi, xv, 2 * (c % 2) + 1);
                        }
                    }
            }
            _Pragma("GCC unroll 4")
            for (int j = 0; j < NC; ++j)
                _Pragma("GCC unroll 4")
                for (int q = 0; q < NQ; ++q) {
                    const int32x4_t P = NCH == 2 ? vaddq_s32(s[j][q][0], s[j][q][1]) : s[j][q][0];
                    acc[j][q] = b32_end(acc[j][q], P, g, kind, hh, q0 + q, &cs, j, b);
                }
        }
    }
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NC; ++j)
        _Pragma("GCC unroll 4")
        for (int q = 0; q < NQ; ++q) vst1q_f32(out + 16 * j + 4 * (q0 + q), acc[j][q]);
}
#endif

/* ---------------------------------------------------------------- F32 (kind 0), F16 (1), BF16 (2) */
/* rows 4q..4q+3 of element row p (F32: 16 B; F16 FCVTL, BF16 shifted into the high half: 8 B) */
AI float32x4_t fl_w4(const uint8_t *p, const int kind) {
    if (kind == 0) return vld1q_f32((const float *)p);
    const uint16x4_t h = vld1_u16((const uint16_t *)p);
    return kind == 1 ? vcvt_f32_f16(vreinterpret_f16_u16(h)) : vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

/* acc + w · x[lane], fused (FMLA by element; the lane a literal for every compiler) */
AI float32x4_t fma_lane(float32x4_t acc, float32x4_t w, float32x4_t x, const int lane) {
    switch (lane) {
    case 0: return vfmaq_laneq_f32(acc, w, x, 0);
    case 1: return vfmaq_laneq_f32(acc, w, x, 1);
    case 2: return vfmaq_laneq_f32(acc, w, x, 2);
    default: return vfmaq_laneq_f32(acc, w, x, 3);
    }
}

/* rp_float_scalar on rows 4q0 .. 4(q0+NQ)-1 of columns c0 .. c0+NC-1 (NQ · NC <= 8): per row two chains (element e
 * of a k-block feeds chain e % 2) of fused multiply-adds, added at the end */
AI void fl_run(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int NC, const int kind,
               const int q0, const int NQ) {
    const int es = kind ? 32 : 64; /* bytes of one element's 16 rows */
    const float *xs[8];
    float32x4_t acc[8][4][2];
    _Pragma("GCC unroll 8")
    for (int j = 0; j < NC; ++j) {
        xs[j] = (const float *)(x->xq + (c0 + j) * x->xq_stride);
        _Pragma("GCC unroll 4")
        for (int q = 0; q < NQ; ++q) acc[j][q][0] = acc[j][q][1] = vdupq_n_f32(0.0f);
    }
    for (int64_t kb = 0; kb < nb; ++kb, g += 16 * es)
        _Pragma("GCC unroll 4")
        for (int e4 = 0; e4 < 16; e4 += 4) { /* the activations of 4 elements per load, taken by lane */
            float32x4_t xv[8];
            _Pragma("GCC unroll 8")
            for (int j = 0; j < NC; ++j) xv[j] = vld1q_f32(xs[j] + 16 * kb + e4);
            _Pragma("GCC unroll 4")
            for (int e = e4; e < e4 + 4; ++e)
                _Pragma("GCC unroll 4")
                for (int q = 0; q < NQ; ++q) {
                    const float32x4_t w = fl_w4(g + es * e + (es / 4) * (q0 + q), kind);
                    _Pragma("GCC unroll 8")
                    for (int j = 0; j < NC; ++j) acc[j][q][e & 1] = fma_lane(acc[j][q][e & 1], w, xv[j], e - e4);
                }
        }
    _Pragma("GCC unroll 8")
    for (int j = 0; j < NC; ++j)
        _Pragma("GCC unroll 4")
        for (int q = 0; q < NQ; ++q) vst1q_f32(out + 16 * j + 4 * (q0 + q), vaddq_f32(acc[j][q][0], acc[j][q][1]));
}

/* ---------------------------------------------------------------- entry points */
/* One column: the whole group in one pass; four columns: two passes of 8 rows (each weight byte decoded once). */
#define RP_B32(name, kind, lvl, ATTR, RUN)                                                                             \
    ATTR void qs_rp_##name##_##lvl##_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {      \
        RUN(g, nb, x, c0, out, 1, kind, 0, 4);                                                                         \
        rp_fix(qs_rp_##name##_scalar, g, nb, x, c0, out, 1);                                                           \
    }                                                                                                                  \
    ATTR void qs_rp_##name##_##lvl##_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {      \
        RUN(g, nb, x, c0, out, 4, kind, 0, 2);                                                                         \
        RUN(g, nb, x, c0, out, 4, kind, 2, 2);                                                                         \
        rp_fix(qs_rp_##name##_scalar, g, nb, x, c0, out, 4);                                                           \
    }

RP_B32(q4_0, K_Q4_0, neon, , b32_neon)
RP_B32(q4_1, K_Q4_1, neon, , b32_neon)
RP_B32(q8_0, K_Q8_0, neon, , b32_neon)
RP_B32(q5_0, K_Q5_0, neon, , b32_neon)
RP_B32(q5_1, K_Q5_1, neon, , b32_neon)
RP_B32(iq4_nl, K_IQ4_NL, neon, , b32_neon)
RP_B32(mxfp4, K_MXFP4, neon, , b32_neon)
#if QS_HAVE_DOTPROD
RP_B32(q4_0, K_Q4_0, dotprod, QS_TARGET_DOTPROD, b32_dot)
RP_B32(q4_1, K_Q4_1, dotprod, QS_TARGET_DOTPROD, b32_dot)
RP_B32(q8_0, K_Q8_0, dotprod, QS_TARGET_DOTPROD, b32_dot)
RP_B32(q5_0, K_Q5_0, dotprod, QS_TARGET_DOTPROD, b32_dot)
RP_B32(q5_1, K_Q5_1, dotprod, QS_TARGET_DOTPROD, b32_dot)
RP_B32(iq4_nl, K_IQ4_NL, dotprod, QS_TARGET_DOTPROD, b32_dot)
RP_B32(mxfp4, K_MXFP4, dotprod, QS_TARGET_DOTPROD, b32_dot)
#endif

/* Float layouts: one column over the whole group (8 chains); eight columns per quarter of the group (16 chains,
 * each weight converted once). */
#define RP_FL(name, kind)                                                                                              \
    void qs_rp_##name##_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {               \
        fl_run(g, nb, x, c0, out, 1, kind, 0, 4);                                                                      \
        rp_fix(qs_rp_##name##_scalar, g, nb, x, c0, out, 1);                                                           \
    }                                                                                                                  \
    void qs_rp_##name##_neon_8(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {               \
        for (int q = 0; q < 4; ++q) fl_run(g, nb, x, c0, out, 8, kind, q, 1);                                          \
        rp_fix(qs_rp_##name##_scalar, g, nb, x, c0, out, 8);                                                           \
    }

RP_FL(f32, 0)
RP_FL(f16, 1)

/* qs_rp_bf16_scalar on rows 4q0 .. 4(q0+NQ)-1 of columns c0 .. c0+NC-1 (NQ · NC <= 8): each pair chunk split into
 * its even and odd elements, two fused multiply-adds per pair (odd first), two chains per row; a k-block's BF16
 * activations widened once into float32 on the stack */
AI void bf_run(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int NC, const int q0,
               const int NQ) {
    const uint8_t *xs[8];
    float32x4_t acc[8][4][2];
    float xf[8][16];
    const uint32x4_t hi = vdupq_n_u32(0xFFFF0000u);
    _Pragma("GCC unroll 8")
    for (int j = 0; j < NC; ++j) {
        xs[j] = x->xq + (c0 + j) * x->xq_stride;
        _Pragma("GCC unroll 4")
        for (int q = 0; q < NQ; ++q) acc[j][q][0] = acc[j][q][1] = vdupq_n_f32(0.0f);
    }
    for (int64_t kb = 0; kb < nb; ++kb, g += 512) {
        _Pragma("GCC unroll 8")
        for (int j = 0; j < NC; ++j)
            for (int h = 0; h < 2; ++h) {
                const uint16x8_t v = vld1q_u16((const uint16_t *)(const void *)(xs[j] + 32 * kb + 16 * h));
                vst1q_f32(xf[j] + 8 * h, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16)));
                vst1q_f32(xf[j] + 8 * h + 4, vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(v), 16)));
            }
        _Pragma("GCC unroll 8")
        for (int p = 0; p < 8; ++p)
            _Pragma("GCC unroll 4")
            for (int q = 0; q < NQ; ++q) {
                const uint32x4_t v = vld1q_u32((const uint32_t *)(const void *)(g + 64 * p + 16 * (q0 + q)));
                const float32x4_t we = vreinterpretq_f32_u32(vshlq_n_u32(v, 16));
                const float32x4_t wo = vreinterpretq_f32_u32(vandq_u32(v, hi));
                _Pragma("GCC unroll 8")
                for (int j = 0; j < NC; ++j) {
                    const float32x4_t a = vfmaq_n_f32(acc[j][q][p & 1], wo, xf[j][2 * p + 1]);
                    acc[j][q][p & 1] = vfmaq_n_f32(a, we, xf[j][2 * p]);
                }
            }
    }
    _Pragma("GCC unroll 8")
    for (int j = 0; j < NC; ++j)
        _Pragma("GCC unroll 4")
        for (int q = 0; q < NQ; ++q) vst1q_f32(out + 16 * j + 4 * (q0 + q), vaddq_f32(acc[j][q][0], acc[j][q][1]));
}

void qs_rp_bf16_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    bf_run(g, nb, x, c0, out, 1, 0, 4);
    rp_fix(qs_rp_bf16_scalar, g, nb, x, c0, out, 1);
}
void qs_rp_bf16_neon_8(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    for (int q = 0; q < 4; ++q) bf_run(g, nb, x, c0, out, 8, q, 1);
    rp_fix(qs_rp_bf16_scalar, g, nb, x, c0, out, 8);
}

#endif /* QS_ARCH_ARM64 */
