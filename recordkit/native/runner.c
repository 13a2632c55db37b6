/*
 * recordkit.native._ext: the Runner, whole reader tasks decoded by threads that never
 * take the GIL. This unit holds the type and its task machinery: the queue, the
 * worker loop, waiting for and collecting tasks in order, closing; what a task is and
 * how one is decoded is task.c's.
 *
 * A reader thread calls runner.work() once: it releases the GIL and loops in C,
 * taking tasks from a queue until close(). The consumer submits tasks (a task is
 * the records of one or more batches, each record given as (buffer, offset,
 * framed size), plus the output arrays to fill) and waits for each, in order,
 * with the GIL released. A task runs the whole fast path in one go (task.c); one
 * that the fast path does not take comes back "not done", and the consumer then
 * decodes it the reference way (BatchDecoder), which gives the exact result or
 * error. So a reader thread needs the GIL neither per record nor per task, and a
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
    PyObject_HEAD
    RkTaskSpec spec;   /* what its tasks are decoded by (task.c) */
    PyObject *keys_obj;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    int sync_ok;
    RkTask *head, *tail; /* queued */
    RkTask **all;        /* submitted, not yet collected, by id order */
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

static void runner_drop_all(Runner *r) {
    for (Py_ssize_t i = 0; i < r->nall; i++) rk_task_free(r->all[i]);
    r->nall = 0;
    r->head = r->tail = NULL;
}

static void Runner_dealloc(Runner *r) {
    runner_drop_all(r); /* workers hold a reference while they run: none runs now */
    PyMem_Free(r->all);
    PyMem_Free(r->spec.expect);
    PyMem_Free(r->spec.cols);
    rk_keys_free(&r->spec.keys);
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
    if (rk_keys_init(keys_obj, &r->spec.keys) < 0) return -1;
    r->keys_obj = Py_NewRef(keys_obj);
    Py_ssize_t nkeys = r->spec.keys.n;
    Py_buffer ex;
    if (PyObject_GetBuffer(expect_obj, &ex, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (ex.len != nkeys * 24) {
        PyErr_Format(PyExc_ValueError, "expect must hold %zd int64 triples", nkeys);
        PyBuffer_Release(&ex);
        return -1;
    }
    r->spec.expect = PyMem_Malloc((size_t)nkeys * 24 + 1);
    if (!r->spec.expect) {
        PyBuffer_Release(&ex);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(r->spec.expect, ex.buf, (size_t)ex.len);
    PyBuffer_Release(&ex);
    r->spec.ncols = PyTuple_GET_SIZE(cols_obj);
    r->spec.cols = PyMem_Calloc((size_t)r->spec.ncols + 1, sizeof(RkColSpec));
    if (!r->spec.cols) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t c = 0; c < r->spec.ncols; c++) {
        RkColSpec *col = &r->spec.cols[c];
        long long key, row, count;
        int mode, fusable, kind, empty_ok;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(cols_obj, c), "iLLLpip:column", &mode, &key, &row,
                              &count, &fusable, &kind, &empty_ok))
            return -1;
        if (mode < COL_BYTES || mode > COL_BYTES_LIST || key < 0 || key >= nkeys || row < 0 ||
            count < 0 || (mode == COL_PACKED && kind != KIND_FLOAT && kind != KIND_BYTES)) {
            PyErr_Format(PyExc_ValueError, "column %zd: bad spec", c);
            return -1;
        }
        col->mode = mode;
        col->key = (Py_ssize_t)key;
        col->row_bytes = row;
        col->count = count;
        /* fused: a value copied whole into its place (not decoded, not a list of values) */
        col->fusable = fusable && (mode == COL_BYTES || mode == COL_FIXED || mode == COL_PACKED);
        col->kind = kind;
        col->empty_ok = empty_ok;
        r->spec.nslots += mode == COL_BYTES_LIST ? 3
                          : (mode == COL_BYTES || mode == COL_PACKED || mode == COL_PACKED_INT64)
                              ? 2
                              : 1;
    }
    r->spec.verify = verify;
    r->spec.max_len = max_len;
    r->spec.fuse_min = fuse_min;
    if (pthread_mutex_init(&r->mu, NULL) || pthread_cond_init(&r->work_cv, NULL) ||
        pthread_cond_init(&r->done_cv, NULL)) {
        PyErr_SetString(PyExc_OSError, "could not create the runner's locks");
        return -1;
    }
    r->sync_ok = 1;
    return 0;
}

/* A task of this runner (rk_task_make), or NULL with an error set. */
static RkTask *task_make(const Runner *r, PyObject *bufs_obj, PyObject *rec_obj,
                         PyObject *outs_obj) {
    if (!r->sync_ok) {
        PyErr_SetString(PyExc_RuntimeError, "Runner is not initialised");
        return NULL;
    }
    return rk_task_make(&r->spec, bufs_obj, rec_obj, outs_obj);
}

