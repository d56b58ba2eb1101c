/* Device kernels of the forward pass. Each kernel handles one piece of a transformer block for T tokens:
 *   k_embed        token rows of the (quantized) embedding table -> x, times embed_scale
 *   k_norm_quant   x += [RMSNorm](o) (the previous residual branch), h = RMSNorm(x) * w, h -> int8 activations
 *   k_matmul       up to three quantized matrices at once (q/k/v, gate/up) against T activation rows (+ bias)
 *   k_qk_post      per-head q/k RMSNorm, RoPE (normal or NeoX), K and V rows into the cache
 *   k_attention    one (head, token) per block: online softmax over the cache, GQA, causal + sliding window;
 *                  quantizes its head's output for the output projection when the blocks align with heads
 *   k_glu_quant    SiLU / GELU-tanh gated unit, then int8 activations for ffn_down
 * Values the step changes (token ids, positions, cache length) are read from device memory, so the same launches
 * can be captured once into a CUDA graph and replayed for every decoded token. */
#pragma once

#include "qsc_common.cuh"

#define FULL_MASK 0xffffffffu

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

/* Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the total. */
__device__ __forceinline__ float block_sum(float v, float *red) {
    v = warp_sum(v);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return warp_sum(lane < nw ? red[lane] : 0.0f);
}

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }

/* ---------------------------------------------------------------------------------------------------------------
 * Activation quantizers, one warp per block, the same arithmetic as ggml's reference quantizers (and as
 * quant_block32 / quant_block256 on the host). */

/* Q8_0 / Q8_1 block of 32: lane i holds element i. d = amax/127 (fp16-rounded when stored), q = roundf(x / d). */
__device__ __forceinline__ void warp_quant32(float v, int8_t *qs, float *d_out, float *s_out) {
    const int lane = threadIdx.x & 31;
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = (int)roundf(v * id);
    qs[lane] = (int8_t)q;
    const int sum = warp_sum_int(q);
    if (lane == 0) {
        *d_out = f16_round(d);
        *s_out = f16_round((float)sum * d);
    }
}

/* Q8_K block of 256: lane i holds elements 8i..8i+7. The scale comes from the signed value of largest magnitude
 * (the first one on ties, hence the index in the reduction); q = min(127, rint(-127/max * x)); bsums per 16. */
__device__ __forceinline__ void warp_quant256(const float (&v)[8], int8_t *qs, float *d_out, int *bs) {
    const int lane = threadIdx.x & 31;
    float amax = 0.0f, mx = 0.0f;
    int idx = 8 * lane;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float ax = fabsf(v[i]);
        if (ax > amax) { amax = ax; mx = v[i]; idx = 8 * lane + i; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float oa = __shfl_xor_sync(FULL_MASK, amax, o), om = __shfl_xor_sync(FULL_MASK, mx, o);
        const int oi = __shfl_xor_sync(FULL_MASK, idx, o);
        if (oa > amax || (oa == amax && oi < idx)) { amax = oa; mx = om; idx = oi; }
    }
    __align__(8) int8_t q8[8];
    int qsum = 0;
    if (amax == 0.0f) {
#pragma unroll
        for (int i = 0; i < 8; ++i) q8[i] = 0;
    } else {
        const float iscale = -127.0f / mx;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            int q = __float2int_rn(iscale * v[i]);
            q = q < 127 ? q : 127;
            q8[i] = (int8_t)q;
            qsum += q;
        }
        if (lane == 0) *d_out = 1.0f / iscale;
    }
    if (amax == 0.0f && lane == 0) *d_out = 0.0f;
    int2 packed;
    memcpy(&packed, q8, 8);
    *(int2 *)(qs + 8 * lane) = packed;
    const int other = __shfl_xor_sync(FULL_MASK, qsum, 1); /* lanes 2g, 2g+1 hold the 16 elements of bsum g */
    if ((lane & 1) == 0) bs[lane >> 1] = qsum + other;
}

