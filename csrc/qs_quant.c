/* Quantized kernels: type table, scalar reference dequantization, activation quantizers, dot products and the
 * matvec/matmat drivers. Scalar code here is the numeric specification the SIMD variants are tested against. */
#include <math.h>
#include <stdlib.h>

#include "qs.h"
#include "qs_gemm.h"
#include "qs_guard.h"
#include "qs_quant_internal.h"
#include "qs_repack.h"


static inline float f16at(const uint8_t *p) { return qs_fp16_to_fp32(qs_load_u16(p)); }

/* ---------------------------------------------------------------- scalar dequantization, one block */
static void deq_f32(const uint8_t *b, float *y) { memcpy(y, b, 4); }
static void deq_f16(const uint8_t *b, float *y) { y[0] = f16at(b); }
static void deq_bf16(const uint8_t *b, float *y) { y[0] = qs_bf16_to_fp32(qs_load_u16(b)); }

static void deq_q4_0(const uint8_t *b, float *y) {
    float d = f16at(b);
    for (int j = 0; j < 16; ++j) {
        y[j] = (float)((b[2 + j] & 15) - 8) * d;
        y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
    }
}
static void deq_q4_1(const uint8_t *b, float *y) {
    float d = f16at(b), m = f16at(b + 2);
    for (int j = 0; j < 16; ++j) {
        y[j] = (float)(b[4 + j] & 15) * d + m;
        y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
    }
}
static void deq_q5_0(const uint8_t *b, float *y) {
    float d = f16at(b);
    uint32_t qh = qs_load_u32(b + 2);
    for (int j = 0; j < 16; ++j) {
        int q0 = (b[6 + j] & 15) | (((qh >> j) & 1) << 4);
        int q1 = (b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        y[j] = (float)(q0 - 16) * d;
        y[j + 16] = (float)(q1 - 16) * d;
    }
}
static void deq_q5_1(const uint8_t *b, float *y) {
    float d = f16at(b), m = f16at(b + 2);
    uint32_t qh = qs_load_u32(b + 4);
    for (int j = 0; j < 16; ++j) {
        int q0 = (b[8 + j] & 15) | (((qh >> j) & 1) << 4);
        int q1 = (b[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        y[j] = (float)q0 * d + m;
        y[j + 16] = (float)q1 * d + m;
    }
}
static void deq_q8_0(const uint8_t *b, float *y) {
    float d = f16at(b);
    for (int j = 0; j < 32; ++j) y[j] = (float)(int8_t)b[2 + j] * d;
}
static void deq_q2_K(const uint8_t *b, float *y) {
    const uint8_t *sc = b, *qs = b + 16;
    float d = f16at(b + 80), dmin = f16at(b + 82);
    for (int n = 0; n < 2; ++n)
        for (int j = 0; j < 4; ++j)
            for (int l = 0; l < 32; ++l) {
                uint8_t s = sc[8 * n + 2 * j + l / 16];
                int q = (qs[32 * n + l] >> (2 * j)) & 3;
                y[128 * n + 32 * j + l] = d * (float)(s & 15) * (float)q - dmin * (float)(s >> 4);
            }
}
void qs_q3k_scales(const uint8_t *s, int8_t out[16]) {
    for (int j = 0; j < 16; ++j) {
        int low = j < 8 ? (s[j] & 15) : (s[j - 8] >> 4);
        int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (int8_t)((low | (high << 4)) - 32);
    }
}
static void deq_q3_K(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *qs = b + 32;
    float d = f16at(b + 108);
    int8_t sc[16];
    qs_q3k_scales(b + 96, sc);
    for (int n = 0; n < 2; ++n)
        for (int j = 0; j < 4; ++j)
            for (int l = 0; l < 32; ++l) {
                int q = ((qs[32 * n + l] >> (2 * j)) & 3) - (((hm[l] >> (4 * n + j)) & 1) ? 0 : 4);
                y[128 * n + 32 * j + l] = d * (float)sc[8 * n + 2 * j + l / 16] * (float)q;
            }
}
static inline void k4_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}
static void deq_q4_K(const uint8_t *b, float *y) {
    float d = f16at(b), dmin = f16at(b + 2);
    const uint8_t *qs = b + 16;
    for (int c = 0; c < 4; ++c) {
        int sc0, m0, sc1, m1;
        k4_scale_min(b + 4, 2 * c, &sc0, &m0);
        k4_scale_min(b + 4, 2 * c + 1, &sc1, &m1);
        float d0 = d * (float)sc0, mm0 = dmin * (float)m0, d1 = d * (float)sc1, mm1 = dmin * (float)m1;
        for (int l = 0; l < 32; ++l) {
            y[64 * c + l] = d0 * (float)(qs[32 * c + l] & 15) - mm0;
            y[64 * c + 32 + l] = d1 * (float)(qs[32 * c + l] >> 4) - mm1;
        }
    }
}
static void deq_q5_K(const uint8_t *b, float *y) {
    float d = f16at(b), dmin = f16at(b + 2);
    const uint8_t *qh = b + 16, *qs = b + 48;
    for (int c = 0; c < 4; ++c) {
        int sc0, m0, sc1, m1;
        k4_scale_min(b + 4, 2 * c, &sc0, &m0);
        k4_scale_min(b + 4, 2 * c + 1, &sc1, &m1);
        float d0 = d * (float)sc0, mm0 = dmin * (float)m0, d1 = d * (float)sc1, mm1 = dmin * (float)m1;
        for (int l = 0; l < 32; ++l) {
            int q0 = (qs[32 * c + l] & 15) | (((qh[l] >> (2 * c)) & 1) << 4);
            int q1 = (qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
            y[64 * c + l] = d0 * (float)q0 - mm0;
            y[64 * c + 32 + l] = d1 * (float)q1 - mm1;
        }
    }
}
static void deq_q6_K(const uint8_t *b, float *y) {
    float d = f16at(b + 208);
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int h = 0; h < 2; ++h) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        float *yy = y + 128 * h;
        for (int l = 0; l < 32; ++l) {
            int q0 = ((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32;
            int q1 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            yy[l] = d * (float)sc[8 * h + l / 16] * (float)q0;
            yy[l + 32] = d * (float)sc[8 * h + 2 + l / 16] * (float)q1;
            yy[l + 64] = d * (float)sc[8 * h + 4 + l / 16] * (float)q2;
            yy[l + 96] = d * (float)sc[8 * h + 6 + l / 16] * (float)q3;
        }
    }
}
static void deq_iq4_nl(const uint8_t *b, float *y) {
    float d = f16at(b);
    for (int j = 0; j < 16; ++j) {
        y[j] = d * (float)QS_IQ4NL[b[2 + j] & 15];
        y[j + 16] = d * (float)QS_IQ4NL[b[2 + j] >> 4];
    }
}
static void deq_iq4_xs(const uint8_t *b, float *y) {
    float d = f16at(b);
    uint16_t sh = qs_load_u16(b + 2);
    for (int s = 0; s < 8; ++s) {
        int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 15) | (((sh >> (2 * s)) & 3) << 4);
        float dl = d * (float)(ls - 32);
        const uint8_t *qs = b + 8 + 16 * s;
        for (int j = 0; j < 16; ++j) {
            y[32 * s + j] = dl * (float)QS_IQ4NL[qs[j] & 15];
            y[32 * s + 16 + j] = dl * (float)QS_IQ4NL[qs[j] >> 4];
        }
    }
}

/* ---------------------------------------------------------------- type table */
typedef struct {
    int elems, bytes;
    qs_deq_block_fn deq;
    int act; /* vec-dot activation type, -1 none */
} qs_type_traits;

static qs_type_traits traits(int type) {
    switch (type) {
    case QS_F32: return (qs_type_traits){1, 4, deq_f32, QS_F32};
    case QS_F16: return (qs_type_traits){1, 2, deq_f16, QS_F16};
    case QS_BF16: return (qs_type_traits){1, 2, deq_bf16, QS_BF16};
    case QS_Q4_0: return (qs_type_traits){32, 18, deq_q4_0, QS_Q8_0};
    case QS_Q4_1: return (qs_type_traits){32, 20, deq_q4_1, QS_Q8_1};
    case QS_Q5_0: return (qs_type_traits){32, 22, deq_q5_0, QS_Q8_0};
    case QS_Q5_1: return (qs_type_traits){32, 24, deq_q5_1, QS_Q8_1};
    case QS_Q8_0: return (qs_type_traits){32, 34, deq_q8_0, QS_Q8_0};
    case QS_Q8_1: return (qs_type_traits){32, 36, NULL, -1};
    case QS_Q2_K: return (qs_type_traits){256, 84, deq_q2_K, QS_Q8_K};
    case QS_Q3_K: return (qs_type_traits){256, 110, deq_q3_K, QS_Q8_K};
    case QS_Q4_K: return (qs_type_traits){256, 144, deq_q4_K, QS_Q8_K};
    case QS_Q5_K: return (qs_type_traits){256, 176, deq_q5_K, QS_Q8_K};
    case QS_Q6_K: return (qs_type_traits){256, 210, deq_q6_K, QS_Q8_K};
    case QS_Q8_K: return (qs_type_traits){256, 292, NULL, -1};
    case QS_IQ4_NL: return (qs_type_traits){32, 18, deq_iq4_nl, QS_Q8_0};
    case QS_IQ4_XS: return (qs_type_traits){256, 136, deq_iq4_xs, QS_Q8_K};
    case QS_IQ2_XXS: return (qs_type_traits){256, 66, qs_deq_iq2_xxs, QS_Q8_K};
    case QS_IQ2_XS: return (qs_type_traits){256, 74, qs_deq_iq2_xs, QS_Q8_K};
    case QS_IQ2_S: return (qs_type_traits){256, 82, qs_deq_iq2_s, QS_Q8_K};
    case QS_IQ3_XXS: return (qs_type_traits){256, 98, qs_deq_iq3_xxs, QS_Q8_K};
    case QS_IQ3_S: return (qs_type_traits){256, 110, qs_deq_iq3_s, QS_Q8_K};
    case QS_IQ1_S: return (qs_type_traits){256, 50, qs_deq_iq1_s, QS_Q8_K};
    case QS_IQ1_M: return (qs_type_traits){256, 56, qs_deq_iq1_m, QS_Q8_K};
    case QS_TQ1_0: return (qs_type_traits){256, 54, qs_deq_tq1_0, QS_Q8_K};
    case QS_TQ2_0: return (qs_type_traits){256, 66, qs_deq_tq2_0, QS_Q8_K};
    case QS_MXFP4: return (qs_type_traits){32, 17, qs_deq_mxfp4, QS_Q8_0};
    case QS_NVFP4: return (qs_type_traits){64, 36, qs_deq_nvfp4, QS_Q8_0};
    default: return (qs_type_traits){0, 0, NULL, -1};
    }
}

int qs_block_elems(int type) { return traits(type).elems; }
int qs_block_bytes(int type) { return traits(type).bytes; }
int qs_can_dequantize(int type) { return traits(type).deq != NULL; }
int qs_vec_dot_type(int type) { return traits(type).act; }

static qs_deq_block_fn deq_fn(int type) {
    if (qs_isa_get() >= QS_ISA_AVX2) {
        switch (type) {
        case QS_Q4_K: return qs_deq_q4_K_avx2;
        case QS_Q6_K: return qs_deq_q6_K_avx2;
        case QS_Q8_0: return qs_deq_q8_0_avx2;
        case QS_Q5_0: return qs_deq_q5_0_avx2;
        case QS_Q4_1: return qs_deq_q4_1_avx2;
        default: break;
        }
    }
    return traits(type).deq;
}

/* Dequantize n_blocks blocks (scalar types: elements) in parallel chunks. */
typedef struct {
    qs_deq_block_fn fn;
    const uint8_t *src;
    float *dst;
    int64_t n_blocks, per_task;
    int elems, bytes;
} deq_ctx;

static void deq_task(void *vctx, int64_t t) {
    deq_ctx *c = (deq_ctx *)vctx;
    int64_t a = t * c->per_task, b = a + c->per_task;
    if (b > c->n_blocks) b = c->n_blocks;
    if (c->elems == 1 && c->fn == deq_f32) {
        memcpy(c->dst + a, c->src + a * 4, (size_t)(b - a) * 4);
        return;
    }
    if (c->elems == 1 && (c->fn == deq_f16 || c->fn == deq_bf16) && qs_isa_get() >= QS_ISA_AVX2) {
        (c->fn == deq_f16 ? qs_f16_row_avx2 : qs_bf16_row_avx2)(c->src + a * 2, c->dst + a, b - a);
        return;
    }
    for (int64_t i = a; i < b; ++i) c->fn(c->src + i * c->bytes, c->dst + i * c->elems);
}

static int dequantize_unguarded(int type, const uint8_t *src, float *dst, int64_t n_blocks, int n_threads) {
    qs_type_traits tr = traits(type);
    if (!tr.deq || n_blocks < 0 || n_blocks > INT64_MAX / tr.bytes / tr.elems) return -1;
    deq_ctx c = {deq_fn(type), src, dst, n_blocks, 0, tr.elems, tr.bytes};
    int64_t elems = n_blocks * tr.elems;
    int64_t per = (1 << 16) / tr.elems; /* ~64k elements per task */
    if (per < 1) per = 1;
    c.per_task = per;
    int64_t n_tasks = (n_blocks + per - 1) / per;
    qs_parallel_for(n_tasks, deq_task, &c, elems < (1 << 17) ? 1 : n_threads);
    return 0;
}

int qs_dequantize(int type, const uint8_t *src, float *dst, int64_t n_blocks, int n_threads) {
    int rc;
    QS_GUARDED(rc, dequantize_unguarded(type, src, dst, n_blocks, n_threads));
    return rc;
}

/* Embedding lookup: dequantize rows ids[0..n_ids) of a table of n_rows rows of row_len elements. */
typedef struct {
    qs_deq_block_fn fn;
    const uint8_t *table;
    const int64_t *ids;
    float *dst;
    int64_t row_len, row_bytes;
    int elems, bytes;
} rows_ctx;

static void rows_task(void *vctx, int64_t t) {
    rows_ctx *c = (rows_ctx *)vctx;
    const uint8_t *src = c->table + c->ids[t] * c->row_bytes;
    float *d = c->dst + t * c->row_len;
    for (int64_t i = 0; i < c->row_len / c->elems; ++i) c->fn(src + i * c->bytes, d + i * c->elems);
}

static int get_rows_unguarded(int type, const uint8_t *table, int64_t n_rows, int64_t row_len, const int64_t *ids,
                              int64_t n_ids, float *dst, int n_threads) {
    qs_type_traits tr = traits(type);
    if (!tr.deq || row_len <= 0 || row_len % tr.elems || n_ids < 0) return -1;
    for (int64_t i = 0; i < n_ids; ++i)
        if (ids[i] < 0 || ids[i] >= n_rows) return -1;
    rows_ctx c = {deq_fn(type), table, ids, dst, row_len, row_len / tr.elems * tr.bytes, tr.elems, tr.bytes};
    qs_parallel_for(n_ids, rows_task, &c, n_ids * row_len < (1 << 17) ? 1 : n_threads);
    return 0;
}

int qs_get_rows(int type, const uint8_t *table, int64_t n_rows, int64_t row_len, const int64_t *ids, int64_t n_ids,
                float *dst, int n_threads) {
    int rc;
    QS_GUARDED(rc, get_rows_unguarded(type, table, n_rows, row_len, ids, n_ids, dst, n_threads));
    return rc;
}

/* ---------------------------------------------------------------- activation quantizers (ggml *_ref) */
static inline int nearest_int(float fval) {
    float val = fval + 12582912.f;
    int i;
    memcpy(&i, &val, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* one 32-element block (ggml's quantize_row_q8_0_ref): codes into q, returns their sum; *d_out = amax / 127 */
static int q8_block32(const float *v, int8_t *q, float *d_out) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(v[j]));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
        q[j] = (int8_t)roundf(v[j] * id);
        sum += q[j];
    }
    *d_out = d;
    return sum;
}

int qs_quantize_q8_0(const float *x, uint8_t *dst, int64_t n) {
    if (n % 32) return -1;
    if (qs_isa_get() >= QS_ISA_AVX2) {
        qs_quantize_q8_0_avx2(x, dst, n);
        return 0;
    }
    for (int64_t i = 0; i < n / 32; ++i) {
        uint8_t *o = dst + 34 * i;
        float d;
        q8_block32(x + 32 * i, (int8_t *)(o + 2), &d);
        uint16_t dh = qs_fp32_to_fp16(d);
        memcpy(o, &dh, 2);
    }
    return 0;
}

int qs_quantize_q8_1(const float *x, uint8_t *dst, int64_t n) {
    if (n % 32) return -1;
    if (qs_isa_get() >= QS_ISA_AVX2) {
        qs_quantize_q8_1_avx2(x, dst, n);
        return 0;
    }
    for (int64_t i = 0; i < n / 32; ++i) {
        uint8_t *o = dst + 36 * i;
        float d;
        int sum = q8_block32(x + 32 * i, (int8_t *)(o + 4), &d);
        uint16_t dh = qs_fp32_to_fp16(d), sh = qs_fp32_to_fp16((float)sum * d);
        memcpy(o, &dh, 2);
        memcpy(o + 2, &sh, 2);
    }
    return 0;
}

int qs_quantize_q8_K(const float *x, uint8_t *dst, int64_t n) {
    if (n % 256) return -1;
    if (qs_isa_get() >= QS_ISA_AVX2) {
        qs_quantize_q8_K_avx2(x, dst, n);
        return 0;
    }
    for (int64_t i = 0; i < n / 256; ++i) {
        const float *v = x + 256 * i;
        uint8_t *o = dst + 292 * i;
        int8_t *qs = (int8_t *)(o + 4);
        float max = 0.0f, amax = 0.0f;
        for (int j = 0; j < 256; ++j) {
            float ax = fabsf(v[j]);
            if (ax > amax) {
                amax = ax;
                max = v[j];
            }
        }
        if (amax == 0.0f) {
            memset(o, 0, 292);
            continue;
        }
        float iscale = -127.0f / max;
        for (int j = 0; j < 256; ++j) {
            int q = nearest_int(iscale * v[j]);
            qs[j] = (int8_t)(q < 127 ? q : 127);
        }
        for (int j = 0; j < 16; ++j) {
            int s = 0;
            for (int k = 0; k < 16; ++k) s += qs[16 * j + k];
            int16_t s16 = (int16_t)s;
            memcpy(o + 260 + 2 * j, &s16, 2);
        }
        float d = 1.0f / iscale;
        memcpy(o, &d, 4);
    }
    return 0;
}

int qs_quantize_f16(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        uint16_t h = qs_fp32_to_fp16(x[i]);
        memcpy(dst + 2 * i, &h, 2);
    }
    return 0;
}

int qs_quantize_bf16(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        uint16_t h = qs_fp32_to_bf16(x[i]);
        memcpy(dst + 2 * i, &h, 2);
    }
    return 0;
}

