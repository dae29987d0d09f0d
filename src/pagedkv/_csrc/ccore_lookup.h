/* A request's lookup, its first take and registration, and its free in C, for
 * DecodeAllocate's layout (one full-attention group, prefix caching on, one hash block
 * per block): DecodeAllocate's methods get_computed_blocks and free, and the steps the
 * admission (ccore_admit.h) runs without a Python call when the pool is plain.
 *
 * get_computed_blocks(request): facade_lookups.get_computed_blocks for a pagedkv Request
 *   whose tokens are those the facade left (_owned_tokens), within max_model_len, with an
 *   exact-str id, a list of block hashes and a plain num_preemptions: the longest run of
 *   the group's index hits over the first (num_tokens - 1) // block_size hashes, the
 *   lookup counted in mgr.lookups (preempted requests apart) and mgr.hit_rate_window,
 *   and the hit built as the Python method builds it (block ids, count, issuer, id, index
 *   generation, fingerprint). Installed only when full attention's own rule finds hits
 *   and no component hooks the lookup (core/fast_paths.py).
 * free(request_or_id): facade_frees.free when no component hooks the free: an unknown id
 *   does nothing; the live request (the very object, or its id) is forgotten, its table
 *   and registered count dropped and its blocks freed last first (pool_free), on a plain
 *   pool (no eviction policy, no listener, the compiled free queue).
 *
 * Every call any check fails goes, before anything changed, to the Python method (the
 * specification and the only place that raises). */

static PyObject *str_num_preemptions, *str_index, *str_dups, *str_secondary, *str_recorder,
    *str_lookups, *str_hit_rate_window, *str_observe, *str_requests, *str_queries, *str_hits,
    *str_preempted_requests, *str_preempted_queries, *str_preempted_hits,
    *str_evict_rehashed, *str_evict, *str_num_evicted_blocks, *str_block_hash,
    *str_block_group, *str_prefix;

/* pool_free and index_register (ccore_refs.h, ccore_index.h) with their arguments packed. */
static PyObject *lk_call_kernel(PyCFunction kernel, PyObject *const *items, Py_ssize_t n) {
    PyObject *args = PyTuple_New(n);
    if (args == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(args, i, Py_NewRef(items[i]));
    PyObject *out = kernel(NULL, args);
    Py_DECREF(args);
    return out;
}

/* obj.name += delta (an int attribute). 0 or -1 with an exception. */
static int lk_add(PyObject *obj, PyObject *name, Py_ssize_t delta) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    PyObject *d = PyLong_FromSsize_t(delta);
    PyObject *sum = d != NULL ? PyNumber_Add(v, d) : NULL;
    Py_DECREF(v);
    Py_XDECREF(d);
    if (sum == NULL) return -1;
    int rc = PyObject_SetAttr(obj, name, sum);
    Py_DECREF(sum);
    return rc;
}

