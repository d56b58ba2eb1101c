/* ARM64 tile kernels of the prefill GEMM (qs_gemm.h), the ports of qs_gemm_tile_avx2 / qs_gemm_tile_avx512. Each
 * computes what tile_scalar (qs_gemm.c) specifies: per 4-element lane the exact integer sum of c*q, scaled by the
 * lane's ws * xs, summed, minus the group mins times bcol; only the order of the float additions differs.
 *   level 1 qs_gemm_tile_neon:         2 rows x 2 columns, 32 elements a step, codes widened to 16 bits (vmlal);
 *                                      any codes 0..255.
 *   level 2 qs_gemm_tile_dotprod:      4 rows x 4 columns, 16 elements a step, SDOT; codes at most 127 (SDOT is
 *                                      signed x signed: a code above 127 would read as negative).
 *   level 2 qs_gemm_tile_dotprod_wide: the same on c - 128 (signed), each lane's integer sum starting at 128 * (sum
 *                                      of the lane's q); any codes (the gemm_wide types).
 *   level 3 qs_gemm_tile_i8mm:         as qs_gemm_tile_dotprod with USDOT (unsigned x signed, vpdpbusd's
 *                                      semantics); any codes.
 * The panel always holds 4 decoded rows (rows from n_r on are zero) and n_c (a multiple of 4) prepared columns, with
 * k64 a multiple of 64 and nl, ngp multiples of 16 (qs_gemm.c), so no kernel needs a tail. */
#include "qs_arch.h"

#if QS_ARCH_ARM64
#include <arm_neon.h>

#include "qs.h"
#include "qs_gemm.h"
#include "qs_nn_neon.h"

/* [sum a, sum b, sum c, sum d] */
static inline float32x4_t hsum4(float32x4_t a, float32x4_t b, float32x4_t c, float32x4_t d) {
    return vpaddq_f32(vpaddq_f32(a, b), vpaddq_f32(c, d));
}

/* Reference: tile_scalar (qs_gemm.c). Level 1: vld4 splits 32 codes so that lane i of vector j holds element
 * 4i + j; widened to 16 bits, four multiply-accumulates (vmull/vmlal, 32-bit sums) give the 8 lanes' exact sums. */
