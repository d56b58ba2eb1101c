/* AVX-512 dot products of lattice i-quants and ternary types against Q8_K (docs/quant-formats.md, "I-quants").
 * The AVX2 kernels fetch each code-book row with a scalar load; with AVX512_VBMI a whole block's rows come from
 * byte/word permutes (vpermi2b, vpermi2w) into small tables derived from ggml's grids at load, so a block costs a
 * fixed few dozen vector instructions. The integer sum of each block is the scalar reference's exactly, and the
 * float work is its s = fma(d · d_x, isum, s) block after block, so the results are the same bits as the
 * qs_dot_*_scalar references. The VBMI kernels run only where the CPU has it (qs_cpu_has_vbmi); TQ2_0's needs
 * only AVX-512 F/BW/VL + VNNI. */
#include "qs_arch.h"
#if QS_ARCH_X86
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "qs.h"
#include "qs_iq_grids.h"
#include "qs_quant_internal.h"

#define T __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")))
#define T512 QS_TARGET_AVX512 /* AVX-512 F/BW/VL + VNNI, no VBMI */
#define AI __attribute__((always_inline)) static inline

/* IQ3_S's 512 grid rows, each four coordinates in 1..15, as two byte tables: coordinates 0 | 1 << 4 and
 * 2 | 3 << 4 of row r at byte r. */
static uint8_t IQ3S_P01[512] __attribute__((aligned(64)));
static uint8_t IQ3S_P23[512] __attribute__((aligned(64)));

__attribute__((constructor)) static void iq3s_tables_init(void) {
    for (int r = 0; r < 512; ++r) {
        const uint8_t *g = QS_GRID_IQ3_S[r];
        IQ3S_P01[r] = (uint8_t)(g[0] | g[1] << 4);
        IQ3S_P23[r] = (uint8_t)(g[2] | g[3] << 4);
    }
}

/* table[idx] for 64 9-bit indices (low 8 bits in idx, bit 8 in k8): four 128-entry permutes, picked by bit 7 and
 * bit 8 */
T AI __m512i lookup512(const uint8_t *table, __m512i idx, __mmask64 k7, __mmask64 k8) {
    const __m512i *t = (const __m512i *)table;
    const __m512i a0 = _mm512_permutex2var_epi8(_mm512_load_si512(t + 0), idx, _mm512_load_si512(t + 1));
    const __m512i a1 = _mm512_permutex2var_epi8(_mm512_load_si512(t + 2), idx, _mm512_load_si512(t + 3));
    const __m512i a2 = _mm512_permutex2var_epi8(_mm512_load_si512(t + 4), idx, _mm512_load_si512(t + 5));
    const __m512i a3 = _mm512_permutex2var_epi8(_mm512_load_si512(t + 6), idx, _mm512_load_si512(t + 7));
    return _mm512_mask_blend_epi8(k8, _mm512_mask_blend_epi8(k7, a0, a1), _mm512_mask_blend_epi8(k7, a2, a3));
}

/* Byte-interleave permutes: lo[2i] = a[i], lo[2i + 1] = b[i] for i < 32; hi the same for i = 32..63. Word
 * interleave: w0[2t] = a[t], w0[2t + 1] = b[t] (words, t < 16); w1 from t = 16..31. */
static uint8_t IL_BYTES[2][64] __attribute__((aligned(64)));
static uint16_t IL_WORDS[2][32] __attribute__((aligned(64)));

__attribute__((constructor)) static void interleave_init(void) {
    for (int h = 0; h < 2; ++h) {
        for (int i = 0; i < 32; ++i) {
            IL_BYTES[h][2 * i] = (uint8_t)(32 * h + i);
            IL_BYTES[h][2 * i + 1] = (uint8_t)(64 + 32 * h + i);
        }
        for (int t = 0; t < 16; ++t) {
            IL_WORDS[h][2 * t] = (uint16_t)(16 * h + t);
            IL_WORDS[h][2 * t + 1] = (uint16_t)(32 + 16 * h + t);
        }
    }
}

