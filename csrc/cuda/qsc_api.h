/* Quantscope CUDA backend: the plain C API loaded with cffi's ffi.dlopen (core/engine/cuda_backend.py keeps a
 * copy of these declarations; tests/test_cuda.py checks the two agree). Declarations only, no preprocessor lines.
 *
 * Conventions: functions return 0 on success and a negative number on failure, writing a one-line reason into
 * err[err_len] when err is not NULL. Type ids are ggml's. Sizes are validated by the Python wrappers first; the
 * C side checks them again and refuses (never trusts) a size that does not add up.
 *
 * Weight slots (argument `slot` of qsc_upload_weight); layer slots take layer = 0..n_layers-1, model slots -1:
 *   0 attn_q  1 attn_k  2 attn_v  3 attn_output  4 ffn_gate  5 ffn_up  6 ffn_down        matrices [rows][k]
 *   7 attn_norm  8 ffn_norm  9 attn_q.bias  10 attn_k.bias  11 attn_v.bias  12 attn_q_norm  13 attn_k_norm
 *   14 post_attention_norm  15 post_ffw_norm                                              F32 vectors (rows 1)
 *   16 token_embd  17 output  18 output_norm                                              (layer -1)
 */

/* The model-wide switches the device code reads (cuda_backend.check_config refuses, by name, the features of a
 * model it lacks; never by architecture). */
typedef struct {
    int n_layers, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train;
    float rms_eps;
    int rope_neox, rope_dim;
    float embed_scale;
    int gelu, qk_norm, post_norms;
    float attn_scale;
} qsc_config;

/* One layer's policy as the CPU block's forward description (qs_block: attn.window, rope.base) has it: decided
 * once in Python, never re-derived here. window 0: every position. */
typedef struct {
    int window;
    float rope_base;
} qsc_layer;

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
int qsc_check_layers(const qsc_config *cfg, const qsc_layer *layers, char *err, size_t err_len); /* 0: usable */

/* ---- model: weights uploaded once, a GPU-resident KV cache, the whole forward pass on the device */
qsc_model *qsc_model_create(const qsc_config *cfg, const qsc_layer *layers, int n_ctx, int kv_f16, int max_batch,
                             char *err, size_t err_len);
int qsc_upload_weight(qsc_model *m, int layer, int slot, int type, int64_t rows, int64_t k, const uint8_t *data,
                      int64_t nbytes, char *err, size_t err_len);
int qsc_tie_output(qsc_model *m, char *err, size_t err_len);     /* output = token_embd (no second copy) */
int qsc_model_finalize(qsc_model *m, char *err, size_t err_len); /* every slot present; scratch allocated */
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
