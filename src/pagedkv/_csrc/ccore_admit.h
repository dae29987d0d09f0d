/* A request's first allocate_slots in C, for DecodeAllocate's layout (one full-attention
 * group, prefix caching on): pagedkv/core/facade_allocation.py allocate_slots, its checks
 * (check_allocate) and UnitaryCoordinator.allocate's general branch, on the calls
 *
 *     allocate_slots(request, num_new_tokens)
 *     allocate_slots(request, num_new_tokens, new_computed_blocks=hit)
 *
 * for a pagedkv Request the manager does not hold (no table, no live entry), with
 * num_computed_tokens 0, its tokens as appended (hashed) and within max_model_len, a hit
 * that is None, empty, or exactly as get_computed_blocks issued it to this manager for
 * this request with the index unchanged since (generation and fingerprint equal), and
 * hit + new tokens within the request's. The pool must have no eviction policy and no
 * listener and the group no zeroing. Then it does what the Python method does, in the
 * same order: the capacity check (new blocks, hit blocks that must leave the free queue,
 * the watermark: has_scheduled_reqs defaults to True), the pool's touch of the hit, the
 * table and registered count, the pool's get_new_blocks, the live entry, and the
 * coordinator's cache_blocks. Any other call — and any call failing a check — returns 1
 * before anything changed, and DecodeAllocate hands it to the Python method, the
 * specification and the only place that raises. */

static PyObject *str_new_computed_blocks, *str_issuer_token, *str_watermark_blocks,
    *str_ref_cnt, *str_index_generation, *str_policy, *str_listeners, *str_touch;

/* ComputedBlocks' fields (a NamedTuple, pagedkv/core/coordinator_base.py). */
enum { HIT_BLOCK_IDS, HIT_NUM_TOKENS, HIT_ISSUER, HIT_REQUEST_ID, HIT_GENERATION,
       HIT_FINGERPRINT, HIT_GROUP_TOKENS, HIT_NUM_FIELDS };

/* 1 when a == b (an error cleared counts as unequal). */
static int admit_equal(PyObject *a, PyObject *b) {
    int eq = PyObject_RichCompareBool(a, b, Py_EQ);
    if (eq < 0) PyErr_Clear();
    return eq == 1;
}

/* obj.name (a new reference), NULL with the error cleared. */
static PyObject *admit_attr(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) PyErr_Clear();
    return v;
}

/* validation.check_hit's fast acceptance: issued by this manager for this request, one group, a
 * count in [0, num_tokens), and unchanged since the lookup (the pool's index generation
 * and the fingerprint (num_hit, tuple(blocks))). 0: not proven (fall back). */
static int admit_hit_fresh(DecodeAllocate *self, PyObject *mgr, PyObject *hit,
                           PyObject *rid, Py_ssize_t num_hit, Py_ssize_t num_tokens,
                           PyObject *blocks) {
    if (num_hit >= num_tokens || PyTuple_GET_ITEM(hit, HIT_GROUP_TOKENS) != Py_None) return 0;
    PyObject *issuer = admit_attr(mgr, str_issuer_token);
    if (issuer == NULL) return 0;
    Py_DECREF(issuer); /* identity only; the manager holds it */
    if (PyTuple_GET_ITEM(hit, HIT_ISSUER) != issuer) return 0;
    PyObject *hit_rid = PyTuple_GET_ITEM(hit, HIT_REQUEST_ID);
    if (!PyUnicode_CheckExact(hit_rid) || !admit_equal(hit_rid, rid)) return 0;
    PyObject *generation = admit_attr(self->pool, str_index_generation);
    if (generation == NULL) return 0;
    int same = admit_equal(PyTuple_GET_ITEM(hit, HIT_GENERATION), generation);
    Py_DECREF(generation);
    if (!same) return 0;
    PyObject *print = PyTuple_GET_ITEM(hit, HIT_FINGERPRINT);
    Py_ssize_t n = PyList_GET_SIZE(blocks);
    if (!PyTuple_CheckExact(print) || PyTuple_GET_SIZE(print) != 2
        || !admit_equal(PyTuple_GET_ITEM(print, 0), PyTuple_GET_ITEM(hit, HIT_NUM_TOKENS))) {
        return 0;
    }
    PyObject *ids = PyTuple_GET_ITEM(print, 1);
    if (!PyTuple_CheckExact(ids) || PyTuple_GET_SIZE(ids) != n) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!admit_equal(PyTuple_GET_ITEM(ids, i), PyList_GET_ITEM(blocks, i))) return 0;
    }
    return 1;
}

