/* Quantscope native API: a tokenizer vocabulary's piece table and BPE merge ranks (docs/engine.md section 8).
 * This file is read by cffi's cdef: declarations only, no preprocessor directives.
 * The inputs are copies of a GGUF file's string arrays (gguf_strings back to back: u64 LE byte length + bytes),
 * owned by the caller and not memory-mapped; every length is checked against the buffer here. */
typedef struct qs_vocab qs_vocab;

/* Index `n_tok` pieces (tok[0..tok_len)) and, when mrg is not NULL, `n_mrg` merges ("left right", split at the first
 * space; a merge without a space can never apply and is skipped). The first id of a piece that occurs twice wins,
 * and so does the first rank of a pair. Returns NULL and sets *err: -1 a string runs past its buffer or a count is
 * out of range, -2 out of memory. */
qs_vocab *qs_vocab_new(const char *tok, uint64_t tok_len, uint64_t n_tok,
                       const char *mrg, uint64_t mrg_len, uint64_t n_mrg, int *err);
void qs_vocab_free(qs_vocab *v);
/* flags[id] = 1: a word equal to that piece is still merged rather than taken whole (llama.cpp does not take a
 * control token's text as a word's token). n must be the piece count; 0, or -1 / -2 (out of memory). */
int qs_vocab_no_whole(qs_vocab *v, const uint8_t *flags, uint64_t n);
/* Id of the piece s[0..n) (its first id), or -1. */
int64_t qs_vocab_find(const qs_vocab *v, const char *s, uint64_t n);
/* Rank of the merge (a, b), or -1. */
int64_t qs_vocab_rank(const qs_vocab *v, const char *a, uint64_t na, const char *b, uint64_t nb);
/* BPE of one word w[0..n) of UTF-8. flags bit 0 (QS_BPE_BYTE_MAP): each byte first becomes its GPT-2 printable
 * character (the byte-level BPE of "gpt2" vocabularies); bit 1 (QS_BPE_WHOLE_FIRST): a (mapped) word that is a
 * piece is that one symbol. Otherwise the symbols start as the characters and the pair of adjacent symbols with the
 * lowest rank (the leftmost of equals) is merged at every occurrence, left to right, until no pair has a rank.
 * Writes each final symbol's vocabulary id (-1: not a piece) to ids and the byte offset where it ends in the
 * (mapped) word to ends; returns the number of symbols, or -1 when cap < the number of characters, or -2 out of
 * memory. A word has at most n characters, so cap = n always suffices. */
enum { QS_BPE_BYTE_MAP = 1, QS_BPE_WHOLE_FIRST = 2 };
int64_t qs_vocab_bpe(const qs_vocab *v, const char *w, uint64_t n, int flags, int32_t *ids, uint64_t *ends,
                     uint64_t cap);
/* qs_vocab_bpe over the n_words consecutive words of text[0..n), word w ending at character (code point) char_ends[w]
 * (ascending; at most the text's length): their ids back to back in ids (cap entries; n, the text's byte count,
 * always suffices), word w's starting at ids[word_start[w]] (n_words + 1 entries). Returns the total, -1 for bad
 * arguments or a short cap, -2 out of memory. */
int64_t qs_vocab_bpe_words(const qs_vocab *v, const char *text, uint64_t n, const uint64_t *char_ends,
                           uint64_t n_words, int flags, int32_t *ids, uint64_t cap, uint64_t *word_start);