/* Coordinate k of rows 0..63 in x_k -> the 256 coordinates in element order (element 4i + k), 64 per register */
T AI void in_element_order(__m512i x0, __m512i x1, __m512i x2, __m512i x3, __m512i co[4]) {
    const __m512i ib0 = _mm512_load_si512(IL_BYTES[0]), ib1 = _mm512_load_si512(IL_BYTES[1]);
    const __m512i a0 = _mm512_permutex2var_epi8(x0, ib0, x1), a1 = _mm512_permutex2var_epi8(x0, ib1, x1);
    const __m512i b0 = _mm512_permutex2var_epi8(x2, ib0, x3), b1 = _mm512_permutex2var_epi8(x2, ib1, x3);
    const __m512i iw0 = _mm512_load_si512(IL_WORDS[0]), iw1 = _mm512_load_si512(IL_WORDS[1]);
    co[0] = _mm512_permutex2var_epi16(a0, iw0, b0);
    co[1] = _mm512_permutex2var_epi16(a0, iw1, b0);
    co[2] = _mm512_permutex2var_epi16(a1, iw0, b1);
    co[3] = _mm512_permutex2var_epi16(a1, iw1, b1);
}

/* The block's integer sum from its 256 unsigned coordinates (64 per register, element order), the sign bits (bit j
 * of sg[m] negates element 64m + j) and the int16 scales of the pairs of each register (sc[m]) */
T AI __m512i block_sum(const __m512i co[4], const uint64_t *sg, const __m512i sc[4], const int8_t *q) {
    const __m512i zero = _mm512_setzero_si512();
    __m512i acc = zero;
    _Pragma("GCC unroll 4")
    for (int m = 0; m < 4; ++m) {
        const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * m));
        const __m512i qn = _mm512_mask_sub_epi8(v, (__mmask64)sg[m], zero, v);
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(co[m], qn), sc[m]);
    }
    return acc;
}

/* Four blocks' integer sums (16 lanes each) by one reduction: lane j of the result is the sum of v_j's lanes */
T512 AI __m128i hsum16x4(__m512i a, __m512i b, __m512i c, __m512i d) {
#define FOLD(v) _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1))
    const __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(FOLD(a), FOLD(b)), _mm256_hadd_epi32(FOLD(c), FOLD(d)));
#undef FOLD
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

/* The body of a dot against Q8_K: BLOCK(w, x) gives a block's integer lane sums (BB bytes per block, its fp16 d at
 * byte DOFF, scaled by WSCALE); four blocks are reduced at once, then one fma per block in order, the scalar
 * reference's float operations. */
#define DOT512(BB, DOFF, WSCALE, BLOCK)                                                                             \
    float s = 0.0f;                                                                                                \
    const int64_t nb = n / 256;                                                                                    \
    int64_t i = 0;                                                                                                 \
    for (; i + 4 <= nb; i += 4, w += 4 * (BB), x += 4 * 292) {                                                     \
        int32_t is[4];                                                                                             \
        _mm_storeu_si128((__m128i *)is, hsum16x4(BLOCK(w, x), BLOCK(w + (BB), x + 292), BLOCK(w + 2 * (BB), x + 584), \
                                                 BLOCK(w + 3 * (BB), x + 876)));                                   \
        for (int j = 0; j < 4; ++j)                                                                                \
            s = fmaf(qs_fp16_to_fp32(qs_load_u16(w + (BB) * j + (DOFF))) * (WSCALE) * qs_load_f32(x + 292 * j),     \
                     (float)is[j], s);                                                                             \
    }                                                                                                              \
    for (; i < nb; ++i, w += (BB), x += 292)                                                                       \
        s = fmaf(qs_fp16_to_fp32(qs_load_u16(w + (DOFF))) * (WSCALE) * qs_load_f32(x),                             \
                 (float)_mm512_reduce_add_epi32(BLOCK(w, x)), s);                                                  \
    return s;

