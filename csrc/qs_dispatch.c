/* CPU feature detection and the active ISA level: the one place that asks the CPU what it has (qs_arch.h names
 * the levels of each CPU family). */
#include "qs.h"
#include "qs_slots.h"

#if QS_ARCH_X86
#include <cpuid.h>
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
#include <windows.h>
#endif

int qs_isa_level = -1;

#if QS_ARCH_X86
/* F16C, read from CPUID leaf 1 (clang before 15 has no "f16c" for __builtin_cpu_supports) */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
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
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c())
        lvl = QS_ISA_AVX2;
    if (lvl == QS_ISA_AVX2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
        lvl = QS_ISA_AVX512;
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
#ifdef PF_ARM_V82_DP_INSTRUCTIONS_AVAILABLE
    dot = IsProcessorFeaturePresent(PF_ARM_V82_DP_INSTRUCTIONS_AVAILABLE) != 0;
#endif
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
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        has = __builtin_cpu_supports("avx512vbmi") ? 1 : 0;
    }
    return has;
#else
    return 0;
#endif
}
