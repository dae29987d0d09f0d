/* admit_groups: a new request's allocation in every group at once (Coordinator.allocate
 * for a request no group holds, without external tokens). Its pure-Python twin and
 * specification: pagedkv.core.kernels_hybrid.admit_groups (same arguments, values, order
 * of calls and errors). Plan entries (kind, manager, tables, num_cached, block_size, span,
 * ignores_lookahead); kinds as ADMIT_* there. Included by ccore.c. */

enum { AD_FULL = 0, AD_WINDOW = 1, AD_CHUNK = 2, AD_METHODS = 3, AD_MAX_GROUPS = 64 };

typedef struct {
    long kind;
    PyObject *manager, *tables, *cached, *blocks; /* borrowed */
    Py_ssize_t bs, span, slots, skipped;
} AdGroup;

static PyObject *str_ad_count, *str_ad_claimed, *str_ad_save, *str_ad_allocate;

PyDoc_STRVAR(admit_groups_doc,
"admit_groups(plan, request_id, hit, total_computed, num_tokens, main_tokens, headroom,\n"
"             num_free, ref_cnt, touch, take, zeroing, new_ids) -> tuple | None\n\n"
"A new request's allocation in every group (pagedkv.core.kernels_hybrid.admit_groups).");

static int ad_size(PyObject *v, Py_ssize_t *out) {
    *out = PyLong_AsSsize_t(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* Read plan entry g and its hit blocks into a. 0, or -1 with an exception. */
static int ad_read(PyObject *entry, PyObject *blocks, Py_ssize_t n_tokens, Py_ssize_t main,
                   Py_ssize_t total, AdGroup *a) {
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 7 || !PyList_Check(blocks)) {
        PyErr_SetString(PyExc_TypeError, "admit_groups: a plan entry is a 7-tuple, hits lists");
        return -1;
    }
    a->kind = PyLong_AsLong(PyTuple_GET_ITEM(entry, 0));
    if (a->kind == -1 && PyErr_Occurred()) return -1;
    a->manager = PyTuple_GET_ITEM(entry, 1);
    a->tables = PyTuple_GET_ITEM(entry, 2);
    a->cached = PyTuple_GET_ITEM(entry, 3);
    a->blocks = blocks;
    if (ad_size(PyTuple_GET_ITEM(entry, 4), &a->bs) < 0 ||
        ad_size(PyTuple_GET_ITEM(entry, 5), &a->span) < 0) {
        return -1;
    }
    int ignores = PyObject_IsTrue(PyTuple_GET_ITEM(entry, 6));
    if (ignores < 0) return -1;
    a->slots = ignores ? main : n_tokens;
    a->skipped = 0;
    if (a->kind != AD_METHODS && (a->bs <= 0 || (a->kind != AD_FULL && a->span <= 0) ||
                                  !PyDict_Check(a->tables) || !PyDict_Check(a->cached))) {
        PyErr_SetString(PyExc_ValueError, "admit_groups: a bad plan entry");
        return -1;
    }
    if (a->kind == AD_WINDOW) {
        Py_ssize_t t = total - a->span + 1;
        a->skipped = (t > 0 ? t : 0) / a->bs;
    } else if (a->kind == AD_CHUNK) {
        a->skipped = total / a->span * a->span / a->bs;
    }
    return 0;
}

/* The group's need in blocks, or -1 with an exception. */
static Py_ssize_t ad_need(AdGroup *a, PyObject *rid, PyObject *total_obj, PyObject *ref) {
    if (a->kind == AD_METHODS) {
        PyObject *slots = PyLong_FromSsize_t(a->slots);
        if (slots == NULL) return -1;
        PyObject *r = PyObject_CallMethodObjArgs(a->manager, str_ad_count, rid, slots,
                                                 a->blocks, total_obj, NULL);
        Py_DECREF(slots);
        if (r == NULL) return -1;
        Py_ssize_t n = PyLong_AsSsize_t(r);
        Py_DECREF(r);
        return n == -1 && PyErr_Occurred() ? -1 : n;
    }
    Py_ssize_t len = PyList_GET_SIZE(a->blocks), size = PyList_GET_SIZE(ref);
    Py_ssize_t n = (a->slots + a->bs - 1) / a->bs - (len > a->skipped ? len : a->skipped);
    if (n < 0) n = 0;
    for (Py_ssize_t i = a->skipped; i < len; i++) {
        Py_ssize_t b = ix_block(PyList_GET_ITEM(a->blocks, i), size);
        if (b < 0) return -1;
        if (b == 0) continue;
        PyObject *c = PyList_GET_ITEM(ref, b);
        if (PyLong_Check(c) && PyLong_AsLong(c) == 0) n++;
    }
    return n;
}

/* Claim (touch) and start the tables: 0, or -1 with an exception. */
static int ad_start(AdGroup *g, Py_ssize_t n, PyObject *rid, PyObject *total_obj,
                    PyObject *touch, int has_hit) {
    for (Py_ssize_t k = 0; has_hit && k < n; k++) {
        AdGroup *a = &g[k];
        PyObject *claimed = a->kind == AD_METHODS
            ? PyObject_CallMethodObjArgs(a->manager, str_ad_claimed, a->blocks, total_obj, NULL)
            : PyList_GetSlice(a->blocks, a->skipped, PyList_GET_SIZE(a->blocks));
        if (claimed == NULL) return -1;
        PyObject *r = PyObject_CallOneArg(touch, claimed);
        Py_DECREF(claimed);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        AdGroup *a = &g[k];
        if (a->kind == AD_METHODS) {
            PyObject *r = PyObject_CallMethodObjArgs(a->manager, str_ad_save, rid, a->blocks,
                                                     total_obj, NULL);
            if (r == NULL) return -1;
            Py_DECREF(r);
            continue;
        }
        Py_ssize_t len = PyList_GET_SIZE(a->blocks);
        Py_ssize_t start = a->skipped < len ? a->skipped : len;
        Py_ssize_t size = a->skipped + (len - start);
        PyObject *table = PyList_New(size);
        if (table == NULL) return -1;
        for (Py_ssize_t i = 0; i < size; i++) {
            PyObject *b = i < a->skipped ? PyLong_FromLong(0)
                                         : Py_NewRef(PyList_GET_ITEM(a->blocks, i));
            if (b == NULL) {
                Py_DECREF(table);
                return -1;
            }
            PyList_SET_ITEM(table, i, b);
        }
        PyObject *count = PyLong_FromSsize_t(size);
        int rc = count == NULL ? -1 : PyDict_SetItem(a->tables, rid, table);
        if (rc == 0) rc = PyDict_SetItem(a->cached, rid, count);
        Py_XDECREF(count);
        Py_DECREF(table);
        if (rc < 0) return -1;
    }
    return 0;
}

/* Group a's new blocks (a new reference), the table grown; NULL with an exception. */
static PyObject *ad_grow(AdGroup *a, PyObject *rid, PyObject *take) {
    if (a->kind == AD_METHODS) {
        PyObject *slots = PyLong_FromSsize_t(a->slots);
        if (slots == NULL) return NULL;
        PyObject *r = PyObject_CallMethodObjArgs(a->manager, str_ad_allocate, rid, slots, NULL);
        Py_DECREF(slots);
        return r;
    }
    PyObject *table = PyDict_GetItemWithError(a->tables, rid);
    if (table == NULL || !PyList_Check(table)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "admit_groups: no table");
        return NULL;
    }
    Py_INCREF(table);
    Py_ssize_t n = (a->slots + a->bs - 1) / a->bs - PyList_GET_SIZE(table);
    PyObject *new_blocks = NULL;
    if (n <= 0) {
        new_blocks = PyList_New(0);
    } else {
        PyObject *count = PyLong_FromSsize_t(n);
        if (count != NULL) new_blocks = PyObject_CallOneArg(take, count);
        Py_XDECREF(count);
        if (new_blocks != NULL) {
            Py_ssize_t end = PyList_GET_SIZE(table);
            if (PyList_SetSlice(table, end, end, new_blocks) < 0) Py_CLEAR(new_blocks);
        }
    }
    Py_DECREF(table);
    return new_blocks;
}

