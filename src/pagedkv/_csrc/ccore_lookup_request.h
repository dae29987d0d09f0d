/* lookup_request: a façade's lookup after its checks, in one call (the compiled twin of
 * pagedkv.core.kernels_hybrid_hits.lookup_request, the specification). Included by
 * ccore.c after ccore_lookup.h (lk_count) and ccore_hybrid_fixed_point.h. */

/* lookup_request(find, mgr, request, num_tokens): find's hit for the request's hashes
 * within num_tokens - 1, counted (ccore_lookup.h's lk_count: the counters, the hit-rate
 * window's observe) and built as the hit type (that of mgr._empty_hit, a tuple of its 7
 * fields). */
#include "ccore_lookup_stats.h"

static PyObject *hf_str_block_hashes, *hf_str_empty_hit, *hf_str_issuer, *hf_str_rid,
    *hf_str_pool, *hf_str_generation;

/* (num_hit, tuple(t) for t in tables) */
static PyObject *hf_fingerprint(PyObject *tables, PyObject *num_hit) {
    Py_ssize_t n = PyTuple_GET_SIZE(tables);
    PyObject *out = PyTuple_New(n + 1);
    if (out == NULL) return NULL;
    PyTuple_SET_ITEM(out, 0, Py_NewRef(num_hit));
    for (Py_ssize_t g = 0; g < n; g++) {
        PyObject *t = PySequence_Tuple(PyTuple_GET_ITEM(tables, g));
        if (t == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, g + 1, t);
    }
    return out;
}

/* The hit record: (tables, num_hit, issuer, request_id, generation, fingerprint, None). */
static PyObject *hf_record(PyObject *mgr, PyObject *request, PyObject *empty, PyObject *tables,
                           PyObject *num_hit, const LrTypes *types) {
    PyObject *f[7] = {Py_NewRef(tables), Py_NewRef(num_hit), NULL, NULL, NULL, NULL,
                      Py_NewRef(Py_None)};
    f[2] = PyObject_GetAttr(mgr, hf_str_issuer);
    f[3] = f[2] ? PyObject_GetAttr(request, hf_str_rid) : NULL;
    PyObject *pool = f[3] ? PyObject_GetAttr(mgr, hf_str_pool) : NULL;
    PyObject *prefix = pool ? PyObject_GetAttr(pool, str_prefix) : NULL;
    f[4] = prefix ? lr_generation(prefix, hf_str_generation, types) : NULL;
    f[5] = f[4] ? hf_fingerprint(tables, num_hit) : NULL;
    Py_XDECREF(pool);
    Py_XDECREF(prefix);
    PyTypeObject *type = Py_TYPE(empty);
    PyObject *hit = f[5] ? type->tp_alloc(type, 7) : NULL;
    for (int i = 0; i < 7; i++) {
        if (hit != NULL) PyTuple_SET_ITEM(hit, i, f[i]);
        else Py_XDECREF(f[i]);
    }
    return hit;
}

PyDoc_STRVAR(lookup_request_doc,
"lookup_request(find, mgr, request, num_tokens) -> hit\n\n"
"A counted lookup (pagedkv.core.kernels_hybrid_hits.lookup_request).");

/* lookup_request's work over checked arguments (types: ccore_lookup_stats.h, or NULL):
 * a new reference or NULL. */
static PyObject *lr_run(PyObject *find, PyObject *mgr, PyObject *request,
                        Py_ssize_t num_tokens, const LrTypes *types) {
    PyObject *hashes = PyObject_GetAttr(request, hf_str_block_hashes);
    if (hashes == NULL) return NULL;
    PyObject *limit = PyLong_FromSsize_t(num_tokens - 1), *found = NULL;
    if (limit != NULL) {
        PyObject *call[2] = {hashes, limit};
        found = PyObject_Vectorcall(find, call, 2, NULL);
    }
    Py_DECREF(hashes);
    Py_XDECREF(limit);
    if (found == NULL) return NULL;
    PyObject *empty = PyObject_GetAttr(mgr, hf_str_empty_hit), *out = NULL;
    if (empty == NULL || found == Py_None) {
        Py_DECREF(found);
        return empty; /* caching off: no lookup, nothing counted */
    }
    if (!PyTuple_Check(empty) || PyTuple_GET_SIZE(empty) != 7 || !PyTuple_CheckExact(found)
        || PyTuple_GET_SIZE(found) != 2 || !PyTuple_Check(PyTuple_GET_ITEM(found, 0))
        || !PyLong_Check(PyTuple_GET_ITEM(found, 1))) {
        PyErr_SetString(PyExc_TypeError, "lookup_request: a hit of 7 fields from a finder "
                        "returning (tuple of block lists, int)");
        goto done;
    }
    PyObject *tables = PyTuple_GET_ITEM(found, 0), *num_hit = PyTuple_GET_ITEM(found, 1);
    Py_ssize_t hits = PyLong_AsSsize_t(num_hit);
    if (hits == -1 && PyErr_Occurred()) goto done;
    PyObject *pre = PyObject_GetAttr(request, str_num_preemptions);
    int preempted = pre != NULL ? PyObject_IsTrue(pre) : -1;
    Py_XDECREF(pre);
    if (preempted < 0 || lr_count(mgr, preempted, num_tokens, hits, types) < 0) goto done;
    out = hf_record(mgr, request, empty, tables, num_hit, types);
done:
    Py_DECREF(empty);
    Py_DECREF(found);
    return out;
}

static PyObject *lookup_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "lookup_request(find, mgr, request, num_tokens)");
        return NULL;
    }
    Py_ssize_t num_tokens = PyLong_AsSsize_t(args[3]);
    if (num_tokens == -1 && PyErr_Occurred()) return NULL;
    return lr_run(args[0], args[1], args[2], num_tokens, NULL);
}

static int ccore_lookup_request_add(void) {
    if (ccore_lookup_stats_add() < 0) return -1;
    const char *names[] = {"block_hashes", "_empty_hit", "issuer_token", "request_id", "pool",
                           "index_generation"};
    PyObject **slots[] = {&hf_str_block_hashes, &hf_str_empty_hit, &hf_str_issuer,
                          &hf_str_rid, &hf_str_pool, &hf_str_generation};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *slots[i] = PyUnicode_InternFromString(names[i]);
        if (*slots[i] == NULL) return -1;
    }
    return 0;
}