int qs_quantize_activation(int act, const float *x, uint8_t *dst, int64_t n) {
    if (n < 0 || n > INT64_MAX / 8) return -1;
    switch (act) {
    case QS_Q8_0: return qs_quantize_q8_0(x, dst, n);
    case QS_Q8_1: return qs_quantize_q8_1(x, dst, n);
    case QS_Q8_K: return qs_quantize_q8_K(x, dst, n);
    case QS_F16: return qs_quantize_f16(x, dst, n);
    case QS_BF16: return qs_quantize_bf16(x, dst, n);
    case QS_F32: memcpy(dst, x, (size_t)n * 4); return 0;
    default: return -1;
    }
}

/* ---------------------------------------------------------------- scalar dot products (ggml generic math) */
float qs_dot_q4_0_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; ++i, w += 18, x += 34) {
        int sumi = 0;
        for (int j = 0; j < 16; ++j) {
            sumi += ((w[2 + j] & 15) - 8) * (int8_t)x[2 + j];
            sumi += ((w[2 + j] >> 4) - 8) * (int8_t)x[18 + j];
        }
        s += (float)sumi * (f16at(w) * f16at(x));
    }
    return s;
}
float qs_dot_q4_1_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; ++i, w += 20, x += 36) {
        int sumi = 0;
        for (int j = 0; j < 16; ++j) {
            sumi += (w[4 + j] & 15) * (int8_t)x[4 + j];
            sumi += (w[4 + j] >> 4) * (int8_t)x[20 + j];
        }
        s += (f16at(w) * f16at(x)) * (float)sumi + f16at(w + 2) * f16at(x + 2);
    }
    return s;
}
float qs_dot_q5_0_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; ++i, w += 22, x += 34) {
        uint32_t qh = qs_load_u32(w + 2);
        int sumi = 0;
        for (int j = 0; j < 16; ++j) {
            int q0 = ((w[6 + j] & 15) | (((qh >> j) & 1) << 4)) - 16;
            int q1 = ((w[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
            sumi += q0 * (int8_t)x[2 + j] + q1 * (int8_t)x[18 + j];
        }
        s += (float)sumi * (f16at(w) * f16at(x));
    }
    return s;
}
float qs_dot_q5_1_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; ++i, w += 24, x += 36) {
        uint32_t qh = qs_load_u32(w + 4);
        int sumi = 0;
        for (int j = 0; j < 16; ++j) {
            int q0 = (w[8 + j] & 15) | (((qh >> j) & 1) << 4);
            int q1 = (w[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            sumi += q0 * (int8_t)x[4 + j] + q1 * (int8_t)x[20 + j];
        }
        s += (f16at(w) * f16at(x)) * (float)sumi + f16at(w + 2) * f16at(x + 2);
    }
    return s;
}
float qs_dot_q8_0_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; ++i, w += 34, x += 34) {
        int sumi = 0;
        for (int j = 0; j < 32; ++j) sumi += (int8_t)w[2 + j] * (int8_t)x[2 + j];
        s += (float)sumi * (f16at(w) * f16at(x));
    }
    return s;
}
static inline int16_t bsum_at(const uint8_t *x, int j) {
    int16_t v;
    memcpy(&v, x + 260 + 2 * j, 2);
    return v;
}
float qs_dot_q4_K_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 256; ++i, w += 144, x += 292) {
        const uint8_t *qs = w + 16;
        const int8_t *q8 = (const int8_t *)(x + 4);
        int32_t sumi = 0, msum = 0;
        for (int c = 0; c < 4; ++c) {
            int sc0, m0, sc1, m1;
            k4_scale_min(w + 4, 2 * c, &sc0, &m0);
            k4_scale_min(w + 4, 2 * c + 1, &sc1, &m1);
            int32_t a = 0, b = 0;
            for (int l = 0; l < 32; ++l) {
                a += (qs[32 * c + l] & 15) * q8[64 * c + l];
                b += (qs[32 * c + l] >> 4) * q8[64 * c + 32 + l];
            }
            sumi += sc0 * a + sc1 * b;
            msum += m0 * (bsum_at(x, 4 * c) + bsum_at(x, 4 * c + 1)) + m1 * (bsum_at(x, 4 * c + 2) + bsum_at(x, 4 * c + 3));
        }
        float d8 = qs_load_f32(x);
        s += f16at(w) * d8 * (float)sumi - f16at(w + 2) * d8 * (float)msum;
    }
    return s;
}
float qs_dot_q5_K_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 256; ++i, w += 176, x += 292) {
        const uint8_t *qh = w + 16, *qs = w + 48;
        const int8_t *q8 = (const int8_t *)(x + 4);
        int32_t sumi = 0, msum = 0;
        for (int c = 0; c < 4; ++c) {
            int sc0, m0, sc1, m1;
            k4_scale_min(w + 4, 2 * c, &sc0, &m0);
            k4_scale_min(w + 4, 2 * c + 1, &sc1, &m1);
            int32_t a = 0, b = 0;
            for (int l = 0; l < 32; ++l) {
                a += ((qs[32 * c + l] & 15) | (((qh[l] >> (2 * c)) & 1) << 4)) * q8[64 * c + l];
                b += ((qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4)) * q8[64 * c + 32 + l];
            }
            sumi += sc0 * a + sc1 * b;
            msum += m0 * (bsum_at(x, 4 * c) + bsum_at(x, 4 * c + 1)) + m1 * (bsum_at(x, 4 * c + 2) + bsum_at(x, 4 * c + 3));
        }
        float d8 = qs_load_f32(x);
        s += f16at(w) * d8 * (float)sumi - f16at(w + 2) * d8 * (float)msum;
    }
    return s;
}
float qs_dot_q6_K_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 256; ++i, w += 210, x += 292) {
        const int8_t *sc = (const int8_t *)(w + 192);
        const int8_t *q8 = (const int8_t *)(x + 4);
        int32_t sumi = 0;
        for (int h = 0; h < 2; ++h) {
            const uint8_t *ql = w + 64 * h, *qh = w + 128 + 32 * h;
            const int8_t *x8 = q8 + 128 * h;
            int32_t part[8] = {0};
            for (int l = 0; l < 32; ++l) {
                int q0 = ((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32;
                int q1 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                part[0 + l / 16] += q0 * x8[l];
                part[2 + l / 16] += q1 * x8[32 + l];
                part[4 + l / 16] += q2 * x8[64 + l];
                part[6 + l / 16] += q3 * x8[96 + l];
            }
            for (int j = 0; j < 8; ++j) sumi += sc[8 * h + j] * part[j];
        }
        s += f16at(w + 208) * qs_load_f32(x) * (float)sumi;
    }
    return s;
}
/* Q2_K x Q8_K: per 16 elements Σ q·x times the 4-bit scale; the mins against the activation's 16-sums (bsums) */
float qs_dot_q2_K_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 256; ++i, w += 84, x += 292) {
        const int8_t *q = (const int8_t *)(x + 4);
        int32_t isum = 0, summs = 0;
        for (int g = 0; g < 16; ++g) {
            const int16_t bs = (int16_t)qs_load_u16(x + 260 + 2 * g);
            summs += (w[g] >> 4) * bs;
            const int n2 = g / 8, j = (g % 8) / 2, l0 = 16 * (g % 2);
            int32_t p = 0;
            for (int l = l0; l < l0 + 16; ++l) p += ((w[16 + 32 * n2 + l] >> (2 * j)) & 3) * q[128 * n2 + 32 * j + l];
            isum += (w[g] & 15) * p;
        }
        const float dx = qs_load_f32(x);
        s += dx * f16at(w + 80) * (float)isum - dx * f16at(w + 82) * (float)summs;
    }
    return s;
}

