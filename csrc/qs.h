/* Quantscope native library: shared internals (not parsed by cffi). */
#ifndef QS_H
#define QS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "qs_arch.h"
#include "qs_api_quant.h"
#include "qs_api_nn.h"
#include "qs_api_vocab.h"
#include "qs_api_quantize.h"

/* ISA levels (qs_arch.h): the same numbers name different instruction sets on each CPU family */
enum { QS_ISA_SCALAR = 0, QS_ISA_AVX2 = 1, QS_ISA_AVX512 = 2 };
enum { QS_ISA_NEON = 1, QS_ISA_DOTPROD = 2, QS_ISA_I8MM = 3 };
/* The kernel tables' per-ISA slots (qs_traits.h): the levels, then on x86 AVX-512 with VBMI (kernels that need
 * AVX512_VBMI too); on ARM64 the levels themselves. */
enum { QS_TIER_VBMI = 3, QS_TIERS = 4 };

/* ggml type ids used by the kernels */
enum {
    QS_F32 = 0, QS_F16 = 1, QS_Q4_0 = 2, QS_Q4_1 = 3, QS_Q5_0 = 6, QS_Q5_1 = 7, QS_Q8_0 = 8, QS_Q8_1 = 9,
    QS_Q2_K = 10, QS_Q3_K = 11, QS_Q4_K = 12, QS_Q5_K = 13, QS_Q6_K = 14, QS_Q8_K = 15, QS_IQ2_XXS = 16,
    QS_IQ2_XS = 17, QS_IQ3_XXS = 18, QS_IQ1_S = 19, QS_IQ4_NL = 20, QS_IQ3_S = 21, QS_IQ2_S = 22, QS_IQ4_XS = 23,
    QS_IQ1_M = 29, QS_BF16 = 30, QS_TQ1_0 = 34, QS_TQ2_0 = 35, QS_MXFP4 = 39, QS_NVFP4 = 40
};

/* A repacked weight's type id: QS_RP_FLAG | ggml type (csrc/qs_repack.h). */
#define QS_RP_FLAG 0x100

extern int qs_isa_level; /* active level (read by every dispatcher) */

/* IEEE binary16 -> binary32, exact (NaN payloads kept, as numpy does). */
static inline float qs_fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do { man <<= 1; ++e; } while (!(man & 0x400u));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* binary32 -> binary16, round to nearest even (ggml / numpy semantics). */
static inline uint16_t qs_fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) return (uint16_t)(sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u | ((ax >> 13) & 0x3FFu) : 0));
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* overflow after rounding */
    if (ax < 0x38800000u) { /* subnormal or zero in half */
        if (ax < 0x33000000u) return (uint16_t)sign; /* < 2^-25 rounds to 0 */
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t half = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (half & 1u))) ++half;
        return (uint16_t)(sign | half);
    }
    uint32_t h = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return (uint16_t)(sign | h);
}

static inline float qs_bf16_to_fp32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* fp32 -> bf16 as ggml: NaN -> quiet NaN, otherwise round to nearest even. */
static inline uint16_t qs_fp32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 64u);
    return (uint16_t)((u + (0x7FFFu + ((u >> 16) & 1u))) >> 16);
}

static inline uint16_t qs_load_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t qs_load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t qs_load_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline float qs_load_f32(const uint8_t *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}

/* Thread pool: run fn(ctx, task) for task in [0, n_tasks) on up to n_threads threads (caller included).
 * Persistent threads (qs_os.h: pthreads, or Win32 threads on Windows), created on first use, re-created in a forked
 * child. Safe to call concurrently: calls are serialised on the pool (the GIL is released, so two Python threads
 * may call in). */
typedef void (*qs_task_fn)(void *ctx, int64_t task);
void qs_parallel_for(int64_t n_tasks, qs_task_fn fn, void *ctx, int n_threads);

#endif
