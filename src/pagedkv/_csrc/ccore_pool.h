/* The pool's per-block loops: FreeQueue (pagedkv.core.free_queue.FreeBlockQueue's
 * doubly linked list in two C int arrays, same methods, same order); the ref-count loops
 * over it are in ccore_refs.h. Included once, by ccore.c. */
#include <stdint.h>

typedef struct {
    PyObject_HEAD
    int32_t *next;
    int32_t *prev;
    Py_ssize_t head; /* sentinel slots past the last block: head, tail */
    Py_ssize_t tail;
    Py_ssize_t num_free;
    PyObject **id_objs; /* block b's int object once made (b < head), kept till dealloc */
} FreeQueue;

static PyTypeObject FreeQueueType;

/* Block id `obj` as an index into the queue's blocks [0, head); -1 with IndexError set. */
static Py_ssize_t fq_id(FreeQueue *q, PyObject *obj) {
    Py_ssize_t b = PyLong_Check(obj) ? PyLong_AsSsize_t(obj) : -1;
    if (b < 0 || b >= q->head) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_IndexError, "block id %R outside the pool", obj);
        return -1;
    }
    return b;
}

/* Drop the kept int objects of the block ids (the queue is resized or released). */
static void fq_forget_ids(FreeQueue *q) {
    if (q->id_objs == NULL) return;
    for (Py_ssize_t i = 0; i < q->head; i++) Py_XDECREF(q->id_objs[i]);
    PyMem_Free(q->id_objs);
    q->id_objs = NULL;
}

/* Block b's int object (a new reference; b in [0, head)), made once and kept: a take
 * hands out the same objects as vLLM's blocks keep their block_id, instead of one new
 * int per block per take. NULL with an exception. */
static PyObject *fq_id_obj(FreeQueue *q, int32_t b) {
    if (q->id_objs == NULL) {
        q->id_objs = PyMem_Calloc((size_t)(q->head ? q->head : 1), sizeof(PyObject *));
        if (q->id_objs == NULL) return PyErr_NoMemory();
    }
    if (q->id_objs[b] == NULL) {
        q->id_objs[b] = PyLong_FromLong(b);
        if (q->id_objs[b] == NULL) return NULL;
    }
    return Py_NewRef(q->id_objs[b]);
}

static int fq_init(FreeQueue *q, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"num_blocks", "first_id", NULL};
    Py_ssize_t n, first = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n|$n:FreeQueue", kwlist, &n, &first)) return -1;
    if (n < 0 || n > INT32_MAX - 2 || first < 0) {
        PyErr_SetString(PyExc_ValueError, "FreeQueue: num_blocks out of range");
        return -1;
    }
    fq_forget_ids(q);
    PyMem_Free(q->next);
    PyMem_Free(q->prev);
    q->next = PyMem_Malloc(sizeof(int32_t) * (size_t)(n + 2));
    q->prev = PyMem_Malloc(sizeof(int32_t) * (size_t)(n + 2));
    if (q->next == NULL || q->prev == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n + 2; i++) {
        q->next[i] = (int32_t)(i + 1);
        q->prev[i] = (int32_t)(i - 1);
    }
    q->head = n;
    q->tail = n + 1;
    if (first < n) {
        q->next[n] = (int32_t)first;
        q->prev[first] = (int32_t)n;
        q->next[n - 1] = (int32_t)(n + 1);
        q->prev[n + 1] = (int32_t)(n - 1);
        q->num_free = n - first;
    } else {
        q->next[n] = (int32_t)(n + 1);
        q->prev[n + 1] = (int32_t)n;
        q->num_free = 0;
    }
    return 0;
}

static void fq_dealloc(FreeQueue *q) {
    fq_forget_ids(q);
    PyMem_Free(q->next);
    PyMem_Free(q->prev);
    Py_TYPE(q)->tp_free((PyObject *)q);
}

static void fq_unlink(FreeQueue *q, Py_ssize_t b) {
    int32_t p = q->prev[b], nx = q->next[b];
    q->next[p] = nx;
    q->prev[nx] = p;
    q->num_free--;
}

static void fq_push_back(FreeQueue *q, Py_ssize_t b) {
    int32_t last = q->prev[q->tail];
    q->next[last] = (int32_t)b;
    q->prev[b] = last;
    q->next[b] = (int32_t)q->tail;
    q->prev[q->tail] = (int32_t)b;
    q->num_free++;
}

