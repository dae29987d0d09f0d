/* GroupsAllocate (ccore_groups.h), its per-step parts: the call's keywords read and
 * checked, the windows' release, the capacity count and the growth of every group. Included
 * by ccore_groups.h after the type's struct; its pure-Python specification is
 * group_allocation.grow_running and the groups' remove_skipped_blocks. */

/* The call's values, read and checked before anything changes. */
typedef struct {
    Py_ssize_t computed, num_new, lookahead, reserved, in_flight, num_tokens;
    int lenient, delay;
} GaCall;

static int ga_exact_count(PyObject *v, Py_ssize_t *out) {
    if (!PyLong_CheckExact(v)) return 0;
    Py_ssize_t n = PyLong_AsSsize_t(v);
    if (n < 0) {
        if (n == -1) PyErr_Clear();
        return 0;
    }
    *out = n;
    return 1;
}

/* Whether keyword `name` is `interned`: by identity, else by value unless both are
 * interned (two interned strings of one value are one object). */
static int ga_name_is(PyObject *name, PyObject *interned) {
    if (name == interned) return 1;
    if (PyUnicode_CheckExact(name) && PyUnicode_CHECK_INTERNED(name)
        && PyUnicode_CHECK_INTERNED(interned)) return 0;
    return PyUnicode_Compare(name, interned) == 0;
}

/* 1 when every keyword has a running request's value (filling c), else 0 (fall back). */
static int ga_keywords(PyObject *const *values, PyObject *kwnames, GaCall *c) {
    Py_ssize_t n = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames), zero;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *v = values[i];
        int ok;
        if (ga_name_is(name, str_kw_hit) || ga_name_is(name, str_kw_hit_tokens)) {
            ok = v == Py_None;
        } else if (ga_name_is(name, str_kw_lookahead)) {
            ok = ga_exact_count(v, &c->lookahead);
        } else if (ga_name_is(name, str_kw_reserved)) {
            ok = ga_exact_count(v, &c->reserved);
        } else if (ga_name_is(name, str_kw_external) || ga_name_is(name, str_kw_encoder)) {
            ok = ga_exact_count(v, &zero) && zero == 0;
        } else if (ga_name_is(name, str_kw_scheduled)) {
            ok = PyBool_Check(v);
        } else if (ga_name_is(name, str_kw_must_fit)) {
            ok = v == Py_False;
        } else if (ga_name_is(name, str_kw_delay)) {
            ok = PyBool_Check(v);
            c->delay = v == Py_True;
        } else if (ga_name_is(name, str_lenient_counts)) {
            ok = PyBool_Check(v);
            c->lenient = v == Py_True;
        } else if (ga_name_is(name, str_num_in_flight_tokens)) {
            ok = ga_exact_count(v, &c->in_flight) && c->in_flight <= c->computed;
        } else {
            ok = 0;
        }
        if (PyErr_Occurred()) PyErr_Clear();
        if (!ok) return 0;
    }
    return 1;
}

/* tables[rid] as a borrowed exact list, or NULL (no error set). */
static PyObject *ga_table(PyObject *tables, PyObject *rid) {
    PyObject *t = da_get(tables, rid);
    return t != NULL && PyList_CheckExact(t) ? t : NULL;
}

/* SlidingWindowManager / ChunkedLocalManager.remove_skipped_blocks in C: null out and
 * free (deepest first, one free_blocks call) the real blocks before the skipped end. */
