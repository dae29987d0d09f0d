/* The vLLM adapter's per-step calls in C: VllmEntry (pagedkv.vllm.manager installs it).
 *
 * vLLM's scheduler calls its KV-cache manager's allocate_slots(request, n,
 * num_lookahead_tokens=0) for every running request every step, and (async scheduling,
 * and sync with prefix caching) cache_blocks(request, num_computed_tokens). The adapter's
 * Python methods (VLLMKVCacheManager.allocate_slots / cache_blocks) translate each call:
 * the request's live view, vLLM's counting as keywords, the answer as vLLM's block
 * objects. VllmEntry does that translation in C for the steady-state call of a request
 * the adapter already holds, and gives every other call (any other keyword or value, a
 * request it does not hold, an admitting request under a watermark), unchanged, to the
 * Python method, before anything changes. So both give the same answers, state and
 * errors; the Python methods are the specification.
 *
 * The steady-state allocate_slots, as the Python method does it:
 *   view = views[request.request_id]; view.request is request;
 *   in_flight = min(request.num_in_flight_tokens, request.num_computed_tokens) (if > 0);
 *   new = facade.allocate_slots(view, n, num_in_flight_tokens=in_flight,
 *                               lenient_counts=True)
 *   None -> None; a new block in some group -> wrap(new); else empty.
 * The steady-state cache_blocks:
 *   facade.cache_blocks(view, min(n, len(request.block_hashes) * hash_block_size)).
 */

typedef struct {
    PyObject_HEAD
    PyObject *adapter;       /* the VLLMKVCacheManager */
    PyObject *facade;        /* its pagedkv KVCacheManager */
    PyObject *views;         /* dict: request id -> RequestView */
    PyObject *allocate_py;   /* VLLMKVCacheManager.allocate_slots (the function) */
    PyObject *cache_py;      /* VLLMKVCacheManager.cache_blocks (the function) */
    PyObject *wrap;          /* new block ids per group -> vLLM's blocks object */
    PyObject *empty;         /* the empty blocks object */
    PyObject *admitting;     /* statuses that count the watermark (a tuple), or None */
    Py_ssize_t hash_block_size;
} VllmEntry;

static PyObject *str_request, *str_status, *str_allocate_slots, *str_cache_blocks,
    *str_num_lookahead_tokens, *kw_engine_counting;

static int ve_traverse(VllmEntry *self, visitproc visit, void *arg) {
    Py_VISIT(self->adapter);
    Py_VISIT(self->facade);
    Py_VISIT(self->views);
    Py_VISIT(self->allocate_py);
    Py_VISIT(self->cache_py);
    Py_VISIT(self->wrap);
    Py_VISIT(self->empty);
    Py_VISIT(self->admitting);
    return 0;
}

static int ve_clear(VllmEntry *self) {
    Py_CLEAR(self->adapter);
    Py_CLEAR(self->facade);
    Py_CLEAR(self->views);
    Py_CLEAR(self->allocate_py);
    Py_CLEAR(self->cache_py);
    Py_CLEAR(self->wrap);
    Py_CLEAR(self->empty);
    Py_CLEAR(self->admitting);
    return 0;
}

static void ve_dealloc(VllmEntry *self) {
    PyObject_GC_UnTrack(self);
    ve_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* function(adapter, *args, **kwargs): the Python method with the call as it came. */
static PyObject *ve_python(VllmEntry *self, PyObject *function, PyObject *const *args,
                           size_t nargsf, PyObject *kwnames) {
    if (self->adapter == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "VllmEntry: cleared");
        return NULL;
    }
    return call_with_first(function, self->adapter, args, nargsf, kwnames);
}

/* The request's live view (a new reference) when the adapter holds this very request,
 * else NULL with no error set (the caller falls back). */
