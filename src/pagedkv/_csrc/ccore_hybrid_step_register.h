/* GroupsAllocate's registration in C (ga_register, for ga_cache in ccore_groups.h, which
 * includes this file after its types): a caching group's cache_blocks by
 * SingleTypeManager's rule, Mamba align's or full attention's over several hash blocks
 * per block, through the index's register kernel (PrefixIndex.cache_full_blocks without
 * a mask or a policy), the recorder's stored told the run. Its specification is those
 * Python methods (the differential machine compares both cores after every step). */

/* 1 when Mamba group c registers by the align rule alone now: no sub-block hits, no
 * 0.32 re-keying, no offload tracking; else 0 (its method runs; no error set). */
static int ga_state_plain(GaCache *c) {
    PyObject *v = PyObject_GetAttr(c->manager, str_partial_hits);
    int on = v == NULL ? -1 : PyObject_IsTrue(v);
    Py_XDECREF(v);
    if (on == 0) {
        v = PyObject_GetAttr(c->manager, str_keep_null_head);
        on = v == NULL ? -1 : PyObject_IsTrue(v);
        Py_XDECREF(v);
    }
    if (on == 0) {
        v = PyObject_GetAttr(c->manager, str_offloads);
        on = v == NULL ? -1 : v != Py_None;
        Py_XDECREF(v);
    }
    if (on < 0) PyErr_Clear();
    return on == 0;
}

/* The recorder's stored((request, blocks, hashes, start, stop, skipped, group)). */
static int ga_tell_stored(GroupsAllocate *self, GaCache *c, PyObject *request, PyObject *table,
                          PyObject *hashes, Py_ssize_t start, Py_ssize_t stop,
                          PyObject *skipped) {
    if (Py_TYPE(self->reg_stored) == &BufferStoredType) { /* EventBuffer.stored in C */
        return bs_stored((BufferStored *)self->reg_stored, request, table, hashes, start, stop,
                         skipped, c->group);
    }
    PyObject *run = Py_BuildValue("(OOOnnOO)", request, table, hashes, start, stop, skipped,
                                  c->group);
    if (run == NULL) return -1;
    PyObject *r = PyObject_CallOneArg(self->reg_stored, run);
    Py_DECREF(run);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* MambaAlignManager.cache_blocks's tail: the keys of positions [start, stop) join the
 * step's registered set. */
static int ga_remember_keys(GroupsAllocate *self, GaCache *c, PyObject *table,
                            Py_ssize_t start, Py_ssize_t stop) {
    for (Py_ssize_t k = start; k < stop && k < PyList_GET_SIZE(table); k++) {
        PyObject *b = PyList_GET_ITEM(table, k);
        int real = PyObject_IsTrue(b);
        if (real < 0) return -1;
        if (!real) continue;
        Py_ssize_t id = PyLong_AsSsize_t(b);
        if (id < 0 || id >= PyList_GET_SIZE(self->reg_hash)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "block id out of range");
            return -1;
        }
        PyObject *h = PyList_GET_ITEM(self->reg_hash, id);
        if (h != Py_None && PySet_Add(c->registered, h) < 0) return -1;
    }
    return 0;
}

/* The pool's cache_partial_block(request, block, boundary, group): the partial entry
 * FullAttentionManager.cache_blocks's tail registers. 0, or -1 with an exception. */
