/* Quantscope: a tokenizer's piece table and BPE merges, for fast start-up and encoding (docs/engine.md section 8).
 * Open-addressing hash tables over the caller's copies of the string arrays: building them allocates no string,
 * so a 150k-piece vocabulary is ready in milliseconds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qs.h"

/* A slot: the upper 32 bits of the key's hash and 1 + the entry's index (0: empty). 8 bytes, at most 3/4 full: a
 * 150k-entry table stays within a few L2-sized megabytes, which is what the build time is made of. */
typedef struct {
    uint32_t tag;
    uint32_t idx1;
} slot;

struct qs_vocab {
    const uint8_t *tok, *mrg;
    uint64_t *tok_off;  /* piece i: tok[tok_off[i] .. + tok_len[i]) */
    uint32_t *tok_len;
    uint64_t *mrg_off;  /* merge r: left side mrg[mrg_off[r] .. + mrg_la[r]), right side after the space */
    uint32_t *mrg_la, *mrg_lb;
    slot *pieces, *merges;
    uint64_t piece_mask, merge_mask;
    uint64_t n_tok;
    uint8_t *no_whole; /* NULL, or one byte per id: 1 = never taken as a whole word (control tokens) */
};

#define MAX_COUNT (1ull << 31)

static uint64_t load_u64_le(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

/* FNV-1a over the bytes, continuing from h, then a final mix (pair keys hash the left side, a separator, the right). */
static uint64_t fnv(uint64_t h, const uint8_t *s, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}
static uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}
#define FNV0 0xcbf29ce484222325ull
static uint64_t hash_piece(const uint8_t *s, uint64_t n) { return mix(fnv(FNV0, s, n)); }
static uint64_t hash_pair(const uint8_t *a, uint64_t na, const uint8_t *b, uint64_t nb) {
    uint64_t h = fnv(FNV0, a, na);
    h = (h ^ 0x1ff) * 0x100000001b3ull; /* a value no byte takes: (a, b) and (a', b') with a+b == a'+b' differ */
    return mix(fnv(h, b, nb));
}

static slot *new_table(uint64_t count, uint64_t *mask) {
    uint64_t cap = 16;
    while (cap < count + count / 3 + 1) cap <<= 1;
    slot *t = calloc(cap, sizeof(slot));
    *mask = cap - 1;
    return t;
}

static int piece_is(const qs_vocab *v, uint32_t i, const uint8_t *s, uint64_t n) {
    return v->tok_len[i] == n && memcmp(v->tok + v->tok_off[i], s, n) == 0;
}
static int merge_is(const qs_vocab *v, uint32_t r, const uint8_t *a, uint64_t na, const uint8_t *b, uint64_t nb) {
    return v->mrg_la[r] == na && v->mrg_lb[r] == nb && memcmp(v->mrg + v->mrg_off[r], a, na) == 0 &&
           memcmp(v->mrg + v->mrg_off[r] + na + 1, b, nb) == 0;
}

static int64_t find_piece(const qs_vocab *v, const uint8_t *s, uint64_t n) {
    if (!v->pieces || n > UINT32_MAX) return -1;
    uint64_t h = hash_piece(s, n);
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint64_t i = h & v->piece_mask;; i = (i + 1) & v->piece_mask) {
        const slot e = v->pieces[i];
        if (!e.idx1) return -1;
        if (e.tag == tag && piece_is(v, e.idx1 - 1, s, n)) return e.idx1 - 1;
    }
}

static int64_t find_rank(const qs_vocab *v, const uint8_t *a, uint64_t na, const uint8_t *b, uint64_t nb) {
    if (!v->merges || na > UINT32_MAX || nb > UINT32_MAX) return -1;
    uint64_t h = hash_pair(a, na, b, nb);
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint64_t i = h & v->merge_mask;; i = (i + 1) & v->merge_mask) {
        const slot e = v->merges[i];
        if (!e.idx1) return -1;
        if (e.tag == tag && merge_is(v, e.idx1 - 1, a, na, b, nb)) return e.idx1 - 1;
    }
}

