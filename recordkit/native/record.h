/*
 * recordkit/native/record.h: one record, as the units that read records share it
 * (example.c, batch.c, runner.c): the Example parse's state, the framing and span
 * checks made for every record (inline: the batch and runner loops call them per
 * record, and a call across units, which the compiler cannot inline, measurably
 * slowed the runner's small records), and what example.c gives the others.
 *
 * Apart from recordkit.h because these inline checks call crc.c's CRC (rk_crc32c):
 * crc.c includes recordkit.h only, so no unit's header depends back on it.
 */
#ifndef RECORDKIT_NATIVE_RECORD_H
#define RECORDKIT_NATIVE_RECORD_H

#include "recordkit.h"

/* What the winning map entry of a wanted key says. */
typedef struct {
    const uint8_t *entry, *entry_end; /* the map entry, to re-walk merged lists */
    const uint8_t *run, *run_end;     /* the first list submessage of the final kind */
    const uint8_t *since;             /* its start: earlier lists were of another kind */
    uint32_t nruns;                   /* list submessages of the final kind (they merge) */
    int kind;                         /* KIND_ABSENT until an entry is seen */
} KeyState;

/* A parse's keys, and a KeyState per key (the caller's, reused record after record). */
typedef struct {
    const Keys *keys;
    KeyState *st;
} Ctx;

enum { VARINTS_MALFORMED = 1, VARINTS_MORE = 2, VARINTS_FEWER = 3 };

/* The framing checks of recordkit.format.read_record, in its order: ST_OK (and the
 * payload [*payload, *payload + *plen)), or the first ST_* that fails. */
static inline int check_frame(const uint8_t *base, int64_t blen, int64_t off, int64_t size,
                              int verify, int64_t max_len, const uint8_t **payload,
                              uint64_t *plen) {
    if (off < 0 || off > blen) return ST_OUT_OF_BOUNDS;
    int64_t left = blen - off;
    if (left < HEADER_SIZE) return ST_TRUNCATED;
    const uint8_t *h = base + off;
    uint64_t length = ld64le(h);
    if (masked(rk_crc32c(0, h, 8)) != ld32le(h + 8)) return ST_LENGTH_CRC;
    if (length > (uint64_t)max_len) return ST_TOO_LARGE;
    if (left < OVERHEAD || length > (uint64_t)(left - OVERHEAD)) return ST_TRUNCATED;
    if (size != (int64_t)length + OVERHEAD) return ST_LENGTH_MISMATCH;
    const uint8_t *data = h + HEADER_SIZE;
    if (verify && masked(rk_crc32c(0, data, (size_t)length)) != ld32le(data + length))
        return ST_PAYLOAD_CRC;
    *payload = data;
    *plen = length;
    return ST_OK;
}

/* Do one record's first spans match `expect` ((kind, count, nbytes) triples, -1: any)? */
static inline int spans_expected(const char *expect, Py_ssize_t nexpect, const int64_t *sp) {
    for (Py_ssize_t k = 0; k < nexpect; k++) {
        int64_t want[3]; /* memcpy: expect may be any buffer, unaligned */
        memcpy(want, expect + 24 * k, 24);
        const int64_t *got = sp + 4 * k;
        if ((want[0] >= 0 && got[0] != want[0]) || (want[1] >= 0 && got[1] != want[1]) ||
            (want[2] >= 0 && got[3] != want[2]))
            return 0;
    }
    return 1;
}

/* Decode exactly `count` packed varints from [p, end) into dst: 0, or VARINTS_* why not. */
static inline int read_varints(const uint8_t *p, const uint8_t *end, int64_t count,
                               uint64_t *dst) {
    int64_t k = 0;
    while (p < end) {
        uint64_t v;
        if (*p < 0x80) {
            v = *p++;
        } else if (!(p = rd_varint(p, end, &v))) {
            return VARINTS_MALFORMED;
        }
        if (k == count) return VARINTS_MORE;
        dst[k++] = v;
    }
    return k == count ? 0 : VARINTS_FEWER;
}

