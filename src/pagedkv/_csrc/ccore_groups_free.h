/* GroupsAllocate's free (installed as the manager's free when fast_paths.py gives it the
 * facade's free and the coordinator's free plan): facade_frees.free followed by
 * Coordinator.free's plan (kernels_hybrid_step.free_groups, hs_free_group in
 * ccore_hybrid_step.h) with the pool's free through PoolOps (ccore_pool_ops.h), for
 * a request's id (an exact str) or the pagedkv Request the manager holds under it. An id
 * the manager does not hold is a no-op, as in Python. Any other call (another request
 * type, a request object other than the one held) goes to the Python function, which
 * validates it and raises the documented errors. Included by ccore_groups.h. */

/* ccore_pool_ops.h (included later): its type, and its free_blocks on any PoolOps. */
static PyTypeObject PoolOpsType;
static PyObject *po_free_queue_any(PyObject *ops);
static PyObject *po_free_blocks_any(PyObject *ops, PyObject *q, PyObject *ordered);

/* One group's free (kernels_hybrid_step.free_groups' entry: tables, counts, the dicts
 * and sets it forgets the request in), the pool's free_blocks called in C when the pool
 * calls are a PoolOps (on queue q when the free's checks passed once for the request).
 * 0, or -1 with an exception. */
static int gf_free_group(GroupsAllocate *self, PyObject *const *e, PyObject *rid,
                         PyObject *q) {
    PyObject *tables = e[0], *counts = e[1], *forget = e[2], *drop = e[3];
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(forget); i++) {
        if (PyDict_DelItem(PyTuple_GET_ITEM(forget, i), rid) < 0) {
            if (!PyErr_ExceptionMatches(PyExc_KeyError)) return -1;
            PyErr_Clear();
        }
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(drop); i++) {
        if (PySet_Discard(PyTuple_GET_ITEM(drop, i), rid) < 0) return -1;
    }
    PyObject *blocks = PyDict_GetItemWithError(tables, rid);
    if (blocks == NULL && PyErr_Occurred()) return -1;
    Py_XINCREF(blocks);
    int rc = blocks != NULL && PyDict_DelItem(tables, rid) < 0 ? -1 : 0;
    if (rc == 0 && PyDict_DelItem(counts, rid) < 0) {
        if (PyErr_ExceptionMatches(PyExc_KeyError)) PyErr_Clear();
        else rc = -1;
    }
    if (rc == 0 && blocks != NULL && !PyList_CheckExact(blocks)) {
        Py_DECREF(blocks); /* not a list: the kernel's general steps */
        PyObject *one = PyTuple_Pack(4, tables, counts, forget, drop);
        rc = one == NULL ? -1 : hs_free_group(one, rid, self->ops_free);
        Py_XDECREF(one);
        return rc;
    }
    if (rc == 0 && blocks != NULL && PyList_GET_SIZE(blocks) > 0) {
        PyObject *r = NULL;
        if (PyList_Reverse(blocks) == 0) {
            r = Py_TYPE(self->ops) == &PoolOpsType
                    ? po_free_blocks_any(self->ops, q, blocks)
                    : PyObject_CallOneArg(self->ops_free, blocks);
        }
        if (r == NULL) rc = -1;
        Py_XDECREF(r);
    }
    Py_XDECREF(blocks);
    return rc;
}

