/* The one place that knows which CPU family the library is compiled for (docs/native.md, "Platforms").
 *
 * Every per-ISA kernel file guards its whole body with QS_ARCH_X86 or QS_ARCH_ARM64, so the build compiles every
 * file on every target (a macOS universal2 build compiles each file once per architecture) and the intrinsics of
 * one family never reach the other's compiler. Generic files include no intrinsics header at all.
 *
 * ISA levels, per family (qs_dispatch.c detects them; the type table's per-ISA slots are indexed by them):
 *   x86-64: 0 scalar, 1 AVX2 + FMA + F16C, 2 AVX-512 F/BW/VL + VNNI (tier 3: the same with VBMI)
 *   ARM64:  0 scalar, 1 NEON (ARMv8.0, e.g. Cortex-A72), 2 + dot product (SDOT/UDOT: Apple M1, Neoverse N1),
 *           3 + int8 matrix multiply (I8MM: SMMLA/USDOT; Apple M2+, Neoverse V1/N2, Snapdragon X)
 * Kernels of a level above the compiler's baseline carry that level's target attribute (QS_TARGET_*), so one
 * binary runs on every CPU of its family and picks its kernels at run time. */
#ifndef QS_ARCH_H
#define QS_ARCH_H

#if defined(__x86_64__) || defined(_M_X64)
#define QS_ARCH_X86 1
#define QS_ARCH_ARM64 0
#define QS_ARCH_NAME "x86_64"
#elif defined(__aarch64__) || defined(_M_ARM64)
#define QS_ARCH_X86 0
#define QS_ARCH_ARM64 1
#define QS_ARCH_NAME "arm64"
#else
#define QS_ARCH_X86 0
#define QS_ARCH_ARM64 0
#define QS_ARCH_NAME "generic"
#endif

#if QS_ARCH_X86
#define QS_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define QS_TARGET_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
/* AVX512_BF16 (vdpbf16ps): not a level of its own; the BF16 kernels of the AVX-512 slot ask qs_bf16_dot_now */
#define QS_TARGET_AVX512BF16 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16")))
#endif

/* No silent multiply-add fusion outside x86: ARM64 has FMA in its baseline, and compilers would fuse a * b + c in
 * the scalar code (GCC's default -ffp-contract=fast), changing its rounding. With this, the scalar references, the
 * quantizers (byte-identical to llama-quantize's) and every float result of plain C give the same bits as on
 * x86-64, whose baseline has no FMA. Kernels that want a fused multiply-add say so (fmaf, vfmaq_f32). */
#if !QS_ARCH_X86
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#endif

#if QS_ARCH_ARM64
/* NEON (Advanced SIMD) is part of ARMv8.0-A: no attribute. The dot-product and int8-matrix levels need one
 * unless the baseline already has them (Apple's arm64 baseline has dotprod). GCC spells the extension as an
 * architecture; clang from 16 (Apple clang from 15) as a feature. Older clang guards the intrinsics with the
 * baseline's macros, so without the baseline it builds those levels empty and the CPU runs the level below. */
#if defined(__clang__) && defined(__apple_build_version__)
#define QS_CLANG_TARGETS (__clang_major__ >= 15)
#elif defined(__clang__)
#define QS_CLANG_TARGETS (__clang_major__ >= 16)
#else
#define QS_CLANG_TARGETS 0
#endif

#if defined(__ARM_FEATURE_DOTPROD)
#define QS_TARGET_DOTPROD
#define QS_HAVE_DOTPROD 1
#elif QS_CLANG_TARGETS
#define QS_TARGET_DOTPROD __attribute__((target("dotprod")))
#define QS_HAVE_DOTPROD 1
#elif defined(__GNUC__) && !defined(__clang__)
#define QS_TARGET_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#define QS_HAVE_DOTPROD 1
#endif

#if defined(__ARM_FEATURE_MATMUL_INT8) && defined(__ARM_FEATURE_DOTPROD)
#define QS_TARGET_I8MM
#define QS_HAVE_I8MM 1
#elif QS_CLANG_TARGETS
#define QS_TARGET_I8MM __attribute__((target("dotprod,i8mm")))
#define QS_HAVE_I8MM 1
#elif defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10
#define QS_TARGET_I8MM __attribute__((target("arch=armv8.6-a+dotprod+i8mm")))
#define QS_HAVE_I8MM 1
#endif

#ifndef QS_HAVE_DOTPROD
#define QS_HAVE_DOTPROD 0
#endif
#ifndef QS_HAVE_I8MM
#define QS_HAVE_I8MM 0
#endif
#endif

/* A spin-wait hint for the thread pool. */
#if QS_ARCH_X86
#define QS_CPU_RELAX() __builtin_ia32_pause()
#elif QS_ARCH_ARM64
#define QS_CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define QS_CPU_RELAX() ((void)0)
#endif

#endif
