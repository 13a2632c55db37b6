/*
 * recordkit.native._ext: whole-batch TFRecord framing checks, tf.train.Example span
 * parsing, CRC-32C, and the batch copies, all with the GIL released.
 *
 * This unit is the module: what it holds and how it is set up at import. The work
 * is in the other units, one subject each (their map is in recordkit.h): CRC-32C
 * (crc.c), buffers and the SIGBUS guard (guard.c), one record's
 * framing, parse and copies (example.c), the batch functions
 * (batch.c), the one-span functions (spans.c), lists of bytes values (lists.c), a reader task (task.c), the Runner
 * (runner.c), the .idx sidecar (index.c) and the maps it reads (filemap.c).
 */
#include "recordkit.h"

static int module_exec(PyObject *m) {
    rk_crc_init();
    /* The contract's constants; recordkit/reader/_contract.py holds the same values
     * and checks these against them at import. */
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
    if (PyModule_AddStringConstant(m, "CRC32C_IMPL", rk_crc32c_name) < 0) return -1;
    if (PyModule_AddFunctions(m, rk_span_methods) < 0) return -1; /* crc32c, read */
    if (PyModule_AddFunctions(m, rk_list_methods) < 0) return -1; /* bytes_lists */
    if (rk_guard_init(m) < 0) return -1; /* MapFault, and the SIGBUS handler */
    if (rk_filemap_init(m) < 0) return -1;  /* FileMap, map_fd */
    if (rk_index_init(m) < 0) return -1;  /* the .idx functions */
    if (rk_order_init(m) < 0) return -1;  /* permute, plan_order */
#ifndef _WIN32
    if (PyType_Ready(&rk_RunnerType) < 0) return -1;
    if (PyModule_AddObjectRef(m, "Runner", (PyObject *)&rk_RunnerType) < 0) return -1;
    if (PyModule_AddIntConstant(m, "COL_BYTES", COL_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "COL_FIXED", COL_FIXED) < 0 ||
        PyModule_AddIntConstant(m, "COL_INT64", COL_INT64) < 0 ||
        PyModule_AddIntConstant(m, "COL_PACKED", COL_PACKED) < 0 ||
        PyModule_AddIntConstant(m, "COL_PACKED_INT64", COL_PACKED_INT64) < 0 ||
        PyModule_AddIntConstant(m, "COL_BYTES_LIST", COL_BYTES_LIST) < 0)
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
    .m_name = "recordkit.native._ext",
    .m_doc = "Batch TFRecord/Example decoding with the GIL released (see recordkit/reader/_fallback.py).",
    .m_size = 0,
    .m_methods = rk_batch_methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__ext(void) { return PyModuleDef_Init(&moduledef); }
