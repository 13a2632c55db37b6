/*
 * recordkit.native._ext: one reader task of the Runner (runner.c), made from Python's
 * buffers and decoded with no Python at all.
 *
 * A task is the records of one or more batches, each given as (buffer, offset, framed
 * size), and the output arrays to fill (the slots of recordkit/reader/_contract.py).
 * rk_task_make exports and checks them (with the GIL); rk_task_run then runs the whole
 * fast path in one go, on any thread, the GIL not held: framing and CRC checks, the
 * Example parse, the span checks against `expect`, and the copies into the outputs
 * (the biggest column fused with the payload CRC for large records). Any record the
 * fast path does not take -- corrupt, or merely unusual -- makes the whole task "not
 * done" (0): the caller then decodes it the reference way (BatchDecoder), which gives
 * the exact result or error. How tasks are queued, run by threads and collected is
 * runner.c's.
 */
#include "record.h"

#ifndef _WIN32
void rk_task_free(RkTask *t) {
    if (!t) return;
    for (Py_ssize_t i = 0; i < t->nbufs; i++)
        if (t->bufs[i].obj) PyBuffer_Release(&t->bufs[i]);
    for (Py_ssize_t i = 0; i < t->nouts; i++)
        if (t->outs[i].obj) PyBuffer_Release(&t->outs[i]);
    PyMem_Free(t->bufs);
    PyMem_Free(t->outs);
    PyMem_RawFree(t->rec);
    PyMem_RawFree(t->widths);
    PyMem_RawFree(t->needs);
    PyMem_Free(t);
}

/* ---------------------------------------------------------- making a task */

RkTask *rk_task_make(const RkTaskSpec *spec, PyObject *bufs_obj, PyObject *rec_obj,
                     PyObject *outs_obj) {
    if (PyTuple_GET_SIZE(outs_obj) != spec->nslots) {
        PyErr_Format(PyExc_ValueError, "expected %zd output buffers", spec->nslots);
        return NULL;
    }
    RkTask *t = PyMem_Calloc(1, sizeof(RkTask));
    if (!t) {
        PyErr_NoMemory();
        return NULL;
    }
    t->nbufs = PyTuple_GET_SIZE(bufs_obj);
    t->nouts = spec->nslots;
    t->bufs = PyMem_Calloc((size_t)t->nbufs + 1, sizeof(Py_buffer));
    t->outs = PyMem_Calloc((size_t)t->nouts + 1, sizeof(Py_buffer));
    t->widths = PyMem_RawCalloc((size_t)spec->ncols + 1, sizeof(int64_t));
    t->needs = PyMem_RawCalloc((size_t)spec->nslots + 1, sizeof(int64_t));
    if (!t->bufs || !t->outs || !t->widths || !t->needs) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < t->nbufs; i++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(bufs_obj, i), &t->bufs[i], PyBUF_SIMPLE) < 0) goto fail;
    }
    for (Py_ssize_t i = 0; i < t->nouts; i++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(outs_obj, i), &t->outs[i],
                               PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            goto fail;
    }
    {
        Py_buffer rv;
        if (PyObject_GetBuffer(rec_obj, &rv, PyBUF_C_CONTIGUOUS) < 0) goto fail;
        if (rv.len % 24) {
            PyBuffer_Release(&rv);
            PyErr_SetString(PyExc_ValueError, "rec must hold int64 triples");
            goto fail;
        }
        t->n = rv.len / 24;
        t->rec = PyMem_RawMalloc((size_t)rv.len + 1);
        if (!t->rec) {
            PyBuffer_Release(&rv);
            PyErr_NoMemory();
            goto fail;
        }
        memcpy(t->rec, rv.buf, (size_t)rv.len);
        PyBuffer_Release(&rv);
    }
    for (Py_ssize_t i = 0; i < t->n; i++) {
        if (t->rec[3 * i] < 0 || t->rec[3 * i] >= t->nbufs) {
            PyErr_Format(PyExc_ValueError, "record %zd: buffer index %lld out of range", i,
                         (long long)t->rec[3 * i]);
            goto fail;
        }
    }
    /* A bytes column's values output may be too narrow for the task's widest value, a
     * packed or list column's values (and a list's lengths) too small for all of them:
     * rk_task_run then leaves the task to the reference path (or says what it needs). */
    {
        Py_ssize_t slot = 0;
        for (Py_ssize_t c = 0; c < spec->ncols; c++) {
            int mode = spec->cols[c].mode;
            Py_ssize_t per_record = mode == COL_BYTES_LIST ? slot + 2
                                    : (mode == COL_BYTES || mode == COL_PACKED ||
                                       mode == COL_PACKED_INT64)
                                        ? slot + 1
                                        : -1;
            if (per_record >= 0 && t->outs[per_record].len != t->n * 8) {
                PyErr_Format(PyExc_ValueError, "column %zd: the lengths output must hold %zd int64",
                             c, t->n);
                goto fail;
            }
            if (mode == COL_PACKED_INT64 && t->outs[slot].len % 8) {
                PyErr_Format(PyExc_ValueError, "column %zd: the values output must hold int64", c);
                goto fail;
            }
            if (mode == COL_BYTES_LIST && t->outs[slot + 1].len % 8) {
                PyErr_Format(PyExc_ValueError, "column %zd: the value lengths must be int64", c);
                goto fail;
            }
            slot += per_record >= 0 ? per_record - slot + 1 : 1;
        }
    }
    return t;
