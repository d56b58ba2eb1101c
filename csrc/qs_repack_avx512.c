/* AVX-512 VNNI kernels on repacked (R16) weights, qs_repack.h: lane r of every integer and float accumulator is
 * row r of the 16-row group, so 4 activation codes broadcast to all lanes feed one vpdpbusd for 16 rows; block
 * scales are applied per lane, in the same order as the scalar references in qs_repack.c (bit-identical). Each
 * kernel exists for 4 columns (prefill: the decoded weights are reused from registers) and for 1 (decode). */
#include "qs_arch.h"
#if QS_ARCH_X86
#include <immintrin.h>

#include "qs.h"
#include "qs_quant_internal.h"
#include "qs_repack.h"

#define T QS_TARGET_AVX512
#define AI __attribute__((always_inline)) static inline
/* Software prefetch this many bytes ahead in a row group's stream: the hardware prefetchers alone left the
 * DRAM-bound Q4_K GEMV at ~80 % of the speed it reaches with it (AMD EPYC, 2 threads; 4 and 16 KiB were within
 * noise of 8). */
#define PF_DIST 8192

/* The lines of a unit that no chunk load's prefetch covers (scales, the Q5_0 bit planes), PF_DIST ahead: without
 * it they are demand misses once per unit. */
T AI void pf_lines(const uint8_t *p, const int n) {
    _Pragma("GCC unroll 8")
    for (int l = 0; l < n; ++l) _mm_prefetch((const char *)(p + PF_DIST + 64 * l), _MM_HINT_T0);
}

T AI __m512i bc32(const uint8_t *p) { return _mm512_set1_epi32((int)qs_load_u32(p)); }

T AI __m512 ph16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

/* 16 MXFP4 exponents (u16 slots, the exponent in the low byte) as qs_e8m0_half's floats: (e - 1) << 23, and for
 * e < 2 the subnormals 0x00200000 << e */
T AI __m512 e8m0_16(const uint8_t *p) {
    const __m512i e = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    const __m512i norm = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)), norm, sub));
}

/* bit i of each byte -> bit 4 (other bits masked later): Q5_0's and Q5_K's fifth bits */
T AI __m512i q5_hi(__m512i h, int i) {
    return i < 4 ? _mm512_slli_epi16(h, 4 - i) : i == 4 ? h : _mm512_srli_epi16(h, i - 4);
}

/* ---------------------------------------------------------------- Q4_K, Q5_K */
T AI __m512i sum_chains(const __m512i *p, const int n) {
    return n == 4 ? _mm512_add_epi32(_mm512_add_epi32(p[0], p[1]), _mm512_add_epi32(p[2], p[3])) : _mm512_add_epi32(p[0], p[1]);
}

/* Per-column state of a kernel call: accumulators, activation codes (at byte aq of each block), offsets, scales. */
typedef struct {
    __m512 acc[4];
    const uint8_t *xq[4];
    const int32_t *ia[4];
    const float *fa[4], *fb[4];
} cols;

T AI void cols_init(cols *c, const qs_rp_x *x, int64_t c0, const int NC, int aq) {
    _Pragma("GCC unroll 16")
    for (int j = 0; j < NC; ++j) {
        c->acc[j] = _mm512_setzero_ps();
        c->xq[j] = x->xq + (c0 + j) * x->xq_stride + aq;
        c->ia[j] = x->ia + (c0 + j) * x->ia_stride;
        c->fa[j] = x->fa + (c0 + j) * x->f_stride;
        c->fb[j] = x->fb + (c0 + j) * x->f_stride;
    }
}

/* A K-quant block's end: acc + I · (d · d_x) − M · (dmin · d_x), fused as the scalar references, d and dmin at 0
 * and 32 of the unit */
T AI void scale_min_end(__m512 *acc, const __m512i *I, const __m512i *M, const uint8_t *g, const float *const *fa,
                        int64_t sb, const int NC) {
    const __m512 d = ph16(g), dm = ph16(g + 32);
    _Pragma("GCC unroll 16")
    for (int j = 0; j < NC; ++j) {
        const __m512 dx = _mm512_set1_ps(fa[j][sb]);
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[j]), _mm512_mul_ps(d, dx), acc[j]);
        acc[j] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M[j]), _mm512_mul_ps(dm, dx), acc[j]);
    }
}

