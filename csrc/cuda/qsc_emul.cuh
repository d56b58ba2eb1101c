/* The host twins of the forward pass's kernels (implemented in qsc_host.cu): each does on host memory what its
 * kernel in qsc_kernels.cuh does on the device, with the same per-element functions (qsc_arch.cuh, qsc_common.cuh's
 * unit decode, int8 dots and activation quantizers). qsc_device.cu's forward pass runs them instead of launching
 * its kernels for a model made by qsc_host_model_create, so that machines without a GPU run the device's whole
 * forward (its order of operations, per-layer buffers and KV cache layout) against the CPU engine and llama.cpp. */
#pragma once

#include "qsc_common.cuh"

void emu_embed(const QW &w, const int *tokens, float *x, int T, int n, float scale);
void emu_quantize(const float *x, const ActOut &o, int rows, int n);
void emu_norm_quant(float *x, const ResidIn &r, const float *w, int norm, float *h, const ActOut &ao, int rows, int n,
                    float eps);
void emu_matmul(const QW &w, const Act &a, float *y, int64_t ldy, const float *bias, int ncols);
void emu_qk_post(float *q, float *k, const float *v, const QKArgs &A, const int *pos, int T, void *k_cache,
                 void *v_cache, int kv_f16);
void emu_attention(int T, const AttnArgs &A, int kv_f16, const float *q, const int *pos, const void *kc,
                   const void *vc, int n_kv, float *out);
void emu_glu(const float *g, const float *u, float *a, const ActOut &ao, int rows, int n, int mode, int64_t ldu,
             int nv);
void emu_logits(float *x, int64_t n, float logit_scale, float cap);
/* the delta-net's and the gated attention's (QSC_GDN_HOST in qsc_gdn.cuh, compiled in qsc_host.cu) */
void emu_gdn_core(const GdnArgs &A, int T);
void emu_qgate_split(const float *qg, const float *bq, float *q, float *gate, int T, int H, int hd);
void emu_qgate_quant(float *att, const float *gate, const ActOut &ao, int T, int n);
