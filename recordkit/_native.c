/*
 * recordkit._native: whole-batch TFRecord framing checks, tf.train.Example span
 * parsing, CRC-32C, and the batch copies, all with the GIL released.
 *
 * Every function here is a faster twin of one in recordkit/reader/_fallback.py
 * and must give identical results (the Runner type has no twin: without it the
 * reader runs BatchDecoder.decode on a thread pool, and must match that); the wire semantics are those of
 * recordkit/codec/example.py (the reference decoder), which follows protobuf's
 * parser. Nothing read from the input is trusted: every length is checked
 * against the end of the message that contains it before it is used, so any
 * byte string is safe to parse. Every function releases the GIL for its whole
 * loop when the call has enough work to pay for it (RK_GIL_MIN_BYTES); input
 * buffers stay exported (so cannot be resized or closed) while it is released.
 */
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
    ST_MALFORMED = 7,      /* the payload is not a well-formed tf.train.Example */
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

/* ------------------------------------------------------------------ CRC-32C */

#define CRC_POLY 0x82F63B78u /* Castagnoli, reflected */

static uint32_t crc_table[8][256];

static void crc_init_tables(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (CRC_POLY & (0u - (c & 1u)));
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = crc_table[0][c & 0xFF] ^ (c >> 8);
            crc_table[k][n] = c;
        }
    }
}

/* Slice-by-8: ~1.5-2 GB/s, the path when the CPU has no CRC instruction. */
static uint32_t crc32c_sw(uint32_t crc, const uint8_t *p, size_t len) {
    uint32_t c = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
        len--;
    }
    while (len >= 8) {
        uint64_t w = ld64le(p) ^ c;
        c = crc_table[7][w & 0xFF] ^ crc_table[6][(w >> 8) & 0xFF] ^
            crc_table[5][(w >> 16) & 0xFF] ^ crc_table[4][(w >> 24) & 0xFF] ^
            crc_table[3][(w >> 32) & 0xFF] ^ crc_table[2][(w >> 40) & 0xFF] ^
            crc_table[1][(w >> 48) & 0xFF] ^ crc_table[0][w >> 56];
        p += 8;
        len -= 8;
    }
    while (len--) c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return ~c;
}

#define LONG_BLOCK 8192
#define SHORT_BLOCK 256

#ifdef RK_X86
/*
 * SSE4.2 crc32 has a latency of 3 cycles and a throughput of 1 per cycle, so
 * large buffers are split into three streams computed together and joined with
 * a "shift by N zero bytes" operator (Mark Adler's construction). The operator
 * for a fixed N is linear over GF(2), tabulated per byte of the CRC.
 */
static uint32_t crc_long[4][256];
static uint32_t crc_short[4][256];

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    while (vec) {
        if (vec & 1) sum ^= *mat;
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; n++) square[n] = gf2_times(mat, mat[n]);
}

/* The operator that appends len zero bytes (len a power of two) to a CRC register. */
static void crc_zeros_op(uint32_t *even, size_t len) {
    uint32_t odd[32];
    uint32_t row = 1;
    odd[0] = CRC_POLY; /* one zero bit */
    for (int n = 1; n < 32; n++) {
        odd[n] = row;
        row <<= 1;
    }
    gf2_square(even, odd); /* two zero bits */
    gf2_square(odd, even); /* four zero bits */
    do {
        gf2_square(even, odd); /* first pass: one zero byte */
        len >>= 1;
        if (len == 0) return;
        gf2_square(odd, even);
        len >>= 1;
    } while (len);
    memcpy(even, odd, sizeof(odd));
}

static void crc_zeros_table(uint32_t zeros[4][256], size_t len) {
    uint32_t op[32];
    crc_zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++) {
        zeros[0][n] = gf2_times(op, n);
        zeros[1][n] = gf2_times(op, n << 8);
        zeros[2][n] = gf2_times(op, n << 16);
        zeros[3][n] = gf2_times(op, n << 24);
    }
}