/* five = 0: Q4_K, 1: Q5_K (a fifth-bit chunk after each sub-block's nibble chunks) */

T AI void k45_body(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int NC,
                   const int five) {
    const int NCH = NC == 1 ? 4 : 2, unit = five ? 2880 : 2368;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10);
    cols cs;
    cols_init(&cs, x, c0, NC, 4);
    __m512 *const acc = cs.acc;
    const uint8_t *const *const xq = cs.xq;
    const int32_t *const *const ia = cs.ia;
    const float *const *const fa = cs.fa;
    for (int64_t sb = 0; sb < nb; ++sb, g += unit) {
        pf_lines(g, 5);
        __m512i I[4];
        _Pragma("GCC unroll 16")
        for (int j = 0; j < NC; ++j) I[j] = _mm512_setzero_si512();
        for (int s = 0; s < 8; ++s) {
            __m512i hb = _mm512_setzero_si512();
            if (five) {
                _mm_prefetch((const char *)(g + K5_BITS(s) + PF_DIST), _MM_HINT_T0);
                hb = _mm512_loadu_si512((const void *)(g + K5_BITS(s)));
            }
            __m512i P[4][4]; /* independent vpdpbusd chains per column: 2 (lo/hi), 4 for one column */
            _Pragma("GCC unroll 16")
            for (int j = 0; j < NC; ++j)
                _Pragma("GCC unroll 4")
                for (int q = 0; q < NCH; ++q) P[j][q] = _mm512_setzero_si512();
            _Pragma("GCC unroll 16")
            for (int cc = 0; cc < 4; ++cc) {
                const int c = 4 * s + cc, ch = NCH == 4 ? 2 * (cc & 1) : 0;
                const uint8_t *vp = g + K45_NIB(five, c);
                _mm_prefetch((const char *)(vp + PF_DIST), _MM_HINT_T0);
                const __m512i v = _mm512_loadu_si512((const void *)vp);
                __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if (five) {
                    lo = _mm512_ternarylogic_epi32(lo, q5_hi(hb, 2 * cc), m10, 0xF8);
                    hi = _mm512_ternarylogic_epi32(hi, q5_hi(hb, 2 * cc + 1), m10, 0xF8);
                }
                _Pragma("GCC unroll 16")
                for (int j = 0; j < NC; ++j) {
                    const uint8_t *xp = xq[j] + 292 * sb + 8 * c;
                    P[j][ch] = _mm512_dpbusd_epi32(P[j][ch], lo, bc32(xp));
                    P[j][ch + 1] = _mm512_dpbusd_epi32(P[j][ch + 1], hi, bc32(xp + 4));
                }
            }
            const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(g + 64 + 16 * s)));
            _Pragma("GCC unroll 16")
            for (int j = 0; j < NC; ++j) I[j] = _mm512_add_epi32(I[j], _mm512_mullo_epi32(sum_chains(P[j], NCH), sc));
        }
        __m512i M[4];
        _Pragma("GCC unroll 16")
        for (int j = 0; j < NC; ++j) M[j] = _mm512_setzero_si512();
        _Pragma("GCC unroll 16")
        for (int p = 0; p < 4; ++p) {
            const __m512i mn = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(g + 192 + 32 * p)));
            _Pragma("GCC unroll 16")
            for (int j = 0; j < NC; ++j) M[j] = _mm512_dpwssd_epi32(M[j], mn, _mm512_set1_epi32(ia[j][4 * sb + p]));
        }
        scale_min_end(acc, I, M, g, fa, sb, NC);
    }
    _Pragma("GCC unroll 16")
    for (int j = 0; j < NC; ++j) _mm512_storeu_ps(out + 16 * j, acc[j]);
}

/* ---------------------------------------------------------------- Q6_K, Q3_K, IQ4_XS */
T AI __m512i q6_hi(__m512i h, int i) { /* bits 2i..2i+1 of each byte -> bits 4..5 (other bits masked later) */
    switch (i) {
    case 0: return _mm512_slli_epi16(h, 4);
    case 1: return _mm512_slli_epi16(h, 2);
    case 2: return h;
    default: return _mm512_srli_epi16(h, 2);
    }
}