/* Record where each of `count` gguf_strings in buf[0..len) lies; -1 when one runs past the end. */
static int walk(const uint8_t *buf, uint64_t len, uint64_t count, uint64_t *off, uint32_t *lens) {
    uint64_t pos = 0;
    for (uint64_t i = 0; i < count; ++i) {
        if (len - pos < 8) return -1;
        uint64_t n = load_u64_le(buf + pos);
        pos += 8;
        if (n > len - pos || n >= UINT32_MAX) return -1;
        off[i] = pos;
        lens[i] = (uint32_t)n;
        pos += n;
    }
    return 0;
}

static void add_piece(qs_vocab *v, uint32_t id) {
    const uint8_t *s = v->tok + v->tok_off[id];
    uint64_t n = v->tok_len[id];
    uint64_t h = hash_piece(s, n);
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint64_t i = h & v->piece_mask;; i = (i + 1) & v->piece_mask) {
        slot *e = &v->pieces[i];
        if (!e->idx1) {
            e->tag = tag;
            e->idx1 = id + 1;
            return;
        }
        if (e->tag == tag && piece_is(v, e->idx1 - 1, s, n)) return; /* the first id wins */
    }
}

static void add_merge(qs_vocab *v, uint32_t r) {
    if (v->mrg_la[r] == UINT32_MAX) return; /* no space: a pair with an empty side never applies */
    const uint8_t *a = v->mrg + v->mrg_off[r], *b = a + v->mrg_la[r] + 1;
    uint64_t na = v->mrg_la[r], nb = v->mrg_lb[r];
    uint64_t h = hash_pair(a, na, b, nb);
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint64_t i = h & v->merge_mask;; i = (i + 1) & v->merge_mask) {
        slot *e = &v->merges[i];
        if (!e->idx1) {
            e->tag = tag;
            e->idx1 = r + 1;
            return;
        }
        if (e->tag == tag && merge_is(v, e->idx1 - 1, a, na, b, nb)) return; /* the first rank wins */
    }
}

void qs_vocab_free(qs_vocab *v) {
    if (!v) return;
    free(v->tok_off);
    free(v->tok_len);
    free(v->mrg_off);
    free(v->mrg_la);
    free(v->mrg_lb);
    free(v->pieces);
    free(v->merges);
    free(v->no_whole);
    free(v);
}

int qs_vocab_no_whole(qs_vocab *v, const uint8_t *flags, uint64_t n) {
    if (!v || !flags || n != v->n_tok) return -1;
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy) return -2;
    memcpy(copy, flags, n);
    free(v->no_whole);
    v->no_whole = copy;
    return 0;
}

qs_vocab *qs_vocab_new(const char *tok_, uint64_t tok_len, uint64_t n_tok,
                       const char *mrg_, uint64_t mrg_len, uint64_t n_mrg, int *err) {
    const uint8_t *tok = (const uint8_t *)tok_, *mrg = (const uint8_t *)mrg_;
    *err = -1;
    if ((!tok && (tok_len || n_tok)) || n_tok >= MAX_COUNT || n_tok > tok_len / 8 ||
        (mrg && (n_mrg >= MAX_COUNT || n_mrg > mrg_len / 8)))
        return NULL;
    *err = -2;
    qs_vocab *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->tok = tok;
    v->mrg = mrg;
    v->n_tok = n_tok;
    v->tok_off = malloc((n_tok + 1) * sizeof *v->tok_off);
    v->tok_len = malloc((n_tok + 1) * sizeof *v->tok_len);
    v->pieces = new_table(n_tok, &v->piece_mask);
    if (!v->tok_off || !v->tok_len || !v->pieces) goto fail;
    if (mrg) {
        v->mrg_off = malloc((n_mrg + 1) * sizeof *v->mrg_off);
        v->mrg_la = malloc((n_mrg + 1) * sizeof *v->mrg_la);
        v->mrg_lb = malloc((n_mrg + 1) * sizeof *v->mrg_lb);
        v->merges = new_table(n_mrg, &v->merge_mask);
        if (!v->mrg_off || !v->mrg_la || !v->mrg_lb || !v->merges) goto fail;
    }
    *err = -1;
    if (walk(tok, tok_len, n_tok, v->tok_off, v->tok_len) != 0) goto fail;
    for (uint64_t i = 0; i < n_tok; ++i) add_piece(v, (uint32_t)i);
    if (mrg) {
        if (walk(mrg, mrg_len, n_mrg, v->mrg_off, v->mrg_la) != 0) goto fail;
        for (uint64_t r = 0; r < n_mrg; ++r) {
            const uint8_t *s = mrg + v->mrg_off[r];
            const uint8_t *sp = memchr(s, ' ', v->mrg_la[r]);
            if (sp) {
                v->mrg_lb[r] = v->mrg_la[r] - (uint32_t)(sp - s) - 1;
                v->mrg_la[r] = (uint32_t)(sp - s);
            } else {
                v->mrg_la[r] = UINT32_MAX;
                v->mrg_lb[r] = 0;
            }
            add_merge(v, (uint32_t)r);
        }
    }
    *err = 0;
    return v;
fail:
    qs_vocab_free(v);
    return NULL;
}