/* The hit of a call's keywords: 1 with *hit (borrowed; NULL for none) when the only
 * keyword is new_computed_blocks, else 0. */
static int admit_keywords(PyObject *const *values, PyObject *kwnames, PyObject **hit) {
    *hit = NULL;
    if (kwnames == NULL) return 1;
    if (PyTuple_GET_SIZE(kwnames) != 1) return 0;
    PyObject *name = PyTuple_GET_ITEM(kwnames, 0);
    if (name != str_new_computed_blocks
        && PyUnicode_Compare(name, str_new_computed_blocks) != 0) {
        if (PyErr_Occurred()) PyErr_Clear();
        return 0;
    }
    *hit = values[0] == Py_None ? NULL : values[0];
    return 1;
}

/* The hit's one table (borrowed) and token count, or NULL (fall back). An empty hit
 * (no tokens, no blocks) is adopted unchecked, as the Python method does. */
static PyObject *admit_hit_blocks(DecodeAllocate *self, PyObject *mgr, PyObject *hit,
                                  PyObject *rid, Py_ssize_t num_tokens, Py_ssize_t *num_hit) {
    if (Py_TYPE(hit) != (PyTypeObject *)self->hit_type
        || PyTuple_GET_SIZE(hit) != HIT_NUM_FIELDS) return NULL;
    PyObject *tables = PyTuple_GET_ITEM(hit, HIT_BLOCK_IDS);
    PyObject *count = PyTuple_GET_ITEM(hit, HIT_NUM_TOKENS);
    if (!PyTuple_CheckExact(tables) || PyTuple_GET_SIZE(tables) != 1
        || !PyLong_CheckExact(count)) return NULL;
    PyObject *blocks = PyTuple_GET_ITEM(tables, 0);
    if (!PyList_CheckExact(blocks)) return NULL;
    Py_ssize_t n = PyLong_AsSsize_t(count);
    if (n < 0) {
        if (n == -1) PyErr_Clear();
        return NULL;
    }
    if ((n || PyList_GET_SIZE(blocks))
        && !admit_hit_fresh(self, mgr, hit, rid, n, num_tokens, blocks)) return NULL;
    *num_hit = n;
    return blocks;
}

/* Free blocks the allocation needs (get_num_blocks_to_allocate): new blocks, plus hit
 * blocks at reference count 0 (they leave the free queue); -1: not covered. */
static Py_ssize_t admit_blocks_needed(DecodeAllocate *self, PyObject *blocks,
                                      Py_ssize_t num_slots) {
    Py_ssize_t held = blocks != NULL ? PyList_GET_SIZE(blocks) : 0;
    Py_ssize_t need = (num_slots + self->block_size - 1) / self->block_size - held;
    if (need < 0) need = 0;
    if (held == 0) return need;
    PyObject *ref = admit_attr(self->pool, str_ref_cnt);
    if (ref == NULL) return -1;
    for (Py_ssize_t i = 0; i < held && need >= 0; i++) {
        PyObject *b = PyList_GET_ITEM(blocks, i);
        Py_ssize_t id = PyLong_CheckExact(b) ? PyLong_AsSsize_t(b) : -1;
        if (id == 0) continue;
        if (!PyList_CheckExact(ref) || id < 0 || id >= PyList_GET_SIZE(ref)) {
            need = -1;
            break;
        }
        PyObject *c = PyList_GET_ITEM(ref, id);
        Py_ssize_t k = PyLong_CheckExact(c) ? PyLong_AsSsize_t(c) : -1;
        if (k < 0) need = -1;
        else if (k == 0) need++;
    }
    Py_DECREF(ref);
    if (need < 0 && PyErr_Occurred()) PyErr_Clear();
    return need;
}

