/* HybridLookup: KVCacheManager.get_computed_blocks in C for a coordinator whose lookup is
 * the compiled lookup_request over a lookup kernel (HybridHit: sliding window, chunked
 * local, Mamba, several groups). Installed by pagedkv/core/fast_paths.py
 * (install_lookup) when no component hooks the lookup.
 *
 * Its pure-Python specification is facade_lookups.get_computed_blocks: for a pagedkv
 * Request whose tokens are those the facade left (_owned_tokens), within max_model_len,
 * called with the request alone, it runs lookup_request(find, mgr, request, num_tokens)
 * (ccore_lookup_request.h: the hit found, counted and built) without the facade's Python
 * frame. Every other call goes, before anything changed, to the Python method (the
 * specification and the only place that raises). Included by ccore.c after
 * ccore_lookup_request.h. */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *function, *manager_ref, *request_type, *find;
    Py_ssize_t max_model_len;
    LrTypes types; /* the classes whose steps run in C (ccore_lookup_stats.h) */
} HybridLookup;

static int hl_traverse(HybridLookup *self, visitproc visit, void *arg) {
    Py_VISIT(self->function);
    Py_VISIT(self->manager_ref);
    Py_VISIT(self->request_type);
    Py_VISIT(self->find);
    Py_VISIT(self->types.window_type);
    Py_VISIT(self->types.prefix_type);
    Py_VISIT(self->types.counters_type);
    return 0;
}

static int hl_clear(HybridLookup *self) {
    Py_CLEAR(self->function);
    Py_CLEAR(self->manager_ref);
    Py_CLEAR(self->request_type);
    Py_CLEAR(self->find);
    Py_CLEAR(self->types.window_type);
    Py_CLEAR(self->types.prefix_type);
    Py_CLEAR(self->types.counters_type);
    self->types.slot[0] = -1;
    return 0;
}

static void hl_dealloc(HybridLookup *self) {
    PyObject_GC_UnTrack(self);
    hl_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *hl_call(HybridLookup *self, PyObject *const *args, size_t nargsf,
                         PyObject *kwnames) {
    if (self->function == NULL) {
        PyErr_SetString(PyExc_TypeError, "HybridLookup: not initialised");
        return NULL;
    }
    PyObject *mgr = da_manager_of(self->manager_ref);
    if (mgr == NULL) return NULL;
    PyObject *out;
    Py_ssize_t num_tokens = -1;
    if (PyVectorcall_NARGS(nargsf) == 1 && kwnames == NULL
        && Py_TYPE(args[0]) == (PyTypeObject *)self->request_type) {
        num_tokens = request_num_tokens(self->request_type, args[0]);
    }
    if (num_tokens >= 0 && num_tokens <= self->max_model_len) {
        out = lr_run(self->find, mgr, args[0], num_tokens, &self->types);
    } else {
        out = call_with_first(self->function, mgr, args, nargsf, kwnames);
    }
    Py_DECREF(mgr);
    return out;
}

static int hl_init(HybridLookup *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"function", "manager", "request_type", "find", "max_model_len",
                             "window_type", "prefix_type", "counters_type", NULL};
    PyObject *function, *manager, *rtype, *find, *wtype = Py_None, *ptype = Py_None,
        *ctype = Py_None;
    Py_ssize_t max_len;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!On|OOO:HybridLookup", kwlist, &function,
                                     &manager, &PyType_Type, &rtype, &find, &max_len, &wtype,
                                     &ptype, &ctype)) {
        return -1;
    }
    if ((wtype != Py_None && !PyType_Check(wtype)) || (ptype != Py_None && !PyType_Check(ptype))
        || (ctype != Py_None && !PyType_Check(ctype))) {
        PyErr_SetString(PyExc_TypeError, "HybridLookup: window_type, prefix_type and "
                                         "counters_type are classes or None");
        return -1;
    }
    if (max_len < 0 || !PyCallable_Check(function) || !PyCallable_Check(find)) {
        PyErr_SetString(PyExc_ValueError,
                        "HybridLookup: callables function and find, max_model_len >= 0");
        return -1;
    }
    PyObject *ref = PyWeakref_NewRef(manager, NULL);
    if (ref == NULL) return -1;
    hl_clear(self);
    self->manager_ref = ref;
    self->function = Py_NewRef(function);
    self->request_type = Py_NewRef(rtype);
    self->find = Py_NewRef(find);
    self->max_model_len = max_len;
    self->types.window_type = wtype == Py_None ? NULL : Py_NewRef(wtype);
    self->types.prefix_type = ptype == Py_None ? NULL : Py_NewRef(ptype);
    self->types.counters_type = ctype == Py_None ? NULL : Py_NewRef(ctype);
    lr_resolve_slots(&self->types);
    self->vectorcall = (vectorcallfunc)hl_call;
    return 0;
}

