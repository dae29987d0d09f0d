/* DecodeAllocate: KVCacheManager.allocate_slots's per-step call in C, for one
 * full-attention group (pagedkv/core/manager.py, coordinator_simple.UnitaryCoordinator).
 *
 * The engine calls allocate_slots(request, num_new_tokens) once per running request per
 * step. For a request that already holds blocks, with no keyword argument, the Python
 * path checks a dozen conditions, grows the one block table and registers blocks that
 * became full. This object does the same checks and the same steps in C, calling the
 * pool's get_new_blocks and the coordinator's cache_blocks (Python) only when a block is
 * taken or becomes full. It also takes the engine's counting (vLLM 0.33's async
 * scheduling): the keywords num_in_flight_tokens (an int in [0, computed]) and
 * lenient_counts (a bool), and nothing else; with lenient_counts=True new tokens may run
 * past the request's (slots to max_model_len, never registered) and blocks are
 * registered only as far as the request has tokens and block hashes — the Python
 * method's rule. In-flight tokens change nothing for one full-attention group (no window
 * frees blocks). Anything else — other keywords, a request the manager does not hold,
 * a count that is not a plain int in range, a zeroing group — goes to the Python method
 * unchanged (it validates, raises the documented errors, or takes the general path), and
 * it does so before anything has changed. So both cores return the same values, change
 * the same state and raise the same errors. */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *function;     /* KVCacheManager.allocate_slots, called with the manager */
    PyObject *cache_function; /* KVCacheManager.cache_blocks (or None), the same way */
    PyObject *manager_ref;  /* a weak reference to the manager (no reference cycle) */
    PyObject *live;         /* manager.live_requests: request id -> request */
    PyObject *tables;       /* the group's req_to_blocks: request id -> list of ids */
    PyObject *cached;       /* the group's num_cached_blocks: request id -> int */
    PyObject *pool;         /* the BlockPool (free_queue, get_new_blocks) */
    PyObject *cache_blocks; /* the coordinator's bound cache_blocks */
    PyObject *zeroing;      /* coordinator.zeroing: list of bools */
    PyObject *request_type; /* pagedkv's Request (num_tokens read from all_token_ids) */
    Py_ssize_t block_size;
    Py_ssize_t hash_block_size; /* the pool's: block_hashes cover this many tokens each */
    Py_ssize_t max_model_len;
    PyObject *hit_type;     /* ComputedBlocks: first calls are taken (ccore_admit.h); NULL: not */
    PyObject *lookup_function; /* get_computed_blocks in Python (ccore_lookup.h), or NULL */
    PyObject *free_function;   /* free in Python (ccore_lookup.h), or NULL */
    PyObject *null_recorder;   /* the recorder type that hears nothing, or NULL */
    Py_ssize_t group;       /* the group's index in the pool */
    int fast_lookup;        /* get_computed_blocks in C (no component hooks it) */
    int fast_free;          /* free in C (no component hooks it) */
    int fast_register;      /* a first call's take and registration without Python calls */
} DecodeAllocate;

static PyObject *da_lookup(DecodeAllocate *self, PyObject *request);
static PyObject *da_free(DecodeAllocate *self, PyObject *request);

/* A request's first allocation (ccore_admit.h): 0 with *out set, 1 when the call is not
 * covered (nothing changed: the caller falls back), -1 with an exception. */
static int da_admit(DecodeAllocate *self, PyObject *request, PyObject *rid,
                    Py_ssize_t num_new, PyObject *const *kwvalues, PyObject *kwnames,
                    PyObject **out);

static PyObject *str_request_id, *str_num_computed_tokens, *str_num_tokens,
    *str_all_token_ids, *str_owned_tokens, *str_free_queue, *str_num_free, *str_get_new_blocks,
    *str_block_hashes, *str_num_in_flight_tokens, *str_lenient_counts;

static int da_traverse(DecodeAllocate *self, visitproc visit, void *arg) {
    Py_VISIT(self->function);
    Py_VISIT(self->cache_function);
    Py_VISIT(self->manager_ref);
    Py_VISIT(self->live);
    Py_VISIT(self->tables);
    Py_VISIT(self->cached);
    Py_VISIT(self->pool);
    Py_VISIT(self->cache_blocks);
    Py_VISIT(self->zeroing);
    Py_VISIT(self->request_type);
    Py_VISIT(self->hit_type);
    Py_VISIT(self->lookup_function);
    Py_VISIT(self->free_function);
    Py_VISIT(self->null_recorder);
    return 0;
}