fail:
    rk_task_free(t);
    return NULL;
}

/* ---------------------------------------------------------- running a task */

/* Where one column of a task goes. */
typedef struct {
    uint8_t *dst;     /* the values output */
    int64_t stride;   /* bytes per row while decoding (a bytes column: as allocated) */
    int64_t *lengths; /* a bytes column's lengths output, else NULL */
    int64_t width;    /* a bytes column: its widest value so far */
    /* packed and list columns: values appended in record order */
    int64_t *counts;  /* per record: its bytes (COL_PACKED) or its values (the others) */
    int64_t cap, at;  /* the values output's room and what the records so far need
                         (bytes; int64 values for COL_PACKED_INT64) */
    int64_t *vlens;   /* COL_BYTES_LIST: each value's length... */
    int64_t vcap, vat; /* ...room for them, and how many so far */
    Py_ssize_t slot;  /* its first output slot */
} ColOut;

static int run_reads(const RkTaskSpec *spec, RkTask *t, Ctx *cx, int64_t *spans,
                     const uint8_t **payloads, ColOut *co, int fuse);

typedef struct {
    const RkTaskSpec *spec;
    RkTask *t;
    Ctx *cx;
    int64_t *spans;
    const uint8_t **payloads;
    ColOut *co;
    int fuse;
    int ok;
} RunJob;

static void run_job(void *arg, RkGuard *g) {
    (void)g;
    RunJob *j = arg;
    j->ok = run_reads(j->spec, j->t, j->cx, j->spans, j->payloads, j->co, j->fuse);
}

/* Records a task reads ahead of the one it decodes: a shuffled task's records lie on
 * pages far apart, so each costs a TLB walk and a cache miss unless fetched early. */
#define PREFETCH_AHEAD 8
/* ...and of a record that far ahead, the lines of up to this many bytes. */
#define PREFETCH_BYTES 2048
/* An asm statement on x86: GCC deletes a loop whose body is only __builtin_prefetch. */
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#define PREFETCH(p) __asm__ volatile("prefetcht0 %0" : : "m"(*(const uint8_t *)(p)))
#elif defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)(p))
#endif

/* Lay out a task's outputs: 0 if one has not the size its column needs. */
static int task_outputs(const RkTaskSpec *spec, const RkTask *t, ColOut *co) {
    Py_ssize_t n = t->n, slot = 0;
    for (Py_ssize_t c = 0; c < spec->ncols; c++) {
        const RkColSpec *col = &spec->cols[c];
        const Py_buffer *out = &t->outs[slot];
        co[c].dst = out->buf;
        co[c].width = 0;
        co[c].lengths = NULL;
        co[c].counts = co[c].vlens = NULL;
        co[c].at = co[c].vat = co[c].cap = co[c].vcap = 0;
        co[c].slot = slot;
        if (col->mode == COL_BYTES) {
            co[c].stride = out->len / n; /* what the caller guessed; a wider value refuses */
            co[c].lengths = t->outs[slot + 1].buf;
            slot += 2;
        } else if (col->mode == COL_PACKED || col->mode == COL_PACKED_INT64) {
            co[c].stride = 0;
            co[c].cap = col->mode == COL_PACKED ? out->len : out->len / 8;
            co[c].counts = t->outs[slot + 1].buf;
            slot += 2;
        } else if (col->mode == COL_BYTES_LIST) {
            co[c].stride = 0;
            co[c].cap = out->len;
            co[c].vlens = t->outs[slot + 1].buf;
            co[c].vcap = t->outs[slot + 1].len / 8;
            co[c].counts = t->outs[slot + 2].buf;
            slot += 3;
        } else {
            int64_t want = col->mode == COL_FIXED ? col->row_bytes : col->count * 8;
            if (out->len != (Py_ssize_t)(want * n)) return 0;
            co[c].stride = want;
            slot += 1;
        }
    }
    return 1;
}

