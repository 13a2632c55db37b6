/*
 * recordkit.native._ext: bytes_lists, the values of many BytesLists as Python bytes
 * (the PyTorch reader's lists of bytes, and bytes_as="list"), in three steps: the
 * lists walked inside the SIGBUS guard (the GIL released for large batches), every
 * bytes object allocated with the GIL held and nothing read, then every value copied
 * into its object inside the guard again. No Python object is made while a page of
 * the caller's map can vanish under the read. Its pure Python twin is in
 * recordkit/reader/_fallback.py.
 */
#include "recordkit.h"

PyDoc_STRVAR(bytes_lists_doc,
"bytes_lists(buf, starts, nbytes, counts, /) -> list\n\n"
"The values of n BytesLists of buf, as parse_batch's spans locate them: record\n"
"i's first value is buf[starts[i]:starts[i] + nbytes[i]], and each of its\n"
"counts[i] - 1 others follows the one before, framed as BytesList.value (0x0A,\n"
"then its length). The spans must be of one list submessage each (parse_batch's\n"
"KIND_BYTES, not KIND_BYTES | KIND_COMPLEX). Returns n lists of bytes; with\n"
"counts None, the n first values as a flat list of bytes (a record of zero values\n"
"has nbytes 0 and gives b\"\"). ValueError if a span or a value lies outside buf or a\n"
"value's framing is not BytesList.value; MapFault if a page vanishes.");

typedef struct {
    const uint8_t *base;
    int64_t blen;
    const I64In *starts, *nbs, *counts; /* counts NULL: one value each */
    Py_ssize_t n;
    int64_t *vstart, *vlen; /* per value, filled by the walk */
    char **dst;             /* per value, its bytes object's storage */
    Py_ssize_t total;       /* values */
    Py_ssize_t bad;         /* the first bad record (-1: none), and why */
    const char *why;
} ListsJob;

static void lists_walk(void *arg, RkGuard *g) {
    ListsJob *j = arg;
    const uint8_t *end = j->base + j->blen;
    Py_ssize_t v = 0;
    for (Py_ssize_t i = 0; i < j->n; i++) {
        int64_t s = i64_at(j->starts, i), nb = i64_at(j->nbs, i);
        int64_t c = j->counts ? i64_at(j->counts, i) : 1;
        g->at = i;
        if (c == 0) continue;
        if (nb < 0 || s < 0 || s > j->blen || nb > j->blen - s) {
            j->why = "the span is outside the buffer";
            j->bad = i;
            return;
        }
        j->vstart[v] = s;
        j->vlen[v++] = nb;
        for (int64_t k = 1; k < c; k++) { /* the next value: 0x0A, its length, its bytes */
            uint64_t tag, len;
            const uint8_t *q = rd_varint(j->base + s + nb, end, &tag);
            if (!q || tag != 0x0A) {
                j->why = "a value after the first is not framed as BytesList.value";
                j->bad = i;
                return;
            }
            if (!(q = rd_len(q, end, &len))) {
                j->why = "a value runs past the end of the buffer";
                j->bad = i;
                return;
            }
            s = q - j->base;
            nb = (int64_t)len;
            j->vstart[v] = s;
            j->vlen[v++] = nb;
        }
    }
}

static void lists_copy(void *arg, RkGuard *g) {
    ListsJob *j = arg;
    for (Py_ssize_t v = 0; v < j->total; v++) {
        g->at = v;
        memcpy(j->dst[v], j->base + j->vstart[v], (size_t)j->vlen[v]);
    }
}

/* Check counts (NULL: one value each) and sum them: 0, or -1 raised. */
static int sum_counts(const I64In *counts, Py_ssize_t n, Py_ssize_t *total) {
    *total = n;
    if (!counts) return 0;
    int64_t sum = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t c = i64_at(counts, i);
        if (c < 0 || c > (int64_t)(PY_SSIZE_T_MAX / 32) - sum) {
            PyErr_Format(PyExc_ValueError, "counts[%zd] = %lld is invalid", i, (long long)c);
            return -1;
        }
        sum += c;
    }
    *total = (Py_ssize_t)sum;
    return 0;
}

/* Value v's bytes object, its storage not yet filled (j->dst[v] set), or NULL. */
static PyObject *new_value(ListsJob *j, Py_ssize_t v) {
    PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)j->vlen[v]);
    if (b) j->dst[v] = PyBytes_AS_STRING(b);
    return b;
}