static PyObject *fq_popleft(FreeQueue *q, PyObject *unused) {
    (void)unused;
    if (q->num_free <= 0) return PyErr_Format(PyExc_IndexError, "popleft from an empty queue");
    Py_ssize_t b = q->next[q->head];
    fq_unlink(q, b);
    return PyLong_FromSsize_t(b);
}

/* The queue's n front ids, unlinked: a new list of them (their values also in ids_c when
 * it is not NULL), or NULL with an exception and the queue unchanged. Every id is checked
 * below `limit` (a caller indexing other arrays with them passes their size). The one
 * front pop: popleft_n and the compiled first take (ccore_lookup.h) both use it.
 * Precondition: 0 <= n <= num_free. */
static PyObject *fq_pop_front(FreeQueue *q, Py_ssize_t n, Py_ssize_t limit, int32_t *ids_c) {
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    int32_t b = q->next[q->head];
    for (Py_ssize_t i = 0; i < n; i++) {
        if (b < 0 || b >= limit || b >= q->head) {
            Py_DECREF(out);
            return PyErr_Format(PyExc_IndexError, "free queue id %d out of range", (int)b);
        }
        PyObject *id = fq_id_obj(q, b);
        if (id == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, id);
        if (ids_c != NULL) ids_c[i] = b;
        b = q->next[b];
    }
    q->next[q->head] = b;
    q->prev[b] = (int32_t)q->head;
    q->num_free -= n;
    return out;
}

static PyObject *fq_popleft_n(FreeQueue *q, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0 || n > q->num_free) {
        return PyErr_Format(PyExc_IndexError, "popleft_n(%zd) with %zd free", n, q->num_free);
    }
    return fq_pop_front(q, n, q->head, NULL);
}

static PyObject *fq_remove(FreeQueue *q, PyObject *arg) {
    Py_ssize_t b = fq_id(q, arg);
    if (b < 0) return NULL;
    fq_unlink(q, b);
    Py_RETURN_NONE;
}

static PyObject *fq_append(FreeQueue *q, PyObject *arg) {
    Py_ssize_t b = fq_id(q, arg);
    if (b < 0) return NULL;
    fq_push_back(q, b);
    Py_RETURN_NONE;
}

