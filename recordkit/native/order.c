/* The keyed Feistel permutation of recordkit/reader/order.py, in C.
 *
 * order.py computes the same bijection with NumPy (the reference, and the path
 * without a C compiler); this computes it per element in a few nanoseconds
 * instead of the ~70 array passes NumPy needs, which matters because every
 * record of a shuffled epoch goes through two of them.
 *
 *   permute(x, out, n, left, right, keys, inverse)
 *     x, out: C-contiguous int64 buffers of equal length (may be the same)
 *     n: the domain [0, n); left/right: the halves' bit widths; keys: a tuple of
 *     round keys (uint64); inverse: 0 to encrypt, 1 to decrypt.
 *
 *   plan_order(g, out, total, block, window, full, block_keys, key)
 *     The shuffled epoch order of recordkit/reader/plan.py (EpochPlan.order, whose
 *     NumPy code is the reference): for each epoch position in g (int64), the
 *     global record number. `block` records a block, `window` blocks a window,
 *     `full` whole blocks, ordered by the block permutation (round keys
 *     block_keys); the records of window w are permuted by the permutation keyed
 *     mix64(key, 2, w), whose round keys are derived here as Permutation does.
 */
#include "recordkit.h"

#define MAX_ROUNDS 16

static inline uint64_t round_hash(uint64_t x, uint64_t key) {
    uint64_t z = x ^ key;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline uint64_t mask_of(int bits) { return bits >= 64 ? ~0ULL : ((1ULL << bits) - 1); }

static uint64_t encrypt(uint64_t x, int wl, int wr, const uint64_t *keys, int rounds) {
    uint64_t left = x >> wr, right = x & mask_of(wr);
    for (int r = 0; r < rounds; r++) {
        uint64_t next = left ^ (round_hash(right, keys[r]) & mask_of(wl));
        left = right;
        right = next;
        int t = wl; wl = wr; wr = t;
    }
    return (left << wr) | right;
}

static uint64_t decrypt(uint64_t y, int wl, int wr, const uint64_t *keys, int rounds) {
    uint64_t left = y >> wr, right = y & mask_of(wr);
    for (int r = rounds - 1; r >= 0; r--) {
        int t = wl; wl = wr; wr = t;
        uint64_t prev_left = right ^ (round_hash(left, keys[r]) & mask_of(wl));
        right = left;
        left = prev_left;
    }
    return (left << wr) | right;
}

/* ---------------------------------------------------------- keys, as order.py */

#define GOLDEN 0x9E3779B97F4A7C15ULL

/* order.mix64(*words): SplitMix64 steps from pi's fraction. */
static uint64_t mix64(const uint64_t *words, int n) {
    uint64_t z = 0x243F6A8885A308D3ULL;
    for (int i = 0; i < n; i++) {
        z = (z ^ words[i]) + GOLDEN;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        z ^= z >> 31;
    }
    return z;
}

/* A Permutation(n, key) of order.py: its widths and round keys. */
typedef struct {
    uint64_t n;
    int wl, wr;
    uint64_t keys[MAX_ROUNDS];
} Perm;

#define ROUNDS 6

static void perm_init(Perm *p, uint64_t n, uint64_t key) {
    int bits = 2;
    while (bits < 64 && n > 1 && ((n - 1) >> bits)) bits++;
    p->n = n;
    p->wl = bits / 2;
    p->wr = bits - bits / 2;
    for (int r = 0; r < ROUNDS; r++) {
        uint64_t words[2] = {key, (uint64_t)r};
        p->keys[r] = mix64(words, 2);
    }
}

/* One encryption of each of LANES values at once: the rounds of a Feistel network
 * are a chain of dependent multiplies, so independent values interleave for free. */
#define LANES 8
static inline void encrypt_lanes(const Perm *p, uint64_t *v) {
    int wl = p->wl, wr = p->wr;
    uint64_t left[LANES], right[LANES];
    for (int k = 0; k < LANES; k++) {
        left[k] = v[k] >> wr;
        right[k] = v[k] & mask_of(wr);
    }
    for (int r = 0; r < ROUNDS; r++) {
        uint64_t m = mask_of(wl), key = p->keys[r];
        for (int k = 0; k < LANES; k++) {
            uint64_t next = left[k] ^ (round_hash(right[k], key) & m);
            left[k] = right[k];
            right[k] = next;
        }
        int t = wl; wl = wr; wr = t;
    }
    for (int k = 0; k < LANES; k++) v[k] = (left[k] << wr) | right[k];
}

/* out[i] = p(x[i]) for i < count (x and out may be one array), cycle-walking each
 * value: a lane whose value has left [0, n) takes the next one. */
static void perm_many(const Perm *p, const uint64_t *x, uint64_t *out, Py_ssize_t count) {
    if (p->n <= 1) {
        if (out != x) memmove(out, x, (size_t)count * sizeof(uint64_t));
        return;
    }
    uint64_t v[LANES];
    Py_ssize_t at[LANES], next = 0;
    int live = 0;
    for (int k = 0; k < LANES; k++) {
        at[k] = next < count ? next++ : -1;
        v[k] = at[k] >= 0 ? x[at[k]] : 0;
        live += at[k] >= 0;
    }
    while (live) {
        encrypt_lanes(p, v);
        for (int k = 0; k < LANES; k++) {
            if (at[k] < 0 || v[k] >= p->n) continue; /* idle, or walking on */
            out[at[k]] = v[k];
            if (next < count) {
                at[k] = next;
                v[k] = x[next++];
            } else {
                at[k] = -1;
                v[k] = 0;
                live--;
            }
        }
    }
}

/* q = j / d for j * d < 2^64, by a multiply: m = ceil(2^64 / d) (exact there). */
typedef struct {
    uint64_t d, m;
} Divisor;

static Divisor divisor(uint64_t d) {
    Divisor v = {d, 0};
#if defined(__SIZEOF_INT128__)
    v.m = d > 1 ? (uint64_t)((((unsigned __int128)1 << 64) + d - 1) / d) : 0;
#endif
    return v;
}

static inline uint64_t divide(const Divisor *v, uint64_t j) {
#if defined(__SIZEOF_INT128__)
    if (v->d == 1) return j;
    return (uint64_t)(((unsigned __int128)j * v->m) >> 64);
#else
    return j / v->d;
#endif
}

#define PLAN_CHUNK 1024

static PyObject *py_plan_order(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *g_obj, *out_obj, *bkeys_obj;
    unsigned long long total, block, window, full, key;
    if (!PyArg_ParseTuple(args, "OOKKKKO!K", &g_obj, &out_obj, &total, &block, &window, &full,
                          &PyTuple_Type, &bkeys_obj, &key))
        return NULL;
    if (block < 1 || window < 1 || full > total / block || PyTuple_GET_SIZE(bkeys_obj) != ROUNDS ||
        total > ((uint64_t)1 << 62) / block) {
        PyErr_SetString(PyExc_ValueError, "plan_order: bad block, window, full or keys");
        return NULL;
    }
    Perm blocks;
    perm_init(&blocks, full, 0);
    for (int r = 0; r < ROUNDS; r++) { /* the block permutation's round keys, as given */
        blocks.keys[r] = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(bkeys_obj, r));
        if (PyErr_Occurred()) return NULL;
    }
    Py_buffer g, out;
    if (PyObject_GetBuffer(g_obj, &g, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&g);
        return NULL;
    }
    PyObject *result = NULL;
    if (g.itemsize != 8 || out.itemsize != 8 || g.len != out.len) {
        PyErr_SetString(PyExc_ValueError, "plan_order: g and out must be int64 arrays of one length");
        goto done;
    }
    Py_ssize_t count = g.len / 8;
    const int64_t *src = (const int64_t *)g.buf;
    int64_t *dst = (int64_t *)out.buf;
    uint64_t per = window * block; /* records in a whole window */
    uint64_t windows = full ? (full + window - 1) / window : 1;
    Divisor by_block = divisor(block);
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    Perm within;
    uint64_t have = UINT64_MAX, first = 0, size = 0, blocks_in = 0;
    uint64_t j[PLAN_CHUNK], slots[PLAN_CHUNK];
    Py_ssize_t rows[PLAN_CHUNK];
    for (Py_ssize_t s = 0; s < count && !bad;) {
        uint64_t x = (uint64_t)src[s];
        if (x >= total) {
            bad = 1;
            break;
        }
        if (have == UINT64_MAX || x - first >= size) { /* another window: its keys, once */
            uint64_t w = x / per;
            if (w > windows - 1) w = windows - 1;
            uint64_t words[3] = {key, 2, w};
            first = w * per;
            blocks_in = w < windows - 1 ? window : full - w * window;
            size = w < windows - 1 ? per : total - first;
            perm_init(&within, size, mix64(words, 3));
            have = w;
        }
        /* a chunk of positions in this window: the window's permutation, then the blocks' */
        Py_ssize_t m = 0;
        while (m < PLAN_CHUNK && s + m < count) {
            uint64_t y = (uint64_t)src[s + m];
            if (y - first >= size) break; /* (wraps for y < first too) */
            j[m++] = y - first;
        }
        perm_many(&within, j, j, m);
        Py_ssize_t nb = 0;
        for (Py_ssize_t i = 0; i < m; i++) {
            uint64_t slot = divide(&by_block, j[i]);
            if (slot < blocks_in) {
                slots[nb] = have * window + slot;
                rows[nb++] = i;
            } else { /* the epoch's tail, after the last whole block */
                dst[s + i] = (int64_t)(full * block + (j[i] - blocks_in * block));
            }
        }
        perm_many(&blocks, slots, slots, nb);
        for (Py_ssize_t k = 0; k < nb; k++) {
            Py_ssize_t i = rows[k];
            uint64_t offset = j[i] - divide(&by_block, j[i]) * block;
            dst[s + i] = (int64_t)(slots[k] * block + offset);
        }
        s += m;
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_SetString(PyExc_IndexError, "plan_order: a position is outside [0, total)");
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&g);
    return result;
}

