/* Quantscope CUDA backend: the plain C API loaded with cffi's ffi.dlopen (core/engine/cuda_backend.py keeps a
 * copy of these declarations; tests/test_cuda.py checks the two agree). Declarations only, no preprocessor lines.
 *
 * Conventions: functions return 0 on success and a negative number on failure, writing a one-line reason into
 * err[err_len] when err is not NULL. Type ids are ggml's. Sizes are validated by the Python wrappers first; the
 * C side checks them again and refuses (never trusts) a size that does not add up.
 *
 * The model is the same forward description the CPU block reads (csrc/qs_api_nn.h, declared before this file):
 * one qs_block per layer (weights {ptr, type, bytes, rows, k}, vectors {ptr, len}, grouped into attn, rope, ffn,
 * moe, gdn, ple, probe) and the model-level part below. Python decides every policy once; the device derives
 * none. qsc_check_model refuses (host only, before any device call) a description whose sizes, types or byte
 * counts do not add up, a missing group, and every feature the device code lacks, naming it.
 */

/* The model-level part of the forward description: the embedding, the head and their scales. output
 * zero-filled (ptr NULL, rows 0): tied to tok_embd (no second copy). eps: the final norm's. */
typedef struct {
    int n_layers, n_vocab;
    float eps, embed_scale, final_softcap, logit_scale; /* final_softcap 0: none; logit_scale 0 or 1: none */
    qs_weight tok_embd, output;
    qs_vec output_norm;
} qsc_model_desc;

typedef struct {
    char name[256];
    int major, minor, sm_count;
    int64_t total_mem, free_mem;
    int mem_clock_khz, bus_width_bits;
    double peak_bw_gbs;                 /* 2 (DDR) x memory clock x bus width */
    int driver_version, runtime_version;
} qsc_device_props;

typedef struct qsc_model qsc_model;

/* ---- library and device */
const char *qsc_build_info(void);                       /* CUDA version and the archs compiled in */
int qsc_init(char *err, size_t err_len);                /* 0 = usable device; else the cudaError_t code (> 0) */
int qsc_device_props_get(qsc_device_props *out, char *err, size_t err_len);
int qsc_device_info(char *buf, size_t len);             /* one human line, e.g. "NVIDIA H100 (sm_90, 132 SMs...)" */

/* ---- weight formats */
int qsc_type_supported(int type);                       /* 1: kernels run on this type as stored */
int64_t qsc_packed_bytes(int type, int64_t rows, int64_t k);   /* device bytes after repacking; < 0 unsupported */
int qsc_repack(int type, const uint8_t *src, int64_t rows, int64_t k, uint8_t *dst, int64_t dst_bytes);
int qsc_check_model(const qsc_model_desc *md, const qs_block *layers, char *err, size_t err_len); /* 0: usable */

/* ---- model: weights uploaded once, a GPU-resident KV cache, the whole forward pass on the device.
 * qsc_model_create checks the description (qsc_check_model), uploads every weight of it (the host memory it
 * points to is read during the call only) and allocates the cache and the scratch. */
qsc_model *qsc_model_create(const qsc_model_desc *md, const qs_block *layers, int n_ctx, int kv_f16, int max_batch,
                             char *err, size_t err_len);
int qsc_forward(qsc_model *m, const int32_t *tokens, int n_tokens, int n_past, int all_logits, float *logits,
                char *err, size_t err_len);             /* logits: n_vocab floats, or n_tokens x n_vocab */
int qsc_set_graphs(qsc_model *m, int enabled);          /* CUDA graph for one-token steps (default on) */
int64_t qsc_model_device_bytes(qsc_model *m);
void qsc_model_free(qsc_model *m);

/* ---- single device kernels on host arrays (tests) */
int qsc_kernel_matmat(int type, const uint8_t *w, int64_t rows, int64_t k, const float *x, int n_x, float *y,
                      char *err, size_t err_len);