/* count_lookup: the statistics of one lookup. 0 or -1. */
static int lk_count(PyObject *mgr, Py_ssize_t preempted, Py_ssize_t queries, Py_ssize_t hits) {
    PyObject *lookups = PyObject_GetAttr(mgr, str_lookups);
    if (lookups == NULL) return -1;
    int rc;
    if (preempted) {
        rc = lk_add(lookups, str_preempted_requests, 1) < 0
             || lk_add(lookups, str_preempted_queries, queries) < 0
             || lk_add(lookups, str_preempted_hits, hits) < 0 ? -1 : 0;
        Py_DECREF(lookups);
        return rc;
    }
    rc = lk_add(lookups, str_requests, 1) < 0 || lk_add(lookups, str_queries, queries) < 0
         || lk_add(lookups, str_hits, hits) < 0 ? -1 : 0;
    Py_DECREF(lookups);
    if (rc < 0) return -1;
    PyObject *window = PyObject_GetAttr(mgr, str_hit_rate_window);
    if (window == NULL) return -1;
    PyObject *q = PyLong_FromSsize_t(queries), *h = PyLong_FromSsize_t(hits);
    PyObject *r = q && h ? PyObject_CallMethodObjArgs(window, str_observe, q, h, NULL) : NULL;
    Py_XDECREF(q);
    Py_XDECREF(h);
    Py_DECREF(window);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* pool.<name>[group] when pool.<name> is an exact list long enough and the item an exact
 * dict: a new reference, or NULL (error cleared: fall back). */
static PyObject *lk_group_dict(PyObject *pool, PyObject *name, Py_ssize_t group) {
    PyObject *all = PyObject_GetAttr(pool, name);
    if (all == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *d = NULL;
    if (PyList_CheckExact(all) && group < PyList_GET_SIZE(all)
        && PyDict_CheckExact(PyList_GET_ITEM(all, group))) {
        d = Py_NewRef(PyList_GET_ITEM(all, group));
    }
    Py_DECREF(all);
    return d;
}

/* The hit record (the hit type's fields, group_tokens None), built as a tuple of that
 * type (checked at construction to be a plain tuple subclass of HIT_NUM_FIELDS). */
static PyObject *lk_hit(DecodeAllocate *self, PyObject *blocks, Py_ssize_t num_hit,
                        PyObject *issuer, PyObject *rid, PyObject *generation) {
    PyObject *count = PyLong_FromSsize_t(num_hit);
    PyObject *ids = PyList_AsTuple(blocks);
    PyObject *print = count && ids ? PyTuple_Pack(2, count, ids) : NULL;
    PyObject *tables = PyTuple_Pack(1, blocks);
    PyTypeObject *type = (PyTypeObject *)self->hit_type;
    PyObject *hit = print && tables ? type->tp_alloc(type, HIT_NUM_FIELDS) : NULL;
    Py_XDECREF(ids);
    if (hit == NULL) {
        Py_XDECREF(count);
        Py_XDECREF(print);
        Py_XDECREF(tables);
        return NULL;
    }
    PyObject *items[HIT_NUM_FIELDS] = {tables, count, Py_NewRef(issuer), Py_NewRef(rid),
                                       Py_NewRef(generation), print, Py_NewRef(Py_None)};
    for (int i = 0; i < HIT_NUM_FIELDS; i++) PyTuple_SET_ITEM(hit, i, items[i]);
    return hit;
}

/* The probe: index[hashes[i]] for i < n up to the first miss. A new list or NULL. */
static PyObject *lk_probe(PyObject *index, PyObject *hashes, Py_ssize_t n) {
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PyDict_GetItemWithError(index, PyList_GET_ITEM(hashes, i));
        if (b == NULL) {
            if (!PyErr_Occurred()) break;
            Py_DECREF(out);
            return NULL;
        }
        if (PyList_Append(out, b) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* The lookup: 0 with *out, 1 when not covered (nothing changed), -1 with an exception. */
static int lk_lookup(DecodeAllocate *self, PyObject *mgr, PyObject *request, PyObject **out) {
    if (!self->fast_lookup || Py_TYPE(request) != (PyTypeObject *)self->request_type) return 1;
    Py_ssize_t num_tokens = da_num_tokens(self, request);
    Py_ssize_t preempted = da_count(request, str_num_preemptions);
    if (num_tokens < 0 || num_tokens > self->max_model_len || preempted < 0) return 1;
    PyObject *rid = admit_attr(request, str_request_id);
    PyObject *hashes = admit_attr(request, str_block_hashes);
    PyObject *issuer = admit_attr(mgr, str_issuer_token);
    PyObject *prefix = admit_attr(self->pool, str_prefix); /* the façade reads it there */
    PyObject *generation = prefix != NULL ? admit_attr(prefix, str_index_generation) : NULL;
    Py_XDECREF(prefix);
    PyObject *index = lk_group_dict(self->pool, str_index, self->group);
    PyObject *blocks = NULL;
    int rc = 1;
    if (rid && hashes && issuer && generation && index && PyUnicode_CheckExact(rid)
        && PyList_CheckExact(hashes)) {
        Py_ssize_t n = num_tokens > 0 ? (num_tokens - 1) / self->block_size : 0;
        if (n > PyList_GET_SIZE(hashes)) n = PyList_GET_SIZE(hashes);
        blocks = lk_probe(index, hashes, n);
        if (blocks == NULL) PyErr_Clear(); /* the Python method raises it again */
    }
    if (blocks != NULL) {
        Py_ssize_t num_hit = PyList_GET_SIZE(blocks) * self->block_size;
        rc = lk_count(mgr, preempted, num_tokens, num_hit) < 0 ? -1 : 0;
        if (rc == 0) {
            *out = lk_hit(self, blocks, num_hit, issuer, rid, generation);
            rc = *out == NULL ? -1 : 0;
        }
    }
    Py_XDECREF(blocks);
    Py_XDECREF(index);
    Py_XDECREF(generation);
    Py_XDECREF(issuer);
    Py_XDECREF(hashes);
    Py_XDECREF(rid);
    return rc;
}

static PyObject *da_lookup(DecodeAllocate *self, PyObject *request) {
    PyObject *mgr = da_manager(self);
    if (mgr == NULL) return NULL;
    PyObject *out = NULL;
    int rc = lk_lookup(self, mgr, request, &out);
    if (rc == 1 && self->lookup_function == NULL) {
        PyErr_SetString(PyExc_TypeError, "DecodeAllocate: built without lookup_function");
    } else if (rc == 1) {
        out = PyObject_CallFunctionObjArgs(self->lookup_function, mgr, request, NULL);
    }
    Py_DECREF(mgr);
    return out;
}

/* The pool's free queue, ref counts and hashes when the pool is plain (no policy, no
 * listener, the compiled queue, lists): 1 with new references in k[0..3) (queue,
 * ref_cnt, block_hash), else 0 (fall back). */
static int lk_plain_pool(DecodeAllocate *self, PyObject **k) {
    PyObject *policy = admit_attr(self->pool, str_policy);
    PyObject *listeners = admit_attr(self->pool, str_listeners);
    int plain = policy == Py_None && listeners != NULL && PyTuple_CheckExact(listeners)
                && PyTuple_GET_SIZE(listeners) == 0;
    Py_XDECREF(policy);
    Py_XDECREF(listeners);
    if (!plain) return 0;
    k[0] = admit_attr(self->pool, str_free_queue);
    k[1] = admit_attr(self->pool, str_ref_cnt);
    k[2] = admit_attr(self->pool, str_block_hash);
    if (k[0] && k[1] && k[2] && Py_TYPE(k[0]) == &FreeQueueType && PyList_CheckExact(k[1])
        && PyList_CheckExact(k[2])) return 1;
    for (int i = 0; i < 3; i++) Py_CLEAR(k[i]);
    return 0;
}

/* The free: 0 done, 1 not covered (nothing changed), -1 with an exception. */
static int lk_free(DecodeAllocate *self, PyObject *request) {
    if (!self->fast_free) return 1;
    PyObject *rid;
    if (PyUnicode_CheckExact(request)) rid = Py_NewRef(request);
    else if (Py_TYPE(request) == (PyTypeObject *)self->request_type) {
        rid = PyObject_GetAttr(request, str_request_id);
        if (rid == NULL) PyErr_Clear();
        if (rid == NULL || !PyUnicode_CheckExact(rid)) {
            Py_XDECREF(rid);
            return 1;
        }
    } else return 1;
    PyObject *live = da_get(self->live, rid), *k[3] = {NULL, NULL, NULL};
    int rc = 1;
    if (live == NULL) rc = PyErr_Occurred() ? 1 : 0; /* unknown: nothing to do */
    else if ((live == request || rid == request) && lk_plain_pool(self, k)) {
        PyObject *table = PyDict_GetItemWithError(self->tables, rid);
        Py_XINCREF(table);
        rc = PyDict_DelItem(self->live, rid) < 0 ? -1 : 0;
        if (rc == 0 && table != NULL && PyDict_DelItem(self->tables, rid) < 0) rc = -1;
        if (rc == 0 && PyDict_Contains(self->cached, rid) == 1
            && PyDict_DelItem(self->cached, rid) < 0) rc = -1;
        if (rc == 0 && table != NULL && PyList_CheckExact(table) && PyList_GET_SIZE(table)) {
            rc = pool_free_table(k, table);
        }
        Py_XDECREF(table);
        for (int i = 0; i < 3; i++) Py_XDECREF(k[i]);
    }
    Py_DECREF(rid);
    return rc;
}

static PyObject *da_free(DecodeAllocate *self, PyObject *request) {
    if (self->free_function == NULL) {
        PyErr_SetString(PyExc_TypeError, "DecodeAllocate: built without free_function");
        return NULL;
    }
    int rc = lk_free(self, request);
    if (rc < 0) return NULL;
    if (rc == 0) Py_RETURN_NONE;
    PyObject *mgr = da_manager(self);
    if (mgr == NULL) return NULL;
    PyObject *out = PyObject_CallFunctionObjArgs(self->free_function, mgr, request, NULL);
    Py_DECREF(mgr);
    return out;
}

#include "ccore_lookup_take.h"

static int ccore_lookup_add(PyObject *m) {
    (void)m;
    const char *names[] = {"num_preemptions", "index", "duplicates", "secondary", "recorder",
                           "lookups", "hit_rate_window", "observe", "requests", "queries",
                           "hits", "preempted_requests", "preempted_queries",
                           "preempted_hits", "_evict_rehashed", "evict_block",
                           "num_evicted_blocks", "block_hash", "block_group", "prefix"};
    PyObject **slots[] = {&str_num_preemptions, &str_index, &str_dups, &str_secondary,
                          &str_recorder, &str_lookups, &str_hit_rate_window, &str_observe,
                          &str_requests, &str_queries, &str_hits, &str_preempted_requests,
                          &str_preempted_queries, &str_preempted_hits, &str_evict_rehashed,
                          &str_evict, &str_num_evicted_blocks, &str_block_hash,
                          &str_block_group, &str_prefix};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *slots[i] = PyUnicode_InternFromString(names[i]);
        if (*slots[i] == NULL) return -1;
    }
    return 0;
}