/* Q3_K x Q8_K: codes q = low 2 bits + 4 · hmask bit (0..7), value q − 4: Σ (q − 4)·x = Σ q·x − 4 · bsum per 16 */
float qs_dot_q3_K_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    int8_t sc[16];
    for (int64_t i = 0; i < n / 256; ++i, w += 110, x += 292) {
        const int8_t *q = (const int8_t *)(x + 4);
        qs_q3k_scales(w + 96, sc);
        int32_t isum = 0;
        for (int g = 0; g < 16; ++g) {
            const int16_t bs = (int16_t)qs_load_u16(x + 260 + 2 * g);
            const int n2 = g / 8, j = (g % 8) / 2, l0 = 16 * (g % 2);
            int32_t p = 0;
            for (int l = l0; l < l0 + 16; ++l) {
                const int c = ((w[32 + 32 * n2 + l] >> (2 * j)) & 3) | (((w[l] >> (4 * n2 + j)) & 1) << 2);
                p += c * q[128 * n2 + 32 * j + l];
            }
            isum += sc[g] * (p - 4 * bs);
        }
        s += qs_load_f32(x) * f16at(w + 108) * (float)isum;
    }
    return s;
}

/* IQ4_NL x Q8_0: the code book's values times the activation codes, one integer sum per block */
float qs_dot_iq4_nl_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; ++i, w += 18, x += 34) {
        int32_t sumi = 0;
        for (int j = 0; j < 16; ++j)
            sumi += QS_IQ4NL[w[2 + j] & 15] * (int8_t)x[2 + j] + QS_IQ4NL[w[2 + j] >> 4] * (int8_t)x[18 + j];
        s += (float)sumi * (f16at(w) * f16at(x));
    }
    return s;
}