int64_t qs_vocab_find(const qs_vocab *v, const char *s, uint64_t n) {
    return v && (s || !n) ? find_piece(v, (const uint8_t *)s, n) : -1;
}

int64_t qs_vocab_rank(const qs_vocab *v, const char *a, uint64_t na, const char *b, uint64_t nb) {
    return v && (a || !na) && (b || !nb) ? find_rank(v, (const uint8_t *)a, na, (const uint8_t *)b, nb) : -1;
}

/* Length of the UTF-8 sequence led by c (1 for a stray continuation or invalid byte: it is a character of its own). */
static uint64_t utf8_len(uint8_t c) {
    if (c >= 0xF0 && c <= 0xF7) return 4;
    if (c >= 0xE0) return c <= 0xEF ? 3 : 1;
    if (c >= 0xC0) return 2;
    return 1;
}

/* GPT-2's byte -> printable character map: printable Latin-1 bytes stand for themselves, the other 68 bytes for
 * U+0100 onwards in byte order. */
static uint32_t gpt2_char(uint8_t b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    uint32_t k = 0;
    for (uint32_t c = 0; c < b; ++c)
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE)) ++k;
    return 0x100 + k;
}

static uint8_t map_bytes[256][2];
static uint8_t map_len[256];

static void init_byte_map(void) {
    static volatile int map_ready = 0;
    if (__atomic_load_n(&map_ready, __ATOMIC_ACQUIRE)) return;
    for (int b = 0; b < 256; ++b) { /* concurrent first calls write the same values */
        uint32_t c = gpt2_char((uint8_t)b);
        if (c < 0x80) {
            map_bytes[b][0] = (uint8_t)c;
            map_len[b] = 1;
        } else {
            map_bytes[b][0] = (uint8_t)(0xC0 | (c >> 6));
            map_bytes[b][1] = (uint8_t)(0x80 | (c & 0x3F));
            map_len[b] = 2;
        }
    }
    __atomic_store_n(&map_ready, 1, __ATOMIC_RELEASE);
}

