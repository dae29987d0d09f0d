/* GroupsAllocate's free (installed as the manager's free when fast_paths.py gives it the
 * facade's free and the coordinator's free plan): facade_frees.free followed by
 * Coordinator.free's plan (kernels_hybrid_step.free_groups, hs_free_group in
 * ccore_hybrid_step.h) with the pool's free through PoolOps (ccore_pool_ops.h), for
 * a request's id (an exact str) or the pagedkv Request the manager holds under it. An id
 * the manager does not hold is a no-op, as in Python. Any other call (another request
 * type, a request object other than the one held) goes to the Python function, which
 * validates it and raises the documented errors. Included by ccore_groups.h. */

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
        PyObject *plan = self->free_plan;
        for (Py_ssize_t g = 0; rc == 0 && g < PyList_GET_SIZE(plan); g++) {
            PyObject *entry = Py_NewRef(PyList_GET_ITEM(plan, g));
            rc = hs_free_group(entry, rid, self->ops_free);
            Py_DECREF(entry);
        }
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
    self->ops_free = PyObject_GetAttr(self->ops, str_free_blocks);
    if (self->ops_free == NULL) return -1;
    self->free_function = Py_NewRef(free_function);
    self->free_plan = Py_NewRef(plan);
    return 0;
}

static PyObject *ga_takes_frees(GroupsAllocate *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(self->free_function != NULL);
}
