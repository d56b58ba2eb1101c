/* Shared by the device kernels and their host emulation: the repacked weight layout, the activation formats, the
 * load and int8 dot helpers as __host__ __device__ functions, and (qsc_types.cuh, included below) the weight types:
 * one list with their capabilities and one room per type with its layout, decode and dot. The host build of this
 * math is what tests/test_cuda.py checks against the CPU kernels on machines without a GPU; the device build is the
 * same source.
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
#include "../qs_plan.h"   /* the layer's plan, its slots and the policy it resolves (shared with the CPU block) */
#include "qsc_api.h"
}

#define HD __host__ __device__ __forceinline__

#include "qsc_arch.cuh" /* the dense architecture features' per-element math (RoPE, soft-caps, GLUs, ...) */

/* The activation formats a matrix consumes: floats, 32-element int8 blocks (Q8_0/Q8_1), 256-element (Q8_K); and the
 * ggml ids of the two int8 formats that are not weight types here (the weight types' T_* ids: qsc_types.cuh). */
enum { ACT_F = 0, ACT_32 = 1, ACT_256 = 2 };
enum { T_Q8_1 = 9, T_Q8_K = 15 };

/* A type's repacked layout (its room's PACK, qsc_types.cuh): the file's block bytes, and per section (SEC_QS, SEC_QH,
 * SEC_SC, SEC_D below) its bytes per block and where they sit in the file's block (-1: none, or made by unpack).
 * F32 / F16 / BF16 count 32-element units, copied as stored. */
struct Packing {
    int raw_bytes;
    int field[4], src[4];
    void (*unpack)(const uint8_t *blk, uint8_t *sc); /* sc unpacked from the file's block on upload (Q3_K, Q4_K, ...) */
};

/* The host's view of a device type (qsc_types.cuh's table, generated from its list and rooms; the kernels get a
 * matrix's geometry from its QW): the block (elements, file bytes), the activation format, the repacked layout
 * and the fast paths it has. An all-zero row is an unsupported type. */
struct TypeDesc {
    int qk, raw_bytes, act;
    int field[4]; /* SEC_QS, SEC_QH, SEC_SC, SEC_D bytes per block */
    int src[4];   /* their offsets in the file's block */
    void (*unpack)(const uint8_t *blk, uint8_t *sc);
    bool gemv, mma; /* k_gemv (qsc_gemv.cuh), k_matmul_mma (qsc_mma.cuh) */
};

static inline const TypeDesc &type_desc(int type); /* qsc_types.cuh */
static inline int type_act(int type) { return type_desc(type).act; }
static inline int type_qk(int type) { return type_desc(type).qk; }
static inline int raw_block_bytes(int type) { return type_desc(type).raw_bytes; }
static inline bool type_supported(int type) { return type_desc(type).raw_bytes > 0; }

/* ------------------------------------------------------------------------------------------------------------------
 * Repacked weight layout. GGUF blocks are 18..210 bytes, so their int8 payload is only 2-byte aligned; the device
 * wants aligned 8/16-byte loads and coalesced warps. On upload every block's fields are split into field arrays
 * (structure of arrays), each starting on a 256-byte boundary; block b of the matrix (b = row * nb + i) owns
 * field[s] bytes at b * field[s] of section s (qs: the quants, qh: high bits, sc: scales, d: fp16 scales); what each
 * type keeps where is in its room in qsc_types.cuh. Nothing is expanded to floats: the device bytes are within 4%
 * of the file's (Q3_K: 114 for 110). */
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
/* Aligned 4 / 16-byte stores (the MMA stage tiles; memcpy on the host). */
HD void st_i32(int8_t *p, int v) {
#ifdef __CUDA_ARCH__
    *(int *)p = v;
#else
    memcpy(p, &v, 4);
#endif
}
HD void st_i4(int8_t *p, int4 v) {
#ifdef __CUDA_ARCH__
    *(int4 *)p = v;
#else
    memcpy(p, &v, 16);
#endif
}

/* ------------------------------------------------------------------------------------------------------------------
 * Unit decode + dot, one specialisation per weight type (its room in qsc_types.cuh). A warp lane handles one unit at
 * a time (QK / NU elements of one block): load() decodes its weights into int8 lanes once, dot() multiplies them with
 * one activation row and returns the float contribution; the static elem() decodes one element (dequant_elem).
 * b = global block index (row * nb + ib), ib = block index within the row. */
template <int TYPE> struct Unit;

#include "qsc_types.cuh" /* the weight types: their list, their rooms, the type table and dequant_elem */

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

#include "qsc_moe.cuh" /* mixture-of-experts: the router math and moe_check */
#include "qsc_gdn.cuh" /* gated delta-net: the recurrence math and gdn_check */

/* The first feature of layer b that the device code does not compute (NULL: none). */
static inline const char *missing_feature(const qs_block &b) {
    const qs_attn_desc &a = b.attn;
    if (!b.gdn.conv && b.gdn.qkv.ptr) return "gated delta-net weights without a conv size";
    if (a.q_gate != 0 && (a.q_gate != 1 || b.gdn.conv)) return "gated attention outputs other than qwen35's";
    if (b.probe.attn || b.probe.wo || b.probe.ffn || b.probe.down || b.probe.exp_count || b.probe.q)
        return "probes";
    if (b.post_ln || b.ffn.plain || a.non_causal)
        return "BERT's post-LayerNorm residuals, ungated FFNs and non-causal attention";
    return nullptr;
}

/* A layer's RoPE as the device applies it: the description's, its 0-means-1 scales resolved as the CPU block
 * resolves them; factors: where the device (or the host emulation) reads rope.freqs. */
static inline RopeP rope_params(const qs_rope_desc &r, const float *factors) {
    const qs_rope_params q = qs_plan_rope(&r); /* the 0-means-1 scales, resolved where the CPU block resolves them */
    RopeP p = {r.skip ? 1 : 0, r.dim, r.neox ? 1 : 0, q.freq_base, q.freq_scale, q.ext_factor, q.corr0, q.corr1,
               q.mscale, r.skip ? nullptr : factors};
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
    const int bad = qs_plan_bad_vec(&b); /* the plan's vectors: norms and biases */
    if (bad) {
        const qs_vec &v = *qs_plan_vec(&b, bad);
        set_err(err, err_len, "layer %d: %s has %lld values%s, expected %lld", i, qs_plan_vec_name(bad),
                (long long)v.len, v.ptr ? "" : " and no data", (long long)qs_plan_vec_len(&b, bad));
        return -1;
    }
    const int64_t QD = (int64_t)H * hd, KD = (int64_t)KV * hd;
    const struct { const char *name; const qs_vec *v; int64_t n; } vecs[] = {
        {"attn.q_norm", &a.q_norm, a.qk_norm_full && !a.kv_reuse ? QD : hd},
        {"attn.k_norm", &a.k_norm, a.qk_norm_full ? KD : hd},
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
              qs_plan_one(md->logit_scale), 0, 0, 0, layers[0].ple.dim, 0};
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
