/* One-thread row dots: Quantscope's kernel against ggml's on the same rows and the same activation, in TSC
 * cycles per 256-element block on x86 and nanoseconds elsewhere (ARM64 has no cycle counter user code may read
 * portably: CNTVCT_EL0 ticks at a fixed tens of MHz), best of 15 interleaved passes. Built and run by
 * tests/bench/bench_dot_vs_ggml.py against the static ggml libraries of the llama.cpp oracle build; figures only.
 *   dot_vs_ggml NATIVE_SO GGUF OFFSET ROWS K ROW_BYTES OURS_SYMBOL GGML_SYMBOL ACT (q8_K or q8_0)
 * (OFFSET -B: random blocks of B bytes instead of the file's rows, for types no file at hand holds) */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
static inline uint64_t ticks(void) { return __rdtsc(); }
#else
#include <time.h>
static inline uint64_t ticks(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
#endif

typedef float (*qs_dot)(int64_t n, const uint8_t *w, const uint8_t *x);
typedef int (*qs_quant)(const float *x, uint8_t *dst, int64_t n);
typedef void (*ggml_dot)(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc);

int main(int argc, char **argv) {
    if (argc != 10) {
        fprintf(stderr, "usage: %s NATIVE_SO GGUF OFFSET ROWS K ROW_BYTES OURS GGML q8_K|q8_0\n", argv[0]);
        return 2;
    }
    const long off = atol(argv[3]);
    const int rows = atoi(argv[4]), k = atoi(argv[5]), rowb = atoi(argv[6]);
    const int q8_0 = argv[9][3] == '0'; /* Q8_0 activations: 34-byte blocks of 32 */
    if (rows <= 0 || k <= 0 || k % 256 || rowb <= 0) return 2;
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    qs_dot ours = (qs_dot)dlsym(h, argv[7]);
    qs_quant q8k = (qs_quant)dlsym(h, q8_0 ? "qs_quantize_q8_0" : "qs_quantize_q8_K");
    ggml_dot theirs = (ggml_dot)dlsym(RTLD_DEFAULT, argv[8]);
    void (*cpu_init)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "ggml_cpu_init");
    if (!ours || !q8k || !theirs || !cpu_init) {
        fprintf(stderr, "missing symbol (%s or %s)\n", argv[7], argv[8]);
        return 1;
    }
    cpu_init();
    uint8_t *w = malloc((size_t)rows * rowb);
    float *x = malloc((size_t)k * 4);
    uint8_t *xq = malloc((size_t)k / 256 * (q8_0 ? 8 * 34 : 292));
    if (!w || !x || !xq) return 1;
    if (off < 0) { /* GGUF "random": random bytes, each block's leading fp16 (d for most types) made small */
        const int nblk = rowb / (int)-off;
        srand(1);
        for (size_t i = 0; i < (size_t)rows * rowb; ++i) w[i] = (uint8_t)(rand() >> 7);
        for (int r = 0; r < rows; ++r)
            for (int b = 0; b < nblk; ++b) {
                w[(size_t)r * rowb + (size_t)b * -off] = 0;
                w[(size_t)r * rowb + (size_t)b * -off + 1] = 0x20;
            }
    } else {
        FILE *f = fopen(argv[2], "rb");
        if (!f || fseek(f, off, SEEK_SET) || fread(w, 1, (size_t)rows * rowb, f) != (size_t)rows * rowb) return 1;
        fclose(f);
    }
    for (int i = 0; i < k; ++i) x[i] = (float)((i * 7919 % 1000) - 500) / 300.0f;
    q8k(x, xq, k);
    uint64_t best_o = UINT64_MAX, best_g = UINT64_MAX;
    double diff = 0.0, mag = 0.0;
    for (int pass = 0; pass < 15; ++pass) {
        float so = 0.0f, sg = 0.0f;
        const uint64_t t0 = ticks();
        for (int r = 0; r < rows; ++r) so += ours(k, w + (size_t)r * rowb, xq);
        const uint64_t t1 = ticks();
        for (int r = 0; r < rows; ++r) {
            float s;
            theirs(k, &s, 0, w + (size_t)r * rowb, 0, xq, 0, 1);
            sg += s;
        }
        const uint64_t t2 = ticks();
        if (t1 - t0 < best_o) best_o = t1 - t0;
        if (t2 - t1 < best_g) best_g = t2 - t1;
        diff = (double)so - (double)sg;
        mag = (double)sg;
    }
    const double blocks = (double)rows * (k / 256);
    printf("%.2f %.2f %.3g\n", (double)best_o / blocks, (double)best_g / blocks, mag != 0.0 ? diff / mag : diff);
    return 0;
}
