/*
 * recordkit.native._ext: the batch functions. Each takes Python buffers, runs one loop
 * over many records (or rows) inside the SIGBUS guard with the GIL released when the
 * call has enough work, and returns Python objects: parse_batch, gather,
 * gather_verified and varints (see their docstrings; crc32c and read, one span
 * each, are in spans.c). Their pure Python twins,
 * with the same signatures and results, are in recordkit/reader/_fallback.py.
 */
#include "record.h"

PyDoc_STRVAR(parse_batch_doc,
"parse_batch(buf, offsets, sizes, keys, verify, max_record_bytes=2**31, expect=None, /)\n"
"    -> (status: bytearray, spans: bytearray)\n\n"
"Check the framing of n records and locate the features named by keys.\n\n"
"buf is any contiguous buffer (a shard's mmap); offsets and sizes are 1-d\n"
"int64 arrays of n records (start offset, framed size = payload + 16); keys is\n"
"a tuple of F distinct bytes; verify checks payload CRCs. Returns status, n\n"
"native int32 (0 ok, else a STATUS_* code), and spans, n*F*4 native int64:\n"
"spans[i, k] = (kind, count, start, nbytes), start an absolute offset in buf;\n"
"all zero for records whose status is an error.\n\n"
"expect, if given, is a C-contiguous native int64 buffer of (kind, count,\n"
"nbytes) triples for the first keys (-1: any); a well-formed record whose\n"
"spans differ from it gets STATUS_UNEXPECTED (its spans are filled in).");

typedef struct {
    const uint8_t *base;
    int64_t blen;
    const I64In *offs, *sizes;
    int verify;
    int64_t max_len;
    Ctx *cx;
    int64_t *spans;
    int32_t *status;
    Py_ssize_t n, nkeys;
    const char *expect; /* NULL: no expect */
    Py_ssize_t nexpect;
} ParseJob;

static void parse_reads(void *arg, RkGuard *g) {
    const ParseJob *j = arg;
    for (Py_ssize_t i = 0; i < j->n; i++) {
        const uint8_t *payload = NULL;
        uint64_t plen = 0;
        int64_t *sp = j->spans + i * j->nkeys * 4;
        g->at = i;
        int s = check_frame(j->base, j->blen, i64_at(j->offs, i), i64_at(j->sizes, i), j->verify,
                            j->max_len, &payload, &plen);
        if (s == ST_OK && rk_parse_record(j->base, payload, payload + plen, j->cx, sp) < 0)
            s = ST_MALFORMED;
        if (s != ST_OK) {
            memset(sp, 0, (size_t)j->nkeys * 32);
        } else if (j->expect && !spans_expected(j->expect, j->nexpect, sp)) {
            s = ST_UNEXPECTED;
        }
        j->status[i] = s;
    }
}

