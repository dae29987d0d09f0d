/* HybridHit: a coordinator's whole lookup in one call, every group's hit by its kind's
 * rule and, for several groups, the fixed point over them. HybridHit(plan) is the compiled
 * twin of pagedkv.core.kernels_hybrid_hits.hybrid_hit(plan) (the specification, with the
 * plan's layout): calling it with (block_hashes, max_length) returns
 * (per-group block lists, hit tokens). Included by ccore.c after ccore_hybrid_hits.h. */

enum { HF_PREFIX = 0, HF_WINDOW = 1, HF_CHUNK = 2, HF_STATE = 3 };

typedef struct {
    Py_ssize_t group, kind, stride, bs, a, b;
    PyObject *index; /* the group's dict: hash -> block (a strong reference) */
} HfEntry;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Py_ssize_t num_groups, lcm, nfull, nall;
    int unitary;
    HfEntry *entries; /* nfull full-attention entries, then the others */
} HybridHit;

/* Python's a // b for b > 0. */
static Py_ssize_t hf_floordiv(Py_ssize_t a, Py_ssize_t b) {
    Py_ssize_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

/* The index's block for block i as a new reference; NULL when absent (*err stays 0) or
 * on error (*err -1). A key that is not exact bytes is held while the dict compares it
 * (its __eq__ may run Python code) and the list's size is checked on every call. */
static PyObject *hf_get(PyObject *index, PyObject *hashes, Py_ssize_t stride, Py_ssize_t i,
                        int *err) {
    Py_ssize_t j = (i + 1) * stride - 1;
    if (j < 0 || j >= PyList_GET_SIZE(hashes)) {
        PyErr_SetString(PyExc_IndexError, "block hash index out of range");
        *err = -1;
        return NULL;
    }
    PyObject *key = PyList_GET_ITEM(hashes, j), *b;
    if (PyBytes_CheckExact(key)) {
        b = PyDict_GetItemWithError(index, key);
    } else {
        Py_INCREF(key);
        b = PyDict_GetItemWithError(index, key);
        Py_XINCREF(b);
        Py_DECREF(key);
        if (b == NULL && PyErr_Occurred()) *err = -1;
        return b;
    }
    if (b == NULL && PyErr_Occurred()) *err = -1;
    return Py_XNewRef(b);
}

/* [0] * nulls followed by run[0..n) (new references, stolen), reversed when asked. */
static PyObject *hf_table(Py_ssize_t nulls, PyObject **run, Py_ssize_t n, int reversed) {
    PyObject *out = PyList_New(nulls + n);
    if (out == NULL) {
        for (Py_ssize_t i = 0; i < n; i++) Py_DECREF(run[i]);
        return NULL;
    }
    PyObject *zero = PyLong_FromLong(0); /* a cached small int: never NULL */
    for (Py_ssize_t i = 0; i < nulls; i++) PyList_SET_ITEM(out, i, Py_NewRef(zero));
    Py_DECREF(zero);
    for (Py_ssize_t i = 0; i < n; i++)
        PyList_SET_ITEM(out, nulls + i, run[reversed ? n - 1 - i : i]);
    return out;
}

static void hf_drop(PyObject **run, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) Py_DECREF(run[i]);
}

/* One group's hit within `length` tokens (kernels_hybrid_hits.group_hit): a new list or
 * NULL with an exception. `run` has room for `cap` blocks, every block of the hashes. */
