/* AVX2 kernels on repacked (R16) weights, qs_repack.h: the AVX-512 kernels' arithmetic on half a row group at a
 * time. A 256-bit register holds 4 code bytes of 8 rows, so each kernel makes two passes over a group's units,
 * rows 0-7 then rows 8-15 (the second pass finds the group in L1/L2). vpdpbusd becomes vpmaddubsw + vpmaddwd,
 * exact because no pair of code x activation products leaves int16 (codes <= 63); Q8_0's byte codes would, so
 * its kernel multiplies the signed weight with the sign trick instead and needs no activation offset. Every
 * integer sum and every float operation per row is the scalar reference's (qs_repack.c): bit-identical. */
#include "qs_arch.h"
#if QS_ARCH_X86
#include <immintrin.h>

#include "qs.h"
#include "qs_quant_internal.h"
#include "qs_repack.h"

#define T QS_TARGET_AVX2
#define AI __attribute__((always_inline)) static inline
#define PF_DIST 8192 /* as the AVX-512 kernels; only the first pass over a group prefetches */

T AI __m256i bc32(const uint8_t *p) { return _mm256_set1_epi32((int)qs_load_u32(p)); }

T AI __m256 ph8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* 8 MXFP4 exponents (u16 slots) as qs_e8m0_half's floats */
T AI __m256 e8m0_8(const uint8_t *p) {
    const __m256i e = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    const __m256i norm = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(norm, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
}

/* acc + per 32-bit lane the sum of its 4 u8 x s8 products (exact while each pair's sum fits int16) */
T AI __m256i dot4(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

T AI __m256i sum_chains(const __m256i *p, const int n) {
    const __m256i s = _mm256_add_epi32(p[0], p[1]);
    return n == 4 ? _mm256_add_epi32(s, _mm256_add_epi32(p[2], p[3])) : s;
}

T AI __m256i ld(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* bit i of each byte -> bit 4 (other bits masked later): Q5's fifth bits */
T AI __m256i q5_hi(__m256i h, int i) {
    return i < 4 ? _mm256_slli_epi16(h, 4 - i) : i == 4 ? h : _mm256_srli_epi16(h, i - 4);
}

/* bits 2i..2i+1 of each byte -> bits 4..5: Q6_K's high bits */
T AI __m256i q6_hi(__m256i h, int i) {
    switch (i) {
    case 0: return _mm256_slli_epi16(h, 4);
    case 1: return _mm256_slli_epi16(h, 2);
    case 2: return h;
    default: return _mm256_srli_epi16(h, 2);
    }
}

T AI void pf(const uint8_t *p, const int on) {
    if (on) _mm_prefetch((const char *)(p + PF_DIST), _MM_HINT_T0);
}

/* columns c0 .. c0+NC-1 of rows 8h .. 8h+7: accumulators, activation codes (at byte aq of each block), sums */
typedef struct {
    __m256 acc[2];
    const uint8_t *xq[2];
    const int32_t *ia[2];
    const float *fa[2], *fb[2];
} cols;

T AI void cols_init(cols *c, const qs_rp_x *x, int64_t c0, const int NC, int aq) {
    _Pragma("GCC unroll 8")
    for (int j = 0; j < NC; ++j) {
        c->acc[j] = _mm256_setzero_ps();
        c->xq[j] = x->xq + (c0 + j) * x->xq_stride + aq;
        c->ia[j] = x->ia + (c0 + j) * x->ia_stride;
        c->fa[j] = x->fa + (c0 + j) * x->f_stride;
        c->fb[j] = x->fb + (c0 + j) * x->f_stride;
    }
}

T AI void cols_store(const cols *c, float *out, const int NC, const int h) {
    _Pragma("GCC unroll 8")
    for (int j = 0; j < NC; ++j) _mm256_storeu_ps(out + 16 * j + 8 * h, c->acc[j]);
}

/* A K-quant block's end on rows 8h..8h+7: acc + I · (d · d_x) − M · (dmin · d_x), fused as the scalar references */
T AI void scale_min_end(cols *cs, const __m256i *I, const __m256i *M, const uint8_t *g, int64_t sb, const int NC,
                        const int h) {
    const __m256 d = ph8(g + 16 * h), dm = ph8(g + 32 + 16 * h);
    _Pragma("GCC unroll 8")
    for (int j = 0; j < NC; ++j) {
        const __m256 dx = _mm256_set1_ps(cs->fa[j][sb]);
        cs->acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[j]), _mm256_mul_ps(d, dx), cs->acc[j]);
        cs->acc[j] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(M[j]), _mm256_mul_ps(dm, dx), cs->acc[j]);
    }
}

