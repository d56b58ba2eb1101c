/* CPU feature detection and the active ISA level: the one place that asks the CPU what it has (qs_arch.h names
 * the levels of each CPU family). */
#include "qs.h"
#include "qs_slots.h"

#if QS_ARCH_X86 && defined(_MSC_VER) && !defined(__clang__)
#include <intrin.h> /* __cpuidex, _xgetbv: MSVC's cl itself (GCC, clang, MinGW-w64 and clang-cl use inline asm) */
#elif QS_ARCH_ARM64 && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1UL << 1)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif
#elif QS_ARCH_ARM64 && defined(__APPLE__)
#include <sys/sysctl.h>
#elif QS_ARCH_ARM64 && defined(_WIN32)
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>
/* winnt.h's numbers; older SDK and MinGW headers lack the names, and Windows answers FALSE for a number it does
 * not know, so naming them here is safe. */
#ifndef PF_ARM_V82_DP_INSTRUCTIONS_AVAILABLE
#define PF_ARM_V82_DP_INSTRUCTIONS_AVAILABLE 43
#endif
#ifndef PF_ARM_V82_I8MM_INSTRUCTIONS_AVAILABLE
#define PF_ARM_V82_I8MM_INSTRUCTIONS_AVAILABLE 66
#endif
#endif

int qs_isa_level = -1;

#if QS_ARCH_X86
/* x86 features straight from CPUID and XGETBV, the same on every compiler (__builtin_cpu_supports differs
 * between them: clang before 15 has no "f16c", and clang-cl's needs compiler-rt's __cpu_model, which MSVC's
 * linker does not bring in). As GCC's and compiler-rt's own checks do, a vector extension counts only when the OS
 * saves its registers (XCR0). */
static void cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
#if defined(_MSC_VER) && !defined(__clang__)
    int v[4];
    __cpuidex(v, (int)leaf, (int)sub);
    for (int i = 0; i < 4; ++i) r[i] = (unsigned)v[i];
#else
    /* the instruction itself: no <cpuid.h>, whose __cpuid macro collides with <intrin.h>'s under clang-cl */
    __asm__ __volatile__("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
#endif
}

static unsigned long long xcr0(void) {
#if defined(_MSC_VER) && !defined(__clang__)
    return _xgetbv(0);
#else
    unsigned lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0)); /* the instruction: no -mxsave needed */
    return ((unsigned long long)hi << 32) | lo;
#endif
}

/* X_AVX2: with FMA and F16C; X_AVX512: F, BW, VL and VNNI; X_BF16: AVX512_BF16 (vdpbf16ps) */
enum { X_AVX2 = 1, X_AVX512 = 2, X_VBMI = 4, X_BF16 = 8 };

static int x86_features(void) {
    unsigned r0[4], r1[4], r7[4] = {0, 0, 0, 0}, r71[4] = {0, 0, 0, 0};
    cpuid(0, 0, r0);
    if (r0[0] < 1) return 0;
    cpuid(1, 0, r1);
    if (r0[0] >= 7) cpuid(7, 0, r7);
    if (r0[0] >= 7 && r7[0] >= 1) cpuid(7, 1, r71); /* leaf 7 sub-leaf 1: EAX bit 5 AVX512_BF16 */
    const unsigned c1 = r1[2], b7 = r7[1], c7 = r7[2];
    if (!(c1 & (1u << 27))) return 0; /* OSXSAVE: without it XGETBV is undefined and no AVX state is saved */
    const unsigned long long x = xcr0();
    const int os_avx = (x & 0x6) == 0x6; /* XMM and YMM state */
#if defined(__APPLE__)
    const int os_avx512 = os_avx; /* macOS enables the AVX-512 state on first use (as compiler-rt assumes too) */
#else
    const int os_avx512 = (x & 0xe6) == 0xe6; /* and opmask, ZMM0-15 upper halves, ZMM16-31 */
#endif
    int f = 0;
    if (os_avx && (c1 & (1u << 28)) && (c1 & (1u << 12)) && (c1 & (1u << 29)) && (b7 & (1u << 5)))
        f |= X_AVX2; /* AVX, FMA, F16C, AVX2 */
    if (os_avx512 && (b7 & (1u << 16)) && (b7 & (1u << 30)) && (b7 & (1u << 31)) && (c7 & (1u << 11)))
        f |= X_AVX512; /* AVX512F, AVX512BW, AVX512VL, AVX512_VNNI */
    if (os_avx512 && (b7 & (1u << 16)) && (c7 & (1u << 1))) f |= X_VBMI; /* AVX512_VBMI */
    if (os_avx512 && (b7 & (1u << 16)) && (r71[0] & (1u << 5))) f |= X_BF16; /* AVX512_BF16 */
    return f;
}

