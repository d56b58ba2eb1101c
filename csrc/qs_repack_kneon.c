/* ARM64 NEON kernels on repacked (R16) weights with 256-element k-blocks, qs_repack.h: Q4_K, Q5_K, Q6_K, Q2_K, Q3_K,
 * IQ4_XS (Q8_K activations) and the code types' prompt layouts (codes16, codes32, codes256). The AVX2 kernels
 * (qs_repack_avx2.c) in NEON form.
 *
 * A 16-byte register holds 4 code bytes of 4 rows (byte 4r+j of a 64-byte chunk), so each kernel takes a unit's
 * rows as four quads, one quad at a time through a whole k-block (the unit stays in L1 across the quads). Per step
 * (4 elements of every row) the quad's codes meet 4 activation bytes:
 *   _neon (ARMv8.0): SMULL/SMLAL of rows 0-1 and 2-3 against the 4 bytes repeated, int16 lanes (each holding
 *     products of one row and one element position), added pairwise into int32 (SADALP) before any lane can
 *     leave int16, and at the end of a sub-block ADDP gives the 4 rows' sums;
 *   _dotprod: one SDOT (signed x signed; every code here is <= 127) per step and column: the rows' sums directly.
 * Integer sums are exact and every float operation per row is the scalar reference's (qs_rp_<name>_scalar in
 * qs_repack_rows.c; for the codes layouts the one-column row dot qs_iq_dot_codes_scalar): bit-identical.
 * IQ4_XS multiplies the signed code-book values (the reference's values + 128 minus its 128 x sum offset: the same
 * integer), so its codes fit SDOT. */
#include "qs_arch.h"
#if QS_ARCH_ARM64
#include <arm_neon.h>
#include <string.h>

#include "qs.h"
#include "qs_quant_internal.h"
#include "qs_repack.h"
#include "qs_repack_kneon.h"

#define AI __attribute__((always_inline)) static inline

enum { RK_Q4K, RK_Q5K, RK_Q6K, RK_Q2K, RK_Q3K, RK_IQ4XS, RK_C16, RK_C32, RK_C256 };
#define RK_CODES(kind) ((kind) >= RK_C16)

/* sub-blocks (one integer scale each) per k-block */
AI int rk_nsub(const int kind) {
    switch (kind) {
    case RK_Q4K: case RK_Q5K: case RK_IQ4XS: case RK_C32: return 8;
    case RK_C256: return 1;
    default: return 16;
    }
}

AI int rk_unit(const int kind) {
    switch (kind) {
    case RK_Q4K: return 2368;
    case RK_Q5K: return 2880;
    case RK_Q6K: return 3392;
    case RK_Q2K: return 1344;
    case RK_Q3K: return 1856;
    case RK_IQ4XS: return 2240;
    default: return 4416;
    }
}

/* _neon: steps whose products one int16 lane may hold (|code| x 128 x lim <= 32768): Q4_K 15, Q5_K 31, Q6_K 63,
 * Q2_K 3, Q3_K 7, IQ4_XS's code book 127, the codes layouts' code + 64 <= 127 */
AI int rk_lim(const int kind) {
    switch (kind) {
    case RK_Q4K: case RK_Q5K: return 8;
    case RK_Q6K: case RK_Q2K: case RK_Q3K: return 4;
    default: return 2;
    }
}

/* the reference subtracts the activation offset ia from each sub-block's sum (Q6_K 32, Q3_K 4, codes 64 x sums) */
AI int rk_has_off(const int kind) { return kind == RK_Q6K || kind == RK_Q3K || RK_CODES(kind); }

AI uint8x16_t shl8(uint8x16_t v, const int n) { return vshlq_u8(v, vdupq_n_s8((int8_t)n)); } /* n < 0: right */

