/* The type table: everything the drivers know about a ggml type, one designated-initializer row per type in
 * qs_traits.c. A driver never switches on a type id: it looks the row up (qs_traits) and picks the kernel of the
 * active ISA from the row's per-ISA slots (qs_pick_*). Adding a type is adding its row (docs/extending.md).
 *
 * Layers (tests/test_csrc_layers.py): the codecs (qs_quant*.c, qs_iquants*.c, qs_act.c, qs_gemm_panel.c,
 * qs_gemm_avx*.c, qs_repack_rows.c, qs_repack_avx*.c, qs_qz_*.c) call nothing above them; the table names them;
 * the drivers (qs_matmat.c, qs_gemm.c, qs_repack.c, qs_quantize.c) read the table; the block (qs_block.c) sits on
 * top. */
#ifndef QS_TRAITS_H
#define QS_TRAITS_H
#include <stdint.h>

#include "qs.h"
#include "qs_gemm.h"
#include "qs_quant_internal.h"
#include "qs_quantize_internal.h"
#include "qs_repack.h"
#include "qs_slots.h"

#define QS_NTYPES 41 /* ggml type ids below this have a row (an all-zero row: no support) */

typedef int (*qs_act_quantize_fn)(const float *x, uint8_t *dst, int64_t n);
typedef void (*qs_deq_row_fn)(const uint8_t *src, float *dst, int64_t n);

typedef struct {
    const char *name;
    int elems, bytes;                     /* one block: elements and bytes (1, 4 for F32); 0 for no support */
    int act;                              /* the activation type the dot reads (valid where dot[0] is set) */
    qs_act_quantize_fn act_quantize;      /* as an activation type: float32 row -> its blocks */
    qs_deq_block_fn deq[QS_TIERS];        /* one block -> float32; [0] the reference */
    qs_deq_row_fn deq_row[QS_TIERS];      /* plain types: a whole run of elements at once */
    qs_dot_fn dot[QS_TIERS];              /* a row against its quantized activation row; [0] the reference */
    qs_panel_fn panel[QS_TIERS];          /* prefill GEMM row decoder (qs_gemm.h); NULL: no GEMM form */
    int gemm_group;                       /* the GEMM's elements per min (16 or 32) */
    int gemm_wide;                        /* codes reach above 127: no AVX2 GEMM (vpmaddubsw would saturate) */
    qs_codes_fn codes;                    /* i-quants, TQ, FP4: one block as exact int8 codes */
    int code_group, code_outer;           /* elements per integer scale, per float multiplier */
    qs_rp_layout rp;                      /* load-time repacked layout (qs_repack.h); rp.blk 0: none */
    qs_rp_layout rp_codes;                /* the code types' prompt layout (qs_iq_prefill); blk 0: none */
    qs_qrow_fn quantize_row;              /* weight quantizer (docs/quantize.md); NULL: none */
} qs_type_traits;

const qs_type_traits *qs_traits(int type); /* never NULL: unknown ids get the all-zero row */
int64_t qs_act_row_bytes(int act, int64_t k);

#endif
