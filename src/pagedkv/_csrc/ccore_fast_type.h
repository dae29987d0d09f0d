/* DecodeAllocate (ccore_fast.h), its cache_blocks entry and its construction: the
 * arguments fast_paths.install passes, checked; the optional entries of ccore_lookup.h;
 * the getters, method tables and the type. Included at the end of ccore_fast.h. */

/* cache_blocks(request, num_computed_tokens) for a request this manager holds: the
 * façade's check (a plain count, no more tokens than the request's slots) and the
 * coordinator's test (a block became full) in C; the coordinator's cache_blocks (Python)
 * runs only when a block is to be registered. Anything else goes to the Python method
 * (KVCacheManager.cache_blocks), which raises the documented errors. */
static PyObject *da_cache_blocks(DecodeAllocate *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames) {
    if (self->cache_function == NULL || self->cache_function == Py_None) {
        PyErr_SetString(PyExc_TypeError, "DecodeAllocate: built without cache_function");
        return NULL;
    }
    if (kwnames != NULL || PyVectorcall_NARGS(nargsf) != 2 || !PyLong_CheckExact(args[1])) {
        return call_python(self->manager_ref, self->cache_function, args, nargsf, kwnames);
    }
    PyObject *mgr = da_manager(self);
    if (mgr == NULL) return NULL;
    Py_DECREF(mgr);
    PyObject *request = args[0];
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n < 0) {
        if (n == -1) PyErr_Clear();
        return call_python(self->manager_ref, self->cache_function, args, nargsf, kwnames);
    }
    PyObject *rid = PyObject_GetAttr(request, str_request_id);
    if (rid == NULL) {
        PyErr_Clear();
        return call_python(self->manager_ref, self->cache_function, args, nargsf, kwnames);
    }
    PyObject *table = NULL, *cached = NULL;
    Py_ssize_t num_tokens = -1;
    if (!PyUnicode_CheckExact(rid) || da_get(self->live, rid) != request) goto fallback;
    num_tokens = da_num_tokens(self, request);
    if (num_tokens < 0) goto fallback;
    if (n > num_tokens) n = num_tokens;
    table = da_get(self->tables, rid);
    cached = da_get(self->cached, rid);
    if (table == NULL || !PyList_CheckExact(table) || cached == NULL
        || !PyLong_CheckExact(cached)) goto fallback;
    if (n > PyList_GET_SIZE(table) * self->block_size) goto fallback; /* past its slots */
    Py_ssize_t num_cached = PyLong_AsSsize_t(cached);
    if (num_cached == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        goto fallback;
    }
    Py_DECREF(rid);
    if (n / self->block_size > num_cached) { /* a block became full: register it */
        PyObject *end_obj = PyLong_FromSsize_t(n);
        if (end_obj == NULL) return NULL;
        PyObject *call_args[2] = {request, end_obj};
        PyObject *r = PyObject_Vectorcall(self->cache_blocks, call_args, 2, NULL);
        Py_DECREF(end_obj);
        if (r == NULL) return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
fallback:
    Py_DECREF(rid);
    return call_python(self->manager_ref, self->cache_function, args, nargsf, kwnames);
}

static PyMethodDef da_methods[] = {
    {"cache_blocks", (PyCFunction)(void (*)(void))da_cache_blocks,
     METH_FASTCALL | METH_KEYWORDS,
     "cache_blocks(request, num_computed_tokens): KVCacheManager.cache_blocks, the "
     "common call in C."},
    {"get_computed_blocks", (PyCFunction)da_lookup, METH_O,
     "get_computed_blocks(request): KVCacheManager.get_computed_blocks, the common call in "
     "C."},
    {"free", (PyCFunction)da_free, METH_O,
     "free(request): KVCacheManager.free, the common call in C."},
    {NULL, NULL, 0, NULL},
};

/* The optional entries (ccore_lookup.h): the lookup needs a hit type that is a plain
 * tuple subclass (built in C), a Python lookup and a group; the free a Python free; the
 * first call's own take and registration a null recorder type. 0 or -1. */
