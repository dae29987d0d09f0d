/* The lookup's statistics and index generation without Python frames, for
 * HybridLookup (ccore_hybrid_lookup.h): the steps of HitRateWindow.observe
 * (pagedkv/core/metrics.py) on a window of exactly that class, and of
 * PrefixIndex.index_generation (pagedkv/core/prefix_index.py) on an index of exactly that
 * class; any other object runs its own method. Included by ccore_lookup_request.h. */

/* The classes whose steps these are (None or NULL: always the object's own method). */
typedef struct {
    PyObject *window_type, *prefix_type;
} LrTypes;

static PyObject *lr_str_entries, *lr_str_max_requests, *lr_str_append, *lr_str_popleft,
    *lr_str_evicted, *lr_str_rehashed;

/* obj.name -= value. 0 or -1. */
static int lr_sub(PyObject *obj, PyObject *name, PyObject *value) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    PyObject *diff = PyNumber_Subtract(v, value);
    Py_DECREF(v);
    if (diff == NULL) return -1;
    int rc = PyObject_SetAttr(obj, name, diff);
    Py_DECREF(diff);
    return rc;
}

/* HitRateWindow.observe(q, h): the pair appended, the sums grown, the oldest pair
 * dropped past max_requests. 0 or -1. */
static int lr_observe(PyObject *window, Py_ssize_t q, Py_ssize_t h) {
    PyObject *entries = PyObject_GetAttr(window, lr_str_entries);
    if (entries == NULL) return -1;
    PyObject *pair = Py_BuildValue("(nn)", q, h);
    PyObject *r = pair ? PyObject_CallMethodOneArg(entries, lr_str_append, pair) : NULL;
    Py_XDECREF(pair);
    int rc = r == NULL || lk_add(window, str_queries, q) < 0 || lk_add(window, str_hits, h) < 0
             ? -1 : 0;
    Py_XDECREF(r);
    Py_ssize_t n = rc == 0 ? PyObject_Length(entries) : -1;
    PyObject *len = n >= 0 ? PyLong_FromSsize_t(n) : NULL;
    PyObject *max = len ? PyObject_GetAttr(window, lr_str_max_requests) : NULL;
    int over = max ? PyObject_RichCompareBool(len, max, Py_GT) : -1;
    Py_XDECREF(len);
    Py_XDECREF(max);
    if (over == 1) {
        PyObject *old = PyObject_CallMethodNoArgs(entries, lr_str_popleft);
        if (old != NULL && (!PyTuple_Check(old) || PyTuple_GET_SIZE(old) != 2)) {
            PyErr_SetString(PyExc_ValueError, "HitRateWindow: an entry not a (queries, hits)");
            Py_CLEAR(old);
        }
        over = old == NULL || lr_sub(window, str_queries, PyTuple_GET_ITEM(old, 0)) < 0
               || lr_sub(window, str_hits, PyTuple_GET_ITEM(old, 1)) < 0 ? -1 : 0;
        Py_XDECREF(old);
    }
    Py_DECREF(entries);
    return over < 0 ? -1 : 0;
}

/* lk_count (ccore_lookup.h), with a fresh lookup's window observed in C when it is of
 * types->window_type exactly. 0 or -1. */
static int lr_count(PyObject *mgr, int preempted, Py_ssize_t q, Py_ssize_t h,
                    const LrTypes *types) {
    if (preempted || types == NULL || types->window_type == NULL) {
        return lk_count(mgr, preempted, q, h);
    }
    PyObject *window = PyObject_GetAttr(mgr, str_hit_rate_window);
    if (window == NULL) return -1;
    if (Py_TYPE(window) != (PyTypeObject *)types->window_type) {
        Py_DECREF(window);
        return lk_count(mgr, preempted, q, h);
    }
    PyObject *lookups = PyObject_GetAttr(mgr, str_lookups);
    int rc = lookups == NULL || lk_add(lookups, str_requests, 1) < 0
             || lk_add(lookups, str_queries, q) < 0 || lk_add(lookups, str_hits, h) < 0
             || lr_observe(window, q, h) < 0 ? -1 : 0;
    Py_XDECREF(lookups);
    Py_DECREF(window);
    return rc;
}

/* prefix.index_generation: num_evicted_blocks + _num_rehashed on an index of
 * types->prefix_type exactly, else the property. A new reference or NULL. */
static PyObject *lr_generation(PyObject *prefix, PyObject *generation_name,
                               const LrTypes *types) {
    if (types == NULL || types->prefix_type == NULL
        || Py_TYPE(prefix) != (PyTypeObject *)types->prefix_type) {
        return PyObject_GetAttr(prefix, generation_name);
    }
    PyObject *evicted = PyObject_GetAttr(prefix, lr_str_evicted);
    PyObject *rehashed = evicted ? PyObject_GetAttr(prefix, lr_str_rehashed) : NULL;
    PyObject *out = rehashed ? PyNumber_Add(evicted, rehashed) : NULL;
    Py_XDECREF(evicted);
    Py_XDECREF(rehashed);
    return out;
}

static int ccore_lookup_stats_add(void) {
    const char *names[] = {"_entries", "max_requests", "append", "popleft",
                           "num_evicted_blocks", "_num_rehashed"};
    PyObject **slots[] = {&lr_str_entries, &lr_str_max_requests, &lr_str_append,
                          &lr_str_popleft, &lr_str_evicted, &lr_str_rehashed};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *slots[i] = PyUnicode_InternFromString(names[i]);
        if (*slots[i] == NULL) return -1;
    }
    return 0;
}
