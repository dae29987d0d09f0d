/* The masked registration of GroupsAllocate (ccore_hybrid_step_register.h): a sliding
 * window group whose reachable_mask leaves positions out (SlidingWindowManager: only the
 * blocks a hit aligned to the lcm of the block sizes can end with) registers by
 * PrefixIndex._register_masked, here in C: index_register's loop (ccore_index.h) with the
 * positions the mask leaves out skipped too. The mask is the window's rule, read once at
 * construction (group_allocation._registration): position i is registered iff i >= shift
 * and (i - shift) % per_segment >= first. Included by ccore_groups.h. */

/* ccore_index.h's helpers (defined there, after this file). */
static int ix_live_block(PyObject *b_obj, Py_ssize_t size, Py_ssize_t *b);
static int ix_set(PyObject *list, Py_ssize_t i, PyObject *value);
static int ix_append_index(PyObject *list, Py_ssize_t i);

/* The window's mask at table position i (SlidingWindowManager.reachable_mask). */
static int am_reachable(Py_ssize_t i, Py_ssize_t per_segment, Py_ssize_t first,
                        Py_ssize_t shift) {
    return i >= shift && (i - shift) % per_segment >= first;
}

/* Block b_obj (at C id b, with a hash) registered under h in `group`, or left alone when
 * it already is (1: skipped); another key's block goes to evict(b) first. 0 registered,
 * 1 skipped, -1 an error. */
static int am_register_one(PyObject *b_obj, Py_ssize_t b, PyObject *h, PyObject *index,
                           PyObject *dups, PyObject *bh, PyObject *bg, PyObject *group,
                           PyObject *evict) {
    PyObject *cur = PyList_GET_ITEM(bh, b);
    if (cur != Py_None) {
        int same = PyObject_RichCompareBool(cur, h, Py_EQ);
        if (same > 0) same = PyObject_RichCompareBool(PyList_GET_ITEM(bg, b), group, Py_EQ);
        if (same != 0) return same < 0 ? -1 : 1;
        PyObject *r = PyObject_CallOneArg(evict, b_obj);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    if (ix_set(bh, b, h) < 0 || ix_set(bg, b, group) < 0) return -1;
    PyObject *primary = PyDict_SetDefault(index, h, b_obj); /* borrowed */
    if (primary == NULL) return -1;
    if (primary == b_obj) return 0;
    int same = PyObject_RichCompareBool(primary, b_obj, Py_EQ);
    if (same != 0) return same < 0 ? -1 : 0;
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL) return -1;
    PyObject *later = PyDict_SetDefault(dups, h, fresh);
    Py_DECREF(fresh);
    return later == NULL || PyList_Append(later, b_obj) < 0 ? -1 : 0;
}

/* PrefixIndex._register_masked over positions [start, stop) of `blocks` (an exact list;
 * hashes, bh and bg exact lists; index and dups dicts): the skipped positions (null
 * blocks, masked ones, ones already registered so), a new list, or NULL with an
 * exception. */
static PyObject *am_register(PyObject *blocks, PyObject *hashes, Py_ssize_t start,
                             Py_ssize_t stop, PyObject *index, PyObject *dups, PyObject *bh,
                             PyObject *bg, PyObject *group, PyObject *evict,
                             Py_ssize_t per_segment, Py_ssize_t first, Py_ssize_t shift) {
    Py_ssize_t size = PyList_GET_SIZE(bh);
    if (PyList_GET_SIZE(bg) != size) {
        PyErr_SetString(PyExc_ValueError, "masked registration: per-block lists differ");
        return NULL;
    }
    PyObject *skipped = PyList_New(0);
    for (Py_ssize_t i = start; skipped != NULL && i < stop; i++) {
        if (i < 0 || i >= PyList_GET_SIZE(blocks)) {
            PyErr_SetString(PyExc_IndexError, "list index out of range");
            Py_CLEAR(skipped);
            break;
        }
        PyObject *b_obj = Py_NewRef(PyList_GET_ITEM(blocks, i)); /* held: evict runs Python */
        Py_ssize_t b = 0;
        int rc, live = am_reachable(i, per_segment, first, shift)
                           ? ix_live_block(b_obj, size, &b)
                           : PyObject_IsTrue(b_obj) < 0 ? -1 : 0; /* masked: skipped */
        if (live <= 0) {
            rc = live < 0 ? -1 : 1;
        } else if (i >= PyList_GET_SIZE(hashes)) {
            PyErr_SetString(PyExc_IndexError, "list index out of range");
            rc = -1;
        } else {
            PyObject *h = Py_NewRef(PyList_GET_ITEM(hashes, i));
            rc = am_register_one(b_obj, b, h, index, dups, bh, bg, group, evict);
            Py_DECREF(h);
        }
        Py_DECREF(b_obj);
        if (rc < 0 || (rc == 1 && ix_append_index(skipped, i) < 0)) Py_CLEAR(skipped);
    }
    return skipped;
}