/* the third bit of crumb position i (bit i, or 4 + i for the odd sub-block of a pair) -> bit 2 */
T AI __m512i q3_hi(__m512i h, const int b) {
    return b < 2 ? _mm512_slli_epi16(h, 2 - b) : b == 2 ? h : _mm512_srli_epi16(h, b - 2);
}

/* The layouts with one signed scale byte per sub-block and row (Q6_K, Q3_K: 16 sub-blocks of 16; IQ4_XS: 8 of 32):
 * per sub-block the offset-corrected integer sum of its codes against the activations, times the scale in the
 * lanes; one float multiply-add per block. A sub-block's codes come in steps of 4 elements per row (4 activation
 * codes broadcast); step t feeds chain t % NCH. */
enum { SB_Q6K, SB_Q3K, SB_IQ4XS, SB_C16, SB_C32, SB_C256 }; /* SB_C*: the code types' prompt layout by group size */
#define SB_CODES(kind) ((kind) >= SB_C16)
#define SB_GS(kind) ((kind) == SB_C16 ? 16 : (kind) == SB_C32 ? 32 : 256)

/* step t of sub-block s: the codes of 4 elements per row, and where their activations start in the block */
T AI __m512i sb_codes(const uint8_t *g, const int kind, const int s, const int t, int *a) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    if (kind == SB_Q6K) { /* nibble chunk 2s + t / 2 (low or high nibbles), high 2 bits from chunk Q6_HI(s) */
        const int c = 2 * s + t / 2, hi = t % 2;
        const __m512i v = _mm512_loadu_si512((const void *)(g + Q6_LO(c)));
        const __m512i h = _mm512_loadu_si512((const void *)(g + Q6_HI(s)));
        *a = 8 * c + 4 * hi;
        return _mm512_ternarylogic_epi32(_mm512_and_si512(hi ? _mm512_srli_epi16(v, 4) : v, m4), q6_hi(h, t),
                                         _mm512_set1_epi8(0x30), 0xF8);
    }
    if (SB_CODES(kind)) { /* byte chunk s · gs/4 + t: the codes + 64 as they are */
        const int c = s * (SB_GS(kind) / 4) + t;
        *a = 4 * c;
        return _mm512_loadu_si512((const void *)(g + 320 + 64 * c));
    }
    if (kind == SB_Q3K) { /* crumb t of chunk Q3_CR(s), third bit from the pair's chunk */
        const __m512i v = _mm512_loadu_si512((const void *)(g + Q3_CR(s)));
        const __m512i h = _mm512_loadu_si512((const void *)(g + Q3_HI(s / 2)));
        *a = 16 * s + 4 * t;
        return _mm512_ternarylogic_epi32(_mm512_and_si512(t ? _mm512_srli_epi16(v, 2 * t) : v, _mm512_set1_epi8(3)),
                                         q3_hi(h, t + 4 * (s % 2)), _mm512_set1_epi8(4), 0xF8);
    }
    /* IQ4_XS: nibble chunk 4s + t / 2, looked up in the code book + 128 */
    const int c = 4 * s + t / 2, hi = t % 2;
    const __m512i lut = _mm512_broadcast_i32x4(_mm_add_epi8(_mm_loadu_si128((const __m128i *)QS_IQ4NL),
                                                            _mm_set1_epi8((char)0x80)));
    const __m512i v = _mm512_loadu_si512((const void *)(g + 192 + 64 * c));
    *a = 8 * c + 4 * hi;
    return _mm512_shuffle_epi8(lut, _mm512_and_si512(hi ? _mm512_srli_epi16(v, 4) : v, m4));
}