static inline uint32_t crc_shift(uint32_t zeros[4][256], uint32_t crc) {
    return zeros[0][crc & 0xFF] ^ zeros[1][(crc >> 8) & 0xFF] ^ zeros[2][(crc >> 16) & 0xFF] ^
           zeros[3][crc >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const uint8_t *p,
                                                               size_t len) {
    uint64_t c0 = crc ^ 0xFFFFFFFFu, c1, c2;
    while (len && ((uintptr_t)p & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        len--;
    }
    while (len >= 3 * LONG_BLOCK) {
        const uint8_t *end = p + LONG_BLOCK;
        c1 = c2 = 0;
        do {
            c0 = _mm_crc32_u64(c0, ld64le(p));
            c1 = _mm_crc32_u64(c1, ld64le(p + LONG_BLOCK));
            c2 = _mm_crc32_u64(c2, ld64le(p + 2 * LONG_BLOCK));
            p += 8;
        } while (p < end);
        c0 = crc_shift(crc_long, (uint32_t)c0) ^ c1;
        c0 = crc_shift(crc_long, (uint32_t)c0) ^ c2;
        p += 2 * LONG_BLOCK;
        len -= 3 * LONG_BLOCK;
    }
    while (len >= 3 * SHORT_BLOCK) {
        const uint8_t *end = p + SHORT_BLOCK;
        c1 = c2 = 0;
        do {
            c0 = _mm_crc32_u64(c0, ld64le(p));
            c1 = _mm_crc32_u64(c1, ld64le(p + SHORT_BLOCK));
            c2 = _mm_crc32_u64(c2, ld64le(p + 2 * SHORT_BLOCK));
            p += 8;
        } while (p < end);
        c0 = crc_shift(crc_short, (uint32_t)c0) ^ c1;
        c0 = crc_shift(crc_short, (uint32_t)c0) ^ c2;
        p += 2 * SHORT_BLOCK;
        len -= 3 * SHORT_BLOCK;
    }
    const uint8_t *end = p + (len & ~(size_t)7);
    while (p < end) {
        c0 = _mm_crc32_u64(c0, ld64le(p));
        p += 8;
    }
    len &= 7;
    while (len--) c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return (uint32_t)c0 ^ 0xFFFFFFFFu;
}

/* The same, storing every word it reads to d: CRC and copy in one pass over memory. */
__attribute__((target("sse4.2"))) static uint32_t crc32c_copy_sse42(uint32_t crc, const uint8_t *p,
                                                                    uint8_t *d, size_t len) {
    uint64_t c0 = crc ^ 0xFFFFFFFFu, c1, c2, x, y, z;
    /* Align the stores, not the loads: a store split across cache lines costs
     * far more than a split load (half the throughput, measured). */
    while (len && ((uintptr_t)d & 7)) {
        *d++ = *p;
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        len--;
    }
#define RK_STEP3(B)                                                                              \
    do {                                                                                         \
        memcpy(&x, p, 8);                                                                        \
        memcpy(&y, p + (B), 8);                                                                  \
        memcpy(&z, p + 2 * (B), 8);                                                              \
        c0 = _mm_crc32_u64(c0, x);                                                               \
        c1 = _mm_crc32_u64(c1, y);                                                               \
        c2 = _mm_crc32_u64(c2, z);                                                               \
        memcpy(d, &x, 8);                                                                        \
        memcpy(d + (B), &y, 8);                                                                  \
        memcpy(d + 2 * (B), &z, 8);                                                              \
        p += 8;                                                                                  \
        d += 8;                                                                                  \
    } while (0)
    while (len >= 3 * LONG_BLOCK) {
        const uint8_t *end = p + LONG_BLOCK;
        c1 = c2 = 0;
        do RK_STEP3(LONG_BLOCK);
        while (p < end);
        c0 = crc_shift(crc_long, (uint32_t)c0) ^ c1;
        c0 = crc_shift(crc_long, (uint32_t)c0) ^ c2;
        p += 2 * LONG_BLOCK;
        d += 2 * LONG_BLOCK;
        len -= 3 * LONG_BLOCK;
    }
    while (len >= 3 * SHORT_BLOCK) {
        const uint8_t *end = p + SHORT_BLOCK;
        c1 = c2 = 0;
        do RK_STEP3(SHORT_BLOCK);
        while (p < end);
        c0 = crc_shift(crc_short, (uint32_t)c0) ^ c1;
        c0 = crc_shift(crc_short, (uint32_t)c0) ^ c2;
        p += 2 * SHORT_BLOCK;
        d += 2 * SHORT_BLOCK;
        len -= 3 * SHORT_BLOCK;
    }
#undef RK_STEP3
    while (len >= 8) {
        memcpy(&x, p, 8);
        c0 = _mm_crc32_u64(c0, x);
        memcpy(d, &x, 8);
        p += 8;
        d += 8;
        len -= 8;
    }
    while (len--) {
        *d++ = *p;
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    }
    return (uint32_t)c0 ^ 0xFFFFFFFFu;
}
#endif /* RK_X86 */

#ifdef RK_ARM
static uint32_t crc32c_arm(uint32_t crc, const uint8_t *p, size_t len) {
    uint32_t c = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        c = __crc32cb(c, *p++);
        len--;
    }
    while (len >= 8) {
        c = __crc32cd(c, ld64le(p));
        p += 8;
        len -= 8;
    }
    while (len--) c = __crc32cb(c, *p++);
    return ~c;
}
#endif

typedef uint32_t (*crc_fn)(uint32_t, const uint8_t *, size_t);
static crc_fn crc32c_impl = crc32c_sw;
static const char *crc32c_impl_name = "software";

/* Copy and CRC in cache-sized pieces, so the CRC reads what the copy just touched. */
static uint32_t crc32c_copy_generic(uint32_t crc, const uint8_t *p, uint8_t *d, size_t len) {
    while (len) {
        size_t n = len < 65536 ? len : 65536;
        memcpy(d, p, n);
        crc = crc32c_impl(crc, p, n);
        p += n;
        d += n;
        len -= n;
    }
    return crc;
}

typedef uint32_t (*crc_copy_fn)(uint32_t, const uint8_t *, uint8_t *, size_t);
static crc_copy_fn crc32c_copy = crc32c_copy_generic;

/* Pick the hardware path if the CPU has one and it agrees with the tables. */
static void crc_init(void) {
    static int done = 0;
    if (done) return;
    done = 1;
    crc_init_tables();
    crc_fn hw = NULL;
    crc_copy_fn hw_copy = NULL;
    const char *name = NULL;
#ifdef RK_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        crc_zeros_table(crc_long, LONG_BLOCK);
        crc_zeros_table(crc_short, SHORT_BLOCK);
        hw = crc32c_sse42;
        hw_copy = crc32c_copy_sse42;
        name = "sse4.2";
    }
#endif
#ifdef RK_ARM
    hw = crc32c_arm;
    name = "armv8-crc";
#endif
    if (!hw) return;
    /* Self-test over every code path (head alignment, both block sizes, tail). */
    static uint8_t probe[3 * LONG_BLOCK + 3 * SHORT_BLOCK + 77], copy[sizeof(probe)];
    uint32_t x = 0x12345678u;
    for (size_t i = 0; i < sizeof(probe); i++) {
        x = x * 1103515245u + 12345u;
        probe[i] = (uint8_t)(x >> 24);
    }
    static const size_t lens[] = {0, 1, 7, 8, 9, 767, 768, 769, 3 * LONG_BLOCK + 3 * SHORT_BLOCK + 70};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        for (size_t start = 0; start < 4; start++) {
            uint32_t want = crc32c_sw(0x9E3779B9u, probe + start, lens[i]);
            if (hw(0x9E3779B9u, probe + start, lens[i]) != want) return;
            if (hw_copy) {
                memset(copy, 0, sizeof(copy));
                if (hw_copy(0x9E3779B9u, probe + start, copy + 1, lens[i]) != want ||
                    memcmp(copy + 1, probe + start, lens[i]) != 0)
                    return;
            }
        }
    }
    crc32c_impl = hw;
    crc32c_impl_name = name;
    if (hw_copy) crc32c_copy = hw_copy;
}

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

