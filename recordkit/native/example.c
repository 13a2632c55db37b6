/*
 * recordkit.native._ext: one record's tf.train.Example span parse (where each wanted
 * feature's values lie in the buffer, as the reference decoder reads them:
 * recordkit/codec/messages.py, on recordkit/codec/wire.py), and the copy of a value
 * made while the payload's CRC is computed. The per-record checks around them (the
 * framing of recordkit.format.read_record, the spans against what the fast path
 * expects, int64 varints decoded) are inline in record.h.
 */
#include "record.h"

/* ------------------------------------------------------------------ protobuf */

/* Strict UTF-8, as Python's str(key, "utf-8") (no surrogates, no overlongs, <= U+10FFFF). */
static int utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
        } else if (c >= 0xC2 && c <= 0xDF) {
            if (n - i < 2 || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (n - i < 3 || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0;
            if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F)) return 0;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (n - i < 4 || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 ||
                (s[i + 3] & 0xC0) != 0x80)
                return 0;
            if ((c == 0xF0 && s[i + 1] < 0x90) || (c == 0xF4 && s[i + 1] > 0x8F)) return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* Count the varints of a non-empty packed run; -1 unless it ends on a varint of <= 10 bytes. */
static int64_t count_varints(const uint8_t *p, uint64_t len) {
    if (p[len - 1] & 0x80) return -1;
    int64_t n = 0;
    unsigned run = 0;
    for (uint64_t i = 0; i < len; i++) {
        if (p[i] & 0x80) {
            if (++run >= 10) return -1;
        } else {
            n++;
            run = 0;
        }
    }
    return n;
}

/* ------------------------------------------------------------ Example parsing */

static inline int kind_of_tag(uint64_t tag) {
    return tag == 0x0A ? KIND_BYTES : tag == 0x12 ? KIND_FLOAT : tag == 0x1A ? KIND_INT64 : 0;
}

/*
 * A field that a message does not define (an unknown number, or a known one with
 * another wire type) makes the record "malformed" here: protobuf would skip it and
 * drop what it holds, and the reference (recordkit/codec/messages.py) refuses the
 * record with an UnknownFieldError naming the field, which the callers' reference
 * path then raises. So every parser below takes exactly the fields its message
 * defines, and nothing is ever skipped.
 */

/* One map<string, Feature> entry: key = 1, value = 2, either absent, repeated or reordered. */
static int parse_entry(const uint8_t *p, const uint8_t *stop, Ctx *cx) {
    const uint8_t *entry = p, *key = p, *run = NULL, *run_end = NULL, *since = NULL;
    uint64_t key_len = 0, tag, len;
    uint32_t nruns = 0;
    int kind = 0;
    while (p < stop) {
        if (!(p = rd_varint(p, stop, &tag))) return -1;
        if (tag == 0x0A) {
            if (!(p = rd_len(p, stop, &len))) return -1;
            key = p;
            key_len = len;
            p += len;
        } else if (tag == 0x12) {
            if (!(p = rd_len(p, stop, &len))) return -1;
            const uint8_t *fend = p + len;
            while (p < fend) { /* the Feature: a oneof of three lists */
                if (!(p = rd_varint(p, fend, &tag))) return -1;
                int k = kind_of_tag(tag);
                if (!k) return -1; /* a field Feature does not define */
                if (!(p = rd_len(p, fend, &len))) return -1;
                if (k == kind) { /* the same member again: protobuf merges */
                    nruns++;
                } else { /* another member replaces the one set before */
                    kind = k;
                    nruns = 1;
                    run = since = p;
                    run_end = p + len;
                }
                p += len;
            }
        } else {
            return -1; /* a field the map entry does not define */
        }
    }
    if (!utf8_valid(key, (size_t)key_len)) return -1;
    Py_ssize_t k = key_lookup(cx->keys, key, (size_t)key_len);
    if (k >= 0) { /* a later entry with the same key replaces this one */
        KeyState *s = &cx->st[k];
        s->entry = entry;
        s->entry_end = stop;
        s->run = run;
        s->run_end = run_end;
        s->since = since;
        s->nruns = nruns;
        s->kind = kind ? kind : KIND_NONE;
    }
    return 0;
}

static int parse_features(const uint8_t *p, const uint8_t *end, Ctx *cx) {
    uint64_t tag, len;
    while (p < end) {
        if (!(p = rd_varint(p, end, &tag))) return -1;
        if (tag != 0x0A) return -1; /* a field Features does not define */
        if (!(p = rd_len(p, end, &len))) return -1;
        if (parse_entry(p, p + len, cx) < 0) return -1;
        p += len;
    }
    return 0;
}

static int parse_example(const uint8_t *p, const uint8_t *end, Ctx *cx) {
    uint64_t tag, len;
    while (p < end) {
        if (!(p = rd_varint(p, end, &tag))) return -1;
        if (tag == 0x0A) { /* Example.features; repeated occurrences merge their maps */
            if (!(p = rd_len(p, end, &len))) return -1;
            if (parse_features(p, p + len, cx) < 0) return -1;
            p += len;
        } else if (tag == 0x12) {
            /* SequenceExample.feature_lists: never read its context alone; the
               Python reference raises SequenceExampleError for this record. */
            return -1;
        } else {
            return -1; /* a field Example does not define */
        }
    }
    return 0;
}

/* The values of one list, summed over the (merged) list submessages. */
typedef struct {
    int64_t count;
    uint32_t chunks; /* numeric lists: packed runs and unpacked values */
    const uint8_t *first;
    uint64_t first_len;
} Acc;

static int scan_list(int kind, const uint8_t *p, const uint8_t *end, Acc *a) {
    uint64_t tag, len;
    while (p < end) {
        if (!(p = rd_varint(p, end, &tag))) return -1;
        if (tag == 0x0A) { /* BytesList.value, or a packed run of numbers */
            if (!(p = rd_len(p, end, &len))) return -1;
            if (kind == KIND_BYTES) {
                if (a->count++ == 0) {
                    a->first = p;
                    a->first_len = len;
                }
            } else if (len) {
                if (kind == KIND_FLOAT) {
                    if (len & 3) return -1;
                    a->count += (int64_t)(len >> 2);
                } else {
                    int64_t c = count_varints(p, len);
                    if (c < 0) return -1;
                    a->count += c;
                }
                if (a->chunks++ == 0) {
                    a->first = p;
                    a->first_len = len;
                }
            }
            p += len;
        } else if ((kind == KIND_FLOAT && tag == 0x0D) || (kind == KIND_INT64 && tag == 0x08)) {
            uint64_t v; /* one unpacked value */
            const uint8_t *q = tag == 0x08 ? rd_varint(p, end, &v) : end - p >= 4 ? p + 4 : NULL;
            if (!q) return -1;
            if (a->chunks++ == 0) {
                a->first = p;
                a->first_len = (uint64_t)(q - p);
            }
            a->count++;
            p = q;
        } else {
            return -1; /* a field the list does not define */
        }
    }
    return 0;
}

/* Scan every list submessage of the final kind in the winning entry (rare: merged lists).
 * parse_entry has checked the entry: it holds keys (0x0A) and Features (0x12) only. */
static int rescan_entry(const KeyState *s, Acc *a) {
    const uint8_t *p = s->entry, *stop = s->entry_end;
    uint64_t tag, len;
    while (p < stop) {
        if (!(p = rd_varint(p, stop, &tag))) return -1;
        if (tag != 0x0A && tag != 0x12) return -1;
        if (!(p = rd_len(p, stop, &len))) return -1;
        if (tag == 0x0A) { /* the key */
            p += len;
            continue;
        }
        const uint8_t *fend = p + len;
        while (p < fend) {
            if (!(p = rd_varint(p, fend, &tag))) return -1;
            int k = kind_of_tag(tag);
            if (!k) return -1;
            if (!(p = rd_len(p, fend, &len))) return -1;
            if (k == s->kind && p >= s->since && scan_list(k, p, p + len, a) < 0) return -1;
            p += len;
        }
    }
    return 0;
}

/* Parse one payload and fill its F spans; 0 or -1 (malformed, or a field not defined). */
int rk_parse_record(const uint8_t *base, const uint8_t *p, const uint8_t *end, Ctx *cx,
                    int64_t *spans) {
    Py_ssize_t nkeys = cx->keys->n;
    memset(cx->st, 0, (size_t)nkeys * sizeof(KeyState));
    if (parse_example(p, end, cx) < 0) return -1;
    for (Py_ssize_t k = 0; k < nkeys; k++) {
        const KeyState *s = &cx->st[k];
        int64_t *sp = spans + 4 * k;
        sp[0] = s->kind;
        sp[1] = sp[2] = sp[3] = 0;
        if (s->kind == KIND_ABSENT || s->kind == KIND_NONE) continue;
        Acc a = {0, 0, NULL, 0};
        if (s->nruns == 1 ? scan_list(s->kind, s->run, s->run_end, &a) : rescan_entry(s, &a)) return -1;
        /* several chunks: a numeric list's runs, or a BytesList in several submessages
           (merged): its values do not follow one another */
        if (s->kind == KIND_BYTES ? s->nruns > 1 : a.chunks > 1) sp[0] |= KIND_COMPLEX;
        sp[1] = a.count;
        if (a.first) {
            sp[2] = (int64_t)(a.first - base);
            sp[3] = (int64_t)a.first_len;
        }
    }
    return 0;
}

/* Copy the l-byte value at v (inside the payload [p, end), end = its CRC) to d, zero
 * d up to row, and check the payload CRC in the same pass: 1 if it matches. */
int rk_copy_verified(rk_crc_copy_fn copy, const uint8_t *p, const uint8_t *end,
                     const uint8_t *v, int64_t l, uint8_t *d, int64_t row) {
    if (!l) v = p;
    uint32_t crc = rk_crc32c(0, p, (size_t)(v - p));
    crc = copy(crc, v, d, (size_t)l);
    crc = rk_crc32c(crc, v + l, (size_t)(end - v - l));
    memset(d + l, 0, (size_t)(row - l));
    return masked(crc) == ld32le(end);
}