static PyObject *py_parse_batch(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *buf_obj, *off_obj, *size_obj, *keys_obj, *expect_obj = Py_None;
    int verify;
    long long max_len = DEFAULT_MAX_RECORD_BYTES;
    if (!PyArg_ParseTuple(args, "OOOOp|LO:parse_batch", &buf_obj, &off_obj, &size_obj, &keys_obj,
                          &verify, &max_len, &expect_obj))
        return NULL;
    if (max_len < 0) {
        PyErr_SetString(PyExc_ValueError, "max_record_bytes must be >= 0");
        return NULL;
    }
    Py_buffer buf, expect;
    int have_expect = expect_obj != Py_None;
    I64In offs, sizes;
    Keys keys;
    PyObject *status_obj = NULL, *spans_obj = NULL, *result = NULL;
    KeyState *st = NULL;
    if (have_expect) {
        if (PyObject_GetBuffer(expect_obj, &expect, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
            return NULL;
        if (expect.itemsize != 8 || !rk_is_i64_format(expect.format) || expect.len % 24) {
            PyErr_SetString(PyExc_ValueError, "expect must hold native int64 triples");
            PyBuffer_Release(&expect);
            return NULL;
        }
    }
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_SIMPLE) < 0) goto release_expect;
    if (rk_i64_in(off_obj, "offsets", &offs) < 0) goto release_buf;
    if (rk_i64_in(size_obj, "sizes", &sizes) < 0) goto release_offs;
    if (rk_keys_init(keys_obj, &keys) < 0) goto release_sizes;
    Py_ssize_t n = offs.n, nkeys = keys.n;
    if (sizes.n != n) {
        PyErr_Format(PyExc_ValueError, "offsets has %zd records, sizes %zd", n, sizes.n);
        goto release_keys;
    }
    Py_ssize_t nexpect = have_expect ? expect.len / 24 : 0;
    if (nexpect > nkeys) {
        PyErr_Format(PyExc_ValueError, "expect has %zd triples for %zd keys", nexpect, nkeys);
        goto release_keys;
    }
    if (nkeys && n > PY_SSIZE_T_MAX / 32 / nkeys) {
        PyErr_NoMemory();
        goto release_keys;
    }
    status_obj = PyByteArray_FromStringAndSize(NULL, n * 4);
    spans_obj = PyByteArray_FromStringAndSize(NULL, n * nkeys * 32);
    st = PyMem_Calloc((size_t)nkeys + 1, sizeof(KeyState));
    if (!status_obj || !spans_obj || !st) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto release_keys;
    }
    {
        int32_t *status = (int32_t *)PyByteArray_AS_STRING(status_obj);
        int64_t *spans = (int64_t *)PyByteArray_AS_STRING(spans_obj);
        const uint8_t *base = buf.buf;
        int64_t blen = (int64_t)buf.len;
        Ctx cx = {&keys, st};
        /* Work: the bytes the CRCs read, plus a parse costing about as much as 512. */
        int64_t work = (int64_t)n * 512;
        for (Py_ssize_t i = 0; verify && i < n && work < RK_GIL_MIN_BYTES; i++) {
            int64_t z = i64_at(&sizes, i); /* clamped: sizes are untrusted */
            work += z > 0 ? (z < RK_GIL_MIN_BYTES ? z : RK_GIL_MIN_BYTES) : 0;
        }
        ParseJob job = {base, blen, &offs, &sizes, verify, (int64_t)max_len, &cx, spans, status,
                        n, nkeys, have_expect ? expect.buf : NULL, nexpect};
        RkGuard g;
        int faulted;
        RK_RELEASE_GIL(work);
        faulted = rk_guarded(parse_reads, &job, &g);
        RK_ACQUIRE_GIL();
        if (faulted) {
            rk_raise_fault(&g, base, blen);
            goto release_keys;
        }
    }
    result = PyTuple_Pack(2, status_obj, spans_obj);
release_keys:
    PyMem_Free(st);
    Py_XDECREF(status_obj);
    Py_XDECREF(spans_obj);
    rk_keys_free(&keys);
release_sizes:
    PyBuffer_Release(&sizes.view);
release_offs:
    PyBuffer_Release(&offs.view);
release_buf:
    PyBuffer_Release(&buf);
release_expect:
    if (have_expect) PyBuffer_Release(&expect);
    return result;
}

typedef struct {
    const uint8_t *src;
    uint8_t *dst;
    const I64In *starts, *lens;
    Py_ssize_t n, row;
} GatherJob;

static void gather_reads(void *arg, RkGuard *g) {
    const GatherJob *j = arg;
    for (Py_ssize_t i = 0; i < j->n; i++) {
        int64_t s = i64_at(j->starts, i), l = i64_at(j->lens, i);
        uint8_t *d = j->dst + i * j->row;
        g->at = i;
        memcpy(d, j->src + s, (size_t)l);
        memset(d + l, 0, (size_t)(j->row - l));
    }
}

PyDoc_STRVAR(gather_doc,
"gather(buf, starts, lengths, out, row_bytes, /) -> None\n\n"
"Copy buf[starts[i]:starts[i] + lengths[i]] to out[i*row_bytes:] and zero the\n"
"rest of each row. out is a writable C-contiguous buffer of exactly\n"
"n*row_bytes bytes. ValueError (before anything is written) if a length is\n"
"negative or over row_bytes, or a span is outside buf.");

