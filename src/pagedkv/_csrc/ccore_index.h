/* The prefix index's per-block loops (pagedkv/core/pool.py, prefix_index.py):
 *
 * pool_take: BlockPool.get_new_blocks after the ids left the free queue — each gets ref
 *   count 1, and each that was cached is evicted from the index, the common case inline
 *   (one dict delete), the rest through the pool's Python _evict;
 * index_register: PrefixIndex.cache_full_blocks's loop without a mask — each block gets
 *   its hash and group and joins the index (as primary or duplicate).
 *
 * Both do what the Python loops do, in the same order, with the same calls back (the
 * recorder's removed, _evict), and raise what they raise. */

/* b as a C index into a list of `size` entries; -1 with an exception when it is not. */
static Py_ssize_t ix_block(PyObject *b, Py_ssize_t size) {
    Py_ssize_t v = PyLong_Check(b) ? PyLong_AsSsize_t(b) : -1;
    if (v < 0 || v >= size) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "block id out of range");
        return -1;
    }
    return v;
}

/* list[i] = value (a new reference taken here, the old item released); 0 or -1. */
static int ix_set(PyObject *list, Py_ssize_t i, PyObject *value) {
    Py_INCREF(value);
    if (i < 0 || i >= PyList_GET_SIZE(list)) {
        return PyList_SetItem(list, i, value); /* raises IndexError, releases value */
    }
    PyObject *old = PyList_GET_ITEM(list, i);
    PyList_SET_ITEM(list, i, value);
    Py_DECREF(old);
    return 0;
}

/* removed(list, group) when the list is not empty; a fresh list in *list. 0 or -1. */
static int ix_flush(PyObject *removed, PyObject **list, PyObject *group) {
    if (PyList_GET_SIZE(*list) == 0) return 0;
    PyObject *r = PyObject_CallFunctionObjArgs(removed, *list, group, NULL);
    if (r == NULL) return -1;
    Py_DECREF(r);
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL) return -1;
    Py_SETREF(*list, fresh);
    return 0;
}

PyDoc_STRVAR(pool_take_doc,
"pool_take(ids, ref_cnt, block_hash, block_group, index, dups, secondary, removed, evict)"
" -> int\n\n"
"BlockPool.get_new_blocks's loop over `ids` (just taken from the free queue): each gets\n"
"ref count 1; a cached one whose key has no duplicate and no partial-prefix entry is\n"
"dropped from index[group] inline and told to removed(hashes, group) in runs of one\n"
"group, any other cached one goes to evict(b). The number evicted inline.");