/* The ids of `seq` (a list or tuple) checked into buf (PyMem, caller frees); -1 on error. */
static Py_ssize_t fq_ids(FreeQueue *q, PyObject *seq, int32_t **buf) {
    PyObject *fast = PySequence_Fast(seq, "expected a sequence of block ids");
    if (fast == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    *buf = PyMem_Malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (*buf == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t b = fq_id(q, items[i]);
        if (b < 0) {
            Py_DECREF(fast);
            PyMem_Free(*buf);
            *buf = NULL;
            return -1;
        }
        (*buf)[i] = (int32_t)b;
    }
    Py_DECREF(fast);
    return n;
}

/* Link ids[0 .. n) in order between `before` and `after`. */
static void fq_splice(FreeQueue *q, const int32_t *ids, Py_ssize_t n, int32_t before,
                      int32_t after) {
    int32_t last = before;
    for (Py_ssize_t i = 0; i < n; i++) {
        q->next[last] = ids[i];
        q->prev[ids[i]] = last;
        last = ids[i];
    }
    q->next[last] = after;
    q->prev[after] = last;
    q->num_free += n;
}

static PyObject *fq_append_n(FreeQueue *q, PyObject *arg) {
    int32_t *ids;
    Py_ssize_t n = fq_ids(q, arg, &ids);
    if (n < 0) return NULL;
    if (n) fq_splice(q, ids, n, q->prev[q->tail], (int32_t)q->tail);
    PyMem_Free(ids);
    Py_RETURN_NONE;
}

static PyObject *fq_prepend_n(FreeQueue *q, PyObject *arg) {
    int32_t *ids;
    Py_ssize_t n = fq_ids(q, arg, &ids);
    if (n < 0) return NULL;
    if (n) fq_splice(q, ids, n, (int32_t)q->head, q->next[q->head]);
    PyMem_Free(ids);
    Py_RETURN_NONE;
}

static PyObject *fq_to_list(FreeQueue *q, PyObject *unused) {
    (void)unused;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    Py_ssize_t guard = q->head + 2;
    for (int32_t b = q->next[q->head]; b != q->tail && guard-- > 0; b = q->next[b]) {
        PyObject *id = PyLong_FromLong(b);
        if (id == NULL || PyList_Append(out, id) < 0) {
            Py_XDECREF(id);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(id);
    }
    return out;
}

/* Lazy iteration front to back, as FreeBlockQueue's generator (the queue must not
 * change meanwhile). */
typedef struct {
    PyObject_HEAD
    FreeQueue *queue;
    int32_t at;
} FreeQueueIter;

static PyTypeObject FreeQueueIterType;

static PyObject *fq_iter(FreeQueue *q) {
    FreeQueueIter *it = PyObject_New(FreeQueueIter, &FreeQueueIterType);
    if (it == NULL) return NULL;
    Py_INCREF(q);
    it->queue = q;
    it->at = q->next[q->head];
    return (PyObject *)it;
}

static PyObject *fqi_next(FreeQueueIter *it) {
    FreeQueue *q = it->queue;
    if (it->at < 0 || it->at >= q->head) return NULL;  /* the tail: done */
    int32_t b = it->at;
    it->at = q->next[b];
    return PyLong_FromLong(b);
}

static void fqi_dealloc(FreeQueueIter *it) {
    Py_DECREF(it->queue);
    PyObject_Free(it);
}

/* FreeBlockQueue.check_invariants: walk both ways; AssertionError naming the fault. */
static PyObject *fq_check_invariants(FreeQueue *q, PyObject *unused) {
    (void)unused;
    Py_ssize_t count = 0;
    int32_t p = (int32_t)q->head;
    char *seen = PyMem_Calloc((size_t)q->head + 1, 1);
    if (seen == NULL) return PyErr_NoMemory();
    const char *fault = NULL;
    for (int32_t b = q->next[q->head]; b != q->tail; p = b, b = q->next[b]) {
        if (b < 0 || b >= q->head) fault = "free queue holds an invalid id";
        else if (q->prev[b] != p) fault = "free queue: prev link broken";
        else if (seen[b]) fault = "free queue: an id appears twice";
        if (fault != NULL) break;
        seen[b] = 1;
        count++;
    }
    PyMem_Free(seen);
    if (fault == NULL && q->prev[q->tail] != p) fault = "free queue: tail link broken";
    if (fault == NULL && count != q->num_free) fault = "free queue: num_free is wrong";
    if (fault != NULL) {
        PyErr_SetString(PyExc_AssertionError, fault);
        return NULL;
    }
    return fq_to_list(q, NULL);
}

/* Pickling and copy.copy/deepcopy: FreeQueue._restore(num_blocks, next, prev, num_free). */
static PyObject *fq_reduce(FreeQueue *q, PyObject *unused) {
    (void)unused;
    Py_ssize_t size = (Py_ssize_t)sizeof(int32_t) * (q->head + 2);
    PyObject *restore = PyObject_GetAttrString((PyObject *)Py_TYPE(q), "_restore");
    if (restore == NULL) return NULL;
    return Py_BuildValue("N(ny#y#n)", restore, q->head, (const char *)q->next, size,
                         (const char *)q->prev, size, q->num_free);
}

/* Whether restored arrays are a state the queue could have reached: every link in
 * range (no later unlink or append of a queued id writes outside the arrays), and
 * the walk from head reaches tail through num_free distinct ids with matching back links. */
static int fq_restored_ok(FreeQueue *q) {
    if (q->num_free < 0 || q->num_free > q->head) return 0;
    for (Py_ssize_t i = 0; i < q->head; i++) {
        if (q->next[i] < 0 || q->next[i] > q->tail || q->prev[i] < -1 || q->prev[i] > q->tail)
            return 0;
    }
    if (q->next[q->head] < 0 || q->next[q->head] > q->tail || q->prev[q->tail] < 0 ||
        q->prev[q->tail] > q->head)
        return 0;
    Py_ssize_t count = 0;
    int32_t p = (int32_t)q->head;
    for (int32_t b = q->next[q->head]; b != q->tail; p = b, b = q->next[b]) {
        if (b >= q->head || q->prev[b] != p || ++count > q->num_free) return 0;
    }
    return q->prev[q->tail] == p && count == q->num_free;
}

static PyObject *fq_restore(PyObject *cls, PyObject *args) {
    Py_ssize_t n, num_free, len_next, len_prev;
    const char *nxt, *prv;
    if (!PyArg_ParseTuple(args, "ny#y#n:_restore", &n, &nxt, &len_next, &prv, &len_prev,
                          &num_free)) return NULL;
    if (n < 0 || len_next != (Py_ssize_t)sizeof(int32_t) * (n + 2) || len_prev != len_next) {
        PyErr_SetString(PyExc_ValueError, "FreeQueue._restore: arrays of the wrong size");
        return NULL;
    }
    PyObject *obj = PyObject_CallFunction(cls, "n", n);
    if (obj == NULL) return NULL;
    FreeQueue *q = (FreeQueue *)obj;
    memcpy(q->next, nxt, (size_t)len_next);
    memcpy(q->prev, prv, (size_t)len_prev);
    q->num_free = num_free;
    if (!fq_restored_ok(q)) {
        Py_DECREF(obj);
        PyErr_SetString(PyExc_ValueError,
                        "FreeQueue._restore: the pickled links are corrupt (an id out of "
                        "range, a broken or cyclic list, or a wrong count)");
        return NULL;
    }
    return obj;
}

static PyMethodDef fq_methods[] = {
    {"__reduce__", (PyCFunction)fq_reduce, METH_NOARGS, "Pickle/copy support."},
    {"_restore", (PyCFunction)fq_restore, METH_VARARGS | METH_CLASS, "Rebuild a pickled queue."},
    {"popleft", (PyCFunction)fq_popleft, METH_NOARGS, "Remove and return the front id."},
    {"popleft_n", (PyCFunction)fq_popleft_n, METH_O, "Remove and return the n front ids."},
    {"remove", (PyCFunction)fq_remove, METH_O, "Unlink a queued id."},
    {"append", (PyCFunction)fq_append, METH_O, "Put an id at the back."},
    {"append_n", (PyCFunction)fq_append_n, METH_O, "Put ids at the back, in order."},
    {"prepend_n", (PyCFunction)fq_prepend_n, METH_O, "Put ids at the front, in order."},
    {"to_list", (PyCFunction)fq_to_list, METH_NOARGS, "Ids front to back."},
    {"check_invariants", (PyCFunction)fq_check_invariants, METH_NOARGS,
     "Walk the list; AssertionError on a fault; the ids front to back."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef fq_members[] = {
    {"num_free", T_PYSSIZET, offsetof(FreeQueue, num_free), READONLY, "Number of queued ids."},
    {NULL, 0, 0, 0, NULL},
};

static int ccore_pool_add(PyObject *m) {
    FreeQueueType.tp_name = "pagedkv.core._ccore.FreeQueue";
    FreeQueueType.tp_doc = "FreeBlockQueue's doubly linked list in C int arrays (same API).";
    FreeQueueType.tp_basicsize = sizeof(FreeQueue);
    FreeQueueType.tp_flags = Py_TPFLAGS_DEFAULT;
    FreeQueueType.tp_new = PyType_GenericNew;
    FreeQueueType.tp_init = (initproc)fq_init;
    FreeQueueType.tp_dealloc = (destructor)fq_dealloc;
    FreeQueueType.tp_iter = (getiterfunc)fq_iter;
    FreeQueueType.tp_methods = fq_methods;
    FreeQueueType.tp_members = fq_members;
    FreeQueueIterType.tp_name = "pagedkv.core._ccore.FreeQueueIterator";
    FreeQueueIterType.tp_basicsize = sizeof(FreeQueueIter);
    FreeQueueIterType.tp_flags = Py_TPFLAGS_DEFAULT;
    FreeQueueIterType.tp_iter = PyObject_SelfIter;
    FreeQueueIterType.tp_iternext = (iternextfunc)fqi_next;
    FreeQueueIterType.tp_dealloc = (destructor)fqi_dealloc;
    if (PyType_Ready(&FreeQueueIterType) < 0
        || ccore_add_type(m, &FreeQueueType, "FreeQueue") < 0) return -1;
    return 0;
}