/* ---------------------------------------------------------------- Q4_K (five = 0), Q5_K (five = 1) */
T AI void k45_half(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int NC,
                   const int five, const int h) {
    const int NCH = NC == 1 ? 4 : 2, unit = five ? 2880 : 2368;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m10 = _mm256_set1_epi8(0x10);
    cols cs;
    cols_init(&cs, x, c0, NC, 4);
    for (int64_t sb = 0; sb < nb; ++sb, g += unit) {
        _Pragma("GCC unroll 8")
        for (int l = 0; l < 5; ++l) pf(g + 64 * l, h == 0);
        __m256i I[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int s = 0; s < 8; ++s) {
            __m256i hb = _mm256_setzero_si256();
            if (five) {
                pf(g + K5_BITS(s), h == 0);
                hb = ld(g + K5_BITS(s) + 32 * h);
            }
            __m256i P[2][4];
            _Pragma("GCC unroll 8")
            for (int j = 0; j < NC; ++j)
                _Pragma("GCC unroll 8")
                for (int q = 0; q < NCH; ++q) P[j][q] = _mm256_setzero_si256();
            _Pragma("GCC unroll 8")
            for (int cc = 0; cc < 4; ++cc) {
                const int c = 4 * s + cc, ch = NCH == 4 ? 2 * (cc & 1) : 0;
                pf(g + K45_NIB(five, c), h == 0);
                const __m256i v = ld(g + K45_NIB(five, c) + 32 * h);
                __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                if (five) {
                    lo = _mm256_or_si256(lo, _mm256_and_si256(q5_hi(hb, 2 * cc), m10));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(q5_hi(hb, 2 * cc + 1), m10));
                }
                _Pragma("GCC unroll 8")
                for (int j = 0; j < NC; ++j) {
                    const uint8_t *xp = cs.xq[j] + 292 * sb + 8 * c;
                    P[j][ch] = dot4(P[j][ch], lo, bc32(xp));
                    P[j][ch + 1] = dot4(P[j][ch + 1], hi, bc32(xp + 4));
                }
            }
            const __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(g + 64 + 16 * s + 8 * h)));
            _Pragma("GCC unroll 8")
            for (int j = 0; j < NC; ++j) {
                I[j] = _mm256_add_epi32(I[j], _mm256_mullo_epi32(sum_chains(P[j], NCH), sc));
            }
        }
        __m256i M[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        _Pragma("GCC unroll 8")
        for (int p = 0; p < 4; ++p) {
            const __m256i mn = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(g + 192 + 32 * p + 16 * h)));
            _Pragma("GCC unroll 8")
            for (int j = 0; j < NC; ++j)
                M[j] = _mm256_add_epi32(M[j], _mm256_madd_epi16(mn, _mm256_set1_epi32(cs.ia[j][4 * sb + p])));
        }
        scale_min_end(&cs, I, M, g, sb, NC, h);
    }
    cols_store(&cs, out, NC, h);
}

/* ---------------------------------------------------------------- Q6_K, Q3_K, IQ4_XS */
/* The AVX-512 kernels' sb_body on rows 8h .. 8h+7: per sub-block the integer sum of the codes against the
 * activations (Q6_K, Q3_K: unsigned codes and the offset in ia; IQ4_XS: the signed code-book values with the sign
 * trick, no offset), times the signed scale; one float multiply-add per block. */
enum { SB_Q6K, SB_Q3K, SB_IQ4XS, SB_C16, SB_C32, SB_C256 }; /* as the AVX-512 kernels */
#define SB_CODES(kind) ((kind) >= SB_C16)
#define SB_GS(kind) ((kind) == SB_C16 ? 16 : (kind) == SB_C32 ? 32 : 256)

T AI __m256i q3_hi(__m256i h, const int b) { /* bit b of each byte -> bit 2 (other bits masked later) */
    return b < 2 ? _mm256_slli_epi16(h, 2 - b) : b == 2 ? h : _mm256_srli_epi16(h, b - 2);
}