/* IQ4_XS x Q8_K: per 32-element sub-block an integer sum times its 6-bit scale minus 32 */
float qs_dot_iq4_xs_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 256; ++i, w += 136, x += 292) {
        const uint16_t sh = qs_load_u16(w + 2);
        const int8_t *q = (const int8_t *)(x + 4);
        int32_t sumi = 0;
        for (int sb = 0; sb < 8; ++sb) {
            const int ls = ((w[4 + sb / 2] >> (4 * (sb % 2))) & 15) | (((sh >> (2 * sb)) & 3) << 4);
            const uint8_t *qs = w + 8 + 16 * sb;
            int32_t p = 0;
            for (int j = 0; j < 16; ++j) p += QS_IQ4NL[qs[j] & 15] * q[32 * sb + j] + QS_IQ4NL[qs[j] >> 4] * q[32 * sb + 16 + j];
            sumi += p * (ls - 32);
        }
        s += (float)sumi * (f16at(w) * qs_load_f32(x));
    }
    return s;
}

float qs_dot_f16_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += (double)(f16at(w + 2 * i) * f16at(x + 2 * i));
    return (float)s;
}
float qs_dot_bf16_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i)
        s += (double)(qs_bf16_to_fp32(qs_load_u16(w + 2 * i)) * qs_bf16_to_fp32(qs_load_u16(x + 2 * i)));
    return (float)s;
}
float qs_dot_f32_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += (double)(qs_load_f32(w + 4 * i) * qs_load_f32(x + 4 * i));
    return (float)s;
}

