/*
 * recordkit.native._ext: the .idx sidecar (DALI's and the tfrecord package's text,
 * "{offset} {framed_size}\n" a record) read into record boundaries as
 * recordkit/reader/index/shard_index.py holds them:
 * the n + 1 record boundaries (record i spans [bounds[i], bounds[i + 1])), uint32
 * below 4 GiB, uint64 above. The texts are read from maps (filemap.c).
 *
 *   index_parse(text, shard_size, out) -> (status, line, a, b)
 *                          the whole text, one pass: every line strictly parsed and
 *                          every entry checked (below); out has lines + 1 items.
 *   index_scan(text, shift, dir) -> lines, or -1 when dir is too small
 *                          the lines counted, and where every (1 << shift)-th one
 *                          starts (dir[k], uint64): what a lazy index needs to parse
 *                          a block of lines later, alone.
 *   index_fill(text, dir, shift, lines, shard_size, out, filled, records)
 *       -> (status, line, a, b, newly)
 *                          the blocks of lines of `records` (int64; None: all) that
 *                          `filled` (a byte per block) does not mark yet, parsed into
 *                          their boundaries (block k: out[k << shift .. (k + 1) << shift]
 *                          inclusive) and marked; newly: how many this call filled.
 *
 * The checks, of a whole text and of each block alike: every line is two decimal
 * numbers of at most 18 digits, one space between them, a newline after; the first
 * offset of the text is 0; each offset is the previous one plus its size (a block's
 * last line is checked against the first offset of the next block, or against the
 * shard's size for the last); every size is >= 16; every record lies inside the
 * shard. A block's first offset is checked when the block before it is. Statuses:
 *   0 ok; 1 malformed line `line` (0-based): a = byte offset in the text, b = why
 *   (MAL_*); 2 entry `line` = (a, b) does not match the shard; 3 the entries end at
 *   a, not at the shard size; 4 not the number of lines expected (a = lines seen).
 *
 * Every read of a map runs inside the SIGBUS guard (guard.c): a file cut
 * short under its map is a MapFault, not a crash.
 */
#include "recordkit.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define MAX_DIGITS 18 /* 10^18 - 1 < 2^63: no number overflows, nor a sum of two */

typedef struct {
    int status;
    Py_ssize_t line;
    uint64_t a, b;
} Outcome;

static const Outcome OUTCOME_OK = {IDX_OK, 0, 0, 0};

/* One decimal number at *pp, before end (at most MAX_DIGITS digits): 0, or MAL_*. */
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

/* read_number where a newline is known to follow before the end: the digit loop
 * needs no bound (the common case, ~2x faster). */