static int x86_cached(void) {
    static int f = -1; /* a benign race: every thread computes the same value */
    if (f < 0) f = x86_features();
    return f;
}
#endif

#if QS_ARCH_ARM64 && defined(__APPLE__)
static int sysctl_flag(const char *name) {
    int v = 0;
    size_t len = sizeof v;
    return sysctlbyname(name, &v, &len, NULL, 0) == 0 && v != 0;
}
#endif

/* The CPU's best level, capped by what this build compiled (an older clang builds no dotprod/i8mm kernels). */
static int detect(void) {
    int lvl = QS_ISA_SCALAR;
#if QS_ARCH_X86
    const int f = x86_cached();
    if (f & X_AVX2) lvl = QS_ISA_AVX2;
    if (lvl == QS_ISA_AVX2 && (f & X_AVX512)) lvl = QS_ISA_AVX512;
#elif QS_ARCH_ARM64
    int dot = 0, i8mm = 0;
    lvl = QS_ISA_NEON; /* Advanced SIMD is mandatory in ARMv8-A */
#if defined(__linux__)
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    if (!(hw & HWCAP_ASIMD)) lvl = QS_ISA_SCALAR;
    dot = (hw & HWCAP_ASIMDDP) != 0;
    i8mm = (hw2 & HWCAP2_I8MM) != 0;
#elif defined(__APPLE__)
    dot = sysctl_flag("hw.optional.arm.FEAT_DotProd");
    i8mm = sysctl_flag("hw.optional.arm.FEAT_I8MM");
#elif defined(_WIN32)
    dot = IsProcessorFeaturePresent(PF_ARM_V82_DP_INSTRUCTIONS_AVAILABLE) != 0;
    i8mm = IsProcessorFeaturePresent(PF_ARM_V82_I8MM_INSTRUCTIONS_AVAILABLE) != 0;
#endif
    if (lvl == QS_ISA_NEON && dot && QS_HAVE_DOTPROD) lvl = QS_ISA_DOTPROD;
    if (lvl == QS_ISA_DOTPROD && i8mm && QS_HAVE_I8MM) lvl = QS_ISA_I8MM;
#endif
    return lvl;
}

int qs_isa_detected(void) {
    static int detected = -1;
    if (detected < 0) detected = detect();
    return detected;
}

int qs_isa_tier_now = -1;

static void set_level(int level) {
    qs_isa_tier_now = QS_ARCH_X86 && level >= QS_ISA_AVX512 && qs_cpu_has_vbmi() ? QS_TIER_VBMI : level;
    qs_isa_level = level;
}

int qs_isa_get(void) {
    if (qs_isa_level < 0) set_level(qs_isa_detected());
    return qs_isa_level;
}

int qs_isa_set(int level) {
    int d = qs_isa_detected();
    if (level < 0 || level > d) level = d;
    set_level(level);
    return level;
}

int qs_isa_tier_first(void) {
    qs_isa_get();
    return qs_isa_tier_now;
}

const char *qs_isa_name(int level) {
#if QS_ARCH_X86
    static const char *const names[] = {"scalar", "avx2", "avx512"};
#elif QS_ARCH_ARM64
    static const char *const names[] = {"scalar", "neon", "dotprod", "i8mm"};
#else
    static const char *const names[] = {"scalar"};
#endif
    return level >= 0 && level < (int)(sizeof names / sizeof names[0]) ? names[level] : NULL;
}

const char *qs_arch_name(void) { return QS_ARCH_NAME; }

int qs_cpu_has_vbmi(void) {
#if QS_ARCH_X86
    return (x86_cached() & X_VBMI) ? 1 : 0;
#else
    return 0;
#endif
}

int qs_cpu_has_avx512bf16(void) {
#if QS_ARCH_X86
    return (x86_cached() & X_BF16) ? 1 : 0;
#else
    return 0;
#endif
}

/* Whether the AVX-512 BF16 kernels use vdpbf16ps: -1 until first asked, then the CPU's answer; qs_bf16_dot_set
 * turns it off to run the AVX-512F fallback on a CPU that has it (tests and benchmarks compare the two). */
int qs_bf16_dot_now = -1;

int qs_bf16_dot_set(int on) {
    int prev = qs_bf16_dot_now >= 0 ? qs_bf16_dot_now : qs_cpu_has_avx512bf16();
    if (on >= 0) qs_bf16_dot_now = on && qs_cpu_has_avx512bf16();
    else qs_bf16_dot_now = prev;
    return prev;
}