static int da_init_fast(DecodeAllocate *self, PyObject *hit_type, PyObject *lookup_function,
                        PyObject *free_function, Py_ssize_t group, PyObject *null_recorder,
                        int fast_register) {
    if ((lookup_function != Py_None && !PyCallable_Check(lookup_function))
        || (free_function != Py_None && !PyCallable_Check(free_function))
        || (null_recorder != Py_None && !PyType_Check(null_recorder))) {
        PyErr_SetString(PyExc_TypeError,
                        "DecodeAllocate: lookup_function and free_function are calls or None, "
                        "null_recorder a type or None");
        return -1;
    }
    PyTypeObject *ht = hit_type != Py_None && PyType_Check(hit_type) ? (PyTypeObject *)hit_type
                                                                     : NULL;
    int plain_hit = ht != NULL && PyType_IsSubtype(ht, &PyTuple_Type)
                    && ht->tp_basicsize == PyTuple_Type.tp_basicsize
                    && ht->tp_itemsize == PyTuple_Type.tp_itemsize && ht->tp_dictoffset == 0;
    self->group = group;
    self->fast_lookup = plain_hit && lookup_function != Py_None && group >= 0;
    Py_XSETREF(self->lookup_function,
               lookup_function == Py_None ? NULL : Py_NewRef(lookup_function));
    Py_XSETREF(self->free_function, free_function == Py_None ? NULL : Py_NewRef(free_function));
    self->fast_free = self->free_function != NULL;
    Py_XSETREF(self->null_recorder, null_recorder == Py_None ? NULL : Py_NewRef(null_recorder));
    self->fast_register = fast_register && self->null_recorder != NULL && group >= 0;
    return 0;
}

static int da_init(DecodeAllocate *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"function", "manager", "live_requests", "tables", "num_cached",
                             "pool", "cache_blocks", "zeroing", "request_type", "block_size",
                             "max_model_len", "hash_block_size", "cache_function", "hit_type",
                             "lookup_function", "free_function", "group",
                             "null_recorder", "fast_register", NULL};
    PyObject *function, *manager, *live, *tables, *cached, *pool, *cache_blocks, *zeroing,
        *rtype;
    Py_ssize_t block_size, max_len, hash_block_size = 0;
    PyObject *cache_function = Py_None, *hit_type = Py_None, *lookup_function = Py_None,
             *free_function = Py_None, *null_recorder = Py_None;
    Py_ssize_t group = -1;
    int fast_register = 0;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwds, "OOO!O!O!OOO!O!nn|nOOOOnOp:DecodeAllocate", kwlist, &function,
            &manager, &PyDict_Type, &live, &PyDict_Type, &tables, &PyDict_Type, &cached,
            &pool, &cache_blocks, &PyList_Type, &zeroing, &PyType_Type, &rtype, &block_size,
            &max_len, &hash_block_size, &cache_function, &hit_type, &lookup_function,
            &free_function, &group, &null_recorder, &fast_register)) {
        return -1;
    }
    if (da_init_fast(self, hit_type, lookup_function, free_function, group, null_recorder,
                     fast_register) < 0) return -1;
    if (hit_type != Py_None && !PyType_Check(hit_type)) {
        PyErr_SetString(PyExc_TypeError, "DecodeAllocate: hit_type is a type or None");
        return -1;
    }
    if (hash_block_size == 0) hash_block_size = block_size;
    if (block_size <= 0 || max_len <= 0 || hash_block_size < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "DecodeAllocate: block_size, hash_block_size and max_model_len > 0");
        return -1;
    }
    if (!PyCallable_Check(function) || !PyCallable_Check(cache_blocks)
        || (cache_function != Py_None && !PyCallable_Check(cache_function))) {
        PyErr_SetString(PyExc_TypeError, "DecodeAllocate: function and cache_blocks calls");
        return -1;
    }
    PyObject *ref = PyWeakref_NewRef(manager, NULL);
    if (ref == NULL) return -1;
    Py_XSETREF(self->manager_ref, ref);
    PyObject *objs[9] = {function, live, tables, cached, pool, cache_blocks, zeroing, rtype,
                         cache_function};
    PyObject **slots[9] = {&self->function, &self->live, &self->tables, &self->cached,
                           &self->pool, &self->cache_blocks, &self->zeroing,
                           &self->request_type, &self->cache_function};
    for (int i = 0; i < 9; i++) {
        Py_INCREF(objs[i]);
        Py_XSETREF(*slots[i], objs[i]);
    }
    Py_XSETREF(self->hit_type, hit_type == Py_None ? NULL : Py_NewRef(hit_type));
    self->block_size = block_size;
    self->hash_block_size = hash_block_size;
    self->max_model_len = max_len;
    self->vectorcall = (vectorcallfunc)da_call;
    return 0;
}

