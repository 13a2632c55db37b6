/*
 * recordkit.native._ext: the Runner, whole reader tasks decoded by threads that never
 * take the GIL.
 *
 * A reader thread calls runner.work() once: it releases the GIL and loops in C,
 * taking tasks from a queue until close(). The consumer submits tasks (a task is
 * the records of one or more batches, each record given as (buffer, offset,
 * framed size), plus the output arrays to fill) and waits for each, in order,
 * with the GIL released. A task runs the whole fast path in one go: framing and
 * CRC checks, the Example parse, the span checks against `expect`, and the
 * copies into the outputs (the biggest column fused with the payload CRC for
 * large records). Any record that the fast path does not take — corrupt, or
 * merely unusual — makes the whole task "not done": the consumer then decodes
 * it the reference way (BatchDecoder), which gives the exact result or error.
 * So a reader thread needs the GIL neither per record nor per task, and a
 * finished task needs it only when the consumer takes it.
 *
 * run() is the same task run by the calling thread instead (recordkit.tf's native
 * path, where TensorFlow's threads call in: one GIL release per task).
 *
 * The task's contract with Python (the column specs, the output slots and their
 * sizes, what a record must look like to be taken) is spelled out once, in
 * recordkit/reader/_contract.py.
 */
#include "record.h"

#ifndef _WIN32
#include <pthread.h>
#include <time.h>

enum { T_QUEUED = 0, T_RUNNING = 1, T_DONE = 2 };

typedef struct {
    int mode;          /* COL_* */
    Py_ssize_t key;    /* index into the keys */
    int64_t row_bytes; /* COL_FIXED: bytes per row */
    int64_t count;     /* COL_INT64: values per row */
    int fusable;       /* may be copied by the fused CRC pass */
} ColSpec;

typedef struct Task {
    struct Task *next;  /* queue link */
    int64_t id;
    Py_ssize_t n;
    Py_ssize_t nbufs;
    Py_buffer *bufs;   /* the shards, exported until the task is collected */
    int64_t *rec;      /* n * (buffer index, offset, framed size) */
    Py_ssize_t nouts;
    Py_buffer *outs;   /* output slots: bytes columns take two (values, lengths) */
    int64_t *widths;   /* per column: the padded width of a bytes column */
    int state;
    int ok;
    double seconds;
} Task;

typedef struct {
    PyObject_HEAD
    Keys keys;
    PyObject *keys_obj;
    int64_t *expect;   /* nkeys * 3 */
    ColSpec *cols;
    Py_ssize_t ncols;
    Py_ssize_t nslots;
    int verify;
    int64_t max_len;
    int64_t fuse_min;  /* mean framed bytes from which the fused copy is used */
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    int sync_ok;
    Task *head, *tail; /* queued */
    Task **all;        /* submitted, not yet collected, by id order */
    Py_ssize_t nall, capall;
    int64_t next_id;
    int closed;
    int workers;
} Runner;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void task_free(Task *t) {
    if (!t) return;
    for (Py_ssize_t i = 0; i < t->nbufs; i++)
        if (t->bufs[i].obj) PyBuffer_Release(&t->bufs[i]);
    for (Py_ssize_t i = 0; i < t->nouts; i++)
        if (t->outs[i].obj) PyBuffer_Release(&t->outs[i]);
    PyMem_Free(t->bufs);
    PyMem_Free(t->outs);
    PyMem_RawFree(t->rec);
    PyMem_RawFree(t->widths);
    PyMem_Free(t);
}

/* Where one column of a task goes. */
typedef struct {
    uint8_t *dst;     /* the values output */
    int64_t stride;   /* bytes per row while decoding (a bytes column: as allocated) */
    int64_t *lengths; /* a bytes column's lengths output, else NULL */
    int64_t width;    /* a bytes column: its widest value so far */
} ColOut;

static int run_reads(const Runner *r, Task *t, Ctx *cx, int64_t *spans,
                     const uint8_t **payloads, ColOut *co, int fuse);