/* ---------------------------------------------------------- the SIGBUS guard */

/*
 * A shard is a memory map: if another program truncates the file while we read
 * it (rsync --inplace, a user rewriting it, a network file system), a read of a
 * page past the new end raises SIGBUS, which kills the process. Every read of a
 * caller's buffer here (parse_batch, gather, gather_verified, varints, read,
 * crc32c, and the runner's tasks) runs inside a guard instead: a process-wide
 * SIGBUS handler, installed once, jumps out of the faulting read to the guard's
 * sigsetjmp point when the faulting thread has a guard active, and the call
 * then fails cleanly (a MapFault exception, or a runner task "not done").
 *
 * Rules for the guarded regions: no lock held, no allocation made, no Python
 * state changed between entering the guard and leaving it (what they hold is
 * set up before and let go of after, on both outcomes), and the GIL is in the
 * same state at the sigsetjmp point as at every read. Progress the fault branch
 * needs is kept in the RkGuard (volatile), never in locals changed after sigsetjmp.
 *
 * A SIGBUS on a thread with no guard active (a bug, or a pure-Python read of a
 * map) is not ours: the handler puts back the handler it replaced (Python's
 * faulthandler, when enabled, or SIG_DFL) and lets the fault happen again, so
 * the process still dies as it would have, with the same diagnostics.
 *
 * A handler installed after ours (faulthandler.enable() after import) sees a
 * guarded fault first: faulthandler prints its report, puts ours back and
 * re-raises, and ours then jumps as usual (so the call still fails cleanly, once
 * with a spurious report). The handler is never re-installed over a later one:
 * two handlers that chain to each other would loop on an unguarded fault.
 */
#ifndef _WIN32
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <unistd.h>

typedef struct RkGuard {
    sigjmp_buf jb;
    struct RkGuard *outer;          /* a guard entered by the same thread before */
    volatile Py_ssize_t at;         /* the record or row being read, for the error */
    const uint8_t *volatile addr;   /* the faulting address */
} RkGuard;

