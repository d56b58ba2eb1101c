/* Quantscope: fast walk over GGUF string arrays (the reader's only per-element loop). */
#include "gguf_scan.h"

#include <string.h>

#include "qs_api_quant.h"
#include "qs_guard.h"

static uint64_t load_u64_le(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

static uint64_t utf8_invalid_at(const uint8_t *s, uint64_t n) {
    uint64_t i = 0;
    while (i < n) {
        /* ASCII fast path, 8 bytes at a time. */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ULL) break;
            i += 8;
        }
        if (i >= n) break;
        uint8_t c = s[i];
        if (c < 0x80) { ++i; continue; }
        uint64_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c == 0xE0) { need = 2; lo = 0xA0; }
        else if (c >= 0xE1 && c <= 0xEC) need = 2;
        else if (c == 0xED) { need = 2; hi = 0x9F; }          /* no surrogates */
        else if (c >= 0xEE && c <= 0xEF) need = 2;
        else if (c == 0xF0) { need = 3; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) need = 3;
        else if (c == 0xF4) { need = 3; hi = 0x8F; }          /* <= U+10FFFF */
        else return i;
        if (n - i <= need) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (uint64_t k = 2; k <= need; ++k)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += need + 1;
    }
    return n;
}

static int scan_strings(const uint8_t *buf, uint64_t len, uint64_t count, uint64_t max_len, int check_utf8,
                        uint64_t *offsets, uint64_t *out_end, uint64_t *err_pos, uint64_t *err_index) {
    uint64_t pos = 0;
    for (uint64_t i = 0; i < count; ++i) {
        if (offsets) offsets[i] = pos;
        if (len - pos < 8) {
            *err_pos = pos; *err_index = i;
            return QS_SCAN_TRUNCATED_LENGTH;
        }
        uint64_t n = load_u64_le(buf + pos);
        if (n > max_len) {
            *err_pos = pos; *err_index = i;
            return QS_SCAN_TOO_LONG;
        }
        if (n > len - pos - 8) {
            *err_pos = pos; *err_index = i;
            return QS_SCAN_PAST_END;
        }
        pos += 8;
        if (check_utf8) {
            uint64_t bad = utf8_invalid_at(buf + pos, n);
            if (bad != n) {
                *err_pos = pos + bad; *err_index = i;
                return QS_SCAN_BAD_UTF8;
            }
        }
        pos += n;
    }
    if (offsets) offsets[count] = pos;
    *out_end = pos;
    return QS_SCAN_OK;
}

static int utf8_invalid_into(const uint8_t *s, uint64_t n, uint64_t *out) {
    *out = utf8_invalid_at(s, n);
    return 0;
}

uint64_t qs_utf8_invalid_at(const uint8_t *s, uint64_t n) {
    uint64_t r = 0;
    int rc;
    QS_GUARDED(rc, utf8_invalid_into(s, n, &r));
    if (rc) qs_guard_note_fault(); /* returns 0: qs_guard_last_fault() tells it from "invalid at 0" */
    return rc ? 0 : r;
}

int qs_scan_strings(const uint8_t *buf, uint64_t len, uint64_t count, uint64_t max_len, int check_utf8,
                    uint64_t *offsets, uint64_t *out_end, uint64_t *err_pos, uint64_t *err_index) {
    int rc;
    QS_GUARDED(rc, scan_strings(buf, len, count, max_len, check_utf8, offsets, out_end, err_pos, err_index));
    if (rc == QS_ERR_MAPPED_FAULT) *err_pos = *err_index = 0;
    return rc;
}
