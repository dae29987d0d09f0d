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

/* One block's hash input [parent, tokens, keys] as canonical CBOR into out; its length.
 * `tail` (tail_len bytes) is the keys' canonical CBOR, or NULL for None (no keys). The one
 * encoder of hash_plain and hash_keyed. */
static size_t encode_block(uint8_t *out, const uint8_t *parent, const uint32_t *tokens,
                           Py_ssize_t bs, const char *tail, Py_ssize_t tail_len) {
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
    if (tail == NULL) {
        *p++ = 0xf6;
    } else {
        memcpy(p, tail, (size_t)tail_len);
        p += tail_len;
    }
    return (size_t)(p - out);
}

/* One token: 1 with *out set; 0 when `item` is not an int in 0 .. TABLE_LIMIT - 1. */
static int read_token(PyObject *item, uint32_t *out) {
    if (!PyLong_Check(item)) return 0;
    int overflow = 0;
    long v = PyLong_AsLongAndOverflow(item, &overflow);
    if (overflow || v < 0 || v >= TABLE_LIMIT) return 0;
    *out = (uint32_t)v;
    return 1;
}

/* Token ids [start, stop) of `tokens` (any sequence; a list or tuple read in place) as
 * uint32 into out: 1; 0 when one is not an int in 0 .. TABLE_LIMIT - 1 or indexing the
 * sequence raised IndexError or TypeError (cleared, as the pure kernel's slice); -1 with
 * any other error set. */
static int read_tokens(PyObject *tokens, Py_ssize_t start, Py_ssize_t stop, uint32_t *out) {
    if (PyList_Check(tokens) || PyTuple_Check(tokens)) {
        PyObject **items = PySequence_Fast_ITEMS(tokens);
        for (Py_ssize_t i = start; i < stop; i++) {
            if (!read_token(items[i], out + (i - start))) return 0;
        }
        return 1;
    }
    for (Py_ssize_t i = start; i < stop; i++) {
        PyObject *item = PySequence_GetItem(tokens, i);
        if (item == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_IndexError)
                && !PyErr_ExceptionMatches(PyExc_TypeError)) {
                return -1;
            }
            PyErr_Clear();
            return 0;
        }
        int ok = read_token(item, out + (i - start));
        Py_DECREF(item);
        if (!ok) return 0;
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

/* The kernels' block range rule: 0 <= start <= stop <= len(tokens), stop - start a
 * multiple of bs > 0. 0, or -1 with ValueError (or len's error) set. */
static int check_block_range(const char *name, PyObject *tokens, Py_ssize_t start,
                             Py_ssize_t stop, Py_ssize_t bs) {
    Py_ssize_t len = PyObject_Length(tokens);
    if (len < 0) return -1;
    if (bs <= 0 || start < 0 || stop > len || start > stop || (stop - start) % bs != 0) {
        PyErr_Format(PyExc_ValueError, "%s: bad block range", name);
        return -1;
    }
    return 0;
}

/* The chained hashes of the blocks of `tokens` in [start, stop) after `parent` (updated
 * to the last digest), appended to `hashes`: block k's keys tail is tails[k] (bytes, at
 * most `longest` long) or None when `tails` is NULL. A new reference to True, or False
 * with `hashes` unchanged (a token outside the table); NULL on error. */
