/* PoolOps: BlockPool.get_new_blocks, touch and free_blocks (pagedkv/core/pool.py) as C
 * methods of one object holding the pool, so the compiled allocation (GroupsAllocate,
 * ccore_groups.h; its first call's admission, ccore_hybrid_first.h; free_groups) grows,
 * claims and frees without a Python frame per call. Each method is its Python method's
 * body read line by line: the same attributes read at call time (the free queue, the
 * per-block lists, the kernels the pool holds, the recorder's removed, the index's
 * eviction), the same kernel calls, the same count moved. A pool with listeners or an
 * eviction policy, and a take past the free count (the Python method's AssertionError),
 * go to the pool's own method. fast_paths.py builds one only for a pool whose class keeps
 * BlockPool's three methods. Included by ccore.c after ccore_index.h. */

typedef struct {
    PyObject_HEAD
    PyObject *pool;
    /* read once at construction (the pool's and its index's lists and dicts stay the same
     * objects for the pool's life, pool.py): the index, its recorder, ref_cnt,
     * block_hash, block_group, index, duplicates, secondary */
    PyObject *prefix, *recorder, *ref, *bh, *bg, *index, *dups, *secondary;
    /* the pool class's get_new_blocks, touch and free_blocks functions: a call finding
     * the pool's attribute bound to another (an instance's own) calls that instead */
    PyObject *fn_take, *fn_touch, *fn_free;
} PoolOps;

#define PO_OBJS(X) X(pool) X(prefix) X(recorder) X(ref) X(bh) X(bg) X(index) X(dups) \
    X(secondary) X(fn_take) X(fn_touch) X(fn_free)

static PyObject *str_po_listeners, *str_po_policy, *str_po_pool_take, *str_po_pool_touch,
    *str_po_pool_free, *str_po_ref_cnt, *str_po_block_hash, *str_po_block_group,
    *str_po_index, *str_po_prefix, *str_po_duplicates, *str_po_secondary, *str_po_recorder,
    *str_po_removed, *str_po_evict_block, *str_po_num_evicted, *str_po_free_queue,
    *str_po_num_free, *str_po_popleft_n, *str_po_get_new_blocks, *str_po_touch,
    *str_po_free_blocks;

/* 1 when attribute `name` of obj is truthy (is not None, with `is_none`), 0 when not, -1
 * on an error. */
static int po_flag(PyObject *obj, PyObject *name, int is_none) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    int on = is_none ? v != Py_None : PyObject_IsTrue(v);
    Py_DECREF(v);
    return on;
}

/* The pool's own method `name`(arg): a new reference, NULL with an exception. */
static PyObject *po_python(PoolOps *self, PyObject *name, PyObject *arg) {
    return PyObject_CallMethodOneArg(self->pool, name, arg);
}

/* Whether pool.<name> is still the class's function `fn` bound to the pool (1), or
 * something else (0: *other, a new reference, is what a Python caller would call); -1
 * on an error. */
static int po_bound(PoolOps *self, PyObject *name, PyObject *fn, PyObject **other) {
    PyObject *m = PyObject_GetAttr(self->pool, name);
    if (m == NULL) return -1;
    if (PyMethod_Check(m) && PyMethod_GET_FUNCTION(m) == fn
        && PyMethod_GET_SELF(m) == self->pool) {
        Py_DECREF(m);
        return 1;
    }
    *other = m;
    return 0;
}

/* other(arg), releasing other: what a Python caller of the rebound method gets. */
static PyObject *po_other(PyObject *other, PyObject *arg) {
    PyObject *r = PyObject_CallOneArg(other, arg);
    Py_DECREF(other);
    return r;
}

/* pool.free_queue when it is the compiled queue (a new reference), else NULL (with an
 * exception only when the read failed). */
static FreeQueue *po_queue(PoolOps *self) {
    PyObject *q = PyObject_GetAttr(self->pool, str_po_free_queue);
    if (q != NULL && Py_TYPE(q) != &FreeQueueType) Py_CLEAR(q);
    return (FreeQueue *)q;
}

/* The pool kernel `name` the pool holds now when it is the compiled `fn` (1), else 0;
 * -1 on an error. */
static int po_kernel_is(PoolOps *self, PyObject *name, PyCFunction fn) {
    PyObject *k = PyObject_GetAttr(self->pool, name);
    if (k == NULL) return -1;
    int same = PyCFunction_Check(k) && PyCFunction_GetFunction(k) == fn;
    Py_DECREF(k);
    return same;
}