/* submit(bufs, rec, outs) -> id; rec: n*3 int64 (buffer index, offset, framed size). */
static PyObject *Runner_submit(Runner *r, PyObject *args) {
    PyObject *bufs_obj, *rec_obj, *outs_obj;
    if (!PyArg_ParseTuple(args, "O!OO!:submit", &PyTuple_Type, &bufs_obj, &rec_obj, &PyTuple_Type,
                          &outs_obj))
        return NULL;
    RkTask *t = task_make(r, bufs_obj, rec_obj, outs_obj);
    if (!t) return NULL;
    if (r->nall == r->capall) {
        Py_ssize_t cap = r->capall ? 2 * r->capall : 16;
        RkTask **all = PyMem_Realloc(r->all, (size_t)cap * sizeof(RkTask *));
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
    rk_task_free(t);
    return NULL;
}

/* run(bufs, rec, outs) -> (ok, widths, needs): one task run by the calling thread, the
 * GIL released once for all of it (recordkit.tf's native path: a tf.numpy_function per
 * task, where each reacquisition of the GIL can wait out a switch interval). `needs`:
 * per slot, the elements a packed or list column filled (or, not done, would have
 * filled: more than the slot holds says to run it again with room). */
static PyObject *Runner_run(Runner *r, PyObject *args) {
    PyObject *bufs_obj, *rec_obj, *outs_obj;
    if (!PyArg_ParseTuple(args, "O!OO!:run", &PyTuple_Type, &bufs_obj, &rec_obj, &PyTuple_Type,
                          &outs_obj))
        return NULL;
    RkTask *t = task_make(r, bufs_obj, rec_obj, outs_obj);
    if (!t) return NULL;
    KeyState *st = PyMem_RawCalloc((size_t)r->spec.keys.n + 1, sizeof(KeyState));
    if (!st) {
        rk_task_free(t);
        return PyErr_NoMemory();
    }
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = rk_task_run(&r->spec, t, st);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(st);
    PyObject *widths = PyTuple_New(r->spec.ncols);
    for (Py_ssize_t c = 0; widths && c < r->spec.ncols; c++) {
        PyObject *w = PyLong_FromLongLong(t->widths[c]);
        if (!w) Py_CLEAR(widths);
        else PyTuple_SET_ITEM(widths, c, w);
    }
    PyObject *needs = widths ? PyTuple_New(r->spec.nslots) : NULL;
    for (Py_ssize_t k = 0; needs && k < r->spec.nslots; k++) {
        PyObject *w = PyLong_FromLongLong(t->needs[k]);
        if (!w) Py_CLEAR(needs);
        else PyTuple_SET_ITEM(needs, k, w);
    }
    rk_task_free(t);
    if (!needs) {
        Py_XDECREF(widths);
        return NULL;
    }
    return Py_BuildValue("(ONN)", ok ? Py_True : Py_False, widths, needs);
}

/* work(): run tasks with the GIL released until close(); returns the tasks run. */
static PyObject *Runner_work(Runner *r, PyObject *Py_UNUSED(ignored)) {
    if (!r->sync_ok) {
        PyErr_SetString(PyExc_RuntimeError, "Runner is not initialised");
        return NULL;
    }
    KeyState *st = PyMem_RawCalloc((size_t)r->spec.keys.n + 1, sizeof(KeyState));
    if (!st) return PyErr_NoMemory();
    long long ran = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&r->mu);
    r->workers++;
    for (;;) {
        while (!r->head && !r->closed) pthread_cond_wait(&r->work_cv, &r->mu);
        if (r->closed) break;
        RkTask *t = r->head;
        r->head = t->next;
        if (!r->head) r->tail = NULL;
        t->state = T_RUNNING;
        pthread_mutex_unlock(&r->mu);
        double t0 = now_s();
        int ok = rk_task_run(&r->spec, t, st);
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
    RkTask *t = r->all[at];
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
    PyObject *widths = PyTuple_New(r->spec.ncols);
    if (!widths) return NULL;
    for (Py_ssize_t c = 0; c < r->spec.ncols; c++) {
        PyObject *w = PyLong_FromLongLong(t->widths[c]);
        if (!w) {
            Py_DECREF(widths);
            return NULL;
        }
        PyTuple_SET_ITEM(widths, c, w);
    }
    PyObject *result = Py_BuildValue("(ONd)", t->ok ? Py_True : Py_False, widths, t->seconds);
    pthread_mutex_lock(&r->mu);
    memmove(&r->all[at], &r->all[at + 1], (size_t)(r->nall - at - 1) * sizeof(RkTask *));
    r->nall--;
    pthread_mutex_unlock(&r->mu);
    rk_task_free(t);
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