/* step t of sub-block s (4 elements per row): the codes of rows 8h..8h+7 and where their activations start */
T AI __m256i sb_codes(const uint8_t *g, const int kind, const int s, const int t, const int h, int *a) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    if (kind == SB_Q6K) {
        const int c = 2 * s + t / 2, hi = t % 2;
        const __m256i v = ld(g + Q6_LO(c) + 32 * h), hb = ld(g + Q6_HI(s) + 32 * h);
        *a = 8 * c + 4 * hi;
        return _mm256_or_si256(_mm256_and_si256(hi ? _mm256_srli_epi16(v, 4) : v, m4),
                               _mm256_and_si256(q6_hi(hb, t), _mm256_set1_epi8(0x30)));
    }
    if (SB_CODES(kind)) { /* codes + 64 <= 127: unsigned bytes whose pair sums stay inside int16 */
        const int c = s * (SB_GS(kind) / 4) + t;
        *a = 4 * c;
        return ld(g + 320 + 64 * c + 32 * h);
    }
    if (kind == SB_Q3K) {
        const __m256i v = ld(g + Q3_CR(s) + 32 * h), hb = ld(g + Q3_HI(s / 2) + 32 * h);
        *a = 16 * s + 4 * t;
        return _mm256_or_si256(_mm256_and_si256(t ? _mm256_srli_epi16(v, 2 * t) : v, _mm256_set1_epi8(3)),
                               _mm256_and_si256(q3_hi(hb, t + 4 * (s % 2)), _mm256_set1_epi8(4)));
    }
    const int c = 4 * s + t / 2, hi = t % 2;
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)QS_IQ4NL));
    const __m256i v = ld(g + 192 + 64 * c + 32 * h);
    *a = 8 * c + 4 * hi;
    return _mm256_shuffle_epi8(lut, _mm256_and_si256(hi ? _mm256_srli_epi16(v, 4) : v, m4));
}

T AI void sb_half(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int NC,
                  const int kind, const int h) {
    const int NCH = NC == 1 ? 4 : 2;
    const int n_sub = SB_CODES(kind) ? 256 / SB_GS(kind) : kind == SB_IQ4XS ? 8 : 16;
    const int steps = SB_CODES(kind) ? SB_GS(kind) / 4 : kind == SB_IQ4XS ? 8 : 4;
    const int unit = SB_CODES(kind) ? 4416 : kind == SB_Q6K ? 3392 : kind == SB_Q3K ? 1856 : 2240;
    const int head = SB_CODES(kind) ? 0 : kind == SB_IQ4XS ? 3 : 5;
    cols cs;
    cols_init(&cs, x, c0, NC, 4);
    for (int64_t sb = 0; sb < nb; ++sb, g += unit) {
        _Pragma("GCC unroll 8")
        for (int l = 0; l < head; ++l) pf(g + 64 * l, h == 0);
        __m256i I[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        _Pragma("GCC unroll 2")
        for (int s = 0; s < n_sub; ++s) {
            if (kind == SB_Q6K) {
                pf(g + Q6_HI(s), h == 0);
                pf(g + Q6_LO(2 * s), h == 0);
                pf(g + Q6_LO(2 * s + 1), h == 0);
            } else if (kind == SB_Q3K) {
                pf(g + Q3_CR(s), h == 0);
                if (s % 2 == 0) pf(g + Q3_HI(s / 2), h == 0);
            } else if (kind == SB_IQ4XS) {
                _Pragma("GCC unroll 4")
                for (int c = 4 * s; c < 4 * s + 4; ++c) pf(g + 192 + 64 * c, h == 0);
            }
            __m256i P[2][4];
            _Pragma("GCC unroll 8")
            for (int j = 0; j < NC; ++j) {
                P[j][0] = kind == SB_IQ4XS ? _mm256_setzero_si256() : _mm256_set1_epi32(-cs.ia[j][n_sub * sb + s]);
                _Pragma("GCC unroll 8")
                for (int q = 1; q < NCH; ++q) P[j][q] = _mm256_setzero_si256();
            }
            _Pragma("GCC unroll 8")
            for (int t = 0; t < steps; ++t) {
                int a;
                const __m256i c = sb_codes(g, kind, s, t, h, &a);
                const __m256i u = kind == SB_IQ4XS ? _mm256_abs_epi8(c) : c;
                _Pragma("GCC unroll 8")
                for (int j = 0; j < NC; ++j) {
                    const __m256i xv = bc32(cs.xq[j] + 292 * sb + a);
                    P[j][t % NCH] = dot4(P[j][t % NCH], u, kind == SB_IQ4XS ? _mm256_sign_epi8(xv, c) : xv);
                }
            }
            const __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(g + 64 + 16 * s + 8 * h)));
            _Pragma("GCC unroll 8")
            for (int j = 0; j < NC; ++j) I[j] = _mm256_add_epi32(I[j], _mm256_mullo_epi32(sum_chains(P[j], NCH), sc));
        }
        const __m256 d = SB_CODES(kind) ? _mm256_loadu_ps((const float *)g + 8 * h) : ph8(g + 16 * h);
        _Pragma("GCC unroll 8")
        for (int j = 0; j < NC; ++j)
            cs.acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[j]), _mm256_mul_ps(d, _mm256_set1_ps(cs.fa[j][sb])),
                                        cs.acc[j]);
    }
    cols_store(&cs, out, NC, h);
}

