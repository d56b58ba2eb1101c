/* Activation quantizers: a float32 row into the blocks a weight type's dot product reads (ggml's *_ref
 * quantizers: Q8_0, Q8_1, Q8_K), or into F16 / BF16. Codecs: they call nothing above them; the type table
 * (qs_traits.c) names each one as its type's act_quantize. */
#include <math.h>

#include "qs.h"
#include "qs_quant_internal.h"
#include "qs_quant_neon.h"
#include "qs_slots.h"

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

void qs_quantize_q8_0_scalar(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t i = 0; i < n / 32; ++i) {
        uint8_t *o = dst + 34 * i;
        float d;
        q8_block32(x + 32 * i, (int8_t *)(o + 2), &d);
        uint16_t dh = qs_fp32_to_fp16(d);
        memcpy(o, &dh, 2);
    }
}

void qs_quantize_q8_1_scalar(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t i = 0; i < n / 32; ++i) {
        uint8_t *o = dst + 36 * i;
        float d;
        int sum = q8_block32(x + 32 * i, (int8_t *)(o + 4), &d);
        uint16_t dh = qs_fp32_to_fp16(d), sh = qs_fp32_to_fp16((float)sum * d);
        memcpy(o, &dh, 2);
        memcpy(o + 2, &sh, 2);
    }
}

void qs_quantize_q8_K_scalar(const float *x, uint8_t *dst, int64_t n) {
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
}

/* The dispatchers: a whole number of blocks, or -1. The SIMD versions give the same bytes. */
typedef void (*act_fn)(const float *x, uint8_t *dst, int64_t n);
static const act_fn Q8_0[QS_TIERS] = SLOTS(quantize_q8_0, X1, A1);
static const act_fn Q8_1[QS_TIERS] = SLOTS(quantize_q8_1, X1, A1);
static const act_fn Q8_K[QS_TIERS] = SLOTS(quantize_q8_K, X1, A1);

int qs_quantize_q8_0(const float *x, uint8_t *dst, int64_t n) {
    if (n % 32) return -1;
    QS_PICK(Q8_0)(x, dst, n);
    return 0;
}

int qs_quantize_q8_1(const float *x, uint8_t *dst, int64_t n) {
    if (n % 32) return -1;
    QS_PICK(Q8_1)(x, dst, n);
    return 0;
}

int qs_quantize_q8_K(const float *x, uint8_t *dst, int64_t n) {
    if (n % 256) return -1;
    QS_PICK(Q8_K)(x, dst, n);
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

int qs_quantize_f32_act(const float *x, uint8_t *dst, int64_t n) {
    memcpy(dst, x, (size_t)n * 4);
    return 0;
}