static int ga_release_window(GroupsAllocate *self, GaGroup *g, PyObject *rid,
                             Py_ssize_t processed) {
    Py_ssize_t end;
    if (g->drop == GA_DROP_WINDOW) { /* max(0, processed - w + 1) tokens skipped */
        Py_ssize_t skipped = processed - g->drop_tokens + 1;
        end = skipped > 0 ? skipped / g->block_size : 0;
    } else { /* processed // chunk * chunk_blocks */
        end = processed / g->drop_tokens * (g->drop_tokens / g->block_size);
    }
    if (end <= 0) return 0;
    PyObject *blocks = ga_table(g->tables, rid);
    if (blocks == NULL || PyList_GET_SIZE(blocks) == 0) return 0;
    if (end > PyList_GET_SIZE(blocks)) end = PyList_GET_SIZE(blocks);
    Py_ssize_t first = end;
    while (first > 0) {
        int real = PyObject_IsTrue(PyList_GET_ITEM(blocks, first - 1));
        if (real < 0) return -1;
        if (!real) break;
        first--;
    }
    if (first == end) return 0; /* nothing newly skipped (the nulls form a prefix) */
    PyObject *freed = PyList_New(end - first), *zero = PyLong_FromLong(0);
    if (freed == NULL || zero == NULL) {
        Py_XDECREF(freed);
        Py_XDECREF(zero);
        return -1;
    }
    Py_INCREF(blocks);
    for (Py_ssize_t i = end - 1, k = 0; i >= first; i--, k++) {
        PyObject *b = PyList_GET_ITEM(blocks, i);
        Py_INCREF(b);
        PyList_SET_ITEM(freed, k, b);
        if (PyList_SetItem(blocks, i, Py_NewRef(zero)) < 0) { /* steals, even on failure */
            Py_DECREF(blocks);
            Py_DECREF(freed);
            Py_DECREF(zero);
            return -1;
        }
    }
    Py_DECREF(zero);
    Py_DECREF(blocks);
    PyObject *r = PyObject_CallMethodOneArg(self->ops, str_free_blocks, freed);
    Py_DECREF(freed);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* Coordinator.allocate's window release for every dropping group, in group order. */
static int ga_release(GroupsAllocate *self, PyObject *rid, Py_ssize_t processed) {
    for (Py_ssize_t i = 0; i < self->num_groups; i++) {
        GaGroup *g = &self->g[i];
        if (g->drop == GA_DROP_NONE) continue;
        if (g->drop == GA_DROP_STATE) {
            if (hs_release(ga_table(g->tables, rid), g->released, g->last_state, rid,
                           processed, g->block_size, self->ops, str_free_blocks) < 0) {
                return -1;
            }
            continue;
        }
        if (g->drop != GA_DROP_METHOD) {
            if (ga_release_window(self, g, rid, processed) < 0) return -1;
            continue;
        }
        PyObject *n = PyLong_FromSsize_t(processed);
        if (n == NULL) return -1;
        PyObject *args[3] = {g->manager, rid, n};
        PyObject *r = PyObject_VectorcallMethod(str_remove_skipped, args,
                                                3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(n);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* manager.name(args...) as an int in *out; -1 with an exception set on an error. */
static int ga_method_count(PyObject *name, PyObject *const *args, size_t nargs,
                           Py_ssize_t *out) {
    PyObject *r = PyObject_VectorcallMethod(name, args, nargs, NULL);
    if (r == NULL) return -1;
    *out = PyLong_AsSsize_t(r);
    Py_DECREF(r);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* The pool's free block count, or -1 with an exception set. */
static Py_ssize_t ga_num_free(PyObject *pool) {
    PyObject *queue = PyObject_GetAttr(pool, str_free_queue);
    if (queue == NULL) return -1;
    if (Py_TYPE(queue) == &FreeQueueType) { /* the compiled queue: its count in C */
        Py_ssize_t n = ((FreeQueue *)queue)->num_free;
        Py_DECREF(queue);
        return n;
    }
    PyObject *v = PyObject_GetAttr(queue, str_num_free);
    Py_DECREF(queue);
    if (v == NULL) return -1;
    Py_ssize_t n = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    return n;
}

/* group_allocation.grow_running's zeroing: group i's real new blocks appended to new_block_ids[i]. */
static int ga_record_zeroing(GroupsAllocate *self, Py_ssize_t i, PyObject *new) {
    if (i >= PyList_GET_SIZE(self->zeroing) || i >= PyList_GET_SIZE(self->new_ids)) return 0;
    int on = PyObject_IsTrue(PyList_GET_ITEM(self->zeroing, i));
    if (on <= 0) return on;
    PyObject *seq = PySequence_Fast(new, "new blocks must be a sequence");
    if (seq == NULL) return -1;
    PyObject *ids = PyList_GET_ITEM(self->new_ids, i);
    if (!PyList_CheckExact(ids)) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_TypeError, "new_block_ids must hold lists");
        return -1;
    }
    Py_INCREF(ids);
    int rc = 0;
    for (Py_ssize_t k = 0; rc == 0 && k < PySequence_Fast_GET_SIZE(seq); k++) {
        PyObject *b = PySequence_Fast_GET_ITEM(seq, k);
        int real = PyObject_IsTrue(b);
        rc = real < 0 ? -1 : real ? PyList_Append(ids, b) : 0;
    }
    Py_DECREF(ids);
    Py_DECREF(seq);
    return rc;
}

/* group_allocation.grow_running, first half: per group the blocks to add (plain groups) or the slots
 * (method groups) in counts[], and the blocks needed in *needed. 0, or -1 on an error. */
static int ga_count(GroupsAllocate *self, PyObject *rid, Py_ssize_t num_tokens,
                    Py_ssize_t main, Py_ssize_t total_computed, Py_ssize_t *counts,
                    Py_ssize_t *needed) {
    *needed = 0;
    for (Py_ssize_t i = 0; i < self->num_groups; i++) {
        GaGroup *g = &self->g[i];
        Py_ssize_t n;
        if (g->grow == GA_GROW_PLAIN) {
            PyObject *table = ga_table(g->tables, rid);
            if (table == NULL) {
                PyErr_SetObject(PyExc_KeyError, rid);
                return -1;
            }
            n = (num_tokens + g->block_size - 1) / g->block_size - PyList_GET_SIZE(table);
            counts[i] = n;
        } else if (g->grow == GA_GROW_STATE) { /* MambaAlignManager's count, no hit */
            PyObject *table = ga_table(g->tables, rid);
            if (table == NULL) {
                PyErr_SetObject(PyExc_KeyError, rid);
                return -1;
            }
            n = (main + g->block_size - 1) / g->block_size > PyList_GET_SIZE(table);
            counts[i] = main;
        } else {
            Py_ssize_t slots = main;
            PyObject *a[4] = {g->manager, NULL, NULL, NULL};
            size_t nargs = 3 | PY_VECTORCALL_ARGUMENTS_OFFSET;
            if (!g->ignores_lookahead) {
                a[1] = PyLong_FromSsize_t(num_tokens);
                a[2] = PyLong_FromLong(0);
                int rc = a[1] && a[2] ? ga_method_count(str_slots_needed, a, nargs, &slots) : -1;
                Py_XDECREF(a[1]);
                Py_XDECREF(a[2]);
                if (rc < 0) return -1;
            }
            PyObject *slots_obj = PyLong_FromSsize_t(slots), *none = PyList_New(0),
                     *tc = PyLong_FromSsize_t(total_computed);
            PyObject *b[5] = {g->manager, rid, slots_obj, none, tc};
            int rc = slots_obj && none && tc
                         ? ga_method_count(str_get_num_blocks, b,
                                           5 | PY_VECTORCALL_ARGUMENTS_OFFSET, &n)
                         : -1;
            Py_XDECREF(slots_obj);
            Py_XDECREF(none);
            Py_XDECREF(tc);
            if (rc < 0) return -1;
            counts[i] = slots;
        }
        if (n > 0) *needed += n;
    }
    return 0;
}

/* Group i's growth by counts[i]: a plain table through the pool's get_new_blocks, a method
 * group through its allocate_new_blocks. A new reference to the new ids, NULL on error. */
static PyObject *ga_grow_group(GroupsAllocate *self, Py_ssize_t i, PyObject *rid,
                               Py_ssize_t count) {
    GaGroup *g = &self->g[i];
    if (g->grow == GA_GROW_STATE) {
        PyObject *table = ga_table(g->tables, rid);
        if (table == NULL) {
            PyErr_SetObject(PyExc_KeyError, rid);
            return NULL;
        }
        return hs_grow(table, g->last_state, g->allocated, rid, count, g->block_size,
                       self->ops, str_get_new_blocks);
    }
    if (g->grow != GA_GROW_PLAIN) {
        PyObject *slots = PyLong_FromSsize_t(count);
        if (slots == NULL) return NULL;
        PyObject *a[3] = {g->manager, rid, slots};
        PyObject *r = PyObject_VectorcallMethod(str_allocate_new, a,
                                                3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(slots);
        return r;
    }
    if (count <= 0) return PyList_New(0);
    PyObject *n_obj = PyLong_FromSsize_t(count);
    if (n_obj == NULL) return NULL;
    PyObject *new = PyObject_CallMethodOneArg(self->ops, str_get_new_blocks, n_obj);
    Py_DECREF(n_obj);
    if (new == NULL) return NULL;
    PyObject *table = ga_table(g->tables, rid); /* again: the pool ran Python code */
    if (table == NULL || !PyList_CheckExact(new)) {
        Py_DECREF(new);
        PyErr_SetString(PyExc_TypeError, "GroupsAllocate: a table or get_new_blocks' result "
                                         "is not a list");
        return NULL;
    }
    Py_ssize_t len = PyList_GET_SIZE(table);
    if (PyList_SetSlice(table, len, len, new) < 0) {
        Py_DECREF(new);
        return NULL;
    }
    return new;
}

/* group_allocation.grow_running after the release: the new ids per group, Py_None (a new reference)
 * when the pool is short (nothing changed), NULL on an error. */
static PyObject *ga_grow(GroupsAllocate *self, PyObject *rid, Py_ssize_t num_tokens,
                         Py_ssize_t main, Py_ssize_t headroom, Py_ssize_t total_computed) {
    Py_ssize_t small[8], needed;
    Py_ssize_t *counts = self->num_groups <= 8
                             ? small
                             : PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)self->num_groups);
    if (counts == NULL) return PyErr_NoMemory();
    PyObject *out = NULL;
    if (ga_count(self, rid, num_tokens, main, total_computed, counts, &needed) < 0) goto done;
    Py_ssize_t num_free = ga_num_free(self->pool);
    if (num_free == -1 && PyErr_Occurred()) goto done;
    if (headroom > num_free || needed > num_free - headroom) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    out = PyTuple_New(self->num_groups);
    for (Py_ssize_t i = 0; out != NULL && i < self->num_groups; i++) {
        PyObject *new = ga_grow_group(self, i, rid, counts[i]);
        if (new == NULL || ga_record_zeroing(self, i, new) < 0) {
            Py_XDECREF(new);
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, i, new);
    }
done:
    if (counts != small) PyMem_Free(counts);
    return out;
}