/* Decode one task with no Python at all. 1: outputs filled; 0: not for the fast path.
 *
 * Small records (no fused CRC) go in one record-major pass: each record is checked,
 * parsed and copied into every column while it is in cache, bytes columns at the
 * row width the caller allocated, closed up afterwards if the task's widest value is
 * narrower. A shuffled task's records lie on pages far apart, so each visit costs a
 * TLB walk and cache misses: one visit per record instead of one per column.
 * Large records (fused: the payload CRC computed while copying the biggest value)
 * take two: the framing, the parse and the int64 columns, then every copied column
 * at the task's exact widths (a large value is not copied twice). */
int rk_task_run(const RkTaskSpec *spec, RkTask *t, KeyState *st) {
    Py_ssize_t n = t->n, nkeys = spec->keys.n;
    if (n == 0) return 1;
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t z = t->rec[3 * i + 2];
        total += z > 0 ? z : 0;
    }
    int fuse = spec->verify && total >= (int64_t)n * spec->fuse_min;
    size_t nspans = (size_t)nkeys * 4 * (fuse ? (size_t)n : 1) + 1; /* two passes keep them */
    int64_t *spans = malloc(nspans * sizeof(int64_t));
    const uint8_t **payloads = fuse ? malloc((size_t)n * sizeof(*payloads)) : NULL;
    ColOut *co = malloc(((size_t)spec->ncols + 1) * sizeof(ColOut));
    int ok = 0;
    if (!spans || !co || (fuse && !payloads) || !task_outputs(spec, t, co)) goto done;
    Ctx cx = {&spec->keys, st};
    /* The reads of the shards, guarded: a page that vanishes makes the task "not
     * done", and the consumer's reference path then reports the changed shard. */
    RunJob job = {spec, t, &cx, spans, payloads, co, fuse, 0};
    RkGuard g;
    if (!rk_guarded(run_job, &job, &g)) ok = job.ok;
done:
    free(spans);
    free((void *)payloads);
    free(co);
    return ok;
}

/* Record i of a task: framing (and its payload CRC unless fused), parse into sp, the
 * span check against `expect`. 1, or 0 (not for the fast path). */
static int parse_one(const RkTaskSpec *spec, const RkTask *t, Ctx *cx, int64_t *sp,
                     Py_ssize_t i, int fuse, const uint8_t **payload, uint64_t *plen) {
    const int64_t *rec = t->rec + 3 * i;
    const Py_buffer *b = &t->bufs[rec[0]];
    const uint8_t *base = b->buf;
    if (check_frame(base, (int64_t)b->len, rec[1], rec[2], spec->verify && !fuse, spec->max_len,
                    payload, plen) != ST_OK)
        return 0;
    if (rk_parse_record(base, *payload, *payload + *plen, cx, sp) < 0) return 0;
    return spans_expected((const char *)spec->expect, spec->keys.n, sp);
}

/* Record i's value of a packed or list column (span s, st its key's parse state, the
 * payload [p, p + plen)): its values appended, or only counted where the output is too
 * small; its size noted. With fused, the payload CRC is checked while copying it. 1, or
 * 0 (not for the fast path: another kind, a size the shape refuses, merged lists). */
