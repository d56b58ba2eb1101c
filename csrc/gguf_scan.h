/* Quantscope native helpers for the GGUF reader. */
#ifndef QS_GGUF_SCAN_H
#define QS_GGUF_SCAN_H
#include <stdint.h>

/* Error codes of qs_scan_strings. */
enum {
    QS_SCAN_OK = 0,
    QS_SCAN_TRUNCATED_LENGTH = 1, /* fewer than 8 bytes left for a length field */
    QS_SCAN_PAST_END = 2,         /* string bytes run past the end of the buffer */
    QS_SCAN_TOO_LONG = 3,         /* string longer than max_len */
    QS_SCAN_BAD_UTF8 = 4          /* string bytes are not valid UTF-8 */
};                                /* and -9 (QS_ERR_MAPPED_FAULT): the mapped buffer became unreadable */

/* Walk `count` consecutive gguf_strings (u64 LE byte length + bytes) in buf[0..len).
 * On success returns QS_SCAN_OK and sets *out_end to the offset just past the last string.
 * If `offsets` is not NULL, offsets[i] receives the offset of string i's length field (count+1 entries:
 * offsets[count] = *out_end).  On failure returns an error code, *err_pos is the offset of the offending
 * length field or byte and *err_index the index of the string. */
int qs_scan_strings(const uint8_t *buf, uint64_t len, uint64_t count, uint64_t max_len, int check_utf8,
                    uint64_t *offsets, uint64_t *out_end, uint64_t *err_pos, uint64_t *err_index);

/* Returns the offset of the first invalid byte in s[0..n) under strict UTF-8 (no overlongs, no surrogates,
 * nothing above U+10FFFF), or n when all of it is valid. */
uint64_t qs_utf8_invalid_at(const uint8_t *s, uint64_t n);

#endif