static inline int read_number_terminated(const uint8_t **pp, uint64_t *value) {
    const uint8_t *p = *pp, *start = p;
    uint64_t v = 0;
    unsigned d;
    while ((d = (unsigned)(*p - '0')) < 10u) {
        v = v * 10u + d;
        p++;
    }
    *pp = p;
    *value = v; /* past MAX_DIGITS it may have wrapped: refused here */
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

static inline void put(void *out, int wide, Py_ssize_t i, uint64_t v) {
    if (wide)
        ((uint64_t *)out)[i] = v;
    else
        ((uint32_t *)out)[i] = (uint32_t)v;
}

/*
 * Parse the lines of text[start:stop] (lines first_line, first_line + 1, ...: exactly
 * `count` of them) into out[first_line ...]. The first offset must be `*expect`
 * unless `any_first` (a block's: the block before checks it); *expect is left at
 * the end of the last entry.
 */
static Outcome parse_lines(const uint8_t *text, Py_ssize_t start, Py_ssize_t stop,
                           Py_ssize_t first_line, Py_ssize_t count, int any_first,
                           uint64_t shard_size, void *out, int wide, uint64_t *expect) {
    const uint8_t *p = text + start, *end = text + stop;
    uint64_t want = *expect, offset = 0, size = 0;
    Py_ssize_t i = first_line, last = first_line + count;
    int why, terminated = stop > start && text[stop - 1] == '\n';
    while (p < end) {
        if (i == last) return (Outcome){IDX_COUNT, i, (uint64_t)(i - first_line) + 1, 0};
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
        if (any_first && i == first_line) {
            if (offset > shard_size) return (Outcome){IDX_ENTRY, i, offset, size};
            want = offset;
        }
        /* want <= shard_size always holds here, so the subtraction cannot wrap */
        if (offset != want || size < OVERHEAD || size > shard_size - offset)
            return (Outcome){IDX_ENTRY, i, offset, size};
        put(out, wide, i, offset);
        i++;
        want = offset + size;
    }
    if (i != last) return (Outcome){IDX_COUNT, i, (uint64_t)(i - first_line), 0};
    *expect = want;
    return OUTCOME_OK;
malformed:
    return (Outcome){IDX_MALFORMED, i, (uint64_t)(p - text), (uint64_t)why};
}

/* ------------------------------------------------------- whole texts, scans, fills */

/* The buffers of a call (released by release_all on every path). */
typedef struct {
    Py_buffer text, dir, filled, out, blocks;
    int have_text, have_dir, have_filled, have_out, have_blocks;
} Bufs;

static void release_all(Bufs *b) {
    if (b->have_text) PyBuffer_Release(&b->text);
    if (b->have_dir) PyBuffer_Release(&b->dir);
    if (b->have_filled) PyBuffer_Release(&b->filled);
    if (b->have_out) PyBuffer_Release(&b->out);
    if (b->have_blocks) PyBuffer_Release(&b->blocks);
}

static int get_text(PyObject *obj, Bufs *b) {
    if (PyObject_GetBuffer(obj, &b->text, PyBUF_C_CONTIGUOUS) < 0) return -1;
    b->have_text = 1;
    return 0;
}

/* out: a writable uint32 or uint64 array of at least `items` items, for a shard of
 * shard_size bytes. Sets *wide. */
static int get_out(PyObject *obj, Bufs *b, Py_ssize_t items, uint64_t shard_size, int *wide) {
    if (PyObject_GetBuffer(obj, &b->out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return -1;
    b->have_out = 1;
    Py_ssize_t width = b->out.itemsize;
    if ((width != 4 && width != 8) || b->out.len % width || b->out.len / width < items) {
        PyErr_SetString(PyExc_ValueError, "out must be a uint32 or uint64 array, large enough");
        return -1;
    }
    if (width == 4 && shard_size > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "a shard of 4 GiB or more needs uint64 bounds");
        return -1;
    }
    *wide = width == 8;
    return 0;
}

/* A writable (dir) or read-only (blocks) array of 8-byte items. */
static int get_u64s(PyObject *obj, Py_buffer *view, int *have, int writable) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    *have = 1;
    if (view->itemsize != 8 || view->len % 8) {
        PyErr_SetString(PyExc_ValueError, "expected an array of 8-byte integers");
        return -1;
    }
    return 0;
}

static PyObject *outcome(Outcome o) {
    return Py_BuildValue("(inKK)", o.status, o.line, (unsigned long long)o.a,
                         (unsigned long long)o.b);
}

/* -- index_parse: a whole text */

typedef struct {
    const uint8_t *text;
    Py_ssize_t len, lines;
    uint64_t shard_size;
    void *out;
    int wide;
    Outcome o;
} ParseJob;

static void parse_reads(void *arg, RkGuard *g) {
    ParseJob *j = arg;
    (void)g;
    uint64_t expect = 0;
    j->o = parse_lines(j->text, 0, j->len, 0, j->lines, 0, j->shard_size, j->out, j->wide,
                       &expect);
    if (j->o.status == IDX_OK) {
        if (expect != j->shard_size) {
            j->o = (Outcome){IDX_END, j->lines, expect, 0};
        } else {
            put(j->out, j->wide, j->lines, expect);
            j->o.line = j->lines;
        }
    }
}

static PyObject *py_index_parse(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *text_obj, *out_obj;
    unsigned long long shard_size;
    if (!PyArg_ParseTuple(args, "OKO:index_parse", &text_obj, &shard_size, &out_obj)) return NULL;
    Bufs b = {0};
    PyObject *result = NULL;
    int wide = 0;
    if (get_text(text_obj, &b) < 0 || get_out(out_obj, &b, 1, shard_size, &wide) < 0) goto done;
    ParseJob job = {b.text.buf, b.text.len, b.out.len / b.out.itemsize - 1, shard_size,
                    b.out.buf, wide, OUTCOME_OK};
    RkGuard g;
    int faulted;
    {
        RK_RELEASE_GIL((int64_t)b.text.len);
        faulted = rk_guarded(parse_reads, &job, &g);
        RK_ACQUIRE_GIL();
    }
    if (faulted)
        rk_raise_fault(&g, b.text.buf, b.text.len);
    else
        result = outcome(job.o);
done:
    release_all(&b);
    return result;
}

/* -- index_scan: count the lines, note where every (1 << shift)-th starts */

typedef struct {
    const uint8_t *text;
    Py_ssize_t len;
    int shift;
    uint64_t *dir;
    Py_ssize_t cap, lines; /* lines: -1 when dir is too small */
} ScanJob;

#define ONES 0x0101010101010101ull
#define LOW7 0x7F7F7F7F7F7F7F7Full

/* Bits set in m (no popcnt instruction assumed: libgcc's call would be slower). */
static inline unsigned pop16(unsigned m) {
    m = m - ((m >> 1) & 0x5555u);
    m = (m & 0x3333u) + ((m >> 2) & 0x3333u);
    m = (m + (m >> 4)) & 0x0F0Fu;
    return (m + (m >> 8)) & 0x1Fu;
}

/* The high bit of each byte of w that is a newline (exactly: no false positives). */
static inline uint64_t newlines(uint64_t w) {
    uint64_t x = w ^ (ONES * '\n');
    return ~(((x & LOW7) + LOW7) | x | LOW7);
}

static void scan_reads(void *arg, RkGuard *g) {
    ScanJob *j = arg;
    (void)g;
    const uint8_t *t = j->text;
    Py_ssize_t n = 0, i = 0, len = j->len, k = 1; /* k: the next directory entry */
    Py_ssize_t step = (Py_ssize_t)1 << j->shift, next = step; /* the line k starts */
    if (j->cap < 1) {
        j->lines = -1;
        return;
    }
    j->dir[0] = 0;
#if defined(__SSE2__)
    const __m128i nl = _mm_set1_epi8('\n');
    for (; i + 16 <= len; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(t + i));
        unsigned m = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, nl));
        if (!m) continue;
        Py_ssize_t c = (Py_ssize_t)pop16(m);
        if (n + c < next) {
            n += c;
            continue;
        }
        for (; m; m &= m - 1) { /* this block completes line `next - 1`: find where */
            n++;
            if (n == next) {
                if (k == j->cap) {
                    j->lines = -1;
                    return;
                }
                j->dir[k++] = (uint64_t)(i + __builtin_ctz(m) + 1);
                next += step;
            }
        }
    }