/* 1 when the pool runs plainly (no eviction policy, no listener), the group zeroes no
 * block, and the manager's watermark is an int >= 0 (*watermark); else 0. */
static int admit_pool_plain(DecodeAllocate *self, PyObject *mgr, Py_ssize_t *watermark) {
    PyObject *zero = PyList_GET_SIZE(self->zeroing) ? PyList_GET_ITEM(self->zeroing, 0)
                                                    : Py_False;
    if (zero != Py_False) return 0;
    PyObject *policy = admit_attr(self->pool, str_policy);
    if (policy == NULL) return 0;
    Py_DECREF(policy);
    if (policy != Py_None) return 0;
    PyObject *listeners = admit_attr(self->pool, str_listeners);
    if (listeners == NULL) return 0;
    int none = PyTuple_CheckExact(listeners) && PyTuple_GET_SIZE(listeners) == 0;
    Py_DECREF(listeners);
    if (!none) return 0;
    *watermark = da_count(mgr, str_watermark_blocks);
    return *watermark >= 0;
}

/* The pool's parts a first call's take and registration read, all checked once per call
 * (ccore_lookup.h fills them): new references, released by lk_parts_clear. The index's
 * parts are its prefix index's (pool.prefix, a PrefixIndex: its dicts, its eviction and
 * its counts). */
typedef struct {
    PyObject *queue, *ref, *bh, *bg, *index, *dups, *secondary, *prefix;
} LkParts;

/* The first call's take and registration without Python calls (ccore_lookup.h). */
static int lk_admit_parts(DecodeAllocate *self, LkParts *p, Py_ssize_t n);
static void lk_parts_clear(LkParts *p);
static PyObject *lk_take(DecodeAllocate *self, LkParts *p, Py_ssize_t n);
static int lk_register(DecodeAllocate *self, LkParts *p, PyObject *request, PyObject *rid,
                       PyObject *table, Py_ssize_t start, Py_ssize_t end);

/* The pool's get_new_blocks(n): in C on the parts when p is filled, else its method. */
static PyObject *admit_take(DecodeAllocate *self, LkParts *p, Py_ssize_t n) {
    if (p != NULL) return lk_take(self, p, n);
    PyObject *n_obj = PyLong_FromSsize_t(n);
    PyObject *ids = n_obj ? PyObject_CallMethodOneArg(self->pool, str_get_new_blocks, n_obj)
                          : NULL;
    Py_XDECREF(n_obj);
    if (ids != NULL && !PyList_CheckExact(ids)) {
        PyErr_SetString(PyExc_TypeError, "get_new_blocks: a list");
        Py_CLEAR(ids);
    }
    return ids;
}

/* The coordinator's cache_blocks(request, num_slots): in C on the parts when p is filled,
 * else its method; `held` blocks (the hit) are registered already. 0 or -1. */