static PyObject *hl_get_doc(HybridLookup *self, void *closure) {
    (void)closure;
    if (self->function == NULL) Py_RETURN_NONE;
    return PyObject_GetAttrString(self->function, "__doc__");
}

static PyGetSetDef hl_getset[] = {
    {"__doc__", (getter)hl_get_doc, NULL, "The Python method's docstring.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef hl_members[] = {
    {"function", T_OBJECT, offsetof(HybridLookup, function), READONLY,
     "The Python get_computed_blocks every other call goes to (with the manager)."},
    {"find", T_OBJECT, offsetof(HybridLookup, find), READONLY,
     "The coordinator's lookup kernel."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject HybridLookupType;

static int ccore_hybrid_lookup_add(PyObject *m) {
    HybridLookupType.tp_name = "pagedkv.core._ccore.HybridLookup";
    HybridLookupType.tp_basicsize = sizeof(HybridLookup);
    HybridLookupType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
                                | Py_TPFLAGS_HAVE_VECTORCALL;
    HybridLookupType.tp_doc = "HybridLookup(function, manager, request_type, find, "
                              "max_model_len, window_type=None, prefix_type=None, "
                              "counters_type=None): "
                              "get_computed_blocks in C.";
    HybridLookupType.tp_new = PyType_GenericNew;
    HybridLookupType.tp_init = (initproc)hl_init;
    HybridLookupType.tp_dealloc = (destructor)hl_dealloc;
    HybridLookupType.tp_traverse = (traverseproc)hl_traverse;
    HybridLookupType.tp_clear = (inquiry)hl_clear;
    HybridLookupType.tp_call = PyVectorcall_Call;
    HybridLookupType.tp_vectorcall_offset = offsetof(HybridLookup, vectorcall);
    HybridLookupType.tp_members = hl_members;
    HybridLookupType.tp_getset = hl_getset;
    return ccore_add_type(m, &HybridLookupType, "HybridLookup");
}

/* GroupsAllocate's lookup entries (declared in ccore_groups.h). */
static PyObject *ga_lookup(GroupsAllocate *self, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames) {
    if (self->lookup == NULL) {
        PyErr_SetString(PyExc_TypeError, "GroupsAllocate: no lookup set (set_lookup)");
        return NULL;
    }
    return hl_call((HybridLookup *)self->lookup, args, nargsf, kwnames);
}

static PyObject *ga_set_lookup(GroupsAllocate *self, PyObject *lookup) {
    if (Py_TYPE(lookup) != &HybridLookupType || ((HybridLookup *)lookup)->function == NULL) {
        PyErr_SetString(PyExc_TypeError, "set_lookup takes an initialised HybridLookup");
        return NULL;
    }
    Py_XSETREF(self->lookup, Py_NewRef(lookup));
    Py_RETURN_NONE;
}

static PyObject *ga_takes_lookups(GroupsAllocate *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(self->lookup != NULL);
}