#endif
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, t + i, 8);
#ifdef RK_BIG_ENDIAN
        w = __builtin_bswap64(w);
#endif
        uint64_t m = newlines(w);
        if (!m) continue;
        Py_ssize_t c = (Py_ssize_t)(((m >> 7) * ONES) >> 56); /* a bit a byte */
        if (n + c < next) {
            n += c;
            continue;
        }
        for (; m; m &= m - 1) { /* this word completes line `next - 1`: find where */
            n++;
            if (n == next) {
                if (k == j->cap) {
                    j->lines = -1;
                    return;
                }
                j->dir[k++] = (uint64_t)(i + (__builtin_ctzll(m) >> 3) + 1);
                next += step;
            }
        }
    }
    for (; i < len; i++) {
        if (t[i] != '\n') continue;
        n++;
        if (n == next) {
            if (k == j->cap) {
                j->lines = -1;
                return;
            }
            j->dir[k++] = (uint64_t)(i + 1);
            next += step;
        }
    }
    if (len && t[len - 1] != '\n') n++; /* a last line without its newline */
    j->lines = n;
}

static PyObject *py_index_scan(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *text_obj, *dir_obj;
    int shift;
    if (!PyArg_ParseTuple(args, "OiO:index_scan", &text_obj, &shift, &dir_obj)) return NULL;
    if (shift < 0 || shift > 30) {
        PyErr_SetString(PyExc_ValueError, "index_scan: shift out of range");
        return NULL;
    }
    Bufs b = {0};
    PyObject *result = NULL;
    if (get_text(text_obj, &b) < 0 || get_u64s(dir_obj, &b.dir, &b.have_dir, 1) < 0) goto done;
    ScanJob job = {b.text.buf, b.text.len, shift, b.dir.buf, b.dir.len / 8, 0};
    RkGuard g;
    int faulted;
    {
        RK_RELEASE_GIL((int64_t)b.text.len);
        faulted = rk_guarded(scan_reads, &job, &g);
        RK_ACQUIRE_GIL();
    }
    if (faulted)
        rk_raise_fault(&g, b.text.buf, b.text.len);
    else
        result = PyLong_FromSsize_t(job.lines);
done:
    release_all(&b);
    return result;
}