static PyObject *pool_take(PyObject *self, PyObject *args) {
    PyObject *ids, *ref, *bh, *bg, *index, *dups, *secondary, *removed, *evict;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!OO:pool_take", &PyList_Type, &ids,
                          &PyList_Type, &ref, &PyList_Type, &bh, &PyList_Type, &bg,
                          &PyList_Type, &index, &PyList_Type, &dups, &PyDict_Type, &secondary,
                          &removed, &evict)) {
        return NULL;
    }
    Py_ssize_t size = PyList_GET_SIZE(ref);
    if (PyList_GET_SIZE(bh) != size || PyList_GET_SIZE(bg) != size) {
        PyErr_SetString(PyExc_ValueError, "pool_take: per-block lists of different lengths");
        return NULL;
    }
    PyObject *one = PyLong_FromLong(1);
    PyObject *list = PyList_New(0);
    PyObject *group = PyLong_FromLong(0); /* the group of the hashes in `list` */
    PyObject *g_held = NULL; /* the group of the block being evicted */
    Py_ssize_t num_evicted = 0;
    if (one == NULL || list == NULL || group == NULL) goto fail;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(ids); k++) {
        PyObject *b_obj = PyList_GET_ITEM(ids, k);
        Py_ssize_t b = ix_block(b_obj, size);
        if (b < 0) goto fail;
        PyObject *h = PyList_GET_ITEM(bh, b);
        if (h != Py_None) {
            PyObject *g = PyList_GET_ITEM(bg, b);
            Py_INCREF(g); /* held across the recorder's Python code below */
            Py_XSETREF(g_held, g);
            Py_ssize_t gi = ix_block(g, PyList_GET_SIZE(index));
            if (gi < 0 || gi >= PyList_GET_SIZE(dups)) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "group out of range");
                goto fail;
            }
            PyObject *dg = PyList_GET_ITEM(dups, gi);
            if (!PyDict_Check(dg)) {
                PyErr_SetString(PyExc_TypeError, "pool_take: dups holds a non-dict");
                goto fail;
            }
            int plain = 1;
            if (PyDict_GET_SIZE(dg)) {
                int has = PyDict_Contains(dg, h);
                if (has < 0) goto fail;
                plain = !has;
            }
            if (plain && PyDict_GET_SIZE(secondary)) {
                int has = PyDict_Contains(secondary, b_obj);
                if (has < 0) goto fail;
                plain = !has;
            }
            if (plain) {
                PyObject *ig = PyList_GET_ITEM(index, gi);
                Py_INCREF(h); /* the list below keeps it; bh drops its reference */
                if (PyDict_DelItem(ig, h) < 0) {
                    Py_DECREF(h);
                    goto fail;
                }
                if (ix_set(bh, b, Py_None) < 0) {
                    Py_DECREF(h);
                    goto fail;
                }
                num_evicted++;
                int same = PyObject_RichCompareBool(g, group, Py_EQ);
                if (same < 0 || (!same && ix_flush(removed, &list, group) < 0)) {
                    Py_DECREF(h);
                    goto fail;
                }
                Py_INCREF(g);
                Py_SETREF(group, g);
                int rc = PyList_Append(list, h);
                Py_DECREF(h);
                if (rc < 0) goto fail;
            } else {
                if (ix_flush(removed, &list, group) < 0) goto fail;
                PyObject *r = PyObject_CallOneArg(evict, b_obj);
                if (r == NULL) goto fail;
                Py_DECREF(r);
            }
        }
        if (ix_set(ref, b, one) < 0) goto fail;
    }
    if (ix_flush(removed, &list, group) < 0) goto fail;
    Py_XDECREF(g_held);
    Py_DECREF(one);
    Py_DECREF(list);
    Py_DECREF(group);
    return PyLong_FromSsize_t(num_evicted);
fail:
    Py_XDECREF(g_held);
    Py_XDECREF(one);
    Py_XDECREF(list);
    Py_XDECREF(group);
    return NULL;
}

/* list.append(i). 0, or -1 with an exception. */
static int ix_append_index(PyObject *list, Py_ssize_t i) {
    PyObject *pos = PyLong_FromSsize_t(i);
    if (pos == NULL) return -1;
    int rc = PyList_Append(list, pos);
    Py_DECREF(pos);
    return rc;
}

PyDoc_STRVAR(index_register_doc,
"index_register(blocks, hashes, start, stop, index, dups, block_hash, block_group, group,"
" evict) -> list\n\n"
"PrefixIndex.cache_full_blocks's loop without a mask, over positions [start, stop) of\n"
"`blocks`: a null block, or one already registered under hashes[i] in `group`, is\n"
"skipped; one registered under another key goes to evict(b) first; then it gets\n"
"hashes[i] and `group` and joins `index` (this group's dict) as primary, or `dups` as a\n"
"duplicate. The skipped positions.");

/* Block b_obj's truth and C id: 1 with *b set (an exact int is read once), 0 for a null
 * block (falsy), -1 with an exception. */
static int ix_live_block(PyObject *b_obj, Py_ssize_t size, Py_ssize_t *b) {
    if (PyLong_CheckExact(b_obj)) {
        Py_ssize_t v = PyLong_AsSsize_t(b_obj);
        if (v == 0) return 0;
        if (v > 0 && v < size) {
            *b = v;
            return 1;
        }
        if (v == -1 && PyErr_Occurred()) return -1;
    } else {
        int truth = PyObject_IsTrue(b_obj);
        if (truth <= 0) return truth;
    }
    *b = ix_block(b_obj, size);
    return *b < 0 ? -1 : 1;
}