/* Append new's real blocks to ids: 0, or -1 with an exception. */
static int ad_record(PyObject *ids, PyObject *new_blocks) {
    PyObject *seq = PySequence_Fast(new_blocks, "admit_groups: new blocks not a sequence");
    if (seq == NULL) return -1;
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *b = PySequence_Fast_GET_ITEM(seq, i);
        int real = PyObject_IsTrue(b);
        rc = real < 0 ? -1 : real ? PyList_Append(ids, b) : 0;
    }
    Py_DECREF(seq);
    return rc;
}

static PyObject *admit_groups(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "admit_groups takes 13 positional arguments");
        return NULL;
    }
    PyObject *plan = args[0], *rid = args[1], *hit = args[2], *total_obj = args[3];
    PyObject *ref = args[8], *touch = args[9], *take = args[10], *zeroing = args[11];
    PyObject *new_ids = args[12];
    Py_ssize_t total, n_tokens, main, headroom, num_free;
    if (ad_size(total_obj, &total) < 0 || ad_size(args[4], &n_tokens) < 0 ||
        ad_size(args[5], &main) < 0 || ad_size(args[6], &headroom) < 0 ||
        ad_size(args[7], &num_free) < 0) {
        return NULL;
    }
    if (!PyList_Check(plan) || !PyList_Check(ref) || !PyList_Check(zeroing) ||
        !PyList_Check(new_ids) || PyList_GET_SIZE(plan) > AD_MAX_GROUPS ||
        PyList_GET_SIZE(zeroing) < PyList_GET_SIZE(plan) ||
        PyList_GET_SIZE(new_ids) < PyList_GET_SIZE(plan)) {
        PyErr_SetString(PyExc_TypeError, "admit_groups: plan, ref_cnt, zeroing, new_ids lists");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(plan);
    PyObject *hits = hit == Py_None ? NULL : PySequence_Fast(hit, "admit_groups: hit");
    if (hit != Py_None && hits == NULL) return NULL;
    PyObject *empty = PyList_New(0), *out = NULL;
    AdGroup g[AD_MAX_GROUPS];
    Py_ssize_t needed = 0;
    if (empty == NULL) goto done;
    if (hits != NULL && PySequence_Fast_GET_SIZE(hits) < n) {
        PyErr_SetString(PyExc_IndexError, "admit_groups: a hit per group");
        goto done;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *blocks = hits == NULL ? empty : PySequence_Fast_GET_ITEM(hits, k);
        if (ad_read(PyList_GET_ITEM(plan, k), blocks, n_tokens, main, total, &g[k]) < 0)
            goto done;
        Py_ssize_t need = ad_need(&g[k], rid, total_obj, ref);
        if (need < 0 && PyErr_Occurred()) goto done;
        needed += need;
    }
    if (needed + headroom > num_free) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    if (ad_start(g, n, rid, total_obj, touch, hits != NULL) < 0) goto done;
    out = PyTuple_New(n);
    for (Py_ssize_t k = 0; out != NULL && k < n; k++) {
        PyObject *new_blocks = ad_grow(&g[k], rid, take);
        if (new_blocks == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, k, new_blocks);
        int zero = PyObject_IsTrue(PyList_GET_ITEM(zeroing, k));
        int has_new = zero > 0 ? PyObject_IsTrue(new_blocks) : 0;
        if (zero < 0 || has_new < 0 ||
            (has_new && ad_record(PyList_GET_ITEM(new_ids, k), new_blocks) < 0)) {
            Py_CLEAR(out);
        }
    }
done:
    Py_XDECREF(hits);
    Py_XDECREF(empty);
    return out;
}

static int ccore_hybrid_admit_init(void) {
    str_ad_count = PyUnicode_InternFromString("get_num_blocks_to_allocate");
    str_ad_claimed = PyUnicode_InternFromString("claimed_hit_blocks");
    str_ad_save = PyUnicode_InternFromString("save_new_computed_blocks");
    str_ad_allocate = PyUnicode_InternFromString("allocate_new_blocks");
    return str_ad_count && str_ad_claimed && str_ad_save && str_ad_allocate ? 0 : -1;
}