/* initial-exec: the handler must not take the lazy TLS path, which may allocate. */
#if defined(__GNUC__)
#define RK_TLS __thread __attribute__((tls_model("initial-exec")))
#else
#define RK_TLS _Thread_local
#endif
static RK_TLS RkGuard *volatile rk_guard_cur;
static struct sigaction rk_prev_action;
static volatile sig_atomic_t rk_installed;

/* A fault, or a fault re-raised on this thread by a handler installed after ours
 * (Python's faulthandler, enabled after import, reports a fault and then raise()s
 * it for the handler it replaced); not a SIGBUS sent by another process. */
static int rk_is_fault(const siginfo_t *si) {
    if (!si) return 0;
    if (si->si_code > 0) return 1;
#ifdef SI_TKILL
    if (si->si_code == SI_TKILL && si->si_pid == getpid()) return 1;
#endif
    return 0;
}

static void rk_sigbus(int sig, siginfo_t *si, void *ctx) {
    (void)ctx;
    RkGuard *g = rk_guard_cur;
    if (g && rk_is_fault(si)) { /* inside a guard */
        rk_guard_cur = g->outer;
        /* si_addr is the faulting address only for a fault (a raise() has none) */
        g->addr = si->si_code > 0 ? (const uint8_t *)si->si_addr : NULL;
        siglongjmp(g->jb, 1);
    }
    /* Not ours: the previous disposition takes over. A fault re-executes the
     * faulting access on return; a SIGBUS sent by kill() is sent again. */
    sigaction(SIGBUS, &rk_prev_action, NULL);
    if (!si || si->si_code <= 0) raise(sig);
}

/* Install the handler (once; called with the GIL held, at import). 0, or -1 with errno. */
static int rk_guard_install(void) {
    if (rk_installed) return 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = rk_sigbus;
    /* SA_NODEFER: SIGBUS stays unblocked after a siglongjmp out of the handler
     * (sigsetjmp(.., 0) saves no mask, which keeps entering a guard cheap). */
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &rk_prev_action) < 0) return -1;
    rk_installed = 1;
    return 0;
}

/* Enter a guard whose sigsetjmp just returned 0; leave it with rk_guard_leave.
 * The compiler barriers keep the buffer reads between the two. */
static inline void rk_guard_enter(RkGuard *g) {
    g->outer = rk_guard_cur;
    g->at = -1;
    g->addr = NULL;
    __asm__ __volatile__("" ::: "memory");
    rk_guard_cur = g;
    __asm__ __volatile__("" ::: "memory");
}

static inline void rk_guard_leave(RkGuard *g) {
    __asm__ __volatile__("" ::: "memory");
    rk_guard_cur = g->outer;
    __asm__ __volatile__("" ::: "memory");
}

/* After a jump: make sure SIGBUS is not left blocked on this thread. */
static void rk_guard_faulted(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGBUS);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

typedef void (*rk_reads_fn)(void *job, RkGuard *g);

/* Run reads(job, g) inside a guard: 0 when it returned, 1 when a page vanished
 * (g->at and g->addr say where). Only this frame calls sigsetjmp, so no local
 * of the caller lives across it (and none can be clobbered by the jump). */
static __attribute__((noinline)) int rk_guarded(rk_reads_fn reads, void *job, RkGuard *g) {
    if (sigsetjmp(g->jb, 0) == 0) {
        rk_guard_enter(g);
        reads(job, g);
        rk_guard_leave(g);
        return 0;
    }
    rk_guard_faulted();
    return 1;
}
#else /* _WIN32: no SIGBUS; the reads run unguarded */
typedef struct {
    volatile Py_ssize_t at;
    const uint8_t *volatile addr;
} RkGuard;
typedef void (*rk_reads_fn)(void *job, RkGuard *g);
static int rk_guard_install(void) { return 0; }
static int rk_guarded(rk_reads_fn reads, void *job, RkGuard *g) {
    g->at = -1;
    g->addr = NULL;
    reads(job, g);
    return 0;
}
#endif /* _WIN32 */

static PyObject *MapFault; /* recordkit._native.MapFault(message, at, offset) */

/* Raise MapFault for a fault at g->addr, which should lie in [base, base + len). */
static void rk_raise_fault(const RkGuard *g, const void *base, Py_ssize_t len) {
    const uint8_t *a = g->addr, *b = base;
    long long off = (a && b && a >= b && a < b + len) ? (long long)(a - b) : -1;
    PyObject *exc = PyObject_CallFunction(
        MapFault, "(snL)",
        "a page of the buffer vanished while it was read (the file behind the map shrank)",
        (Py_ssize_t)g->at, off);
    if (exc) {
        PyErr_SetObject(MapFault, exc);
        Py_DECREF(exc);
    }
}

/* ------------------------------------------------------------- buffer helpers */