static PyObject *py_permute(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *x_obj, *out_obj, *keys_obj;
    unsigned long long n;
    int wl, wr, inverse;
    if (!PyArg_ParseTuple(args, "OOKiiO!p", &x_obj, &out_obj, &n, &wl, &wr, &PyTuple_Type,
                          &keys_obj, &inverse))
        return NULL;
    Py_ssize_t rounds = PyTuple_GET_SIZE(keys_obj);
    if (rounds < 2 || rounds > MAX_ROUNDS || rounds % 2 || wl < 1 || wr < 1 || wl + wr > 62) {
        PyErr_SetString(PyExc_ValueError, "permute: bad rounds or widths");
        return NULL;
    }
    uint64_t keys[MAX_ROUNDS];
    for (Py_ssize_t r = 0; r < rounds; r++) {
        keys[r] = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(keys_obj, r));
        if (PyErr_Occurred()) return NULL;
    }
    Py_buffer x, out;
    if (PyObject_GetBuffer(x_obj, &x, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    PyObject *result = NULL;
    if (x.itemsize != 8 || out.itemsize != 8 || x.len != out.len) {
        PyErr_SetString(PyExc_ValueError, "permute: x and out must be int64 arrays of one length");
        goto done;
    }
    Py_ssize_t count = x.len / 8;
    const int64_t *src = (const int64_t *)x.buf;
    int64_t *dst = (int64_t *)out.buf;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t v = (uint64_t)src[i];
        if (v >= n) { bad = 1; break; }
        /* cycle-walking: the network permutes [0, 2^(wl+wr)), n is within it */
        do {
            v = inverse ? decrypt(v, wl, wr, keys, (int)rounds) : encrypt(v, wl, wr, keys, (int)rounds);
        } while (v >= n);
        dst[i] = (int64_t)v;
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_SetString(PyExc_IndexError, "permute: a position is outside [0, n)");
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&x);
    return result;
}

static PyMethodDef methods[] = {
    {"permute", py_permute, METH_VARARGS,
     "permute(x, out, n, left, right, keys, inverse): the Feistel bijection of order.py."},
    {"plan_order", py_plan_order, METH_VARARGS,
     "plan_order(g, out, total, block, window, full, block_keys, key): EpochPlan.order's "
     "shuffled order, in C."},
    {NULL, NULL, 0, NULL},
};

/* Added to recordkit.native._ext by module.c. */
int rk_order_init(PyObject *m) { return PyModule_AddFunctions(m, methods); }
