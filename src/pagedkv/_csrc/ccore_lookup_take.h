/* DecodeAllocate's quiet first take and registration (ccore_lookup.h): the pool's parts
 * read once, the take-and-evict loop and the registration without a recorder. Its
 * pure-Python specification is BlockPool.get_new_blocks and PrefixIndex.cache_full_blocks
 * under the null EventRecorder. Included by ccore_lookup.h. */

static void lk_parts_clear(LkParts *p) {
    Py_CLEAR(p->queue);
    Py_CLEAR(p->ref);
    Py_CLEAR(p->bh);
    Py_CLEAR(p->bg);
    Py_CLEAR(p->index);
    Py_CLEAR(p->dups);
    Py_CLEAR(p->secondary);
    Py_CLEAR(p->prefix);
}

/* 1 with *p filled when the pool is plain, its recorder hears nothing and its per-block
 * lists and index have the shapes the loops read; else 0 (nothing held). */
static int lk_parts(DecodeAllocate *self, LkParts *p) {
    memset(p, 0, sizeof(*p));
    if (!self->fast_register) return 0;
    PyObject *recorder = admit_attr(self->pool, str_recorder);
    int quiet = recorder != NULL && Py_TYPE(recorder) == (PyTypeObject *)self->null_recorder;
    Py_XDECREF(recorder);
    PyObject *k[3] = {NULL, NULL, NULL};
    if (!quiet || !lk_plain_pool(self, k)) return 0;
    p->queue = k[0];
    p->ref = k[1];
    p->bh = k[2];
    p->prefix = admit_attr(self->pool, str_prefix);
    if (p->prefix != NULL) {
        p->bg = admit_attr(p->prefix, str_block_group);
        p->index = admit_attr(p->prefix, str_index);
        p->dups = admit_attr(p->prefix, str_dups);
        p->secondary = admit_attr(p->prefix, str_secondary);
    }
    Py_ssize_t size = PyList_GET_SIZE(p->ref);
    if (p->bg && p->index && p->dups && p->secondary && PyList_CheckExact(p->bg)
        && PyList_CheckExact(p->index) && PyList_CheckExact(p->dups)
        && PyDict_CheckExact(p->secondary) && PyList_GET_SIZE(p->bh) == size
        && PyList_GET_SIZE(p->bg) == size
        && PyList_GET_SIZE(p->index) == PyList_GET_SIZE(p->dups)
        && self->group < PyList_GET_SIZE(p->index)
        && ((FreeQueue *)p->queue)->head <= size) return 1;
    lk_parts_clear(p);
    return 0;
}

/* Block b's eviction as pool_take does it (ccore_index.h), no recorder told: inline
 * (1) when its key has no duplicate and no partial-prefix entry, else through the prefix
 * index's evict_block (0: it counts the eviction itself). -1 with an exception. */
static int lk_evict(DecodeAllocate *self, LkParts *p, Py_ssize_t b, PyObject *b_obj) {
    PyObject *h = PyList_GET_ITEM(p->bh, b);
    Py_ssize_t gi = ix_block(PyList_GET_ITEM(p->bg, b), PyList_GET_SIZE(p->index));
    if (gi < 0) return -1;
    PyObject *dg = PyList_GET_ITEM(p->dups, gi), *ig = PyList_GET_ITEM(p->index, gi);
    if (!PyDict_Check(dg) || !PyDict_Check(ig)) {
        PyErr_SetString(PyExc_TypeError, "the pool's index holds a non-dict");
        return -1;
    }
    int has = PyDict_GET_SIZE(dg) ? PyDict_Contains(dg, h) : 0;
    if (has == 0 && PyDict_GET_SIZE(p->secondary)) has = PyDict_Contains(p->secondary, b_obj);
    if (has < 0) return -1;
    if (has) {
        PyObject *r = PyObject_CallMethodOneArg(p->prefix, str_evict, b_obj);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    if (PyDict_DelItem(ig, h) < 0) return -1;
    return ix_set(p->bh, b, Py_None) < 0 ? -1 : 1;
}

/* The taken blocks are spread over the pool's lists and their hashes over the heap:
 * fetch the list slots of the block 8 ahead and the hash object of the block 4 ahead
 * while block i is evicted (a hint only: no state read or changed). */
static void lk_prefetch(LkParts *p, const int32_t *ids_c, Py_ssize_t i, Py_ssize_t n) {
#if defined(__GNUC__) || defined(__clang__)
    if (i + 8 < n) {
        int32_t far = ids_c[i + 8];
        __builtin_prefetch(&PyList_GET_ITEM(p->bh, far));
        __builtin_prefetch(&PyList_GET_ITEM(p->bg, far));
        __builtin_prefetch(&PyList_GET_ITEM(p->ref, far), 1);
    }
    if (i + 4 < n) __builtin_prefetch(PyList_GET_ITEM(p->bh, ids_c[i + 4]));
#else
    (void)p, (void)ids_c, (void)i, (void)n;
#endif
}

/* 1 when the pool's per-block lists still hold `size` slots (after an eviction that ran
 * the prefix index's Python method), else 0 with an exception. */
static int lk_sizes_kept(LkParts *p, Py_ssize_t size) {
    if (PyList_GET_SIZE(p->ref) == size && PyList_GET_SIZE(p->bh) == size
        && PyList_GET_SIZE(p->bg) == size) return 1;
    PyErr_SetString(PyExc_RuntimeError, "the pool's block lists changed size during a take");
    return 0;
}

/* The take loop over ids (their values in ids_c): each block's ref count set to `one`,
 * the cached ones evicted; the inline evictions counted into *evicted. 0 or -1. */
static int lk_take_loop(DecodeAllocate *self, LkParts *p, PyObject *ids,
                        const int32_t *ids_c, Py_ssize_t n, Py_ssize_t *evicted) {
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL) return -1;
    Py_ssize_t size = PyList_GET_SIZE(p->ref);
    for (Py_ssize_t i = 0; i < n; i++) {
        lk_prefetch(p, ids_c, i, n);
        Py_ssize_t b = ids_c[i];
        if (PyList_GET_ITEM(p->bh, b) != Py_None) {
            int rc = lk_evict(self, p, b, PyList_GET_ITEM(ids, i));
            if (rc == 0 && !lk_sizes_kept(p, size)) rc = -1; /* Python ran: recheck */
            if (rc < 0) {
                Py_DECREF(one);
                return -1;
            }
            *evicted += rc;
        }
        PyObject *old = PyList_GET_ITEM(p->ref, b);
        PyList_SET_ITEM(p->ref, b, Py_NewRef(one));
        Py_DECREF(old);
    }
    Py_DECREF(one);
    return 0;
}

