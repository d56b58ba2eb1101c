/* Per-ISA kernel slots: how every dispatcher names its kernels and picks one (qs_arch.h names the levels).
 *
 * A slot array holds, per ISA slot, the kernel of that level ([0] the scalar reference, which must exist; the
 * other slots may be empty). The active slot is the highest filled one at or below the CPU's tier (qs_isa_tier:
 * the ISA level, on x86 QS_TIER_VBMI where AVX-512 also has VBMI), so forcing a lower level (qs_isa_set) reaches
 * every kernel beneath it. The per-type kernels sit in the type table (qs_traits.h); a kernel that is not per type
 * has its slot array beside the code that calls it, declared with the same macros. */
#ifndef QS_SLOTS_H
#define QS_SLOTS_H

#include <stddef.h>

#include "qs.h"

/* The active slot (qs_dispatch.c keeps it with the level): one load, as cheap as the level's own check. */
extern int qs_isa_tier_now;
int qs_isa_tier_first(void);
static inline int qs_isa_tier(void) { return qs_isa_tier_now >= 0 ? qs_isa_tier_now : qs_isa_tier_first(); }

/* Per-ISA slots, written once for both CPU families: SLOTS(kernel, x86 set, ARM64 set), where a set names
 * the levels that have their own kernel (qs_arch.h); the other family's set is not even expanded, so its kernels
 * need not exist in this build. An empty slot falls back to the next filled one below (QS_PICK_FN).
 *   x86:   X0 none, X1 AVX2, X2 AVX2 + AVX-512, XV AVX2 + AVX-512 with VBMI
 *   ARM64: A0 none, A1 NEON, A2 NEON + dotprod, A3 NEON + dotprod + i8mm */
#if QS_ARCH_X86
#define SLOTS(name, x, a) X86_##x(name)
#elif QS_ARCH_ARM64
#define SLOTS(name, x, a) ARM_##a(name)
#else
#define SLOTS(name, x, a) {qs_##name##_scalar}
#endif
#define X86_X0(name) {qs_##name##_scalar}
#define X86_X1(name) {qs_##name##_scalar, qs_##name##_avx2}
#define X86_X2(name) {qs_##name##_scalar, qs_##name##_avx2, qs_##name##_avx512}
#define X86_XV(name) {qs_##name##_scalar, qs_##name##_avx2, [QS_TIER_VBMI] = qs_##name##_avx512}
#define ARM_A0(name) {qs_##name##_scalar}
#define ARM_A1(name) {qs_##name##_scalar, qs_##name##_neon}
#define ARM_A2(name) {qs_##name##_scalar, qs_##name##_neon, QS_DOTPROD(qs_##name##_dotprod)}
#define ARM_A3(name) {qs_##name##_scalar, qs_##name##_neon, QS_DOTPROD(qs_##name##_dotprod), QS_I8MM(qs_##name##_i8mm)}
/* a kernel of a level this compiler may not build (qs_arch.h): the kernel, or an empty slot */
#if QS_ARCH_ARM64 && QS_HAVE_DOTPROD
#define QS_DOTPROD(fn) fn
#else
#define QS_DOTPROD(fn) NULL
#endif
#if QS_ARCH_ARM64 && QS_HAVE_I8MM
#define QS_I8MM(fn) fn
#else
#define QS_I8MM(fn) NULL
#endif
/* a slot set of kernels not named by the <kernel>_scalar rule: BY_ARCH(({x86 slots}), ({ARM64 slots})) */
#define QS_UNPAREN(...) __VA_ARGS__
#if QS_ARCH_X86
#define BY_ARCH(x, a) QS_UNPAREN x
#elif QS_ARCH_ARM64
#define BY_ARCH(x, a) QS_UNPAREN a
#else
#define BY_ARCH(x, a) {0}
#endif

/* The slot a tier uses: the highest filled slot at or below it (0 when only the reference is filled). */
#define QS_PICK_AT(slots, tier)                                                                                    \
    ({                                                                                                             \
        int at_ = 0;                                                                                               \
        for (int i_ = (tier); i_ > 0; --i_)                                                                        \
            if ((slots)[i_]) {                                                                                     \
                at_ = i_;                                                                                          \
                break;                                                                                             \
            }                                                                                                      \
        at_;                                                                                                       \
    })
/* The kernel of a tier, and of the active one. */
#define QS_PICK_FN(slots, tier) ((slots)[QS_PICK_AT(slots, tier)])
#define QS_PICK(slots) QS_PICK_FN(slots, qs_isa_tier())

#endif