static PyObject *ve_view(VllmEntry *self, PyObject *request) {
    PyObject *rid = PyObject_GetAttr(request, str_request_id);
    if (rid == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *view = PyUnicode_CheckExact(rid) ? da_get(self->views, rid) : NULL;
    Py_DECREF(rid);
    if (view == NULL) return NULL;
    Py_INCREF(view);
    PyObject *held = PyObject_GetAttr(view, str_request);
    if (held == NULL) PyErr_Clear();
    int same = held == request;
    Py_XDECREF(held);
    if (!same) {
        Py_DECREF(view);
        return NULL;
    }
    return view;
}

/* 1 when the call is the steady-state one: exactly (request, n) with n an exact int > 0,
 * and num_lookahead_tokens=0 the only keyword if any; else 0. */
static int ve_plain_call(PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 2 || !PyLong_CheckExact(args[1])) return 0;
    if (kwnames != NULL) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < nk; i++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, i);
            PyObject *value = args[2 + i];
            int is_lookahead = name == str_num_lookahead_tokens
                               || PyUnicode_Compare(name, str_num_lookahead_tokens) == 0;
            if (PyErr_Occurred()) PyErr_Clear();
            if (!is_lookahead || !PyLong_CheckExact(value) || PyObject_IsTrue(value) != 0)
                return 0;
        }
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n <= 0) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* Whether the request is admitting under a watermark: 1, 0, or -1 with an error. */
static int ve_admitting(VllmEntry *self, PyObject *request) {
    if (self->admitting == Py_None) return 0;
    PyObject *status = PyObject_GetAttr(request, str_status);
    if (status == NULL) return -1;
    int in = PySequence_Contains(self->admitting, status);
    Py_DECREF(status);
    return in;
}

static PyObject *ve_allocate(VllmEntry *self, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames) {
    if (self->adapter == NULL || !ve_plain_call(args, nargsf, kwnames))
        return ve_python(self, self->allocate_py, args, nargsf, kwnames);
    PyObject *request = args[0];
    PyObject *view = ve_view(self, request);
    if (view == NULL) return ve_python(self, self->allocate_py, args, nargsf, kwnames);
    int adm = ve_admitting(self, request);
    Py_ssize_t in_flight = adm == 0 ? da_count(request, str_num_in_flight_tokens) : -1;
    if (in_flight > 0) {  /* capped at the computed tokens, as the Python method */
        Py_ssize_t computed = da_count(request, str_num_computed_tokens);
        in_flight = computed < 0 ? -1 : in_flight < computed ? in_flight : computed;
    }
    if (in_flight < 0) {
        Py_DECREF(view);
        if (adm < 0) PyErr_Clear();
        return ve_python(self, self->allocate_py, args, nargsf, kwnames);
    }
    PyObject *allocate = PyObject_GetAttr(self->facade, str_allocate_slots);
    PyObject *flight = PyLong_FromSsize_t(in_flight);
    PyObject *new = NULL;
    if (allocate != NULL && flight != NULL) {
        PyObject *call[4] = {view, args[1], flight, Py_True};
        new = PyObject_Vectorcall(allocate, call, 2, kw_engine_counting);
    }
    Py_XDECREF(allocate);
    Py_XDECREF(flight);
    Py_DECREF(view);
    if (new == NULL || new == Py_None) return new;
    int any = 0;
    if (PyTuple_CheckExact(new)) {
        Py_ssize_t groups = PyTuple_GET_SIZE(new);
        for (Py_ssize_t g = 0; g < groups && !any; g++) {
            PyObject *ids = PyTuple_GET_ITEM(new, g);
            any = PyList_CheckExact(ids) ? PyList_GET_SIZE(ids) > 0 : PyObject_IsTrue(ids);
            if (any < 0) {
                Py_DECREF(new);
                return NULL;
            }
        }
    } else {
        any = 1;  /* not the façade's tuple: let the wrapper say */
    }
    if (!any) {
        Py_DECREF(new);
        Py_INCREF(self->empty);
        return self->empty;
    }
    PyObject *out = PyObject_CallOneArg(self->wrap, new);
    Py_DECREF(new);
    return out;
}

static PyObject *ve_cache_blocks(VllmEntry *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames) {
    if (self->adapter == NULL || kwnames != NULL || PyVectorcall_NARGS(nargsf) != 2
        || !PyLong_CheckExact(args[1]))
        return ve_python(self, self->cache_py, args, nargsf, kwnames);
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n < 0) {
        PyErr_Clear();
        return ve_python(self, self->cache_py, args, nargsf, kwnames);
    }
    PyObject *request = args[0];
    PyObject *view = ve_view(self, request);
    if (view == NULL) return ve_python(self, self->cache_py, args, nargsf, kwnames);
    Py_ssize_t num_hashes = attr_list_len(request, str_block_hashes);
    if (num_hashes < 0) {
        Py_DECREF(view);
        return ve_python(self, self->cache_py, args, nargsf, kwnames);
    }
    Py_ssize_t hashed = num_hashes * self->hash_block_size;
    PyObject *end = n < hashed ? Py_NewRef(args[1]) : PyLong_FromSsize_t(hashed);
    PyObject *cache = PyObject_GetAttr(self->facade, str_cache_blocks);
    PyObject *r = NULL;
    if (end != NULL && cache != NULL) {
        PyObject *call[2] = {view, end};
        r = PyObject_Vectorcall(cache, call, 2, NULL);
    }
    Py_XDECREF(end);
    Py_XDECREF(cache);
    Py_DECREF(view);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
}