static PyObject *hash_blocks(PyObject *hashes, PyObject *tokens, Py_ssize_t start,
                             Py_ssize_t stop, Py_ssize_t bs, uint8_t *parent,
                             PyObject *tails, Py_ssize_t longest) {
    Py_ssize_t n = stop - start;
    size_t buf_len = (size_t)bs * 5 + 64 + (size_t)longest;
    uint32_t ids_small[CHUNK_TOKENS];
    uint8_t buf_small[64 * 5 + 64];
    uint32_t *ids = n <= CHUNK_TOKENS ? ids_small : PyMem_Malloc(sizeof(uint32_t) * (size_t)n);
    uint8_t *buf = buf_len <= sizeof buf_small ? buf_small : PyMem_Malloc(buf_len);
    PyObject *result = NULL;
    if (ids == NULL || buf == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int read = read_tokens(tokens, start, stop, ids);
    if (read <= 0) {
        result = read == 0 ? Py_False : NULL;
        goto done;
    }
    for (Py_ssize_t k = 0; k < n; k += bs) {
        PyObject *tail = tails == NULL ? NULL : PyList_GET_ITEM(tails, k / bs);
        size_t len = encode_block(buf, parent, ids + k, bs,
                                  tail == NULL ? NULL : PyBytes_AS_STRING(tail),
                                  tail == NULL ? 0 : PyBytes_GET_SIZE(tail));
        if (push_digest(hashes, buf, len, parent) < 0) goto done;
    }
    result = Py_True;
done:
    if (ids != ids_small) PyMem_Free(ids);
    if (buf != buf_small) PyMem_Free(buf);
    Py_XINCREF(result);
    return result;
}

PyDoc_STRVAR(hash_plain_doc,
"hash_plain(hasher, hashes, tokens, start, stop, block_size) -> bool\n\n"
"Append to `hashes` the SHA-256 CBOR chained hashes of the blocks of `tokens` (any\n"
"sequence; a list or tuple read in place) in [start, stop) (multiples of block_size)\n"
"without extra keys, as pagedkv.core.kernels_pure.hash_plain computes them (the first\n"
"parent: the last of `hashes`, else hasher.seed). False, with nothing changed, when a\n"
"token is not an int in 0 .. 2**17 - 1 or the parent is not a 32-byte digest.");

static PyObject *hash_plain(PyObject *self, PyObject *args) {
    PyObject *hasher, *hashes, *tokens;
    Py_ssize_t start, stop, bs;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO!Onnn:hash_plain", &hasher, &PyList_Type, &hashes,
                          &tokens, &start, &stop, &bs)) {
        return NULL;
    }
    if (check_block_range("hash_plain", tokens, start, stop, bs) < 0) return NULL;
    uint8_t parent[DIGEST_BYTES];
    Py_ssize_t num_hashes = PyList_GET_SIZE(hashes);
    PyObject *last = num_hashes ? PyList_GET_ITEM(hashes, num_hashes - 1)
                                : PyObject_GetAttr(hasher, str_seed);
    if (last == NULL) return NULL;
    int parent_ok = PyBytes_Check(last) && PyBytes_GET_SIZE(last) == DIGEST_BYTES;
    if (parent_ok) memcpy(parent, PyBytes_AS_STRING(last), DIGEST_BYTES);
    if (!num_hashes) Py_DECREF(last);
    if (!parent_ok) Py_RETURN_FALSE;
    return hash_blocks(hashes, tokens, start, stop, bs, parent, NULL, 0);
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

/* The masked registration's mask and index_register's loop, declared (ccore_index.h). */
#include "ccore_index_mask.h"
#include "ccore_pool.h"
#include "ccore_refs.h"
#include "ccore_fast.h"
#include "ccore_admit.h"
/* A Mamba group's running step (pure twins: pagedkv/core/kernels_hybrid_step.py). */
#include "ccore_hybrid_step.h"
#include "ccore_groups.h"
#include "ccore_index.h"
#include "ccore_vllm.h"
/* The hybrid groups' own loops (pure twins: pagedkv/core/kernels_hybrid.py). */
#include "ccore_hybrid_hash.h"
#include "ccore_hybrid_admit.h"
#include "ccore_hybrid_events.h"
#include "ccore_hybrid_hits.h"
#include "ccore_hybrid_first.h"
/* A hybrid request's hashing extras and lookup (pure twins:
 * pagedkv/core/kernels_hybrid_lookup.py). */
#include "ccore_hybrid_lookup_tails.h"
/* A full-attention request's lookup, first take and registration, and free. */
#include "ccore_lookup.h"
/* A coordinator's whole lookup (pure twin: pagedkv/core/kernels_hybrid_hits.py). */
#include "ccore_hybrid_fixed_point.h"
/* A façade's lookup after its checks (pure twin: pagedkv/core/kernels_hybrid_hits.py). */
#include "ccore_lookup_request.h"
/* A new request's prompt: checked, copied and hashed in one call (pure twin:
 * pagedkv/core/kernels_request.py). */
#include "ccore_request.h"
/* BlockPool's take, touch and free as C methods (the compiled allocation's pool calls). */
#include "ccore_pool_ops.h"
/* get_computed_blocks in C over a coordinator's compiled lookup. */
#include "ccore_hybrid_lookup.h"

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
    /* the hybrid request's hashing extras and lookup */
    {"extra_tails", (PyCFunction)(void (*)(void))extra_tails, METH_FASTCALL,
     extra_tails_doc},
    {"mamba_release", (PyCFunction)(void (*)(void))mamba_release, METH_FASTCALL,
     mamba_release_doc},
    {"mamba_grow", (PyCFunction)(void (*)(void))mamba_grow, METH_FASTCALL, mamba_grow_doc},
    {"free_groups", (PyCFunction)(void (*)(void))free_groups, METH_FASTCALL,
     free_groups_doc},
    {"lookup_request", (PyCFunction)(void (*)(void))lookup_request, METH_FASTCALL,
     lookup_request_doc},
    {"start_request", (PyCFunction)(void (*)(void))start_request, METH_FASTCALL,
     start_request_doc},
    {"extend_request", (PyCFunction)(void (*)(void))extend_request, METH_FASTCALL,
     extend_request_doc},
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
        || ccore_lookup_add(m) < 0 || ccore_refs_add(m) < 0
        || ccore_hybrid_admit_init() < 0 || ccore_hybrid_first_init() < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (ccore_fixed_point_add(m) < 0 || ccore_lookup_request_add() < 0
        || ccore_pool_ops_add(m) < 0 || ccore_buffer_stored_add(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (ccore_hybrid_lookup_add(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
