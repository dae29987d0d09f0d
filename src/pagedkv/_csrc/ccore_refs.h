/* The pool's ref-count loops over its Python lists, on a FreeQueue (ccore_pool.h):
 * pool_free and pool_touch (BlockPool.free_blocks and BlockPool.touch, same order, same
 * checks), and pool_free_table, the compiled free's call of pool_free without packing
 * its arguments (ccore_lookup.h). Included once, by ccore.c, after ccore_pool.h. */

/* ref[b] as a C integer; -1 (with TypeError) when it is not an int. */
static long ref_of(PyObject *ref, Py_ssize_t b) {
    PyObject *r = PyList_GET_ITEM(ref, b);
    if (!PyLong_CheckExact(r)) {
        PyErr_SetString(PyExc_TypeError, "ref_cnt holds a non-int");
        return -1;
    }
    return PyLong_AsLong(r);
}

static int set_ref(PyObject *ref, Py_ssize_t b, long value) {
    PyObject *v = PyLong_FromLong(value);
    if (v == NULL) return -1;
    PyObject *old = PyList_GET_ITEM(ref, b);
    PyList_SET_ITEM(ref, b, v);
    Py_DECREF(old);
    return 0;
}

/* A freed request's blocks are spread over the pool's lists: fetch the slots of block
 * ids[i] (checked ids, i past the end ignored) ahead of their use (a hint only). */
static void pool_prefetch(PyObject *ref, PyObject *bh, const int32_t *ids, Py_ssize_t i,
                          Py_ssize_t n) {
#if defined(__GNUC__) || defined(__clang__)
    if (i < n) {
        __builtin_prefetch(&PyList_GET_ITEM(ref, ids[i]), 1);
        __builtin_prefetch(&PyList_GET_ITEM(bh, ids[i]));
    }
#else
    (void)ref, (void)bh, (void)ids, (void)i, (void)n;
#endif
}

PyDoc_STRVAR(pool_free_doc,
"pool_free(queue, ref_cnt, block_hash, ordered) -> None\n\n"
"BlockPool.free_blocks on a FreeQueue: ref count -1 for each id of `ordered` (0 = the\n"
"null block, skipped); those reaching 0 are queued, unhashed at the front, hashed at the\n"
"back, each in `ordered` order. Every id is checked before anything changes.");

/* pool_free's steps on checked ids (each in [0, head), ref and bh at least head long). */
static int pool_free_ids(FreeQueue *q, PyObject *ref, PyObject *bh, const int32_t *ids,
                         Py_ssize_t n) {
    int32_t small[512];
    int32_t *front = 2 * n <= 512 ? small : PyMem_Malloc(sizeof(int32_t) * (size_t)(2 * n));
    if (front == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int32_t *back = front + n;
    Py_ssize_t num_front = 0, num_back = 0;
    int rc = 0;
    for (Py_ssize_t i = 0; i < n; i++) {  /* check first: a bad ref count changes nothing */
        pool_prefetch(ref, bh, ids, i + 8, n);
        if (ids[i] && ref_of(ref, ids[i]) == -1 && PyErr_Occurred()) {
            rc = -1;
            break;
        }
    }
    for (Py_ssize_t i = 0; i < n && rc == 0; i++) {
        int32_t b = ids[i];
        if (!b) continue;
        long r = ref_of(ref, b) - 1;
        if (set_ref(ref, b, r) < 0) rc = -1;
        else if (r == 0) {
            if (PyList_GET_ITEM(bh, b) == Py_None) front[num_front++] = b;
            else back[num_back++] = b;
        }
    }
    if (rc == 0 && num_front) {
        fq_splice(q, front, num_front, (int32_t)q->head, q->next[q->head]);
    }
    if (rc == 0 && num_back) {
        fq_splice(q, back, num_back, q->prev[q->tail], (int32_t)q->tail);
    }
    if (front != small) PyMem_Free(front);
    return rc;
}

static PyObject *pool_free(PyObject *self, PyObject *args) {
    FreeQueue *q;
    PyObject *ref, *bh, *ordered;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!O!O:pool_free", &FreeQueueType, &q, &PyList_Type, &ref,
                          &PyList_Type, &bh, &ordered)) return NULL;
    if (PyList_GET_SIZE(ref) < q->head || PyList_GET_SIZE(bh) < q->head) {
        PyErr_SetString(PyExc_ValueError, "pool_free: lists shorter than the pool");
        return NULL;
    }
    int32_t *ids;
    Py_ssize_t n = fq_ids(q, ordered, &ids);
    if (n < 0) return NULL;
    int rc = pool_free_ids(q, ref, bh, ids, n);
    PyMem_Free(ids);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* pool_free(queue, ref_cnt, block_hash, reversed(table)) on a plain pool's parts k
 * (queue, ref_cnt, block_hash: ccore_lookup.h's lk_plain_pool) without building its arguments: the table's ids read last first into a
 * C array, each checked, then pool_free's steps. 0, or -1 with an exception (an id out of
 * range or a bad ref count changes nothing). */