/* One word (see qs_vocab_bpe); ends may be NULL. */
static int64_t bpe_one(const qs_vocab *v, const uint8_t *w, uint64_t n, int flags, int32_t *ids, uint64_t *ends,
                       uint64_t cap) {
    const int byte_map = flags & QS_BPE_BYTE_MAP;
    const uint8_t *s = w;
    uint8_t small_map[512], *mapped = NULL; /* most words fit the stack buffers */
    uint64_t small_start[257];
    uint64_t m = n;
    if (byte_map) {
        if (n > UINT64_MAX / 4) return -1;
        mapped = 2 * n <= sizeof small_map ? small_map : malloc(2 * n);
        if (!mapped) return -2;
        m = 0;
        for (uint64_t i = 0; i < n; ++i) {
            memcpy(mapped + m, map_bytes[w[i]], map_len[w[i]]);
            m += map_len[w[i]];
        }
        s = mapped;
    }
    if (flags & QS_BPE_WHOLE_FIRST) {
        int64_t id = find_piece(v, s, m);
        if (id >= 0 && id <= INT32_MAX && m > 0 && cap >= 1 && !(v->no_whole && v->no_whole[id])) {
            ids[0] = (int32_t)id;
            if (ends) ends[0] = m;
            if (mapped != small_map) free(mapped);
            return 1;
        }
    }
    /* the symbols, as byte spans [start[k], start[k+1]) of s; they always cover it contiguously */
    uint64_t k = 0;
    for (uint64_t i = 0; i < m; i += utf8_len(s[i])) ++k;
    if (k > cap) {
        if (mapped != small_map) free(mapped);
        return -1;
    }
    uint64_t *start = k < 257 ? small_start : malloc((k + 1) * sizeof *start);
    if (!start) {
        if (mapped != small_map) free(mapped);
        return -2;
    }
    k = 0;
    for (uint64_t i = 0; i < m; i += utf8_len(s[i])) start[k++] = i;
    start[k] = m; /* a truncated sequence at the end is cut at m */
    while (k > 1) {
        int64_t best = -1;
        uint64_t bi = 0;
        for (uint64_t i = 0; i + 1 < k; ++i) {
            int64_t r = find_rank(v, s + start[i], start[i + 1] - start[i], s + start[i + 1], start[i + 2] - start[i + 1]);
            if (r >= 0 && (best < 0 || r < best)) { best = r; bi = i; }
        }
        if (best < 0) break;
        const uint8_t *a = s + start[bi], *b = s + start[bi + 1];
        uint64_t na = start[bi + 1] - start[bi], nb = start[bi + 2] - start[bi + 1];
        /* merge every occurrence of (a, b), left to right: drop the boundary between the two symbols */
        uint64_t out = 0, i = 0;
        while (i < k) {
            start[out++] = start[i];
            if (i + 1 < k && start[i + 1] - start[i] == na && start[i + 2] - start[i + 1] == nb &&
                memcmp(s + start[i], a, na) == 0 && memcmp(s + start[i + 1], b, nb) == 0)
                i += 2;
            else
                i += 1;
        }
        start[out] = m;
        k = out;
    }
    for (uint64_t i = 0; i < k; ++i) {
        int64_t id = find_piece(v, s + start[i], start[i + 1] - start[i]);
        ids[i] = id >= 0 && id <= INT32_MAX ? (int32_t)id : -1;
        if (ends) ends[i] = start[i + 1];
    }
    if (start != small_start) free(start);
    if (mapped != small_map) free(mapped);
    return (int64_t)k;
}

int64_t qs_vocab_bpe(const qs_vocab *v, const char *w, uint64_t n, int flags, int32_t *ids, uint64_t *ends,
                     uint64_t cap) {
    if (!v || (!w && n) || !ids || !ends) return -1;
    if (flags & QS_BPE_BYTE_MAP) init_byte_map();
    return bpe_one(v, (const uint8_t *)w, n, flags, ids, ends, cap);
}

int64_t qs_vocab_bpe_words(const qs_vocab *v, const char *text_, uint64_t n, const uint64_t *char_ends,
                           uint64_t n_words, int flags, int32_t *ids, uint64_t cap, uint64_t *word_start) {
    const uint8_t *text = (const uint8_t *)text_;
    if (!v || (!text && n) || (!char_ends && n_words) || !ids || !word_start) return -1;
    if (flags & QS_BPE_BYTE_MAP) init_byte_map();
    uint64_t pos = 0, chars = 0, out = 0;
    for (uint64_t w = 0; w < n_words; ++w) {
        uint64_t a = pos;
        if (char_ends[w] < chars) return -1;
        while (chars < char_ends[w]) {
            if (pos >= n) return -1;
            pos += utf8_len(text[pos]);
            ++chars;
        }
        if (pos > n) return -1; /* a truncated sequence at the end */
        word_start[w] = out;
        int64_t k = bpe_one(v, text + a, pos - a, flags, ids + out, NULL, cap - out);
        if (k < 0) return k;
        out += (uint64_t)k;
    }
    word_start[n_words] = out;
    return (int64_t)out;
}