T AI void sb_body(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int NC,
                  const int kind) {
    const int NCH = NC == 1 ? 4 : 2;
    const int n_sub = SB_CODES(kind) ? 256 / SB_GS(kind) : kind == SB_IQ4XS ? 8 : 16;
    const int steps = SB_CODES(kind) ? SB_GS(kind) / 4 : kind == SB_IQ4XS ? 8 : 4;
    const int unit = SB_CODES(kind) ? 4416 : kind == SB_Q6K ? 3392 : kind == SB_Q3K ? 1856 : 2240;
    cols cs;
    cols_init(&cs, x, c0, NC, 4);
    __m512 *const acc = cs.acc;
    const uint8_t *const *const xq = cs.xq;
    const int32_t *const *const ia = cs.ia;
    const float *const *const fa = cs.fa;
    for (int64_t sb = 0; sb < nb; ++sb, g += unit) {
        pf_lines(g, kind == SB_IQ4XS ? 3 : 5);
        __m512i I[4];
        _Pragma("GCC unroll 16")
        for (int j = 0; j < NC; ++j) I[j] = _mm512_setzero_si512();
        _Pragma("GCC unroll 2")
        for (int s = 0; s < n_sub; ++s) {
            /* prefetch the sub-block's lines (one each; Q6_K's and Q3_K's high bits with the first of theirs) */
            if (kind == SB_Q6K) {
                _mm_prefetch((const char *)(g + Q6_HI(s) + PF_DIST), _MM_HINT_T0);
                _mm_prefetch((const char *)(g + Q6_LO(2 * s) + PF_DIST), _MM_HINT_T0);
                _mm_prefetch((const char *)(g + Q6_LO(2 * s + 1) + PF_DIST), _MM_HINT_T0);
            } else if (kind == SB_Q3K) {
                _mm_prefetch((const char *)(g + Q3_CR(s) + PF_DIST), _MM_HINT_T0);
                if (s % 2 == 0) _mm_prefetch((const char *)(g + Q3_HI(s / 2) + PF_DIST), _MM_HINT_T0);
            } else if (kind == SB_IQ4XS) {
                _Pragma("GCC unroll 4")
                for (int c = 4 * s; c < 4 * s + 4; ++c) _mm_prefetch((const char *)(g + 192 + 64 * c + PF_DIST), _MM_HINT_T0);
            } /* the code layout was just decoded into cache: nothing to prefetch */
            __m512i P[4][4];
            _Pragma("GCC unroll 16")
            for (int j = 0; j < NC; ++j) {
                P[j][0] = _mm512_set1_epi32(-ia[j][n_sub * sb + s]);
                _Pragma("GCC unroll 4")
                for (int q = 1; q < NCH; ++q) P[j][q] = _mm512_setzero_si512();
            }
            _Pragma("GCC unroll 8")
            for (int t = 0; t < steps; ++t) {
                int a;
                const __m512i c = sb_codes(g, kind, s, t, &a);
                _Pragma("GCC unroll 16")
                for (int j = 0; j < NC; ++j)
                    P[j][t % NCH] = _mm512_dpbusd_epi32(P[j][t % NCH], c, bc32(xq[j] + 292 * sb + a));
            }
            const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(g + 64 + 16 * s)));
            _Pragma("GCC unroll 16")
            for (int j = 0; j < NC; ++j) I[j] = _mm512_add_epi32(I[j], _mm512_mullo_epi32(sum_chains(P[j], NCH), sc));
        }
        const __m512 d = SB_CODES(kind) ? _mm512_loadu_ps((const float *)g) : ph16(g);
        _Pragma("GCC unroll 16")
        for (int j = 0; j < NC; ++j)
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[j]), _mm512_mul_ps(d, _mm512_set1_ps(fa[j][sb])), acc[j]);
    }
    _Pragma("GCC unroll 16")
    for (int j = 0; j < NC; ++j) _mm512_storeu_ps(out + 16 * j, acc[j]);
}

/* ---------------------------------------------------------------- Q2_K */
/* per sub-block of 16: the 2-bit codes of 4 elements per row (one crumb position of the chunk) against 4 broadcast
 * activation codes, times the scale in the lanes (I); the mins times the activation sums (M) */