static PyObject *py_gather(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *buf_obj, *starts_obj, *lens_obj, *out_obj;
    Py_ssize_t row;
    if (!PyArg_ParseTuple(args, "OOOOn:gather", &buf_obj, &starts_obj, &lens_obj, &out_obj, &row))
        return NULL;
    Py_buffer buf, out;
    I64In starts, lens;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_SIMPLE) < 0) return NULL;
    if (rk_i64_in(starts_obj, "starts", &starts) < 0) goto release_buf;
    if (rk_i64_in(lens_obj, "lengths", &lens) < 0) goto release_starts;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE) < 0) goto release_lens;
    Py_ssize_t n = starts.n;
    if (lens.n != n) {
        PyErr_Format(PyExc_ValueError, "starts has %zd rows, lengths %zd", n, lens.n);
        goto release_out;
    }
    if (row < 0 || (n && row > PY_SSIZE_T_MAX / n) || out.len != n * row) {
        PyErr_Format(PyExc_ValueError, "out has %zd bytes, expected %zd rows of %zd", out.len, n, row);
        goto release_out;
    }
    {
        const uint8_t *src = buf.buf;
        uint8_t *dst = out.buf;
        int64_t blen = (int64_t)buf.len;
        Py_ssize_t bad = -1;
        RK_RELEASE_GIL((int64_t)n * row);
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t s = i64_at(&starts, i), l = i64_at(&lens, i);
            if (l < 0 || l > (int64_t)row || s < 0 || s > blen || l > blen - s) {
                bad = i;
                break;
            }
        }
        RkGuard g;
        int faulted = 0;
        if (bad < 0) {
            GatherJob job = {src, dst, &starts, &lens, n, row};
            faulted = rk_guarded(gather_reads, &job, &g);
        }
        RK_ACQUIRE_GIL();
        if (faulted) {
            rk_raise_fault(&g, src, (Py_ssize_t)blen);
            goto release_out;
        }
        if (bad >= 0) {
            PyErr_Format(PyExc_ValueError,
                         "row %zd: span start %lld length %lld is outside the buffer (%lld bytes) "
                         "or longer than row_bytes=%zd",
                         bad, (long long)i64_at(&starts, bad), (long long)i64_at(&lens, bad),
                         (long long)blen, row);
            goto release_out;
        }
    }
    result = Py_NewRef(Py_None);
release_out:
    PyBuffer_Release(&out);
release_lens:
    PyBuffer_Release(&lens.view);
release_starts:
    PyBuffer_Release(&starts.view);
release_buf:
    PyBuffer_Release(&buf);
    return result;
}

typedef struct {
    const uint8_t *base;
    uint8_t *dst;
    int32_t *status;
    const I64In *offs, *sizes, *starts, *lens;
    Py_ssize_t n, row;
} GatherVerifiedJob;

static void gather_verified_reads(void *arg, RkGuard *g) {
    const GatherVerifiedJob *j = arg;
    for (Py_ssize_t i = 0; i < j->n; i++) {
        int64_t o = i64_at(j->offs, i), z = i64_at(j->sizes, i);
        int64_t s = i64_at(j->starts, i), l = i64_at(j->lens, i);
        const uint8_t *p = j->base + o + HEADER_SIZE, *end = j->base + o + z - 4;
        g->at = i;
        int good = rk_copy_verified(rk_crc32c_copy, p, end, j->base + s, l, j->dst + i * j->row, j->row);
        j->status[i] = good ? ST_OK : ST_PAYLOAD_CRC;
    }
}

PyDoc_STRVAR(gather_verified_doc,
"gather_verified(buf, offsets, sizes, starts, lengths, out, row_bytes, /) -> bytearray\n\n"
"gather() fused with the payload CRC check of the records the spans lie in, in\n"
"one pass over memory: row i gets buf[starts[i]:starts[i] + lengths[i]] (zero\n"
"padded to row_bytes) while the payload of the record at offsets[i] (framed\n"
"size sizes[i]) is checked. Returns n native int32: 0, or STATUS_PAYLOAD_CRC.\n"
"A span of nonzero length must lie inside its record's payload; ValueError\n"
"(before anything is written) otherwise, or if a record is outside buf.");