/* Parse one payload [p, end) of the buffer at base and fill its F spans
 * (kind, count, start in base, nbytes): 0, or -1 (not an Example read whole). */
RK_HIDDEN int rk_parse_record(const uint8_t *base, const uint8_t *p, const uint8_t *end,
                              Ctx *cx, int64_t *spans);
/* Copy the l-byte value at v (inside the payload [p, end), end = its CRC) to d, zero
 * d up to row, and check the payload CRC in the same pass: 1 if it matches. */
RK_HIDDEN int rk_copy_verified(rk_crc_copy_fn copy, const uint8_t *p, const uint8_t *end,
                               const uint8_t *v, int64_t l, uint8_t *d, int64_t row);

#ifndef _WIN32
/* ------------------------------------------- reader tasks (task.c, runner.c) */

/* How one output column of a task is filled (ColumnSpec in _contract.py). */
typedef struct {
    int mode;          /* COL_* */
    Py_ssize_t key;    /* index into the keys */
    int64_t row_bytes; /* COL_FIXED: bytes per row; COL_PACKED: a value's bytes are a multiple */
    int64_t count;     /* COL_INT64: values per row; COL_PACKED_INT64: a multiple of it;
                          COL_BYTES_LIST: values per record (0: any number) */
    int fusable;       /* may be copied by the fused CRC pass */
    int kind;          /* COL_PACKED: the list it reads (KIND_FLOAT, or KIND_BYTES: one value) */
    int empty_ok;      /* packed and list columns: an absent feature (or no list) is no values */
} RkColSpec;

/* What a Runner's tasks are decoded by: set once, then only read (by any thread). */
typedef struct {
    Keys keys;
    int64_t *expect;    /* keys.n (kind, count, nbytes) triples */
    RkColSpec *cols;
    Py_ssize_t ncols;
    Py_ssize_t nslots;  /* output buffers a task takes: a bytes or packed column two, a
                           bytes list three */
    int verify;
    int64_t max_len;
    int64_t fuse_min;   /* mean framed bytes from which the fused copy is used */
} RkTaskSpec;

/* One task: its inputs and outputs (task.c), and its place in a Runner (runner.c). */
typedef struct RkTask {
    Py_ssize_t n;
    Py_ssize_t nbufs;
    Py_buffer *bufs;   /* the shards, exported until the task is freed */
    int64_t *rec;      /* n * (buffer index, offset, framed size) */
    Py_ssize_t nouts;
    Py_buffer *outs;   /* output slots: bytes columns take two (values, lengths) */
    int64_t *widths;   /* per column, as written: a bytes column's widest value */
    int64_t *needs;    /* per slot: the elements a packed or list column's slot needs (its
                          values, its values' lengths); more than it holds: "not done" */
    /* the Runner's */
    struct RkTask *next; /* queue link */
    int64_t id;
    int state;
    int ok;
    double seconds;
} RkTask;

/* A task from (bufs, rec, outs), its buffers exported and checked; NULL with an error
 * set. With the GIL. */
RK_HIDDEN RkTask *rk_task_make(const RkTaskSpec *spec, PyObject *bufs, PyObject *rec,
                               PyObject *outs);
/* Let go of a task's buffers and free it (NULL: nothing). With the GIL. */
RK_HIDDEN void rk_task_free(RkTask *t);
/* Decode a task with no Python (any thread, GIL not needed; st: spec->keys.n states):
 * 1 outputs filled (t->widths, t->needs set), 0 not for the fast path (t->needs then
 * says what packed slots would hold if it was too small for them). */
RK_HIDDEN int rk_task_run(const RkTaskSpec *spec, RkTask *t, KeyState *st);
#endif

#endif /* RECORDKIT_NATIVE_RECORD_H */