static int ve_init(VllmEntry *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"adapter", "facade", "views", "allocate_function",
                            "cache_function", "wrap", "empty", "admitting",
                            "hash_block_size", NULL};
    PyObject *adapter, *facade, *views, *allocate_py, *cache_py, *wrap, *empty, *admitting;
    Py_ssize_t hash_block_size;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!OOOOOn:VllmEntry", names, &adapter,
                                     &facade, &PyDict_Type, &views, &allocate_py, &cache_py,
                                     &wrap, &empty, &admitting, &hash_block_size))
        return -1;
    if (!PyCallable_Check(allocate_py) || !PyCallable_Check(cache_py)
        || !PyCallable_Check(wrap) || hash_block_size <= 0
        || (admitting != Py_None && !PyTuple_Check(admitting))) {
        PyErr_SetString(PyExc_TypeError,
                        "VllmEntry: allocate_function, cache_function and wrap callables, "
                        "admitting a tuple or None, hash_block_size > 0");
        return -1;
    }
    PyObject *objs[8] = {adapter, facade, views, allocate_py, cache_py, wrap, empty,
                         admitting};
    PyObject **slots[8] = {&self->adapter, &self->facade, &self->views, &self->allocate_py,
                           &self->cache_py, &self->wrap, &self->empty, &self->admitting};
    for (int i = 0; i < 8; i++) {
        Py_INCREF(objs[i]);
        Py_XSETREF(*slots[i], objs[i]);
    }
    self->hash_block_size = hash_block_size;
    return 0;
}

static PyMethodDef ve_methods[] = {
    {"allocate_slots", (PyCFunction)(void (*)(void))ve_allocate,
     METH_FASTCALL | METH_KEYWORDS,
     "allocate_slots(request, num_new_tokens, **kwargs): the adapter's allocate_slots."},
    {"cache_blocks", (PyCFunction)(void (*)(void))ve_cache_blocks,
     METH_FASTCALL | METH_KEYWORDS,
     "cache_blocks(request, num_computed_tokens): the adapter's cache_blocks."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject VllmEntryType;

static int ccore_vllm_add(PyObject *m) {
    str_request = PyUnicode_InternFromString("request");
    str_status = PyUnicode_InternFromString("status");
    str_allocate_slots = PyUnicode_InternFromString("allocate_slots");
    str_cache_blocks = PyUnicode_InternFromString("cache_blocks");
    str_num_lookahead_tokens = PyUnicode_InternFromString("num_lookahead_tokens");
    if (!str_request || !str_status || !str_allocate_slots || !str_cache_blocks
        || !str_num_lookahead_tokens) return -1;
    kw_engine_counting = PyTuple_Pack(2, str_num_in_flight_tokens, str_lenient_counts);
    if (kw_engine_counting == NULL) return -1;
    VllmEntryType.tp_name = "pagedkv.core._ccore.VllmEntry";
    VllmEntryType.tp_doc = "The vLLM adapter's allocate_slots and cache_blocks, "
                           "the steady-state call in C (pagedkv.vllm.manager).";
    VllmEntryType.tp_basicsize = sizeof(VllmEntry);
    VllmEntryType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
    VllmEntryType.tp_new = PyType_GenericNew;
    VllmEntryType.tp_init = (initproc)ve_init;
    VllmEntryType.tp_dealloc = (destructor)ve_dealloc;
    VllmEntryType.tp_traverse = (traverseproc)ve_traverse;
    VllmEntryType.tp_clear = (inquiry)ve_clear;
    VllmEntryType.tp_methods = ve_methods;
    return ccore_add_type(m, &VllmEntryType, "VllmEntry");
}