/* Quantize row `row` (n floats at xr) into whichever formats `o` asks for; all warps of the block share the work. */
static __device__ void block_quantize_row(const float *xr, int n, const ActOut &o, int64_t row) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (o.qs32)
        for (int b = warp; b < n / 32; b += nw) {
            const int64_t blk = row * (n / 32) + b;
            warp_quant32(xr[32 * b + lane], o.qs32 + blk * 32, o.d32 + blk, o.s32 + blk);
        }
    if (o.qs256)
        for (int b = warp; b < n / 256; b += nw) {
            const int64_t blk = row * (n / 256) + b;
            float v[8];
            const float *p = xr + 256 * b + 8 * lane;
            const float4 a = *(const float4 *)p, c = *(const float4 *)(p + 4);
            v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = c.x; v[5] = c.y; v[6] = c.z; v[7] = c.w;
            warp_quant256(v, o.qs256 + blk * 256, o.d256 + blk, o.bs256 + blk * 16);
        }
}

/* ---------------------------------------------------------------------------------------------------------------
 * Embedding: x[t] = dequant(table row tokens[t]) * scale. One block per token. */
__global__ void __launch_bounds__(256) k_embed(const QW w, const int *__restrict__ tokens, float *__restrict__ x,
                                               int n, float scale) {
    const int t = blockIdx.x;
    const int64_t row = tokens[t];
    for (int e = threadIdx.x; e < n; e += blockDim.x) x[(int64_t)t * n + e] = dequant_elem(w, row, e) * scale;
}

/* Standalone quantization of rows of n floats (attention outputs whose blocks straddle heads; tests). */
__global__ void __launch_bounds__(256) k_quantize(const float *__restrict__ x, const ActOut o, int n) {
    block_quantize_row(x + (int64_t)blockIdx.x * n, n, o, blockIdx.x);
}

/* Residual add + RMSNorm + quantize, one block per token row: the residual update above, then h = RMSNorm(x) * w
 * (w NULL: no weight; norm 0: h = x, olmo2's layers without pre-norms), then h -> the int8 formats in ao. */
__global__ void __launch_bounds__(256) k_norm_quant(float *__restrict__ x, const ResidIn r,
                                                    const float *__restrict__ w, int norm, float *__restrict__ h,
                                                    const ActOut ao, int n, float eps) {
    __shared__ float red[32];
    const int64_t row = blockIdx.x;
    float *xr = x + row * n;
    if (r.o) {
        const float *orow = r.o + row * n;
        float sc = 1.0f;
        if (r.post_w) {
            float ss = 0.0f;
            for (int i = threadIdx.x; i < n; i += blockDim.x) ss += orow[i] * orow[i];
            ss = block_sum(ss, red);
            sc = 1.0f / sqrtf(ss / (float)n + r.post_eps);
        }
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            xr[i] = residual_add(xr[i], r.post_w ? orow[i] * sc * r.post_w[i] : orow[i], r.rs, r.out_scale);
    }
    float sc = 1.0f;
    if (norm) {
        float ss = 0.0f;
        for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
        ss = block_sum(ss, red);
        sc = 1.0f / sqrtf(ss / (float)n + eps);
    }
    float *hr = h + row * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) hr[i] = !norm ? xr[i] : w ? xr[i] * sc * w[i] : xr[i] * sc;
    __syncthreads(); /* the quantizer's warps read elements other threads wrote */
    block_quantize_row(hr, n, ao, row);
}

/* Gated FFN activation, one block per token row: a = glu_unit(g, u, mode) (SiLU, GELU-tanh or gpt-oss's clamped
 * SwiGLU) for the first nv of the row's n values, 0 past them (gemma4's per-layer embedding, padded to the
 * matmul's 32); u's rows are ldu apart. */