T AI void q2k_body(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int NC) {
    const __m512i m3 = _mm512_set1_epi8(3), m15 = _mm512_set1_epi32(15);
    cols cs;
    cols_init(&cs, x, c0, NC, 4);
    __m512 *const acc = cs.acc;
    const uint8_t *const *const xq = cs.xq;
    const int32_t *const *const ia = cs.ia;
    const float *const *const fa = cs.fa;
    for (int64_t sb = 0; sb < nb; ++sb, g += 1344) {
        pf_lines(g, 5);
        __m512i I[4], M[4];
        _Pragma("GCC unroll 16")
        for (int j = 0; j < NC; ++j) I[j] = M[j] = _mm512_setzero_si512();
        _Pragma("GCC unroll 2")
        for (int s = 0; s < 16; ++s) {
            const uint8_t *vp = g + Q2_CR(s);
            _mm_prefetch((const char *)(vp + PF_DIST), _MM_HINT_T0);
            const __m512i v = _mm512_loadu_si512((const void *)vp);
            __m512i P[4][2];
            _Pragma("GCC unroll 16")
            for (int j = 0; j < NC; ++j) P[j][0] = P[j][1] = _mm512_setzero_si512();
            _Pragma("GCC unroll 4")
            for (int i = 0; i < 4; ++i) {
                const __m512i c = _mm512_and_si512(i ? _mm512_srli_epi16(v, 2 * i) : v, m3);
                _Pragma("GCC unroll 16")
                for (int j = 0; j < NC; ++j)
                    P[j][i & 1] = _mm512_dpbusd_epi32(P[j][i & 1], c, bc32(xq[j] + 292 * sb + 16 * s + 4 * i));
            }
            const __m512i sm = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(g + 64 + 16 * s)));
            const __m512i sc = _mm512_and_si512(sm, m15), mn = _mm512_srli_epi32(sm, 4);
            _Pragma("GCC unroll 16")
            for (int j = 0; j < NC; ++j) {
                I[j] = _mm512_add_epi32(I[j], _mm512_mullo_epi32(_mm512_add_epi32(P[j][0], P[j][1]), sc));
                M[j] = _mm512_add_epi32(M[j], _mm512_mullo_epi32(mn, _mm512_set1_epi32(ia[j][16 * sb + s])));
            }
        }
        scale_min_end(acc, I, M, g, fa, sb, NC);
    }
    _Pragma("GCC unroll 16")
    for (int j = 0; j < NC; ++j) _mm512_storeu_ps(out + 16 * j, acc[j]);
}

/* ---------------------------------------------------------------- 32-element blocks: Q4_0, Q4_1, Q8_0 */
/* kind 0: Q4_0 (nibbles, offset in ia), 1: Q4_1 (nibbles, min * s), 2: Q8_0 (bytes, offset in ia),
 * 3: Q5_0 (nibbles + a plane of fifth bits, offset in ia), 4: Q5_1 (nibbles + fifth bits, min * s),
 * 5: IQ4_NL (nibbles looked up in the code book + 128 by one byte shuffle, offset in ia), 6: MXFP4 (as IQ4_NL with
 * its E2M1 code book and an E8M0 exponent for d) */