/* step t (elements E s + 4t .. +3 of each row, E = 256 / sub-blocks) of sub-block s: the codes of rows 4q .. 4q+3 */
AI int8x16_t rk_codes(const uint8_t *g, const int kind, const int s, const int t, const int q) {
    const uint8_t *gq = g + 16 * q;
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    uint8x16_t v;
    switch (kind) {
    case RK_Q4K:
    case RK_Q5K: { /* chunk 4s + t/2, low (t even) or high nibbles; Q5_K's fifth bit t of the sub-block's chunk */
        const int five = kind == RK_Q5K;
        v = vld1q_u8(gq + K45_NIB(five, 4 * s + t / 2));
        v = t % 2 ? vshrq_n_u8(v, 4) : vandq_u8(v, m4);
        if (five) v = vorrq_u8(v, vandq_u8(shl8(vld1q_u8(gq + K5_BITS(s)), 4 - t), vdupq_n_u8(0x10)));
        return vreinterpretq_s8_u8(v);
    }
    case RK_Q6K: { /* chunk 2s + t/2, its nibble, bits 2t..2t+1 of the high-bit chunk as bits 4..5 */
        v = vld1q_u8(gq + Q6_LO(2 * s + t / 2));
        v = t % 2 ? vshrq_n_u8(v, 4) : vandq_u8(v, m4);
        v = vorrq_u8(v, vandq_u8(shl8(vld1q_u8(gq + Q6_HI(s)), 4 - 2 * t), vdupq_n_u8(0x30)));
        return vreinterpretq_s8_u8(v);
    }
    case RK_Q2K: /* crumb t */
        return vreinterpretq_s8_u8(vandq_u8(shl8(vld1q_u8(gq + Q2_CR(s)), -2 * t), vdupq_n_u8(3)));
    case RK_Q3K: { /* crumb t, third bit t + 4 (s % 2) of the pair's high-bit chunk as bit 2 */
        v = vandq_u8(shl8(vld1q_u8(gq + Q3_CR(s)), -2 * t), vdupq_n_u8(3));
        const uint8x16_t hb = shl8(vld1q_u8(gq + Q3_HI(s / 2)), 2 - (t + 4 * (s % 2)));
        return vreinterpretq_s8_u8(vorrq_u8(v, vandq_u8(hb, vdupq_n_u8(4))));
    }
    case RK_IQ4XS: { /* chunk 4s + t/2, its nibble looked up in the code book (signed values) */
        v = vld1q_u8(gq + 192 + 64 * (4 * s + t / 2));
        v = t % 2 ? vshrq_n_u8(v, 4) : vandq_u8(v, m4);
        return vqtbl1q_s8(vld1q_s8(QS_IQ4NL), v);
    }
    default: /* codes layouts: byte chunk (E/4) s + t of code + 64 */
        return vreinterpretq_s8_u8(vld1q_u8(gq + 320 + 64 * ((256 / rk_nsub(kind) / 4) * s + t)));
    }
}

/* 4 unsigned (u = 1) or signed scale bytes of rows 4q .. 4q+3 as int32 */
AI int32x4_t ld_sc(const uint8_t *p, const int u) {
    uint32_t w;
    memcpy(&w, p, 4);
    const uint8x8_t b = vreinterpret_u8_u32(vdup_n_u32(w));
    return u ? vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(b))))
             : vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u8(b))));
}

AI float32x4_t ph4(const uint8_t *p) { return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(p))); } /* 4 fp16, exact */

/* ---------------------------------------------------------------- per-level sub-block sums of one quad */
/* _neon: int16 lanes (rows 0-1, rows 2-3 of the quad) flushed pairwise into int32 */
typedef struct {
    int16x8_t a[2];
    int32x4_t b[2];
} rk_acc_neon;
typedef const int8_t *rk_xv_neon;

