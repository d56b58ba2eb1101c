/* Quantscope native self-test: the kernel tests' checks (tests/test_native_kernels.py, test_native_nn.py,
 * test_native_pool.py, test_repack.py) in plain C, run against the scalar reference at every ISA level this CPU and
 * this build have, without Python. tests/run_native_checks.sh builds it with each toolchain (gcc, clang, the
 * aarch64 cross compiler, MinGW-w64) and runs it natively, under qemu-aarch64 and under Wine.
 *
 * Every type of the type table (qs_traits.h) with the relevant entry is checked:
 *   dequantize  every level bit for bit equal to the scalar one (realistic blocks; random bytes: NaN equals NaN)
 *   act         the activation quantizers (Q8_0, Q8_1, Q8_K, F16, BF16) byte for byte equal to the scalar ones
 *   dot         qs_vec_dot within 1e-5 of sum |w x| of a float64 evaluation of the same quantized scheme
 *   matmat      qs_matmat: each column within 1e-5 |x||w| of qs_matvec, 1 thread bit-equal to 2, within 2e-2
 *               (relative norm) of the float64 product, within rtol 1e-4 of the scalar level
 *   gemm        the tiled prefill GEMM within 1e-5 |x||w| of the row dots; its row decoders bit-equal to scalar
 *   repack      the repacked layout's scalar kernel within 1e-5 |x||w| of the row dots, SIMD bit-equal to it
 *   codes       the code types' dots at every level bit-equal to the scalar dot, and so their matmat (the row dots;
 *               at SIMD levels the prompt path of many columns, qs_iq_prefill)
 *   pool, nn    qs_parallel_for / qs_pool_selftest; rmsnorm, softmax, rope, swiglu, geglu, attention vs scalar
 * Weight rows come from the scalar reference quantizers (qs_qrow_*) where the type has one, else random code
 * bytes with small scales (tests/test_dequant.py's realistic_blocks). The data are deterministic and use no libm.
 *
 * Usage: qs_selftest [--isa NAME] [--quick]; --isa checks only that level (against scalar, always run as the
 * reference; a level this CPU or build lacks exits 2), --quick fewer sizes and pool jobs. Prints one line per check
 * ("ok   <check> <type> <level>" or "FAIL ...: detail") and a summary "selftest: N checks, F failed, levels:
 * scalar,avx2,..."; exit status 1 on any failure, 2 on bad usage.
 * C11 and the library's own API only (no POSIX calls), so it builds for Linux, macOS and Windows alike. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qs.h"
#include "qs_traits.h"

/* ------------------------------------------------------------------ reporting */
static int n_checks, n_failed;

static int report(int ok, const char *what, const char *type, int level, const char *detail) {
    ++n_checks;
    if (!ok) ++n_failed;
    printf("%s %s %s %s%s%s\n", ok ? "ok  " : "FAIL", what, type, qs_isa_name(level), ok || !detail ? "" : ": ",
           ok || !detail ? "" : detail);
    return ok;
}