__global__ void __launch_bounds__(256) k_glu_quant(const float *__restrict__ g, const float *__restrict__ u,
                                                   float *__restrict__ a, const ActOut ao, int n, int mode,
                                                   int64_t ldu, int nv) {
    const int64_t row = blockIdx.x;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        a[row * n + i] = i < nv ? glu_unit(g[row * n + i], u[row * ldu + i], mode) : 0.0f;
    __syncthreads();
    block_quantize_row(a + row * n, n, ao, row);
}

/* q/k RMSNorm, RoPE (skipped on NoPE layers), the query temperature, then this token's K and V rows into the cache
 * (layout [n_ctx][KV][hd]) - the CPU block's order. One block per token, one warp per head; each pair's cos and sin
 * are computed once per token (rope_cs, in double) into shared memory for all heads. k_cache NULL: no store (RoPE
 * alone, for tests). */
__global__ void __launch_bounds__(256) k_qk_post(float *__restrict__ q, float *__restrict__ k,
                                                 const float *__restrict__ v, const QKArgs A,
                                                 const int *__restrict__ pos, void *k_cache, void *v_cache,
                                                 int kv_f16) {
    __shared__ float red[32];
    __shared__ float rc[QSC_MAX_HEAD / 2], rs[QSC_MAX_HEAD / 2];
    const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const int p = pos[t], H = A.H, KV = A.KV, hd = A.hd;
    const int half = A.rope.skip ? 0 : A.rope.dim / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) rope_cs(A.rope, p, i, &rc[i], &rs[i]);
    __syncthreads();
    if (A.q_norm && A.k_norm && A.qk_full) { /* over the whole projection: one block-wide sum for q, one for k */
        for (int which = 0; which < 2; ++which) {
            const int n = (which ? KV : H) * hd;
            float *r = which ? k + (int64_t)t * n : q + (int64_t)t * n;
            const float *w = which ? A.k_norm : A.q_norm;
            float ss = 0.0f;
            for (int i = threadIdx.x; i < n; i += blockDim.x) ss += r[i] * r[i];
            ss = block_sum(ss, red);
            const float sc = 1.0f / sqrtf(ss / (float)n + A.eps);
            for (int i = threadIdx.x; i < n; i += blockDim.x) r[i] = r[i] * sc * w[i];
        }
        __syncthreads();
    }
    for (int hh = warp; hh < H + KV; hh += nw) {
        const bool isq = hh < H;
        float *vec = isq ? q + ((int64_t)t * H + hh) * hd : k + ((int64_t)t * KV + (hh - H)) * hd;
        const float *nw_ = isq ? A.q_norm : A.k_norm;
        if (nw_ && !A.qk_full) {
            float ss = 0.0f;
            for (int i = lane; i < hd; i += 32) ss += vec[i] * vec[i];
            ss = warp_sum(ss);
            const float sc = 1.0f / sqrtf(ss / (float)hd + A.eps);
            for (int i = lane; i < hd; i += 32) vec[i] = vec[i] * sc * nw_[i];
            __syncwarp();
        }
        for (int i = lane; i < half; i += 32) rope_pair(vec, rope_ia(A.rope, i), rope_ib(A.rope, i), rc[i], rs[i]);
        __syncwarp();
        if (isq && A.temp_scale != 0.0f) {
            const float f = temp_factor(p, A.temp_scale, A.temp_floor);
            for (int i = lane; i < hd; i += 32) vec[i] *= f;
        }
        if (!isq && k_cache) {
            const int kvh = hh - H;
            const float *vv = v + ((int64_t)t * KV + kvh) * hd;
            const int64_t off = ((int64_t)p * KV + kvh) * hd;
            float vs = 1.0f;
            if (A.v_norm) {
                float ss = 0.0f;
                for (int i = lane; i < hd; i += 32) ss += vv[i] * vv[i];
                vs = 1.0f / sqrtf(warp_sum(ss) / (float)hd + A.eps);
            }
            for (int i = lane; i < hd; i += 32) {
                if (kv_f16) {
                    ((__half *)k_cache)[off + i] = __float2half_rn(vec[i]);
                    ((__half *)v_cache)[off + i] = __float2half_rn(vv[i] * vs);
                } else {
                    ((float *)k_cache)[off + i] = vec[i];
                    ((float *)v_cache)[off + i] = vv[i] * vs;
                }
            }
        }
    }
}

