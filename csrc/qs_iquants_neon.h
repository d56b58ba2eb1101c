/* ARM64 NEON kernels of the lattice i-quants (qs_iquants_neon.c): dots against Q8_K, block codes, the many-column
 * codes dot. Same signatures as the scalar references in qs_iquants.c / qs_quant_internal.h. */
#ifndef QS_IQUANTS_NEON_H
#define QS_IQUANTS_NEON_H
#include <stdint.h>

#include "qs_arch.h"

#if QS_ARCH_ARM64
/* level 1: NEON (ARMv8.0) */
float qs_dot_iq2_xxs_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq2_xs_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq2_s_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq3_xxs_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq3_s_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq1_s_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq1_m_neon(int64_t n, const uint8_t *w, const uint8_t *x);
void qs_iq_lattice_codes_neon(int type, const uint8_t *b, int8_t *code);
float qs_iq_dot_codes_neon(const int8_t *codes, const float *mults, const int16_t *ls, int gs, int os, int q8k,
                           int64_t k, const uint8_t *x);

/* level 2: + dot product (SDOT) */
#if QS_HAVE_DOTPROD
float qs_dot_iq2_xxs_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq2_xs_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq2_s_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq3_xxs_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq3_s_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq1_s_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq1_m_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_iq_dot_codes_dotprod(const int8_t *codes, const float *mults, const int16_t *ls, int gs, int os, int q8k,
                              int64_t k, const uint8_t *x);
#endif
#endif

#endif