T AI void b32_body(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int NC,
                   const int kind) {
    const int NCH = NC == 1 ? 4 : 2;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i m10 = _mm512_set1_epi8(0x10);
    const int has_min = kind == 1 || kind == 4, has_hb = kind == 3 || kind == 4, planes = kind == 3 ? 576 : 640;
    const int unit = kind == 0 || kind >= 5 ? 576 : kind == 1 ? 640 : kind == 2 ? 1088 : kind == 3 ? 704 : 768;
    const int qoff = has_min ? 128 : 64, ab = has_min ? 36 : 34, aq = has_min ? 4 : 2;
    const __m512i lut = _mm512_broadcast_i32x4(_mm_add_epi8(
        _mm_loadu_si128((const __m128i *)(kind == 6 ? QS_FP4X2 : QS_IQ4NL)), _mm_set1_epi8((char)0x80)));
    cols cs;
    cols_init(&cs, x, c0, NC, aq);
    __m512 *const acc = cs.acc;
    const uint8_t *const *const xq = cs.xq;
    const int32_t *const *const ia = cs.ia;
    const float *const *const fa = cs.fa, *const *const fb = cs.fb;
    for (int64_t kb = 0; kb < nb; ++kb, g += unit) {
        pf_lines(g, qoff / 64);
        if (has_hb) pf_lines(g + planes, 2);
        _Pragma("GCC unroll 16")
        for (int h = 0; h < 2; ++h) {
            const int64_t b = 2 * kb + h;
            __m512i P[4][4];
            _Pragma("GCC unroll 16")
            for (int j = 0; j < NC; ++j) {
                P[j][0] = has_min ? _mm512_setzero_si512() : _mm512_set1_epi32(-ia[j][b]);
                _Pragma("GCC unroll 4")
                for (int q = 1; q < NCH; ++q) P[j][q] = _mm512_setzero_si512();
            }
            if (kind == 2) {
                _Pragma("GCC unroll 16")
                for (int c = 0; c < 8; ++c) {
                    const uint8_t *vp = g + qoff + 64 * (8 * h + c);
                    _mm_prefetch((const char *)(vp + PF_DIST), _MM_HINT_T0);
                    const __m512i v = _mm512_loadu_si512((const void *)vp);
                    _Pragma("GCC unroll 16")
                    for (int j = 0; j < NC; ++j)
                        P[j][c % NCH] = _mm512_dpbusd_epi32(P[j][c % NCH], v, bc32(xq[j] + ab * b + 4 * c));
                }
            } else {
                _Pragma("GCC unroll 16")
                for (int c = 0; c < 4; ++c) {
                    const uint8_t *vp = g + qoff + 64 * (4 * h + c);
                    const int ch = NCH == 4 ? 2 * (c & 1) : 0;
                    _mm_prefetch((const char *)(vp + PF_DIST), _MM_HINT_T0);
                    const __m512i v = _mm512_loadu_si512((const void *)vp);
                    __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                    if (has_hb) {
                        const __m512i hb = _mm512_loadu_si512((const void *)(g + planes + 64 * h));
                        lo = _mm512_ternarylogic_epi32(lo, q5_hi(hb, 2 * c), m10, 0xF8);
                        hi = _mm512_ternarylogic_epi32(hi, q5_hi(hb, 2 * c + 1), m10, 0xF8);
                    }
                    if (kind >= 5) {
                        lo = _mm512_shuffle_epi8(lut, lo);
                        hi = _mm512_shuffle_epi8(lut, hi);
                    }
                    _Pragma("GCC unroll 16")
                    for (int j = 0; j < NC; ++j) {
                        const uint8_t *xp = xq[j] + ab * b + 8 * c;
                        P[j][ch] = _mm512_dpbusd_epi32(P[j][ch], lo, bc32(xp));
                        P[j][ch + 1] = _mm512_dpbusd_epi32(P[j][ch + 1], hi, bc32(xp + 4));
                    }
                }
            }
            const __m512 d = kind == 6 ? e8m0_16(g + 32 * h) : ph16(g + 32 * h);
            _Pragma("GCC unroll 16")
            for (int j = 0; j < NC; ++j) {
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum_chains(P[j], NCH)), _mm512_mul_ps(d, _mm512_set1_ps(fa[j][b])), acc[j]);
                if (has_min) acc[j] = _mm512_fmadd_ps(ph16(g + 64 + 32 * h), _mm512_set1_ps(fb[j][b]), acc[j]);
            }
        }
    }
    _Pragma("GCC unroll 16")
    for (int j = 0; j < NC; ++j) _mm512_storeu_ps(out + 16 * j, acc[j]);
}

/* ---------------------------------------------------------------- F32 (kind 0), F16 (1), BF16 (2) */
T AI __m512 fl_w(const uint8_t *p, const int kind) {
    if (kind == 0) return _mm512_loadu_ps((const float *)p);
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return kind == 1 ? _mm512_cvtph_ps(h) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Each element's 16 row values against the column's float activation, broadcast. Two chains per column (element e
 * feeds chain e % 2) keep a decode GEMV far above DRAM speed; the 8-column kernel reuses each loaded and
 * converted vector 8 times (16 accumulators), which is what bounds the prefill GEMM. */
T AI void fl_body(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int NC,
                  const int kind) {
    const int es = kind ? 32 : 64; /* bytes of one element's 16 values */
    __m512 acc[8][2];
    const float *xs[8];
    _Pragma("GCC unroll 8")
    for (int j = 0; j < NC; ++j) {
        xs[j] = (const float *)(x->xq + (c0 + j) * x->xq_stride);
        acc[j][0] = acc[j][1] = _mm512_setzero_ps();
    }
    for (int64_t kb = 0; kb < nb; ++kb, g += 16 * es) {
        pf_lines(g, es / 4);
        _Pragma("GCC unroll 16")
        for (int e = 0; e < 16; ++e) {
            const __m512 w = fl_w(g + es * e, kind);
            _Pragma("GCC unroll 8")
            for (int j = 0; j < NC; ++j)
                acc[j][e & 1] = _mm512_fmadd_ps(w, _mm512_set1_ps(xs[j][16 * kb + e]), acc[j][e & 1]);
        }
    }
    _Pragma("GCC unroll 8")
    for (int j = 0; j < NC; ++j) _mm512_storeu_ps(out + 16 * j, _mm512_add_ps(acc[j][0], acc[j][1]));
}

/* ---------------------------------------------------------------- entry points */
/* One column (decode) and four (prefill) per kernel; `kind` selects the layout within a shared body. */
#define RP_AVX512(name, body, kind)                                                                                \
    T void qs_rp_##name##_avx512_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {       \
        body(g, nb, x, c0, out, 4, kind);                                                                          \
    }                                                                                                              \
    T void qs_rp_##name##_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {       \
        body(g, nb, x, c0, out, 1, kind);                                                                          \
    }
