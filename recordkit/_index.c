/* The .idx sidecar parsed and checked in one pass, into a compact array.
 *
 * recordkit/format/index.py has the reference (NumPy: parse_index, then
 * validate_index); recordkit/format/shard_index.py calls this when the
 * extension is built. An index line is "{offset} {framed_size}\n" (DALI's and
 * the tfrecord package's text format). One pass over the text parses each line
 * strictly and checks the entry against the shard as it goes: offsets start at 0
 * and each is the previous one plus its size (contiguous, so monotonic), every
 * size is >= 16, every record lies inside the shard, and the last one ends at the
 * shard's size. What it keeps is the n + 1 record boundaries (offset of record i,
 * and the shard size last): record i spans [bounds[i], bounds[i + 1]), so its size
 * is implied and needs no array. uint32 boundaries for shards below 4 GiB, uint64
 * otherwise: 4 or 8 bytes a record instead of the 16 of two int64 columns.
 *
 * The length fields of the records (the u64 at each offset) are not read here:
 * the shard is not even mapped by this module. shard_index.py checks them.
 *
 *   parse(data, shard_size, out) -> (status, line, a, b)
 *     data: the index text (any contiguous buffer); out: a writable C-contiguous
 *     buffer of uint32 or uint64 with one item per line plus one.
 *     status 0: ok (line = lines parsed);
 *     status 1: malformed line `line` (0-based): a = byte offset in data, b = why (MAL_*);
 *     status 2: entry `line` = (a, b) does not match the shard;
 *     status 3: the entries end at a, not at the shard size;
 *     status 4: out does not have one item per line plus one (a = lines seen).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

enum { IDX_OK = 0, IDX_MALFORMED = 1, IDX_ENTRY = 2, IDX_END = 3, IDX_COUNT = 4 };
enum { MAL_BYTE = 1, MAL_LAYOUT = 2, MAL_EMPTY = 3, MAL_LARGE = 4 };

#define OVERHEAD 16
#define MAX_DIGITS 18 /* 10^18 - 1 < 2^63: no number overflows, nor a sum of two */
#define GIL_MIN_BYTES ((Py_ssize_t)64 << 10)

typedef struct {
    int status;
    Py_ssize_t line;
    uint64_t a, b;
} Outcome;

/* One decimal number at *pp (at most MAX_DIGITS digits); 0, or MAL_* why not. */
static inline int read_number(const uint8_t **pp, const uint8_t *end, uint64_t *value) {
    const uint8_t *p = *pp, *start = p;
    uint64_t v = 0;
    while (p < end && (unsigned)(*p - '0') < 10u) {
        if (p - start == MAX_DIGITS) return MAL_LARGE;
        v = v * 10u + (uint64_t)(*p - '0');
        p++;
    }
    *pp = p;
    *value = v;
    if (p != start) return 0;
    if (p < end && *p != ' ' && *p != '\n') return MAL_BYTE;
    return MAL_EMPTY;
}

/* read_number for text that ends with a newline: no digit loop can run past it, so
 * the loop needs no bound (the common case, ~2x faster). */
static inline int read_number_terminated(const uint8_t **pp, uint64_t *value) {
    const uint8_t *p = *pp, *start = p;
    uint64_t v = 0;
    unsigned d;
    while ((d = (unsigned)(*p - '0')) < 10u) {
        v = v * 10u + d;
        p++;
    }
    *pp = p;
    *value = v; /* past MAX_DIGITS it may have wrapped: refused below */
    if (p - start > MAX_DIGITS) {
        *pp = start + MAX_DIGITS;
        return MAL_LARGE;
    }
    if (p != start) return 0;
    if (*p != ' ' && *p != '\n') return MAL_BYTE;
    return MAL_EMPTY;
}

/* Why the byte at p cannot follow a number: a foreign byte, or a separator out of place. */
static inline int separator_error(const uint8_t *p, const uint8_t *end) {
    if (p < end && *p != ' ' && *p != '\n') return MAL_BYTE;
    return MAL_LAYOUT;
}