static int ga_tail_register(GroupsAllocate *self, GaCache *c, PyObject *request,
                            PyObject *block, Py_ssize_t boundary) {
    static PyObject *name;
    if (name == NULL && (name = PyUnicode_InternFromString("cache_partial_block")) == NULL) {
        return -1;
    }
    PyObject *n = PyLong_FromSsize_t(boundary);
    if (n == NULL) return -1;
    PyObject *a[5] = {self->pool, request, block, n, c->group};
    PyObject *r = PyObject_VectorcallMethod(name, a, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(n);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* FullAttentionManager.cache_blocks's tail (a block of several hash blocks): 1 when the
 * prompt's tail boundary within end tokens may still need its partial entry and the
 * counts are unusual (the method decides), 0 when its rule returns without one or the
 * entry was registered here (the rule's last step: the pool's cache_partial_block), -1
 * with an exception. */
static int ga_tail_pending(GroupsAllocate *self, GaCache *c, PyObject *request,
                           PyObject *table, PyObject *all, Py_ssize_t end) {
    Py_ssize_t hbs = self->hash_block_size, prompt = da_count(request, str_num_prompt_tokens);
    if (prompt < 0) return 1;
    Py_ssize_t limit = prompt - (c->drop_last_hit ? 0 : 1);
    if (limit < 0) return 1;
    Py_ssize_t n = limit / hbs;
    if (n > PyList_GET_SIZE(all)) n = PyList_GET_SIZE(all);
    Py_ssize_t boundary = n * hbs, i = boundary / c->block_size;
    if (!boundary || boundary > end || !(boundary % c->block_size)
        || i >= PyList_GET_SIZE(table)) return 0;
    PyObject *block = Py_NewRef(PyList_GET_ITEM(table, i));
    PyObject *cur = PyDict_GetItemWithError(c->index, PyList_GET_ITEM(all, boundary / hbs - 1));
    int same = cur == NULL ? (PyErr_Occurred() ? -1 : 0)
                           : PyObject_RichCompareBool(cur, block, Py_EQ);
    int rc = same < 0 ? (PyErr_Clear(), 1) /* the method decides */
             : same ? 0 : ga_tail_register(self, c, request, block, boundary);
    Py_DECREF(block);
    return rc;
}

/* hashes all[k - 1 :: k] as a new list (all itself, a new reference, when k is 1). */
static PyObject *ga_strided(PyObject *all, Py_ssize_t k) {
    if (k == 1) return Py_NewRef(all);
    Py_ssize_t n = PyList_GET_SIZE(all) / k;
    PyObject *hashes = PyList_New(n);
    for (Py_ssize_t i = 0; hashes != NULL && i < n; i++) {
        PyList_SET_ITEM(hashes, i, Py_NewRef(PyList_GET_ITEM(all, (i + 1) * k - 1)));
    }
    return hashes;
}

/* Blocks [start, stop) of the table through the index's register kernel, the recorder
 * told, the count moved (SingleTypeManager.cache_blocks -> PrefixIndex.cache_full_blocks
 * without a mask or a policy). 0, or -1 with an exception set. */
static int ga_register_run(GroupsAllocate *self, GaCache *c, PyObject *request,
                           PyObject *rid, PyObject *table, PyObject *all, Py_ssize_t start,
                           Py_ssize_t stop) {
    PyObject *hashes = ga_strided(all, c->stride);
    if (hashes == NULL) return -1;
    /* the index's kernel as it holds it now (reg_fn: the index) */
    PyObject *kernel = c->kind == GA_CACHE_MASKED
                           ? NULL : PyObject_GetAttr(self->reg_fn, str_index_register_attr);
    IxMask mask = {c->per_segment, c->first, c->shift};
    PyObject *skipped = c->kind == GA_CACHE_MASKED
                            ? ix_register(table, hashes, start, stop, c->index, c->dups,
                                          self->reg_hash, self->reg_group, c->group,
                                          self->reg_evict, &mask)
                        : kernel == NULL ? NULL
                        : PyObject_CallFunction(kernel, "OOnnOOOOOO", table, hashes, start,
                                                stop, c->index, c->dups, self->reg_hash,
                                                self->reg_group, c->group, self->reg_evict);
    Py_XDECREF(kernel);
    int rc = skipped == NULL ? -1 : 0;
    if (rc == 0 && self->reg_stored != NULL) {
        rc = ga_tell_stored(self, c, request, table, hashes, start, stop, skipped);
    }
    if (rc == 0) rc = hs_set_int(c->counts, rid, stop);
    if (rc == 0 && c->kind == GA_CACHE_STATE) rc = ga_remember_keys(self, c, table, start, stop);
    Py_XDECREF(skipped);
    Py_DECREF(hashes);
    return rc;
}

/* Group c's cache_blocks(request, rid, end) in C (GaCache kinds): the blocks full within
 * end tokens and not registered yet go through the index's register kernel, the recorder
 * hears the run, the count moves; a tail kind then leaves the prompt's tail boundary to
 * the method when it may need a partial entry. 0 done, 1 not taken or not finished (the
 * method runs: what is left of its rule), -1 an error. */
static int ga_register(GroupsAllocate *self, GaCache *c, PyObject *request, PyObject *rid,
                       Py_ssize_t end) {
    PyObject *table = ga_table(c->tables, rid), *v = da_get(c->counts, rid);
    if (table == NULL || v == NULL || !PyLong_CheckExact(v)
        || (c->kind == GA_CACHE_STATE && !ga_state_plain(c))) return 1;
    Py_ssize_t start = PyLong_AsSsize_t(v);
    PyObject *all = PyObject_GetAttr(request, str_block_hashes);
    if (all == NULL || !PyList_CheckExact(all) || start < 0) {
        Py_XDECREF(all);
        PyErr_Clear();
        return 1;
    }
    Py_ssize_t num_full = end;
    if (c->kind == GA_CACHE_STATE && end > PyList_GET_SIZE(all) * self->hash_block_size) {
        num_full = PyList_GET_SIZE(all) * self->hash_block_size;
    }
    Py_ssize_t stop = num_full / c->block_size;
    Py_INCREF(table);
    int rc = stop > start ? ga_register_run(self, c, request, rid, table, all, start, stop) : 0;
    if (rc == 0 && c->kind == GA_CACHE_TAIL) rc = ga_tail_pending(self, c, request, table, all,
                                                                  end);
    Py_DECREF(table);
    Py_DECREF(all);
    return rc;
}
