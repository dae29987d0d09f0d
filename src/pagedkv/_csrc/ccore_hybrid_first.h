/* GroupsAllocate's first call of a request: pagedkv/core/facade_allocation.py allocate_slots
 * (its checks, check_allocate, and the hit's adoption) followed by Coordinator.allocate's
 * admission (admit_groups, ccore_hybrid_admit.h) and Coordinator.cache_blocks, on the call
 *
 *     allocate_slots(request, num_new_tokens, **keywords)
 *
 * for a pagedkv Request the manager does not hold (no live entry, no table in group 0)
 * with num_computed_tokens 0, its tokens as appended (hashed) and within max_model_len,
 * when the keywords carry a first call's plain values: new_computed_blocks None or a
 * ComputedBlocks, num_new_computed_tokens None, num_lookahead_tokens and reserved_blocks
 * plain ints >= 0, num_external_computed_tokens and num_encoder_tokens 0,
 * has_scheduled_reqs, delay_caching and full_sequence_must_fit bools, lenient_counts
 * False, num_in_flight_tokens 0. A hit holding tokens or blocks must be as
 * get_computed_blocks issued it to this manager for this request (issuer, request id, one
 * list per group, no per-group lengths) with the index unchanged since (the pool's
 * index_generation and the fingerprint equal: validation.check_hit's fast acceptance), shorter
 * than the request; hit plus new tokens within the request's tokens. The coordinator must
 * have an admission plan (_admit_plan). Then, in the Python method's order: under
 * full_sequence_must_fit the gate (the coordinator's num_blocks_for_full_sequence plus the
 * watermark within the free blocks, else None), the headroom (reserved blocks, plus the
 * watermark when has_scheduled_reqs), admit_groups with the
 * coordinator's arguments, the live entry, and the registration (ga_cache) unless
 * delayed. Any other call, and any call failing a check, returns 1 before anything
 * changed; GroupsAllocate then hands it to the Python method, the specification and the
 * only place that raises. */

static PyObject *str_fc_coordinator, *str_fc_admit_plan, *str_fc_get_new_blocks,
    *str_fc_block_ids_type, *str_fc_full_sequence;
static PyObject *fc_hit_type; /* pagedkv.core.coordinator_base.ComputedBlocks, looked up once */
/* Coordinator.num_blocks_for_full_sequence (the function), looked up once */
static PyObject *fc_count_fn, *str_fc_caps;

/* The first call's keyword values. */
typedef struct {
    PyObject *hit; /* borrowed; NULL: none */
    Py_ssize_t lookahead, reserved, watermark;
    int scheduled, delay, must_fit;
} FcCall;

/* 1 when every keyword has a plain first call's value (filling c), else 0. */
static int fc_keywords(PyObject *const *values, PyObject *kwnames, FcCall *c) {
    Py_ssize_t n = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames), zero;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *v = values[i];
        int ok;
        if (ga_name_is(name, str_kw_hit)) {
            ok = 1;
            c->hit = v == Py_None ? NULL : v;
        } else if (ga_name_is(name, str_kw_hit_tokens)) {
            ok = v == Py_None;
        } else if (ga_name_is(name, str_kw_lookahead)) {
            ok = ga_exact_count(v, &c->lookahead);
        } else if (ga_name_is(name, str_kw_reserved)) {
            ok = ga_exact_count(v, &c->reserved);
        } else if (ga_name_is(name, str_kw_external) || ga_name_is(name, str_kw_encoder)
                   || ga_name_is(name, str_num_in_flight_tokens)) {
            ok = ga_exact_count(v, &zero) && zero == 0;
        } else if (ga_name_is(name, str_kw_scheduled)) {
            ok = PyBool_Check(v);
            c->scheduled = v == Py_True;
        } else if (ga_name_is(name, str_kw_delay)) {
            ok = PyBool_Check(v);
            c->delay = v == Py_True;
        } else if (ga_name_is(name, str_kw_must_fit)) {
            ok = PyBool_Check(v);
            c->must_fit = v == Py_True;
        } else if (ga_name_is(name, str_lenient_counts)) {
            ok = v == Py_False;
        } else {
            ok = 0;
        }
        if (PyErr_Occurred()) PyErr_Clear();
        if (!ok) return 0;
    }
    return 1;
}

