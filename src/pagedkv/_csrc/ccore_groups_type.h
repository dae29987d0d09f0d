/* GroupsAllocate (ccore_groups.h), its construction: the groups' and the registration
 * plan's entries parsed and checked (fast_paths.install builds them), the getters, the
 * method tables and the type. Included at the end of ccore_groups.h. */

/* groups: one (grow, drop, ignores_lookahead, block_size, drop_tokens, manager, tables
 * [, state]) tuple per group, in group order; state (a state kind's) is (released dict,
 * last_state dict, allocated set, partial dict). 0, or -1 with an exception set. */
static int ga_parse_groups(GroupsAllocate *self, PyObject *groups) {
    Py_ssize_t n = PyTuple_GET_SIZE(groups);
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "GroupsAllocate: at least one group");
        return -1;
    }
    self->g = PyMem_Calloc((size_t)n, sizeof(GaGroup));
    if (self->g == NULL) return (PyErr_NoMemory(), -1);
    self->num_groups = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        GaGroup *g = &self->g[i];
        PyObject *state = Py_None;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(groups, i), "iiinnOO!|O:GroupsAllocate group",
                              &g->grow, &g->drop, &g->ignores_lookahead, &g->block_size,
                              &g->drop_tokens, &g->manager, &PyDict_Type, &g->tables,
                              &state)) {
            return -1;
        }
        int windowed = g->drop == GA_DROP_WINDOW || g->drop == GA_DROP_CHUNK;
        int stateful = g->grow == GA_GROW_STATE || g->drop == GA_DROP_STATE;
        if (stateful && !PyTuple_Check(state)) {
            PyErr_SetString(PyExc_TypeError, "GroupsAllocate state: a tuple for a state kind");
            return -1;
        }
        if (stateful
            && (!PyArg_ParseTuple(state, "O!O!O!O!:GroupsAllocate state", &PyDict_Type,
                                  &g->released, &PyDict_Type, &g->last_state, &PySet_Type,
                                  &g->allocated, &PyDict_Type, &g->partial))) {
            return -1;
        }
        if (g->block_size <= 0 || g->grow < 0 || g->grow > GA_GROW_STATE || g->drop < 0
            || g->drop > GA_DROP_STATE || (windowed && g->drop_tokens <= 0)
            || (g->grow == GA_GROW_STATE && !g->ignores_lookahead)
            || (g->drop == GA_DROP_CHUNK && g->drop_tokens % g->block_size)) {
            PyErr_SetString(PyExc_ValueError, "GroupsAllocate: a group's kinds or sizes are "
                                              "out of range");
            return -1;
        }
    }
    return 0;
}

/* cache_plan: one (block_size, manager, tables, cached dict or None) per caching group. */
static int ga_parse_cache(GroupsAllocate *self, PyObject *plan) {
    Py_ssize_t n = PyTuple_GET_SIZE(plan);
    self->c = PyMem_Calloc((size_t)(n ? n : 1), sizeof(GaCache));
    if (self->c == NULL) return (PyErr_NoMemory(), -1);
    self->num_cache = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        GaCache *c = &self->c[i];
        PyObject *reg = Py_None;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(plan, i), "nOO!O|O:GroupsAllocate cache group",
                              &c->block_size, &c->manager, &PyDict_Type, &c->tables,
                              &c->cached, &reg)) {
            return -1;
        }
        c->kind = GA_CACHE_METHOD;
        if (reg != Py_None && !PyTuple_Check(reg)) {
            PyErr_SetString(PyExc_TypeError, "GroupsAllocate registration: a tuple or None");
            return -1;
        }
        if (reg != Py_None
            && !PyArg_ParseTuple(reg, "inOO!O!O!O!p|nnn:GroupsAllocate registration",
                                 &c->kind, &c->stride, &c->group, &PyDict_Type, &c->index,
                                 &PyDict_Type, &c->dups, &PySet_Type, &c->registered,
                                 &PyDict_Type, &c->counts, &c->drop_last_hit,
                                 &c->per_segment, &c->first, &c->shift)) {
            return -1;
        }
        if (c->block_size <= 0 || (c->cached != Py_None && !PyDict_Check(c->cached))
            || c->kind < GA_CACHE_METHOD || c->kind > GA_CACHE_MASKED
            || (c->kind == GA_CACHE_MASKED && (c->per_segment <= 0 || c->shift < 0))
            || (c->kind != GA_CACHE_METHOD && c->stride <= 0)
            || (c->kind != GA_CACHE_METHOD && c->kind != GA_CACHE_TAIL && c->cached == Py_None)) {
            PyErr_SetString(PyExc_ValueError, "GroupsAllocate: a cache group's block size "
                                              "or counts are wrong");
            return -1;
        }
    }
    return 0;
}