/* Parse n lines into out (uint32 when wide == 0, else uint64), checking each entry. */
static Outcome parse_lines(const uint8_t *data, Py_ssize_t len, uint64_t shard_size, void *out,
                           int wide, Py_ssize_t n) {
    const uint8_t *p = data, *end = data + len;
    uint64_t expect = 0, offset = 0, size = 0;
    Py_ssize_t i = 0;
    int why, terminated = len > 0 && data[len - 1] == '\n';
    while (p < end) {
        if (i == n) return (Outcome){IDX_COUNT, i, (uint64_t)i + 1, 0};
        why = terminated ? read_number_terminated(&p, &offset) : read_number(&p, end, &offset);
        if (why) goto malformed;
        if (p == end || *p != ' ') {
            why = separator_error(p, end);
            goto malformed;
        }
        p++;
        why = terminated ? read_number_terminated(&p, &size) : read_number(&p, end, &size);
        if (why) goto malformed;
        if (p < end) { /* the last line's newline may be missing */
            if (*p != '\n') {
                why = separator_error(p, end);
                goto malformed;
            }
            p++;
        }
        /* expect <= shard_size always holds here, so the subtraction cannot wrap */
        if (offset != expect || size < OVERHEAD || size > shard_size - offset)
            return (Outcome){IDX_ENTRY, i, offset, size};
        if (wide)
            ((uint64_t *)out)[i] = offset;
        else
            ((uint32_t *)out)[i] = (uint32_t)offset;
        i++;
        expect = offset + size;
    }
    if (i != n) return (Outcome){IDX_COUNT, i, (uint64_t)i, 0};
    if (expect != shard_size) return (Outcome){IDX_END, i, expect, 0};
    if (wide)
        ((uint64_t *)out)[n] = expect;
    else
        ((uint32_t *)out)[n] = (uint32_t)expect;
    return (Outcome){IDX_OK, i, 0, 0};
malformed:
    return (Outcome){IDX_MALFORMED, i, (uint64_t)(p - data), (uint64_t)why};
}

static PyObject *py_parse(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *data_obj, *out_obj;
    unsigned long long shard_size;
    if (!PyArg_ParseTuple(args, "OKO:parse", &data_obj, &shard_size, &out_obj)) return NULL;
    Py_buffer data, out;
    if (PyObject_GetBuffer(data_obj, &data, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t width = out.itemsize;
    if ((width != 4 && width != 8) || out.len % width || out.len < width) {
        PyErr_SetString(PyExc_ValueError, "parse: out must be a non-empty uint32 or uint64 array");
        goto done;
    }
    if (width == 4 && shard_size > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "parse: a shard of 4 GiB or more needs uint64 bounds");
        goto done;
    }
    Py_ssize_t n = out.len / width - 1;
    Outcome o;
    PyThreadState *save = data.len >= GIL_MIN_BYTES ? PyEval_SaveThread() : NULL;
    o = parse_lines(data.buf, data.len, (uint64_t)shard_size, out.buf, width == 8, n);
    if (save) PyEval_RestoreThread(save);
    result = Py_BuildValue("(inKK)", o.status, o.line, (unsigned long long)o.a,
                           (unsigned long long)o.b);
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&data);
    return result;
}

static PyMethodDef methods[] = {
    {"parse", py_parse, METH_VARARGS,
     "parse(data, shard_size, out) -> (status, line, a, b): an .idx text parsed and checked "
     "into record boundaries (see recordkit/_index.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_index",
    .m_doc = "The .idx sidecar parsed and checked in one pass (recordkit.format.shard_index).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__index(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddIntConstant(m, "OK", IDX_OK) < 0 ||
        PyModule_AddIntConstant(m, "MALFORMED", IDX_MALFORMED) < 0 ||
        PyModule_AddIntConstant(m, "ENTRY", IDX_ENTRY) < 0 ||
        PyModule_AddIntConstant(m, "END", IDX_END) < 0 ||
        PyModule_AddIntConstant(m, "COUNT", IDX_COUNT) < 0 ||
        PyModule_AddIntConstant(m, "MAL_BYTE", MAL_BYTE) < 0 ||
        PyModule_AddIntConstant(m, "MAL_LAYOUT", MAL_LAYOUT) < 0 ||
        PyModule_AddIntConstant(m, "MAL_EMPTY", MAL_EMPTY) < 0 ||
        PyModule_AddIntConstant(m, "MAL_LARGE", MAL_LARGE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