static int da_clear(DecodeAllocate *self) {
    Py_CLEAR(self->function);
    Py_CLEAR(self->cache_function);
    Py_CLEAR(self->manager_ref);
    Py_CLEAR(self->live);
    Py_CLEAR(self->tables);
    Py_CLEAR(self->cached);
    Py_CLEAR(self->pool);
    Py_CLEAR(self->cache_blocks);
    Py_CLEAR(self->zeroing);
    Py_CLEAR(self->request_type);
    Py_CLEAR(self->hit_type);
    Py_CLEAR(self->lookup_function);
    Py_CLEAR(self->free_function);
    Py_CLEAR(self->null_recorder);
    return 0;
}

static void da_dealloc(DecodeAllocate *self) {
    PyObject_GC_UnTrack(self);
    da_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A non-negative Py_ssize_t from an exact int attribute of obj; -1 when it is missing,
 * not an exact int, negative or too large (any error cleared: the caller falls back). */
static Py_ssize_t da_count(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) {
        PyErr_Clear();
        return -1;
    }
    Py_ssize_t n = -1;
    if (PyLong_CheckExact(v)) {
        n = PyLong_AsSsize_t(v);
        if (n == -1) PyErr_Clear();
    }
    Py_DECREF(v);
    return n < 0 ? -1 : n;
}

/* The length of obj.name when it is an exact list, else -1 (a missing attribute's error
 * cleared: the caller falls back). */
static Py_ssize_t attr_list_len(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) {
        PyErr_Clear();
        return -1;
    }
    Py_ssize_t n = PyList_CheckExact(v) ? PyList_GET_SIZE(v) : -1;
    Py_DECREF(v);
    return n;
}

/* The request's token count, or -1 (fall back). A request of request_type (pagedkv's
 * Request) counts its all_token_ids, and only while they are the ones the facade left
 * (_owned_tokens: tokens appended behind its back have no hashes, and the Python method
 * refuses them before allocating); any other request its num_tokens. */
static Py_ssize_t request_num_tokens(PyObject *request_type, PyObject *request) {
    if (Py_TYPE(request) != (PyTypeObject *)request_type) {
        return da_count(request, str_num_tokens);
    }
    Py_ssize_t n = attr_list_len(request, str_all_token_ids);
    if (n < 0) return -1;
    return da_count(request, str_owned_tokens) == n ? n : -1;
}

static Py_ssize_t da_num_tokens(DecodeAllocate *self, PyObject *request) {
    return request_num_tokens(self->request_type, request);
}

/* dict[key] as a borrowed reference, NULL when absent (no error set) or on an error
 * (cleared: the caller falls back). */
static PyObject *da_get(PyObject *dict, PyObject *key) {
    PyObject *v = PyDict_GetItemWithError(dict, key);
    if (v == NULL) PyErr_Clear();
    return v;
}

/* The pool's free block count, or -1 with an exception set. */
static Py_ssize_t da_num_free(DecodeAllocate *self) {
    PyObject *queue = PyObject_GetAttr(self->pool, str_free_queue);
    if (queue == NULL) return -1;
    PyObject *v = PyObject_GetAttr(queue, str_num_free);
    Py_DECREF(queue);
    if (v == NULL) return -1;
    Py_ssize_t n = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    return n;
}

/* The documented error for a call through an allocate_slots whose manager was freed:
 * pagedkv.errors.InvalidArgumentError naming the fix (a raw ReferenceError if even the
 * import fails). */
static void da_manager_gone(void) {
    PyObject *errors = PyImport_ImportModule("pagedkv.errors");
    PyObject *cls = errors ? PyObject_GetAttrString(errors, "InvalidArgumentError") : NULL;
    Py_XDECREF(errors);
    if (cls == NULL) {
        PyErr_Clear();
        cls = Py_NewRef(PyExc_ReferenceError);
    }
    PyErr_SetString(cls, "allocate_slots was called after its KVCacheManager was freed (the "
                         "compiled core's bound allocate_slots holds its manager weakly); keep "
                         "a reference to the manager for as long as you call it");
    Py_DECREF(cls);
}

/* The manager behind the weak reference (a new reference), or NULL with an exception
 * when it is gone. */
static PyObject *da_manager_of(PyObject *manager_ref) {
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *mgr = NULL;
    if (PyWeakref_GetRef(manager_ref, &mgr) < 0) return NULL;
#else
    PyObject *mgr = PyWeakref_GetObject(manager_ref);
    if (mgr == NULL) return NULL;
    if (mgr == Py_None) mgr = NULL;
    Py_XINCREF(mgr);
#endif
    if (mgr == NULL) {
        da_manager_gone();
    }
    return mgr;
}