static int ga_init(GroupsAllocate *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"function", "cache_function", "manager", "live_requests", "pool",
                             "zeroing", "new_block_ids", "request_type", "groups",
                             "cache_plan", "max_model_len", "hash_block_size",
                             "cache_alignment", "registrar", "pool_ops", "free_function",
                             "free_plan", NULL};
    PyObject *function, *cache_function, *manager, *live, *pool, *zeroing, *new_ids, *rtype,
        *groups, *plan, *registrar = Py_None, *ops = Py_None, *free_fn = Py_None,
        *free_plan = Py_None;
    Py_ssize_t max_len, hash_bs, align;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwds, "OOOO!OO!O!O!O!O!nnn|OOOO:GroupsAllocate", kwlist, &function,
            &cache_function, &manager, &PyDict_Type, &live, &pool, &PyList_Type, &zeroing,
            &PyList_Type, &new_ids, &PyType_Type, &rtype, &PyTuple_Type, &groups,
            &PyTuple_Type, &plan, &max_len, &hash_bs, &align, &registrar, &ops, &free_fn, &free_plan)) {
        return -1;
    }
    if (max_len <= 0 || hash_bs <= 0 || align <= 0 || !PyCallable_Check(function)
        || !PyCallable_Check(cache_function)) {
        PyErr_SetString(PyExc_ValueError, "GroupsAllocate: callables, and max_model_len, "
                                          "hash_block_size and cache_alignment > 0");
        return -1;
    }
    ga_clear(self);
    PyObject *ref = PyWeakref_NewRef(manager, NULL);
    if (ref == NULL) return -1;
    self->manager_ref = ref;
    self->function = Py_NewRef(function);
    self->cache_function = Py_NewRef(cache_function);
    self->live = Py_NewRef(live);
    self->pool = Py_NewRef(pool);
    self->zeroing = Py_NewRef(zeroing);
    self->new_ids = Py_NewRef(new_ids);
    self->request_type = Py_NewRef(rtype);
    self->groups = Py_NewRef(groups); /* owns what the GaGroup entries borrow */
    self->cache_plan = Py_NewRef(plan);
    self->registrar = Py_NewRef(registrar);
    self->ops = Py_NewRef(ops == Py_None ? pool : ops);
    if (registrar != Py_None) { /* (index, block_hash, block_group, evict, stored) */
        if (!PyTuple_Check(registrar)) {
            PyErr_SetString(PyExc_TypeError, "GroupsAllocate registrar: a tuple or None");
            return -1;
        }
        if (!PyArg_ParseTuple(registrar, "OO!O!OO:GroupsAllocate registrar", &self->reg_fn,
                              &PyList_Type, &self->reg_hash, &PyList_Type, &self->reg_group,
                              &self->reg_evict, &self->reg_stored)) {
            self->reg_fn = NULL;
            return -1;
        }
        if (self->reg_stored == Py_None) self->reg_stored = NULL;
        if (!PyCallable_Check(self->reg_evict)
            || (self->reg_stored != NULL && !PyCallable_Check(self->reg_stored))) {
            self->reg_fn = NULL;
            PyErr_SetString(PyExc_TypeError, "GroupsAllocate registrar: the eviction and "
                                             "stored must be callables");
            return -1;
        }
    }
    self->max_model_len = max_len;
    self->hash_block_size = hash_bs;
    self->align = align;
    if (ga_parse_groups(self, groups) < 0 || ga_parse_cache(self, plan) < 0
        || gf_init(self, free_fn, free_plan) < 0) return -1;
    self->vectorcall = (vectorcallfunc)ga_call;
    return 0;
}

static PyObject *ga_get_manager(GroupsAllocate *self, void *closure) {
    (void)closure;
    return da_manager_of(self->manager_ref);
}

static PyObject *ga_get_doc(GroupsAllocate *self, void *closure) {
    (void)closure;
    return PyObject_GetAttrString(self->function, "__doc__");
}

