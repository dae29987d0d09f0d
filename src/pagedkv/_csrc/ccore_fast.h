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

#include "ccore_fast_type.h"