static PyObject *py_gather_verified(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *buf_obj, *offs_obj, *sizes_obj, *starts_obj, *lens_obj, *out_obj;
    Py_ssize_t row;
    if (!PyArg_ParseTuple(args, "OOOOOOn:gather_verified", &buf_obj, &offs_obj, &sizes_obj,
                          &starts_obj, &lens_obj, &out_obj, &row))
        return NULL;
    Py_buffer buf, out;
    I64In offs, sizes, starts, lens;
    PyObject *result = NULL, *status_obj = NULL;
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_SIMPLE) < 0) return NULL;
    if (rk_i64_in(offs_obj, "offsets", &offs) < 0) goto release_buf;
    if (rk_i64_in(sizes_obj, "sizes", &sizes) < 0) goto release_offs;
    if (rk_i64_in(starts_obj, "starts", &starts) < 0) goto release_sizes;
    if (rk_i64_in(lens_obj, "lengths", &lens) < 0) goto release_starts;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE) < 0) goto release_lens;
    Py_ssize_t n = starts.n;
    if (lens.n != n || offs.n != n || sizes.n != n) {
        PyErr_SetString(PyExc_ValueError, "offsets, sizes, starts and lengths differ in length");
        goto release_out;
    }
    if (row < 0 || (n && row > PY_SSIZE_T_MAX / n) || out.len != n * row) {
        PyErr_Format(PyExc_ValueError, "out has %zd bytes, expected %zd rows of %zd", out.len, n, row);
        goto release_out;
    }
    if (!(status_obj = PyByteArray_FromStringAndSize(NULL, n * 4))) goto release_out;
    {
        const uint8_t *base = buf.buf;
        uint8_t *dst = out.buf;
        int32_t *status = (int32_t *)PyByteArray_AS_STRING(status_obj);
        int64_t blen = (int64_t)buf.len;
        Py_ssize_t bad = -1;
        int64_t work = 0;
        for (Py_ssize_t i = 0; i < n && work < RK_GIL_MIN_BYTES; i++) {
            int64_t z = i64_at(&sizes, i); /* clamped: sizes are untrusted */
            work += z > 0 ? (z < RK_GIL_MIN_BYTES ? z : RK_GIL_MIN_BYTES) : 0;
        }
        RK_RELEASE_GIL(work);
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t o = i64_at(&offs, i), z = i64_at(&sizes, i);
            int64_t s = i64_at(&starts, i), l = i64_at(&lens, i);
            if (o < 0 || z < OVERHEAD || o > blen || z > blen - o || l < 0 || l > (int64_t)row ||
                (l && (s < o + HEADER_SIZE || s > o + z - 4 - l))) {
                bad = i;
                break;
            }
        }
        RkGuard g;
        int faulted = 0;
        if (bad < 0) {
            GatherVerifiedJob job = {base, dst, status, &offs, &sizes, &starts, &lens, n, row};
            faulted = rk_guarded(gather_verified_reads, &job, &g);
        }
        RK_ACQUIRE_GIL();
        if (faulted) {
            rk_raise_fault(&g, base, (Py_ssize_t)blen);
            goto release_out;
        }
        if (bad >= 0) {
            PyErr_Format(PyExc_ValueError,
                         "row %zd: record (offset %lld, size %lld) is outside the buffer, or its "
                         "span (start %lld, length %lld) is outside its payload or row_bytes=%zd",
                         bad, (long long)i64_at(&offs, bad), (long long)i64_at(&sizes, bad),
                         (long long)i64_at(&starts, bad), (long long)i64_at(&lens, bad), row);
            goto release_out;
        }
    }
    result = Py_NewRef(status_obj);
release_out:
    Py_XDECREF(status_obj);
    PyBuffer_Release(&out);
release_lens:
    PyBuffer_Release(&lens.view);
release_starts:
    PyBuffer_Release(&starts.view);
release_sizes:
    PyBuffer_Release(&sizes.view);
release_offs:
    PyBuffer_Release(&offs.view);
release_buf:
    PyBuffer_Release(&buf);
    return result;
}

typedef struct {
    const uint8_t *base;
    int64_t blen;
    uint64_t *dst;
    const I64In *starts, *nbs, *counts;
    Py_ssize_t n;
    Py_ssize_t bad; /* the first bad record (-1: none), and why */
    const char *why;
} VarintsJob;