/* 1 when every entry of `tables` (a tuple of num_groups exact lists) is empty. */
static int fc_all_empty(PyObject *tables) {
    for (Py_ssize_t g = 0; g < PyTuple_GET_SIZE(tables); g++) {
        if (PyList_GET_SIZE(PyTuple_GET_ITEM(tables, g)) != 0) return 0;
    }
    return 1;
}

/* validation.check_hit's fast acceptance for several groups: issued by this manager for this
 * request, no per-group lengths, a count in [0, num_tokens), the pool's index generation
 * and the fingerprint (num_hit, tuple(blocks) per group) unchanged. 0: not proven. */
static int fc_hit_fresh(GroupsAllocate *self, PyObject *mgr, PyObject *hit, PyObject *rid,
                        Py_ssize_t num_hit, Py_ssize_t num_tokens, PyObject *tables) {
    if (num_hit >= num_tokens || PyTuple_GET_ITEM(hit, HIT_GROUP_TOKENS) != Py_None) return 0;
    PyObject *issuer = admit_attr(mgr, str_issuer_token);
    if (issuer == NULL) return 0;
    Py_DECREF(issuer); /* identity only; the manager holds it */
    PyObject *hit_rid = PyTuple_GET_ITEM(hit, HIT_REQUEST_ID);
    if (PyTuple_GET_ITEM(hit, HIT_ISSUER) != issuer || !PyUnicode_CheckExact(hit_rid)
        || !admit_equal(hit_rid, rid)) return 0;
    PyObject *generation = admit_attr(self->pool, str_index_generation);
    if (generation == NULL) return 0;
    int same = admit_equal(PyTuple_GET_ITEM(hit, HIT_GENERATION), generation);
    Py_DECREF(generation);
    PyObject *print = PyTuple_GET_ITEM(hit, HIT_FINGERPRINT);
    Py_ssize_t groups = PyTuple_GET_SIZE(tables);
    if (!same || !PyTuple_CheckExact(print) || PyTuple_GET_SIZE(print) != groups + 1
        || !admit_equal(PyTuple_GET_ITEM(print, 0), PyTuple_GET_ITEM(hit, HIT_NUM_TOKENS))) {
        return 0;
    }
    for (Py_ssize_t g = 0; g < groups; g++) {
        PyObject *ids = PyTuple_GET_ITEM(print, g + 1), *blocks = PyTuple_GET_ITEM(tables, g);
        Py_ssize_t n = PyList_GET_SIZE(blocks);
        if (!PyTuple_CheckExact(ids) || PyTuple_GET_SIZE(ids) != n) return 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!admit_equal(PyTuple_GET_ITEM(ids, i), PyList_GET_ITEM(blocks, i))) return 0;
        }
    }
    return 1;
}

/* The hit's tables (borrowed: a tuple of one exact list per group) and token count when
 * the Python method would adopt it unchanged, else NULL (fall back). */