static PyObject *hf_group(const HfEntry *e, PyObject *hashes, Py_ssize_t length,
                          PyObject **run, Py_ssize_t cap) {
    Py_ssize_t n = hf_floordiv(length, e->bs), total = PyList_GET_SIZE(hashes) / e->stride;
    if (n > total) n = total;
    if (n > cap) n = cap; /* the hashes grew under a key's __eq__: hf_get raises first */
    Py_ssize_t count = 0, first = 0;
    int err = 0, reversed = 0;
    if (e->kind == HF_WINDOW && e->a <= 0) return hf_table(n > 0 ? n : 0, NULL, 0, 0);
    if (e->kind == HF_PREFIX || e->kind == HF_CHUNK) {
        if (e->kind == HF_CHUNK) {
            first = hf_floordiv(length, e->a) * e->b;
            if (first < 0) first = 0;
        }
        for (Py_ssize_t i = first; i < n; i++) {
            PyObject *b = hf_get(e->index, hashes, e->stride, i, &err);
            if (b == NULL) break;
            run[count++] = b;
        }
    } else if (e->kind == HF_WINDOW) {
        reversed = 1;
        for (Py_ssize_t i = n - 1; i >= 0; i--) {
            PyObject *b = hf_get(e->index, hashes, e->stride, i, &err);
            if (b == NULL) {
                if (err) break;
                hf_drop(run, count);
                count = 0;
                continue;
            }
            run[count++] = b;
            if (count == e->a) {
                first = i;
                break;
            }
        }
    } else {
        for (Py_ssize_t i = n - 1; i >= 0; i--) {
            PyObject *b = hf_get(e->index, hashes, e->stride, i, &err);
            if (b == NULL) {
                if (err) break;
                continue;
            }
            if ((i + 1) * e->bs % e->a == 0) {
                run[count++] = b;
                first = i;
                break;
            }
            Py_DECREF(b);
        }
    }
    if (err) {
        hf_drop(run, count);
        return NULL;
    }
    return hf_table(first, run, count, reversed);
}

/* blocks[start:] deleted, start as Python reads a slice bound. 0 or -1. */
static int hf_cut(PyObject *blocks, Py_ssize_t start) {
    Py_ssize_t size = PyList_GET_SIZE(blocks);
    if (start < 0) start = start + size < 0 ? 0 : start + size;
    return start < size ? PyList_SetSlice(blocks, start, size, NULL) : 0;
}

/* Group k's hit within *length into hits[group]; *length lowered (rounded down to the
 * lcm) when the hit is shorter: 1 lowered, 0 not, -1 with an exception. */
static int hf_ask(const HybridHit *self, Py_ssize_t k, PyObject *hashes, Py_ssize_t *length,
                  PyObject **hits, PyObject **run, Py_ssize_t cap) {
    const HfEntry *e = &self->entries[k];
    PyObject *hit = hf_group(e, hashes, *length, run, cap);
    if (hit == NULL) return -1;
    Py_XSETREF(hits[e->group], hit);
    Py_ssize_t got = PyList_GET_SIZE(hit) * e->bs;
    if (got >= *length) return 0;
    *length = hf_floordiv(got, self->lcm) * self->lcm;
    return 1;
}

/* The fixed point (HybridCoordinator.find_longest_cache_hit without the drop) into
 * hits[num_groups] (new references, NULL: none yet): full-attention groups once, the
 * others in passes until one changes nothing. The hit length, or -1 with *err set. */
static Py_ssize_t hf_fixed_point(const HybridHit *self, PyObject *hashes, Py_ssize_t max_length,
                                 PyObject **hits, PyObject **run, Py_ssize_t cap, int *err) {
    Py_ssize_t length = hf_floordiv(max_length, self->lcm) * self->lcm;
    for (Py_ssize_t k = 0; k < self->nfull; k++) {
        if (hf_ask(self, k, hashes, &length, hits, run, cap) < 0) goto fail;
    }
    int changed = 1;
    while (changed && length != 0) {
        changed = 0;
        for (Py_ssize_t k = self->nfull; k < self->nall; k++) {
            int rc = hf_ask(self, k, hashes, &length, hits, run, cap);
            if (rc < 0) goto fail;
            changed |= rc;
        }
    }
    if (length == 0) {
        for (Py_ssize_t g = 0; g < self->num_groups; g++) Py_CLEAR(hits[g]);
        return 0;
    }
    for (Py_ssize_t k = 0; k < self->nfull; k++) {
        const HfEntry *e = &self->entries[k];
        if (hf_cut(hits[e->group], hf_floordiv(length, e->bs)) < 0) goto fail;
    }
    return length;
fail:
    *err = -1;
    return -1;
}