typedef struct {
    const Runner *r;
    Task *t;
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
    j->ok = run_reads(j->r, j->t, j->cx, j->spans, j->payloads, j->co, j->fuse);
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
static int task_outputs(const Runner *r, const Task *t, ColOut *co) {
    Py_ssize_t n = t->n, slot = 0;
    for (Py_ssize_t c = 0; c < r->ncols; c++) {
        const ColSpec *col = &r->cols[c];
        const Py_buffer *out = &t->outs[slot];
        co[c].dst = out->buf;
        co[c].width = 0;
        co[c].lengths = NULL;
        if (col->mode == COL_BYTES) {
            co[c].stride = out->len / n; /* what the caller guessed; a wider value refuses */
            co[c].lengths = t->outs[slot + 1].buf;
            slot += 2;
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
static int run_task(const Runner *r, Task *t, KeyState *st) {
    Py_ssize_t n = t->n, nkeys = r->keys.n;
    if (n == 0) return 1;
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t z = t->rec[3 * i + 2];
        total += z > 0 ? z : 0;
    }
    int fuse = r->verify && total >= (int64_t)n * r->fuse_min;
    size_t nspans = (size_t)nkeys * 4 * (fuse ? (size_t)n : 1) + 1; /* two passes keep them */
    int64_t *spans = malloc(nspans * sizeof(int64_t));
    const uint8_t **payloads = fuse ? malloc((size_t)n * sizeof(*payloads)) : NULL;
    ColOut *co = malloc(((size_t)r->ncols + 1) * sizeof(ColOut));
    int ok = 0;
    if (!spans || !co || (fuse && !payloads) || !task_outputs(r, t, co)) goto done;
    Ctx cx = {&r->keys, st};
    /* The reads of the shards, guarded: a page that vanishes makes the task "not
     * done", and the consumer's reference path then reports the changed shard. */
    RunJob job = {r, t, &cx, spans, payloads, co, fuse, 0};
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
static int parse_one(const Runner *r, const Task *t, Ctx *cx, int64_t *sp, Py_ssize_t i, int fuse,
                     const uint8_t **payload, uint64_t *plen) {
    const int64_t *rec = t->rec + 3 * i;
    const Py_buffer *b = &t->bufs[rec[0]];
    const uint8_t *base = b->buf;
    if (check_frame(base, (int64_t)b->len, rec[1], rec[2], r->verify && !fuse, r->max_len, payload,
                    plen) != ST_OK)
        return 0;
    if (rk_parse_record(base, *payload, *payload + *plen, cx, sp) < 0) return 0;
    return spans_expected((const char *)r->expect, r->keys.n, sp);
}

/* Copy record i's values (spans sp, payload [p, p + plen)) into the columns of kind
 * `which` (COPY_INT64: the int64 columns; COPY_VALUES: the others; both: all). With
 * fuse, the payload CRC is checked while copying its longest fusable value (or on
 * its own, when there is none). 1 done, 0 not for the fast path. */
enum { COPY_INT64 = 1, COPY_VALUES = 2 };
static int copy_one(const Runner *r, const Task *t, const int64_t *sp, ColOut *co, Py_ssize_t i,
                    const uint8_t *p, uint64_t plen, int fuse, int which) {
    const uint8_t *base = t->bufs[t->rec[3 * i]].buf;
    Py_ssize_t fused = -1;
    int64_t most = -1;
    for (Py_ssize_t c = 0; fuse && (which & COPY_VALUES) && c < r->ncols; c++) {
        int64_t len = sp[r->cols[c].key * 4 + 3];
        if (r->cols[c].fusable && len > most) {
            most = len;
            fused = c;
        }
    }
    for (Py_ssize_t c = 0; c < r->ncols; c++) {
        const ColSpec *col = &r->cols[c];
        const int64_t *s = sp + col->key * 4;
        const uint8_t *v = base + s[2];
        int64_t l = s[3];
        uint8_t *d = co[c].dst + i * co[c].stride;
        if (col->mode == COL_INT64) {
            if ((which & COPY_INT64) && read_varints(v, v + l, col->count, (uint64_t *)d)) return 0;
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
static void note_lengths(const Runner *r, const int64_t *sp, ColOut *co, Py_ssize_t i) {
    for (Py_ssize_t c = 0; c < r->ncols; c++) {
        if (!co[c].lengths) continue;
        int64_t l = sp[r->cols[c].key * 4 + 3];
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
static inline void prefetch_record(const Task *t, Py_ssize_t i) {
    if (i + PREFETCH_AHEAD >= t->n) return;
    const int64_t *ahead = t->rec + 3 * (i + PREFETCH_AHEAD);
    const Py_buffer *pb = &t->bufs[ahead[0]];
    if (ahead[1] < 0 || ahead[2] < 0 || ahead[2] > (int64_t)pb->len - ahead[1]) return;
    const uint8_t *p = (const uint8_t *)pb->buf + ahead[1];
    int64_t span = ahead[2] < PREFETCH_BYTES ? ahead[2] : PREFETCH_BYTES;
    for (int64_t k = 0; k < span; k += 64) PREFETCH(p + k);
}

/* run_task's reads of the shards (and writes of the outputs): 1 done, 0 not taken. */
static int run_reads(const Runner *r, Task *t, Ctx *cx, int64_t *spans,
                     const uint8_t **payloads, ColOut *co, int fuse) {
    Py_ssize_t n = t->n, nkeys = r->keys.n;
    if (!fuse) { /* one record-major pass */
        for (Py_ssize_t i = 0; i < n; i++) {
            const uint8_t *p = NULL;
            uint64_t plen = 0;
            prefetch_record(t, i);
            if (!parse_one(r, t, cx, spans, i, 0, &p, &plen)) return 0;
            if (!copy_one(r, t, spans, co, i, p, plen, 0, COPY_INT64 | COPY_VALUES)) return 0;
            note_lengths(r, spans, co, i);
        }
        for (Py_ssize_t c = 0; c < r->ncols; c++)
            if (co[c].lengths) close_up_rows(&co[c], n);
    } else { /* large records: parse (and the int64 columns), then the copies at exact widths */
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t *sp = spans + i * nkeys * 4;
            uint64_t plen = 0;
            prefetch_record(t, i);
            if (!parse_one(r, t, cx, sp, i, 1, &payloads[i], &plen)) return 0;
            if (!copy_one(r, t, sp, co, i, payloads[i], plen, 1, COPY_INT64)) return 0;
            note_lengths(r, sp, co, i);
        }
        for (Py_ssize_t c = 0; c < r->ncols; c++) {
            if (!co[c].lengths) continue;
            if (co[c].width > co[c].stride) return 0; /* too narrow: the caller guessed low */
            co[c].stride = co[c].width;               /* rows of the exact width: no closing up */
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            const int64_t *sp = spans + i * nkeys * 4;
            if (i + PREFETCH_AHEAD < n) { /* the next values: the copies jump across the file */
                const int64_t *ahead = spans + (i + PREFETCH_AHEAD) * nkeys * 4;
                const uint8_t *base = t->bufs[t->rec[3 * (i + PREFETCH_AHEAD)]].buf;
                for (Py_ssize_t c = 0; c < r->ncols; c++)
                    PREFETCH(base + ahead[r->cols[c].key * 4 + 2]);
            }
            uint64_t plen = (uint64_t)(t->rec[3 * i + 2] - OVERHEAD);
            if (!copy_one(r, t, sp, co, i, payloads[i], plen, 1, COPY_VALUES)) return 0;
        }
    }
    for (Py_ssize_t c = 0; c < r->ncols; c++) t->widths[c] = co[c].lengths ? co[c].width : co[c].stride;
    return 1;
}

static void runner_drop_all(Runner *r) {
    for (Py_ssize_t i = 0; i < r->nall; i++) task_free(r->all[i]);
    r->nall = 0;
    r->head = r->tail = NULL;
}

static void Runner_dealloc(Runner *r) {
    runner_drop_all(r); /* workers hold a reference while they run: none runs now */
    PyMem_Free(r->all);
    PyMem_Free(r->expect);
    PyMem_Free(r->cols);
    rk_keys_free(&r->keys);
    Py_XDECREF(r->keys_obj);
    if (r->sync_ok) {
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->work_cv);
        pthread_cond_destroy(&r->done_cv);
    }
    Py_TYPE(r)->tp_free((PyObject *)r);
}

/* Runner(keys, expect, columns, verify, max_record_bytes, fuse_min_bytes) */
static int Runner_init(Runner *r, PyObject *args, PyObject *kwds) {
    (void)kwds;
    PyObject *keys_obj, *expect_obj, *cols_obj;
    int verify;
    long long max_len, fuse_min;
    if (r->keys_obj) {
        PyErr_SetString(PyExc_RuntimeError, "Runner is already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O!OO!pLL:Runner", &PyTuple_Type, &keys_obj, &expect_obj,
                          &PyTuple_Type, &cols_obj, &verify, &max_len, &fuse_min))
        return -1;
    if (rk_keys_init(keys_obj, &r->keys) < 0) return -1;
    r->keys_obj = Py_NewRef(keys_obj);
    Py_ssize_t nkeys = r->keys.n;
    Py_buffer ex;
    if (PyObject_GetBuffer(expect_obj, &ex, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (ex.len != nkeys * 24) {
        PyErr_Format(PyExc_ValueError, "expect must hold %zd int64 triples", nkeys);
        PyBuffer_Release(&ex);
        return -1;
    }
    r->expect = PyMem_Malloc((size_t)nkeys * 24 + 1);
    if (!r->expect) {
        PyBuffer_Release(&ex);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(r->expect, ex.buf, (size_t)ex.len);
    PyBuffer_Release(&ex);
    r->ncols = PyTuple_GET_SIZE(cols_obj);
    r->cols = PyMem_Calloc((size_t)r->ncols + 1, sizeof(ColSpec));
    if (!r->cols) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t c = 0; c < r->ncols; c++) {
        ColSpec *col = &r->cols[c];
        long long key, row, count;
        int mode, fusable;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(cols_obj, c), "iLLLp:column", &mode, &key, &row,
                              &count, &fusable))
            return -1;
        if (mode < COL_BYTES || mode > COL_INT64 || key < 0 || key >= nkeys || row < 0 || count < 0) {
            PyErr_Format(PyExc_ValueError, "column %zd: bad spec", c);
            return -1;
        }
        col->mode = mode;
        col->key = (Py_ssize_t)key;
        col->row_bytes = row;
        col->count = count;
        col->fusable = fusable && mode != COL_INT64;
        r->nslots += mode == COL_BYTES ? 2 : 1;
    }
    r->verify = verify;
    r->max_len = max_len;
    r->fuse_min = fuse_min;
    if (pthread_mutex_init(&r->mu, NULL) || pthread_cond_init(&r->work_cv, NULL) ||
        pthread_cond_init(&r->done_cv, NULL)) {
        PyErr_SetString(PyExc_OSError, "could not create the runner's locks");
        return -1;
    }
    r->sync_ok = 1;
    return 0;
}

/* A task from (bufs, rec, outs), its buffers exported and checked; NULL with an error set. */
static Task *task_make(const Runner *r, PyObject *bufs_obj, PyObject *rec_obj, PyObject *outs_obj) {
    if (!r->sync_ok) {
        PyErr_SetString(PyExc_RuntimeError, "Runner is not initialised");
        return NULL;
    }
    if (PyTuple_GET_SIZE(outs_obj) != r->nslots) {
        PyErr_Format(PyExc_ValueError, "expected %zd output buffers", r->nslots);
        return NULL;
    }
    Task *t = PyMem_Calloc(1, sizeof(Task));
    if (!t) {
        PyErr_NoMemory();
        return NULL;
    }
    t->nbufs = PyTuple_GET_SIZE(bufs_obj);
    t->nouts = r->nslots;
    t->bufs = PyMem_Calloc((size_t)t->nbufs + 1, sizeof(Py_buffer));
    t->outs = PyMem_Calloc((size_t)t->nouts + 1, sizeof(Py_buffer));
    t->widths = PyMem_RawCalloc((size_t)r->ncols + 1, sizeof(int64_t));
    if (!t->bufs || !t->outs || !t->widths) {
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
    /* A bytes column's values output may be too narrow for the task's widest value:
     * run_task then leaves the task to the reference path. */
    {
        Py_ssize_t slot = 0;
        for (Py_ssize_t c = 0; c < r->ncols; c++) {
            if (r->cols[c].mode == COL_BYTES) {
                if (t->outs[slot + 1].len != t->n * 8) {
                    PyErr_Format(PyExc_ValueError, "column %zd: the lengths output must hold %zd int64",
                                 c, t->n);
                    goto fail;
                }
                slot += 2;
            } else {
                slot += 1;
            }
        }
    }
    return t;
fail:
    task_free(t);
    return NULL;
}

/* submit(bufs, rec, outs) -> id; rec: n*3 int64 (buffer index, offset, framed size). */
static PyObject *Runner_submit(Runner *r, PyObject *args) {
    PyObject *bufs_obj, *rec_obj, *outs_obj;
    if (!PyArg_ParseTuple(args, "O!OO!:submit", &PyTuple_Type, &bufs_obj, &rec_obj, &PyTuple_Type,
                          &outs_obj))
        return NULL;
    Task *t = task_make(r, bufs_obj, rec_obj, outs_obj);
    if (!t) return NULL;
    if (r->nall == r->capall) {
        Py_ssize_t cap = r->capall ? 2 * r->capall : 16;
        Task **all = PyMem_Realloc(r->all, (size_t)cap * sizeof(Task *));
        if (!all) {
            PyErr_NoMemory();
            goto fail;
        }
        r->all = all;
        r->capall = cap;
    }
    pthread_mutex_lock(&r->mu);
    if (r->closed) {
        pthread_mutex_unlock(&r->mu);
        PyErr_SetString(PyExc_RuntimeError, "Runner is closed");
        goto fail;
    }
    t->id = r->next_id++;
    r->all[r->nall++] = t;
    if (r->tail) r->tail->next = t;
    else r->head = t;
    r->tail = t;
    pthread_cond_signal(&r->work_cv);
    pthread_mutex_unlock(&r->mu);
    return PyLong_FromLongLong(t->id);
fail:
    task_free(t);
    return NULL;
}

/* run(bufs, rec, outs) -> (ok, widths): one task run by the calling thread, the GIL
 * released once for all of it (recordkit.tf's native path: a tf.numpy_function per
 * task, where each reacquisition of the GIL can wait out a switch interval). */
static PyObject *Runner_run(Runner *r, PyObject *args) {
    PyObject *bufs_obj, *rec_obj, *outs_obj;
    if (!PyArg_ParseTuple(args, "O!OO!:run", &PyTuple_Type, &bufs_obj, &rec_obj, &PyTuple_Type,
                          &outs_obj))
        return NULL;
    Task *t = task_make(r, bufs_obj, rec_obj, outs_obj);
    if (!t) return NULL;
    KeyState *st = PyMem_RawCalloc((size_t)r->keys.n + 1, sizeof(KeyState));
    if (!st) {
        task_free(t);
        return PyErr_NoMemory();
    }
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = run_task(r, t, st);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(st);
    PyObject *widths = PyTuple_New(r->ncols);
    for (Py_ssize_t c = 0; widths && c < r->ncols; c++) {
        PyObject *w = PyLong_FromLongLong(t->widths[c]);
        if (!w) Py_CLEAR(widths);
        else PyTuple_SET_ITEM(widths, c, w);
    }
    task_free(t);
    if (!widths) return NULL;
    return Py_BuildValue("(ON)", ok ? Py_True : Py_False, widths);
}

/* work(): run tasks with the GIL released until close(); returns the tasks run. */
static PyObject *Runner_work(Runner *r, PyObject *Py_UNUSED(ignored)) {
    if (!r->sync_ok) {
        PyErr_SetString(PyExc_RuntimeError, "Runner is not initialised");
        return NULL;
    }
    KeyState *st = PyMem_RawCalloc((size_t)r->keys.n + 1, sizeof(KeyState));
    if (!st) return PyErr_NoMemory();
    long long ran = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&r->mu);
    r->workers++;
    for (;;) {
        while (!r->head && !r->closed) pthread_cond_wait(&r->work_cv, &r->mu);
        if (r->closed) break;
        Task *t = r->head;
        r->head = t->next;
        if (!r->head) r->tail = NULL;
        t->state = T_RUNNING;
        pthread_mutex_unlock(&r->mu);
        double t0 = now_s();
        int ok = run_task(r, t, st);
        double dt = now_s() - t0;
        pthread_mutex_lock(&r->mu);
        t->ok = ok;
        t->seconds = dt;
        t->state = T_DONE;
        ran++;
        pthread_cond_broadcast(&r->done_cv);
    }
    r->workers--;
    pthread_cond_broadcast(&r->done_cv);
    pthread_mutex_unlock(&r->mu);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(st);
    return PyLong_FromLongLong(ran);
}

/* wait(id) -> (ok, widths, seconds); the task is then collected (its buffers let go). */
static PyObject *Runner_wait(Runner *r, PyObject *arg) {
    long long id = PyLong_AsLongLong(arg);
    if (id == -1 && PyErr_Occurred()) return NULL;
    if (!r->sync_ok) {
        PyErr_SetString(PyExc_RuntimeError, "Runner is not initialised");
        return NULL;
    }
    Py_ssize_t at = -1;
    for (Py_ssize_t i = 0; i < r->nall; i++) {
        if (r->all[i]->id == id) {
            at = i;
            break;
        }
    }
    if (at < 0) {
        PyErr_Format(PyExc_KeyError, "no task %lld", id);
        return NULL;
    }
    Task *t = r->all[at];
    int gone = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&r->mu);
    while (t->state != T_DONE && !(r->closed && t->state == T_QUEUED))
        pthread_cond_wait(&r->done_cv, &r->mu);
    gone = t->state != T_DONE;
    pthread_mutex_unlock(&r->mu);
    Py_END_ALLOW_THREADS
    if (gone) {
        PyErr_SetString(PyExc_RuntimeError, "the runner was closed before the task ran");
        return NULL;
    }
    PyObject *widths = PyTuple_New(r->ncols);
    if (!widths) return NULL;
    for (Py_ssize_t c = 0; c < r->ncols; c++) {
        PyObject *w = PyLong_FromLongLong(t->widths[c]);
        if (!w) {
            Py_DECREF(widths);
            return NULL;
        }
        PyTuple_SET_ITEM(widths, c, w);
    }
    PyObject *result = Py_BuildValue("(ONd)", t->ok ? Py_True : Py_False, widths, t->seconds);
    pthread_mutex_lock(&r->mu);
    memmove(&r->all[at], &r->all[at + 1], (size_t)(r->nall - at - 1) * sizeof(Task *));
    r->nall--;
    pthread_mutex_unlock(&r->mu);
    task_free(t);
    return result;
}

/* close(): stop the workers (a task in progress finishes); queued tasks never run. */
static PyObject *Runner_close(Runner *r, PyObject *Py_UNUSED(ignored)) {
    if (r->sync_ok) {
        pthread_mutex_lock(&r->mu);
        r->closed = 1;
        pthread_cond_broadcast(&r->work_cv);
        pthread_cond_broadcast(&r->done_cv);
        pthread_mutex_unlock(&r->mu);
    }
    Py_RETURN_NONE;
}

/* drop(): close, wait until no worker runs a task (GIL released), then let go of
 * every task's buffers. Waits in C, not on Python threads: it also works while the
 * interpreter shuts down, when joining a thread may return early. */
static PyObject *Runner_drop(Runner *r, PyObject *Py_UNUSED(ignored)) {
    if (!r->sync_ok) Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&r->mu);
    r->closed = 1;
    pthread_cond_broadcast(&r->work_cv);
    while (r->workers > 0) pthread_cond_wait(&r->done_cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    Py_END_ALLOW_THREADS
    runner_drop_all(r);
    Py_RETURN_NONE;
}

static PyMethodDef Runner_methods[] = {
    {"submit", (PyCFunction)Runner_submit, METH_VARARGS,
     "submit(bufs, rec, outs, /) -> int: queue a task, return its id."},
    {"run", (PyCFunction)Runner_run, METH_VARARGS,
     "run(bufs, rec, outs, /) -> (ok, widths): run one task here, the GIL released once."},
    {"work", (PyCFunction)Runner_work, METH_NOARGS,
     "work() -> int: run tasks with the GIL released until close()."},
    {"wait", (PyCFunction)Runner_wait, METH_O,
     "wait(id, /) -> (ok, widths, seconds): wait for a task (GIL released), collect it."},
    {"close", (PyCFunction)Runner_close, METH_NOARGS, "close() -> None: stop the workers."},
    {"drop", (PyCFunction)Runner_drop, METH_NOARGS,
     "drop() -> None: close, wait for the workers to leave, let go of the tasks not collected."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject rk_RunnerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "recordkit.native._ext.Runner",
    .tp_basicsize = sizeof(Runner),
    .tp_dealloc = (destructor)Runner_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Runner(keys, expect, columns, verify, max_record_bytes, fuse_min_bytes)\n\n"
              "Decodes whole reader tasks on threads that never take the GIL (see runner.c).",
    .tp_methods = Runner_methods,
    .tp_init = (initproc)Runner_init,
    .tp_new = PyType_GenericNew,
};
#endif /* _WIN32 */
