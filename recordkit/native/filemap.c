/*
 * recordkit.native._ext: whole files mapped read-only without holding a descriptor.
 *
 *   FileMap                a whole file mapped read-only, holding no file descriptor
 *                          (a reader may hold thousands of index maps; Python's mmap
 *                          keeps a descriptor per map): index texts (index.c parses
 *                          them), and the per-user cache's binary copies of them.
 *                          Unmapped when the last reference (a NumPy view's included)
 *                          goes.
 *   map_fd(fd, populate) -> FileMap    (the caller opens and closes fd)
 *
 * A read of a map whose file was cut short faults (SIGBUS): its readers read it
 * inside the guard (guard.c).
 */
#include "recordkit.h"

#ifndef _WIN32
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

typedef struct {
    PyObject_HEAD
    void *addr;
    Py_ssize_t len;
} FileMap;

static void FileMap_dealloc(FileMap *self) {
#ifndef _WIN32
    if (self->addr) munmap(self->addr, (size_t)self->len);
#endif
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int FileMap_getbuffer(FileMap *self, Py_buffer *view, int flags) {
    static char empty[1];
    return PyBuffer_FillInfo(view, (PyObject *)self, self->addr ? self->addr : empty, self->len,
                             1, flags);
}

static Py_ssize_t FileMap_length(FileMap *self) { return self->len; }

static PyBufferProcs FileMap_as_buffer = {(getbufferproc)FileMap_getbuffer, NULL};
static PySequenceMethods FileMap_as_sequence = {.sq_length = (lenfunc)FileMap_length};

static PyTypeObject FileMapType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "recordkit.native._ext.FileMap",
    .tp_basicsize = sizeof(FileMap),
    .tp_dealloc = (destructor)FileMap_dealloc,
    .tp_as_buffer = &FileMap_as_buffer,
    .tp_as_sequence = &FileMap_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A whole file mapped read-only (a buffer), holding no file descriptor.",
};

static PyObject *py_map_fd(PyObject *self, PyObject *args) {
    (void)self;
    int fd, populate = 0;
    if (!PyArg_ParseTuple(args, "i|p:map_fd", &fd, &populate)) return NULL;
#ifdef _WIN32
    (void)fd;
    (void)populate;
    PyErr_SetString(PyExc_OSError, "map_fd: not on Windows");
    return NULL;
#else
    FileMap *m = PyObject_New(FileMap, &FileMapType);
    if (!m) return NULL;
    m->addr = NULL;
    m->len = 0;
    int err = 0;
    struct stat st;
    void *addr = NULL;
    Py_BEGIN_ALLOW_THREADS
    if (fstat(fd, &st) < 0) {
        err = errno;
    } else if (!S_ISREG(st.st_mode)) {
        err = EINVAL;
    } else if (st.st_size > 0) {
        int flags = MAP_SHARED;
#ifdef MAP_POPULATE
        if (populate) flags |= MAP_POPULATE;
#endif
        addr = mmap(NULL, (size_t)st.st_size, PROT_READ, flags, fd, 0);
        if (addr == MAP_FAILED) {
            err = errno;
            addr = NULL;
        }
    }
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(m);
        return NULL;
    }
    m->addr = addr;
    m->len = addr ? (Py_ssize_t)st.st_size : 0;
    return (PyObject *)m;
#endif
}

static PyMethodDef filemap_methods[] = {
    {"map_fd", py_map_fd, METH_VARARGS,
     "map_fd(fd, populate=False, /) -> FileMap: the whole regular file open as fd mapped "
     "read-only; the map holds no descriptor (fd may be closed at once)."},
    {NULL, NULL, 0, NULL},
};

int rk_filemap_init(PyObject *m) {
    if (PyType_Ready(&FileMapType) < 0) return -1;
    if (PyModule_AddObjectRef(m, "FileMap", (PyObject *)&FileMapType) < 0) return -1;
    return PyModule_AddFunctions(m, filemap_methods);
}