static int pool_free_table(PyObject **k, PyObject *table) {
    FreeQueue *q = (FreeQueue *)k[0];
    Py_ssize_t n = PyList_GET_SIZE(table);
    if (PyList_GET_SIZE(k[1]) < q->head || PyList_GET_SIZE(k[2]) < q->head) {
        PyErr_SetString(PyExc_ValueError, "pool_free: lists shorter than the pool");
        return -1;
    }
    int32_t small[256];
    int32_t *ids = n <= 256 ? small : PyMem_New(int32_t, (size_t)n);
    if (ids == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int rc = 0;
    for (Py_ssize_t i = 0; i < n && rc == 0; i++) {
        Py_ssize_t b = fq_id(q, PyList_GET_ITEM(table, n - 1 - i));
        if (b < 0) rc = -1;
        else ids[i] = (int32_t)b;
    }
    if (rc == 0) rc = pool_free_ids(q, k[1], k[2], ids, n);
    if (ids != small) PyMem_Free(ids);
    return rc;
}

PyDoc_STRVAR(pool_touch_doc,
"pool_touch(queue, ref_cnt, ids) -> None\n\n"
"BlockPool.touch on a FreeQueue: ref count +1 for each id of `ids` (0 skipped); a block\n"
"at 0 leaves the queue first. Every id is checked before anything changes.");

static PyObject *pool_touch(PyObject *self, PyObject *args) {
    FreeQueue *q;
    PyObject *ref, *seq;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!O:pool_touch", &FreeQueueType, &q, &PyList_Type, &ref,
                          &seq)) return NULL;
    if (PyList_GET_SIZE(ref) < q->head) {
        PyErr_SetString(PyExc_ValueError, "pool_touch: ref_cnt shorter than the pool");
        return NULL;
    }
    int32_t *ids;
    Py_ssize_t n = fq_ids(q, seq, &ids);
    if (n < 0) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (ids[i] && ref_of(ref, ids[i]) == -1 && PyErr_Occurred()) goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t b = ids[i];
        if (!b) continue;
        long r = ref_of(ref, b);
        if (r == 0) fq_unlink(q, b);
        if (set_ref(ref, b, r + 1) < 0) goto fail;
    }
    PyMem_Free(ids);
    Py_RETURN_NONE;
fail:
    PyMem_Free(ids);
    return NULL;
}

static PyMethodDef pool_methods[] = {
    {"pool_free", pool_free, METH_VARARGS, pool_free_doc},
    {"pool_touch", pool_touch, METH_VARARGS, pool_touch_doc},
    {NULL, NULL, 0, NULL},
};

static int ccore_refs_add(PyObject *m) { return PyModule_AddFunctions(m, pool_methods); }