void qs_gemm_tile_neon(const qs_gemm_dims *d, const uint8_t *wc, const float *ws, const float *mrow,
                       const int8_t *xc, const float *xs, const float *bcol, int64_t n_c, int64_t n_valid, int n_r,
                       float *y, int64_t ldy) {
    const int64_t k64 = d->k64, nl = d->nl, ngp = d->ngp, nch = k64 / 32;
    for (int rp = 0; rp < n_r; rp += 2) {
        const uint8_t *w0p = wc + rp * k64, *w1p = w0p + k64;
        const float *s0p = ws + rp * nl, *s1p = s0p + nl;
        const float *m0p = mrow + rp * ngp, *m1p = m0p + ngp;
        for (int64_t c0 = 0; c0 < n_c; c0 += 2) {
            float32x4_t a00 = vdupq_n_f32(0.0f), a01 = a00, a10 = a00, a11 = a00;
            const int8_t *xb = xc + c0 * k64;
            const float *sb = xs + c0 * nl;
            for (int64_t ch = 0; ch < nch; ++ch) {
                const uint8x8x4_t u0 = vld4_u8(w0p + 32 * ch), u1 = vld4_u8(w1p + 32 * ch);
                const int16x8_t w00 = vreinterpretq_s16_u16(vmovl_u8(u0.val[0]));
                const int16x8_t w01 = vreinterpretq_s16_u16(vmovl_u8(u0.val[1]));
                const int16x8_t w02 = vreinterpretq_s16_u16(vmovl_u8(u0.val[2]));
                const int16x8_t w03 = vreinterpretq_s16_u16(vmovl_u8(u0.val[3]));
                const int16x8_t w10 = vreinterpretq_s16_u16(vmovl_u8(u1.val[0]));
                const int16x8_t w11 = vreinterpretq_s16_u16(vmovl_u8(u1.val[1]));
                const int16x8_t w12 = vreinterpretq_s16_u16(vmovl_u8(u1.val[2]));
                const int16x8_t w13 = vreinterpretq_s16_u16(vmovl_u8(u1.val[3]));
                const float32x4_t s0l = vld1q_f32(s0p + 8 * ch), s0h = vld1q_f32(s0p + 8 * ch + 4);
                const float32x4_t s1l = vld1q_f32(s1p + 8 * ch), s1h = vld1q_f32(s1p + 8 * ch + 4);
/* lanes 0..3 (l) and 4..7 (h) of one row (W0..W3: its elements 4i + j, widened) against the column's x0..x3, into
 * accumulator A; |c q| <= 255 * 128, so the 32-bit sums are exact */
#define QS_ROW(W0, W1, W2, W3, SL, SH, A)                                                                       \
                do {                                                                                            \
                    int32x4_t pl = vmull_s16(vget_low_s16(W0), vget_low_s16(x0));                               \
                    int32x4_t ph = vmull_high_s16(W0, x0);                                                      \
                    pl = vmlal_s16(pl, vget_low_s16(W1), vget_low_s16(x1));                                     \
                    ph = vmlal_high_s16(ph, W1, x1);                                                            \
                    pl = vmlal_s16(pl, vget_low_s16(W2), vget_low_s16(x2));                                     \
                    ph = vmlal_high_s16(ph, W2, x2);                                                            \
                    pl = vmlal_s16(pl, vget_low_s16(W3), vget_low_s16(x3));                                     \
                    ph = vmlal_high_s16(ph, W3, x3);                                                            \
                    A = vfmaq_f32(A, vcvtq_f32_s32(pl), vmulq_f32(SL, xl));                                     \
                    A = vfmaq_f32(A, vcvtq_f32_s32(ph), vmulq_f32(SH, xh));                                     \
                } while (0)
#define QS_COL(c, A0, A1)                                                                                       \
                do {                                                                                            \
                    const int8x8x4_t v = vld4_s8(xb + (c) * k64 + 32 * ch);                                     \
                    const int16x8_t x0 = vmovl_s8(v.val[0]), x1 = vmovl_s8(v.val[1]);                           \
                    const int16x8_t x2 = vmovl_s8(v.val[2]), x3 = vmovl_s8(v.val[3]);                           \
                    const float32x4_t xl = vld1q_f32(sb + (c) * nl + 8 * ch);                                   \
                    const float32x4_t xh = vld1q_f32(sb + (c) * nl + 8 * ch + 4);                               \
                    QS_ROW(w00, w01, w02, w03, s0l, s0h, A0);                                                   \
                    QS_ROW(w10, w11, w12, w13, s1l, s1h, A1);                                                   \
                } while (0)
                QS_COL(0, a00, a10);
                QS_COL(1, a01, a11);
#undef QS_COL
#undef QS_ROW
            }
            const float *bb = bcol + c0 * ngp;
            for (int64_t g = 0; g < ngp; g += 4) {
                const float32x4_t m0 = vld1q_f32(m0p + g), m1 = vld1q_f32(m1p + g);
                const float32x4_t b0 = vld1q_f32(bb + g), b1 = vld1q_f32(bb + ngp + g);
                a00 = vfmsq_f32(a00, m0, b0);
                a10 = vfmsq_f32(a10, m1, b0);
                a01 = vfmsq_f32(a01, m0, b1);
                a11 = vfmsq_f32(a11, m1, b1);
            }
            const float v0[2] = {vaddvq_f32(a00), vaddvq_f32(a01)}, v1[2] = {vaddvq_f32(a10), vaddvq_f32(a11)};
            for (int c = 0; c < 2 && c0 + c < n_valid; ++c) {
                y[(c0 + c) * ldy + rp] = v0[c];
                if (rp + 1 < n_r) y[(c0 + c) * ldy + rp + 1] = v1[c];
            }
        }
    }
}

/* The 4 x 4 tile of the dot-product levels, 16 elements (4 lanes) a step, like qs_gemm_tile_avx512: LOAD_W(p) turns
 * 16 weight codes into the DOT operand, COL_INIT(xv) gives a column's starting lane sums, DOT(acc, w, xv) adds the 4
 * lane sums. Then the mins, and one 4-float store per column. */