/* ---------------------------------------------------------------- Q2_K */
T AI void q2k_half(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int NC, const int h) {
    const __m256i m3 = _mm256_set1_epi8(3), m15 = _mm256_set1_epi32(15);
    cols cs;
    cols_init(&cs, x, c0, NC, 4);
    for (int64_t sb = 0; sb < nb; ++sb, g += 1344) {
        _Pragma("GCC unroll 8")
        for (int l = 0; l < 5; ++l) pf(g + 64 * l, h == 0);
        __m256i I[2], M[2];
        _Pragma("GCC unroll 8")
        for (int j = 0; j < NC; ++j) I[j] = M[j] = _mm256_setzero_si256();
        _Pragma("GCC unroll 2")
        for (int s = 0; s < 16; ++s) {
            pf(g + Q2_CR(s), h == 0);
            const __m256i v = ld(g + Q2_CR(s) + 32 * h);
            __m256i P[2][2];
            _Pragma("GCC unroll 8")
            for (int j = 0; j < NC; ++j) P[j][0] = P[j][1] = _mm256_setzero_si256();
            _Pragma("GCC unroll 4")
            for (int i = 0; i < 4; ++i) {
                const __m256i c = _mm256_and_si256(i ? _mm256_srli_epi16(v, 2 * i) : v, m3);
                _Pragma("GCC unroll 8")
                for (int j = 0; j < NC; ++j)
                    P[j][i & 1] = dot4(P[j][i & 1], c, bc32(cs.xq[j] + 292 * sb + 16 * s + 4 * i));
            }
            const __m256i sm = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(g + 64 + 16 * s + 8 * h)));
            const __m256i sc = _mm256_and_si256(sm, m15), mn = _mm256_srli_epi32(sm, 4);
            _Pragma("GCC unroll 8")
            for (int j = 0; j < NC; ++j) {
                I[j] = _mm256_add_epi32(I[j], _mm256_mullo_epi32(_mm256_add_epi32(P[j][0], P[j][1]), sc));
                M[j] = _mm256_add_epi32(M[j], _mm256_mullo_epi32(mn, _mm256_set1_epi32(cs.ia[j][16 * sb + s])));
            }
        }
        scale_min_end(&cs, I, M, g, sb, NC, h);
    }
    cols_store(&cs, out, NC, h);
}

/* ---------------------------------------------------------------- 32-element blocks */
/* kind 0: Q4_0, 1: Q4_1, 2: Q8_0, 3: Q5_0, 4: Q5_1, 5: IQ4_NL, 6: MXFP4 (as the AVX-512 kernels; IQ4_NL and MXFP4,
 * like Q8_0, multiply the signed code-book values with the sign trick and need no offset) */