static int copy_packed(const RkColSpec *col, ColOut *o, const int64_t *s, const uint8_t *base,
                       Py_ssize_t i, const KeyState *st, int fused, const uint8_t *p,
                       uint64_t plen) {
    int kind = (int)s[0];
    if (kind == KIND_ABSENT || kind == KIND_NONE) { /* no values, if the column says so */
        if (!col->empty_ok) return 0;
        o->counts[i] = 0;
        return !fused || masked(rk_crc32c(0, p, (size_t)plen)) == ld32le(p + plen);
    }
    const uint8_t *v = base + s[2];
    int64_t l;
    if (col->mode == COL_PACKED) { /* one packed float run, or one bytes value: copied */
        if (kind != col->kind || (kind == KIND_BYTES && s[1] != 1)) return 0;
        l = s[3];
        if (col->row_bytes && l % col->row_bytes) return 0;
        o->counts[i] = l;
        if (o->at + l <= o->cap) {
            uint8_t *d = o->dst + o->at;
            if (fused) {
                if (!rk_copy_verified(rk_crc32c_copy, p, p + plen, v, l, d, l)) return 0;
            } else {
                memcpy(d, v, (size_t)l);
            }
        }
        o->at += l;
        return 1;
    }
    l = s[1]; /* the number of values */
    if (col->mode == COL_PACKED_INT64) {
        if (kind != KIND_INT64 || (col->count && l % col->count)) return 0;
        o->counts[i] = l;
        if (o->at + l <= o->cap && read_varints(v, v + s[3], l, (uint64_t *)o->dst + o->at))
            return 0;
        o->at += l;
        return 1;
    }
    /* COL_BYTES_LIST: the values of one BytesList, one after another in it */
    if (kind != KIND_BYTES || (col->count && l != col->count) || st->nruns != 1) return 0;
    o->counts[i] = l;
    int64_t len = s[3];
    for (int64_t k = 0; k < l; k++) {
        if (k) { /* the next value: BytesList.value (0x0A), its length, its bytes */
            uint64_t tag, next;
            const uint8_t *q = rd_varint(v + len, st->run_end, &tag);
            if (!q || tag != 0x0A || !(q = rd_len(q, st->run_end, &next))) return 0;
            v = q;
            len = (int64_t)next;
        }
        if (o->at + len <= o->cap) memcpy(o->dst + o->at, v, (size_t)len);
        if (o->vat < o->vcap) o->vlens[o->vat] = len;
        o->at += len;
        o->vat++;
    }
    return 1;
}

/* Copy record i's values (spans sp, payload [p, p + plen); st: the states of its parse,
 * or NULL after another record's) into the columns of kind `which` (COPY_PARSED: the
 * int64 and list columns, read while the parse is at hand; COPY_VALUES: the others; both:
 * all). With fuse, the payload CRC is checked while copying its longest fusable value
 * (or on its own, when there is none). 1 done, 0 not for the fast path. */
enum { COPY_PARSED = 1, COPY_VALUES = 2 };
static int copy_one(const RkTaskSpec *spec, const RkTask *t, const int64_t *sp, ColOut *co,
                    Py_ssize_t i, const uint8_t *p, uint64_t plen, int fuse, int which,
                    const KeyState *st) {
    const uint8_t *base = t->bufs[t->rec[3 * i]].buf;
    Py_ssize_t fused = -1;
    int64_t most = -1;
    for (Py_ssize_t c = 0; fuse && (which & COPY_VALUES) && c < spec->ncols; c++) {
        int64_t len = sp[spec->cols[c].key * 4 + 3];
        if (spec->cols[c].fusable && len > most) {
            most = len;
            fused = c;
        }
    }
    for (Py_ssize_t c = 0; c < spec->ncols; c++) {
        const RkColSpec *col = &spec->cols[c];
        const int64_t *s = sp + col->key * 4;
        const uint8_t *v = base + s[2];
        int64_t l = s[3];
        uint8_t *d = co[c].dst + i * co[c].stride;
        if (col->mode == COL_INT64) {
            if ((which & COPY_PARSED) && read_varints(v, v + l, col->count, (uint64_t *)d)) return 0;
            continue;
        }
        if (col->mode == COL_PACKED_INT64 || col->mode == COL_BYTES_LIST) {
            if ((which & COPY_PARSED) &&
                !copy_packed(col, &co[c], s, base, i, st + col->key, 0, p, plen))
                return 0;
            continue;
        }
        if (col->mode == COL_PACKED) {
            if ((which & COPY_VALUES) &&
                !copy_packed(col, &co[c], s, base, i, NULL, c == fused, p, plen))
                return 0;
            continue;
        }
        if (!(which & COPY_VALUES)) continue;
        if (l > co[c].stride) return 0; /* too narrow: the caller guessed low */
        if (c == fused) {
            if (!rk_copy_verified(rk_crc32c_copy, p, p + plen, v, l, d, co[c].stride)) return 0;
        } else {
            memcpy(d, v, (size_t)l);
            memset(d + l, 0, (size_t)(co[c].stride - l));
        }
    }
    if (fuse && (which & COPY_VALUES) && fused < 0 &&
        masked(rk_crc32c(0, p, (size_t)plen)) != ld32le(p + plen))
        return 0; /* nothing to fuse with: the payload's CRC on its own */
    return 1;
}

/* The widest value of each bytes column (and its lengths output) from record i's spans. */
static void note_lengths(const RkTaskSpec *spec, const int64_t *sp, ColOut *co, Py_ssize_t i) {
    for (Py_ssize_t c = 0; c < spec->ncols; c++) {
        if (!co[c].lengths) continue;
        int64_t l = sp[spec->cols[c].key * 4 + 3];
        co[c].lengths[i] = l;
        if (l > co[c].width) co[c].width = l;
    }
}