static PyObject *fc_hit_tables(GroupsAllocate *self, PyObject *mgr, PyObject *hit,
                               PyObject *rid, Py_ssize_t num_tokens, Py_ssize_t *num_hit) {
    if (fc_hit_type == NULL) {
        PyObject *mod = PyImport_ImportModule("pagedkv.core.coordinator_base");
        fc_hit_type = mod == NULL ? NULL : PyObject_GetAttr(mod, str_fc_block_ids_type);
        Py_XDECREF(mod);
        if (fc_hit_type == NULL) {
            PyErr_Clear();
            return NULL;
        }
    }
    if (Py_TYPE(hit) != (PyTypeObject *)fc_hit_type
        || PyTuple_GET_SIZE(hit) != HIT_NUM_FIELDS) return NULL;
    PyObject *tables = PyTuple_GET_ITEM(hit, HIT_BLOCK_IDS);
    Py_ssize_t n;
    if (!PyTuple_CheckExact(tables) || PyTuple_GET_SIZE(tables) != self->num_groups
        || !ga_exact_count(PyTuple_GET_ITEM(hit, HIT_NUM_TOKENS), &n)) return NULL;
    for (Py_ssize_t g = 0; g < self->num_groups; g++) {
        if (!PyList_CheckExact(PyTuple_GET_ITEM(tables, g))) return NULL;
    }
    if ((n || !fc_all_empty(tables))
        && !fc_hit_fresh(self, mgr, hit, rid, n, num_tokens, tables)) return NULL;
    *num_hit = n;
    return tables;
}

/* admit_groups with Coordinator.allocate's arguments (a new reference: the new blocks per
 * group, or None), or NULL with an exception set. */
static PyObject *fc_admit(GroupsAllocate *self, PyObject *plan, PyObject *rid,
                          PyObject *tables, Py_ssize_t total, Py_ssize_t num_slots,
                          Py_ssize_t main, Py_ssize_t headroom, Py_ssize_t num_free) {
    PyObject *ref = PyObject_GetAttr(self->pool, str_ref_cnt);
    PyObject *touch = PyObject_GetAttr(self->ops, str_touch);
    PyObject *take = PyObject_GetAttr(self->ops, str_fc_get_new_blocks);
    PyObject *nums[5] = {PyLong_FromSsize_t(total), PyLong_FromSsize_t(num_slots),
                         PyLong_FromSsize_t(main), PyLong_FromSsize_t(headroom),
                         PyLong_FromSsize_t(num_free)};
    PyObject *out = NULL;
    if (ref && touch && take && nums[0] && nums[1] && nums[2] && nums[3] && nums[4]) {
        PyObject *args[13] = {plan, rid, tables == NULL ? Py_None : tables, nums[0], nums[1],
                              nums[2], nums[3], nums[4], ref, touch, take, self->zeroing,
                              self->new_ids};
        out = admit_groups(NULL, args, 13);
    }
    for (int i = 0; i < 5; i++) Py_XDECREF(nums[i]);
    Py_XDECREF(ref);
    Py_XDECREF(touch);
    Py_XDECREF(take);
    return out;
}

/* The coordinator's admission plan (a new reference to a list), the headroom and the
 * watermark (c->watermark), or NULL (fall back, no error set). *coord: the coordinator (a
 * new reference) when the plan is returned. */
static PyObject *fc_plan(PyObject *mgr, FcCall *c, Py_ssize_t *headroom, PyObject **coord) {
    c->watermark = 0;
    if (c->scheduled) {
        c->watermark = da_count(mgr, str_watermark_blocks);
        if (c->watermark < 0 || c->reserved > PY_SSIZE_T_MAX - c->watermark) return NULL;
    }
    *headroom = c->reserved + c->watermark;
    *coord = admit_attr(mgr, str_fc_coordinator);
    PyObject *plan = *coord == NULL ? NULL : admit_attr(*coord, str_fc_admit_plan);
    if (plan != NULL && !PyList_CheckExact(plan)) Py_CLEAR(plan);
    if (plan == NULL) Py_CLEAR(*coord);
    return plan;
}

/* Coordinator.num_blocks_for_full_sequence (group_allocation.full_sequence_blocks) in C
 * when the coordinator's method is the base one and every group of the admission plan
 * counts by a kernel rule (admit_groups' ad_need, the slots capped at the group's
 * admission cap) and holds no table for the request: the count (>= 0), or -1 (not
 * taken, no error set). */
