/* A Mamba align group's running step: mamba_release (its release of the states behind
 * the live one) and mamba_grow (its growth to the live position); and free_groups, a
 * request's free in every group at once (Coordinator.free). Pure-Python twins and
 * specifications: pagedkv.core.kernels_hybrid_step (which MambaAlignManager's
 * remove_skipped_blocks and allocate_new_blocks call). GroupsAllocate (ccore_groups.h)
 * runs the same C functions for a Mamba group without a Python call. Included by
 * ccore.c before ccore_groups.h. */

/* Python's a // b for b > 0. */
static Py_ssize_t hs_floordiv(Py_ssize_t a, Py_ssize_t b) {
    Py_ssize_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

/* fn(arg), or obj.name(arg) when name is not NULL: a new reference, NULL on error. */
static PyObject *hs_call1(PyObject *fn, PyObject *name, PyObject *arg) {
    return name == NULL ? PyObject_CallOneArg(fn, arg) : PyObject_CallMethodOneArg(fn, name, arg);
}

/* d.get(key) as an int: 1 present (*out), 0 absent, -1 an error (not an int too). */
static int hs_get_int(PyObject *d, PyObject *key, Py_ssize_t *out) {
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (v == NULL) return PyErr_Occurred() ? -1 : 0;
    *out = PyLong_AsSsize_t(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 1;
}

/* d[key] = n; 0, or -1 with an exception set. */
static int hs_set_int(PyObject *d, PyObject *key, Py_ssize_t n) {
    PyObject *v = PyLong_FromSsize_t(n);
    if (v == NULL) return -1;
    int rc = PyDict_SetItem(d, key, v);
    Py_DECREF(v);
    return rc;
}

/* Real blocks of table[first:last], deepest first, nulled in the table; freed through
 * free_fn in one call when there are any. 0, or -1 with an exception set. */
static int hs_release_run(PyObject *table, Py_ssize_t first, Py_ssize_t last,
                          PyObject *free_fn, PyObject *free_name) {
    PyObject *freed = PyList_New(0);
    if (freed == NULL) return -1;
    for (Py_ssize_t i = last - 1; i >= first; i--) {
        if (i >= PyList_GET_SIZE(table)) continue;
        PyObject *b = PyList_GET_ITEM(table, i);
        int real = PyObject_IsTrue(b);
        if (real < 0 || (real && PyList_Append(freed, b) < 0)) goto fail;
        if (real && PyList_SetItem(table, i, PyLong_FromLong(0)) < 0) goto fail;
    }
    if (PyList_GET_SIZE(freed) > 0) {
        PyObject *r = hs_call1(free_fn, free_name, freed);
        if (r == NULL) goto fail;
        Py_DECREF(r);
    }
    Py_DECREF(freed);
    return 0;
fail:
    Py_DECREF(freed);
    return -1;
}

/* kernels_hybrid_step.mamba_release on an exact list `table` (NULL: the request holds
 * no table, a no-op). 0, or -1 with an exception set. */
static int hs_release(PyObject *table, PyObject *released, PyObject *last_state,
                      PyObject *rid, Py_ssize_t computed, Py_ssize_t bs, PyObject *free_fn,
                      PyObject *free_name) {
    if (table == NULL) return 0;
    Py_ssize_t last = computed > 1 ? hs_floordiv(computed - 1, bs) : 0, first = 0;
    if (last > PyList_GET_SIZE(table)) last = PyList_GET_SIZE(table);
    if (last && hs_get_int(released, rid, &first) < 0) return -1;
    Py_INCREF(table);
    int rc = 0;
    if (first < last) {
        rc = hs_release_run(table, first, last, free_fn, free_name);
        if (rc == 0) rc = hs_set_int(released, rid, last);
    }
    Py_ssize_t k = 0;
    int has = rc == 0 ? hs_get_int(last_state, rid, &k) : 0;
    if (has < 0) rc = -1;
    if (has > 0 && k < -hs_floordiv(-computed, bs) - 1) {
        Py_ssize_t len = PyList_GET_SIZE(table), j = k < 0 ? k + len : k;
        if (j < 0 || j >= len) {
            PyErr_SetString(PyExc_IndexError, "list index out of range");
            rc = -1;
        } else {
            PyObject *b = Py_NewRef(PyList_GET_ITEM(table, j));
            int real = PyObject_IsTrue(b);
            if (real < 0) rc = -1;
            if (real > 0) {
                PyObject *one = PyList_New(1);
                PyObject *r = one == NULL ? NULL : (PyList_SET_ITEM(one, 0, Py_NewRef(b)),
                                                    hs_call1(free_fn, free_name, one));
                Py_XDECREF(one);
                if (r == NULL || j >= PyList_GET_SIZE(table)
                    || PyList_SetItem(table, j, PyLong_FromLong(0)) < 0) rc = -1;
                Py_XDECREF(r);
            }
            Py_DECREF(b);
        }
    }
    Py_DECREF(table);
    return rc;
}

/* kernels_hybrid_step.mamba_grow on an exact list `table`: a new reference to the padding
 * and the new block, NULL with an exception set. */
static PyObject *hs_grow(PyObject *table, PyObject *last_state, PyObject *allocated,
                         PyObject *rid, Py_ssize_t num_tokens, Py_ssize_t bs, PyObject *take_fn,
                         PyObject *take_name) {
    Py_ssize_t required = -hs_floordiv(-num_tokens, bs), prev = PyList_GET_SIZE(table);
    if (required <= prev) return PySet_Add(allocated, rid) < 0 ? NULL : PyList_New(0);
    if (prev && hs_set_int(last_state, rid, prev - 1) < 0) return NULL;
    Py_INCREF(table);
    PyObject *out = NULL, *new = NULL, *n_obj = NULL;
    for (Py_ssize_t i = prev; i < required - 1; i++) {
        PyObject *zero = PyLong_FromLong(0);
        int rc = zero == NULL ? -1 : PyList_Append(table, zero);
        Py_XDECREF(zero);
        if (rc < 0) goto done;
    }
    Py_ssize_t n = required - PyList_GET_SIZE(table);
    if ((n_obj = PyLong_FromSsize_t(n > 0 ? n : 0)) == NULL) goto done;
    if ((new = hs_call1(take_fn, take_name, n_obj)) == NULL) goto done;
    if (prev > PyList_GET_SIZE(table)) prev = PyList_GET_SIZE(table);
    out = PyList_GetSlice(table, prev, PyList_GET_SIZE(table));
    Py_ssize_t len = PyList_GET_SIZE(table);
    if (out == NULL || PyList_SetSlice(table, len, len, new) < 0
        || PyList_SetSlice(out, PyList_GET_SIZE(out), PyList_GET_SIZE(out), new) < 0
        || PySet_Add(allocated, rid) < 0) {
        Py_CLEAR(out);
    }
done:
    Py_XDECREF(n_obj);
    Py_XDECREF(new);
    Py_DECREF(table);
    return out;
}

/* The exported kernels' common checks: argument count, a list (or None where allowed)
 * table, dicts, a set, an int and a positive block size. 0, or -1 with a TypeError. */
static int hs_args(PyObject *const *args, Py_ssize_t nargs, const char *name, int table_none,
                   int third_set, Py_ssize_t *count, Py_ssize_t *bs) {
    if (nargs != 7 || !(PyList_Check(args[0]) || (table_none && args[0] == Py_None))
        || !PyDict_Check(args[1]) || !(third_set ? PySet_Check(args[2]) : PyDict_Check(args[2]))
        || !PyLong_Check(args[4]) || !PyLong_Check(args[5])) {
        PyErr_Format(PyExc_TypeError, "%s: (table: list%s, dict, %s, request_id, int, int, "
                     "callable) expected", name, table_none ? " | None" : "",
                     third_set ? "set" : "dict");
        return -1;
    }
    *count = PyLong_AsSsize_t(args[4]);
    if (*count == -1 && PyErr_Occurred()) return -1;
    *bs = PyLong_AsSsize_t(args[5]);
    if (*bs == -1 && PyErr_Occurred()) return -1;
    if (*bs <= 0) {
        PyErr_Format(PyExc_ValueError, "%s: block_size must be positive", name);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(mamba_release_doc,
"mamba_release(table, released, last_state, request_id, num_computed_tokens, block_size,\n"
"              free_blocks) -> None\n\n"
"A Mamba align group's release (pagedkv.core.kernels_hybrid_step.mamba_release).");

static PyObject *mamba_release(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t computed, bs;
    (void)self;
    if (hs_args(args, nargs, "mamba_release", 1, 0, &computed, &bs) < 0) return NULL;
    PyObject *table = args[0] == Py_None ? NULL : args[0];
    if (hs_release(table, args[1], args[2], args[3], computed, bs, args[6], NULL) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(mamba_grow_doc,
"mamba_grow(table, last_state, allocated, request_id, num_tokens, block_size,\n"
"           get_new_blocks) -> list\n\n"
"A Mamba align group's growth (pagedkv.core.kernels_hybrid_step.mamba_grow).");

static PyObject *mamba_grow(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t num_tokens, bs;
    (void)self;
    if (hs_args(args, nargs, "mamba_grow", 0, 1, &num_tokens, &bs) < 0) return NULL;
    return hs_grow(args[0], args[1], args[2], args[3], num_tokens, bs, args[6], NULL);
}

/* One group's entry of free_groups: forget the request in `forget` (dicts) and `drop`
 * (sets), pop its table and count, free the table's blocks last first. 0, or -1. */
static int hs_free_group(PyObject *entry, PyObject *rid, PyObject *free_fn) {
    PyObject *tables, *counts, *forget, *drop;
    if (!PyTuple_Check(entry)
        || !PyArg_ParseTuple(entry, "O!O!O!O!:free_groups entry", &PyDict_Type, &tables,
                             &PyDict_Type, &counts, &PyTuple_Type, &forget, &PyTuple_Type,
                             &drop)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "free_groups: an entry is "
                                               "(tables, counts, dicts, sets)");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(forget); i++) {
        PyObject *d = PyTuple_GET_ITEM(forget, i);
        if (!PyDict_Check(d)) {
            PyErr_SetString(PyExc_TypeError, "free_groups: forget holds dicts");
            return -1;
        }
        if (PyDict_DelItem(d, rid) < 0) {
            if (!PyErr_ExceptionMatches(PyExc_KeyError)) return -1;
            PyErr_Clear();
        }
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(drop); i++) {
        PyObject *st = PyTuple_GET_ITEM(drop, i);
        if (!PySet_Check(st)) {
            PyErr_SetString(PyExc_TypeError, "free_groups: drop holds sets");
            return -1;
        }
        if (PySet_Discard(st, rid) < 0) return -1;
    }
    PyObject *blocks = PyDict_GetItemWithError(tables, rid);
    if (blocks == NULL) {
        if (PyErr_Occurred()) return -1;
    } else {
        Py_INCREF(blocks);
        if (PyDict_DelItem(tables, rid) < 0) {
            Py_DECREF(blocks);
            return -1;
        }
    }
    if (PyDict_DelItem(counts, rid) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError)) {
            Py_XDECREF(blocks);
            return -1;
        }
        PyErr_Clear();
    }
    if (blocks == NULL) return 0;
    int real = PyObject_IsTrue(blocks), rc = real < 0 ? -1 : 0;
    if (real > 0) {
        PyObject *r = PyList_Check(blocks) ? (PyList_Reverse(blocks) < 0 ? NULL : Py_None)
                                           : PyObject_CallMethod(blocks, "reverse", NULL);
        if (r != NULL && r != Py_None) Py_DECREF(r);
        if (r == NULL) rc = -1;
        if (rc == 0) {
            r = PyObject_CallOneArg(free_fn, blocks);
            if (r == NULL) rc = -1;
            Py_XDECREF(r);
        }
    }
    Py_DECREF(blocks);
    return rc;
}

PyDoc_STRVAR(free_groups_doc,
"free_groups(plan, request_id, free_blocks) -> None\n\n"
"A request's free in every group (pagedkv.core.kernels_hybrid_step.free_groups).");

static PyObject *free_groups(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "free_groups(plan: list, request_id, free_blocks)");
        return NULL;
    }
    PyObject *plan = args[0];
    for (Py_ssize_t g = 0; g < PyList_GET_SIZE(plan); g++) {
        PyObject *entry = Py_NewRef(PyList_GET_ITEM(plan, g));
        int rc = hs_free_group(entry, args[1], args[2]);
        Py_DECREF(entry);
        if (rc < 0) return NULL;
    }
    Py_RETURN_NONE;
}
