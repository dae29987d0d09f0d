/* record_stored: one stored event of a registered run and the blocks it announces (the
 * event recorder's registration record). Its pure-Python twin and specification:
 * pagedkv.core.kernels_hybrid.record_stored. Included by ccore.c. */

PyDoc_STRVAR(record_stored_doc,
"record_stored(events, announced, cls, blocks, hashes, start, end, skipped, token_ids,\n"
"              block_size, lora_id, medium, lora_name, extra, group, kind, window)\n\n"
"One stored record of a registered run (pagedkv.core.kernels_hybrid.record_stored).");

/* The listed positions of [start, end) without the `skipped` ones (a sequence of
 * ints), as a new list of ints; NULL with an exception. */
static PyObject *rs_positions(Py_ssize_t start, Py_ssize_t end, PyObject *skipped) {
    PyObject *seq = PySequence_Fast(skipped, "record_stored: skipped is not a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
    Py_ssize_t *left_out = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(m ? m : 1));
    PyObject *out = left_out == NULL ? PyErr_NoMemory() : PyList_New(0);
    for (Py_ssize_t j = 0; out != NULL && j < m; j++) {
        left_out[j] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, j));
        if (left_out[j] == -1 && PyErr_Occurred()) Py_CLEAR(out);
    }
    for (Py_ssize_t i = start; out != NULL && i < end; i++) {
        int listed = 1;
        for (Py_ssize_t j = 0; j < m && listed; j++) listed = left_out[j] != i;
        if (!listed) continue;
        PyObject *v = PyLong_FromSsize_t(i);
        if (v == NULL || PyList_Append(out, v) < 0) Py_CLEAR(out);
        Py_XDECREF(v);
    }
    PyMem_Free(left_out);
    Py_DECREF(seq);
    return out;
}

/* hashes[i - 1], or None at 0 (a new reference); NULL with an exception. */
static PyObject *rs_parent(PyObject *hashes, Py_ssize_t i) {
    if (i == 0) return Py_NewRef(Py_None);
    return PySequence_GetItem(hashes, i - 1);
}

/* The record's 12 fields into a new instance of the tuple subclass cls. */
static PyObject *rs_record(PyTypeObject *cls, PyObject **fields) {
    PyObject *t = cls->tp_alloc(cls, 12);
    if (t == NULL) return NULL;
    for (Py_ssize_t i = 0; i < 12; i++) PyTuple_SET_ITEM(t, i, Py_NewRef(fields[i]));
    return t;
}

static int rs_announce(PyObject *announced, PyObject *blocks, PyObject *hashes,
                       PyObject *record, PyObject *positions, Py_ssize_t start) {
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(positions); k++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyList_GET_ITEM(positions, k));
        PyObject *b = PySequence_GetItem(blocks, i);
        PyObject *parent = b == NULL ? NULL : rs_parent(hashes, i);
        PyObject *entry = parent == NULL ? NULL
            : Py_BuildValue("(OnnO)", record, k, i - start, parent);
        int rc = entry == NULL ? -1 : PyDict_SetItem(announced, b, entry);
        Py_XDECREF(b);
        Py_XDECREF(parent);
        Py_XDECREF(entry);
        if (rc < 0) return -1;
    }
    return 0;
}

static PyObject *record_stored(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 17) {
        PyErr_SetString(PyExc_TypeError, "record_stored takes 17 positional arguments");
        return NULL;
    }
    PyObject *events = args[0], *announced = args[1], *cls = args[2], *blocks = args[3];
    PyObject *hashes = args[4], *skipped = args[7], *extra = args[13];
    Py_ssize_t start = PyLong_AsSsize_t(args[5]), end = PyLong_AsSsize_t(args[6]);
    Py_ssize_t bs = PyLong_AsSsize_t(args[9]);
    if (PyErr_Occurred()) return NULL;
    if (!PyList_Check(events) || !PyDict_Check(announced) || !PyType_Check(cls) ||
        !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record_stored: events list, announced dict, "
                                         "a tuple class");
        return NULL;
    }
    PyObject *positions = rs_positions(start, end, skipped);
    PyObject *listed = NULL, *parent = NULL, *tokens = NULL, *extras = NULL, *record = NULL;
    if (positions == NULL) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(positions);
    listed = PyList_New(n);
    if (listed == NULL) goto done;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *h = PySequence_GetItem(hashes, PyLong_AsSsize_t(PyList_GET_ITEM(positions, k)));
        if (h == NULL) goto done;
        PyList_SET_ITEM(listed, k, h);
    }
    parent = rs_parent(hashes, start);
    tokens = parent == NULL ? NULL : PySequence_GetSlice(args[8], start * bs, end * bs);
    if (tokens == NULL) goto done;
    if (extra == Py_None) {
        extras = n ? PyList_New(n) : Py_NewRef(Py_None);
        for (Py_ssize_t k = 0; n && extras != NULL && k < n; k++)
            PyList_SET_ITEM(extras, k, Py_NewRef(Py_None));
    } else {
        int truth = PyObject_IsTrue(extra);
        extras = truth < 0 ? NULL : Py_NewRef(truth ? extra : Py_None);
    }
    if (extras == NULL) goto done;
    PyObject *fields[12] = {listed, parent, tokens, args[9], args[10], args[11], args[12],
                            extras, args[14], args[15], args[16], Py_None};
    record = rs_record((PyTypeObject *)cls, fields);
    if (record == NULL || PyList_Append(events, record) < 0 ||
        rs_announce(announced, blocks, hashes, record, positions, start) < 0) {
        Py_CLEAR(record);
    }
done:
    Py_DECREF(positions);
    Py_XDECREF(listed);
    Py_XDECREF(parent);
    Py_XDECREF(tokens);
    Py_XDECREF(extras);
    if (record == NULL) return NULL;
    Py_DECREF(record);
    Py_RETURN_NONE;
}