/* The result's objects, storage not yet filled: a new reference, or NULL. */
static PyObject *lists_alloc(ListsJob *j) {
    PyObject *out = PyList_New(j->n);
    if (!out) return NULL;
    Py_ssize_t v = 0;
    for (Py_ssize_t i = 0; i < j->n; i++) {
        if (!j->counts) { /* flat: one value per record */
            PyObject *b = new_value(j, v++);
            if (!b) goto fail;
            PyList_SET_ITEM(out, i, b);
            continue;
        }
        Py_ssize_t c = (Py_ssize_t)i64_at(j->counts, i);
        PyObject *inner = PyList_New(c);
        if (!inner) goto fail;
        PyList_SET_ITEM(out, i, inner);
        for (Py_ssize_t k = 0; k < c; k++) {
            PyObject *b = new_value(j, v++);
            if (!b) goto fail;
            PyList_SET_ITEM(inner, k, b);
        }
    }
    return out;
fail:
    Py_DECREF(out); /* PyList_New's slots start NULL: a partial list is safe to free */
    return NULL;
}

static PyObject *py_bytes_lists(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *buf_obj, *starts_obj, *nb_obj, *counts_obj;
    if (!PyArg_ParseTuple(args, "OOOO:bytes_lists", &buf_obj, &starts_obj, &nb_obj, &counts_obj))
        return NULL;
    Py_buffer buf;
    I64In starts, nbs, counts;
    int have_counts = counts_obj != Py_None;
    PyObject *result = NULL;
    ListsJob job = {0};
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_SIMPLE) < 0) return NULL;
    if (rk_i64_in(starts_obj, "starts", &starts) < 0) goto release_buf;
    if (rk_i64_in(nb_obj, "nbytes", &nbs) < 0) goto release_starts;
    if (have_counts && rk_i64_in(counts_obj, "counts", &counts) < 0) goto release_nbs;
    Py_ssize_t n = starts.n;
    if (nbs.n != n || (have_counts && counts.n != n)) {
        PyErr_Format(PyExc_ValueError, "starts, nbytes and counts differ in length (%zd, %zd, %zd)",
                     n, nbs.n, have_counts ? counts.n : n);
        goto release_counts;
    }
    job.base = buf.buf;
    job.blen = (int64_t)buf.len;
    job.starts = &starts;
    job.nbs = &nbs;
    job.counts = have_counts ? &counts : NULL;
    job.n = n;
    job.bad = -1;
    if (sum_counts(job.counts, n, &job.total) < 0) goto release_counts;
    job.vstart = PyMem_Malloc((size_t)(job.total ? job.total : 1) * 8);
    job.vlen = PyMem_Malloc((size_t)(job.total ? job.total : 1) * 8);
    job.dst = PyMem_Malloc((size_t)(job.total ? job.total : 1) * sizeof(char *));
    if (!job.vstart || !job.vlen || !job.dst) {
        PyErr_NoMemory();
        goto free_job;
    }
    {
        RkGuard g;
        int faulted;
        RK_RELEASE_GIL((int64_t)job.total * 16); /* a walk step reads ~2 bytes a value */
        faulted = rk_guarded(lists_walk, &job, &g);
        RK_ACQUIRE_GIL();
        if (faulted) {
            rk_raise_fault(&g, buf.buf, buf.len);
            goto free_job;
        }
    }
    if (job.bad >= 0) {
        PyErr_Format(PyExc_ValueError, "record %zd: %s", job.bad, job.why);
        goto free_job;
    }
    PyObject *out = lists_alloc(&job);
    if (!out) goto free_job;
    {
        int64_t bytes = 0;
        for (Py_ssize_t v = 0; v < job.total; v++) bytes += job.vlen[v];
        RkGuard g;
        int faulted;
        RK_RELEASE_GIL(bytes);
        faulted = rk_guarded(lists_copy, &job, &g);
        RK_ACQUIRE_GIL();
        if (faulted) {
            rk_raise_fault(&g, buf.buf, buf.len);
            Py_DECREF(out);
            goto free_job;
        }
    }
    result = out;
free_job:
    PyMem_Free(job.vstart);
    PyMem_Free(job.vlen);
    PyMem_Free(job.dst);
release_counts:
    if (have_counts) PyBuffer_Release(&counts.view);
release_nbs:
    PyBuffer_Release(&nbs.view);
release_starts:
    PyBuffer_Release(&starts.view);
release_buf:
    PyBuffer_Release(&buf);
    return result;
}

PyMethodDef rk_list_methods[] = {
    {"bytes_lists", py_bytes_lists, METH_VARARGS, bytes_lists_doc},
    {NULL, NULL, 0, NULL},
};