/* get_new_blocks' take kernel over ids that were cached: pool_take with the recorder's
 * removed and the index's evict_block as they are now, the inline evictions added to
 * the index's num_evicted_blocks. 0, or -1 with an exception. */
static int po_take_cached(PoolOps *self, PyObject *ids) {
    PyObject *removed = PyObject_GetAttr(self->recorder, str_po_removed);
    PyObject *evict = PyObject_GetAttr(self->prefix, str_po_evict_block);
    PyObject *args = removed && evict
                         ? PyTuple_Pack(9, ids, self->ref, self->bh, self->bg, self->index,
                                        self->dups, self->secondary, removed, evict)
                         : NULL;
    PyObject *inline_n = args == NULL ? NULL : pool_take(NULL, args);
    Py_XDECREF(args);
    Py_XDECREF(removed);
    Py_XDECREF(evict);
    if (inline_n == NULL) return -1;
    PyObject *count = PyObject_GetAttr(self->prefix, str_po_num_evicted);
    PyObject *sum = count == NULL ? NULL : PyNumber_InPlaceAdd(count, inline_n);
    int rc = sum == NULL ? -1 : PyObject_SetAttr(self->prefix, str_po_num_evicted, sum);
    Py_XDECREF(count);
    Py_XDECREF(sum);
    Py_DECREF(inline_n);
    return rc;
}

/* BlockPool.get_new_blocks(n): the n front ids of the compiled queue, each at ref count
 * 1; when one of them was cached, pool_take's loop over them all (its evictions, the
 * recorder told). A pool with listeners, another queue or kernel, or n out of [0,
 * num_free] goes to the Python method (its checks and errors). */
static PyObject *po_get_new_blocks(PoolOps *self, PyObject *n_obj) {
    PyObject *other = NULL;
    int bound = po_bound(self, str_po_get_new_blocks, self->fn_take, &other);
    if (bound <= 0) return bound < 0 ? NULL : po_other(other, n_obj);
    Py_ssize_t n = PyLong_CheckExact(n_obj) ? PyLong_AsSsize_t(n_obj) : -1;
    if (n == -1) PyErr_Clear();
    FreeQueue *q = n < 0 ? NULL : po_queue(self);
    int plain = q != NULL && n <= q->num_free;
    if (plain) plain = po_flag(self->pool, str_po_listeners, 0) == 0;
    if (plain) plain = po_kernel_is(self, str_po_pool_take, (PyCFunction)pool_take) == 1;
    if (!plain) {
        Py_XDECREF(q);
        if (PyErr_Occurred()) return NULL;
        return po_python(self, str_po_get_new_blocks, n_obj);
    }
    Py_ssize_t limit = q->head, size = PyList_GET_SIZE(self->ref);
    if (size < limit) limit = size;
    if (PyList_GET_SIZE(self->bh) < limit) limit = PyList_GET_SIZE(self->bh);
    if (PyList_GET_SIZE(self->bg) < limit) limit = PyList_GET_SIZE(self->bg);
    int32_t small[64];
    int32_t *ids_c = n <= 64 ? small : PyMem_New(int32_t, (size_t)n);
    PyObject *ids = ids_c == NULL ? PyErr_NoMemory() : fq_pop_front(q, n, limit, ids_c);
    Py_DECREF(q);
    int cached = 0;
    for (Py_ssize_t i = 0; ids != NULL && i < n && !cached; i++) {
        cached = PyList_GET_ITEM(self->bh, ids_c[i]) != Py_None;
    }
    if (ids != NULL && cached && po_take_cached(self, ids) < 0) Py_CLEAR(ids);
    PyObject *one = ids != NULL && !cached ? PyLong_FromLong(1) : NULL;
    if (ids != NULL && !cached && one == NULL) Py_CLEAR(ids);
    if (ids != NULL && !cached) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *old = PyList_GET_ITEM(self->ref, ids_c[i]);
            PyList_SET_ITEM(self->ref, ids_c[i], Py_NewRef(one));
            Py_DECREF(old);
        }
        Py_DECREF(one);
    }
    if (ids_c != small) PyMem_Free(ids_c);
    return ids;
}

/* kernel(queue, ref_cnt, ids) for the pool's compiled kernel `fn` on the compiled queue;
 * any other kernel or queue through the Python method `method`. */
static PyObject *po_refs(PoolOps *self, PyObject *kernel_name, PyCFunction fn,
                         PyObject *method, PyObject *ids) {
    FreeQueue *q = po_queue(self);
    int same = q == NULL ? -1 : po_kernel_is(self, kernel_name, fn);
    if (same != 1) {
        Py_XDECREF(q);
        if (PyErr_Occurred()) return NULL;
        return po_python(self, method, ids);
    }
    PyObject *args = PyTuple_Pack(3, q, self->ref, ids);
    Py_DECREF(q);
    if (args == NULL) return NULL;
    PyObject *r = fn(NULL, args);
    Py_DECREF(args);
    return r;
}

