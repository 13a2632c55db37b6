/*
 * recordkit/native/recordkit.h: what the units of the recordkit.native._ext extension share.
 *
 * The extension is one module built from several units, each to be read on its own:
 *
 *   module.c           the module: its functions, constants and types, set up at import
 *   crc.c              CRC-32C: the table-driven path, SSE4.2 and ARMv8 back-ends, and a
 *                      copy that computes the CRC of what it copies in the same pass
 *   guard.c            buffers: the SIGBUS guard around every read of a caller's buffer
 *                      (and its MapFault error), int64 buffer views, the key table
 *   example.c          one record: the tf.train.Example span parse and the fused
 *                      CRC + copy of a value (its framing and span checks, called for
 *                      every record, are inline in record.h)
 *   batch.c            the batch functions (parse_batch, gather, gather_verified,
 *                      varints): Python in, one guarded loop, Python out
 *   spans.c            the one-span functions (crc32c, read)
 *   task.c             one reader task: made from Python's buffers (checked), then
 *                      decoded whole with no Python (framing, CRCs, parse, copies)
 *   runner.c           the Runner type: tasks queued, run by threads with no GIL (or
 *                      by the caller), and collected in order
 *   index.c            the .idx sidecar: whole texts parsed, or scanned and parsed a
 *                      block of lines at a time
 *   filemap.c          whole files mapped without a descriptor (index texts, their
 *                      binary copies)
 *   order.c            the shuffle: the keyed Feistel permutation and EpochPlan.order
 *
 * This header holds the platform switches, the constants of the contract with Python
 * (recordkit/reader/_contract.py holds the same values and checks them at import),
 * the little inline readers every unit uses, and the declarations of what one unit
 * gives another; it uses no unit. record.h holds what the units that read records
 * (example.c, batch.c, runner.c) share: its inline checks call crc.c's CRC. Names a unit gives another start with rk_ (and are hidden: nothing
 * here is visible outside the extension).
 *
 * Every function is a faster twin of one in recordkit/reader/_fallback.py and must
 * give identical results (the Runner has no twin: without it the reader runs
 * BatchDecoder.decode on a thread pool, and must match that); the wire semantics are
 * those of the reference decoder (recordkit/codec/example.py, messages.py, wire.py),
 * which follows protobuf's parser except that a field a message does not define is
 * refused, never skipped.
 * Nothing read from the input is trusted: every length is checked against the end of
 * the message that contains it before it is used, so any byte string is safe to parse.
 * Every function releases the GIL for its whole loop when the call has enough work to
 * pay for it (RK_GIL_MIN_BYTES); input buffers stay exported (so cannot be resized or
 * closed) while it is released.
 */
#ifndef RECORDKIT_NATIVE_H
#define RECORDKIT_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define RK_X86 1
#include <nmmintrin.h>
#endif
#if defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
/* Only when the compiler targets a CPU with the CRC extension anyway (Apple
 * silicon, -march=armv8.1-a and later): no runtime check is then needed. */
#define RK_ARM 1
#include <arm_acle.h>
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define RK_BIG_ENDIAN 1
#endif

#ifndef _WIN32
#include <setjmp.h>
#endif

/* What one unit gives another: never exported from the extension. */
#if defined(__GNUC__) || defined(__clang__)
#define RK_HIDDEN __attribute__((visibility("hidden")))
#else
#define RK_HIDDEN
#endif

/* ------------------------------------------------------------------ constants */

/* Record status codes (parse_batch), in the order the reference checks them. */
enum {
    ST_OK = 0,
    ST_OUT_OF_BOUNDS = 1,  /* offset < 0 or past the end of the buffer */
    ST_TRUNCATED = 2,      /* the header, or the record it announces, runs past the end */
    ST_LENGTH_CRC = 3,     /* the masked CRC of the length field does not match */
    ST_TOO_LARGE = 4,      /* the length field exceeds max_record_bytes */
    ST_LENGTH_MISMATCH = 5, /* the length field disagrees with the index's framed size */
    ST_PAYLOAD_CRC = 6,    /* the masked CRC of the payload does not match */
    ST_MALFORMED = 7,      /* not a well-formed tf.train.Example, or one with a field it
                              does not define */
    ST_UNEXPECTED = 8,     /* well-formed, but a span is not what `expect` asks for */
};

