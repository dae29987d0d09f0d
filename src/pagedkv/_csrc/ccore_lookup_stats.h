/* The lookup's statistics and index generation without Python frames, for
 * HybridLookup (ccore_hybrid_lookup.h): the steps of HitRateWindow.observe
 * (pagedkv/core/metrics.py) on a window of exactly that class, the counters' sums on a
 * LookupCounters of exactly that class (their slots read and written in place, as the
 * slots' descriptors do), and PrefixIndex.index_generation (pagedkv/core/prefix_index.py)
 * on an index of exactly that class; any other object runs its own method or attribute
 * protocol. Included by ccore_lookup_request.h. */

/* A slot's offset in its object (a member descriptor of an object slot), or -1. */
enum { LR_HITS, LR_QUERIES, LR_REQUESTS, LR_W_ENTRIES, LR_W_HITS, LR_W_QUERIES, LR_W_MAX,
       LR_NUM_SLOTS };

/* The classes whose steps these are (NULL: always the object's own method). */
typedef struct {
    PyObject *window_type, *prefix_type, *counters_type;
    Py_ssize_t slot[LR_NUM_SLOTS]; /* all >= 0, or slot[0] == -1: no slot access */
} LrTypes;

/* type.name's slot offset when it is an object slot of `type` itself, else -1. */
static Py_ssize_t lr_slot_offset(PyObject *type, const char *name) {
    PyObject *d = PyDict_GetItemString(((PyTypeObject *)type)->tp_dict, name); /* borrowed */
    if (d == NULL || Py_TYPE(d) != &PyMemberDescr_Type) return -1;
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY)
        || ((PyMemberDescrObject *)d)->d_common.d_type != (PyTypeObject *)type) {
        return -1;
    }
    return m->offset;
}

/* Resolve the slots of the counters and window classes (-1 in slot[0]: none). */
static void lr_resolve_slots(LrTypes *t) {
    const char *names[LR_NUM_SLOTS] = {"hits", "queries", "requests", "_entries", "hits",
                                       "queries", "max_requests"};
    t->slot[0] = -1;
    if (t->counters_type == NULL || t->window_type == NULL) return;
    Py_ssize_t found[LR_NUM_SLOTS];
    for (int i = 0; i < LR_NUM_SLOTS; i++) {
        found[i] = lr_slot_offset(i < LR_W_ENTRIES ? t->counters_type : t->window_type,
                                  names[i]);
        if (found[i] < 0) return;
    }
    memcpy(t->slot, found, sizeof(found));
}

/* The object in obj's slot (borrowed; NULL when unset). */
#define LR_SLOT(obj, t, i) (*(PyObject **)((char *)(obj) + (t)->slot[i]))

/* A slot emptied under a sum (by an odd value's own code): -1 with AttributeError. */
static int lr_unset(void) {
    PyErr_SetString(PyExc_AttributeError, "a lookup statistics slot is unset");
    return -1;
}

/* obj's slot i += delta (set, so never NULL). 0 or -1. */
static int lr_slot_add(PyObject *obj, const LrTypes *t, int i, PyObject *delta) {
    if (LR_SLOT(obj, t, i) == NULL) return lr_unset();
    PyObject *sum = PyNumber_Add(LR_SLOT(obj, t, i), delta);
    if (sum == NULL) return -1;
    PyObject *old = LR_SLOT(obj, t, i);
    LR_SLOT(obj, t, i) = sum;
    Py_DECREF(old);
    return 0;
}

/* obj's slot i -= value. 0 or -1. */
static int lr_slot_sub(PyObject *obj, const LrTypes *t, int i, PyObject *value) {
    if (LR_SLOT(obj, t, i) == NULL) return lr_unset();
    PyObject *diff = PyNumber_Subtract(LR_SLOT(obj, t, i), value);
    if (diff == NULL) return -1;
    PyObject *old = LR_SLOT(obj, t, i);
    LR_SLOT(obj, t, i) = diff;
    Py_DECREF(old);
    return 0;
}

static PyObject *lr_one; /* the int 1 */
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

/* A fresh lookup counted through the slots (counters and window of the exact classes,
 * every slot set): the counters' sums, then HitRateWindow.observe's steps. 0 or -1. */
static int lr_count_slots(PyObject *lookups, PyObject *window, const LrTypes *t,
                          Py_ssize_t q, Py_ssize_t h) {
    PyObject *qo = PyLong_FromSsize_t(q), *ho = PyLong_FromSsize_t(h);
    PyObject *pair = qo && ho ? PyTuple_Pack(2, qo, ho) : NULL;
    int rc = pair == NULL || lr_slot_add(lookups, t, LR_REQUESTS, lr_one) < 0
             || lr_slot_add(lookups, t, LR_QUERIES, qo) < 0
             || lr_slot_add(lookups, t, LR_HITS, ho) < 0 ? -1 : 0;
    /* read after the sums (an odd value's __add__ may have replaced it); held across
     * the calls */
    PyObject *entries = Py_XNewRef(LR_SLOT(window, t, LR_W_ENTRIES));
    if (entries == NULL) rc = -1;
    PyObject *r = rc == 0 ? PyObject_CallMethodOneArg(entries, lr_str_append, pair) : NULL;
    Py_XDECREF(pair);
    rc = r == NULL || lr_slot_add(window, t, LR_W_QUERIES, qo) < 0
         || lr_slot_add(window, t, LR_W_HITS, ho) < 0 ? -1 : 0;
    Py_XDECREF(r);
    Py_XDECREF(qo);
    Py_XDECREF(ho);
    Py_ssize_t n = rc == 0 ? PyObject_Length(entries) : -1;
    PyObject *len = n >= 0 ? PyLong_FromSsize_t(n) : NULL;
    PyObject *max = LR_SLOT(window, t, LR_W_MAX);
    int over = len && max ? PyObject_RichCompareBool(len, max, Py_GT) : -1;
    Py_XDECREF(len);
    if (over == 1) {
        PyObject *old = PyObject_CallMethodNoArgs(entries, lr_str_popleft);
        if (old != NULL && (!PyTuple_Check(old) || PyTuple_GET_SIZE(old) != 2)) {
            PyErr_SetString(PyExc_ValueError, "HitRateWindow: an entry not a (queries, hits)");
            Py_CLEAR(old);
        }
        over = old == NULL || lr_slot_sub(window, t, LR_W_QUERIES, PyTuple_GET_ITEM(old, 0)) < 0
               || lr_slot_sub(window, t, LR_W_HITS, PyTuple_GET_ITEM(old, 1)) < 0 ? -1 : 0;
        Py_XDECREF(old);
    }
    Py_XDECREF(entries);
    if (over < 0 && !PyErr_Occurred()) lr_unset(); /* max_requests unset */
    return over < 0 ? -1 : 0;
}

/* lk_count (ccore_lookup.h), with a fresh lookup's window observed in C when it is of
 * types->window_type exactly (through the slots when the counters are of
 * types->counters_type too and every slot is set). 0 or -1. */
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
    if (lookups != NULL && types->slot[0] >= 0
        && Py_TYPE(lookups) == (PyTypeObject *)types->counters_type) {
        int set = 1;
        for (int i = 0; i < LR_NUM_SLOTS; i++) {
            set &= LR_SLOT(i < LR_W_ENTRIES ? lookups : window, types, i) != NULL;
        }
        if (set) {
            int rc = lr_count_slots(lookups, window, types, q, h);
            Py_DECREF(lookups);
            Py_DECREF(window);
            return rc;
        }
    }
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
    if ((lr_one = PyLong_FromLong(1)) == NULL) return -1;
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
