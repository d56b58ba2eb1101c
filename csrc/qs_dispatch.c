/* CPU feature detection and the active ISA level. */
#include "qs.h"

int qs_isa_level = -1;

int qs_isa_detected(void) {
    static int detected = -1;
    if (detected < 0) {
        __builtin_cpu_init();
        int lvl = QS_ISA_SCALAR;
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
            lvl = QS_ISA_AVX2;
        if (lvl == QS_ISA_AVX2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
            lvl = QS_ISA_AVX512;
        detected = lvl;
    }
    return detected;
}

int qs_isa_get(void) {
    if (qs_isa_level < 0) qs_isa_level = qs_isa_detected();
    return qs_isa_level;
}

int qs_isa_set(int level) {
    int d = qs_isa_detected();
    if (level < 0 || level > d) level = d;
    qs_isa_level = level;
    return level;
}
