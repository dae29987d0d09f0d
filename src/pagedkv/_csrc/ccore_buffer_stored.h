/* BufferStored: EventBuffer.stored (pagedkv/core/recorder.py) in C for the compiled
 * registration (GroupsAllocate, ccore_hybrid_step_register.h), so a registered run's
 * stored record is built without a Python frame: the group's info, the request's
 * extras, the extra keys per listed position (the hasher's recorded keys when the group's
 * block is one hash block, else the extras' block_keys), hashing.event_extra_keys on
 * each (in C for lists of [str tag, ...] lists, else the Python function), then the
 * recorder's record kernel with the same 17 arguments. Any run it cannot read plainly
 * (a skipped entry that is not an int, a recorded-keys container that is not a list) goes
 * to the recorder's own stored. fast_paths.py builds one only for an exact EventBuffer.
 * Included by ccore_groups.h before its registration. */

typedef struct {
    PyObject_HEAD
    /* recorder: the EventBuffer; groups, announced, record: its lists, dict and record
     * kernel (the same objects for its life); cls, medium, convert: BlockStored,
     * MEDIUM_GPU, event_extra_keys; python: the recorder's bound stored */
    PyObject *recorder, *groups, *announced, *record, *cls, *medium, *convert, *python;
    Py_ssize_t hash_block_size;
} BufferStored;

#define BS_OBJS(X) X(recorder) X(groups) X(announced) X(record) X(cls) X(medium) X(convert) \
    X(python)

static PyObject *str_bs_events, *str_bs_hash_extras, *str_bs_lora, *str_bs_adapter_id,
    *str_bs_name, *str_bs_block_extra_keys, *str_bs_all_token_ids, *str_bs_block_keys,
    *str_bs_block_size, *str_bs_kind, *str_bs_sliding_window, *str_bs_groups,
    *str_bs_announced, *str_bs_record, *str_bs_hash_block_size, *str_bs_stored;

static PyTypeObject BufferStoredType;

/* event_extra_keys(keys): a new reference, NULL with an exception. */
static PyObject *bs_event_keys(BufferStored *self, PyObject *keys) {
    if (keys == Py_None) return Py_NewRef(Py_None);
    if (!PyList_CheckExact(keys)) return PyObject_CallOneArg(self->convert, keys);
    Py_ssize_t n = PyList_GET_SIZE(keys);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *key = PyList_GET_ITEM(keys, k);
        if (!PyList_CheckExact(key) || PyList_GET_SIZE(key) < 2
            || !PyUnicode_CheckExact(PyList_GET_ITEM(key, 0))) {
            return PyObject_CallOneArg(self->convert, keys);
        }
    }
    PyObject *out = PyList_New(n);
    for (Py_ssize_t k = 0; out != NULL && k < n; k++) {
        PyObject *key = PyList_GET_ITEM(keys, k);
        PyObject *v = PyUnicode_CompareWithASCIIString(PyList_GET_ITEM(key, 0), "mm") == 0
                          ? PyList_GetSlice(key, 1, PyList_GET_SIZE(key))
                          : Py_NewRef(PyList_GET_ITEM(key, 1));
        if (v == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, k, v);
    }
    return out;
}

/* The listed positions of [start, end) (those not in `skipped`) into *pos (PyMem, *n of
 * them): 1, 0 when a skipped entry is not an exact int (the Python method reads it), -1
 * with an exception. */