#define QS_TILE_4X4(LOAD_W, COL_INIT, DOT)                                                                      \
    const int64_t k64 = d->k64, nl = d->nl, ngp = d->ngp, nch = k64 / 16;                                       \
    const uint8_t *w0p = wc, *w1p = wc + k64, *w2p = wc + 2 * k64, *w3p = wc + 3 * k64;                          \
    const float *s0p = ws, *s1p = ws + nl, *s2p = ws + 2 * nl, *s3p = ws + 3 * nl;                               \
    for (int64_t c0 = 0; c0 < n_c; c0 += 4) {                                                                   \
        float32x4_t a00 = vdupq_n_f32(0.0f), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,   \
                    a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00,      \
                    a33 = a00;                                                                                  \
        const int8_t *xb = xc + c0 * k64;                                                                       \
        const float *sb = xs + c0 * nl;                                                                         \
        for (int64_t ch = 0; ch < nch; ++ch) {                                                                  \
            const __auto_type w0 = LOAD_W(w0p + 16 * ch);                                                       \
            const __auto_type w1 = LOAD_W(w1p + 16 * ch);                                                       \
            const __auto_type w2 = LOAD_W(w2p + 16 * ch);                                                       \
            const __auto_type w3 = LOAD_W(w3p + 16 * ch);                                                       \
            const float32x4_t s0 = vld1q_f32(s0p + 4 * ch), s1 = vld1q_f32(s1p + 4 * ch);                       \
            const float32x4_t s2 = vld1q_f32(s2p + 4 * ch), s3 = vld1q_f32(s3p + 4 * ch);                       \
            QS_TILE_COL(0, a00, a10, a20, a30, COL_INIT, DOT);                                                  \
            QS_TILE_COL(1, a01, a11, a21, a31, COL_INIT, DOT);                                                  \
            QS_TILE_COL(2, a02, a12, a22, a32, COL_INIT, DOT);                                                  \
            QS_TILE_COL(3, a03, a13, a23, a33, COL_INIT, DOT);                                                  \
        }                                                                                                       \
        const float *bb = bcol + c0 * ngp;                                                                      \
        for (int64_t g = 0; g < ngp; g += 4) {                                                                  \
            const float32x4_t m0 = vld1q_f32(mrow + g), m1 = vld1q_f32(mrow + ngp + g);                         \
            const float32x4_t m2 = vld1q_f32(mrow + 2 * ngp + g), m3 = vld1q_f32(mrow + 3 * ngp + g);           \
            QS_TILE_MIN(0, a00, a10, a20, a30);                                                                 \
            QS_TILE_MIN(1, a01, a11, a21, a31);                                                                 \
            QS_TILE_MIN(2, a02, a12, a22, a32);                                                                 \
            QS_TILE_MIN(3, a03, a13, a23, a33);                                                                 \
        }                                                                                                       \
        const float32x4_t v0 = hsum4(a00, a10, a20, a30), v1 = hsum4(a01, a11, a21, a31);                     \
        const float32x4_t v2 = hsum4(a02, a12, a22, a32), v3 = hsum4(a03, a13, a23, a33);                     \
        if (n_r == 4 && c0 + 4 <= n_valid) {                                                                    \
            vst1q_f32(y + c0 * ldy, v0);                                                                        \
            vst1q_f32(y + (c0 + 1) * ldy, v1);                                                                  \
            vst1q_f32(y + (c0 + 2) * ldy, v2);                                                                  \
            vst1q_f32(y + (c0 + 3) * ldy, v3);                                                                  \
        } else { /* the last panel's rows or the last columns */                                                \
            float t[16];                                                                                        \
            vst1q_f32(t, v0);                                                                                   \
            vst1q_f32(t + 4, v1);                                                                               \
            vst1q_f32(t + 8, v2);                                                                               \
            vst1q_f32(t + 12, v3);                                                                              \
            for (int c = 0; c < 4 && c0 + c < n_valid; ++c)                                                     \
                for (int r = 0; r < n_r; ++r) y[(c0 + c) * ldy + r] = t[4 * c + r];                             \
        }                                                                                                       \
    }

