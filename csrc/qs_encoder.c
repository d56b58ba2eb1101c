/* Kernels only the BERT-style encoders (core/engine/encoder.py) use, kept apart from qs_nn.c's:
 * - ALiBi attention (jina-bert-v2): every query attends to every cached key with a linear bias on the distance, as
 *   llama.cpp builds it (a mask of -|p_q - p_k| given to ggml_soft_max_ext with max_bias); a plain scalar loop on
 *   the encoder's own cache (F32 or F16) of one input;
 * - ggml's CPU GELU (GGML_GELU_FP16): a table over F16 inputs, what llama-embedding computes for BERT's and
 *   jina-bert-v2's FFNs. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "qs.h"

float qs_alibi_slope(int n_heads, int head, float max_bias) {
    if (max_bias <= 0.0f) return 1.0f;
    int n2 = 1; /* the largest power of two <= n_heads, as ggml's 1 << floor(log2(n_head)) */
    while (n2 * 2 <= n_heads) n2 *= 2;
    const float m0 = powf(2.0f, -max_bias / (float)n2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / (float)n2);
    return head < n2 ? powf(m0, (float)(head + 1)) : powf(m1, (float)(2 * (head - n2) + 1));
}

typedef struct {
    const float *q;
    const void *k, *v;
    const int32_t *q_pos;
    int64_t n_kv;
    int n_heads, head_dim, n_kv_heads, kv_f16;
    float scale, max_bias;
    float *out;
    int failed;
} alibi_ctx;

/* element i of a cache (F32 or F16) */
static inline float kv_at(const void *cache, int f16, int64_t i) {
    return f16 ? qs_fp16_to_fp32(((const uint16_t *)cache)[i]) : ((const float *)cache)[i];
}

/* one (query, head): scores over every key, softmax in double, the weighted sum of the values */
static void alibi_task(void *vctx, int64_t task) {
    alibi_ctx *c = (alibi_ctx *)vctx;
    const int64_t H = c->n_heads, hd = c->head_dim, KV = c->n_kv_heads, n = c->n_kv;
    const int64_t t = task / H, h = task % H, kh = h / (H / KV);
    const float *q = c->q + (t * H + h) * hd;
    const float slope = qs_alibi_slope((int)H, (int)h, c->max_bias);
    double *s = (double *)malloc((size_t)n * sizeof(double));
    if (!s) {
        c->failed = 1;
        return;
    }
    double m = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
        const int64_t row = (j * KV + kh) * hd;
        float dot = 0.0f;
        for (int64_t i = 0; i < hd; ++i) dot += q[i] * kv_at(c->k, c->kv_f16, row + i);
        const float d = (float)(c->q_pos[t] > j ? c->q_pos[t] - j : j - c->q_pos[t]);
        s[j] = (double)(dot * c->scale - slope * d);
        if (s[j] > m) m = s[j];
    }
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) sum += (s[j] = exp(s[j] - m));
    float *o = c->out + (t * H + h) * hd;
    for (int64_t i = 0; i < hd; ++i) o[i] = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
        const int64_t row = (j * KV + kh) * hd;
        const float p = (float)(s[j] / sum);
        for (int64_t i = 0; i < hd; ++i) o[i] += p * kv_at(c->v, c->kv_f16, row + i);
    }
    free(s);
}

int qs_attention_alibi(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                       const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int64_t n_kv,
                       float scale, float max_bias, float *out, int n_threads) {
    if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || head_dim <= 0 || head_dim > 1024)
        return QS_ERR_HEADS;
    if (n_q < 0 || n_kv <= 0 || (kv_f16 != 0 && kv_f16 != 1) || n_q > INT64_MAX / n_heads || !isfinite(scale) ||
        !isfinite(max_bias) || max_bias < 0.0f)
        return QS_ERR_SIZE;
    if (!q || !q_pos || !k_cache || !v_cache || !out) return QS_ERR_SIZE;
    for (int64_t t = 0; t < n_q; ++t)
        if (q_pos[t] < 0) return QS_ERR_POS;
    alibi_ctx c = {q, k_cache, v_cache, q_pos, n_kv, n_heads, head_dim, n_kv_heads, kv_f16, scale, max_bias, out, 0};
    qs_parallel_for(n_q * n_heads, alibi_task, &c, n_threads);
    return c.failed ? QS_ERR_NOMEM : QS_OK;
}

/* ggml_gelu_f32: the tanh form as ggml writes it */
static inline float gelu_ggml(float x) {
    return 0.5f * x * (1.0f + tanhf(0.79788456080286535587989211986876f * x * (1.0f + 0.044715f * x * x)));
}

/* ggml_table_gelu_f16[fp16(x)] (ggml_vec_gelu_f32 with GGML_GELU_FP16): 0 at or below -10, x at or above 10 */
static inline float gelu_table(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return qs_fp16_to_fp32(qs_fp32_to_fp16(gelu_ggml(qs_fp16_to_fp32(qs_fp32_to_fp16(x)))));
}

void qs_gelu_f16(const float *x, float *out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = gelu_table(x[i]);
}

void qs_geglu_f16(const float *gate, const float *up, float *out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        out[i] = (g >= 10.0f ? g : gelu_table(g)) * up[i];
    }
}