static int is_i64_format(const char *f) {
    if (!f) return 0;
    if (*f == '@' || *f == '=') {
        f++;
    }
#ifdef RK_BIG_ENDIAN
    else if (*f == '>' || *f == '!') {
        f++;
    }
#else
    else if (*f == '<') {
        f++;
    }
#endif
    return (f[0] == 'q' || f[0] == 'l') && f[1] == '\0';
}

/* A 1-d int64 array, possibly strided (e.g. a column of the spans array). */
typedef struct {
    Py_buffer view;
    const char *ptr;
    Py_ssize_t n;
    Py_ssize_t stride;
} I64In;

static int i64_in(PyObject *obj, const char *what, I64In *a) {
    if (PyObject_GetBuffer(obj, &a->view, PyBUF_STRIDES | PyBUF_FORMAT) < 0) return -1;
    if (a->view.ndim != 1 || a->view.itemsize != 8 || !is_i64_format(a->view.format)) {
        PyErr_Format(PyExc_ValueError, "%s must be a 1-d buffer of native int64, got format %s ndim %d",
                     what, a->view.format ? a->view.format : "?", a->view.ndim);
        PyBuffer_Release(&a->view);
        return -1;
    }
    a->ptr = (const char *)a->view.buf;
    a->n = a->view.shape[0];
    a->stride = a->view.strides ? a->view.strides[0] : 8;
    return 0;
}

static inline int64_t i64_at(const I64In *a, Py_ssize_t i) {
    int64_t v;
    memcpy(&v, a->ptr + i * a->stride, 8);
    return v;
}

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

/* Skip the value of an unknown field whose tag has just been read. */
static const uint8_t *skip_field(const uint8_t *p, const uint8_t *end, uint64_t tag) {
    uint64_t v;
    if ((tag >> 3) == 0 || tag > 0xFFFFFFFFu) return NULL;
    switch (tag & 7) {
    case 0:
        return rd_varint(p, end, &v);
    case 1:
        return end - p >= 8 ? p + 8 : NULL;
    case 2:
        p = rd_len(p, end, &v);
        return p ? p + v : NULL;
    case 5:
        return end - p >= 4 ? p + 4 : NULL;
    default:
        return NULL;
    }
}

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

/* ---------------------------------------------------------------- key lookup */

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

static Py_ssize_t key_lookup(const Keys *keys, const uint8_t *s, size_t n) {
    uint64_t i = fnv1a(s, n) & keys->mask;
    for (;;) {
        int32_t k = keys->table[i];
        if (!k) return -1;
        k--;
        if ((size_t)keys->len[k] == n && memcmp(keys->ptr[k], s, n) == 0) return k;
        i = (i + 1) & keys->mask;
    }
}

static void keys_free(Keys *keys) {
    PyMem_Free(keys->ptr);
    PyMem_Free(keys->len);
    PyMem_Free(keys->table);
    memset(keys, 0, sizeof(*keys));
}

/* keys: a tuple of distinct bytes. The tuple keeps them alive for the call. */
static int keys_init(PyObject *tuple, Keys *keys) {
    memset(keys, 0, sizeof(*keys));
    if (!PyTuple_Check(tuple)) {
        PyErr_SetString(PyExc_TypeError, "keys must be a tuple of bytes");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(tuple);
    if (n > (1 << 24)) {
        PyErr_SetString(PyExc_ValueError, "too many keys");
        return -1;
    }
    uint64_t size = 8;
    while (size < 2 * (uint64_t)n) size <<= 1;
    keys->n = n;
    keys->mask = size - 1;
    keys->ptr = PyMem_Calloc((size_t)n + 1, sizeof(*keys->ptr));
    keys->len = PyMem_Calloc((size_t)n + 1, sizeof(*keys->len));
    keys->table = PyMem_Calloc((size_t)size, sizeof(*keys->table));
    if (!keys->ptr || !keys->len || !keys->table) {
        keys_free(keys);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, k);
        if (!PyBytes_Check(item)) {
            PyErr_Format(PyExc_TypeError, "keys[%zd] must be bytes, not %.100s", k,
                         Py_TYPE(item)->tp_name);
            keys_free(keys);
            return -1;
        }
        const uint8_t *s = (const uint8_t *)PyBytes_AS_STRING(item);
        Py_ssize_t len = PyBytes_GET_SIZE(item);
        if (key_lookup(keys, s, (size_t)len) >= 0) {
            PyErr_Format(PyExc_ValueError, "keys[%zd] is a duplicate", k);
            keys_free(keys);
            return -1;
        }
        keys->ptr[k] = s;
        keys->len[k] = len;
        uint64_t i = fnv1a(s, (size_t)len) & keys->mask;
        while (keys->table[i]) i = (i + 1) & keys->mask;
        keys->table[i] = (int32_t)(k + 1);
    }
    return 0;
}