AI void rk_init_neon(rk_acc_neon *p) {
    p->a[0] = p->a[1] = vdupq_n_s16(0);
    p->b[0] = p->b[1] = vdupq_n_s32(0);
}
AI rk_xv_neon rk_xload_neon(const int8_t *xp) { return xp; }
/* step tt of 4 whose activations start at xp */
AI void rk_step_neon(rk_acc_neon *p, int8x16_t c, rk_xv_neon xp, const int tt) {
    int32_t w;
    memcpy(&w, xp + 4 * tt, 4);
    const int8x8_t xv = vreinterpret_s8_s32(vdup_n_s32(w));
    p->a[0] = vmlal_s8(p->a[0], vget_low_s8(c), xv);
    p->a[1] = vmlal_s8(p->a[1], vget_high_s8(c), xv);
}
AI void rk_flush_neon(rk_acc_neon *p) {
    p->b[0] = vpadalq_s16(p->b[0], p->a[0]);
    p->b[1] = vpadalq_s16(p->b[1], p->a[1]);
    p->a[0] = p->a[1] = vdupq_n_s16(0);
}
AI int32x4_t rk_sum_neon(rk_acc_neon *p) { /* the 4 rows' sums */
    rk_flush_neon(p);
    return vpaddq_s32(p->b[0], p->b[1]);
}

#if QS_HAVE_DOTPROD
#define DP QS_TARGET_DOTPROD
typedef struct {
    int32x4_t p;
} rk_acc_dotprod;
typedef int8x16_t rk_xv_dotprod;

DP AI void rk_init_dotprod(rk_acc_dotprod *p) { p->p = vdupq_n_s32(0); }
DP AI rk_xv_dotprod rk_xload_dotprod(const int8_t *xp) { return vld1q_s8(xp); }
DP AI void rk_step_dotprod(rk_acc_dotprod *p, int8x16_t c, rk_xv_dotprod xv, const int tt) {
    switch (tt) {
    case 0: p->p = vdotq_laneq_s32(p->p, c, xv, 0); break;
    case 1: p->p = vdotq_laneq_s32(p->p, c, xv, 1); break;
    case 2: p->p = vdotq_laneq_s32(p->p, c, xv, 2); break;
    default: p->p = vdotq_laneq_s32(p->p, c, xv, 3); break;
    }
}
DP AI void rk_flush_dotprod(rk_acc_dotprod *p) { (void)p; }
DP AI int32x4_t rk_sum_dotprod(rk_acc_dotprod *p) { return p->p; }
#endif

/* ---------------------------------------------------------------- the kernel body, per level */
/* NC columns (1 or 4) of the whole group. Per k-block and quad: per sub-block the exact integer sum (minus ia where
 * the reference subtracts it) times the scale into I; Q4_K/Q5_K/Q2_K also M, their mins against the activation
 * sums; then the reference's float operations: acc + I · (d · d_x) fused (and + (−M) · (dmin · d_x) fused; −M is
 * negated as an integer, exact for these sums, so that a NaN from dmin keeps its sign under clang too, which would
 * otherwise fold the float negation into the other factor).
 * One column runs two accumulation chains (steps alternate) for latency; their int32 sum is the same integer. */