/* A bytes column decoded at a stride wider than its widest value: rows of that width,
 * moved up in place (every byte past a value is already zero). */
static void close_up_rows(ColOut *co, Py_ssize_t n) {
    if (co->width >= co->stride || co->width == 0) return;
    for (Py_ssize_t i = 1; i < n; i++)
        memmove(co->dst + i * co->width, co->dst + i * co->stride, (size_t)co->width);
}

/* Fetch the first bytes of record i + PREFETCH_AHEAD of the task (its header, and of a
 * small record all of it) while record i is decoded. */
static inline void prefetch_record(const RkTask *t, Py_ssize_t i) {
    if (i + PREFETCH_AHEAD >= t->n) return;
    const int64_t *ahead = t->rec + 3 * (i + PREFETCH_AHEAD);
    const Py_buffer *pb = &t->bufs[ahead[0]];
    if (ahead[1] < 0 || ahead[2] < 0 || ahead[2] > (int64_t)pb->len - ahead[1]) return;
    const uint8_t *p = (const uint8_t *)pb->buf + ahead[1];
    int64_t span = ahead[2] < PREFETCH_BYTES ? ahead[2] : PREFETCH_BYTES;
    for (int64_t k = 0; k < span; k += 64) PREFETCH(p + k);
}

/* rk_task_run's reads of the shards (and writes of the outputs): 1 done, 0 not taken. */
static int run_reads(const RkTaskSpec *spec, RkTask *t, Ctx *cx, int64_t *spans,
                     const uint8_t **payloads, ColOut *co, int fuse) {
    Py_ssize_t n = t->n, nkeys = spec->keys.n;
    if (!fuse) { /* one record-major pass */
        for (Py_ssize_t i = 0; i < n; i++) {
            const uint8_t *p = NULL;
            uint64_t plen = 0;
            prefetch_record(t, i);
            if (!parse_one(spec, t, cx, spans, i, 0, &p, &plen)) return 0;
            if (!copy_one(spec, t, spans, co, i, p, plen, 0, COPY_PARSED | COPY_VALUES, cx->st))
                return 0;
            note_lengths(spec, spans, co, i);
        }
        for (Py_ssize_t c = 0; c < spec->ncols; c++)
            if (co[c].lengths) close_up_rows(&co[c], n);
    } else { /* large records: parse (and the int64 columns), then the copies at exact widths */
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t *sp = spans + i * nkeys * 4;
            uint64_t plen = 0;
            prefetch_record(t, i);
            if (!parse_one(spec, t, cx, sp, i, 1, &payloads[i], &plen)) return 0;
            if (!copy_one(spec, t, sp, co, i, payloads[i], plen, 1, COPY_PARSED, cx->st)) return 0;
            note_lengths(spec, sp, co, i);
        }
        for (Py_ssize_t c = 0; c < spec->ncols; c++) {
            if (!co[c].lengths) continue;
            if (co[c].width > co[c].stride) return 0; /* too narrow: the caller guessed low */
            co[c].stride = co[c].width;               /* rows of the exact width: no closing up */
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            const int64_t *sp = spans + i * nkeys * 4;
            if (i + PREFETCH_AHEAD < n) { /* the next values: the copies jump across the file */
                const int64_t *ahead = spans + (i + PREFETCH_AHEAD) * nkeys * 4;
                const uint8_t *base = t->bufs[t->rec[3 * (i + PREFETCH_AHEAD)]].buf;
                for (Py_ssize_t c = 0; c < spec->ncols; c++)
                    PREFETCH(base + ahead[spec->cols[c].key * 4 + 2]);
            }
            uint64_t plen = (uint64_t)(t->rec[3 * i + 2] - OVERHEAD);
            if (!copy_one(spec, t, sp, co, i, payloads[i], plen, 1, COPY_VALUES, NULL)) return 0;
        }
    }
    int room = 1; /* every packed and list column fitted its outputs */
    for (Py_ssize_t c = 0; c < spec->ncols; c++) {
        t->widths[c] = co[c].lengths ? co[c].width : co[c].stride;
        if (!co[c].counts) continue;
        t->needs[co[c].slot] = co[c].at;
        if (co[c].vlens) t->needs[co[c].slot + 1] = co[c].vat;
        if (co[c].at > co[c].cap || co[c].vat > co[c].vcap) room = 0;
    }
    return room;
}

#endif /* _WIN32 */