T AI void b32_half(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int NC,
                   const int kind, const int h) {
    const int NCH = NC == 1 ? 4 : 2;
    const int has_min = kind == 1 || kind == 4, has_hb = kind == 3 || kind == 4, planes = kind == 3 ? 576 : 640;
    const int unit = kind == 0 || kind >= 5 ? 576 : kind == 1 ? 640 : kind == 2 ? 1088 : kind == 3 ? 704 : 768;
    const int qoff = has_min ? 128 : 64, ab = has_min ? 36 : 34, aq = has_min ? 4 : 2;
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(kind == 6 ? QS_FP4X2 : QS_IQ4NL)));
    const __m256i m4 = _mm256_set1_epi8(0x0F), m10 = _mm256_set1_epi8(0x10), m80 = _mm256_set1_epi8((char)0x80);
    cols cs;
    cols_init(&cs, x, c0, NC, aq);
    for (int64_t kb = 0; kb < nb; ++kb, g += unit) {
        _Pragma("GCC unroll 8")
        for (int l = 0; l < qoff / 64; ++l) pf(g + 64 * l, h == 0);
        if (has_hb) {
            pf(g + planes, h == 0);
            pf(g + planes + 64, h == 0);
        }
        _Pragma("GCC unroll 8")
        for (int hh = 0; hh < 2; ++hh) {
            const int64_t b = 2 * kb + hh;
            __m256i P[2][4];
            _Pragma("GCC unroll 8")
            for (int j = 0; j < NC; ++j) {
                /* Q8_0 multiplies the signed weights: no offset; the others' codes carry one (ia) or a min */
                P[j][0] = has_min || kind == 2 || kind >= 5 ? _mm256_setzero_si256() : _mm256_set1_epi32(-cs.ia[j][b]);
                _Pragma("GCC unroll 8")
                for (int q = 1; q < NCH; ++q) P[j][q] = _mm256_setzero_si256();
            }
            if (kind == 2) {
                _Pragma("GCC unroll 8")
                for (int c = 0; c < 8; ++c) {
                    const uint8_t *vp = g + qoff + 64 * (8 * hh + c);
                    pf(vp, h == 0);
                    const __m256i q = _mm256_xor_si256(ld(vp + 32 * h), m80), aw = _mm256_abs_epi8(q);
                    _Pragma("GCC unroll 8")
                    for (int j = 0; j < NC; ++j) {
                        const __m256i xs = _mm256_sign_epi8(bc32(cs.xq[j] + ab * b + 4 * c), q);
                        P[j][c % NCH] = dot4(P[j][c % NCH], aw, xs);
                    }
                }
            } else {
                _Pragma("GCC unroll 8")
                for (int c = 0; c < 4; ++c) {
                    const uint8_t *vp = g + qoff + 64 * (4 * hh + c);
                    const int ch = NCH == 4 ? 2 * (c & 1) : 0;
                    pf(vp, h == 0);
                    const __m256i v = ld(vp + 32 * h);
                    __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    if (has_hb) {
                        const __m256i hb = ld(g + planes + 64 * hh + 32 * h);
                        lo = _mm256_or_si256(lo, _mm256_and_si256(q5_hi(hb, 2 * c), m10));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(q5_hi(hb, 2 * c + 1), m10));
                    }
                    if (kind >= 5) {
                        const __m256i ql = _mm256_shuffle_epi8(lut, lo), qh = _mm256_shuffle_epi8(lut, hi);
                        const __m256i al = _mm256_abs_epi8(ql), ah = _mm256_abs_epi8(qh);
                        _Pragma("GCC unroll 8")
                        for (int j = 0; j < NC; ++j) {
                            const uint8_t *xp = cs.xq[j] + ab * b + 8 * c;
                            P[j][ch] = dot4(P[j][ch], al, _mm256_sign_epi8(bc32(xp), ql));
                            P[j][ch + 1] = dot4(P[j][ch + 1], ah, _mm256_sign_epi8(bc32(xp + 4), qh));
                        }
                        continue;
                    }
                    _Pragma("GCC unroll 8")
                    for (int j = 0; j < NC; ++j) {
                        const uint8_t *xp = cs.xq[j] + ab * b + 8 * c;
                        P[j][ch] = dot4(P[j][ch], lo, bc32(xp));
                        P[j][ch + 1] = dot4(P[j][ch + 1], hi, bc32(xp + 4));
                    }
                }
            }
            const __m256 d = kind == 6 ? e8m0_8(g + 32 * hh + 16 * h) : ph8(g + 32 * hh + 16 * h);
            _Pragma("GCC unroll 8")
            for (int j = 0; j < NC; ++j) {
                const __m256 dx = _mm256_mul_ps(d, _mm256_set1_ps(cs.fa[j][b]));
                cs.acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_chains(P[j], NCH)), dx, cs.acc[j]);
                if (has_min)
                    cs.acc[j] = _mm256_fmadd_ps(ph8(g + 64 + 32 * hh + 16 * h), _mm256_set1_ps(cs.fb[j][b]), cs.acc[j]);
            }
        }
    }
    cols_store(&cs, out, NC, h);
}