#define Q6K(g, nb, x, c0, out, NC, kind) sb_body(g, nb, x, c0, out, NC, SB_Q6K)

RP_AVX512(q4_K, k45_body, 0)
RP_AVX512(q5_K, k45_body, 1)
RP_AVX512(q6_K, Q6K, 0)
RP_AVX512(q4_0, b32_body, 0)
RP_AVX512(q4_1, b32_body, 1)
RP_AVX512(q8_0, b32_body, 2)
RP_AVX512(q5_0, b32_body, 3)
RP_AVX512(q5_1, b32_body, 4)
RP_AVX512(iq4_nl, b32_body, 5)
RP_AVX512(mxfp4, b32_body, 6)
#define IQ4XS(g, nb, x, c0, out, NC, kind) sb_body(g, nb, x, c0, out, NC, SB_IQ4XS)
RP_AVX512(iq4_xs, IQ4XS, 0)
#define Q2K(g, nb, x, c0, out, NC, kind) q2k_body(g, nb, x, c0, out, NC)
RP_AVX512(q2_K, Q2K, 0)
#define Q3K(g, nb, x, c0, out, NC, kind) sb_body(g, nb, x, c0, out, NC, SB_Q3K)
RP_AVX512(q3_K, Q3K, 0)
#define SBC(g, nb, x, c0, out, NC, kind) sb_body(g, nb, x, c0, out, NC, kind)
RP_AVX512(codes16, SBC, SB_C16)
RP_AVX512(codes32, SBC, SB_C32)
RP_AVX512(codes256, SBC, SB_C256)
/* float layouts: 8 columns per call (RP_TABLE's cols) */
#define RP_AVX512_F(name, kind)                                                                                    \
    T void qs_rp_##name##_avx512_8(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {       \
        fl_body(g, nb, x, c0, out, 8, kind);                                                                       \
    }                                                                                                              \
    T void qs_rp_##name##_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {       \
        fl_body(g, nb, x, c0, out, 1, kind);                                                                       \
    }
RP_AVX512_F(f32, 0)
RP_AVX512_F(f16, 1)

/* ---------------------------------------------------------------- BF16 against BF16 activations */
/* The BF16 layout holds pairs (qs_repack.h): a 64-byte chunk is 16 rows x elements 2p, 2p+1, the operand of one
 * vdpbf16ps against the column's activation pair broadcast. Two chains per column (pair p feeds chain p % 2) as the
 * scalar reference; the 8-column kernel keeps 16 accumulators and reuses each loaded chunk 8 times. */
#define T_BF QS_TARGET_AVX512BF16
T_BF AI void bf_dp_body(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int NC) {
    __m512 acc[8][2];
    const uint8_t *xs[8];
    _Pragma("GCC unroll 8")
    for (int j = 0; j < NC; ++j) {
        xs[j] = x->xq + (c0 + j) * x->xq_stride;
        acc[j][0] = acc[j][1] = _mm512_setzero_ps();
    }
    for (int64_t kb = 0; kb < nb; ++kb, g += 512) {
        pf_lines(g, 8);
        _Pragma("GCC unroll 8")
        for (int p = 0; p < 8; ++p) {
            const __m512bh w = (__m512bh)_mm512_loadu_si512((const void *)(g + 64 * p));
            _Pragma("GCC unroll 8")
            for (int j = 0; j < NC; ++j) {
                const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)qs_load_u32(xs[j] + 32 * kb + 4 * p));
                acc[j][p & 1] = _mm512_dpbf16_ps(acc[j][p & 1], w, xv);
            }
        }
    }
    _Pragma("GCC unroll 8")
    for (int j = 0; j < NC; ++j) _mm512_storeu_ps(out + 16 * j, _mm512_add_ps(acc[j][0], acc[j][1]));
}