/* One registration of block b_obj (at C id b) under hash h in `group`: left alone when it
 * already is (1: skipped), another key's block to evict(b) first, then primary or
 * duplicate. 0 registered, 1 skipped, -1 an error. The caller holds b_obj and h (evict
 * runs Python). */
static int ix_register_one(PyObject *b_obj, Py_ssize_t b, PyObject *h, PyObject *index,
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

/* index_register's loop on checked arguments (bh and bg lists, index and dups dicts):
 * the skipped positions, a new list, or NULL with an exception. With a mask (not NULL:
 * a sliding window's reachable_mask, PrefixIndex._register_masked) the positions it
 * leaves out are skipped too. */
static PyObject *ix_register(PyObject *blocks, PyObject *hashes, Py_ssize_t start,
                             Py_ssize_t stop, PyObject *index, PyObject *dups, PyObject *bh,
                             PyObject *bg, PyObject *group, PyObject *evict,
                             const IxMask *mask) {
    Py_ssize_t size = PyList_GET_SIZE(bh);
    if (PyList_GET_SIZE(bg) != size) {
        PyErr_SetString(PyExc_ValueError, "index_register: per-block lists differ in length");
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
        int rc, live = mask == NULL || ix_reachable(mask, i)
                           ? ix_live_block(b_obj, size, &b)
                           : PyObject_IsTrue(b_obj) < 0 ? -1 : 0; /* masked: skipped */
        if (live <= 0) {
            rc = live < 0 ? -1 : 1;
        } else if (i >= PyList_GET_SIZE(hashes)) {
            PyErr_SetString(PyExc_IndexError, "list index out of range");
            rc = -1;
        } else {
            PyObject *h = Py_NewRef(PyList_GET_ITEM(hashes, i));
            rc = ix_register_one(b_obj, b, h, index, dups, bh, bg, group, evict);
            Py_DECREF(h);
        }
        Py_DECREF(b_obj);
        if (rc < 0 || (rc == 1 && ix_append_index(skipped, i) < 0)) Py_CLEAR(skipped);
    }
    return skipped;
}

static PyObject *index_register(PyObject *self, PyObject *args) {
    PyObject *blocks, *hashes, *index, *dups, *bh, *bg, *group, *evict;
    Py_ssize_t start, stop;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!nnO!O!O!O!OO:index_register", &PyList_Type, &blocks,
                          &PyList_Type, &hashes, &start, &stop, &PyDict_Type, &index,
                          &PyDict_Type, &dups, &PyList_Type, &bh, &PyList_Type, &bg, &group,
                          &evict)) {
        return NULL;
    }
    return ix_register(blocks, hashes, start, stop, index, dups, bh, bg, group, evict,
                       NULL);
}

PyDoc_STRVAR(longest_hit_doc,
"longest_hit(index, hashes, n) -> list\n\n"
"The blocks index[hashes[0]], index[hashes[1]], ... for the first n hashes, up to the\n"
"first hash `index` (a dict) does not hold: FullAttentionManager's longest-hit probe.");

static PyObject *longest_hit(PyObject *self, PyObject *args) {
    PyObject *index, *hashes;
    Py_ssize_t n;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!n:longest_hit", &PyDict_Type, &index, &PyList_Type,
                          &hashes, &n)) {
        return NULL;
    }
    if (n > PyList_GET_SIZE(hashes)) n = PyList_GET_SIZE(hashes);
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PyDict_GetItemWithError(index, PyList_GET_ITEM(hashes, i));
        if (b == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(out);
                return NULL;
            }
            break;
        }
        if (PyList_Append(out, b) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyMethodDef index_methods[] = {
    {"longest_hit", longest_hit, METH_VARARGS, longest_hit_doc},
    {"pool_take", pool_take, METH_VARARGS, pool_take_doc},
    {"index_register", index_register, METH_VARARGS, index_register_doc},
    {NULL, NULL, 0, NULL},
};

static int ccore_index_add(PyObject *m) { return PyModule_AddFunctions(m, index_methods); }