int qsc_kernel_quantize(int act_type, const float *x, int64_t n, uint8_t *out, char *err, size_t err_len);
int qsc_kernel_get_rows(int type, const uint8_t *w, int64_t rows, int64_t k, const int32_t *ids, int n_ids,
                        float scale, float *out, char *err, size_t err_len);
int qsc_kernel_rmsnorm(const float *x, const float *w, float *y, int n_rows, int n, float eps, char *err,
                       size_t err_len);
int qsc_kernel_rope(float *x, int n_tokens, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
                    float freq_base, int neox, char *err, size_t err_len);
int qsc_kernel_glu(const float *gate, const float *up, float *out, int n_rows, int n, int gelu, char *err,
                   size_t err_len);
int qsc_kernel_attention(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim,
                         const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int n_kv,
                         int window, float scale, float *out, char *err, size_t err_len);

/* ---- the device's per-block math compiled for the host (no GPU needed): repack + decode + int8 dots */
int qsc_host_dequantize(int type, const uint8_t *w, int64_t rows, int64_t k, float *out);
int qsc_host_quantize(int act_type, const float *x, int64_t n, uint8_t *out);
int qsc_host_matmat(int type, const uint8_t *w, int64_t rows, int64_t k, const float *x, int n_x, float *y);

/* ---- mixture of experts (qsc_moe.cuh) compiled for the host: the device's routing (sel, w: n_tokens x n_used) and
 * its expert-by-expert FFN of one layer's moe group on h [n_tokens][n_embd] into out (no GPU needed) */
int qsc_host_moe_route(const float *logits, int n_tokens, int n_expert, int n_used, int norm, float scale,
                       int32_t *sel, float *w);
int qsc_host_moe_ffn(const qs_block *b, const float *h, int n_tokens, float *out, char *err, size_t err_len);
/* the same on the device (a one-layer model holding the moe group; tests) */
int qsc_kernel_moe_ffn(const qs_block *b, const float *h, int n_tokens, float *out, char *err, size_t err_len);

/* ---- the probes (qsc_probe.cuh): copies back only when asked for */
int qsc_probe_trace(qsc_model *m, float *resid, float *queries, int64_t n_tokens, char *err, size_t err_len);
int qsc_stats_enable(qsc_model *m, const float *init, int64_t n, char *err, size_t err_len);
int qsc_stats_read(qsc_model *m, float *out, int64_t n, char *err, size_t err_len);
int qsc_head(qsc_model *m, const float *x, int n_rows, float *logits, char *err, size_t err_len);
int qsc_read_cache(qsc_model *m, int layer, int which, int n_rows, void *out, int64_t out_bytes, char *err,
                   size_t err_len);
int qsc_host_probe_sumsq(float *acc, const float *x, int64_t T, int64_t n);

/* ---- gated delta-net layers (qsc_gdn.cuh) and per-layer embeddings (qsc_ple.cuh) compiled for the host: one layer's
 * delta-net mixer on h [n_tokens][n_embd] into out, its conv_state / ssm_state updated in place; the per-layer
 * embedding step in place on x [n_tokens][n_embd] (no GPU needed) */
int qsc_host_gdn_mixer(const qs_block *b, const float *h, int n_tokens, float *out, char *err, size_t err_len);
int qsc_host_ple(const qs_block *b, float *x, int n_tokens, char *err, size_t err_len);
/* the session's recurrent state (every delta-net layer's conv and ssm state; qsc_forward zeroes it at position 0):
 * op 0 zero it, 1 save it as the checkpoint, 2 restore the checkpoint, 3 ask whether there is one (1 / 0) */
int qsc_recurrent_state(qsc_model *m, int op, char *err, size_t err_len);
/* qwen35's gated attention outputs compiled for the host: wq's output qg [n_tokens][n_head][2 head_dim] (each head's
 * query, then its gate) split into q (+ bq, NULL: none), and out = att * sigmoid(gate) */
int qsc_host_qgate(const float *qg, const float *bq, const float *att, int n_tokens, int n_head, int head_dim,
                   float *q, float *out);