/* AVX-512F without BF16: the same sums with two fused multiply-adds per pair, odd element first (a product of two
 * bfloat16 values is exact, so each rounds as vdpbf16ps's steps do); a k-block's activations widened once per call
 * of the block into float32 on the stack. */
T AI void bf_widen(const uint8_t *const *xs, int64_t kb, const int NC, float (*xf)[16]) {
    _Pragma("GCC unroll 8")
    for (int j = 0; j < NC; ++j)
        _mm512_store_ps(xf[j], _mm512_castsi512_ps(_mm512_slli_epi32(
                                   _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(xs[j] + 32 * kb))), 16)));
}

T AI void bf_f_body(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int NC) {
    __m512 acc[8][2];
    const uint8_t *xs[8];
    float xf[2][8][16] __attribute__((aligned(64))); /* k-block kb's in xf[kb % 2], the next one's written ahead */
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    _Pragma("GCC unroll 8")
    for (int j = 0; j < NC; ++j) {
        xs[j] = x->xq + (c0 + j) * x->xq_stride;
        acc[j][0] = acc[j][1] = _mm512_setzero_ps();
    }
    if (nb > 0) bf_widen(xs, 0, NC, xf[0]);
    for (int64_t kb = 0; kb < nb; ++kb, g += 512) {
        pf_lines(g, 8);
        if (kb + 1 < nb) bf_widen(xs, kb + 1, NC, xf[(kb + 1) & 1]);
        const float(*xk)[16] = xf[kb & 1];
        _Pragma("GCC unroll 8")
        for (int p = 0; p < 8; ++p) {
            const __m512i v = _mm512_loadu_si512((const void *)(g + 64 * p));
            const __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            const __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
            _Pragma("GCC unroll 8")
            for (int j = 0; j < NC; ++j) {
                const __m512 a = _mm512_fmadd_ps(wo, _mm512_set1_ps(xk[j][2 * p + 1]), acc[j][p & 1]);
                acc[j][p & 1] = _mm512_fmadd_ps(we, _mm512_set1_ps(xk[j][2 * p]), a);
            }
        }
    }
    _Pragma("GCC unroll 8")
    for (int j = 0; j < NC; ++j) _mm512_storeu_ps(out + 16 * j, _mm512_add_ps(acc[j][0], acc[j][1]));
}

T_BF static void bf_dp_8(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    bf_dp_body(g, nb, x, c0, out, 8);
}
T_BF static void bf_dp_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    bf_dp_body(g, nb, x, c0, out, 1);
}
/* float32 -> BF16 activations, qs_fp32_to_bf16's bits: round to nearest even, a NaN kept quiet */
T void qs_rp_bf16_act_avx512(const float *x, uint8_t *dst, int64_t n) {
    const __m512i abs = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7FFF), quiet = _mm512_set1_epi32(64);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i u = _mm512_loadu_si512((const void *)(x + i));
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
        const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
        const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(half, odd)), 16);
        const __m512i v = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), quiet);
        _mm256_storeu_si256((__m256i *)(dst + 2 * i), _mm512_cvtepi32_epi16(v));
    }
    for (; i < n; ++i) {
        const uint16_t h = qs_fp32_to_bf16(x[i]);
        memcpy(dst + 2 * i, &h, 2);
    }
}

/* the AVX-512 slot: vdpbf16ps where the CPU has it and it is not switched off (qs_bf16_dot_set) */
T void qs_rp_bf16_avx512_8(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    if (qs_bf16_dot()) bf_dp_8(g, nb, x, c0, out);
    else bf_f_body(g, nb, x, c0, out, 8);
}
T void qs_rp_bf16_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    if (qs_bf16_dot()) bf_dp_1(g, nb, x, c0, out);
    else bf_f_body(g, nb, x, c0, out, 1);
}

#endif /* QS_ARCH_X86 */