/* ------------------------------------------------------------------ deterministic data */
static uint64_t rng_state;
static void seed(uint64_t s) { rng_state = s * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull; }
static uint64_t next_u64(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double uniform(void) { return (double)(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
/* roughly standard normal without libm: the sum of 12 uniforms minus 6 */
static float normal(void) {
    double s = 0;
    for (int i = 0; i < 12; ++i) s += uniform();
    return (float)(s - 6.0);
}
static double dabs(double v) { return v < 0 ? -v : v; }
static int is_nan(float v) { return v != v; }

/* tests/test_native_kernels.py's activations(): outliers, an all-zero block, exact .5 ties */
static void activations(float *x, int64_t n, int outliers) {
    for (int64_t i = 0; i < n; ++i) x[i] = normal();
    if (!outliers) return;
    for (int64_t i = 0; i < n; i += 97) x[i] *= 20;
    for (int64_t i = 5; i < 37 && i < n; ++i) x[i] = 0;
    for (int64_t i = 64; i < 96 && i < n; ++i) x[i] = 0.5f * (float)(i - 64);
}

static void *xmalloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        fprintf(stderr, "qs_selftest: out of memory (%lu bytes)\n", (unsigned long)n);
        exit(2);
    }
    return p;
}

static int64_t row_bytes(const qs_type_traits *t, int64_t k) { return k / t->elems * t->bytes; }

static void put_f16(uint8_t *p, float v) {
    uint16_t h = qs_fp32_to_fp16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* One weight row of k values: the scalar quantizer of the type, else random codes with small finite scales. */
static void weight_row(int type, uint8_t *dst, int64_t k) {
    const qs_type_traits *t = qs_traits(type);
    float *x = (float *)xmalloc((size_t)k * sizeof(float));
    for (int64_t i = 0; i < k; ++i) x[i] = normal();
    if (type == QS_F32) {
        memcpy(dst, x, (size_t)k * 4);
    } else if (type == QS_F16 || type == QS_BF16) {
        for (int64_t i = 0; i < k; ++i) {
            uint32_t u;
            memcpy(&u, &x[i], 4);
            uint16_t h = type == QS_F16 ? qs_fp32_to_fp16(x[i]) : (uint16_t)(u >> 16);
            dst[2 * i] = (uint8_t)h;
            dst[2 * i + 1] = (uint8_t)(h >> 8);
        }
    } else if (t->quantize_row) {
        t->quantize_row(x, dst, k, NULL);
    } else {
        int64_t nb = k / t->elems;
        for (int64_t i = 0; i < nb * t->bytes; ++i) dst[i] = (uint8_t)next_u64();
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t *blk = dst + b * t->bytes;
            float d = (float)(uniform() * 0.02 - 0.01);
            if (type == QS_NVFP4) { /* UE4M3 scales between 2^-6 and 2^-4 */
                for (int i = 0; i < 4; ++i) blk[i] = (uint8_t)(8 + next_u64() % 16);
            } else if (type == QS_MXFP4) { /* E8M0 exponent around 2^-6 */
                blk[0] = (uint8_t)(118 + next_u64() % 6);
            } else if (type == QS_IQ1_M) { /* d's 16 bits are the top nibbles of the four scale words at 48 */
                uint16_t h = qs_fp32_to_fp16(d);
                for (int i = 0; i < 4; ++i) blk[48 + 2 * i + 1] = (uint8_t)((blk[48 + 2 * i + 1] & 0x0F) | (((h >> (4 * i)) & 15) << 4));
            } else { /* the i-quants: the fp16 super-block scale leads the block */
                put_f16(blk, d);
            }
        }
    }
    free(x);
}

/* ------------------------------------------------------------------ levels */
static int levels[QS_TIERS], n_levels;

static void set_level(int level) {
    if (qs_isa_set(level) != level) {
        fprintf(stderr, "qs_selftest: cannot set ISA level %d\n", level);
        exit(2);
    }
}

static int bits_equal(const float *a, const float *b, int64_t n, int nan_equal) {
    for (int64_t i = 0; i < n; ++i) {
        if (nan_equal && is_nan(a[i]) && is_nan(b[i])) continue;
        if (memcmp(&a[i], &b[i], 4) != 0) return 0;
    }
    return 1;
}

/* numpy's allclose: |a - b| <= atol + rtol |b| */
static int allclose(const float *a, const float *b, int64_t n, double rtol, double atol, char *detail, size_t dl) {
    for (int64_t i = 0; i < n; ++i) {
        double d = dabs((double)a[i] - b[i]);
        if (!(d <= atol + rtol * dabs(b[i]))) {
            snprintf(detail, dl, "element %ld: %.9g vs %.9g", (long)i, a[i], b[i]);
            return 0;
        }
    }
    return 1;
}

/* ------------------------------------------------------------------ dequantize */
static void check_dequantize(int type, int quick) {
    const qs_type_traits *t = qs_traits(type);
    int64_t nblocks = (quick ? 64 : 600) * (t->elems >= 256 ? 1 : 256 / t->elems);
    int64_t k = nblocks * t->elems;
    uint8_t *raw = (uint8_t *)xmalloc((size_t)(nblocks * t->bytes));
    uint8_t *wild = (uint8_t *)xmalloc((size_t)(nblocks * t->bytes));
    float *ref = (float *)xmalloc((size_t)k * 4), *ref_wild = (float *)xmalloc((size_t)k * 4);
    float *got = (float *)xmalloc((size_t)k * 4);
    seed(1000 + (uint64_t)type);
    for (int64_t r = 0; r < nblocks; r += t->elems >= 256 ? 1 : 256 / t->elems)
        weight_row(type, raw + r * t->bytes, t->elems >= 256 ? t->elems : 256);
    for (int64_t i = 0; i < nblocks * t->bytes; ++i) wild[i] = (uint8_t)next_u64();
    set_level(QS_ISA_SCALAR);
    int rc = qs_dequantize(type, raw, ref, nblocks, 1) | qs_dequantize(type, wild, ref_wild, nblocks, 1);
    for (int li = 0; li < n_levels; ++li) {
        int L = levels[li];
        set_level(L);
        char detail[160] = "";
        int ok = rc == 0;
        if (!ok) snprintf(detail, sizeof detail, "scalar dequantize returned %d", rc);
        for (int threads = 1; ok && threads <= 2; ++threads) {
            ok = qs_dequantize(type, raw, got, nblocks, threads) == 0 && bits_equal(got, ref, k, 0);
            if (!ok) snprintf(detail, sizeof detail, "realistic blocks, %d thread(s)", threads);
            ok = ok && qs_dequantize(type, wild, got, nblocks, threads) == 0 && bits_equal(got, ref_wild, k, 1);
            if (!ok && !detail[0]) snprintf(detail, sizeof detail, "random bytes, %d thread(s)", threads);
        }
        report(ok, "dequantize", t->name, L, detail);
    }
    free(raw), free(wild), free(ref), free(ref_wild), free(got);
}

/* ------------------------------------------------------------------ activation quantizers */
static void check_activation(int act, int quick) {
    const qs_type_traits *t = qs_traits(act);
    int64_t n = quick ? 1024 : 4096;
    float *x = (float *)xmalloc((size_t)n * 4);
    int64_t nb = qs_act_row_bytes(act, n);
    uint8_t *ref = (uint8_t *)xmalloc((size_t)nb), *got = (uint8_t *)xmalloc((size_t)nb);
    seed(77 + (uint64_t)act);
    int trials = quick ? 8 : 40, bad_level[QS_TIERS] = {0};
    for (int trial = 0; trial < trials; ++trial) {
        double mag = trial % 3 == 0 ? 1e-3 : trial % 3 == 1 ? 1.0 : 50.0;
        activations(x, n, 1);
        for (int64_t i = 0; i < n; ++i) x[i] = (float)(x[i] * mag);
        for (int i = 0; i < 32; ++i) x[128 + i] = (float)i - 15.5f; /* amax 127 below: every x.5 a tie */
        x[140] = 127;
        float amax = 0;
        for (int i = 256; i < 512; ++i) amax = dabs(x[i]) > amax ? (float)dabs(x[i]) : amax;
        x[263] = -amax, x[356] = amax; /* Q8_K's signed max: a magnitude tie of opposite signs */
        set_level(QS_ISA_SCALAR);
        if (qs_quantize_activation(act, x, ref, n) != 0) bad_level[0] = 1;
        for (int li = 1; li < n_levels; ++li) {
            set_level(levels[li]);
            memset(got, 0xAA, (size_t)nb);
            if (qs_quantize_activation(act, x, got, n) != 0 || memcmp(got, ref, (size_t)nb) != 0) bad_level[li] = 1;
        }
    }
    for (int li = 0; li < n_levels; ++li) report(!bad_level[li] && !bad_level[0], "act", t->name, levels[li], "bytes differ from scalar");
    free(x), free(ref), free(got);
}

/* ------------------------------------------------------------------ dots against the float64 scheme */
/* Values of a quantized activation row as float64; sums: Q8_1's per-block s (d * sum of codes), else untouched. */
static int activation_values(int act, const uint8_t *xq, int64_t n, double *x, double *sums) {
    if (act == QS_Q8_0 || act == QS_Q8_1) {
        int size = act == QS_Q8_0 ? 34 : 36, off = act == QS_Q8_0 ? 2 : 4;
        for (int64_t b = 0; b < n / 32; ++b) {
            const uint8_t *p = xq + b * size;
            double d = qs_fp16_to_fp32(qs_load_u16(p));
            if (act == QS_Q8_1) sums[b] = qs_fp16_to_fp32(qs_load_u16(p + 2));
            for (int i = 0; i < 32; ++i) x[b * 32 + i] = (int8_t)p[off + i] * d;
        }
    } else if (act == QS_Q8_K) {
        for (int64_t b = 0; b < n / 256; ++b) {
            const uint8_t *p = xq + b * 292;
            double d = qs_load_f32(p);
            for (int i = 0; i < 256; ++i) x[b * 256 + i] = (int8_t)p[4 + i] * d;
        }
    } else if (act == QS_F16 || act == QS_BF16) {
        for (int64_t i = 0; i < n; ++i) {
            uint16_t h = qs_load_u16(xq + 2 * i);
            x[i] = act == QS_F16 ? qs_fp16_to_fp32(h) : qs_bf16_to_fp32(h);
        }
    } else if (act == QS_F32) {
        for (int64_t i = 0; i < n; ++i) x[i] = qs_load_f32(xq + 4 * i);
    } else {
        return 0;
    }
    return 1;
}

/* The byte offsets of the fp16 min and scale fields of the formats with a subtracted or added minimum
 * (tests/test_native_kernels.py's MIN_FIELD); -1: none. */
static void min_field(int type, int *mo, int *so) {
    *mo = *so = -1;
    if (type == QS_Q4_1 || type == QS_Q5_1) *mo = 2, *so = 0;
    if (type == QS_Q4_K || type == QS_Q5_K) *mo = 2, *so = 0;
    if (type == QS_Q2_K) *mo = 82, *so = 80;
}

static void deq_scalar(int type, const uint8_t *row, int64_t k, float *out) {
    set_level(QS_ISA_SCALAR);
    qs_dequantize(type, row, out, k / qs_traits(type)->elems, 1);
}

/* float64 weights exactly as the dot scheme sees them; for Q4_1/Q5_1 also the per-block mins (dot with Q8_1's s) */
static void exact_weights(int type, const uint8_t *row, int64_t k, double *w, double *mins) {
    const qs_type_traits *t = qs_traits(type);
    int64_t nb = k / t->elems, rb = row_bytes(t, k);
    int mo, so;
    min_field(type, &mo, &so);
    float *f = (float *)xmalloc((size_t)k * 4);
    if (mo < 0) {
        deq_scalar(type, row, k, f);
        for (int64_t i = 0; i < k; ++i) w[i] = f[i];
    } else {
        uint8_t *a = (uint8_t *)xmalloc((size_t)rb);
        memcpy(a, row, (size_t)rb);
        for (int64_t b = 0; b < nb; ++b) a[b * t->bytes + mo] = a[b * t->bytes + mo + 1] = 0;
        deq_scalar(type, a, k, f);
        for (int64_t i = 0; i < k; ++i) w[i] = f[i];
        if (t->elems == 32) {
            for (int64_t b = 0; b < nb; ++b) mins[b] = qs_fp16_to_fp32(qs_load_u16(row + b * t->bytes + mo));
        } else {
            memcpy(a, row, (size_t)rb);
            for (int64_t b = 0; b < nb; ++b) a[b * t->bytes + so] = a[b * t->bytes + so + 1] = 0;
            deq_scalar(type, a, k, f);
            for (int64_t i = 0; i < k; ++i) w[i] += f[i];
        }
        free(a);
    }
    free(f);
}

static void check_dot(int type, int quick) {
    const qs_type_traits *t = qs_traits(type);
    static const int64_t sizes[] = {256, 1024, 4864, 2816};
    int64_t kmax = 4864;
    uint8_t *w = (uint8_t *)xmalloc((size_t)row_bytes(t, kmax));
    uint8_t *xq = (uint8_t *)xmalloc((size_t)qs_act_row_bytes(t->act, kmax) + 64);
    float *x = (float *)xmalloc((size_t)kmax * 4);
    double *wd = (double *)xmalloc((size_t)kmax * 8), *xd = (double *)xmalloc((size_t)kmax * 8);
    double *mins = (double *)xmalloc((size_t)kmax / 32 * 8), *sums = (double *)xmalloc((size_t)kmax / 32 * 8);
    for (int li = 0; li < n_levels; ++li) {
        int L = levels[li], ok = 1;
        char detail[200] = "";
        seed(3000 + (uint64_t)type * 7 + (uint64_t)L);
        for (int si = 0; si < 4 && ok; ++si) {
            int64_t n = sizes[si];
            if (n % t->elems || (quick && si > 1)) continue;
            weight_row(type, w, n);
            activations(x, n, 1);
            int mo, so;
            min_field(type, &mo, &so);
            exact_weights(type, w, n, wd, mins);
            set_level(L);
            float got = 0;
            if (qs_quantize_activation(t->act, x, xq, n) != 0 || qs_vec_dot(type, n, w, xq, &got) != 0) {
                ok = 0, snprintf(detail, sizeof detail, "n %ld: a call returned an error", (long)n);
                break;
            }
            if (!activation_values(t->act, xq, n, xd, sums)) {
                ok = 0, snprintf(detail, sizeof detail, "no decoder for activation type %d", t->act);
                break;
            }
            double total = 0, scale = 0;
            for (int64_t i = 0; i < n; ++i) total += wd[i] * xd[i], scale += dabs(wd[i] * xd[i]);
            if (mo >= 0 && t->elems == 32)
                for (int64_t b = 0; b < n / 32; ++b) total += mins[b] * sums[b], scale += dabs(mins[b] * sums[b]);
            if (!(dabs(got - total) <= 1e-5 * scale + 1e-30)) {
                ok = 0;
                snprintf(detail, sizeof detail, "n %ld: %.9g vs float64 %.9g (scale %.3g)", (long)n, got, total, scale);
            }
        }
        report(ok, "dot", t->name, L, detail);
    }
    free(w), free(xq), free(x), free(wd), free(xd), free(mins), free(sums);
}

/* ------------------------------------------------------------------ matmat, GEMM, repack */
/* |x| |w|^T * 1e-5 + 1e-30: the float-summation-order bound of tests/test_native_kernels.py */
static void bound_of(const float *x, const float *dense, int64_t n_x, int64_t rows, int64_t k, double *bound) {
    for (int64_t j = 0; j < n_x; ++j)
        for (int64_t r = 0; r < rows; ++r) {
            double s = 0;
            for (int64_t i = 0; i < k; ++i) s += dabs(x[j * k + i]) * dabs(dense[r * k + i]);
            bound[j * rows + r] = s * 1e-5 + 1e-30;
        }
}

static int within(const float *a, const float *b, const double *bound, int64_t n, char *detail, size_t dl) {
    for (int64_t i = 0; i < n; ++i)
        if (!(dabs((double)a[i] - b[i]) <= bound[i])) {
            snprintf(detail, dl, "element %ld: %.9g vs %.9g (bound %.3g)", (long)i, a[i], b[i], bound[i]);
            return 0;
        }
    return 1;
}

static void check_matmat(int type, int quick) {
    const qs_type_traits *t = qs_traits(type);
    const int64_t rows = 48, k = 1024, n_x = 6;
    int64_t rb = row_bytes(t, k);
    uint8_t *w = (uint8_t *)xmalloc((size_t)(rows * rb));
    float *x = (float *)xmalloc((size_t)(n_x * k) * 4), *dense = (float *)xmalloc((size_t)(rows * k) * 4);
    float *y = (float *)xmalloc((size_t)(n_x * rows) * 4), *y1 = (float *)xmalloc((size_t)(n_x * rows) * 4);
    float *scalar = (float *)xmalloc((size_t)(n_x * rows) * 4), *yv = (float *)xmalloc((size_t)rows * 4);
    double *bound = (double *)xmalloc((size_t)(n_x * rows) * 8);
    (void)quick;
    seed(5000 + (uint64_t)type);
    for (int64_t r = 0; r < rows; ++r) weight_row(type, w + r * rb, k);
    activations(x, n_x * k, 0);
    deq_scalar(type, w, rows * k, dense);
    bound_of(x, dense, n_x, rows, k, bound);
    for (int li = 0; li < n_levels; ++li) {
        int L = levels[li], ok = 1;
        char detail[200] = "";
        set_level(L);
        if (qs_matmat(type, w, rows, k, x, n_x, y, 2) != 0 || qs_matmat(type, w, rows, k, x, n_x, y1, 1) != 0) {
            ok = 0, snprintf(detail, sizeof detail, "qs_matmat returned an error");
        } else if (!bits_equal(y, y1, n_x * rows, 0)) {
            ok = 0, snprintf(detail, sizeof detail, "1 thread differs from 2");
        }
        for (int64_t j = 0; j < n_x && ok; ++j) {
            ok = qs_matvec(type, w, rows, k, x + j * k, yv, 2) == 0 &&
                 within(yv, y + j * rows, bound + j * rows, rows, detail, sizeof detail);
            if (!ok) snprintf(detail + strlen(detail), sizeof detail - strlen(detail), " (matvec column %ld)", (long)j);
        }
        if (ok) { /* relative error against the float64 product */
            double num = 0, den = 0;
            for (int64_t j = 0; j < n_x; ++j)
                for (int64_t r = 0; r < rows; ++r) {
                    double s = 0;
                    for (int64_t i = 0; i < k; ++i) s += (double)x[j * k + i] * dense[r * k + i];
                    num += (y[j * rows + r] - s) * (y[j * rows + r] - s), den += s * s;
                }
            if (!(num < 4e-4 * den)) ok = 0, snprintf(detail, sizeof detail, "relative error vs float64 >= 2e-2");
        }
        if (ok && L == QS_ISA_SCALAR) memcpy(scalar, y, (size_t)(n_x * rows) * 4);
        if (ok && L != QS_ISA_SCALAR) {
            double amax = 0;
            for (int64_t i = 0; i < n_x * rows; ++i) amax = dabs(scalar[i]) > amax ? dabs(scalar[i]) : amax;
            ok = allclose(y, scalar, n_x * rows, 1e-4, 1e-4 * amax, detail, sizeof detail);
        }
        report(ok, "matmat", t->name, L, detail);
    }
    free(w), free(x), free(dense), free(y), free(y1), free(scalar), free(yv), free(bound);
}

static void check_gemm(int type, int quick) {
    const qs_type_traits *t = qs_traits(type);
    const int64_t rows = 50, k = t->elems == 32 ? 608 : 768, max_x = 13;
    static const int64_t n_xs[] = {4, 5, 13, 7};
    int64_t rb = row_bytes(t, k);
    uint8_t *w = (uint8_t *)xmalloc((size_t)(rows * rb));
    float *x = (float *)xmalloc((size_t)(max_x * k) * 4), *dense = (float *)xmalloc((size_t)(rows * k) * 4);
    float *got = (float *)xmalloc((size_t)(max_x * rows) * 4), *got1 = (float *)xmalloc((size_t)(max_x * rows) * 4);
    float *ref = (float *)xmalloc((size_t)(max_x * rows) * 4);
    double *bound = (double *)xmalloc((size_t)(max_x * rows) * 8);
    int64_t k64 = (k + 63) / 64 * 64, nmins = (k / t->gemm_group + 15) / 16 * 16;
    uint8_t *codes0 = (uint8_t *)xmalloc((size_t)k64), *codes = (uint8_t *)xmalloc((size_t)k64);
    float *ws0 = (float *)xmalloc((size_t)k64), *ws = (float *)xmalloc((size_t)k64);
    float *m0 = (float *)xmalloc((size_t)nmins * 4), *m = (float *)xmalloc((size_t)nmins * 4);
    seed(7000 + (uint64_t)type);
    for (int64_t r = 0; r < rows; ++r) weight_row(type, w + r * rb, k);
    activations(x, max_x * k, 1);
    deq_scalar(type, w, rows * k, dense);
    bound_of(x, dense, max_x, rows, k, bound);
    set_level(QS_ISA_SCALAR);
    int rc0 = qs_gemm_decode_row(type, w, k, 0, codes0, ws0, m0);
    int prev = qs_gemm_set(-1);
    for (int li = 0; li < n_levels; ++li) {
        int L = levels[li], ok = 1;
        char detail[200] = "";
        set_level(L);
        for (int xi = 0; xi < (quick ? 2 : 4) && ok; ++xi) {
            int64_t n_x = n_xs[xi];
            qs_gemm_set(1);
            ok = qs_matmat(type, w, rows, k, x, n_x, got, 2) == 0 && qs_matmat(type, w, rows, k, x, n_x, got1, 1) == 0;
            if (ok && !bits_equal(got, got1, n_x * rows, 0))
                ok = 0, snprintf(detail, sizeof detail, "n_x %ld: 1 thread differs from 2", (long)n_x);
            qs_gemm_set(0);
            ok = ok && qs_matmat(type, w, rows, k, x, n_x, ref, 2) == 0;
            if (ok && !within(got, ref, bound, n_x * rows, detail, sizeof detail))
                ok = 0, snprintf(detail + strlen(detail), sizeof detail - strlen(detail), " (n_x %ld)", (long)n_x);
            if (!ok && !detail[0]) snprintf(detail, sizeof detail, "n_x %ld: qs_matmat returned an error", (long)n_x);
        }
        if (ok && L != QS_ISA_SCALAR) { /* the row decoder of this level, bit for bit the scalar one */
            memset(codes, 0xAA, (size_t)k64), memset(ws, 0x7F, (size_t)k64), memset(m, 0x7F, (size_t)nmins * 4);
            ok = rc0 == 0 && qs_gemm_decode_row(type, w, k, 1, codes, ws, m) == 0 && !memcmp(codes, codes0, (size_t)k64) &&
                 !memcmp(ws, ws0, (size_t)(k64 / 4) * 4) && !memcmp(m, m0, (size_t)nmins * 4);
            if (!ok) snprintf(detail, sizeof detail, "the row decoder differs from the scalar one");
        }
        report(ok, "gemm", t->name, L, detail);
    }
    qs_gemm_set(prev);
    free(w), free(x), free(dense), free(got), free(got1), free(ref), free(bound);
    free(codes0), free(codes), free(ws0), free(ws), free(m0), free(m);
}

static void check_repack(int type, int quick) {
    const qs_type_traits *t = qs_traits(type);
    const int64_t rows = 48, k = 1024, max_x = 9;
    static const int64_t n_xs[] = {1, 4, 5, 9};
    int rtype = qs_repack_type(type);
    int64_t rb = row_bytes(t, k), nbytes = qs_repack_bytes(type, rows, k);
    if (rtype < 0 || nbytes <= 0) return;
    uint8_t *w = (uint8_t *)xmalloc((size_t)(rows * rb));
    uint8_t *rp = (uint8_t *)qs_alloc_huge(nbytes);
    float *x = (float *)xmalloc((size_t)(max_x * k) * 4), *dense = (float *)xmalloc((size_t)(rows * k) * 4);
    float *ref = (float *)xmalloc((size_t)(max_x * rows) * 4), *want = (float *)xmalloc((size_t)(max_x * rows) * 4);
    float *got = (float *)xmalloc((size_t)(max_x * rows) * 4);
    double *bound = (double *)xmalloc((size_t)(max_x * rows) * 8);
    seed(9000 + (uint64_t)type);
    for (int64_t r = 0; r < rows; ++r) weight_row(type, w + r * rb, k);
    activations(x, max_x * k, 1);
    deq_scalar(type, w, rows * k, dense);
    bound_of(x, dense, max_x, rows, k, bound);
    int ok0 = rp && qs_repack(type, w, rows * rb, rows, k, rp, nbytes, 0, rows / 16, 2) == 0;
    for (int li = 0; li < n_levels; ++li) {
        int L = levels[li], ok = ok0;
        char detail[200] = "";
        if (!ok) snprintf(detail, sizeof detail, "qs_repack failed");
        for (int xi = 0; xi < (quick ? 2 : 4) && ok; ++xi) {
            int64_t n_x = n_xs[xi];
            set_level(QS_ISA_SCALAR);
            ok = qs_matmat(rtype, rp, rows, k, x, n_x, ref, 1) == 0;
            if (ok && L == QS_ISA_SCALAR) { /* the scalar layout kernel against the row dots (float layouts: float64) */
                if (t->rp.act == QS_F32) {
                    for (int64_t j = 0; j < n_x; ++j)
                        for (int64_t r = 0; r < rows; ++r) {
                            double s = 0;
                            for (int64_t i = 0; i < k; ++i) s += (double)x[j * k + i] * dense[r * k + i];
                            want[j * rows + r] = (float)s;
                        }
                } else {
                    for (int64_t j = 0; j < n_x && ok; ++j) ok = qs_matvec(type, w, rows, k, x + j * k, want + j * rows, 1) == 0;
                }
                ok = ok && within(ref, want, bound, n_x * rows, detail, sizeof detail);
            }
            /* BF16's vdpbf16ps kernels (AVX-512 with AVX512_BF16): the scalar reference's exact products may enter
             * a pair in the other order, or at once, and subnormals flush: within one rounding of the running sum
             * per step, k 2^-24 |x||w| (the bound's 1e-5, scaled; 1.01 for the BF16-rounded |x|) */
            const int dp = type == QS_BF16 && L >= QS_ISA_AVX512 && QS_ARCH_X86 && qs_bf16_dot_set(-1);
            if (ok && dp) {
                set_level(L);
                for (int threads = 2; threads >= 1 && ok; --threads) {
                    ok = qs_matmat(rtype, rp, rows, k, x, n_x, got, threads) == 0;
                    for (int64_t i = 0; i < n_x * rows && ok; ++i)
                        if (!(dabs((double)got[i] - ref[i]) <= bound[i] * (k * 0x1p-24 / 1e-5) * 1.01))
                            ok = 0, snprintf(detail, sizeof detail, "vdpbf16ps n_x %ld: element %ld %.9g vs %.9g",
                                             (long)n_x, (long)i, got[i], ref[i]);
                }
                qs_bf16_dot_set(0); /* and the AVX-512F fallback bit for bit, below */
            }
            if (ok && L != QS_ISA_SCALAR) {
                set_level(L);
                for (int threads = 2; threads >= 1 && ok; --threads) {
                    int rc = qs_matmat(rtype, rp, rows, k, x, n_x, got, threads);
                    if (rc != 0) {
                        ok = 0, snprintf(detail, sizeof detail, "n_x %ld, %d thread(s): qs_matmat returned %d", (long)n_x,
                                         threads, rc);
                    } else if (!bits_equal(got, ref, n_x * rows, 0)) {
                        int64_t i = 0;
                        while (!memcmp(&got[i], &ref[i], 4)) ++i;
                        ok = 0, snprintf(detail, sizeof detail,
                                         "n_x %ld, %d thread(s): element %ld %.9g, the scalar layout kernel %.9g",
                                         (long)n_x, threads, (long)i, got[i], ref[i]);
                    }
                }
            }
            if (dp) qs_bf16_dot_set(1);
            if (!ok && !detail[0]) snprintf(detail, sizeof detail, "n_x %ld: a call returned an error", (long)n_x);
        }
        report(ok, "repack", t->name, L, detail);
    }
    if (rp) qs_free_huge(rp, nbytes);
    free(w), free(x), free(dense), free(ref), free(want), free(got), free(bound);
}

/* The code types (i-quants, TQ, FP4: t->codes): the dots sum exact integers and do the scalar reference's float
 * operations in its order, so every level gives the scalar dot's bits; so do the row-dot matmat and, for many
 * columns, the prompt path that decodes each 16-row group once (qs_iq_prefill; tests/test_native_iquants.py). */
static void check_codes(int type, int quick) {
    const qs_type_traits *t = qs_traits(type);
    const int64_t rows = 32, k = 1536, n_x = 9;
    int64_t rb = row_bytes(t, k), xb = qs_act_row_bytes(t->act, k);
    uint8_t *w = (uint8_t *)xmalloc((size_t)(rows * rb)), *xq = (uint8_t *)xmalloc((size_t)(n_x * xb));
    float *x = (float *)xmalloc((size_t)(n_x * k) * 4), *scalar = (float *)xmalloc((size_t)(n_x * rows) * 4);
    float *dots = (float *)xmalloc((size_t)(n_x * rows) * 4), *got = (float *)xmalloc((size_t)(n_x * rows) * 4);
    seed(11000 + (uint64_t)type);
    for (int64_t r = 0; r < rows; ++r) weight_row(type, w + r * rb, k);
    activations(x, n_x * k, 0);
    int prev = qs_gemm_set(-1);
    for (int li = 0; li < n_levels; ++li) {
        int L = levels[li], ok = 1;
        char detail[200] = "";
        set_level(L);
        for (int64_t j = 0; j < n_x && ok; ++j) {
            ok = qs_quantize_activation(t->act, x + j * k, xq + j * xb, k) == 0;
            for (int64_t r = 0; r < rows && ok; ++r) ok = qs_vec_dot(type, k, w + r * rb, xq + j * xb, &dots[j * rows + r]) == 0;
        }
        if (!ok) snprintf(detail, sizeof detail, "a dot returned an error");
        if (ok && L == QS_ISA_SCALAR) memcpy(scalar, dots, (size_t)(n_x * rows) * 4);
        if (ok && !bits_equal(dots, scalar, n_x * rows, 0)) ok = 0, snprintf(detail, sizeof detail, "dots differ from the scalar dots");
        /* gemm off, 7 rows: the row dots; on a SIMD level with a prompt layout, 32 rows: qs_iq_prefill (the scalar
         * level and the FP4 types take the tiled GEMM there: equal up to summation order, checked under "gemm") */
        int last = L != QS_ISA_SCALAR && t->rp_codes.blk;
        for (int gemm = 0; gemm <= last && ok; ++gemm) {
            qs_gemm_set(gemm);
            int64_t nr = gemm ? rows : 7;
            ok = qs_matmat(type, w, nr, k, x, quick ? 5 : n_x, got, 2) == 0;
            for (int64_t j = 0; j < (quick ? 5 : n_x) && ok; ++j)
                ok = bits_equal(got + j * nr, dots + j * rows, nr, 0);
            if (!ok) snprintf(detail, sizeof detail, "matmat of %d rows (prefill GEMM %s) differs from the row dots", (int)nr,
                              gemm ? "on" : "off");
        }
        if (ok && L != QS_ISA_SCALAR && t->rp_codes.blk && qs_iq_prefill_usable(type, rows, k) != 1)
            ok = 0, snprintf(detail, sizeof detail, "qs_iq_prefill_usable is not 1 at a SIMD level");
        report(ok, "codes", t->name, L, detail);
    }
    qs_gemm_set(prev);
    free(w), free(xq), free(x), free(scalar), free(dots), free(got);
}

/* ------------------------------------------------------------------ pool */
typedef struct {
    int64_t *hits;
} pf_ctx;
static void pf_task(void *ctx, int64_t task) { ((pf_ctx *)ctx)->hits[task] += task + 1; }

static void check_pool(int quick) {
    char detail[160] = "";
    int ok = 1;
    const int64_t n = 1000;
    pf_ctx c = {(int64_t *)xmalloc((size_t)n * 8)};
    for (int threads = 1; threads <= 8 && ok; threads *= 2)
        for (int rep = 0; rep < 20 && ok; ++rep) {
            int64_t tasks = 1 + (rep * 37 + threads) % n;
            memset(c.hits, 0, (size_t)n * 8);
            qs_parallel_for(tasks, pf_task, &c, threads);
            for (int64_t i = 0; i < n && ok; ++i)
                if (c.hits[i] != (i < tasks ? i + 1 : 0)) {
                    ok = 0, snprintf(detail, sizeof detail, "%d threads, %d tasks: task %d ran %s", threads, (int)tasks,
                                     (int)i, c.hits[i] ? "twice or out of range" : "never");
                }
        }
    report(ok, "pool", "parallel_for", QS_ISA_SCALAR, detail);
    free(c.hits);
    static const int params[][2] = {{8, 1000}, {8, 100}, {4, 300}, {3, 1000}};
    for (int i = 0; i < (quick ? 2 : 4); ++i) {
        int64_t bad = qs_pool_selftest(quick ? 100 : 500, params[i][0], params[i][1]);
        snprintf(detail, sizeof detail, "%d threads, pause %d us: %d bad", params[i][0], params[i][1], (int)bad);
        char name[48];
        snprintf(name, sizeof name, "selftest/%dt/%dus", params[i][0], params[i][1]);
        report(bad == 0, "pool", name, QS_ISA_SCALAR, detail);
    }
}

/* ------------------------------------------------------------------ nn kernels (every level vs scalar) */
#define NN_N 896
#define NN_ROWS 5
static void check_nn(void) {
    static float x[NN_ROWS * NN_N], wv[NN_N], ref[NN_ROWS * NN_N], got[NN_ROWS * NN_N], up[NN_ROWS * NN_N];
    seed(42);
    for (int i = 0; i < NN_ROWS * NN_N; ++i) x[i] = normal() * 3, up[i] = normal();
    for (int i = 0; i < NN_N; ++i) wv[i] = normal();
    enum { T = 4, H = 3, D = 64 };
    static const int32_t pos[T] = {0, 1, 17, 4095};
    /* attention: 6 query heads over 2 KV heads, 40 cached positions */
    enum { CTX = 40, KVH = 2, QH = 6, QN = 4 };
    static float kc[CTX * KVH * D], vc[CTX * KVH * D], q[QN * QH * D], ao[QN * QH * D], ao_ref[QN * QH * D];
    static const int32_t q_pos[QN] = {0, 9, 20, 29};
    for (int i = 0; i < CTX * KVH * D; ++i) kc[i] = normal(), vc[i] = normal();
    for (int i = 0; i < QN * QH * D; ++i) q[i] = normal();
    /* the cache types (QS_KV_*): the same rows stored in each, read by every level's dots and V adds */
    static const int kv_types[4] = {QS_KV_F16, QS_KV_BF16, QS_KV_Q8_0, QS_KV_Q4_0};
    static uint8_t kt[4][CTX * KVH * D * 2], vt[4][CTX * KVH * D * 2];
    for (int t = 0; t < 4; ++t)
        if (qs_kv_store(kt[t], kv_types[t], 0, kc, CTX * KVH, D) || qs_kv_store(vt[t], kv_types[t], 0, vc, CTX * KVH, D))
            report(0, "nn", "kv_store", QS_ISA_SCALAR, "qs_kv_store returned an error");
    const char *names[] = {"rmsnorm",          "softmax",        "rope",
                           "rope_neox",        "swiglu",         "geglu_tanh",
                           "attention",        "attention_f16_bf16", "attention_bf16_q8_0",
                           "attention_q8_0_q4_0", "attention_q4_0_f16"};
    for (int which = 0; which < 11; ++which)
        for (int li = 0; li < n_levels; ++li) {
            int L = levels[li], ok = 1;
            char detail[160] = "";
            for (int pass = 0; pass < 2; ++pass) { /* pass 0: scalar reference, pass 1: this level */
                float *out = pass ? got : ref;
                set_level(pass ? L : QS_ISA_SCALAR);
                switch (which) {
                case 0: qs_rmsnorm(x, wv, out, NN_ROWS, NN_N, 1e-6f); break;
                case 1:
                    memcpy(out, x, sizeof x);
                    qs_softmax(out, NN_ROWS, NN_N);
                    break;
                case 2:
                case 3:
                    memcpy(out, x, sizeof(float) * T * H * D);
                    ok = ok && qs_rope(out, T, H, D, which == 2 ? 64 : 48, pos, 1e6f, 1.0f, which == 3, NULL) == 0;
                    break;
                case 4: qs_swiglu(x, up, out, NN_ROWS * NN_N); break;
                case 5: qs_geglu_tanh(x, up, out, NN_ROWS * NN_N); break;
                case 6:
                    ok = ok && qs_attention(q, QN, q_pos, QH, D, kc, vc, 0, KVH, 30, CTX, 5, 0.125f, pass ? ao : ao_ref,
                                            2) == 0;
                    break;
                default: /* K and V of one type, another V type beside (the four types in a ring) */
                    ok = ok && qs_attention_kv(q, QN, q_pos, QH, D, kt[which - 7], vt[(which - 6) % 4],
                                               kv_types[which - 7], kv_types[(which - 6) % 4], KVH, 30, CTX, 0, 0.125f,
                                               0.0f, NULL, pass ? ao : ao_ref, 2) == 0;
                }
            }
            if (!ok) snprintf(detail, sizeof detail, "a call returned an error");
            /* the Python tests' tolerances against float64, doubled: both sides may be that far off */
            if (ok && which == 0) ok = allclose(got, ref, NN_ROWS * NN_N, 2e-5, 2e-6, detail, sizeof detail);
            if (ok && which == 1) ok = allclose(got, ref, NN_ROWS * NN_N, 2e-5, 2e-7, detail, sizeof detail);
            if (ok && (which == 2 || which == 3)) ok = allclose(got, ref, T * H * D, 2e-5, 4e-5, detail, sizeof detail);
            if (ok && (which == 4 || which == 5)) ok = allclose(got, ref, NN_ROWS * NN_N, 2e-5, 2e-6, detail, sizeof detail);
            if (ok && which >= 6) ok = allclose(ao, ao_ref, QN * QH * D, 2e-4, 2e-5, detail, sizeof detail);
            report(ok, "nn", names[which], L, detail);
        }
}

/* ------------------------------------------------------------------ main */
static int usage(const char *msg) {
    fprintf(stderr, "qs_selftest: %s\nusage: qs_selftest [--isa NAME] [--quick]\n", msg);
    return 2;
}

int main(int argc, char **argv) {
    const char *only = NULL;
    int quick = 0;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) only = argv[++i];
        else return usage("unknown argument");
    }
    setvbuf(stdout, NULL, _IONBF, 0);
    int detected = qs_isa_detected();
    levels[n_levels++] = QS_ISA_SCALAR; /* the reference every level is compared with */
    for (int L = 1; L <= detected; ++L)
        if (!only || !strcmp(only, qs_isa_name(L))) levels[n_levels++] = L;
    if (only && strcmp(only, "scalar") && n_levels == 1) {
        fprintf(stderr, "qs_selftest: ISA level %s is not on this CPU (%s, best %s)\n", only, qs_arch_name(),
                qs_isa_name(detected));
        return 2;
    }
    printf("selftest: arch %s, detected %s%s%s\n", qs_arch_name(), qs_isa_name(detected),
           qs_cpu_has_vbmi() ? " (vbmi)" : "", quick ? ", quick" : "");
    int bad_row = qs_traits_check();
    report(bad_row < 0, "traits", "table", QS_ISA_SCALAR, "inconsistent row");

    for (int act = 0; act < QS_NTYPES; ++act)
        if (qs_traits(act)->act_quantize) check_activation(act, quick);
    for (int type = 0; type < QS_NTYPES; ++type) {
        const qs_type_traits *t = qs_traits(type);
        if (!t->deq[0]) continue;
        check_dequantize(type, quick);
        if (t->dot[0]) {
            check_dot(type, quick);
            check_matmat(type, quick);
        }
        if (t->panel[0]) check_gemm(type, quick);
        if (t->dot[0]) check_repack(type, quick);
        if (t->codes && t->dot[0]) check_codes(type, quick);
    }
    check_pool(quick);
    check_nn();

    printf("selftest: %d checks, %d failed, levels: ", n_checks, n_failed);
    for (int li = 0; li < n_levels; ++li) printf("%s%s", li ? "," : "", qs_isa_name(levels[li]));
    printf("\n");
    return n_failed ? 1 : 0;
}