static int bs_positions(PyObject *skipped, Py_ssize_t start, Py_ssize_t end,
                        Py_ssize_t **pos, Py_ssize_t *n) {
    Py_ssize_t len = end > start ? end - start : 0, m = 0;
    char *left_out = PyMem_Calloc((size_t)(len ? len : 1), 1);
    *pos = PyMem_New(Py_ssize_t, (size_t)(len ? len : 1));
    if (left_out == NULL || *pos == NULL) {
        PyMem_Free(left_out);
        PyMem_Free(*pos);
        *pos = NULL;
        PyErr_NoMemory();
        return -1;
    }
    int truth = PyObject_IsTrue(skipped), rc = truth < 0 ? -1 : 1;
    if (truth > 0) {
        PyObject *seq = PySequence_Fast(skipped, "skipped must be a sequence");
        rc = seq == NULL ? -1 : 1;
        for (Py_ssize_t j = 0; rc == 1 && j < PySequence_Fast_GET_SIZE(seq); j++) {
            PyObject *v = PySequence_Fast_GET_ITEM(seq, j);
            if (!PyLong_CheckExact(v)) {
                rc = 0;
                break;
            }
            Py_ssize_t i = PyLong_AsSsize_t(v);
            if (i == -1 && PyErr_Occurred()) PyErr_Clear(); /* huge: never in range */
            else if (i >= start && i < end) left_out[i - start] = 1;
        }
        Py_XDECREF(seq);
    }
    for (Py_ssize_t i = 0; rc == 1 && i < len; i++) {
        if (!left_out[i]) (*pos)[m++] = start + i;
    }
    PyMem_Free(left_out);
    *n = m;
    if (rc != 1) {
        PyMem_Free(*pos);
        *pos = NULL;
    }
    return rc;
}

/* _extra_keys(request, extras, positions, bs, end): a new list, NULL with an exception,
 * or Py_None (not a new reference) when the recorded keys are not a list (fall back). */
static PyObject *bs_extra_keys(BufferStored *self, PyObject *request, PyObject *extras,
                               const Py_ssize_t *pos, Py_ssize_t n, Py_ssize_t bs,
                               Py_ssize_t end) {
    PyObject *recorded = NULL;
    if (bs == self->hash_block_size) {
        recorded = PyObject_GetAttr(request, str_bs_block_extra_keys);
        if (recorded == NULL) return NULL;
        Py_ssize_t have = PyObject_Length(recorded);
        if (have < 0) {
            Py_DECREF(recorded);
            return NULL;
        }
        if (have < end) Py_CLEAR(recorded);
        else if (!PyList_CheckExact(recorded)) {
            Py_DECREF(recorded);
            return Py_None;
        }
    }
    PyObject *out = PyList_New(n);
    for (Py_ssize_t k = 0; out != NULL && k < n; k++) {
        Py_ssize_t i = pos[k];
        PyObject *keys, *v;
        if (recorded != NULL) {
            if (i >= PyList_GET_SIZE(recorded)) { /* the list shrank under Python code */
                PyErr_SetString(PyExc_IndexError, "list index out of range");
                Py_CLEAR(out);
                break;
            }
            keys = Py_NewRef(PyList_GET_ITEM(recorded, i));
        } else {
            keys = PyObject_CallMethod(extras, "block_keys", "nn", i * bs, (i + 1) * bs);
        }
        v = keys == NULL ? NULL : bs_event_keys(self, keys);
        Py_XDECREF(keys);
        if (v == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, k, v);
    }
    Py_XDECREF(recorded);
    return out;
}