/* ---------------------------------------------------------------- F32 (kind 0), F16 (1), BF16 (2) */
T AI __m256 fl_w8(const uint8_t *p, const int kind) {
    if (kind == 0) return _mm256_loadu_ps((const float *)p);
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    return kind == 1 ? _mm256_cvtph_ps(h) : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* the AVX-512 kernel's two chains per column on rows 8h .. 8h+7, up to 4 columns */
T AI void fl_half(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int NC,
                  const int kind, const int h) {
    const int es = kind ? 32 : 64;
    __m256 acc[4][2];
    const float *xs[4];
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NC; ++j) {
        xs[j] = (const float *)(x->xq + (c0 + j) * x->xq_stride);
        acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    }
    for (int64_t kb = 0; kb < nb; ++kb, g += 16 * es) {
        _Pragma("GCC unroll 16")
        for (int l = 0; l < es / 4; ++l) pf(g + 64 * l, h == 0);
        _Pragma("GCC unroll 16")
        for (int e = 0; e < 16; ++e) {
            const __m256 w = fl_w8(g + es * e + es / 2 * h, kind);
            _Pragma("GCC unroll 4")
            for (int j = 0; j < NC; ++j)
                acc[j][e & 1] = _mm256_fmadd_ps(w, _mm256_set1_ps(xs[j][16 * kb + e]), acc[j][e & 1]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NC; ++j) _mm256_storeu_ps(out + 16 * j + 8 * h, _mm256_add_ps(acc[j][0], acc[j][1]));
}

/* Entry points: one column (decode) or four (prefill, as two pairs), each over both halves of the group. */
#define RP_AVX2(name, call)                                                                                        \
    T void qs_rp_##name##_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {         \
        for (int h = 0; h < 2; ++h) call(g, nb, x, c0, out, 1, h);                                                 \
    }                                                                                                              \
    T void qs_rp_##name##_avx2_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {         \
        for (int p = 0; p < 4; p += 2)                                                                             \
            for (int h = 0; h < 2; ++h) call(g, nb, x, c0 + p, out + 16 * p, 2, h);                                \
    }

#define K4(g, nb, x, c0, out, NC, h) k45_half(g, nb, x, c0, out, NC, 0, h)
#define K5(g, nb, x, c0, out, NC, h) k45_half(g, nb, x, c0, out, NC, 1, h)
#define B0(g, nb, x, c0, out, NC, h) b32_half(g, nb, x, c0, out, NC, 0, h)
#define B1(g, nb, x, c0, out, NC, h) b32_half(g, nb, x, c0, out, NC, 1, h)
#define B2(g, nb, x, c0, out, NC, h) b32_half(g, nb, x, c0, out, NC, 2, h)
#define B3(g, nb, x, c0, out, NC, h) b32_half(g, nb, x, c0, out, NC, 3, h)
#define B4(g, nb, x, c0, out, NC, h) b32_half(g, nb, x, c0, out, NC, 4, h)
#define B5(g, nb, x, c0, out, NC, h) b32_half(g, nb, x, c0, out, NC, 5, h)
#define B6(g, nb, x, c0, out, NC, h) b32_half(g, nb, x, c0, out, NC, 6, h)

RP_AVX2(q4_K, K4)
RP_AVX2(q5_K, K5)
#define SB6(g, nb, x, c0, out, NC, h) sb_half(g, nb, x, c0, out, NC, SB_Q6K, h)
#define SB3(g, nb, x, c0, out, NC, h) sb_half(g, nb, x, c0, out, NC, SB_Q3K, h)
#define SBX(g, nb, x, c0, out, NC, h) sb_half(g, nb, x, c0, out, NC, SB_IQ4XS, h)
RP_AVX2(q6_K, SB6)
RP_AVX2(q4_0, B0)
RP_AVX2(q4_1, B1)
RP_AVX2(q8_0, B2)
RP_AVX2(q5_0, B3)
RP_AVX2(q5_1, B4)
RP_AVX2(iq4_nl, B5)
RP_AVX2(mxfp4, B6)
RP_AVX2(iq4_xs, SBX)
RP_AVX2(q2_K, q2k_half)
RP_AVX2(q3_K, SB3)
#define SBC16(g, nb, x, c0, out, NC, h) sb_half(g, nb, x, c0, out, NC, SB_C16, h)
#define SBC32(g, nb, x, c0, out, NC, h) sb_half(g, nb, x, c0, out, NC, SB_C32, h)
#define SBC256(g, nb, x, c0, out, NC, h) sb_half(g, nb, x, c0, out, NC, SB_C256, h)
RP_AVX2(codes16, SBC16)
RP_AVX2(codes32, SBC32)
RP_AVX2(codes256, SBC256)
/* float layouts: 8 columns per call as two passes of 4 over each half */
#define RP_AVX2_F(name, kind)                                                                                      \
    T void qs_rp_##name##_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {         \
        for (int h = 0; h < 2; ++h) fl_half(g, nb, x, c0, out, 1, kind, h);                                        \
    }                                                                                                              \
    T void qs_rp_##name##_avx2_8(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {         \
        for (int p = 0; p < 8; p += 4)                                                                             \
            for (int h = 0; h < 2; ++h) fl_half(g, nb, x, c0 + p, out + 16 * p, 4, kind, h);                       \
    }
