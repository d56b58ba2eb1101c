/* Test oracle: ggml's own quantizer (ggml_quantize_chunk from the llama.cpp oracle build's libggml-base.a) on rows
 * read from a file. Built and run only by tests/record_quantize_fixtures.py; CI never needs it.
 *
 * usage: quantize_oracle TYPE_ID NROWS N_PER_ROW ROWS.f32 IMATRIX.f32|- OUT.bin
 * ROWS.f32 holds NROWS*N_PER_ROW little-endian floats, IMATRIX.f32 N_PER_ROW of them ("-": none). */
#include <stdio.h>
#include <stdlib.h>
#include "ggml.h"

static void *slurp(const char *path, size_t want) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    void *p = malloc(want ? want : 1);
    if (fread(p, 1, want, f) != want) { fprintf(stderr, "%s: short read\n", path); exit(2); }
    fclose(f);
    return p;
}

int main(int argc, char **argv) {
    if (argc != 7) { fprintf(stderr, "usage: %s TYPE NROWS N_PER_ROW ROWS IMATRIX|- OUT\n", argv[0]); return 2; }
    enum ggml_type type = (enum ggml_type) atoi(argv[1]);
    long long nrows = atoll(argv[2]), n_per_row = atoll(argv[3]);
    float *src = slurp(argv[4], (size_t) (nrows * n_per_row) * sizeof(float));
    float *imat = argv[5][0] == '-' ? NULL : slurp(argv[5], (size_t) n_per_row * sizeof(float));
    size_t row = ggml_row_size(type, n_per_row);
    void *dst = calloc((size_t) nrows, row);
    size_t n = ggml_quantize_chunk(type, src, dst, 0, nrows, n_per_row, imat);
    FILE *o = fopen(argv[6], "wb");
    if (!o || fwrite(dst, 1, n, o) != n) { perror(argv[6]); return 2; }
    fclose(o);
    return 0;
}