static qs_dot_fn dot_fn(int type) {
    int isa = qs_isa_get();
    switch (type) {
    case QS_Q4_0: return isa >= 2 ? qs_dot_q4_0_avx512 : isa >= 1 ? qs_dot_q4_0_avx2 : qs_dot_q4_0_scalar;
    case QS_Q4_1: return isa >= 2 ? qs_dot_q4_1_avx512 : isa >= 1 ? qs_dot_q4_1_avx2 : qs_dot_q4_1_scalar;
    case QS_Q5_0: return isa >= 2 ? qs_dot_q5_0_avx512 : isa >= 1 ? qs_dot_q5_0_avx2 : qs_dot_q5_0_scalar;
    case QS_Q5_1: return isa >= 1 ? qs_dot_q5_1_avx2 : qs_dot_q5_1_scalar;
    case QS_Q8_0: return isa >= 2 ? qs_dot_q8_0_avx512 : isa >= 1 ? qs_dot_q8_0_avx2 : qs_dot_q8_0_scalar;
    case QS_Q4_K: return isa >= 2 ? qs_dot_q4_K_avx512 : isa >= 1 ? qs_dot_q4_K_avx2 : qs_dot_q4_K_scalar;
    case QS_Q5_K: return isa >= 1 ? qs_dot_q5_K_avx2 : qs_dot_q5_K_scalar;
    case QS_Q6_K: return isa >= 2 ? qs_dot_q6_K_avx512 : isa >= 1 ? qs_dot_q6_K_avx2 : qs_dot_q6_K_scalar;
    case QS_IQ2_XXS: return isa >= 2 && qs_cpu_has_vbmi() ? qs_dot_iq2_xxs_avx512 : isa >= 1 ? qs_dot_iq2_xxs_avx2 : qs_dot_iq2_xxs_scalar;
    case QS_IQ2_XS: return isa >= 2 && qs_cpu_has_vbmi() ? qs_dot_iq2_xs_avx512 : isa >= 1 ? qs_dot_iq2_xs_avx2 : qs_dot_iq2_xs_scalar;
    case QS_IQ2_S: return isa >= 1 ? qs_dot_iq2_s_avx2 : qs_dot_iq2_s_scalar;
    case QS_IQ3_XXS: return isa >= 2 && qs_cpu_has_vbmi() ? qs_dot_iq3_xxs_avx512 : isa >= 1 ? qs_dot_iq3_xxs_avx2 : qs_dot_iq3_xxs_scalar;
    case QS_IQ3_S: return isa >= 2 && qs_cpu_has_vbmi() ? qs_dot_iq3_s_avx512 : isa >= 1 ? qs_dot_iq3_s_avx2 : qs_dot_iq3_s_scalar;
    case QS_IQ1_S: return isa >= 1 ? qs_dot_iq1_s_avx2 : qs_dot_iq1_s_scalar;
    case QS_IQ1_M: return isa >= 1 ? qs_dot_iq1_m_avx2 : qs_dot_iq1_m_scalar;
    case QS_TQ1_0: return isa >= 2 && qs_cpu_has_vbmi() ? qs_dot_tq1_0_avx512 : isa >= 1 ? qs_dot_tq1_0_avx2 : qs_dot_tq1_0_scalar;
    case QS_TQ2_0: return isa >= 2 ? qs_dot_tq2_0_avx512 : isa >= 1 ? qs_dot_tq2_0_avx2 : qs_dot_tq2_0_scalar;
    case QS_MXFP4: return isa >= 1 ? qs_dot_mxfp4_avx2 : qs_dot_mxfp4_scalar;
    case QS_NVFP4: return isa >= 1 ? qs_dot_nvfp4_avx2 : qs_dot_nvfp4_scalar;
    case QS_Q2_K: return isa >= 1 ? qs_dot_q2_K_avx2 : qs_dot_q2_K_scalar;
    case QS_Q3_K: return isa >= 1 ? qs_dot_q3_K_avx2 : qs_dot_q3_K_scalar;
    case QS_IQ4_NL: return isa >= 1 ? qs_dot_iq4_nl_avx2 : qs_dot_iq4_nl_scalar;
    case QS_IQ4_XS: return isa >= 1 ? qs_dot_iq4_xs_avx2 : qs_dot_iq4_xs_scalar;
    case QS_F16: return isa >= 1 ? qs_dot_f16_avx2 : qs_dot_f16_scalar;
    case QS_BF16: return isa >= 1 ? qs_dot_bf16_avx2 : qs_dot_bf16_scalar;
    case QS_F32: return isa >= 1 ? qs_dot_f32_avx2_q : qs_dot_f32_scalar;
    default: return NULL;
    }
}