/* Attention for query head blockIdx.x of token blockIdx.y over cache positions lo..hi (causal: hi = the query's
 * position; sliding window: lo = pos - window + 1). 8 warps take keys round-robin; lane i holds head elements
 * EPL*i .. EPL*i+EPL-1 (those below hd: any head size up to 32 EPL). Scores are scaled and soft-capped
 * (attn_score); each warp keeps an online softmax (softmax_step); the warps are merged through shared memory at
 * the end, with the head's sink (gpt-oss; NULL: none) joining the denominator there. */
/* One head's output (hd floats in shared memory, the slice of the activation matrix from element r0) into its int8
 * blocks of each format asked for, the NW warps of the block taking blocks in turn (hd a multiple of each block:
 * the launches check). Shared by the attention kernels that quantize their own output (k_attention, k_fdec_merge). */
template <int NW>
__device__ __forceinline__ void quant_head_row(const float *sm_out, int64_t r0, int hd, const ActOut &ao, int warp,
                                               int lane) {
    if (ao.qs32)
        for (int b = warp; b < hd / 32; b += NW) {
            const int64_t blk = r0 / 32 + b;
            warp_quant32(sm_out[32 * b + lane], ao.qs32 + blk * 32, ao.d32 + blk, ao.s32 + blk);
        }
    if (ao.qs256)
        for (int b = warp; b < hd / 256; b += NW) {
            const int64_t blk = r0 / 256 + b;
            float v[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = sm_out[256 * b + 8 * lane + i];
            warp_quant256(v, ao.qs256 + blk * 256, ao.d256 + blk, ao.bs256 + blk * 16);
        }
}

template <int EPL, typename KT>
__global__ void __launch_bounds__(256) k_attention(const float *__restrict__ q, const int *__restrict__ q_pos, int H,
                                                   int KV, int hd, const KT *__restrict__ kc,
                                                   const KT *__restrict__ vc, const int *__restrict__ n_kv_p,
                                                   int window, float scale, float softcap,
                                                   const float *__restrict__ sinks, float *__restrict__ out,
                                                   const ActOut ao) {
    constexpr int HMAX = EPL * 32, NW = 8;
    __shared__ float sm_m[NW], sm_l[NW];
    __shared__ float sm_acc[NW][HMAX];
    __shared__ float sm_out[HMAX];
    const int h = blockIdx.x, t = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kvh = h / (H / KV);
    const int qp = q_pos[t], n_kv = *n_kv_p;
    const int hi = min(qp, n_kv - 1);
    const int lo = window > 0 ? max(0, qp - window + 1) : 0;
    const float *qv = q + ((int64_t)t * H + h) * hd;
    const int e0 = lane * EPL;
    float qr[EPL], acc[EPL];
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
        qr[i] = e0 + i < hd ? qv[e0 + i] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = lo + warp; j <= hi; j += NW) {
        const int64_t base = ((int64_t)j * KV + kvh) * hd + e0;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < EPL; ++i)
            if (e0 + i < hd) s += qr[i] * to_f(kc[base + i]);
        float alpha;
        const float p = softmax_step(m, l, attn_score(warp_sum(s), scale, softcap), &alpha);
#pragma unroll
        for (int i = 0; i < EPL; ++i)
            if (e0 + i < hd) acc[i] = acc[i] * alpha + p * to_f(vc[base + i]);
    }
    if (lane == 0) { sm_m[warp] = m; sm_l[warp] = l; }
#pragma unroll
    for (int i = 0; i < EPL; ++i) sm_acc[warp][e0 + i] = acc[i];
    __syncthreads();
    const float sink = sinks ? sinks[h] : -INFINITY;
    float M = sink;