#define RK_BODY(LVL, ATTR)                                                                                         \
    ATTR AI void rk_##LVL(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int NC,     \
                          const int kind) {                                                                        \
        const int nsub = rk_nsub(kind), E = 256 / nsub, steps = E / 4, unit = rk_unit(kind), lim = rk_lim(kind);    \
        const int NCH = NC == 1 ? 2 : 1, k45 = kind == RK_Q4K || kind == RK_Q5K;                                   \
        const int8_t *xq[4];                                                                                       \
        const int32_t *ia[4];                                                                                      \
        const float *fa[4];                                                                                        \
        float32x4_t acc[4][4];                                                                                     \
        for (int j = 0; j < NC; ++j) {                                                                             \
            xq[j] = (const int8_t *)(x->xq + (c0 + j) * x->xq_stride + 4);                                         \
            ia[j] = x->ia + (c0 + j) * x->ia_stride;                                                               \
            fa[j] = x->fa + (c0 + j) * x->f_stride;                                                                \
            for (int q = 0; q < 4; ++q) acc[j][q] = vdupq_n_f32(0.0f);                                             \
        }                                                                                                          \
        for (int64_t sb = 0; sb < nb; ++sb, g += unit) {                                                           \
            for (int q = 0; q < 4; ++q) {                                                                          \
                int32x4_t I[4], M[4];                                                                              \
                _Pragma("GCC unroll 4")                                                                            \
                for (int j = 0; j < NC; ++j) I[j] = M[j] = vdupq_n_s32(0);                                          \
                _Pragma("GCC unroll 2")                                                                            \
                for (int s = 0; s < nsub; ++s) {                                                                   \
                    rk_acc_##LVL P[4][2];                                                                          \
                    _Pragma("GCC unroll 4")                                                                        \
                    for (int j = 0; j < NC; ++j)                                                                   \
                        _Pragma("GCC unroll 2")                                                                    \
                        for (int h = 0; h < NCH; ++h) rk_init_##LVL(&P[j][h]);                                     \
                    _Pragma("GCC unroll 2")                                                                        \
                    for (int t0 = 0; t0 < steps; t0 += 4) {                                                        \
                        rk_xv_##LVL xv[4];                                                                         \
                        _Pragma("GCC unroll 4")                                                                    \
                        for (int j = 0; j < NC; ++j) xv[j] = rk_xload_##LVL(xq[j] + 292 * sb + E * s + 4 * t0);     \
                        _Pragma("GCC unroll 4")                                                                    \
                        for (int tt = 0; tt < 4; ++tt) {                                                           \
                            const int8x16_t c = rk_codes(g, kind, s, t0 + tt, q);                                  \
                            _Pragma("GCC unroll 4")                                                                \
                            for (int j = 0; j < NC; ++j) rk_step_##LVL(&P[j][tt % NCH], c, xv[j], tt);             \
                            if ((t0 + tt + 1) % lim == 0 && t0 + tt + 1 < steps) {                                 \
                                _Pragma("GCC unroll 4")                                                            \
                                for (int j = 0; j < NC; ++j)                                                       \
                                    _Pragma("GCC unroll 2")                                                        \
                                    for (int h = 0; h < NCH; ++h) rk_flush_##LVL(&P[j][h]);                        \
                            }                                                                                      \
                        }                                                                                          \
                    }                                                                                              \
                    const uint8_t *scp = g + 64 + 16 * s + 4 * q;                                                  \
                    const int32x4_t sm = ld_sc(scp, k45 || kind == RK_Q2K);                                        \
                    const int32x4_t sc = kind == RK_Q2K ? vandq_s32(sm, vdupq_n_s32(15)) : sm;                     \
                    _Pragma("GCC unroll 4")                                                                        \
                    for (int j = 0; j < NC; ++j) {                                                                 \
                        int32x4_t ps = rk_sum_##LVL(&P[j][0]);                                                     \
                        if (NCH == 2) ps = vaddq_s32(ps, rk_sum_##LVL(&P[j][1]));                                  \
                        if (rk_has_off(kind)) ps = vsubq_s32(ps, vdupq_n_s32(ia[j][nsub * sb + s]));               \
                        I[j] = vmlaq_s32(I[j], ps, sc);                                                            \
                        if (kind == RK_Q2K) M[j] = vmlaq_n_s32(M[j], vshrq_n_s32(sm, 4), ia[j][16 * sb + s]);      \
                    }                                                                                              \
                }                                                                                                  \
                if (k45) { /* mins of sub-blocks 2p, 2p+1 (row r at 192 + 32p + 2r) against the int16 sum pairs */  \
                    int32x4_t ml[4], mh[4];                                                                        \
                    _Pragma("GCC unroll 4")                                                                        \
                    for (int j = 0; j < NC; ++j) ml[j] = mh[j] = vdupq_n_s32(0);                                    \
                    _Pragma("GCC unroll 4")                                                                        \
                    for (int p = 0; p < 4; ++p) {                                                                  \
                        const int16x8_t mn = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(g + 192 + 32 * p + 8 * q)));  \
                        _Pragma("GCC unroll 4")                                                                    \
                        for (int j = 0; j < NC; ++j) {                                                             \
                            const int16x4_t s2 = vreinterpret_s16_s32(vdup_n_s32(ia[j][4 * sb + p]));              \
                            ml[j] = vmlal_s16(ml[j], vget_low_s16(mn), s2);                                        \
                            mh[j] = vmlal_s16(mh[j], vget_high_s16(mn), s2);                                       \
                        }                                                                                          \
                    }                                                                                              \
                    _Pragma("GCC unroll 4")                                                                        \
                    for (int j = 0; j < NC; ++j) M[j] = vpaddq_s32(ml[j], mh[j]);                                  \
                }                                                                                                  \
                const float32x4_t d = RK_CODES(kind) ? vreinterpretq_f32_u8(vld1q_u8(g + 16 * q))                 \
                                                     : ph4(g + 8 * q);                                             \
                const int has_min = k45 || kind == RK_Q2K;                                                         \
                const float32x4_t dm = has_min ? ph4(g + 32 + 8 * q) : d;                                          \
                _Pragma("GCC unroll 4")                                                                            \
                for (int j = 0; j < NC; ++j) {                                                                     \
                    const float32x4_t dx = vdupq_n_f32(fa[j][sb]);                                                 \
                    acc[j][q] = vfmaq_f32(acc[j][q], vcvtq_f32_s32(I[j]), vmulq_f32(d, dx));                       \
                    if (has_min) /* −M as an integer: clang moves a float negation onto the other factor */       \
                        acc[j][q] = vfmaq_f32(acc[j][q], vcvtq_f32_s32(vnegq_s32(M[j])), vmulq_f32(dm, dx));       \
                }                                                                                                  \
            }                                                                                                      \
        }                                                                                                          \
        for (int j = 0; j < NC; ++j)                                                                               \
            for (int q = 0; q < 4; ++q) vst1q_f32(out + 16 * j + 4 * q, acc[j][q]);                                \
    }