/* (tuple of the hits, NULL ones as new empty lists; length): stealing the hits. */
static PyObject *hf_result(PyObject **hits, Py_ssize_t num_groups, Py_ssize_t length) {
    PyObject *tables = PyTuple_New(num_groups);
    for (Py_ssize_t g = 0; g < num_groups; g++) {
        PyObject *h = hits[g] != NULL ? hits[g] : PyList_New(0);
        hits[g] = NULL;
        if (tables == NULL || h == NULL) {
            Py_XDECREF(h);
            continue;
        }
        PyTuple_SET_ITEM(tables, g, h);
    }
    if (tables == NULL) return NULL;
    for (Py_ssize_t g = 0; g < num_groups; g++) {
        if (PyTuple_GET_ITEM(tables, g) == NULL) {
            Py_DECREF(tables);
            return NULL;
        }
    }
    PyObject *n = PyLong_FromSsize_t(length);
    if (n == NULL) {
        Py_DECREF(tables);
        return NULL;
    }
    PyObject *out = PyTuple_Pack(2, tables, n);
    Py_DECREF(tables);
    Py_DECREF(n);
    return out;
}

/* The bound: an int; one too large for a Py_ssize_t stands for "every hashed block"
 * (every group's hit is capped by the hashes, and a plan has at least one group, so the
 * result is the same; a chunked group's nulls before such a bound's chunk are too many
 * for a list either way). */
static int hf_bound(PyObject *v, Py_ssize_t *out) {
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "max_length must be an int, got %.80s",
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    int overflow = 0;
    *out = PyLong_AsLongAndOverflow(v, &overflow);
    if (overflow > 0) *out = PY_SSIZE_T_MAX / 4;
    else if (overflow < 0) {
        PyErr_SetString(PyExc_OverflowError, "max_length is too negative");
        return -1;
    }
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *hf_call(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    HybridHit *self = (HybridHit *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), max_length;
    if (nargs != 2 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "HybridHit(block_hashes, max_length): 2 arguments");
        return NULL;
    }
    if (hf_bound(args[1], &max_length) < 0) return NULL;
    PyObject *hashes = PyList_CheckExact(args[0]) ? Py_NewRef(args[0]) : PySequence_List(args[0]);
    if (hashes == NULL) return NULL;
    Py_ssize_t cap = PyList_GET_SIZE(hashes) + 1;
    PyObject **run = PyMem_Malloc(sizeof(PyObject *) * (size_t)(cap + self->num_groups));
    if (run == NULL) {
        Py_DECREF(hashes);
        return PyErr_NoMemory();
    }
    PyObject **hits = run + cap, *out = NULL;
    for (Py_ssize_t g = 0; g < self->num_groups; g++) hits[g] = NULL;
    int err = 0;
    Py_ssize_t length;
    if (self->unitary) {
        hits[0] = hf_group(&self->entries[0], hashes, max_length, run, cap);
        length = hits[0] != NULL ? PyList_GET_SIZE(hits[0]) * self->entries[0].bs : 0;
        err = hits[0] == NULL ? -1 : 0;
    } else {
        length = hf_fixed_point(self, hashes, max_length, hits, run, cap, &err);
    }
    if (!err) out = hf_result(hits, self->num_groups, length);
    for (Py_ssize_t g = 0; g < self->num_groups; g++) Py_XDECREF(hits[g]);
    PyMem_Free(run);
    Py_DECREF(hashes);
    return out;
}