static int vec_dot_unguarded(int type, int64_t n, const uint8_t *w, const uint8_t *xq, float *out) {
    qs_dot_fn fn = dot_fn(type);
    if (!fn || n < 0) return -1;
    *out = fn(n, w, xq);
    return 0;
}

int qs_vec_dot(int type, int64_t n, const uint8_t *w, const uint8_t *xq, float *out) {
    int rc;
    QS_GUARDED(rc, vec_dot_unguarded(type, n, w, xq, out));
    return rc;
}

/* ---------------------------------------------------------------- matvec / matmat drivers */
typedef struct {
    int type;
    qs_dot_fn dot;
    qs_deq_block_fn deq; /* fallback: dequantize row, float dot */
    const uint8_t *w;
    int64_t n_rows, k, row_bytes, rows_per_task;
    const uint8_t *xq; /* n_x activation rows, xq_stride bytes apart (quantized, or float for fallback) */
    int64_t xq_stride, n_x;
    float *y; /* [n_x][n_rows] */
    int elems, bytes;
    int failed;
} mm_ctx;

static void mm_task(void *vctx, int64_t t) {
    mm_ctx *c = (mm_ctx *)vctx;
    int64_t a = t * c->rows_per_task, b = a + c->rows_per_task;
    if (b > c->n_rows) b = c->n_rows;
    if (c->dot && c->n_x > 1 && qs_iq_codes(c->type, c->w, NULL, NULL, NULL) > 0) {
        /* i-quant / ternary / FP4 rows: decoded to codes once, then dotted with every column (the same sums and
         * float operations as the one-column dot, so prefill and decode agree bit for bit) */
        int8_t *codes = (int8_t *)malloc((size_t)c->k);
        float *mults = (float *)malloc((size_t)(c->k / 16 + 1) * sizeof(float));
        int16_t *ls = (int16_t *)malloc((size_t)(c->k / 16 + 1) * sizeof(int16_t));
        if (!codes || !mults || !ls) {
            free(codes);
            free(mults);
            free(ls);
            c->failed = 1;
            return;
        }
        const int simd = qs_isa_get() >= QS_ISA_AVX2, q8k = c->elems == 256, os = qs_iq_outer(c->type);
        for (int64_t r = a; r < b; ++r) {
            const int gs = qs_iq_row_codes(c->type, c->w + r * c->row_bytes, c->k, codes, mults, ls);
            for (int64_t j = 0; j < c->n_x; ++j) {
                const uint8_t *x = c->xq + j * c->xq_stride;
                c->y[j * c->n_rows + r] = simd ? qs_iq_dot_codes_avx2(codes, mults, ls, gs, os, q8k, c->k, x)
                                               : qs_iq_dot_codes_scalar(codes, mults, ls, gs, os, q8k, c->k, x);
            }
        }
        free(codes);
        free(mults);
        free(ls);
        return;
    }
    if (c->dot) {
        for (int64_t r = a; r < b; ++r) {
            const uint8_t *wr = c->w + r * c->row_bytes;
            for (int64_t j = 0; j < c->n_x; ++j) c->y[j * c->n_rows + r] = c->dot(c->k, wr, c->xq + j * c->xq_stride);
        }
        return;
    }
    float *row = (float *)malloc((size_t)c->k * sizeof(float));
    if (!row) { c->failed = 1; return; }
    qs_dot_fn fdot = dot_fn(QS_F32);
    for (int64_t r = a; r < b; ++r) {
        const uint8_t *wr = c->w + r * c->row_bytes;
        for (int64_t i = 0; i < c->k / c->elems; ++i) c->deq(wr + i * c->bytes, row + i * c->elems);
        for (int64_t j = 0; j < c->n_x; ++j)
            c->y[j * c->n_rows + r] = fdot(c->k, (const uint8_t *)row, c->xq + j * c->xq_stride);
    }
    free(row);
}