/* BlockPool.touch(ids): without a policy or listeners, the pool's touch kernel. */
static PyObject *po_touch(PoolOps *self, PyObject *ids) {
    PyObject *other = NULL;
    int bound = po_bound(self, str_po_touch, self->fn_touch, &other);
    if (bound <= 0) return bound < 0 ? NULL : po_other(other, ids);
    int told = po_flag(self->pool, str_po_policy, 1);
    if (told == 0) told = po_flag(self->pool, str_po_listeners, 0);
    if (told < 0) return NULL;
    if (told) return po_python(self, str_po_touch, ids);
    return po_refs(self, str_po_pool_touch, (PyCFunction)pool_touch, str_po_touch, ids);
}

/* The compiled queue (a new reference) when free_blocks is the class's on the pool and
 * the pool's free kernel the compiled one on it, so po_free_ids may run; else NULL (with
 * an exception only on an error). Nothing a free does changes what this checks. */
static FreeQueue *po_free_queue(PoolOps *self) {
    PyObject *other = NULL;
    int bound = po_bound(self, str_po_free_blocks, self->fn_free, &other);
    Py_XDECREF(other);
    FreeQueue *q = bound == 1 ? po_queue(self) : NULL;
    int same = q == NULL ? -1 : po_kernel_is(self, str_po_pool_free, (PyCFunction)pool_free);
    if (same != 1) Py_CLEAR(q);
    return q;
}

/* The compiled free kernel's checks and steps on q (po_free_queue's) without packing its
 * arguments. 0, or -1 with an exception. */
static int po_free_ids(PoolOps *self, FreeQueue *q, PyObject *ordered) {
    int32_t *ids = NULL;
    Py_ssize_t n = -1;
    if (PyList_GET_SIZE(self->ref) < q->head || PyList_GET_SIZE(self->bh) < q->head) {
        PyErr_SetString(PyExc_ValueError, "pool_free: lists shorter than the pool");
    } else {
        n = fq_ids(q, ordered, &ids);
    }
    int rc = n < 0 ? -1 : pool_free_ids(q, self->ref, self->bh, ids, n);
    PyMem_Free(ids);
    return rc;
}

/* BlockPool.free_blocks(ordered): the pool's free kernel (the compiled one on the
 * compiled queue: its checks and steps without packing its arguments). */