#pragma unroll
    for (int w = 0; w < NW; ++w) M = fmaxf(M, sm_m[w]);
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float L = sinks ? expf(sink - M) : 0.0f, o = 0.0f;
        if (M != -INFINITY)
            for (int w = 0; w < NW; ++w) {
                const float f = expf(sm_m[w] - M); /* warps that saw no key: exp(-inf) = 0 */
                L += sm_l[w] * f;
                o += sm_acc[w][e] * f;
            }
        const float r = L > 0.0f ? o / L : 0.0f;
        out[((int64_t)t * H + h) * hd + e] = r;
        sm_out[e] = r;
    }
    if (!ao.qs32 && !ao.qs256) return;
    __syncthreads();
    /* this head's slice of row t of the [T][H*hd] activation matrix (hd a multiple of the block: see the launch) */
    quant_head_row<NW>(sm_out, ((int64_t)t * H + h) * hd, hd, ao, warp, lane);
}

/* The head's logits, in place: logit_post (granite's logit scale, gemma2's final soft-cap). */
__global__ void __launch_bounds__(256) k_logits_post(float *__restrict__ x, int64_t n, float logit_scale,
                                                     float cap) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = logit_post(x[i], logit_scale, cap);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Quantized matrix x activations: y[c][row] = W[row] . act[c] (+ bias[row]). One warp per output row, 4 rows per
 * block; lanes stride over the row's units (consecutive lanes read consecutive bytes of the repacked fields, so a
 * warp's loads coalesce), each unit is decoded once and dotted with NC activation columns (NC = 1 for decode, 8
 * for prefill: the weights are read once per 8 tokens). Up to three matrices share one launch (q/k/v, gate/up):
 * blockIdx.x picks the segment. */
constexpr int MM_WARPS = 4;

struct MMSeg {
    QW w;
    Act a;
    float *y;
    int64_t ldy;
    const float *bias;
    int blk0; /* first blockIdx.x of this segment */
};
struct MMArgs {
    MMSeg seg[3];
    int nseg, ncols;
};

template <int TYPE, int NC>
__device__ __forceinline__ void warp_row_dot(const QW &w, int64_t row, const Act &a, int64_t col0, int ncols,
                                             float (&acc)[NC]) {
    using U = Unit<TYPE>;
    const int nu = w.nb * U::NU, lane = threadIdx.x & 31;
    for (int t = lane; t < nu; t += 32) {
        const int ib = t / U::NU, sub = t % U::NU;
        U u;
        u.load(w, row * w.nb + ib, sub);
#pragma unroll
        for (int c = 0; c < NC; ++c)
            if (c < ncols) acc[c] += u.dot(a, col0 + c, ib);
    }
}

template <int NC>
__global__ void __launch_bounds__(MM_WARPS * 32) k_matmul(const __grid_constant__ MMArgs args) {
    const int bx = blockIdx.x;
    int si = 0;
    if (args.nseg > 1 && bx >= args.seg[1].blk0) si = 1;
    if (args.nseg > 2 && bx >= args.seg[2].blk0) si = 2;
    const MMSeg &s = args.seg[si];
    const int64_t row = (int64_t)(bx - s.blk0) * MM_WARPS + (threadIdx.x >> 5);
    if (row >= s.w.rows) return; /* whole warp */
    const int64_t col0 = (int64_t)blockIdx.y * NC;
    const int ncols = min(NC, args.ncols - (int)col0);
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
    switch (s.w.type) { /* warp-uniform branch */
#define QSC_MM_CASE(T) case T: warp_row_dot<T, NC>(s.w, row, s.a, col0, ncols, acc); break;
        QSC_FOR_TYPES(QSC_MM_CASE)
#undef QSC_MM_CASE
    default: break;
    }
    const float b = s.bias ? s.bias[row] : 0.0f;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        const float v = warp_sum(acc[c]);
        if ((threadIdx.x & 31) == 0 && c < ncols) s.y[(col0 + c) * s.ldy + row] = v + b;
    }
}