static PyObject *da_get_doc(DecodeAllocate *self, void *closure) {
    (void)closure;
    return PyObject_GetAttrString(self->function, "__doc__");
}

static PyObject *da_get_manager(DecodeAllocate *self, void *closure) {
    (void)closure;
    return da_manager(self);
}

static PyGetSetDef da_getset[] = {
    {"__doc__", (getter)da_get_doc, NULL, "The Python method's docstring.", NULL},
    {"manager", (getter)da_get_manager, NULL, "The manager whose allocate_slots this is.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef da_members[] = {
    {"function", T_OBJECT, offsetof(DecodeAllocate, function), READONLY,
     "The Python allocate_slots every other call goes to (with the manager)."},
    {"takes_lookups", T_INT, offsetof(DecodeAllocate, fast_lookup), READONLY,
     "Whether get_computed_blocks runs in C (else it is not to be installed)."},
    {"takes_frees", T_INT, offsetof(DecodeAllocate, fast_free), READONLY,
     "Whether free runs in C (else it is not to be installed)."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject DecodeAllocateType;

static int ccore_fast_add(PyObject *m) {
    str_request_id = PyUnicode_InternFromString("request_id");
    str_num_computed_tokens = PyUnicode_InternFromString("num_computed_tokens");
    str_num_tokens = PyUnicode_InternFromString("num_tokens");
    str_all_token_ids = PyUnicode_InternFromString("all_token_ids");
    str_owned_tokens = PyUnicode_InternFromString("_owned_tokens");
    str_free_queue = PyUnicode_InternFromString("free_queue");
    str_num_free = PyUnicode_InternFromString("num_free");
    str_get_new_blocks = PyUnicode_InternFromString("get_new_blocks");
    str_block_hashes = PyUnicode_InternFromString("block_hashes");
    str_num_in_flight_tokens = PyUnicode_InternFromString("num_in_flight_tokens");
    str_lenient_counts = PyUnicode_InternFromString("lenient_counts");
    if (!str_block_hashes || !str_num_in_flight_tokens || !str_lenient_counts) return -1;
    if (!str_request_id || !str_num_computed_tokens || !str_num_tokens || !str_all_token_ids
        || !str_owned_tokens
        || !str_free_queue || !str_num_free || !str_get_new_blocks) return -1;
    DecodeAllocateType.tp_name = "pagedkv.core._ccore.DecodeAllocate";
    DecodeAllocateType.tp_basicsize = sizeof(DecodeAllocate);
    DecodeAllocateType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
                                  | Py_TPFLAGS_HAVE_VECTORCALL;
    DecodeAllocateType.tp_new = PyType_GenericNew;
    DecodeAllocateType.tp_init = (initproc)da_init;
    DecodeAllocateType.tp_dealloc = (destructor)da_dealloc;
    DecodeAllocateType.tp_traverse = (traverseproc)da_traverse;
    DecodeAllocateType.tp_clear = (inquiry)da_clear;
    DecodeAllocateType.tp_call = PyVectorcall_Call;
    DecodeAllocateType.tp_vectorcall_offset = offsetof(DecodeAllocate, vectorcall);
    DecodeAllocateType.tp_members = da_members;
    DecodeAllocateType.tp_getset = da_getset;
    DecodeAllocateType.tp_methods = da_methods;
    return ccore_add_type(m, &DecodeAllocateType, "DecodeAllocate");
}