static PyObject *po_free_blocks(PoolOps *self, PyObject *ordered) {
    FreeQueue *q = po_free_queue(self);
    if (q == NULL) {
        if (PyErr_Occurred()) return NULL;
        return po_python(self, str_po_free_blocks, ordered); /* as it is bound now */
    }
    int32_t *ids = NULL;
    Py_ssize_t n = -1;
    if (PyList_GET_SIZE(self->ref) < q->head || PyList_GET_SIZE(self->bh) < q->head) {
        PyErr_SetString(PyExc_ValueError, "pool_free: lists shorter than the pool");
    } else {
        n = fq_ids(q, ordered, &ids);
    }
    int rc = n < 0 ? -1 : pool_free_ids(q, self->ref, self->bh, ids, n);
    PyMem_Free(ids);
    Py_DECREF(q);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* For GroupsAllocate's free, on a PoolOps held as a plain object: po_free_queue, and a
 * free on its queue (q NULL: po_free_blocks). */
static PyObject *po_free_queue_any(PyObject *ops) {
    return (PyObject *)po_free_queue((PoolOps *)ops);
}

static PyObject *po_free_blocks_any(PyObject *ops, PyObject *q, PyObject *ordered) {
    if (q == NULL) return po_free_blocks((PoolOps *)ops, ordered);
    if (po_free_ids((PoolOps *)ops, (FreeQueue *)q, ordered) < 0) return NULL;
    Py_RETURN_NONE;
}

/* PoolOps(pool): the parts read once (a TypeError when one is not a list or a dict). */
static int po_init(PoolOps *self, PyObject *args, PyObject *kwds) {
    PyObject *pool;
    static char *kwlist[] = {"pool", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:PoolOps", kwlist, &pool)) return -1;
#define PO_CLEAR(f) Py_CLEAR(self->f);
    PO_OBJS(PO_CLEAR)
    self->pool = Py_NewRef(pool);
    if ((self->prefix = PyObject_GetAttr(pool, str_po_prefix)) == NULL
        || (self->recorder = PyObject_GetAttr(pool, str_po_recorder)) == NULL
        || (self->ref = PyObject_GetAttr(pool, str_po_ref_cnt)) == NULL
        || (self->bh = PyObject_GetAttr(pool, str_po_block_hash)) == NULL
        || (self->bg = PyObject_GetAttr(pool, str_po_block_group)) == NULL
        || (self->index = PyObject_GetAttr(pool, str_po_index)) == NULL
        || (self->dups = PyObject_GetAttr(self->prefix, str_po_duplicates)) == NULL
        || (self->secondary = PyObject_GetAttr(self->prefix, str_po_secondary)) == NULL
        || (self->fn_take = PyObject_GetAttr((PyObject *)Py_TYPE(pool), str_po_get_new_blocks))
               == NULL
        || (self->fn_touch = PyObject_GetAttr((PyObject *)Py_TYPE(pool), str_po_touch)) == NULL
        || (self->fn_free = PyObject_GetAttr((PyObject *)Py_TYPE(pool), str_po_free_blocks))
               == NULL) {
        return -1;
    }
    if (!PyList_CheckExact(self->ref) || !PyList_CheckExact(self->bh)
        || !PyList_CheckExact(self->bg) || !PyList_CheckExact(self->index)
        || !PyList_CheckExact(self->dups) || !PyDict_CheckExact(self->secondary)) {
        PyErr_SetString(PyExc_TypeError, "PoolOps: the pool's per-block lists, index lists "
                                         "and secondary dict");
        return -1;
    }
    return 0;
}

static int po_traverse(PoolOps *self, visitproc visit, void *arg) {
#define PO_VISIT(f) Py_VISIT(self->f);
    PO_OBJS(PO_VISIT)
    return 0;
}

static int po_clear(PoolOps *self) {
    PO_OBJS(PO_CLEAR)
    return 0;
}

static void po_dealloc(PoolOps *self) {
    PyObject_GC_UnTrack(self);
    po_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef po_methods[] = {
    {"get_new_blocks", (PyCFunction)po_get_new_blocks, METH_O,
     "BlockPool.get_new_blocks(n) on the pool."},
    {"touch", (PyCFunction)po_touch, METH_O, "BlockPool.touch(ids) on the pool."},
    {"free_blocks", (PyCFunction)po_free_blocks, METH_O,
     "BlockPool.free_blocks(ordered) on the pool."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef po_members[] = {
    {"pool", T_OBJECT, offsetof(PoolOps, pool), READONLY, "The BlockPool."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject PoolOpsType;

static int ccore_pool_ops_add(PyObject *m) {
    const char *names[] = {"listeners", "policy", "_pool_take", "_pool_touch", "_pool_free",
                           "ref_cnt", "block_hash", "block_group", "index", "prefix",
                           "duplicates", "secondary", "recorder", "removed", "evict_block",
                           "num_evicted_blocks", "free_queue", "num_free", "popleft_n",
                           "get_new_blocks", "touch", "free_blocks"};
    PyObject **slots[] = {&str_po_listeners, &str_po_policy, &str_po_pool_take,
                          &str_po_pool_touch, &str_po_pool_free, &str_po_ref_cnt,
                          &str_po_block_hash, &str_po_block_group, &str_po_index,
                          &str_po_prefix, &str_po_duplicates, &str_po_secondary,
                          &str_po_recorder, &str_po_removed, &str_po_evict_block,
                          &str_po_num_evicted, &str_po_free_queue, &str_po_num_free,
                          &str_po_popleft_n, &str_po_get_new_blocks, &str_po_touch,
                          &str_po_free_blocks};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if ((*slots[i] = PyUnicode_InternFromString(names[i])) == NULL) return -1;
    }
    PoolOpsType.tp_name = "pagedkv.core._ccore.PoolOps";
    PoolOpsType.tp_doc = "BlockPool's get_new_blocks, touch and free_blocks in C (same "
                         "steps, same calls).";
    PoolOpsType.tp_basicsize = sizeof(PoolOps);
    PoolOpsType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
    PoolOpsType.tp_new = PyType_GenericNew;
    PoolOpsType.tp_init = (initproc)po_init;
    PoolOpsType.tp_dealloc = (destructor)po_dealloc;
    PoolOpsType.tp_traverse = (traverseproc)po_traverse;
    PoolOpsType.tp_clear = (inquiry)po_clear;
    PoolOpsType.tp_methods = po_methods;
    PoolOpsType.tp_members = po_members;
    return ccore_add_type(m, &PoolOpsType, "PoolOps");
}