/* ------------------------------------------------------------ Example parsing */

/* What the winning map entry of a wanted key says. */
typedef struct {
    const uint8_t *entry, *entry_end; /* the map entry, to re-walk merged lists */
    const uint8_t *run, *run_end;     /* the first list submessage of the final kind */
    const uint8_t *since;             /* its start: earlier lists were of another kind */
    uint32_t nruns;                   /* list submessages of the final kind (they merge) */
    int kind;                         /* KIND_ABSENT until an entry is seen */
} KeyState;

typedef struct {
    const Keys *keys;
    KeyState *st;
} Ctx;

static inline int kind_of_tag(uint64_t tag) {
    return tag == 0x0A ? KIND_BYTES : tag == 0x12 ? KIND_FLOAT : tag == 0x1A ? KIND_INT64 : 0;
}

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
                if (!k) {
                    if (!(p = skip_field(p, fend, tag))) return -1;
                    continue;
                }
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
        } else if (!(p = skip_field(p, stop, tag))) {
            return -1;
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
        if (tag != 0x0A) {
            if (!(p = skip_field(p, end, tag))) return -1;
            continue;
        }
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
        } else if (!(p = skip_field(p, end, tag))) {
            return -1;
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
            const uint8_t *q = skip_field(p, end, tag); /* one unpacked value */
            if (!q) return -1;
            if (a->chunks++ == 0) {
                a->first = p;
                a->first_len = (uint64_t)(q - p);
            }
            a->count++;
            p = q;
        } else if (!(p = skip_field(p, end, tag))) {
            return -1;
        }
    }
    return 0;
}

/* Scan every list submessage of the final kind in the winning entry (rare: merged lists). */
static int rescan_entry(const KeyState *s, Acc *a) {
    const uint8_t *p = s->entry, *stop = s->entry_end;
    uint64_t tag, len;
    while (p < stop) {
        if (!(p = rd_varint(p, stop, &tag))) return -1;
        if (tag != 0x12) {
            if (!(p = skip_field(p, stop, tag))) return -1;
            continue;
        }
        if (!(p = rd_len(p, stop, &len))) return -1;
        const uint8_t *fend = p + len;
        while (p < fend) {
            if (!(p = rd_varint(p, fend, &tag))) return -1;
            int k = kind_of_tag(tag);
            if (!k) {
                if (!(p = skip_field(p, fend, tag))) return -1;
                continue;
            }
            if (!(p = rd_len(p, fend, &len))) return -1;
            if (k == s->kind && p >= s->since && scan_list(k, p, p + len, a) < 0) return -1;
            p += len;
        }
    }
    return 0;
}

/* Parse one payload and fill its F spans; 0 or -1 (malformed). */
static int parse_record(const uint8_t *base, const uint8_t *p, const uint8_t *end, Ctx *cx,
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
        if (s->kind != KIND_BYTES && a.chunks > 1) sp[0] |= KIND_COMPLEX;
        sp[1] = a.count;
        if (a.first) {
            sp[2] = (int64_t)(a.first - base);
            sp[3] = (int64_t)a.first_len;
        }
    }
    return 0;
}

/* The framing checks of recordkit.format.read_record, in its order. */
static int check_frame(const uint8_t *base, int64_t blen, int64_t off, int64_t size, int verify,
                       int64_t max_len, const uint8_t **payload, uint64_t *plen) {
    if (off < 0 || off > blen) return ST_OUT_OF_BOUNDS;
    int64_t left = blen - off;
    if (left < HEADER_SIZE) return ST_TRUNCATED;
    const uint8_t *h = base + off;
    uint64_t length = ld64le(h);
    if (masked(crc32c_impl(0, h, 8)) != ld32le(h + 8)) return ST_LENGTH_CRC;
    if (length > (uint64_t)max_len) return ST_TOO_LARGE;
    if (left < OVERHEAD || length > (uint64_t)(left - OVERHEAD)) return ST_TRUNCATED;
    if (size != (int64_t)length + OVERHEAD) return ST_LENGTH_MISMATCH;
    const uint8_t *data = h + HEADER_SIZE;
    if (verify && masked(crc32c_impl(0, data, (size_t)length)) != ld32le(data + length))
        return ST_PAYLOAD_CRC;
    *payload = data;
    *plen = length;
    return ST_OK;
}