static Py_ssize_t fc_need(GroupsAllocate *self, PyObject *coord, PyObject *plan,
                          PyObject *rid, PyObject *tables, Py_ssize_t num_hit,
                          Py_ssize_t num_tokens) {
    if (fc_count_fn == NULL) {
        PyObject *mod = PyImport_ImportModule("pagedkv.core.coordinator_base");
        PyObject *cls = mod == NULL ? NULL : PyObject_GetAttrString(mod, "Coordinator");
        fc_count_fn = cls == NULL ? NULL : PyObject_GetAttr(cls, str_fc_full_sequence);
        Py_XDECREF(mod);
        Py_XDECREF(cls);
        if (fc_count_fn == NULL) PyErr_Clear();
    }
    PyObject *m = PyObject_GetAttr(coord, str_fc_full_sequence);
    int base = m != NULL && fc_count_fn != NULL && PyMethod_Check(m)
               && PyMethod_GET_FUNCTION(m) == fc_count_fn;
    Py_XDECREF(m);
    PyObject *caps = base ? PyObject_GetAttr(coord, str_fc_caps) : NULL;
    PyObject *ref = caps != NULL ? PyObject_GetAttr(self->pool, str_ref_cnt) : NULL;
    PyObject *total = ref != NULL ? PyLong_FromSsize_t(num_hit) : NULL, *empty = PyList_New(0);
    Py_ssize_t n = total != NULL && empty != NULL && PyList_CheckExact(caps)
                           && PyList_CheckExact(ref)
                           && PyList_GET_SIZE(caps) == PyList_GET_SIZE(plan)
                           && PyList_GET_SIZE(plan) == self->num_groups
                       ? 0 : -1;
    for (Py_ssize_t g = 0; n >= 0 && g < PyList_GET_SIZE(plan); g++) {
        PyObject *entry = PyList_GET_ITEM(plan, g), *cap = PyList_GET_ITEM(caps, g);
        PyObject *blocks = tables == NULL ? empty : PyTuple_GET_ITEM(tables, g);
        AdGroup a;
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 7
            || PyLong_AsLong(PyTuple_GET_ITEM(entry, 0)) == AD_METHODS
            || ad_read(entry, blocks, num_tokens, num_tokens, num_hit, &a) < 0
            || da_get(a.tables, rid) != NULL) {
            n = -1;
            break;
        }
        Py_ssize_t c = cap == Py_None ? -1 : PyLong_AsSsize_t(cap);
        if (cap != Py_None && c < 0) n = -1; /* not an int, or a negative cap: Python */
        else if (c >= 0 && a.slots / a.bs >= c) a.slots = c * a.bs; /* slots > cap * bs */
        Py_ssize_t need = n < 0 ? -1 : ad_need(&a, rid, total, ref);
        n = need < 0 ? -1 : n + need;
    }
    if (PyErr_Occurred()) PyErr_Clear();
    Py_XDECREF(caps);
    Py_XDECREF(ref);
    Py_XDECREF(total);
    Py_XDECREF(empty);
    return n;
}

/* full_sequence_must_fit's gate (facade_allocation.whole_request_fits): 1 the request
 * fits, 0 not, -1 an error from the coordinator's count (nothing changed). */