/* Span kinds (spans[i, k, 0]). */
enum {
    KIND_ABSENT = 0,
    KIND_BYTES = 1,
    KIND_FLOAT = 2,
    KIND_INT64 = 3,
    KIND_NONE = 4,   /* the Feature is present with no list set */
    KIND_COMPLEX = 0x10, /* or-ed in: values spread over several chunks */
};

/* Runner column modes: how one output column is filled (recordkit/reader/_contract.py). */
enum {
    COL_BYTES = 0,      /* one bytes value per record: zero-padded rows, lengths */
    COL_FIXED = 1,      /* exactly row_bytes per record, copied */
    COL_INT64 = 2,      /* exactly count varints per record, decoded */
    COL_PACKED = 3,     /* a float list's or a raw tensor's bytes, any size: appended, lengths */
    COL_PACKED_INT64 = 4, /* an int64 list, any size: decoded and appended, counts */
    COL_BYTES_LIST = 5, /* a list of bytes values: appended, each value's length, counts */
};

#define HEADER_SIZE 12
#define OVERHEAD 16
#define MASK_DELTA 0xA282EAD8u
#define DEFAULT_MAX_RECORD_BYTES ((int64_t)1 << 31)

/* ------------------------------------------------------------ little-endian loads */

static inline uint64_t ld64le(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#ifdef RK_BIG_ENDIAN
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t ld32le(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
#ifdef RK_BIG_ENDIAN
    v = __builtin_bswap32(v);
#endif
    return v;
}

/* ------------------------------------------------------ CRC-32C (crc.c) */

typedef uint32_t (*rk_crc_fn)(uint32_t, const uint8_t *, size_t);
typedef uint32_t (*rk_crc_copy_fn)(uint32_t, const uint8_t *, uint8_t *, size_t);

/* The fastest CRC-32C this CPU runs (after rk_crc_init), and its name. */
RK_HIDDEN extern rk_crc_fn rk_crc32c;
RK_HIDDEN extern const char *rk_crc32c_name;
/* CRC of [p, p + len) continuing from crc, copying those bytes to d in the same pass. */
RK_HIDDEN extern rk_crc_copy_fn rk_crc32c_copy;
/* The table-driven path (every CPU; the others are checked against it). */
RK_HIDDEN uint32_t rk_crc32c_sw(uint32_t crc, const uint8_t *p, size_t len);
/* Build the tables and pick the hardware path; once per process, at import. */
RK_HIDDEN void rk_crc_init(void);

/* TFRecord's masked CRC. */
static inline uint32_t masked(uint32_t crc) {
    return ((crc >> 15) | (crc << 17)) + MASK_DELTA;
}

/* ------------------------------------------------------------------ the GIL */

/*
 * Release the GIL only for calls with enough work. Handing the GIL to another
 * thread and taking it back costs a thread wake-up (several µs, ~25 µs on small
 * VMs), more than a small call's whole work; with several reader threads, every
 * release by a tiny call (a batch's int64 labels, say) becomes a convoy hand-off.
 * Large calls (the reader hands over batches of many records / megabytes) always
 * release it, for their whole loop.
 */
#define RK_GIL_MIN_BYTES ((int64_t)64 << 10)
#define RK_RELEASE_GIL(work) PyThreadState *rk_save = (work) >= RK_GIL_MIN_BYTES ? PyEval_SaveThread() : NULL
#define RK_ACQUIRE_GIL() \
    if (rk_save) PyEval_RestoreThread(rk_save)

/* ------------------------------------------------ the SIGBUS guard (guard.c) */

#ifndef _WIN32
typedef struct RkGuard {
    sigjmp_buf jb;
    struct RkGuard *outer;          /* a guard entered by the same thread before */
    volatile Py_ssize_t at;         /* the record or row being read, for the error */
    const uint8_t *volatile addr;   /* the faulting address */
} RkGuard;
#else /* _WIN32: no SIGBUS; the reads run unguarded */
typedef struct {
    volatile Py_ssize_t at;
    const uint8_t *volatile addr;
} RkGuard;
#endif

/* A guarded region's reads of callers' buffers: job is the caller's, g says where. */
typedef void (*rk_reads_fn)(void *job, RkGuard *g);

/* Run reads(job, g) inside a guard: 0 when it returned, 1 when a page vanished
 * (g->at and g->addr say where). The rules for what reads may do are in guard.c. */
RK_HIDDEN int rk_guarded(rk_reads_fn reads, void *job, RkGuard *g);
/* Raise MapFault for a fault at g->addr, which should lie in [base, base + len). */
RK_HIDDEN void rk_raise_fault(const RkGuard *g, const void *base, Py_ssize_t len);
/* Create MapFault (once per process), add it to m, install the SIGBUS handler: 0 or -1. */
RK_HIDDEN int rk_guard_init(PyObject *m);

/* ------------------------------------------------------ buffers (guard.c) */

/* Is f the struct format of a native int64? */
RK_HIDDEN int rk_is_i64_format(const char *f);

/* A 1-d int64 array, possibly strided (e.g. a column of the spans array). */
typedef struct {
    Py_buffer view;
    const char *ptr;
    Py_ssize_t n;
    Py_ssize_t stride;
} I64In;

/* Export obj as a 1-d native int64 buffer (release a->view after): 0, or -1 raised. */
RK_HIDDEN int rk_i64_in(PyObject *obj, const char *what, I64In *a);

static inline int64_t i64_at(const I64In *a, Py_ssize_t i) {
    int64_t v;
    memcpy(&v, a->ptr + i * a->stride, 8);
    return v;
}

/* The keys of a call: a tuple of distinct bytes, looked up by an open-addressing table. */
typedef struct {
    Py_ssize_t n;
    const uint8_t **ptr;
    Py_ssize_t *len;
    int32_t *table; /* open addressing: key index + 1, 0 = empty */
    uint64_t mask;
} Keys;

static inline uint64_t fnv1a(const uint8_t *s, size_t n) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001B3ull;
    return h;
}