/* The record kernel's call once the extras are known (extra: a list or None). */
static int bs_record(BufferStored *self, PyObject *request, PyObject *blocks,
                     PyObject *hashes, PyObject *start, PyObject *end, PyObject *skipped,
                     PyObject *group, PyObject *info, PyObject *lora, PyObject *extra) {
    PyObject *events = PyObject_GetAttr(self->recorder, str_bs_events);
    PyObject *tokens = events ? PyObject_GetAttr(request, str_bs_all_token_ids) : NULL;
    PyObject *bs = tokens ? PyObject_GetAttr(info, str_bs_block_size) : NULL;
    PyObject *kind = bs ? PyObject_GetAttr(info, str_bs_kind) : NULL;
    PyObject *window = kind ? PyObject_GetAttr(info, str_bs_sliding_window) : NULL;
    PyObject *lora_id = NULL, *lora_name = NULL, *r = NULL;
    int has_lora = window == NULL ? -1 : lora == Py_None ? 0 : PyObject_IsTrue(lora);
    if (has_lora == 0) {
        lora_id = Py_NewRef(Py_None);
        lora_name = Py_NewRef(Py_None);
    } else if (has_lora > 0) {
        lora_id = PyObject_GetAttr(lora, str_bs_adapter_id);
        lora_name = lora_id ? PyObject_GetAttr(lora, str_bs_name) : NULL;
    }
    if (lora_name != NULL) {
        PyObject *a[18] = {NULL, events, self->announced, self->cls, blocks, hashes, start,
                           end, skipped, tokens, bs, lora_id, self->medium, lora_name,
                           extra, group, kind, window};
        r = PyObject_Vectorcall(self->record, a + 1, 17 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                NULL);
    }
    Py_XDECREF(events);
    Py_XDECREF(tokens);
    Py_XDECREF(bs);
    Py_XDECREF(kind);
    Py_XDECREF(window);
    Py_XDECREF(lora_id);
    Py_XDECREF(lora_name);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* The recorder's own stored((request, blocks, hashes, start, end, skipped, group)). */
static int bs_python(BufferStored *self, PyObject *request, PyObject *blocks,
                     PyObject *hashes, Py_ssize_t start, Py_ssize_t end, PyObject *skipped,
                     PyObject *group) {
    PyObject *run = Py_BuildValue("(OOOnnOO)", request, blocks, hashes, start, end, skipped,
                                  group);
    PyObject *r = run == NULL ? NULL : PyObject_CallOneArg(self->python, run);
    Py_XDECREF(run);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* EventBuffer.stored on the run's fields. 0, or -1 with an exception. */
static int bs_stored(BufferStored *self, PyObject *request, PyObject *blocks,
                     PyObject *hashes, Py_ssize_t start, Py_ssize_t end, PyObject *skipped,
                     PyObject *group) {
    PyObject *info = PyObject_GetItem(self->groups, group);
    PyObject *bs_obj = info ? PyObject_GetAttr(info, str_bs_block_size) : NULL;
    Py_ssize_t bs = bs_obj ? PyLong_AsSsize_t(bs_obj) : -1;
    PyObject *extras = bs == -1 && PyErr_Occurred() ? NULL
                       : PyObject_GetAttr(request, str_bs_hash_extras);
    PyObject *lora = NULL, *extra = NULL, *start_obj = NULL, *end_obj = NULL;
    Py_ssize_t *pos = NULL, n = 0;
    int rc = -1;
    if (extras == Py_None) {
        lora = Py_NewRef(Py_None);
        extra = Py_NewRef(Py_None);
    } else if (extras != NULL && (lora = PyObject_GetAttr(extras, str_bs_lora)) != NULL) {
        int plain = bs_positions(skipped, start, end, &pos, &n);
        if (plain == 0) rc = bs_python(self, request, blocks, hashes, start, end, skipped, group);
        extra = plain <= 0 ? NULL : bs_extra_keys(self, request, extras, pos, n, bs, end);
        if (extra == Py_None) {
            extra = NULL;
            rc = bs_python(self, request, blocks, hashes, start, end, skipped, group);
        }
    }
    if (extra != NULL && (start_obj = PyLong_FromSsize_t(start)) != NULL
        && (end_obj = PyLong_FromSsize_t(end)) != NULL) {
        rc = bs_record(self, request, blocks, hashes, start_obj, end_obj, skipped, group, info,
                       lora, extra);
    }
    PyMem_Free(pos);
    Py_XDECREF(info);
    Py_XDECREF(bs_obj);
    Py_XDECREF(extras);
    Py_XDECREF(lora);
    Py_XDECREF(extra);
    Py_XDECREF(start_obj);
    Py_XDECREF(end_obj);
    return rc;
}

/* BufferStored(run): EventBuffer.stored(run) for a 7-tuple run. */
static PyObject *bs_call(BufferStored *self, PyObject *args, PyObject *kwds) {
    PyObject *run;
    if (kwds != NULL || !PyArg_ParseTuple(args, "O!:BufferStored", &PyTuple_Type, &run)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "BufferStored(run)");
        return NULL;
    }
    PyObject *request, *blocks, *hashes, *skipped, *group;
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(run, "OOOnnOO:BufferStored run", &request, &blocks, &hashes, &start,
                          &end, &skipped, &group)) {
        return NULL;
    }
    if (bs_stored(self, request, blocks, hashes, start, end, skipped, group) < 0) return NULL;
    Py_RETURN_NONE;
}