RK_BODY(neon, )
#if QS_HAVE_DOTPROD
RK_BODY(dotprod, DP)
#endif

/* Entry points: 4 columns (prefill) and 1 column (decode) per call. */
#define RK_NEON(name, kind)                                                                                        \
    void qs_rp_##name##_neon_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {           \
        rk_neon(g, nb, x, c0, out, 4, kind);                                                                       \
    }                                                                                                              \
    void qs_rp_##name##_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {           \
        rk_neon(g, nb, x, c0, out, 1, kind);                                                                       \
    }
#if QS_HAVE_DOTPROD
#define RK_DOTPROD(name, kind)                                                                                     \
    DP void qs_rp_##name##_dotprod_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {     \
        rk_dotprod(g, nb, x, c0, out, 4, kind);                                                                    \
    }                                                                                                              \
    DP void qs_rp_##name##_dotprod_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {     \
        rk_dotprod(g, nb, x, c0, out, 1, kind);                                                                    \
    }
#else
#define RK_DOTPROD(name, kind)
#endif
#define RK(name, kind) RK_NEON(name, kind) RK_DOTPROD(name, kind)

RK(q4_K, RK_Q4K)
RK(q5_K, RK_Q5K)
RK(q6_K, RK_Q6K)
RK(q2_K, RK_Q2K)
RK(q3_K, RK_Q3K)
RK(iq4_xs, RK_IQ4XS)
RK(codes16, RK_C16)
RK(codes32, RK_C32)
RK(codes256, RK_C256)

#endif /* QS_ARCH_ARM64 */