/* one column: its 16 codes against the 4 rows, each lane sum scaled by ws * xs into the row's accumulator */
#define QS_TILE_COL(c, A0, A1, A2, A3, COL_INIT, DOT)                                                           \
    do {                                                                                                        \
        const int8x16_t xv = vld1q_s8(xb + (c) * k64 + 16 * ch);                                                \
        const float32x4_t xsv = vld1q_f32(sb + (c) * nl + 4 * ch);                                              \
        const int32x4_t i0 = COL_INIT(xv);                                                                      \
        A0 = vfmaq_f32(A0, vcvtq_f32_s32(DOT(i0, w0, xv)), vmulq_f32(s0, xsv));                                 \
        A1 = vfmaq_f32(A1, vcvtq_f32_s32(DOT(i0, w1, xv)), vmulq_f32(s1, xsv));                                 \
        A2 = vfmaq_f32(A2, vcvtq_f32_s32(DOT(i0, w2, xv)), vmulq_f32(s2, xsv));                                 \
        A3 = vfmaq_f32(A3, vcvtq_f32_s32(DOT(i0, w3, xv)), vmulq_f32(s3, xsv));                                 \
    } while (0)

#define QS_TILE_MIN(c, A0, A1, A2, A3)                                                                          \
    do {                                                                                                        \
        const float32x4_t b = vld1q_f32(bb + (c) * ngp + g);                                                    \
        A0 = vfmsq_f32(A0, m0, b);                                                                              \
        A1 = vfmsq_f32(A1, m1, b);                                                                              \
        A2 = vfmsq_f32(A2, m2, b);                                                                              \
        A3 = vfmsq_f32(A3, m3, b);                                                                              \
    } while (0)

#define QS_ZERO_INIT(xv) vdupq_n_s32(0)

#if QS_HAVE_DOTPROD
/* codes <= 127 read as signed bytes unchanged */
#define QS_LOAD_S8(p) vreinterpretq_s8_u8(vld1q_u8(p))
/* c - 128 as a signed byte (flip the top bit) */
#define QS_LOAD_S8_WIDE(p) vreinterpretq_s8_u8(veorq_u8(vld1q_u8(p), vdupq_n_u8(0x80)))
/* 128 * (sum of each lane's 4 activation codes): sum (c - 128) q + 128 sum q = sum c q */
#define QS_WIDE_INIT(xv) vshlq_n_s32(vdotq_s32(vdupq_n_s32(0), vdupq_n_s8(1), xv), 7)

/* Reference: tile_scalar (qs_gemm.c). Level 2, weight codes at most 127 (not for gemm_wide types). */
QS_TARGET_DOTPROD void qs_gemm_tile_dotprod(const qs_gemm_dims *d, const uint8_t *wc, const float *ws,
                                            const float *mrow, const int8_t *xc, const float *xs, const float *bcol,
                                            int64_t n_c, int64_t n_valid, int n_r, float *y, int64_t ldy) {
    QS_TILE_4X4(QS_LOAD_S8, QS_ZERO_INIT, vdotq_s32)
}

/* Reference: tile_scalar (qs_gemm.c). Level 2, any codes 0..255 (for the gemm_wide types). */
QS_TARGET_DOTPROD void qs_gemm_tile_dotprod_wide(const qs_gemm_dims *d, const uint8_t *wc, const float *ws,
                                                 const float *mrow, const int8_t *xc, const float *xs,
                                                 const float *bcol, int64_t n_c, int64_t n_valid, int n_r, float *y,
                                                 int64_t ldy) {
    QS_TILE_4X4(QS_LOAD_S8_WIDE, QS_WIDE_INIT, vdotq_s32)
}
#endif

#if QS_HAVE_I8MM
/* Reference: tile_scalar (qs_gemm.c). Level 3, any codes 0..255: USDOT multiplies unsigned weight codes by signed
 * activation codes, as vpdpbusd does. */
QS_TARGET_I8MM void qs_gemm_tile_i8mm(const qs_gemm_dims *d, const uint8_t *wc, const float *ws, const float *mrow,
                                      const int8_t *xc, const float *xs, const float *bcol, int64_t n_c,
                                      int64_t n_valid, int n_r, float *y, int64_t ldy) {
    QS_TILE_4X4(vld1q_u8, QS_ZERO_INIT, vusdotq_s32)
}
#endif
#endif