/* The free: 0 done, 1 not covered (nothing changed), -1 with an exception. */
static int gf_free(GroupsAllocate *self, PyObject *request) {
    PyObject *rid;
    if (PyUnicode_CheckExact(request)) {
        rid = Py_NewRef(request);
    } else if (Py_TYPE(request) == (PyTypeObject *)self->request_type) {
        rid = PyObject_GetAttr(request, str_request_id);
        if (rid == NULL) PyErr_Clear();
        if (rid == NULL || !PyUnicode_CheckExact(rid)) {
            Py_XDECREF(rid);
            return 1;
        }
    } else {
        return 1;
    }
    PyObject *live = da_get(self->live, rid);
    int rc = 1;
    if (live == NULL) {
        rc = PyErr_Occurred() ? 1 : 0; /* not held: nothing to do */
        PyErr_Clear();
    } else if (live == request || rid == request) {
        rc = PyDict_DelItem(self->live, rid) < 0 ? -1 : 0;
        PyObject *q = rc == 0 && Py_TYPE(self->ops) == &PoolOpsType
                          ? po_free_queue_any(self->ops) : NULL;
        if (PyErr_Occurred()) rc = -1;
        for (Py_ssize_t g = 0; rc == 0 && g < self->num_free_groups; g++) {
            rc = gf_free_group(self, self->free_entries + 4 * g, rid, q);
        }
        Py_XDECREF(q);
    }
    Py_DECREF(rid);
    return rc;
}

static PyObject *ga_free(GroupsAllocate *self, PyObject *request) {
    if (self->free_function == NULL) {
        PyErr_SetString(PyExc_TypeError, "GroupsAllocate: built without free_function");
        return NULL;
    }
    int rc = gf_free(self, request);
    if (rc < 0) return NULL;
    if (rc == 0) Py_RETURN_NONE;
    PyObject *mgr = da_manager_of(self->manager_ref);
    if (mgr == NULL) return NULL;
    PyObject *out = PyObject_CallFunctionObjArgs(self->free_function, mgr, request, NULL);
    Py_DECREF(mgr);
    return out;
}

/* free_function and free_plan (both None, or a callable and a list): the free's parts,
 * the pool's free_blocks read once from the pool calls. 0, or -1 with an exception. */
static int gf_init(GroupsAllocate *self, PyObject *free_function, PyObject *plan) {
    if (free_function == Py_None || plan == Py_None) return 0;
    if (!PyCallable_Check(free_function) || !PyList_CheckExact(plan)) {
        PyErr_SetString(PyExc_TypeError, "GroupsAllocate: free_function a callable and "
                                         "free_plan a list");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(plan);
    PyObject **e = PyMem_Calloc((size_t)(4 * (n ? n : 1)), sizeof(PyObject *));
    if (e == NULL) return (PyErr_NoMemory(), -1);
    for (Py_ssize_t g = 0; g < n; g++) { /* borrowed from the plan, which self holds */
        PyObject *entry = PyList_GET_ITEM(plan, g);
        if (!PyTuple_Check(entry)
            || !PyArg_ParseTuple(entry, "O!O!O!O!:GroupsAllocate free plan entry",
                                 &PyDict_Type, &e[4 * g], &PyDict_Type, &e[4 * g + 1],
                                 &PyTuple_Type, &e[4 * g + 2], &PyTuple_Type, &e[4 * g + 3])) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "GroupsAllocate: a free "
                                                   "plan entry is a tuple");
            PyMem_Free(e);
            return -1;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(e[4 * g + 2]); i++) {
            if (!PyDict_Check(PyTuple_GET_ITEM(e[4 * g + 2], i))) goto bad;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(e[4 * g + 3]); i++) {
            if (!PySet_Check(PyTuple_GET_ITEM(e[4 * g + 3], i))) goto bad;
        }
    }
    self->ops_free = PyObject_GetAttr(self->ops, str_free_blocks);
    if (self->ops_free == NULL) {
        PyMem_Free(e);
        return -1;
    }
    self->free_function = Py_NewRef(free_function);
    self->free_plan = Py_NewRef(plan);
    self->free_entries = e;
    self->num_free_groups = n;
    return 0;
bad:
    PyMem_Free(e);
    PyErr_SetString(PyExc_TypeError, "GroupsAllocate: a free plan entry forgets in dicts "
                                     "and drops from sets");
    return -1;
}

static PyObject *ga_takes_frees(GroupsAllocate *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(self->free_function != NULL);
}