static int64_t act_row_bytes(int act, int64_t k) {
    switch (act) {
    case QS_Q8_0: return k / 32 * 34;
    case QS_Q8_1: return k / 32 * 36;
    case QS_Q8_K: return k / 256 * 292;
    case QS_F16: case QS_BF16: return k * 2;
    default: return k * 4;
    }
}


int64_t qs_weight_bytes(int type, int64_t rows, int64_t k) {
    if (type & QS_RP_FLAG) return qs_repack_bytes(type & ~QS_RP_FLAG, rows, k);
    qs_type_traits tr = traits(type);
    int64_t b;
    if (!tr.deq || tr.elems <= 0 || rows < 0 || k <= 0 || k % tr.elems ||
        __builtin_mul_overflow(rows, k / tr.elems * tr.bytes, &b))
        return -1;
    return b;
}

static int matmat_unguarded(int type, const uint8_t *w, int64_t n_rows, int64_t k, const float *x, int64_t n_x,
                            float *y, int n_threads) {
    if (type & QS_RP_FLAG) {
        if (k > INT64_MAX / 8 || n_x < 0 || n_x > INT64_MAX / 8 / (k > 0 ? k : 1) || n_rows > INT64_MAX / 8 / (n_x ? n_x : 1))
            return -1;
        return qs_rp_matmat(type, w, n_rows, k, x, n_x, y, n_threads);
    }
    qs_type_traits tr = traits(type);
    if (!tr.deq || tr.elems == 0 || k <= 0 || k % tr.elems || n_rows < 0 || n_x < 0) return -1;
    if (n_rows == 0 || n_x == 0) return 0;
    int64_t nbytes; /* the weights, the activations and the output must each be addressable */
    if (k > INT64_MAX / 8 || n_x > INT64_MAX / 4 || __builtin_mul_overflow(n_rows, k / tr.elems * tr.bytes, &nbytes) ||
        __builtin_mul_overflow(n_x, k * 8, &nbytes) || __builtin_mul_overflow(n_x * 4, n_rows, &nbytes))
        return -1;
    if (n_x >= 4 && qs_gemm_enabled()) {
        /* the code types: row groups decoded once into a repacked layout, the same bits as their row dots */
        if (qs_iq_prefill_usable(type, n_rows, k)) return qs_iq_prefill(type, w, n_rows, k, x, n_x, y, n_threads);
        int rc = qs_gemm(type, w, n_rows, k, k / tr.elems * tr.bytes, x, n_x, y, n_threads);
        if (rc <= 0) return rc;
    }
    mm_ctx c;
    memset(&c, 0, sizeof c);
    c.type = type;
    c.w = w;
    c.n_rows = n_rows;
    c.k = k;
    c.row_bytes = k / tr.elems * tr.bytes;
    c.n_x = n_x;
    c.y = y;
    c.elems = tr.elems;
    c.bytes = tr.bytes;
    c.dot = tr.act >= 0 ? dot_fn(type) : NULL;
    uint8_t *xq = NULL;
    if (c.dot) {
        int64_t rb = act_row_bytes(tr.act, k);
        xq = (uint8_t *)malloc((size_t)(rb * n_x) + 64);
        if (!xq) return -2;
        for (int64_t j = 0; j < n_x; ++j) qs_quantize_activation(tr.act, x + j * k, xq + j * rb, k);
        c.xq = xq;
        c.xq_stride = rb;
    } else {
        c.deq = deq_fn(type);
        c.xq = (const uint8_t *)x;
        c.xq_stride = k * 4;
    }
    if (n_threads <= 0) n_threads = qs_threads_default();
    /* Few, contiguous chunks per thread: each thread streams long runs of rows (keeps the hardware prefetcher
     * on one stream) while 4 chunks per thread still balance uneven progress. */
    int64_t work;
    if (__builtin_mul_overflow(n_rows, k, &work) || __builtin_mul_overflow(work, n_x, &work)) work = INT64_MAX;
    if (work < (1 << 16)) n_threads = 1;
    int64_t per = (n_rows + 4 * (int64_t)n_threads - 1) / (4 * (int64_t)n_threads);
    if (per < 1) per = 1;
    c.rows_per_task = per;
    qs_parallel_for((n_rows + per - 1) / per, mm_task, &c, n_threads);
    free(xq);
    return c.failed ? -2 : 0;
}

int qs_matmat(int type, const uint8_t *w, int64_t n_rows, int64_t k, const float *x, int64_t n_x, float *y,
              int n_threads) {
    int rc;
    QS_GUARDED(rc, matmat_unguarded(type, w, n_rows, k, x, n_x, y, n_threads));
    return rc;
}

int qs_matvec(int type, const uint8_t *w, int64_t n_rows, int64_t k, const float *x, float *y, int n_threads) {
    return qs_matmat(type, w, n_rows, k, x, 1, y, n_threads);
}