/* Eight per-32 scales (int16 in an xmm) -> register m's pair scales: lanes 0-15 chunk 2m, lanes 16-31 chunk 2m + 1 */
T AI void chunk_scales512(__m128i ls8, __m512i sc[4]) {
    const __m512i b = _mm512_broadcast_i32x4(ls8);
    _Pragma("GCC unroll 4")
    for (int m = 0; m < 4; ++m)
        sc[m] = _mm512_permutexvar_epi16(_mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(2 * m))),
                                                            _mm256_set1_epi16((short)(2 * m + 1)), 1), b);
}

/* One IQ3_S block's exact integer sum Σ_c (2 sc_c + 1) · Σ code · q (110 bytes: d, qs[64], qh[8], signs[32],
 * scales[4]; row r of chunk c is qs[8c + r] | bit r of qh[c] << 8, element e of chunk c negated by bit e of its
 * four sign bytes). */
T AI __m512i iq3_s_block512(const uint8_t *w, const uint8_t *x) {
    const int8_t *q = (const int8_t *)(x + 4);
    const __m512i idx = _mm512_loadu_si512((const void *)(w + 2));
    const __mmask64 k7 = _mm512_movepi8_mask(idx), k8 = (__mmask64)qs_load_u64(w + 66);
    const __m512i p01 = lookup512(IQ3S_P01, idx, k7, k8), p23 = lookup512(IQ3S_P23, idx, k7, k8);
    /* the four coordinates of row i: p01 low/high nibble, p23 low/high nibble -> element order */
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i l01 = _mm512_and_si512(p01, m4), h01 = _mm512_and_si512(_mm512_srli_epi16(p01, 4), m4);
    const __m512i l23 = _mm512_and_si512(p23, m4), h23 = _mm512_and_si512(_mm512_srli_epi16(p23, 4), m4);
    __m512i co[4];
    in_element_order(l01, h01, l23, h23, co);
    /* chunk scales 2 sc + 1 */
    const __m128i sb = _mm_cvtsi32_si128((int)qs_load_u32(w + 106));
    const __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(sb, _mm_set1_epi8(15)),
                                          _mm_and_si128(_mm_srli_epi16(sb, 4), _mm_set1_epi8(15)));
    __m512i sc[4];
    chunk_scales512(_mm_cvtepu8_epi16(_mm_add_epi8(_mm_add_epi8(nib, nib), _mm_set1_epi8(1))), sc);
    uint64_t sg[4];
    memcpy(sg, w + 74, sizeof sg);
    return block_sum(co, sg, sc, q);
}

T float qs_dot_iq3_s_avx512(int64_t n, const uint8_t *w, const uint8_t *x) { DOT512(110, 0, 1.0f, iq3_s_block512); }

/* IQ2_XS's 512 grid rows, eight coordinates in {8, 25, 43}, as 16-bit words of 2-bit codes 0, 1, 2 (coordinate k
 * in bits 2k..2k+1); the code back to the coordinate by a byte permute (any index whose low two bits are v -> the
 * coordinate of code v); ggml's 7-bit sign words with the parity bit, as bytes. */
static uint16_t IQ2XS_ROWS[512] __attribute__((aligned(64)));
static uint8_t COORD_OF_CODE[64] __attribute__((aligned(64)));
static uint8_t KSIGN_BYTES[128] __attribute__((aligned(64)));
/* Word permutes: SPREAD[m] puts row 8m + j in the low word of qword j; SCALE_PICK[m] gives int16 lane l the scale
 * of group 4m + l / 8 */
static uint16_t SPREAD[4][32] __attribute__((aligned(64)));
static uint16_t SCALE_PICK[4][32] __attribute__((aligned(64)));