static int admit_register(DecodeAllocate *self, LkParts *p, PyObject *request, PyObject *rid,
                          PyObject *table, Py_ssize_t held, Py_ssize_t num_slots) {
    if (p != NULL) return lk_register(self, p, request, rid, table, held, num_slots);
    PyObject *end = PyLong_FromSsize_t(num_slots);
    PyObject *call_args[2] = {request, end};
    PyObject *r = end ? PyObject_Vectorcall(self->cache_blocks, call_args, 2, NULL) : NULL;
    Py_XDECREF(end);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* The steps, after every check: touch the hit, start the table, take the new blocks,
 * enter the request as live, register its full blocks. The pool's parts are read once,
 * after the touch (the last Python call before the take), and serve the take and the
 * registration. 0 with *out, or -1. */
static int admit_apply(DecodeAllocate *self, PyObject *request, PyObject *rid,
                       PyObject *blocks, Py_ssize_t num_slots, Py_ssize_t need_new,
                       PyObject **out) {
    if (blocks != NULL && PyList_GET_SIZE(blocks)) {
        PyObject *r = PyObject_CallMethodOneArg(self->pool, str_touch, blocks);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    PyObject *table = blocks != NULL ? PyList_GetSlice(blocks, 0, PyList_GET_SIZE(blocks))
                                     : PyList_New(0);
    if (table == NULL) return -1;
    LkParts parts;
    LkParts *p = lk_admit_parts(self, &parts, need_new) ? &parts : NULL;
    Py_ssize_t held = PyList_GET_SIZE(table);
    PyObject *count = PyLong_FromSsize_t(held);
    int rc = count == NULL || PyDict_SetItem(self->tables, rid, table) < 0
             || PyDict_SetItem(self->cached, rid, count) < 0 ? -1 : 0;
    Py_XDECREF(count);
    PyObject *new_ids = NULL;
    if (rc == 0) new_ids = need_new > 0 ? admit_take(self, p, need_new) : PyList_New(0);
    if (new_ids != NULL && need_new > 0 && PyList_SetSlice(table, held, held, new_ids) < 0) {
        Py_CLEAR(new_ids);
    }
    rc = new_ids == NULL || PyDict_SetItem(self->live, rid, request) < 0
         || admit_register(self, p, request, rid, table, held, num_slots) < 0 ? -1 : 0;
    if (p != NULL) lk_parts_clear(p);
    Py_DECREF(table);
    if (rc < 0) {
        Py_XDECREF(new_ids);
        return -1;
    }
    *out = PyTuple_Pack(1, new_ids);
    Py_DECREF(new_ids);
    return *out == NULL ? -1 : 0;
}

static int da_admit(DecodeAllocate *self, PyObject *request, PyObject *rid,
                    Py_ssize_t num_new, PyObject *const *kwvalues, PyObject *kwnames,
                    PyObject **out) {
    PyObject *hit, *blocks = NULL;
    if (Py_TYPE(request) != (PyTypeObject *)self->request_type
        || !admit_keywords(kwvalues, kwnames, &hit) || PyUnicode_GET_LENGTH(rid) == 0
        || da_get(self->tables, rid) != NULL || da_get(self->cached, rid) != NULL
        || da_count(request, str_num_computed_tokens) != 0) return 1;
    Py_ssize_t num_tokens = da_num_tokens(self, request), num_hit = 0, watermark = 0;
    if (num_tokens < 0 || num_tokens > self->max_model_len) return 1;
    PyObject *mgr = da_manager(self);
    if (mgr == NULL) return -1;
    int plain = admit_pool_plain(self, mgr, &watermark);
    if (plain && hit != NULL) {
        blocks = admit_hit_blocks(self, mgr, hit, rid, num_tokens, &num_hit);
        plain = blocks != NULL;
    }
    Py_DECREF(mgr);
    if (!plain || num_new > num_tokens - num_hit) return 1;
    Py_ssize_t num_slots = num_hit + num_new; /* <= num_tokens <= max_model_len */
    Py_ssize_t need = admit_blocks_needed(self, blocks, num_slots);
    if (need < 0) return 1;
    Py_ssize_t num_free = da_num_free(self);
    if (num_free < 0) {
        PyErr_Clear();
        return 1;
    }
    if (need + watermark > num_free) { /* a normal no: nothing changed */
        *out = Py_NewRef(Py_None);
        return 0;
    }
    Py_ssize_t held = blocks != NULL ? PyList_GET_SIZE(blocks) : 0;
    Py_ssize_t need_new = (num_slots + self->block_size - 1) / self->block_size - held;
    return admit_apply(self, request, rid, blocks, num_slots, need_new, out);
}

static int ccore_admit_add(PyObject *m) {
    (void)m;
    str_new_computed_blocks = PyUnicode_InternFromString("new_computed_blocks");
    str_issuer_token = PyUnicode_InternFromString("issuer_token");
    str_watermark_blocks = PyUnicode_InternFromString("watermark_blocks");
    str_ref_cnt = PyUnicode_InternFromString("ref_cnt");
    str_index_generation = PyUnicode_InternFromString("index_generation");
    str_policy = PyUnicode_InternFromString("policy");
    str_listeners = PyUnicode_InternFromString("listeners");
    str_touch = PyUnicode_InternFromString("touch");
    return str_new_computed_blocks && str_issuer_token && str_watermark_blocks && str_ref_cnt
                   && str_index_generation && str_policy && str_listeners && str_touch
               ? 0
               : -1;
}
