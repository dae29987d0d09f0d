/* pagedkv.core._ccore: the compiled core's per-block loops.
 *
 * hash_plain: BlockHasher's chained SHA-256 over canonical CBOR for blocks without extra
 * keys, byte for byte what the pure path computes (pagedkv/core/hashing.py). It hashes
 * every block: the pure path's hash memo (which spares Python the CBOR encoding and the
 * SHA-256 of blocks it hashed recently) would cost more here than the hash it saves, so
 * the compiled core leaves the memo empty. Tokens outside what the pure fast path takes
 * (an id that is not an int in 0 .. 2**17 - 1) make it return False having changed
 * nothing: the caller then runs the pure path, which encodes them or raises. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <string.h>

#include "sha256.h"

#define DIGEST_BYTES 32
#define CHUNK_TOKENS 1024
#define TABLE_LIMIT (1L << 17) /* token ids the pure fast path's table holds */

static PyObject *str_seed;

/* Canonical CBOR head of major type `major` with argument `value` into out; its length. */
static size_t cbor_head(uint8_t *out, unsigned major, uint64_t value) {
    uint8_t mt = (uint8_t)(major << 5);
    if (value < 24) {
        out[0] = mt | (uint8_t)value;
        return 1;
    }
    int n = value < 0x100 ? 1 : value < 0x10000 ? 2 : value < 0x100000000ULL ? 4 : 8;
    out[0] = mt | (uint8_t)(n == 1 ? 24 : n == 2 ? 25 : n == 4 ? 26 : 27);
    for (int i = 0; i < n; i++) out[1 + i] = (uint8_t)(value >> (8 * (n - 1 - i)));
    return 1 + (size_t)n;
}

/* One block's hash input: [parent, tokens, None] as canonical CBOR. */
static size_t encode_block(uint8_t *out, const uint8_t *parent, const uint32_t *tokens,
                           Py_ssize_t bs) {
    uint8_t *p = out;
    *p++ = 0x83;
    *p++ = 0x58;
    *p++ = DIGEST_BYTES;
    memcpy(p, parent, DIGEST_BYTES);
    p += DIGEST_BYTES;
    p += cbor_head(p, 4, (uint64_t)bs);
    for (Py_ssize_t i = 0; i < bs; i++) {
        uint32_t v = tokens[i];
        if (v < 24) {
            *p++ = (uint8_t)v;
        } else if (v < 0x100) {
            *p++ = 0x18;
            *p++ = (uint8_t)v;
        } else if (v < 0x10000) {
            *p++ = 0x19;
            *p++ = (uint8_t)(v >> 8);
            *p++ = (uint8_t)v;
        } else {
            *p++ = 0x1a;
            *p++ = (uint8_t)(v >> 24);
            *p++ = (uint8_t)(v >> 16);
            *p++ = (uint8_t)(v >> 8);
            *p++ = (uint8_t)v;
        }
    }
    *p++ = 0xf6;
    return (size_t)(p - out);
}

/* Token ids [start, stop) of `tokens` (a list) as uint32 into out; 0 when one is not an
 * int in 0 .. TABLE_LIMIT - 1. */
static int read_tokens(PyObject *tokens, Py_ssize_t start, Py_ssize_t stop, uint32_t *out) {
    for (Py_ssize_t i = start; i < stop; i++) {
        PyObject *item = PyList_GET_ITEM(tokens, i);
        if (!PyLong_Check(item)) return 0;
        int overflow = 0;
        long v = PyLong_AsLongAndOverflow(item, &overflow);
        if (overflow || v < 0 || v >= TABLE_LIMIT) return 0;
        out[i - start] = (uint32_t)v;
    }
    return 1;
}

/* Append one digest (a new bytes object) and make it the parent. 0, or -1 on error. */
static int push_digest(PyObject *hashes, const uint8_t *data, size_t len, uint8_t *parent) {
    pk_sha256(data, len, parent);
    PyObject *digest = PyBytes_FromStringAndSize((const char *)parent, DIGEST_BYTES);
    if (digest == NULL) return -1;
    int rc = PyList_Append(hashes, digest);
    Py_DECREF(digest);
    return rc;
}

PyDoc_STRVAR(hash_plain_doc,
"hash_plain(hasher, hashes, tokens, start, stop, block_size) -> bool\n\n"
"Append to `hashes` the SHA-256 CBOR chained hashes of the blocks of `tokens` (a list)\n"
"in [start, stop) (multiples of block_size) without extra keys, as\n"
"BlockHasher._extend_plain computes them (the first parent: the last of `hashes`, else\n"
"hasher.seed). False, with nothing changed, when a token is not an int in\n"
"0 .. 2**17 - 1 or the parent is not a 32-byte digest.");