__attribute__((constructor)) static void iq2xs_tables_init(void) {
    for (int r = 0; r < 512; ++r) {
        uint16_t v = 0;
        for (int k = 0; k < 8; ++k) {
            const uint8_t c = QS_GRID_IQ2_XS[r][k];
            v |= (uint16_t)((c == 8 ? 0 : c == 25 ? 1 : 2) << (2 * k));
        }
        IQ2XS_ROWS[r] = v;
    }
    for (int i = 0; i < 64; ++i) COORD_OF_CODE[i] = (uint8_t)((i & 3) == 0 ? 8 : (i & 3) == 1 ? 25 : 43);
    for (int i = 0; i < 128; ++i) KSIGN_BYTES[i] = qs_ksign((uint32_t)i);
    for (int m = 0; m < 4; ++m)
        for (int l = 0; l < 32; ++l) {
            SPREAD[m][l] = (uint16_t)(l % 4 == 0 ? 8 * m + l / 4 : 0);
            SCALE_PICK[m][l] = (uint16_t)(4 * m + l / 8);
        }
}

/* 32 rows of eight 2-bit codes (16-bit words) -> their 256 coordinates in element order, 64 per register */
T AI void rows_to_coords(__m512i rows, __m512i co[4]) {
    const __m512i shifts = _mm512_set1_epi64(0x0E0C0A0806040200LL), coord = _mm512_load_si512(COORD_OF_CODE);
    _Pragma("GCC unroll 4")
    for (int m = 0; m < 4; ++m) {
        const __m512i wm = _mm512_permutexvar_epi16(_mm512_load_si512(SPREAD[m]), rows);
        co[m] = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(shifts, wm), coord);
    }
}

/* One IQ2_XS block's exact integer sum Σ_g (2 sc_g + 1) · Σ code · q (74 bytes: d, 32 words of a 9-bit row index
 * and a 7-bit sign word, scales[8] as nibbles per 16 elements; row i covers elements 8i..8i+7). */
T AI __m512i iq2_xs_block512(const uint8_t *w, const uint8_t *x) {
    const int8_t *q = (const int8_t *)(x + 4);
    const __m512i e = _mm512_loadu_si512((const void *)(w + 2));
    /* the 32 rows' code words: eight 64-entry word permutes, picked by index bits 6, 7, 8 */
    const __m512i *t = (const __m512i *)IQ2XS_ROWS;
    __m512i r[8];
    _Pragma("GCC unroll 8")
    for (int j = 0; j < 8; ++j) r[j] = _mm512_permutex2var_epi16(_mm512_load_si512(t + 2 * j), e, _mm512_load_si512(t + 2 * j + 1));
    const __mmask32 k6 = _mm512_test_epi16_mask(e, _mm512_set1_epi16(64));
    const __mmask32 k7 = _mm512_test_epi16_mask(e, _mm512_set1_epi16(128));
    const __mmask32 k8 = _mm512_test_epi16_mask(e, _mm512_set1_epi16(256));
    const __m512i c0 = _mm512_mask_blend_epi16(k7, _mm512_mask_blend_epi16(k6, r[0], r[1]), _mm512_mask_blend_epi16(k6, r[2], r[3]));
    const __m512i c1 = _mm512_mask_blend_epi16(k7, _mm512_mask_blend_epi16(k6, r[4], r[5]), _mm512_mask_blend_epi16(k6, r[6], r[7]));
    const __m512i rows = _mm512_mask_blend_epi16(k8, c0, c1);
    /* sign bytes of the 32 rows: bit k of byte i negates element 8i + k, so bytes 8m..8m+7 mask register m */
    uint64_t sg[8];
    const __m512i s7 = _mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16(e, 9)));
    _mm512_storeu_si512((void *)sg, _mm512_permutex2var_epi8(_mm512_load_si512(KSIGN_BYTES), s7,
                                                             _mm512_load_si512(KSIGN_BYTES + 64)));
    /* scales 2 sc + 1 of the 16 groups as int16 */
    const __m128i sb = _mm_loadl_epi64((const __m128i *)(w + 66));
    const __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(sb, _mm_set1_epi8(15)),
                                          _mm_and_si128(_mm_srli_epi16(sb, 4), _mm_set1_epi8(15)));
    const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_add_epi8(_mm_add_epi8(nib, nib), _mm_set1_epi8(1))));
    __m512i co[4], scm[4];
    rows_to_coords(rows, co);
    _Pragma("GCC unroll 4")
    for (int m = 0; m < 4; ++m) scm[m] = _mm512_permutexvar_epi16(_mm512_load_si512(SCALE_PICK[m]), sc);
    return block_sum(co, sg, scm, q);
}