static int fc_fits(GroupsAllocate *self, PyObject *coord, PyObject *plan, PyObject *rid,
                   PyObject *tables, Py_ssize_t num_hit, Py_ssize_t num_tokens,
                   Py_ssize_t watermark, Py_ssize_t num_free) {
    Py_ssize_t c_need = fc_need(self, coord, plan, rid, tables, num_hit, num_tokens);
    if (c_need >= 0) return c_need <= num_free - watermark;
    PyObject *total = PyLong_FromSsize_t(num_hit), *n = PyLong_FromSsize_t(num_tokens);
    PyObject *zero = PyLong_FromLong(0), *r = NULL;
    if (total && n && zero) {
        PyObject *a[6] = {coord, rid, tables == NULL ? Py_None : tables, total, n, zero};
        r = PyObject_VectorcallMethod(str_fc_full_sequence, a,
                                      6 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    Py_XDECREF(total);
    Py_XDECREF(n);
    Py_XDECREF(zero);
    if (r == NULL) return -1;
    Py_ssize_t need = PyLong_AsSsize_t(r);
    Py_DECREF(r);
    if (need == -1 && PyErr_Occurred()) return -1;
    return need <= num_free - watermark;
}

/* GroupsAllocate's first call (the header comment): 1 not taken (nothing changed, no
 * error set), 0 taken (*out: the new blocks per group or None), -1 an error after state
 * may have changed (the Python method's would propagate the same way). */
static int ga_first(GroupsAllocate *self, PyObject *const *args, PyObject *kwnames,
                    PyObject *rid, Py_ssize_t num_new, PyObject **out) {
    PyObject *request = args[0];
    FcCall c = {NULL, 0, 0, 0, 1, 0, 0};
    if (Py_TYPE(request) != (PyTypeObject *)self->request_type
        || PyUnicode_GET_LENGTH(rid) == 0 || !fc_keywords(args + 2, kwnames, &c)
        || da_get(self->live, rid) != NULL || da_get(self->g[0].tables, rid) != NULL
        || da_count(request, str_num_computed_tokens) != 0) return 1;
    Py_ssize_t num_tokens = request_num_tokens(self->request_type, request), num_hit = 0;
    if (num_tokens < 0 || num_tokens > self->max_model_len) return 1;
    PyObject *mgr = da_manager_of(self->manager_ref);
    if (mgr == NULL) return -1;
    PyObject *tables = NULL, *coord = NULL;
    Py_ssize_t headroom = 0;
    PyObject *plan = fc_plan(mgr, &c, &headroom, &coord);
    int plain = plan != NULL;
    if (plain && c.hit != NULL) {
        tables = fc_hit_tables(self, mgr, c.hit, rid, num_tokens, &num_hit);
        plain = tables != NULL;
    }
    Py_DECREF(mgr);
    Py_ssize_t num_free = plain ? ga_num_free(self->pool) : -1;
    if (num_free < 0 || num_new > num_tokens - num_hit
        || c.lookahead > PY_SSIZE_T_MAX - num_tokens) {
        if (PyErr_Occurred()) PyErr_Clear();
        Py_XDECREF(plan);
        Py_XDECREF(coord);
        return 1;
    }
    int fits = c.must_fit ? fc_fits(self, coord, plan, rid, tables, num_hit, num_tokens,
                                    c.watermark, num_free)
                          : 1;
    Py_DECREF(coord);
    if (fits <= 0) {
        Py_DECREF(plan);
        *out = fits == 0 ? Py_NewRef(Py_None) : NULL;
        return fits == 0 ? 0 : -1;
    }
    /* From here on state changes: errors propagate as the Python method's would. */
    Py_ssize_t main = num_hit + num_new, slots = main + c.lookahead;
    if (slots > self->max_model_len) slots = self->max_model_len;
    *out = fc_admit(self, plan, rid, tables, num_hit, slots, main, headroom, num_free);
    Py_DECREF(plan);
    if (*out == NULL) return -1;
    if (*out == Py_None) return 0;
    if (PyDict_SetItem(self->live, rid, request) < 0
        || (!c.delay && ga_cache(self, request, rid, main) < 0)) {
        Py_CLEAR(*out);
        return -1;
    }
    return 0;
}

static int ccore_hybrid_first_init(void) {
    str_fc_coordinator = PyUnicode_InternFromString("coordinator");
    str_fc_admit_plan = PyUnicode_InternFromString("_admit_plan");
    str_fc_get_new_blocks = PyUnicode_InternFromString("get_new_blocks");
    str_fc_block_ids_type = PyUnicode_InternFromString("ComputedBlocks");
    str_fc_full_sequence = PyUnicode_InternFromString("num_blocks_for_full_sequence");
    str_fc_caps = PyUnicode_InternFromString("admission_cap_blocks");
    return str_fc_coordinator && str_fc_admit_plan && str_fc_get_new_blocks && str_fc_caps
                   && str_fc_block_ids_type && str_fc_full_sequence
               ? 0
               : -1;
}