static int bs_init(BufferStored *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"recorder", "record_class", "medium", "event_extra_keys", NULL};
    PyObject *recorder, *cls, *medium, *convert;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!OO:BufferStored", kwlist, &recorder,
                                     &PyType_Type, &cls, &medium, &convert)) {
        return -1;
    }
#define BS_CLEAR(f) Py_CLEAR(self->f);
    BS_OBJS(BS_CLEAR)
    self->recorder = Py_NewRef(recorder);
    self->cls = Py_NewRef(cls);
    self->medium = Py_NewRef(medium);
    self->convert = Py_NewRef(convert);
    PyObject *hbs = NULL;
    if ((self->groups = PyObject_GetAttr(recorder, str_bs_groups)) == NULL
        || (self->announced = PyObject_GetAttr(recorder, str_bs_announced)) == NULL
        || (self->record = PyObject_GetAttr(recorder, str_bs_record)) == NULL
        || (self->python = PyObject_GetAttr(recorder, str_bs_stored)) == NULL
        || (hbs = PyObject_GetAttr(recorder, str_bs_hash_block_size)) == NULL) {
        return -1;
    }
    self->hash_block_size = PyLong_AsSsize_t(hbs);
    Py_DECREF(hbs);
    if (self->hash_block_size == -1 && PyErr_Occurred()) return -1;
    if (!PyCallable_Check(self->record) || !PyCallable_Check(convert)) {
        PyErr_SetString(PyExc_TypeError, "BufferStored: the record kernel and "
                                         "event_extra_keys must be callables");
        return -1;
    }
    return 0;
}

static int bs_traverse(BufferStored *self, visitproc visit, void *arg) {
#define BS_VISIT(f) Py_VISIT(self->f);
    BS_OBJS(BS_VISIT)
    return 0;
}

static int bs_clear(BufferStored *self) {
    BS_OBJS(BS_CLEAR)
    return 0;
}

static void bs_dealloc(BufferStored *self) {
    PyObject_GC_UnTrack(self);
    bs_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int ccore_buffer_stored_add(PyObject *m) {
    const char *names[] = {"_events", "hash_extras", "lora", "adapter_id", "name",
                           "block_extra_keys", "all_token_ids", "block_keys", "block_size",
                           "kind", "sliding_window", "groups", "_announced", "_record",
                           "hash_block_size", "stored"};
    PyObject **slots[] = {&str_bs_events, &str_bs_hash_extras, &str_bs_lora,
                          &str_bs_adapter_id, &str_bs_name, &str_bs_block_extra_keys,
                          &str_bs_all_token_ids, &str_bs_block_keys, &str_bs_block_size,
                          &str_bs_kind, &str_bs_sliding_window, &str_bs_groups,
                          &str_bs_announced, &str_bs_record, &str_bs_hash_block_size,
                          &str_bs_stored};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if ((*slots[i] = PyUnicode_InternFromString(names[i])) == NULL) return -1;
    }
    BufferStoredType.tp_name = "pagedkv.core._ccore.BufferStored";
    BufferStoredType.tp_doc = "EventBuffer.stored in C (same record, same calls).";
    BufferStoredType.tp_basicsize = sizeof(BufferStored);
    BufferStoredType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
    BufferStoredType.tp_new = PyType_GenericNew;
    BufferStoredType.tp_init = (initproc)bs_init;
    BufferStoredType.tp_dealloc = (destructor)bs_dealloc;
    BufferStoredType.tp_traverse = (traverseproc)bs_traverse;
    BufferStoredType.tp_clear = (inquiry)bs_clear;
    BufferStoredType.tp_call = (ternaryfunc)bs_call;
    return ccore_add_type(m, &BufferStoredType, "BufferStored");
}