T float qs_dot_iq2_xs_avx512(int64_t n, const uint8_t *w, const uint8_t *x) { DOT512(74, 0, 0.125f, iq2_xs_block512); }

/* IQ3_XXS's 256 grid rows (four coordinates 4..62) as four byte tables, coordinate k of row r at byte r of table
 * k; IQ2_XXS's 256 rows as 16-bit words of 2-bit codes (as IQ2_XS's) */
static uint8_t IQ3XXS_COORD[4][256] __attribute__((aligned(64)));
static uint16_t IQ2XXS_ROWS[256] __attribute__((aligned(64)));
/* Byte permutes: the four 7-bit sign words of chunk c (bits 0, 7, 14, 21 of its 32-bit word, the words two to a
 * quadword) to bytes 4c..4c+3; IQ2_XXS's 32 row indices (bytes 0-3 of each 8-byte chunk) to the low bytes of 32
 * words */
static uint8_t SIGN_FIELDS[64] __attribute__((aligned(64)));
static uint8_t XXS_INDEX_BYTES[64] __attribute__((aligned(64)));
static uint8_t XXS_SIGN_PACK[64] __attribute__((aligned(64)));

__attribute__((constructor)) static void xxs_tables_init(void) {
    for (int r = 0; r < 256; ++r) {
        uint16_t v = 0;
        for (int k = 0; k < 4; ++k) IQ3XXS_COORD[k][r] = QS_GRID_IQ3_XXS[r][k];
        for (int k = 0; k < 8; ++k) {
            const uint8_t c = QS_GRID_IQ2_XXS[r][k];
            v |= (uint16_t)((c == 8 ? 0 : c == 25 ? 1 : 2) << (2 * k));
        }
        IQ2XXS_ROWS[r] = v;
    }
    for (int b = 0; b < 64; ++b) {
        SIGN_FIELDS[b] = (uint8_t)(32 * (b % 8 / 4) + 7 * (b % 4));
        XXS_INDEX_BYTES[b] = (uint8_t)(b % 2 ? 0 : 8 * (b / 8) + b % 8 / 2);
        XXS_SIGN_PACK[b] = (uint8_t)(b < 32 ? 8 * (b / 4) + b % 4 : 0);
    }
}

/* 128-entry byte table lookup of the low 7 bits of each byte of idx: ggml's sign word with its parity bit */
T AI __m512i ksign_bytes(__m512i idx) {
    return _mm512_permutex2var_epi8(_mm512_load_si512(KSIGN_BYTES), idx, _mm512_load_si512(KSIGN_BYTES + 64));
}

/* One IQ3_XXS block's exact integer sum Σ_c (2 sc_c + 1) · Σ code · q (98 bytes: d, qs[64] row indices, then per
 * chunk a 32-bit word of four 7-bit sign words and the 4-bit scale on top) */