static PyObject *da_manager(DecodeAllocate *self) {
    return da_manager_of(self->manager_ref);
}

/* function(first, *args, **kwargs): a call as it came, with `first` in front. */
static PyObject *call_with_first(PyObject *function, PyObject *first, PyObject *const *args,
                                 size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t total = nargs + (kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[16];
    PyObject **stack =
        total + 1 <= 16 ? small : PyMem_Malloc(sizeof(PyObject *) * (size_t)(total + 1));
    if (stack == NULL) return PyErr_NoMemory();
    stack[0] = first;
    if (total) memcpy(stack + 1, args, sizeof(PyObject *) * (size_t)total);
    PyObject *out = PyObject_Vectorcall(function, stack, (size_t)(nargs + 1), kwnames);
    if (stack != small) PyMem_Free(stack);
    return out;
}

/* The Python method `function` on the manager (held by manager_ref) with the same
 * arguments. */
static PyObject *call_python(PyObject *manager_ref, PyObject *function,
                             PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyObject *mgr = da_manager_of(manager_ref);
    if (mgr == NULL) return NULL;
    PyObject *out = call_with_first(function, mgr, args, nargsf, kwnames);
    Py_DECREF(mgr);
    return out;
}

/* allocate_slots in Python with the same arguments. */
static PyObject *da_fallback(DecodeAllocate *self, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames) {
    return call_python(self->manager_ref, self->function, args, nargsf, kwnames);
}

/* The engine-counting keywords of a call: 1 with *lenient set when every keyword is
 * num_in_flight_tokens (an exact int in [0, computed] — it frees nothing for one
 * full-attention group) or lenient_counts (exactly True or False), else 0 (fall back;
 * the Python method validates). Reads no attribute and changes nothing. */
static int da_keywords(PyObject *const *values, PyObject *kwnames, Py_ssize_t computed,
                       int *lenient) {
    *lenient = 0;
    if (kwnames == NULL) return 1;
    Py_ssize_t n = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *v = values[i];
        if (name == str_lenient_counts
            || PyUnicode_Compare(name, str_lenient_counts) == 0) {
            if (v != Py_True && v != Py_False) return 0;
            *lenient = v == Py_True;
        } else if (name == str_num_in_flight_tokens
                   || PyUnicode_Compare(name, str_num_in_flight_tokens) == 0) {
            if (!PyLong_CheckExact(v)) return 0;
            Py_ssize_t k = PyLong_AsSsize_t(v);
            if (k < 0 || k > computed) {
                if (k == -1) PyErr_Clear();
                return 0;
            }
        } else {
            if (PyErr_Occurred()) PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

/* Under lenient_counts, how far blocks are registered: the end of the new tokens, capped
 * at the request's tokens and at its block hashes (each covering hash_block_size tokens);
 * -1 (fall back) when block_hashes is not a list. */
static Py_ssize_t lenient_cache_end(PyObject *request, Py_ssize_t hash_block_size,
                                    Py_ssize_t end, Py_ssize_t num_tokens) {
    Py_ssize_t hashed = attr_list_len(request, str_block_hashes);
    if (hashed < 0 || hashed > PY_SSIZE_T_MAX / hash_block_size) return -1;
    hashed *= hash_block_size;
    if (end > num_tokens) end = num_tokens;
    return end < hashed ? end : hashed;
}

static PyObject *da_call(DecodeAllocate *self, PyObject *const *args, size_t nargsf,
                         PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 2) return da_fallback(self, args, nargsf, kwnames);
    PyObject *mgr = da_manager(self); /* a freed manager fails every call, not only some */
    if (mgr == NULL) return NULL;
    Py_DECREF(mgr); /* alive: the caller's request and this call's state keep what we use */
    PyObject *request = args[0], *num_new_obj = args[1];
    if (!PyLong_CheckExact(num_new_obj)) return da_fallback(self, args, nargsf, kwnames);
    Py_ssize_t num_new = PyLong_AsSsize_t(num_new_obj);
    if (num_new <= 0) {
        if (num_new == -1) PyErr_Clear();
        return da_fallback(self, args, nargsf, kwnames);
    }
    PyObject *rid = PyObject_GetAttr(request, str_request_id);
    if (rid == NULL) {
        PyErr_Clear();
        return da_fallback(self, args, nargsf, kwnames);
    }
    /* A live request: this very object holds blocks under its id. */
    PyObject *table = NULL, *cached = NULL;
    Py_ssize_t computed = -1, num_tokens = -1;
    if (!PyUnicode_CheckExact(rid)) goto fallback;
    PyObject *held_by = da_get(self->live, rid);
    if (held_by == NULL && self->hit_type != NULL) { /* a first call: ccore_admit.h */
        PyObject *admitted = NULL;
        int rc = da_admit(self, request, rid, num_new, args + 2, kwnames, &admitted);
        if (rc == 1) goto fallback;
        Py_DECREF(rid);
        return rc < 0 ? NULL : admitted;
    }
    if (held_by != request) goto fallback;
    computed = da_count(request, str_num_computed_tokens);
    if (computed < 0) goto fallback;
    int lenient;
    if (!da_keywords(args + 2, kwnames, computed, &lenient)) goto fallback;
    num_tokens = da_num_tokens(self, request);
    if (num_tokens < 0 || num_tokens > self->max_model_len) goto fallback;
    if (lenient ? num_new > PY_SSIZE_T_MAX - computed
                : (num_new > num_tokens || computed > num_tokens - num_new)) goto fallback;
    Py_ssize_t end = computed + num_new; /* strict: <= num_tokens <= max_model_len */
    Py_ssize_t slots_end = end < self->max_model_len ? end : self->max_model_len;
    Py_ssize_t cache_end = end;
    if (lenient) {
        cache_end = lenient_cache_end(request, self->hash_block_size, end, num_tokens);
        if (cache_end < 0) goto fallback;
    }
    table = da_get(self->tables, rid);
    cached = da_get(self->cached, rid);
    if (table == NULL || !PyList_CheckExact(table) || cached == NULL
        || !PyLong_CheckExact(cached)) {
        table = NULL; /* not held yet */
        goto fallback;
    }
    Py_INCREF(table); /* held to the end: the pool's Python code runs below */

    Py_ssize_t need =
        (slots_end + self->block_size - 1) / self->block_size - PyList_GET_SIZE(table);
    PyObject *new_ids;
    if (need > 0) {
        PyObject *zero = PyList_GET_SIZE(self->zeroing) ? PyList_GET_ITEM(self->zeroing, 0)
                                                        : Py_False;
        if (zero != Py_False) goto fallback; /* new blocks are recorded for zeroing */
        Py_ssize_t num_free = da_num_free(self);
        if (num_free < 0) {
            PyErr_Clear();
            goto fallback;
        }
        if (need > num_free) { /* out of blocks: a normal no, nothing changed */
            Py_DECREF(table);
            Py_DECREF(rid);
            Py_RETURN_NONE;
        }
        PyObject *n_obj = PyLong_FromSsize_t(need);
        if (n_obj == NULL) goto error;
        new_ids = PyObject_CallMethodOneArg(self->pool, str_get_new_blocks, n_obj);
        Py_DECREF(n_obj);
        if (new_ids == NULL) goto error;
        Py_ssize_t len = PyList_GET_SIZE(table);
        int rc = PyList_CheckExact(new_ids) ? PyList_SetSlice(table, len, len, new_ids) : -1;
        if (rc < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "get_new_blocks returned a non-list");
            }
            Py_DECREF(new_ids);
            goto error;
        }
    } else {
        new_ids = PyList_New(0);
        if (new_ids == NULL) goto error;
    }
    /* Register the blocks that became full (the coordinator reads the counts again). */
    cached = da_get(self->cached, rid);
    Py_ssize_t num_cached = cached != NULL ? PyLong_AsSsize_t(cached) : -1;
    if (num_cached == -1 && PyErr_Occurred()) PyErr_Clear();
    if (cached == NULL || cache_end / self->block_size > num_cached) {
        PyObject *end_obj = PyLong_FromSsize_t(cache_end);
        if (end_obj == NULL) {
            Py_DECREF(new_ids);
            goto error;
        }
        PyObject *call_args[2] = {request, end_obj};
        PyObject *r = PyObject_Vectorcall(self->cache_blocks, call_args, 2, NULL);
        Py_DECREF(end_obj);
        if (r == NULL) {
            Py_DECREF(new_ids);
            goto error;
        }
        Py_DECREF(r);
    }
    Py_DECREF(table);
    Py_DECREF(rid);
    PyObject *out = PyTuple_New(1);
    if (out == NULL) {
        Py_DECREF(new_ids);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, new_ids);
    return out;

fallback:
    Py_XDECREF(table);
    Py_DECREF(rid);
    return da_fallback(self, args, nargsf, kwnames);
error:
    Py_XDECREF(table);
    Py_DECREF(rid);
    return NULL;
}

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