/* get_computed_blocks, set_lookup, takes_lookups: ccore_hybrid_lookup.h */
static PyObject *ga_lookup(GroupsAllocate *self, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames);
static PyObject *ga_set_lookup(GroupsAllocate *self, PyObject *lookup);
static PyObject *ga_takes_lookups(GroupsAllocate *self, void *closure);

static PyMethodDef ga_methods[] = {
    {"cache_blocks", (PyCFunction)(void (*)(void))ga_cache_blocks,
     METH_FASTCALL | METH_KEYWORDS,
     "cache_blocks(request, num_computed_tokens): KVCacheManager.cache_blocks, the "
     "common call in C."},
    {"free", (PyCFunction)ga_free, METH_O,
     "free(request): KVCacheManager.free, a held request's free in C."},
    {"get_computed_blocks", (PyCFunction)(void (*)(void))ga_lookup,
     METH_FASTCALL | METH_KEYWORDS, "KVCacheManager.get_computed_blocks, in C (set_lookup)."},
    {"set_lookup", (PyCFunction)ga_set_lookup, METH_O,
     "set_lookup(lookup): get_computed_blocks goes to a HybridLookup."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ga_getset[] = {
    {"__doc__", (getter)ga_get_doc, NULL, "The Python method's docstring.", NULL},
    {"manager", (getter)ga_get_manager, NULL, "The manager whose allocate_slots this is.",
     NULL},
    {"takes_frees", (getter)ga_takes_frees, NULL, "Whether free is the compiled free.", NULL},
    {"takes_lookups", (getter)ga_takes_lookups, NULL,
     "Whether get_computed_blocks runs in C (else it is not to be installed).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef ga_members[] = {
    {"function", T_OBJECT, offsetof(GroupsAllocate, function), READONLY,
     "The Python allocate_slots every other call goes to (with the manager)."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject GroupsAllocateType;

static int ccore_groups_add(PyObject *m) {
    const char *names[] = {"remove_skipped_blocks", "get_num_blocks_to_allocate",
                           "allocate_new_blocks", "slots_needed", "cache_blocks",
                           "free_blocks", "new_computed_blocks", "num_new_computed_tokens",
                           "num_lookahead_tokens", "num_external_computed_tokens",
                           "num_encoder_tokens", "delay_caching", "reserved_blocks",
                           "has_scheduled_reqs", "full_sequence_must_fit", "partial_hits",
                           "keep_null_head", "offloads", "num_prompt_tokens",
                           "_index_register"};
    PyObject **slots[] = {&str_remove_skipped, &str_get_num_blocks, &str_allocate_new,
                          &str_slots_needed, &str_mgr_cache_blocks, &str_free_blocks,
                          &str_kw_hit, &str_kw_hit_tokens, &str_kw_lookahead,
                          &str_kw_external, &str_kw_encoder, &str_kw_delay, &str_kw_reserved,
                          &str_kw_scheduled, &str_kw_must_fit, &str_partial_hits,
                          &str_keep_null_head, &str_offloads, &str_num_prompt_tokens,
                          &str_index_register_attr};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if ((*slots[i] = PyUnicode_InternFromString(names[i])) == NULL) return -1;
    }
    GroupsAllocateType.tp_name = "pagedkv.core._ccore.GroupsAllocate";
    GroupsAllocateType.tp_basicsize = sizeof(GroupsAllocate);
    GroupsAllocateType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
                                  | Py_TPFLAGS_HAVE_VECTORCALL;
    GroupsAllocateType.tp_new = PyType_GenericNew;
    GroupsAllocateType.tp_init = (initproc)ga_init;
    GroupsAllocateType.tp_dealloc = (destructor)ga_dealloc;
    GroupsAllocateType.tp_traverse = (traverseproc)ga_traverse;
    GroupsAllocateType.tp_clear = (inquiry)ga_clear;
    GroupsAllocateType.tp_call = PyVectorcall_Call;
    GroupsAllocateType.tp_vectorcall_offset = offsetof(GroupsAllocate, vectorcall);
    GroupsAllocateType.tp_members = ga_members;
    GroupsAllocateType.tp_getset = ga_getset;
    GroupsAllocateType.tp_methods = ga_methods;
    return ccore_add_type(m, &GroupsAllocateType, "GroupsAllocate");
}
