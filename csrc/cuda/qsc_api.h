/* Quantscope CUDA backend: the plain C API loaded with cffi's ffi.dlopen. core/engine/cuda_abi.py's CDEF is
 * generated from this file and qs_api_nn.h (python -m quantscope.core.engine.cuda_abi; tests/test_cuda.py fails
 * until it is regenerated). Declarations only, no preprocessor lines (cffi parses this text as it is).
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
 * zero-filled (ptr NULL, rows 0): tied to tok_embd (no second copy). eps: the final norm's. kv_source: NULL, or
 * n_layers entries, the layer whose KV cache each layer attends to (itself; for a layer with attn.kv_reuse, an
 * earlier layer with a cache of its own and the same KV heads and head size: gemma4's shared layers). */
typedef struct {
    int n_layers, n_vocab;
    float eps, embed_scale, final_softcap, logit_scale; /* final_softcap 0: none; logit_scale 0 or 1: none */
    qs_weight tok_embd, output;
    qs_vec output_norm;
    const int32_t *kv_source;
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
int qsc_type_supported(int type); /* 1: kernels run on this type as stored (its row in qsc_types.cuh's QSC_TYPE_LIST,
                                   * the one list of the device's types); 0: dequantized to F32 on upload */
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
/* The debug mode: QUANTSCOPE_CUDA_DEBUG=1 in the environment when the model is made (read once) has every launch of
 * its forward followed by a stream synchronize and an error check; the first fault, one line naming the kernel,
 * its grid, block and main sizes, is kept on the model and is the error of that forward and of every later one.
 * qsc_model_debug: 1 when m runs so, else 0. qsc_debug_message: that line for the given parts (tests; no GPU).
 * qsc_debug_selftest (GPU): a launch the device refuses (2048 threads a block: nothing runs and the context stays
 * usable) checked as the debug mode checks; 0 and its line in err when the check named it. */
int qsc_model_debug(qsc_model *m);
int qsc_debug_message(const char *kernel, int gx, int gy, int gz, int bx, int by, int bz, const char *sizes,
                      const char *error, char *out, size_t len);
int qsc_debug_selftest(char *err, size_t err_len);
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
int qsc_kernel_glu(const float *gate, const float *up, float *out, int n_rows, int n, int mode, char *err,
                   size_t err_len);
int qsc_kernel_attention(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim,
                         const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int n_kv,
                         int window, float scale, float *out, char *err, size_t err_len);

/* ---- the device's per-block math compiled for the host (no GPU needed): repack + decode + int8 dots */
int qsc_host_dequantize(int type, const uint8_t *w, int64_t rows, int64_t k, float *out);
int qsc_host_quantize(int act_type, const float *x, int64_t n, uint8_t *out);
int qsc_host_matmat(int type, const uint8_t *w, int64_t rows, int64_t k, const float *x, int n_x, float *y);

/* ---- mixture of experts (qsc_moe.cuh): the device's routing compiled for the host (sel, w: n_tokens x n_used), and
 * one layer's moe FFN of h [n_tokens][n_embd] into out through the forward's own launches (enqueue_moe on a one-layer
 * model): the host twins (no GPU needed) or the device */
int qsc_host_moe_route(const float *logits, int n_tokens, int n_expert, int n_used, int norm, float scale,
                       int32_t *sel, float *w);
int qsc_host_moe_ffn(const qs_block *b, const float *h, int n_tokens, float *out, char *err, size_t err_len);
int qsc_kernel_moe_ffn(const qs_block *b, const float *h, int n_tokens, float *out, char *err, size_t err_len);
/* the routing sel [n_tokens][n_used] grouped by expert as the forward groups it (k_moe_group / its host twin):
 * pairs, trow [n_tokens * n_used], off [n_expert + 1], tiles [3 * n_tokens * n_used] ((expert, first row, rows) of
 * `tile` rows at most), n_tiles [1] */
int qsc_host_moe_group(const int32_t *sel, int n_tokens, int n_used, int n_expert, int tile, int32_t *pairs,
                       int32_t *trow, int32_t *off, int32_t *tiles, int32_t *n_tiles, char *err, size_t err_len);
int qsc_kernel_moe_group(const int32_t *sel, int n_tokens, int n_used, int n_expert, int tile, int32_t *pairs,
                         int32_t *trow, int32_t *off, int32_t *tiles, int32_t *n_tiles, char *err, size_t err_len);

/* ---- the probes (qsc_probe.cuh): copies back only when asked for */
int qsc_probe_trace(qsc_model *m, float *resid, float *queries, int64_t n_tokens, char *err, size_t err_len);
int qsc_stats_enable(qsc_model *m, const float *init, int64_t n, char *err, size_t err_len);
int qsc_stats_read(qsc_model *m, float *out, int64_t n, char *err, size_t err_len);
int qsc_head(qsc_model *m, const float *x, int n_rows, float *logits, char *err, size_t err_len);
int qsc_read_cache(qsc_model *m, int layer, int which, int n_rows, void *out, int64_t out_bytes, char *err,
                   size_t err_len);
int qsc_host_probe_sumsq(float *acc, const float *x, int64_t T, int64_t n);

/* ---- the dense architecture features (tests/test_cuda_features.py): each on the device (qsc_kernel_*) and its
 * per-element math (qsc_arch.cuh) run on the host the way the kernel runs it (qsc_host_*). glu mode: 0 SwiGLU,
 * 1 GELU-tanh, 2 gpt-oss's clamped SwiGLU. qk_post: the q/k RMSNorms (both or neither; per head, or qk_full over
 * the whole projection), RoPE as the description's qs_rope_desc says (NoPE, scaling, factors), the query
 * temperature, in place (k NULL: queries only). attention: scores scaled, soft-capped (0: none), with one sink per
 * query head (NULL: none), any head size up to 1024. logits: divided by logit_scale (0 or 1: none), then
 * soft-capped (0: none). residual: x = (x + rs * [RMSNorm](o) * post_w) * out_scale, post_w NULL: o as it is. */
int qsc_kernel_attention_ext(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim,
                             const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int n_kv,
                             int window, float scale, float softcap, const float *sinks, float *out, char *err,
                             size_t err_len);
/* flash-decoding (qsc_decode.cuh): decode attention of n_q <= 15 tokens with the keys split across blocks and the
 * partials merged, as the forward runs it for T <= 15 (arguments as qsc_kernel_attention_ext; head sizes whose rows
 * are whole 16-byte chunks: a multiple of 8 for an F16 cache, of 4 for F32). n_split: the splits (1..128), or <= 0
 * for the forward's choice with n_kv as the context size (the host twin counts 132 SMs). Returns the split count
 * used (> 0), or < 0 refused. The host twin runs the kernels' blocks, partials and merge on the CPU. */
int qsc_kernel_flashdec(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim,
                        const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int n_kv, int window,
                        float scale, float softcap, const float *sinks, int n_split, float *out, char *err,
                        size_t err_len);
int qsc_host_flashdec(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim, const void *k_cache,
                      const void *v_cache, int kv_f16, int n_kv_heads, int n_kv, int window, float scale, float softcap,
                      const float *sinks, int n_split, float *out);
int qsc_kernel_qk_post(float *q, float *k, int n_tokens, int n_head, int n_head_kv, int head_dim,
                       const float *q_norm, const float *k_norm, int qk_full, float eps, const int32_t *pos,
                       const qs_rope_desc *rope, float temp_scale, int64_t temp_floor, char *err, size_t err_len);
int qsc_kernel_logits(float *x, int64_t n, float logit_scale, float softcap, char *err, size_t err_len);
int qsc_host_attention(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim,
                       const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int n_kv, int window,
                       float scale, float softcap, const float *sinks, float *out);
int qsc_host_qk_post(float *q, float *k, int n_tokens, int n_head, int n_head_kv, int head_dim, const float *q_norm,
                     const float *k_norm, int qk_full, float eps, const int32_t *pos, const qs_rope_desc *rope,
                     float temp_scale, int64_t temp_floor);
int qsc_host_glu(const float *gate, const float *up, float *out, int64_t n, int mode);
int qsc_host_logits(float *x, int64_t n, float logit_scale, float softcap);
int qsc_host_residual(float *x, const float *o, const float *post_w, int n_rows, int n, float eps, float rs,
                      float out_scale);
/* The device's forward pass run on the host (tests, machines without a GPU): a model like qsc_model_create's, its
 * buffers in host memory and each kernel replaced by its host twin (qsc_emul.cuh); qsc_forward, qsc_set_graphs,
 * qsc_model_device_bytes and qsc_model_free take it. Needs no GPU, driver or CUDA call. */
/* qsc_forward for a model with per-layer embeddings (gemma4: the layers' ple.dim P > 0): ple holds the call's
 * per-layer inputs [n_tokens][n_layers][P] (ple_len floats, exactly that many); qsc_forward refuses such a model. */
int qsc_forward_ple(qsc_model *m, const int32_t *tokens, int n_tokens, int n_past, int all_logits, float *logits,
                    const float *ple, int64_t ple_len, char *err, size_t err_len);
qsc_model *qsc_host_model_create(const qsc_model_desc *md, const qs_block *layers, int n_ctx, int kv_f16,
                                 int max_batch, char *err, size_t err_len);

/* ---- qwen35 (qsc_gdn.cuh) compiled for the host: one layer's gated delta-net mixer on h [n_tokens][n_embd] into
 * out, its conv_state / ssm_state updated in place; the gated attention's split of wq's output qg
 * [n_tokens][n_head][2 head_dim] (each head's query, then its gate) into q (+ bq, NULL: none), and
 * out = att * sigmoid(gate) (no GPU needed) */
int qsc_host_gdn_mixer(const qs_block *b, const float *h, int n_tokens, float *out, char *err, size_t err_len);
int qsc_host_qgate(const float *qg, const float *bq, const float *att, int n_tokens, int n_head, int head_dim,
                   float *q, float *out);
/* the session's recurrent state (every delta-net layer's conv and ssm state; the forward zeroes it at position 0):
 * op 0 zero it, 1 save it as the checkpoint, 2 restore the checkpoint, 3 ask whether there is one (1 / 0) */
int qsc_recurrent_state(qsc_model *m, int op, char *err, size_t err_len);
/* partial offload (core/engine/split.py): qsc_forward_ple (ple NULL / 0 for a model without per-layer inputs) that
 * copies the residual stream after the model's last layer into resid [n_tokens][n_embd] instead of logits; a
 * one-token step runs uncaptured */
int qsc_forward_resid(qsc_model *m, const int32_t *tokens, int n_tokens, int n_past, const float *ple,
                      int64_t ple_len, float *resid, char *err, size_t err_len);
