/*
 * recordkit.native._ext: the one-buffer functions: crc32c (and the table-driven
 * _crc32c_software, for tests) and read, each a single span of a caller's buffer
 * read inside the SIGBUS guard, with the GIL released for large spans. Their pure
 * Python twins are in recordkit/reader/_fallback.py; the per-record batch loops are
 * in batch.c.
 */
#include "recordkit.h"

/* One span of a buffer: its CRC (crc continues from the value given), or a copy to d. */
typedef struct {
    const uint8_t *p;
    uint8_t *d;
    size_t len;
    uint32_t crc;
} SpanJob;

static void span_crc(void *job, RkGuard *g) {
    (void)g;
    SpanJob *j = job;
    j->crc = rk_crc32c(j->crc, j->p, j->len);
}

static void span_copy(void *job, RkGuard *g) {
    (void)g;
    SpanJob *j = job;
    memcpy(j->d, j->p, j->len);
}

PyDoc_STRVAR(crc32c_doc,
"crc32c(data, value=0, /) -> int\n\n"
"CRC-32C of a bytes-like object, continuing from value (0 starts fresh; only\n"
"its low 32 bits count), as the crc32c package computes it. Releases the GIL\n"
"for buffers of 64 KiB or more.");

static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    PyObject *value_obj = NULL;
    if (!PyArg_ParseTuple(args, "y*|O!:crc32c", &view, &PyLong_Type, &value_obj)) return NULL;
    unsigned long long value = value_obj ? PyLong_AsUnsignedLongLongMask(value_obj) : 0;
    if (PyErr_Occurred()) {
        PyBuffer_Release(&view);
        return NULL;
    }
    value &= 0xFFFFFFFFull; /* as the crc32c package does */
    SpanJob job = {view.buf, NULL, (size_t)view.len, (uint32_t)value};
    RkGuard g;
    int faulted;
    {
        RK_RELEASE_GIL((int64_t)job.len);
        faulted = rk_guarded(span_crc, &job, &g);
        RK_ACQUIRE_GIL();
    }
    if (faulted) rk_raise_fault(&g, view.buf, view.len);
    PyBuffer_Release(&view);
    return faulted ? NULL : PyLong_FromUnsignedLong(job.crc);
}

static PyObject *py_crc32c_software(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I:_crc32c_software", &view, &value)) return NULL;
    uint32_t crc = rk_crc32c_sw((uint32_t)value, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

PyDoc_STRVAR(read_doc,
"read(buf, start, length, /) -> bytes\n\n"
"A copy of buf[start:start + length], made inside the SIGBUS guard: MapFault,\n"
"not a crash, if a page of a memory map vanishes under the copy. ValueError\n"
"if the span is outside buf. Releases the GIL for 64 KiB or more.");

static PyObject *py_read(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t start, length;
    if (!PyArg_ParseTuple(args, "y*nn:read", &view, &start, &length)) return NULL;
    if (start < 0 || length < 0 || start > view.len || length > view.len - start) {
        PyErr_Format(PyExc_ValueError, "span start %zd length %zd is outside the buffer (%zd bytes)",
                     start, length, view.len);
        PyBuffer_Release(&view);
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, length);
    if (!out) {
        PyBuffer_Release(&view);
        return NULL;
    }
    SpanJob job = {(const uint8_t *)view.buf + start, (uint8_t *)PyBytes_AS_STRING(out),
                   (size_t)length, 0};
    RkGuard g;
    int faulted;
    {
        RK_RELEASE_GIL((int64_t)length);
        faulted = rk_guarded(span_copy, &job, &g);
        RK_ACQUIRE_GIL();
    }
    if (faulted) {
        rk_raise_fault(&g, view.buf, view.len);
        Py_DECREF(out);
        out = NULL;
    }
    PyBuffer_Release(&view);
    return out;
}

PyMethodDef rk_span_methods[] = {
    {"crc32c", py_crc32c, METH_VARARGS, crc32c_doc},
    {"_crc32c_software", py_crc32c_software, METH_VARARGS,
     "_crc32c_software(data, value=0, /) -> int\n\nThe table-driven path, for tests."},
    {"read", py_read, METH_VARARGS, read_doc},
    {NULL, NULL, 0, NULL},
};