static void varints_reads(void *arg, RkGuard *g) {
    VarintsJob *j = arg;
    uint64_t *dst = j->dst;
    for (Py_ssize_t i = 0; i < j->n; i++) {
        int64_t s = i64_at(j->starts, i), nb = i64_at(j->nbs, i), c = i64_at(j->counts, i);
        g->at = i;
        if (nb < 0 || s < 0 || s > j->blen || nb > j->blen - s) {
            j->why = "the span is outside the buffer";
        } else {
            switch (read_varints(j->base + s, j->base + s + nb, c, dst)) {
            case VARINTS_MALFORMED:
                j->why = "a varint is truncated or longer than 10 bytes";
                break;
            case VARINTS_MORE:
                j->why = "the span holds more values than its count";
                break;
            case VARINTS_FEWER:
                j->why = "the span holds fewer values than its count";
                break;
            }
        }
        if (j->why) {
            j->bad = i;
            return;
        }
        dst += c;
    }
}

PyDoc_STRVAR(varints_doc,
"varints(buf, starts, nbytes, counts, out, /) -> None\n\n"
"Decode the packed int64 varints buf[starts[i]:starts[i] + nbytes[i]] of n\n"
"records, in order, into out: a writable C-contiguous native int64 buffer of\n"
"exactly sum(counts) values. Each span must hold exactly counts[i] varints of\n"
"at most 10 bytes (two's complement; bits past 64 dropped, as protobuf does);\n"
"ValueError otherwise, or if a span is outside buf.");

static PyObject *py_varints(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *buf_obj, *starts_obj, *nb_obj, *counts_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OOOOO:varints", &buf_obj, &starts_obj, &nb_obj, &counts_obj,
                          &out_obj))
        return NULL;
    Py_buffer buf, out;
    I64In starts, nbs, counts;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_SIMPLE) < 0) return NULL;
    if (rk_i64_in(starts_obj, "starts", &starts) < 0) goto release_buf;
    if (rk_i64_in(nb_obj, "nbytes", &nbs) < 0) goto release_starts;
    if (rk_i64_in(counts_obj, "counts", &counts) < 0) goto release_nbs;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        goto release_counts;
    Py_ssize_t n = starts.n;
    if (nbs.n != n || counts.n != n) {
        PyErr_Format(PyExc_ValueError, "starts, nbytes and counts differ in length (%zd, %zd, %zd)",
                     n, nbs.n, counts.n);
        goto release_out;
    }
    if (out.itemsize != 8 || !rk_is_i64_format(out.format)) {
        PyErr_SetString(PyExc_ValueError, "out must be a buffer of native int64");
        goto release_out;
    }
    {
        int64_t total = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t c = i64_at(&counts, i);
            if (c < 0 || c > (int64_t)(PY_SSIZE_T_MAX / 8) - total) {
                PyErr_Format(PyExc_ValueError, "counts[%zd] = %lld is invalid", i, (long long)c);
                goto release_out;
            }
            total += c;
        }
        if (out.len != total * 8) {
            PyErr_Format(PyExc_ValueError, "out holds %zd values, counts sum to %lld",
                         out.len / 8, (long long)total);
            goto release_out;
        }
        const uint8_t *base = buf.buf;
        int64_t blen = (int64_t)buf.len;
        VarintsJob job = {base, blen, out.buf, &starts, &nbs, &counts, n, -1, NULL};
        RkGuard g;
        int faulted;
        RK_RELEASE_GIL(total * 2); /* ~2 bytes a value for typical int64 lists */
        faulted = rk_guarded(varints_reads, &job, &g);
        RK_ACQUIRE_GIL();
        if (faulted) {
            rk_raise_fault(&g, base, (Py_ssize_t)blen);
            goto release_out;
        }
        Py_ssize_t bad = job.bad;
        const char *why = job.why;
        if (bad >= 0) {
            PyErr_Format(PyExc_ValueError, "record %zd: %s", bad, why);
            goto release_out;
        }
    }
    result = Py_NewRef(Py_None);
release_out:
    PyBuffer_Release(&out);
release_counts:
    PyBuffer_Release(&counts.view);
release_nbs:
    PyBuffer_Release(&nbs.view);
release_starts:
    PyBuffer_Release(&starts.view);
release_buf:
    PyBuffer_Release(&buf);
    return result;
}

PyMethodDef rk_batch_methods[] = {
    {"parse_batch", py_parse_batch, METH_VARARGS, parse_batch_doc},
    {"gather", py_gather, METH_VARARGS, gather_doc},
    {"gather_verified", py_gather_verified, METH_VARARGS, gather_verified_doc},
    {"varints", py_varints, METH_VARARGS, varints_doc},
    {NULL, NULL, 0, NULL},
};