T AI __m512i iq3_xxs_block512(const uint8_t *w, const uint8_t *x) {
    const int8_t *q = (const int8_t *)(x + 4);
    const __m512i idx = _mm512_loadu_si512((const void *)(w + 2));
    const __mmask64 k7 = _mm512_movepi8_mask(idx);
    __m512i xk[4];
    _Pragma("GCC unroll 4")
    for (int k = 0; k < 4; ++k) {
        const __m512i *t = (const __m512i *)IQ3XXS_COORD[k];
        xk[k] = _mm512_mask_blend_epi8(k7, _mm512_permutex2var_epi8(_mm512_load_si512(t), idx, _mm512_load_si512(t + 1)),
                                      _mm512_permutex2var_epi8(_mm512_load_si512(t + 2), idx, _mm512_load_si512(t + 3)));
    }
    __m512i co[4];
    in_element_order(xk[0], xk[1], xk[2], xk[3], co);
    const __m256i aux = _mm256_loadu_si256((const __m256i *)(w + 66));
    uint64_t sg[8];
    _mm512_storeu_si512((void *)sg, ksign_bytes(_mm512_multishift_epi64_epi8(_mm512_load_si512(SIGN_FIELDS),
                                                                            _mm512_castsi256_si512(aux))));
    const __m256i ls = _mm256_add_epi32(_mm256_slli_epi32(_mm256_srli_epi32(aux, 28), 1), _mm256_set1_epi32(1));
    __m512i sc[4];
    chunk_scales512(_mm256_cvtepi32_epi16(ls), sc);
    return block_sum(co, sg, sc, q);
}

T float qs_dot_iq3_xxs_avx512(int64_t n, const uint8_t *w, const uint8_t *x) { DOT512(98, 0, 0.25f, iq3_xxs_block512); }

/* One IQ2_XXS block's exact integer sum (66 bytes: d, then per 32-element chunk four row indices and a 32-bit word
 * of four 7-bit sign words and the 4-bit scale on top) */
T AI __m512i iq2_xxs_block512(const uint8_t *w, const uint8_t *x) {
    const int8_t *q = (const int8_t *)(x + 4);
    const __m512i e = _mm512_loadu_si512((const void *)(w + 2));
    const __m512i ix = _mm512_maskz_permutexvar_epi8(0x5555555555555555ULL, _mm512_load_si512(XXS_INDEX_BYTES), e);
    const __m512i *t = (const __m512i *)IQ2XXS_ROWS;
    const __mmask32 k6 = _mm512_test_epi16_mask(ix, _mm512_set1_epi16(64));
    const __mmask32 k7 = _mm512_test_epi16_mask(ix, _mm512_set1_epi16(128));
    const __m512i r0 = _mm512_permutex2var_epi16(_mm512_load_si512(t), ix, _mm512_load_si512(t + 1));
    const __m512i r1 = _mm512_permutex2var_epi16(_mm512_load_si512(t + 2), ix, _mm512_load_si512(t + 3));
    const __m512i r2 = _mm512_permutex2var_epi16(_mm512_load_si512(t + 4), ix, _mm512_load_si512(t + 5));
    const __m512i r3 = _mm512_permutex2var_epi16(_mm512_load_si512(t + 6), ix, _mm512_load_si512(t + 7));
    const __m512i rows = _mm512_mask_blend_epi16(k7, _mm512_mask_blend_epi16(k6, r0, r1), _mm512_mask_blend_epi16(k6, r2, r3));
    __m512i co[4];
    rows_to_coords(rows, co);
    /* the sign words sit in the high half of each quadword: bit offsets 32, 39, 46, 53 */
    const __m512i f = _mm512_multishift_epi64_epi8(_mm512_add_epi8(_mm512_load_si512(SIGN_FIELDS), _mm512_set1_epi8(32)), e);
    uint64_t sg[8];
    _mm512_storeu_si512((void *)sg, ksign_bytes(_mm512_permutexvar_epi8(_mm512_load_si512(XXS_SIGN_PACK), f)));
    const __m512i ls = _mm512_add_epi64(_mm512_slli_epi64(_mm512_srli_epi64(e, 60), 1), _mm512_set1_epi64(1));
    __m512i sc[4];
    chunk_scales512(_mm512_cvtepi64_epi16(ls), sc);
    return block_sum(co, sg, sc, q);
}

T float qs_dot_iq2_xxs_avx512(int64_t n, const uint8_t *w, const uint8_t *x) { DOT512(66, 0, 0.125f, iq2_xxs_block512); }

/* ---------------------------------------------------------------- ternary types */