/* One plan entry (group, kind, index, stride, block_size, a, b) into *e. 0 or -1. */
static int hf_parse_entry(PyObject *item, Py_ssize_t num_groups, HfEntry *e) {
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 7
        || !PyDict_Check(PyTuple_GET_ITEM(item, 2))) {
        PyErr_SetString(PyExc_TypeError, "HybridHit: an entry is (group, kind, index: dict, "
                        "stride, block_size, a, b)");
        return -1;
    }
    Py_ssize_t v[7];
    for (int i = 0; i < 7; i++) {
        if (i == 2) continue;
        v[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, i));
        if (v[i] == -1 && PyErr_Occurred()) return -1;
    }
    e->group = v[0], e->kind = v[1], e->stride = v[3], e->bs = v[4], e->a = v[5], e->b = v[6];
    if (e->group < 0 || e->group >= num_groups || e->kind < HF_PREFIX || e->kind > HF_STATE
        || e->stride <= 0 || e->bs <= 0
        || ((e->kind == HF_CHUNK || e->kind == HF_STATE) && e->a <= 0)) {
        PyErr_SetString(PyExc_ValueError, "HybridHit: an entry's group, kind, stride, "
                        "block size or parameter is out of range");
        return -1;
    }
    e->index = Py_NewRef(PyTuple_GET_ITEM(item, 2));
    return 0;
}

static void hf_dealloc(PyObject *op) {
    HybridHit *self = (HybridHit *)op;
    if (self->entries != NULL) {
        for (Py_ssize_t k = 0; k < self->nall; k++) Py_XDECREF(self->entries[k].index);
        PyMem_Free(self->entries);
    }
    Py_TYPE(op)->tp_free(op);
}

/* HybridHit(plan): plan = (num_groups, lcm, unitary, full, others) as
 * kernels_hybrid_hits documents it; TypeError / ValueError for another shape. */
static PyObject *hf_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *plan, *full, *others;
    Py_ssize_t num_groups, lcm;
    int unitary;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "HybridHit(plan) takes no keywords");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!:HybridHit", &PyTuple_Type, &plan)) return NULL;
    if (!PyArg_ParseTuple(plan, "nnpO!O!:HybridHit plan", &num_groups, &lcm, &unitary,
                          &PyTuple_Type, &full, &PyTuple_Type, &others)) return NULL;
    Py_ssize_t nfull = PyTuple_GET_SIZE(full), nall = nfull + PyTuple_GET_SIZE(others);
    if (num_groups <= 0 || num_groups > 4096 || lcm <= 0 || nall == 0
        || (unitary && (nall != 1 || num_groups != 1))) {
        PyErr_SetString(PyExc_ValueError, "HybridHit: num_groups, lcm, unitary or the number "
                        "of entries out of range");
        return NULL;
    }
    HybridHit *self = (HybridHit *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = hf_call;
    self->num_groups = num_groups, self->lcm = lcm, self->unitary = unitary;
    self->nfull = nfull;
    self->entries = PyMem_Calloc((size_t)(nall ? nall : 1), sizeof(HfEntry));
    if (self->entries == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < nall; k++) {
        PyObject *item = k < nfull ? PyTuple_GET_ITEM(full, k) : PyTuple_GET_ITEM(others, k - nfull);
        if (hf_parse_entry(item, num_groups, &self->entries[k]) < 0) {
            Py_DECREF(self);
            return NULL;
        }
        self->nall = k + 1;
    }
    return (PyObject *)self;
}

PyDoc_STRVAR(hybrid_hit_doc,
"HybridHit(plan)(block_hashes, max_length) -> (tuple of block lists, hit tokens)\n\n"
"A coordinator's whole lookup (pagedkv.core.kernels_hybrid_hits.hybrid_hit).");

static PyTypeObject HybridHitType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pagedkv.core._ccore.HybridHit",
    .tp_basicsize = sizeof(HybridHit),
    .tp_dealloc = hf_dealloc,
    .tp_vectorcall_offset = offsetof(HybridHit, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = hybrid_hit_doc,
    .tp_new = hf_new,
};

static int ccore_fixed_point_add(PyObject *m) {
    return ccore_add_type(m, &HybridHitType, "HybridHit");
}