/* -- index_fill: blocks of lines */

typedef struct {
    const uint8_t *src;
    Py_ssize_t len;      /* of src */
    const uint64_t *dir; /* where each block of lines starts */
    Py_ssize_t lines;
    int shift;
    uint64_t shard_size;
    void *out;
    int wide;
    uint8_t *filled;        /* a mark per block, set once it is filled in */
    const int64_t *records; /* the records whose blocks are wanted (NULL: every block) */
    Py_ssize_t nrecords;
    Py_ssize_t newly; /* blocks this call filled in */
    Outcome o;
} FillJob;

static Outcome fill_text_block(const FillJob *j, Py_ssize_t k) {
    Py_ssize_t nb = ((j->lines - 1) >> j->shift) + 1;
    Py_ssize_t first = k << j->shift, count = (Py_ssize_t)1 << j->shift;
    if (first + count > j->lines) count = j->lines - first;
    Py_ssize_t lo = (Py_ssize_t)j->dir[k], hi = k + 1 < nb ? (Py_ssize_t)j->dir[k + 1] : j->len;
    if (lo > hi || hi > j->len) return (Outcome){IDX_COUNT, first, 0, 0};
    uint64_t expect = 0;
    Outcome o = parse_lines(j->src, lo, hi, first, count, k > 0, j->shard_size, j->out, j->wide,
                            &expect);
    if (o.status != IDX_OK) return o;
    uint64_t next = j->shard_size;
    if (k + 1 < nb) { /* the next line's offset: the number before its space */
        const uint8_t *p = j->src + hi, *end = j->src + j->len;
        uint64_t size = 0;
        int why = read_number(&p, end, &next);
        if (!why && (p == end || *p != ' ')) why = separator_error(p, end);
        if (!why) {
            p++;
            why = read_number(&p, end, &size);
        }
        if (why) return (Outcome){IDX_MALFORMED, first + count, (uint64_t)(p - j->src), why};
        /* the next block's first entry does not start where this block's last ends */
        if (next != expect) return (Outcome){IDX_ENTRY, first + count, next, size};
    } else if (expect != j->shard_size) {
        return (Outcome){IDX_END, j->lines, expect, 0};
    }
    put(j->out, j->wide, first + count, next);
    return OUTCOME_OK;
}

static void fill_reads(void *arg, RkGuard *g) {
    FillJob *j = arg;
    Py_ssize_t nb = ((j->lines - 1) >> j->shift) + 1;
    Py_ssize_t count = j->records ? j->nrecords : nb;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t k = j->records ? (Py_ssize_t)(j->records[i] >> j->shift) : i;
        if (__atomic_load_n(&j->filled[k], __ATOMIC_ACQUIRE)) continue;
        g->at = k;
        j->o = fill_text_block(j, k);
        if (j->o.status != IDX_OK) return;
        /* Only now may another thread that sees the mark read the block. Racing
         * threads may fill a block twice, with the same values. */
        __atomic_store_n(&j->filled[k], 1, __ATOMIC_RELEASE);
        j->newly++;
    }
}