/* Do one record's first spans match `expect` ((kind, count, nbytes) triples, -1: any)? */
static int spans_expected(const char *expect, Py_ssize_t nexpect, const int64_t *sp) {
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
enum { VARINTS_MALFORMED = 1, VARINTS_MORE = 2, VARINTS_FEWER = 3 };
static int read_varints(const uint8_t *p, const uint8_t *end, int64_t count, uint64_t *dst) {
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

/* Copy the l-byte value at v (inside the payload [p, end), end = its CRC) to d, zero
 * d up to row, and check the payload CRC in the same pass: 1 if it matches. */
static int copy_verified(crc_copy_fn copy, const uint8_t *p, const uint8_t *end,
                         const uint8_t *v, int64_t l, uint8_t *d, int64_t row) {
    if (!l) v = p;
    uint32_t crc = crc32c_impl(0, p, (size_t)(v - p));
    crc = copy(crc, v, d, (size_t)l);
    crc = crc32c_impl(crc, v + l, (size_t)(end - v - l));
    memset(d + l, 0, (size_t)(row - l));
    return masked(crc) == ld32le(end);
}

/* ------------------------------------------------------------- Python functions */

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
    j->crc = crc32c_impl(j->crc, j->p, j->len);
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
    uint32_t crc = crc32c_sw((uint32_t)value, view.buf, (size_t)view.len);
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
        if (s == ST_OK && parse_record(j->base, payload, payload + plen, j->cx, sp) < 0)
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
        if (expect.itemsize != 8 || !is_i64_format(expect.format) || expect.len % 24) {
            PyErr_SetString(PyExc_ValueError, "expect must hold native int64 triples");
            PyBuffer_Release(&expect);
            return NULL;
        }
    }
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_SIMPLE) < 0) goto release_expect;
    if (i64_in(off_obj, "offsets", &offs) < 0) goto release_buf;
    if (i64_in(size_obj, "sizes", &sizes) < 0) goto release_offs;
    if (keys_init(keys_obj, &keys) < 0) goto release_sizes;
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
    keys_free(&keys);
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
    if (i64_in(starts_obj, "starts", &starts) < 0) goto release_buf;
    if (i64_in(lens_obj, "lengths", &lens) < 0) goto release_starts;
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
        int good = copy_verified(crc32c_copy, p, end, j->base + s, l, j->dst + i * j->row, j->row);
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
    if (i64_in(offs_obj, "offsets", &offs) < 0) goto release_buf;
    if (i64_in(sizes_obj, "sizes", &sizes) < 0) goto release_offs;
    if (i64_in(starts_obj, "starts", &starts) < 0) goto release_sizes;
    if (i64_in(lens_obj, "lengths", &lens) < 0) goto release_starts;
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
    if (i64_in(starts_obj, "starts", &starts) < 0) goto release_buf;
    if (i64_in(nb_obj, "nbytes", &nbs) < 0) goto release_starts;
    if (i64_in(counts_obj, "counts", &counts) < 0) goto release_nbs;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        goto release_counts;
    Py_ssize_t n = starts.n;
    if (nbs.n != n || counts.n != n) {
        PyErr_Format(PyExc_ValueError, "starts, nbytes and counts differ in length (%zd, %zd, %zd)",
                     n, nbs.n, counts.n);
        goto release_out;
    }
    if (out.itemsize != 8 || !is_i64_format(out.format)) {
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

/* --------------------------------------------------------------- the task runner */

/*
 * Runner: whole reader tasks decoded by threads that never take the GIL.
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
 */
#ifndef _WIN32
#include <pthread.h>
#include <time.h>

enum { COL_BYTES = 0, COL_FIXED = 1, COL_INT64 = 2 };
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
    if (parse_record(base, *payload, *payload + *plen, cx, sp) < 0) return 0;
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
            if (!copy_verified(crc32c_copy, p, p + plen, v, l, d, co[c].stride)) return 0;
        } else {
            memcpy(d, v, (size_t)l);
            memset(d + l, 0, (size_t)(co[c].stride - l));
        }
    }
    if (fuse && (which & COPY_VALUES) && fused < 0 &&
        masked(crc32c_impl(0, p, (size_t)plen)) != ld32le(p + plen))
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
    keys_free(&r->keys);
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
    if (keys_init(keys_obj, &r->keys) < 0) return -1;
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

