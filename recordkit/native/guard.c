/*
 * recordkit.native._ext: buffers. The SIGBUS guard around every read of a caller's buffer
 * (and MapFault, the error a guarded call raises when a page vanished), views of
 * int64 buffers, and the key table of a call (the features it looks for).
 */
#include "recordkit.h"

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

/* Run reads(job, g) inside a guard: 0 when it returned, 1 when a page vanished
 * (g->at and g->addr say where). Only this frame calls sigsetjmp, so no local
 * of the caller lives across it (and none can be clobbered by the jump). */
__attribute__((noinline)) int rk_guarded(rk_reads_fn reads, void *job, RkGuard *g) {
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
static int rk_guard_install(void) { return 0; }
int rk_guarded(rk_reads_fn reads, void *job, RkGuard *g) {
    g->at = -1;
    g->addr = NULL;
    reads(job, g);
    return 0;
}
#endif /* _WIN32 */

static PyObject *MapFault; /* recordkit.native._ext.MapFault(message, at, offset) */

/* Raise MapFault for a fault at g->addr, which should lie in [base, base + len). */
void rk_raise_fault(const RkGuard *g, const void *base, Py_ssize_t len) {
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

int rk_guard_init(PyObject *m) {
    /* One exception type and one SIGBUS handler per process: a second interpreter
     * (or a re-import) shares both. */
    if (!MapFault) {
        MapFault = PyErr_NewExceptionWithDoc(
            "recordkit.native._ext.MapFault",
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
    return 0;
}

/* ------------------------------------------------------------- buffer helpers */

int rk_is_i64_format(const char *f) {
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

int rk_i64_in(PyObject *obj, const char *what, I64In *a) {
    if (PyObject_GetBuffer(obj, &a->view, PyBUF_STRIDES | PyBUF_FORMAT) < 0) return -1;
    if (a->view.ndim != 1 || a->view.itemsize != 8 || !rk_is_i64_format(a->view.format)) {
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

/* ---------------------------------------------------------------- key lookup */

void rk_keys_free(Keys *keys) {
    PyMem_Free(keys->ptr);
    PyMem_Free(keys->len);
    PyMem_Free(keys->table);
    memset(keys, 0, sizeof(*keys));
}

/* keys: a tuple of distinct bytes. The tuple keeps them alive for the call. */
int rk_keys_init(PyObject *tuple, Keys *keys) {
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
        rk_keys_free(keys);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, k);
        if (!PyBytes_Check(item)) {
            PyErr_Format(PyExc_TypeError, "keys[%zd] must be bytes, not %.100s", k,
                         Py_TYPE(item)->tp_name);
            rk_keys_free(keys);
            return -1;
        }
        const uint8_t *s = (const uint8_t *)PyBytes_AS_STRING(item);
        Py_ssize_t len = PyBytes_GET_SIZE(item);
        if (key_lookup(keys, s, (size_t)len) >= 0) {
            PyErr_Format(PyExc_ValueError, "keys[%zd] is a duplicate", k);
            rk_keys_free(keys);
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