T512 AI __m512i minus_q8k_sums(__m512i acc, const uint8_t *x) { /* acc − Q8_K's 16 sums of 16, in its lanes */
    const __m256i bs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(x + 260)), _mm256_set1_epi16(1));
    return _mm512_sub_epi32(acc, _mm512_zextsi256_si512(bs));
}

/* TQ2_0 x Q8_K: digit k of the 64 bytes at once (byte j: element 32k + j for j < 32, 128 + 32k + j − 32 after), as
 * unsigned t in vpdpbusd; Σ (t − 1) · q = Σ t · q − Σ q */
T512 AI __m512i tq2_0_block512(const uint8_t *w, const uint8_t *x) {
    const int8_t *q = (const int8_t *)(x + 4);
    const __m512i m3 = _mm512_set1_epi8(3), qv = _mm512_loadu_si512((const void *)w);
    __m512i acc = _mm512_setzero_si512();
    _Pragma("GCC unroll 4")
    for (int k = 0; k < 4; ++k) {
        const __m512i t = _mm512_and_si512(_mm512_srli_epi16(qv, 2 * k), m3);
        const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(q + 32 * k))),
                                             _mm256_loadu_si256((const __m256i *)(q + 128 + 32 * k)), 1);
        acc = _mm512_dpbusd_epi32(acc, t, v);
    }
    return minus_q8k_sums(acc, x);
}

T512 float qs_dot_tq2_0_avx512(int64_t n, const uint8_t *w, const uint8_t *x) { DOT512(66, 64, 1.0f, tq2_0_block512); }

/* TQ1_0's base-3 digit k of every byte value (ggml: ((b · 3^k mod 256) · 3) >> 8), one 256-byte table per k */
static uint8_t TRITS[5][256] __attribute__((aligned(64)));

__attribute__((constructor)) static void trits_init(void) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    for (int k = 0; k < 5; ++k)
        for (int b = 0; b < 256; ++b) TRITS[k][b] = (uint8_t)(((unsigned)(uint8_t)(b * pow3[k]) * 3u) >> 8);
}

/* TQ1_0 x Q8_K (54 bytes: 48 bytes of five digits, 4 of four, d): the block's 52 bytes in one register (a masked load,
 * so nothing past the block is read); digit k of all of them by two 128-entry byte permutes; the activations of
 * digit k gathered to match (bytes 0-31: elements 32k + j, 32-47: 160 + 16k + j, 48-51: 240 + 4k + j) */
T AI __m512i tq1_0_block512(const uint8_t *w, const uint8_t *x) {
    const int8_t *q = (const int8_t *)(x + 4);
    const __m512i b = _mm512_maskz_loadu_epi8(0x000FFFFFFFFFFFFFULL, (const void *)w);
    const __mmask64 k7 = _mm512_movepi8_mask(b);
    __m512i acc = _mm512_setzero_si512();
    _Pragma("GCC unroll 5")
    for (int k = 0; k < 5; ++k) {
        const __m512i *t = (const __m512i *)TRITS[k];
        const __m512i d = _mm512_mask_blend_epi8(k7, _mm512_permutex2var_epi8(_mm512_load_si512(t), b, _mm512_load_si512(t + 1)),
                                                 _mm512_permutex2var_epi8(_mm512_load_si512(t + 2), b, _mm512_load_si512(t + 3)));
        __m512i v = _mm512_inserti32x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(q + 32 * k))),
                                       _mm_loadu_si128((const __m128i *)(q + 160 + 16 * k)), 2);
        v = _mm512_inserti32x4(v, k < 4 ? _mm_cvtsi32_si128((int)qs_load_u32((const uint8_t *)(q + 240 + 4 * k)))
                                        : _mm_setzero_si128(), 3);
        acc = _mm512_dpbusd_epi32(acc, d, v);
    }
    return minus_q8k_sums(acc, x);
}

T float qs_dot_tq1_0_avx512(int64_t n, const uint8_t *w, const uint8_t *x) { DOT512(54, 52, 1.0f, tq1_0_block512); }

#endif /* QS_ARCH_X86 */