/* The index of key s[:n], or -1. */
static inline Py_ssize_t key_lookup(const Keys *keys, const uint8_t *s, size_t n) {
    uint64_t i = fnv1a(s, n) & keys->mask;
    for (;;) {
        int32_t k = keys->table[i];
        if (!k) return -1;
        k--;
        if ((size_t)keys->len[k] == n && memcmp(keys->ptr[k], s, n) == 0) return k;
        i = (i + 1) & keys->mask;
    }
}

/* keys: a tuple of distinct bytes, which keeps them alive for the call. 0, or -1 raised. */
RK_HIDDEN int rk_keys_init(PyObject *tuple, Keys *keys);
RK_HIDDEN void rk_keys_free(Keys *keys);

/* ------------------------------------------------------------------ protobuf */

/* A varint of at most 10 bytes; bits past 64 are dropped, as protobuf does. NULL on error. */
static inline const uint8_t *rd_varint(const uint8_t *p, const uint8_t *end, uint64_t *out) {
    if (p < end && *p < 0x80) {
        *out = *p;
        return p + 1;
    }
    uint64_t r = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= end) return NULL;
        uint8_t b = *p++;
        r |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            *out = r;
            return p;
        }
    }
    return NULL;
}

/* A length prefix whose bytes must all lie before end. */
static inline const uint8_t *rd_len(const uint8_t *p, const uint8_t *end, uint64_t *len) {
    p = rd_varint(p, end, len);
    if (!p || *len > (uint64_t)(end - p)) return NULL;
    return p;
}

/* ------------------------------------------- the module's parts, for module.c */

/* The batch functions (batch.c), the module's m_methods; the one-span ones (spans.c). */
RK_HIDDEN extern PyMethodDef rk_batch_methods[];
RK_HIDDEN extern PyMethodDef rk_span_methods[];
/* The values of many BytesLists as bytes objects (lists.c): bytes_lists. */
RK_HIDDEN extern PyMethodDef rk_list_methods[];

/* Whole files mapped without a descriptor (filemap.c): FileMap, map_fd. */
RK_HIDDEN int rk_filemap_init(PyObject *m);

/* The .idx sidecar (index.c): index_parse, index_scan, index_fill and their
 * INDEX_* constants. */
enum { IDX_OK = 0, IDX_MALFORMED = 1, IDX_ENTRY = 2, IDX_END = 3, IDX_COUNT = 4 };
enum { MAL_BYTE = 1, MAL_LAYOUT = 2, MAL_EMPTY = 3, MAL_LARGE = 4 };
RK_HIDDEN int rk_index_init(PyObject *m);

/* The shuffle's keyed permutation and plan order (order.c; NumPy twin in
 * recordkit/reader/order.py): permute, plan_order. */
RK_HIDDEN int rk_order_init(PyObject *m);

#ifndef _WIN32
/* recordkit.native._ext.Runner (runner.c). */
RK_HIDDEN extern PyTypeObject rk_RunnerType;
#endif

#endif /* RECORDKIT_NATIVE_H */