RP_AVX2_F(f32, 0)
RP_AVX2_F(f16, 1)

/* BF16 against BF16 activations (qs_rp_bf16_scalar's sums): rows 8h .. 8h+7 of each pair chunk, split into the
 * even and odd elements, two fused multiply-adds per pair (odd first), two chains per column, up to 4 columns; a
 * k-block's activations widened once into float32 on the stack. */
T AI void bf_half(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int NC, const int h) {
    __m256 acc[4][2];
    const uint8_t *xs[4];
    float xf[4][16] __attribute__((aligned(32)));
    const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NC; ++j) {
        xs[j] = x->xq + (c0 + j) * x->xq_stride;
        acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    }
    for (int64_t kb = 0; kb < nb; ++kb, g += 512) {
        _Pragma("GCC unroll 8")
        for (int l = 0; l < 8; ++l) pf(g + 64 * l, h == 0);
        _Pragma("GCC unroll 4")
        for (int j = 0; j < NC; ++j)
            for (int q = 0; q < 2; ++q)
                _mm256_store_si256((__m256i *)(xf[j] + 8 * q),
                                   _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(
                                                         (const __m128i *)(xs[j] + 32 * kb + 16 * q))), 16));
        _Pragma("GCC unroll 8")
        for (int p = 0; p < 8; ++p) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(g + 64 * p + 32 * h));
            const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
            const __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
            _Pragma("GCC unroll 4")
            for (int j = 0; j < NC; ++j) {
                const __m256 a = _mm256_fmadd_ps(wo, _mm256_set1_ps(xf[j][2 * p + 1]), acc[j][p & 1]);
                acc[j][p & 1] = _mm256_fmadd_ps(we, _mm256_set1_ps(xf[j][2 * p]), a);
            }
        }
    }
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NC; ++j) _mm256_storeu_ps(out + 16 * j + 8 * h, _mm256_add_ps(acc[j][0], acc[j][1]));
}

/* float32 -> BF16 activations, qs_fp32_to_bf16's bits: round to nearest even, a NaN kept quiet */
T void qs_rp_bf16_act_avx2(const float *x, uint8_t *dst, int64_t n) {
    const __m256i abs = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7FFF), quiet = _mm256_set1_epi32(64);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i v[2];
        for (int h = 0; h < 2; ++h) {
            const __m256i u = _mm256_loadu_si256((const __m256i *)(x + i + 8 * h));
            /* signed compare: |u| and inf are both below 2^31 */
            const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
            const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
            const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(half, odd)), 16);
            v[h] = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet), nan);
        }
        /* unsigned saturation never bites (every value fits 16 bits); packus works per 128-bit lane */
        const __m256i p = _mm256_packus_epi32(v[0], v[1]);
        _mm256_storeu_si256((__m256i *)(dst + 2 * i), _mm256_permute4x64_epi64(p, 0xD8));
    }
    for (; i < n; ++i) {
        const uint16_t h = qs_fp32_to_bf16(x[i]);
        memcpy(dst + 2 * i, &h, 2);
    }
}

T void qs_rp_bf16_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    for (int h = 0; h < 2; ++h) bf_half(g, nb, x, c0, out, 1, h);
}
T void qs_rp_bf16_avx2_8(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    for (int p = 0; p < 8; p += 4)
        for (int h = 0; h < 2; ++h) bf_half(g, nb, x, c0 + p, out + 16 * p, 4, h);
}

#endif /* QS_ARCH_X86 */