/* index_fill's out, filled and records (None: every block). */
static int fill_args(Bufs *b, FillJob *job, PyObject *out_obj, PyObject *filled_obj,
                     PyObject *records_obj) {
    if (job->shift < 0 || job->shift > 30 || job->lines < 1) {
        PyErr_SetString(PyExc_ValueError, "bad shift or line count");
        return -1;
    }
    if (get_out(out_obj, b, job->lines + 1, job->shard_size, &job->wide) < 0) return -1;
    job->out = b->out.buf;
    Py_ssize_t nb = ((job->lines - 1) >> job->shift) + 1;
    if (PyObject_GetBuffer(filled_obj, &b->filled, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return -1;
    b->have_filled = 1;
    if (b->filled.itemsize != 1 || b->filled.len != nb) {
        PyErr_SetString(PyExc_ValueError, "filled must be a byte array, one per block");
        return -1;
    }
    job->filled = b->filled.buf;
    if (records_obj != Py_None) {
        if (get_u64s(records_obj, &b->blocks, &b->have_blocks, 0) < 0) return -1;
        job->records = b->blocks.buf;
        job->nrecords = b->blocks.len / 8;
        for (Py_ssize_t i = 0; i < job->nrecords; i++) {
            if (job->records[i] < 0 || job->records[i] >= job->lines) {
                PyErr_SetString(PyExc_IndexError, "a record outside the index");
                return -1;
            }
        }
    }
    return 0;
}

static PyObject *run_fill(Bufs *b, FillJob *job) {
    RkGuard g;
    int faulted;
    {
        Py_ssize_t work = job->records ? job->nrecords : job->lines;
        RK_RELEASE_GIL((int64_t)work << 4);
        faulted = rk_guarded(fill_reads, job, &g);
        RK_ACQUIRE_GIL();
    }
    if (faulted) {
        rk_raise_fault(&g, b->text.buf, b->text.len);
        return NULL;
    }
    return Py_BuildValue("(inKKn)", job->o.status, job->o.line, (unsigned long long)job->o.a,
                         (unsigned long long)job->o.b, job->newly);
}

static PyObject *py_index_fill(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *text_obj, *dir_obj, *out_obj, *filled_obj, *records_obj;
    FillJob job = {0};
    if (!PyArg_ParseTuple(args, "OOinKOOO:index_fill", &text_obj, &dir_obj, &job.shift,
                          &job.lines, &job.shard_size, &out_obj, &filled_obj, &records_obj))
        return NULL;
    Bufs b = {0};
    PyObject *result = NULL;
    if (get_text(text_obj, &b) < 0 || get_u64s(dir_obj, &b.dir, &b.have_dir, 0) < 0 ||
        fill_args(&b, &job, out_obj, filled_obj, records_obj) < 0)
        goto done;
    if (b.dir.len / 8 < ((job.lines - 1) >> job.shift) + 1) {
        PyErr_SetString(PyExc_ValueError, "index_fill: the directory is too short");
        goto done;
    }
    job.src = b.text.buf;
    job.len = b.text.len;
    job.dir = b.dir.buf;
    result = run_fill(&b, &job);
done:
    release_all(&b);
    return result;
}

static PyMethodDef index_methods[] = {
    {"index_parse", py_index_parse, METH_VARARGS,
     "index_parse(text, shard_size, out) -> (status, line, a, b): a whole .idx text parsed "
     "and checked into record boundaries."},
    {"index_scan", py_index_scan, METH_VARARGS,
     "index_scan(text, shift, dir) -> lines (-1: dir too small): where each block of "
     "1 << shift lines starts."},
    {"index_fill", py_index_fill, METH_VARARGS,
     "index_fill(text, dir, shift, lines, shard_size, out, filled, records) -> (status, "
     "line, a, b, blocks filled)."},
    {NULL, NULL, 0, NULL},
};

int rk_index_init(PyObject *m) {
    if (PyModule_AddFunctions(m, index_methods) < 0) return -1;
    struct {
        const char *name;
        long value;
    } consts[] = {
        {"INDEX_OK", IDX_OK},           {"INDEX_MALFORMED", IDX_MALFORMED},
        {"INDEX_ENTRY", IDX_ENTRY},     {"INDEX_END", IDX_END},
        {"INDEX_COUNT", IDX_COUNT},     {"INDEX_MAL_BYTE", MAL_BYTE},
        {"INDEX_MAL_LAYOUT", MAL_LAYOUT}, {"INDEX_MAL_EMPTY", MAL_EMPTY},
        {"INDEX_MAL_LARGE", MAL_LARGE},
    };
    for (size_t i = 0; i < sizeof(consts) / sizeof(consts[0]); i++) {
        if (PyModule_AddIntConstant(m, consts[i].name, consts[i].value) < 0) return -1;
    }
    return 0;
}