static PyObject *hash_plain(PyObject *self, PyObject *args) {
    PyObject *hasher, *hashes, *tokens;
    Py_ssize_t start, stop, bs;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO!O!nnn:hash_plain", &hasher, &PyList_Type, &hashes,
                          &PyList_Type, &tokens, &start, &stop, &bs)) {
        return NULL;
    }
    if (bs <= 0 || start < 0 || stop > PyList_GET_SIZE(tokens) || start > stop ||
        (stop - start) % bs != 0) {
        PyErr_SetString(PyExc_ValueError, "hash_plain: bad block range");
        return NULL;
    }
    uint8_t parent[DIGEST_BYTES];
    Py_ssize_t num_hashes = PyList_GET_SIZE(hashes);
    PyObject *last = num_hashes ? PyList_GET_ITEM(hashes, num_hashes - 1)
                                : PyObject_GetAttr(hasher, str_seed);
    if (last == NULL) return NULL;
    int parent_ok = PyBytes_Check(last) && PyBytes_GET_SIZE(last) == DIGEST_BYTES;
    if (parent_ok) memcpy(parent, PyBytes_AS_STRING(last), DIGEST_BYTES);
    if (!num_hashes) Py_DECREF(last);
    if (!parent_ok) Py_RETURN_FALSE;
    Py_ssize_t n = stop - start;
    uint32_t ids_small[CHUNK_TOKENS];
    uint8_t buf_small[64 * 5 + 64];
    uint32_t *ids = n <= CHUNK_TOKENS ? ids_small : PyMem_Malloc(sizeof(uint32_t) * (size_t)n);
    uint8_t *buf = bs <= 64 ? buf_small : PyMem_Malloc((size_t)bs * 5 + 64);
    PyObject *result = NULL;
    if (ids == NULL || buf == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (!read_tokens(tokens, start, stop, ids)) {
        result = Py_False;
        goto done;
    }
    for (Py_ssize_t k = 0; k < n; k += bs) {
        size_t len = encode_block(buf, parent, ids + k, bs);
        if (push_digest(hashes, buf, len, parent) < 0) goto done;
    }
    result = Py_True;
done:
    if (ids != ids_small) PyMem_Free(ids);
    if (buf != buf_small) PyMem_Free(buf);
    Py_XINCREF(result);
    return result;
}

PyDoc_STRVAR(sha256_doc,
"sha256(data: bytes) -> bytes\n\nThe SHA-256 digest of `data` (the compiled core's own).");

static PyObject *sha256(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint8_t out[DIGEST_BYTES];
    pk_sha256((const uint8_t *)view.buf, (size_t)view.len, out);
    PyBuffer_Release(&view);
    return PyBytes_FromStringAndSize((const char *)out, DIGEST_BYTES);
}

PyDoc_STRVAR(sha256_mode_doc,
"sha256_mode(portable: bool | None = None) -> str\n\n"
"'shani' or 'portable': the compression function in use; `portable` True forces the\n"
"portable one, False the detected one (tests compare the two).");

static PyObject *sha256_mode(PyObject *self, PyObject *args) {
    PyObject *portable = Py_None;
    (void)self;
    if (!PyArg_ParseTuple(args, "|O:sha256_mode", &portable)) return NULL;
    if (portable != Py_None) {
        int flag = PyObject_IsTrue(portable);
        if (flag < 0) return NULL;
        pk_sha256_force_portable(flag);
    }
    return PyUnicode_FromString(pk_sha256_accelerated() ? "shani" : "portable");
}

/* Ready `type` and add it to the module as `name`: -1 with an exception on failure. */
static int ccore_add_type(PyObject *m, PyTypeObject *type, const char *name) {
    if (PyType_Ready(type) < 0) return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(m, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

#include "ccore_pool.h"
#include "ccore_fast.h"
#include "ccore_admit.h"
#include "ccore_groups.h"
#include "ccore_index.h"
#include "ccore_vllm.h"
/* The hybrid groups' own loops (pure twins: pagedkv/core/kernels_hybrid.py). */
#include "ccore_hybrid_hash.h"
#include "ccore_hybrid_admit.h"
#include "ccore_hybrid_events.h"
#include "ccore_hybrid_hits.h"
/* A full-attention request's lookup, first take and registration, and free. */
#include "ccore_lookup.h"

static PyMethodDef methods[] = {
    {"hash_plain", hash_plain, METH_VARARGS, hash_plain_doc},
    {"sha256", sha256, METH_O, sha256_doc},
    {"sha256_mode", sha256_mode, METH_VARARGS, sha256_mode_doc},
    /* the hybrid kernels */
    {"hash_keyed", hash_keyed, METH_VARARGS, hash_keyed_doc},
    {"admit_groups", (PyCFunction)(void (*)(void))admit_groups, METH_FASTCALL,
     admit_groups_doc},
    {"record_stored", (PyCFunction)(void (*)(void))record_stored, METH_FASTCALL,
     record_stored_doc},
    {"window_hit", (PyCFunction)(void (*)(void))window_hit, METH_FASTCALL, window_hit_doc},
    {"chunk_hit", (PyCFunction)(void (*)(void))chunk_hit, METH_FASTCALL, chunk_hit_doc},
    {"state_hit", (PyCFunction)(void (*)(void))state_hit, METH_FASTCALL, state_hit_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pagedkv.core._ccore",
    "pagedkv's compiled core: the per-block loops (see pagedkv.core.native).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ccore(void) {
    pk_sha256_init();
    str_seed = PyUnicode_InternFromString("seed");
    if (str_seed == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (ccore_pool_add(m) < 0 || ccore_fast_add(m) < 0 || ccore_groups_add(m) < 0
        || ccore_index_add(m) < 0 || ccore_vllm_add(m) < 0 || ccore_admit_add(m) < 0
        || ccore_lookup_add(m) < 0
        || ccore_hybrid_admit_init() < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