/* submit(bufs, rec, outs) -> id; rec: n*3 int64 (buffer index, offset, framed size). */
static PyObject *Runner_submit(Runner *r, PyObject *args) {
    PyObject *bufs_obj, *rec_obj, *outs_obj;
    if (!PyArg_ParseTuple(args, "O!OO!:submit", &PyTuple_Type, &bufs_obj, &rec_obj, &PyTuple_Type,
                          &outs_obj))
        return NULL;
    if (!r->sync_ok) {
        PyErr_SetString(PyExc_RuntimeError, "Runner is not initialised");
        return NULL;
    }
    if (PyTuple_GET_SIZE(outs_obj) != r->nslots) {
        PyErr_Format(PyExc_ValueError, "expected %zd output buffers", r->nslots);
        return NULL;
    }
    Task *t = PyMem_Calloc(1, sizeof(Task));
    if (!t) return PyErr_NoMemory();
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
    {"work", (PyCFunction)Runner_work, METH_NOARGS,
     "work() -> int: run tasks with the GIL released until close()."},
    {"wait", (PyCFunction)Runner_wait, METH_O,
     "wait(id, /) -> (ok, widths, seconds): wait for a task (GIL released), collect it."},
    {"close", (PyCFunction)Runner_close, METH_NOARGS, "close() -> None: stop the workers."},
    {"drop", (PyCFunction)Runner_drop, METH_NOARGS,
     "drop() -> None: close, wait for the workers to leave, let go of the tasks not collected."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RunnerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "recordkit._native.Runner",
    .tp_basicsize = sizeof(Runner),
    .tp_dealloc = (destructor)Runner_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Runner(keys, expect, columns, verify, max_record_bytes, fuse_min_bytes)\n\n"
              "Decodes whole reader tasks on threads that never take the GIL (see _native.c).",
    .tp_methods = Runner_methods,
    .tp_init = (initproc)Runner_init,
    .tp_new = PyType_GenericNew,
};
#endif /* _WIN32 */

/* ------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"crc32c", py_crc32c, METH_VARARGS, crc32c_doc},
    {"_crc32c_software", py_crc32c_software, METH_VARARGS,
     "_crc32c_software(data, value=0, /) -> int\n\nThe table-driven path, for tests."},
    {"parse_batch", py_parse_batch, METH_VARARGS, parse_batch_doc},
    {"gather", py_gather, METH_VARARGS, gather_doc},
    {"read", py_read, METH_VARARGS, read_doc},
    {"gather_verified", py_gather_verified, METH_VARARGS, gather_verified_doc},
    {"varints", py_varints, METH_VARARGS, varints_doc},
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *m) {
    crc_init();
    struct {
        const char *name;
        long value;
    } consts[] = {
        {"STATUS_OK", ST_OK},
        {"STATUS_OUT_OF_BOUNDS", ST_OUT_OF_BOUNDS},
        {"STATUS_TRUNCATED", ST_TRUNCATED},
        {"STATUS_LENGTH_CRC", ST_LENGTH_CRC},
        {"STATUS_TOO_LARGE", ST_TOO_LARGE},
        {"STATUS_LENGTH_MISMATCH", ST_LENGTH_MISMATCH},
        {"STATUS_PAYLOAD_CRC", ST_PAYLOAD_CRC},
        {"STATUS_MALFORMED", ST_MALFORMED},
        {"STATUS_UNEXPECTED", ST_UNEXPECTED},
        {"KIND_ABSENT", KIND_ABSENT},
        {"KIND_BYTES", KIND_BYTES},
        {"KIND_FLOAT", KIND_FLOAT},
        {"KIND_INT64", KIND_INT64},
        {"KIND_NONE", KIND_NONE},
        {"KIND_COMPLEX", KIND_COMPLEX},
    };
    for (size_t i = 0; i < sizeof(consts) / sizeof(consts[0]); i++) {
        if (PyModule_AddIntConstant(m, consts[i].name, consts[i].value) < 0) return -1;
    }
    if (PyModule_AddStringConstant(m, "CRC32C_IMPL", crc32c_impl_name) < 0) return -1;
    /* One exception type and one SIGBUS handler per process: a second interpreter
     * (or a re-import) shares both. */
    if (!MapFault) {
        MapFault = PyErr_NewExceptionWithDoc(
            "recordkit._native.MapFault",
            "A page of a buffer (a memory map whose file shrank) vanished while a guarded\n"
            "call read it. args: (message, at, offset); at: the record or row being read\n"
            "(-1: unknown); offset: the faulting byte's offset in the buffer (-1: unknown).",
            PyExc_BufferError, NULL);
        if (!MapFault) return -1;
    }
    if (PyModule_AddObjectRef(m, "MapFault", MapFault) < 0) return -1;
    if (rk_guard_install() < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
#ifndef _WIN32
    if (PyType_Ready(&RunnerType) < 0) return -1;
    if (PyModule_AddObjectRef(m, "Runner", (PyObject *)&RunnerType) < 0) return -1;
    if (PyModule_AddIntConstant(m, "COL_BYTES", COL_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "COL_FIXED", COL_FIXED) < 0 ||
        PyModule_AddIntConstant(m, "COL_INT64", COL_INT64) < 0)
        return -1;
#endif
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, (void *)module_exec},
#ifdef Py_GIL_DISABLED
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "recordkit._native",
    .m_doc = "Batch TFRecord/Example decoding with the GIL released (see recordkit/reader/_fallback.py).",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModuleDef_Init(&moduledef); }
