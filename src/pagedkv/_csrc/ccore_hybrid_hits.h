/* The longest hit per attention kind beside full attention: window_hit (sliding window),
 * chunk_hit (chunked local), state_hit (Mamba align). Block i's hash is
 * block_hashes[(i + 1) * stride - 1]; the index maps a hash to its block. Pure-Python
 * twins and specifications: pagedkv.core.kernels_hybrid. Included by ccore.c. */

/* The index's block for block i (borrowed, NULL when absent; -1 in *err on error). */
static PyObject *hh_get(PyObject *index, PyObject *hashes, Py_ssize_t stride, Py_ssize_t i,
                        int *err) {
    Py_ssize_t j = (i + 1) * stride - 1;
    if (j < 0 || j >= PyList_GET_SIZE(hashes)) {
        PyErr_SetString(PyExc_IndexError, "block hash index out of range");
        *err = -1;
        return NULL;
    }
    PyObject *b = PyDict_GetItemWithError(index, PyList_GET_ITEM(hashes, j));
    if (b == NULL && PyErr_Occurred()) *err = -1;
    return b;
}

/* [0] * nulls followed by the borrowed blocks run[0..n) in order (or reversed). */
static PyObject *hh_table(Py_ssize_t nulls, PyObject **run, Py_ssize_t n, int reversed) {
    PyObject *out = PyList_New(nulls + n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < nulls; i++) PyList_SET_ITEM(out, i, PyLong_FromLong(0));
    for (Py_ssize_t i = 0; i < n; i++)
        PyList_SET_ITEM(out, nulls + i, Py_NewRef(run[reversed ? n - 1 - i : i]));
    for (Py_ssize_t i = 0; i < nulls; i++) {
        if (PyList_GET_ITEM(out, i) == NULL) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static int hh_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, const char *name,
                   Py_ssize_t *ints) {
    if (nargs != want || !PyDict_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_Format(PyExc_TypeError, "%s(index: dict, block_hashes: list, ...) takes %zd "
                     "arguments", name, want);
        return -1;
    }
    for (Py_ssize_t k = 2; k < want; k++) {
        ints[k - 2] = PyLong_AsSsize_t(args[k]);
        if (ints[k - 2] == -1 && PyErr_Occurred()) return -1;
    }
    if (ints[0] <= 0) {
        PyErr_Format(PyExc_ValueError, "%s: stride must be positive", name);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(window_hit_doc,
"window_hit(index, block_hashes, stride, num_blocks, need) -> list\n\n"
"Sliding window's longest hit (pagedkv.core.kernels_hybrid.window_hit).");

static PyObject *window_hit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t v[3];
    (void)self;
    if (hh_args(args, nargs, 5, "window_hit", v) < 0) return NULL;
    Py_ssize_t stride = v[0], num_blocks = v[1], need = v[2];
    if (need <= 0) return hh_table(num_blocks > 0 ? num_blocks : 0, NULL, 0, 0);
    PyObject **run = PyMem_Malloc(sizeof(PyObject *) * (size_t)need);
    if (run == NULL) return PyErr_NoMemory();
    Py_ssize_t n = 0;
    PyObject *out = NULL;
    int err = 0;
    for (Py_ssize_t i = num_blocks - 1; i >= 0; i--) {
        PyObject *b = hh_get(args[0], args[1], stride, i, &err);
        if (err) goto done;
        if (b == NULL) {
            n = 0;
            continue;
        }
        run[n++] = b;
        if (n == need) {
            out = hh_table(i, run, n, 1);
            goto done;
        }
    }
    out = hh_table(0, run, n, 1); /* the run that reached block 0 (possibly empty) */
done:
    PyMem_Free(run);
    return out;
}

PyDoc_STRVAR(chunk_hit_doc,
"chunk_hit(index, block_hashes, stride, first, num_blocks) -> list\n\n"
"Chunked local's longest hit (pagedkv.core.kernels_hybrid.chunk_hit).");

static PyObject *chunk_hit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t v[3];
    (void)self;
    if (hh_args(args, nargs, 5, "chunk_hit", v) < 0) return NULL;
    Py_ssize_t stride = v[0], first = v[1] > 0 ? v[1] : 0, num_blocks = v[2];
    Py_ssize_t cap = num_blocks > first ? num_blocks - first : 0;
    PyObject **run = PyMem_Malloc(sizeof(PyObject *) * (size_t)(cap ? cap : 1));
    if (run == NULL) return PyErr_NoMemory();
    Py_ssize_t n = 0;
    PyObject *out = NULL;
    int err = 0;
    for (Py_ssize_t i = first; i < num_blocks; i++) {
        PyObject *b = hh_get(args[0], args[1], stride, i, &err);
        if (err) goto done;
        if (b == NULL) break;
        run[n++] = b;
    }
    out = hh_table(first, run, n, 0);
done:
    PyMem_Free(run);
    return out;
}

PyDoc_STRVAR(state_hit_doc,
"state_hit(index, block_hashes, stride, num_blocks, block_size, align) -> list\n\n"
"Mamba align's longest hit (pagedkv.core.kernels_hybrid.state_hit).");

static PyObject *state_hit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t v[4];
    (void)self;
    if (hh_args(args, nargs, 6, "state_hit", v) < 0) return NULL;
    Py_ssize_t stride = v[0], num_blocks = v[1], bs = v[2], align = v[3];
    if (align <= 0) {
        PyErr_SetString(PyExc_ValueError, "state_hit: align must be positive");
        return NULL;
    }
    int err = 0;
    for (Py_ssize_t i = num_blocks - 1; i >= 0; i--) {
        PyObject *b = hh_get(args[0], args[1], stride, i, &err);
        if (err) return NULL;
        if (b != NULL && (i + 1) * bs % align == 0) return hh_table(i, &b, 1, 0);
    }
    return PyList_New(0);
}