/* BlockPool.get_new_blocks(n) on the parts: the n front ids of the queue, each at ref
 * count 1, the cached ones evicted; num_evicted_blocks counts the inline ones. The ids
 * are read from the queue's links in C once (no int object parsed back per block). A new
 * list, or NULL with an exception. Precondition: n <= the queue's free count. */
static PyObject *lk_take(DecodeAllocate *self, LkParts *p, Py_ssize_t n) {
    int32_t small[256];
    int32_t *ids_c = n <= 256 ? small : PyMem_New(int32_t, (size_t)n);
    if (ids_c == NULL) return PyErr_NoMemory();
    Py_ssize_t evicted = 0;
    PyObject *ids = fq_pop_front((FreeQueue *)p->queue, n, PyList_GET_SIZE(p->ref), ids_c);
    if (ids != NULL && (lk_take_loop(self, p, ids, ids_c, n, &evicted) < 0
                        || lk_add(p->prefix, str_num_evicted_blocks, evicted) < 0)) {
        Py_CLEAR(ids);
    }
    if (ids_c != small) PyMem_Free(ids_c);
    return ids;
}

/* The coordinator's cache_blocks(request, end) for a request just given `table` with
 * `start` blocks registered (the hit): the index's loop over [start, end // block_size)
 * and the registered count. 0, or -1 with an exception. */
static int lk_register(DecodeAllocate *self, LkParts *p, PyObject *request, PyObject *rid,
                       PyObject *table, Py_ssize_t start, Py_ssize_t end) {
    Py_ssize_t stop = end / self->block_size;
    if (stop <= start) return 0;
    PyObject *hashes = PyObject_GetAttr(request, str_block_hashes);
    PyObject *evict = PyObject_GetAttr(p->prefix, str_evict_rehashed);
    PyObject *group = PyLong_FromSsize_t(self->group), *lo = PyLong_FromSsize_t(start);
    PyObject *hi = PyLong_FromSsize_t(stop), *skipped = NULL;
    if (hashes && evict && group && lo && hi) {
        PyObject *ig = PyList_GET_ITEM(p->index, self->group);
        PyObject *dg = PyList_GET_ITEM(p->dups, self->group);
        if (PyDict_Check(ig) && PyDict_Check(dg) && PyList_Check(hashes)) {
            skipped = ix_register(table, hashes, start, stop, ig, dg, p->bh, p->bg, group,
                                  evict, NULL); /* index_register, its arguments unpacked */
        } else {
            PyObject *args[10] = {table, hashes, lo, hi, ig, dg, p->bh, p->bg, group, evict};
            skipped = lk_call_kernel(index_register, args, 10); /* raises its TypeError */
        }
    }
    int rc = skipped == NULL || PyDict_SetItem(self->cached, rid, hi) < 0 ? -1 : 0;
    Py_XDECREF(skipped);
    Py_XDECREF(hashes);
    Py_XDECREF(evict);
    Py_XDECREF(group);
    Py_XDECREF(lo);
    Py_XDECREF(hi);
    return rc;
}

/* A first call's parts (ccore_admit.h), read once after the hit's touch: 1 with *p filled
 * when the pool is plain and quiet and holds at least n free blocks, so the take and the
 * registration both run in C on the same parts; else 0 with nothing held (the caller runs
 * get_new_blocks and cache_blocks, nothing changed yet). */
static int lk_admit_parts(DecodeAllocate *self, LkParts *p, Py_ssize_t n) {
    if (!lk_parts(self, p)) return 0;
    if (n <= ((FreeQueue *)p->queue)->num_free) return 1;
    lk_parts_clear(p);
    return 0;
}
