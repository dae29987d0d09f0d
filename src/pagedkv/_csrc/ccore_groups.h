/* GroupsAllocate: KVCacheManager.allocate_slots's per-step call in C for any coordinator
 * whose allocate and cache_blocks are Coordinator's own rules (coordinator_base.py): several
 * groups, groups that drop blocks out of a window (sliding window, chunked local), Mamba
 * and other groups that grow through their own methods, mixed block sizes, a registration
 * aligned to the lcm of the block sizes. Installed by pagedkv/core/fast_paths.py.
 *
 * Its pure-Python specification is the facade's allocate_slots on a running request
 * (manager.py) followed by Coordinator.allocate -> group_allocation.grow_running and
 * Coordinator.cache_blocks, with SlidingWindowManager / ChunkedLocalManager
 * remove_skipped_blocks for the windows. The call it takes: two positional arguments (a
 * request this manager holds, a plain positive count) and any of the facade's keywords
 * with the values of a running request's step (no hit, no external or encoder tokens, no
 * full-sequence gate; lookahead, reserve, in-flight tokens, lenient counts, delayed
 * caching allowed), and a request's plain first call (ccore_hybrid_first.h). In that
 * order it releases every dropping group's skipped blocks (windows in C, other groups
 * through their remove_skipped_blocks), checks capacity for every group at once (pool.free_queue.num_free), grows plain tables through the pool's
 * get_new_blocks (other groups through get_num_blocks_to_allocate / allocate_new_blocks),
 * records zeroed groups' new blocks, and registers the blocks that became full (a group's
 * cache_blocks runs only when its count says a block became full). Every other call goes
 * to the Python method before anything has changed, so the errors and state stay the
 * Python ones. A Mamba align group's release and growth run in C (state kinds,
 * ccore_hybrid_step.h; a request with a sub-block state to copy falls back first), and
 * so does the registration of groups registering by the base rule, Mamba align's or
 * full attention's over several hash blocks per block, when the pool has no eviction
 * policy (ccore_hybrid_step_register.h); other groups' methods run. */

/* GA_GROW_STATE / GA_DROP_STATE: a Mamba align group's growth and release in C
 * (ccore_hybrid_step.h), over the manager's containers given in the group's entry. */
enum { GA_GROW_PLAIN = 0, GA_GROW_METHOD = 1, GA_GROW_STATE = 2 };
enum { GA_DROP_NONE = 0, GA_DROP_WINDOW = 1, GA_DROP_CHUNK = 2, GA_DROP_METHOD = 3,
       GA_DROP_STATE = 4 };

typedef struct {
    int grow, drop, ignores_lookahead;
    Py_ssize_t block_size, drop_tokens; /* the window or the chunk, in tokens */
    PyObject *manager, *tables;         /* borrowed from self->groups */
    /* State groups only (borrowed): request -> released positions, -> last state's
     * position; the requests allocated; request -> a sub-block state to copy. */
    PyObject *released, *last_state, *allocated, *partial;
} GaGroup;

/* How a caching group registers: through its cache_blocks (GA_CACHE_METHOD), or in C
 * (ga_register): SingleTypeManager.cache_blocks's rule (GA_CACHE_PLAIN), or
 * MambaAlignManager's (GA_CACHE_STATE: capped at the hashed tokens, the new keys
 * remembered for this step), or FullAttentionManager's over several hash blocks per block
 * (GA_CACHE_TAIL: its method still runs when the prompt's tail may need an entry). */
enum { GA_CACHE_METHOD = 0, GA_CACHE_PLAIN = 1, GA_CACHE_STATE = 2, GA_CACHE_TAIL = 3,
       GA_CACHE_MASKED = 4 /* a window's masked rule: ccore_alloc_masked.h */ };

typedef struct {
    Py_ssize_t block_size;
    PyObject *manager, *tables, *cached; /* cached: a dict, or None (always call) */
    int kind, drop_last_hit;
    Py_ssize_t stride;                   /* hash blocks per block */
    /* borrowed: the group's index and duplicates, the step's keys (a set, STATE), the
     * registered counts (the manager's num_cached_blocks) */
    PyObject *group, *index, *dups, *registered, *counts;
    Py_ssize_t per_segment, first, shift; /* MASKED: the window's mask */
} GaCache;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *function, *cache_function, *manager_ref, *live, *pool, *zeroing, *new_ids,
        *request_type, *groups, *cache_plan, *registrar;
    /* the pool's get_new_blocks, touch and free_blocks: a PoolOps (ccore_pool_ops.h) or
     * the pool itself */
    PyObject *ops;
    /* the free (ccore_groups_free.h): the facade's free, the coordinator's free plan, the
     * pool calls' free_blocks; all NULL when the manager's free stays Python */
    PyObject *free_function, *free_plan, *ops_free;
    PyObject **free_entries; /* 4 per group, borrowed from free_plan (PyMem) */
    PyObject *lookup; /* get_computed_blocks: a HybridLookup (ccore_hybrid_lookup.h) or NULL */
    Py_ssize_t num_free_groups;
    /* from registrar (borrowed): the prefix index (its _index_register kernel read per
     * registration), the per-block hash and
     * group lists, the rehash eviction, the recorder's stored (NULL: it hears nothing) */
    PyObject *reg_fn, *reg_hash, *reg_group, *reg_evict, *reg_stored;
    GaGroup *g;
    GaCache *c;
    Py_ssize_t num_groups, num_cache, max_model_len, hash_block_size, align;
} GroupsAllocate;

static PyObject *str_partial_hits, *str_keep_null_head, *str_offloads, *str_num_prompt_tokens,
    *str_index_register_attr;
static PyObject *str_remove_skipped, *str_get_num_blocks, *str_allocate_new, *str_slots_needed,
    *str_mgr_cache_blocks, *str_free_blocks, *str_kw_hit, *str_kw_hit_tokens, *str_kw_lookahead,
    *str_kw_external, *str_kw_encoder, *str_kw_delay, *str_kw_reserved, *str_kw_scheduled,
    *str_kw_must_fit;

#define GA_OBJS(X) X(function) X(cache_function) X(manager_ref) X(live) X(pool) X(zeroing) \
    X(new_ids) X(request_type) X(groups) X(cache_plan) X(registrar) X(ops) \
    X(free_function) X(free_plan) X(ops_free) X(lookup)

static int ga_traverse(GroupsAllocate *self, visitproc visit, void *arg) {
#define GA_VISIT(f) Py_VISIT(self->f);
    GA_OBJS(GA_VISIT)
    return 0;
}

static int ga_clear(GroupsAllocate *self) {
#define GA_CLEAR(f) Py_CLEAR(self->f);
    GA_OBJS(GA_CLEAR)
    PyMem_Free(self->g);
    PyMem_Free(self->c);
    PyMem_Free(self->free_entries);
    self->free_entries = NULL;
    self->num_free_groups = 0;
    self->g = NULL;
    self->c = NULL;
    self->num_groups = self->num_cache = 0;
    self->reg_fn = self->reg_hash = self->reg_group = self->reg_evict = NULL;
    self->reg_stored = NULL;
    return 0;
}

static void ga_dealloc(GroupsAllocate *self) {
    PyObject_GC_UnTrack(self);
    ga_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The call's values, read and checked before anything changes. */
typedef struct {
    Py_ssize_t computed, num_new, lookahead, reserved, in_flight, num_tokens;
    int lenient, delay;
} GaCall;

static int ga_exact_count(PyObject *v, Py_ssize_t *out) {
    if (!PyLong_CheckExact(v)) return 0;
    Py_ssize_t n = PyLong_AsSsize_t(v);
    if (n < 0) {
        if (n == -1) PyErr_Clear();
        return 0;
    }
    *out = n;
    return 1;
}

/* Whether keyword `name` is `interned`: by identity, else by value unless both are
 * interned (two interned strings of one value are one object). */
static int ga_name_is(PyObject *name, PyObject *interned) {
    if (name == interned) return 1;
    if (PyUnicode_CheckExact(name) && PyUnicode_CHECK_INTERNED(name)
        && PyUnicode_CHECK_INTERNED(interned)) return 0;
    return PyUnicode_Compare(name, interned) == 0;
}

/* 1 when every keyword has a running request's value (filling c), else 0 (fall back). */
static int ga_keywords(PyObject *const *values, PyObject *kwnames, GaCall *c) {
    Py_ssize_t n = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames), zero;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *v = values[i];
        int ok;
        if (ga_name_is(name, str_kw_hit) || ga_name_is(name, str_kw_hit_tokens)) {
            ok = v == Py_None;
        } else if (ga_name_is(name, str_kw_lookahead)) {
            ok = ga_exact_count(v, &c->lookahead);
        } else if (ga_name_is(name, str_kw_reserved)) {
            ok = ga_exact_count(v, &c->reserved);
        } else if (ga_name_is(name, str_kw_external) || ga_name_is(name, str_kw_encoder)) {
            ok = ga_exact_count(v, &zero) && zero == 0;
        } else if (ga_name_is(name, str_kw_scheduled)) {
            ok = PyBool_Check(v);
        } else if (ga_name_is(name, str_kw_must_fit)) {
            ok = v == Py_False;
        } else if (ga_name_is(name, str_kw_delay)) {
            ok = PyBool_Check(v);
            c->delay = v == Py_True;
        } else if (ga_name_is(name, str_lenient_counts)) {
            ok = PyBool_Check(v);
            c->lenient = v == Py_True;
        } else if (ga_name_is(name, str_num_in_flight_tokens)) {
            ok = ga_exact_count(v, &c->in_flight) && c->in_flight <= c->computed;
        } else {
            ok = 0;
        }
        if (PyErr_Occurred()) PyErr_Clear();
        if (!ok) return 0;
    }
    return 1;
}

/* tables[rid] as a borrowed exact list, or NULL (no error set). */
static PyObject *ga_table(PyObject *tables, PyObject *rid) {
    PyObject *t = da_get(tables, rid);
    return t != NULL && PyList_CheckExact(t) ? t : NULL;
}

/* SlidingWindowManager / ChunkedLocalManager.remove_skipped_blocks in C: null out and
 * free (deepest first, one free_blocks call) the real blocks before the skipped end. */
static int ga_release_window(GroupsAllocate *self, GaGroup *g, PyObject *rid,
                             Py_ssize_t processed) {
    Py_ssize_t end;
    if (g->drop == GA_DROP_WINDOW) { /* max(0, processed - w + 1) tokens skipped */
        Py_ssize_t skipped = processed - g->drop_tokens + 1;
        end = skipped > 0 ? skipped / g->block_size : 0;
    } else { /* processed // chunk * chunk_blocks */
        end = processed / g->drop_tokens * (g->drop_tokens / g->block_size);
    }
    if (end <= 0) return 0;
    PyObject *blocks = ga_table(g->tables, rid);
    if (blocks == NULL || PyList_GET_SIZE(blocks) == 0) return 0;
    if (end > PyList_GET_SIZE(blocks)) end = PyList_GET_SIZE(blocks);
    Py_ssize_t first = end;
    while (first > 0) {
        int real = PyObject_IsTrue(PyList_GET_ITEM(blocks, first - 1));
        if (real < 0) return -1;
        if (!real) break;
        first--;
    }
    if (first == end) return 0; /* nothing newly skipped (the nulls form a prefix) */
    PyObject *freed = PyList_New(end - first), *zero = PyLong_FromLong(0);
    if (freed == NULL || zero == NULL) {
        Py_XDECREF(freed);
        Py_XDECREF(zero);
        return -1;
    }
    Py_INCREF(blocks);
    for (Py_ssize_t i = end - 1, k = 0; i >= first; i--, k++) {
        PyObject *b = PyList_GET_ITEM(blocks, i);
        Py_INCREF(b);
        PyList_SET_ITEM(freed, k, b);
        if (PyList_SetItem(blocks, i, Py_NewRef(zero)) < 0) { /* steals, even on failure */
            Py_DECREF(blocks);
            Py_DECREF(freed);
            Py_DECREF(zero);
            return -1;
        }
    }
    Py_DECREF(zero);
    Py_DECREF(blocks);
    PyObject *r = PyObject_CallMethodOneArg(self->ops, str_free_blocks, freed);
    Py_DECREF(freed);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* Coordinator.allocate's window release for every dropping group, in group order. */
static int ga_release(GroupsAllocate *self, PyObject *rid, Py_ssize_t processed) {
    for (Py_ssize_t i = 0; i < self->num_groups; i++) {
        GaGroup *g = &self->g[i];
        if (g->drop == GA_DROP_NONE) continue;
        if (g->drop == GA_DROP_STATE) {
            if (hs_release(ga_table(g->tables, rid), g->released, g->last_state, rid,
                           processed, g->block_size, self->ops, str_free_blocks) < 0) {
                return -1;
            }
            continue;
        }
        if (g->drop != GA_DROP_METHOD) {
            if (ga_release_window(self, g, rid, processed) < 0) return -1;
            continue;
        }
        PyObject *n = PyLong_FromSsize_t(processed);
        if (n == NULL) return -1;
        PyObject *args[3] = {g->manager, rid, n};
        PyObject *r = PyObject_VectorcallMethod(str_remove_skipped, args,
                                                3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(n);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* manager.name(args...) as an int in *out; -1 with an exception set on an error. */
static int ga_method_count(PyObject *name, PyObject *const *args, size_t nargs,
                           Py_ssize_t *out) {
    PyObject *r = PyObject_VectorcallMethod(name, args, nargs, NULL);
    if (r == NULL) return -1;
    *out = PyLong_AsSsize_t(r);
    Py_DECREF(r);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* The pool's free block count, or -1 with an exception set. */
static Py_ssize_t ga_num_free(PyObject *pool) {
    PyObject *queue = PyObject_GetAttr(pool, str_free_queue);
    if (queue == NULL) return -1;
    if (Py_TYPE(queue) == &FreeQueueType) { /* the compiled queue: its count in C */
        Py_ssize_t n = ((FreeQueue *)queue)->num_free;
        Py_DECREF(queue);
        return n;
    }
    PyObject *v = PyObject_GetAttr(queue, str_num_free);
    Py_DECREF(queue);
    if (v == NULL) return -1;
    Py_ssize_t n = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    return n;
}

/* group_allocation.grow_running's zeroing: group i's real new blocks appended to new_block_ids[i]. */
static int ga_record_zeroing(GroupsAllocate *self, Py_ssize_t i, PyObject *new) {
    if (i >= PyList_GET_SIZE(self->zeroing) || i >= PyList_GET_SIZE(self->new_ids)) return 0;
    int on = PyObject_IsTrue(PyList_GET_ITEM(self->zeroing, i));
    if (on <= 0) return on;
    PyObject *seq = PySequence_Fast(new, "new blocks must be a sequence");
    if (seq == NULL) return -1;
    PyObject *ids = PyList_GET_ITEM(self->new_ids, i);
    if (!PyList_CheckExact(ids)) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_TypeError, "new_block_ids must hold lists");
        return -1;
    }
    Py_INCREF(ids);
    int rc = 0;
    for (Py_ssize_t k = 0; rc == 0 && k < PySequence_Fast_GET_SIZE(seq); k++) {
        PyObject *b = PySequence_Fast_GET_ITEM(seq, k);
        int real = PyObject_IsTrue(b);
        rc = real < 0 ? -1 : real ? PyList_Append(ids, b) : 0;
    }
    Py_DECREF(ids);
    Py_DECREF(seq);
    return rc;
}

/* group_allocation.grow_running, first half: per group the blocks to add (plain groups) or the slots
 * (method groups) in counts[], and the blocks needed in *needed. 0, or -1 on an error. */
static int ga_count(GroupsAllocate *self, PyObject *rid, Py_ssize_t num_tokens,
                    Py_ssize_t main, Py_ssize_t total_computed, Py_ssize_t *counts,
                    Py_ssize_t *needed) {
    *needed = 0;
    for (Py_ssize_t i = 0; i < self->num_groups; i++) {
        GaGroup *g = &self->g[i];
        Py_ssize_t n;
        if (g->grow == GA_GROW_PLAIN) {
            PyObject *table = ga_table(g->tables, rid);
            if (table == NULL) {
                PyErr_SetObject(PyExc_KeyError, rid);
                return -1;
            }
            n = (num_tokens + g->block_size - 1) / g->block_size - PyList_GET_SIZE(table);
            counts[i] = n;
        } else if (g->grow == GA_GROW_STATE) { /* MambaAlignManager's count, no hit */
            PyObject *table = ga_table(g->tables, rid);
            if (table == NULL) {
                PyErr_SetObject(PyExc_KeyError, rid);
                return -1;
            }
            n = (main + g->block_size - 1) / g->block_size > PyList_GET_SIZE(table);
            counts[i] = main;
        } else {
            Py_ssize_t slots = main;
            PyObject *a[4] = {g->manager, NULL, NULL, NULL};
            size_t nargs = 3 | PY_VECTORCALL_ARGUMENTS_OFFSET;
            if (!g->ignores_lookahead) {
                a[1] = PyLong_FromSsize_t(num_tokens);
                a[2] = PyLong_FromLong(0);
                int rc = a[1] && a[2] ? ga_method_count(str_slots_needed, a, nargs, &slots) : -1;
                Py_XDECREF(a[1]);
                Py_XDECREF(a[2]);
                if (rc < 0) return -1;
            }
            PyObject *slots_obj = PyLong_FromSsize_t(slots), *none = PyList_New(0),
                     *tc = PyLong_FromSsize_t(total_computed);
            PyObject *b[5] = {g->manager, rid, slots_obj, none, tc};
            int rc = slots_obj && none && tc
                         ? ga_method_count(str_get_num_blocks, b,
                                           5 | PY_VECTORCALL_ARGUMENTS_OFFSET, &n)
                         : -1;
            Py_XDECREF(slots_obj);
            Py_XDECREF(none);
            Py_XDECREF(tc);
            if (rc < 0) return -1;
            counts[i] = slots;
        }
        if (n > 0) *needed += n;
    }
    return 0;
}

/* Group i's growth by counts[i]: a plain table through the pool's get_new_blocks, a method
 * group through its allocate_new_blocks. A new reference to the new ids, NULL on error. */
static PyObject *ga_grow_group(GroupsAllocate *self, Py_ssize_t i, PyObject *rid,
                               Py_ssize_t count) {
    GaGroup *g = &self->g[i];
    if (g->grow == GA_GROW_STATE) {
        PyObject *table = ga_table(g->tables, rid);
        if (table == NULL) {
            PyErr_SetObject(PyExc_KeyError, rid);
            return NULL;
        }
        return hs_grow(table, g->last_state, g->allocated, rid, count, g->block_size,
                       self->ops, str_get_new_blocks);
    }
    if (g->grow != GA_GROW_PLAIN) {
        PyObject *slots = PyLong_FromSsize_t(count);
        if (slots == NULL) return NULL;
        PyObject *a[3] = {g->manager, rid, slots};
        PyObject *r = PyObject_VectorcallMethod(str_allocate_new, a,
                                                3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(slots);
        return r;
    }
    if (count <= 0) return PyList_New(0);
    PyObject *n_obj = PyLong_FromSsize_t(count);
    if (n_obj == NULL) return NULL;
    PyObject *new = PyObject_CallMethodOneArg(self->ops, str_get_new_blocks, n_obj);
    Py_DECREF(n_obj);
    if (new == NULL) return NULL;
    PyObject *table = ga_table(g->tables, rid); /* again: the pool ran Python code */
    if (table == NULL || !PyList_CheckExact(new)) {
        Py_DECREF(new);
        PyErr_SetString(PyExc_TypeError, "GroupsAllocate: a table or get_new_blocks' result "
                                         "is not a list");
        return NULL;
    }
    Py_ssize_t len = PyList_GET_SIZE(table);
    if (PyList_SetSlice(table, len, len, new) < 0) {
        Py_DECREF(new);
        return NULL;
    }
    return new;
}

/* group_allocation.grow_running after the release: the new ids per group, Py_None (a new reference)
 * when the pool is short (nothing changed), NULL on an error. */
static PyObject *ga_grow(GroupsAllocate *self, PyObject *rid, Py_ssize_t num_tokens,
                         Py_ssize_t main, Py_ssize_t headroom, Py_ssize_t total_computed) {
    Py_ssize_t small[8], needed;
    Py_ssize_t *counts = self->num_groups <= 8
                             ? small
                             : PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)self->num_groups);
    if (counts == NULL) return PyErr_NoMemory();
    PyObject *out = NULL;
    if (ga_count(self, rid, num_tokens, main, total_computed, counts, &needed) < 0) goto done;
    Py_ssize_t num_free = ga_num_free(self->pool);
    if (num_free == -1 && PyErr_Occurred()) goto done;
    if (headroom > num_free || needed > num_free - headroom) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    out = PyTuple_New(self->num_groups);
    for (Py_ssize_t i = 0; out != NULL && i < self->num_groups; i++) {
        PyObject *new = ga_grow_group(self, i, rid, counts[i]);
        if (new == NULL || ga_record_zeroing(self, i, new) < 0) {
            Py_XDECREF(new);
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, i, new);
    }
done:
    if (counts != small) PyMem_Free(counts);
    return out;
}

#include "ccore_buffer_stored.h"
#include "ccore_groups_free.h"
#include "ccore_alloc_masked.h"
#include "ccore_hybrid_step_register.h"

/* Coordinator.cache_blocks(request, end) (no re-prefillable tokens, no hash lookahead):
 * end aligned down, and a group's cache_blocks called only when its count says a block
 * became full (or it keeps no count). 0, or -1 on an error. */
static int ga_cache(GroupsAllocate *self, PyObject *request, PyObject *rid, Py_ssize_t end) {
    if (self->align > 1) end = end / self->align * self->align;
    PyObject *end_obj = NULL;
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < self->num_cache; i++) {
        GaCache *c = &self->c[i];
        if (c->cached != Py_None) {
            PyObject *v = da_get(c->cached, rid);
            Py_ssize_t n = v != NULL && PyLong_CheckExact(v) ? PyLong_AsSsize_t(v) : -1;
            if (n == -1) PyErr_Clear();
            if (n >= 0 && end / c->block_size <= n) continue;
        }
        if (c->kind != GA_CACHE_METHOD && self->reg_fn != NULL) {
            int done = ga_register(self, c, request, rid, end);
            if (done < 0) rc = -1;
            if (done <= 0) continue; /* registered in C, or an error */
        }
        if (end_obj == NULL && (end_obj = PyLong_FromSsize_t(end)) == NULL) return -1;
        PyObject *a[4] = {c->manager, request, rid, end_obj};
        PyObject *r = PyObject_VectorcallMethod(str_mgr_cache_blocks, a,
                                                4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (r == NULL) rc = -1;
        Py_XDECREF(r);
    }
    Py_XDECREF(end_obj);
    return rc;
}

/* The Python method `function` on the manager with the same arguments. */
static PyObject *ga_python(GroupsAllocate *self, PyObject *function, PyObject *const *args,
                           size_t nargsf, PyObject *kwnames) {
    return call_python(self->manager_ref, function, args, nargsf, kwnames);
}

/* 1 when every table the C steps read (plain growth, windows) is held by the request, and
 * group 0 holds it (Coordinator.allocate grows only a request in the first group's
 * tables); else 0. Reads no attribute. */
static int ga_holds(GroupsAllocate *self, PyObject *rid) {
    if (da_get(self->g[0].tables, rid) == NULL) return 0;
    for (Py_ssize_t i = 0; i < self->num_groups; i++) {
        GaGroup *g = &self->g[i];
        int c_reads = g->grow == GA_GROW_PLAIN || g->grow == GA_GROW_STATE
                      || g->drop == GA_DROP_WINDOW || g->drop == GA_DROP_CHUNK
                      || g->drop == GA_DROP_STATE;
        if (c_reads && ga_table(g->tables, rid) == NULL) return 0;
        /* a sub-block state to copy: the manager's own allocation (the Python method) */
        if (g->grow == GA_GROW_STATE && PyDict_GET_SIZE(g->partial) > 0
            && da_get(g->partial, rid) != NULL) return 0;
    }
    return 1;
}

/* The call's counts when this object takes it (1), else 0 (fall back; nothing changed). */
static int ga_accept(GroupsAllocate *self, PyObject *const *args, PyObject *kwnames,
                     PyObject *rid, GaCall *c) {
    PyObject *request = args[0];
    if (!PyUnicode_CheckExact(rid) || da_get(self->live, rid) != request) return 0;
    if ((c->computed = da_count(request, str_num_computed_tokens)) < 0) return 0;
    if (!ga_keywords(args + 2, kwnames, c)) return 0;
    c->num_tokens = request_num_tokens(self->request_type, request);
    if (c->num_tokens < 0 || c->num_tokens > self->max_model_len) return 0;
    if (c->lookahead > PY_SSIZE_T_MAX - c->computed
        || c->num_new > PY_SSIZE_T_MAX - c->computed - c->lookahead) return 0;
    if (!c->lenient && c->num_new > c->num_tokens - c->computed) return 0;
    return ga_holds(self, rid);
}

/* A request's first call, in C when plain (ccore_hybrid_first.h, included after the
 * admission kernel it runs): 1 not taken, 0 taken (*out), -1 an error. */
static int ga_first(GroupsAllocate *self, PyObject *const *args, PyObject *kwnames,
                    PyObject *rid, Py_ssize_t num_new, PyObject **out);

static PyObject *ga_call(GroupsAllocate *self, PyObject *const *args, size_t nargsf,
                         PyObject *kwnames) {
    GaCall c = {0, 0, 0, 0, 0, 0, 0, 0};
    if (PyVectorcall_NARGS(nargsf) != 2 || !ga_exact_count(args[1], &c.num_new)
        || c.num_new == 0) {
        return ga_python(self, self->function, args, nargsf, kwnames);
    }
    PyObject *mgr = da_manager_of(self->manager_ref); /* a freed manager fails every call */
    if (mgr == NULL) return NULL;
    Py_DECREF(mgr);
    PyObject *request = args[0], *rid = PyObject_GetAttr(request, str_request_id);
    if (rid == NULL) PyErr_Clear();
    if (rid != NULL && PyUnicode_CheckExact(rid) && da_get(self->live, rid) == NULL) {
        PyObject *first = NULL; /* a request's first call (ccore_hybrid_first.h) */
        int taken = ga_first(self, args, kwnames, rid, c.num_new, &first);
        if (taken <= 0) {
            Py_DECREF(rid);
            return first;
        }
    }
    if (rid == NULL || !ga_accept(self, args, kwnames, rid, &c)) {
        Py_XDECREF(rid);
        return ga_python(self, self->function, args, nargsf, kwnames);
    }
    Py_ssize_t end = c.computed + c.num_new, cache_end = end;
    if (!c.delay && c.lenient) {
        cache_end = lenient_cache_end(request, self->hash_block_size, end, c.num_tokens);
        if (cache_end < 0) {
            Py_DECREF(rid);
            return ga_python(self, self->function, args, nargsf, kwnames);
        }
    }
    /* From here on state changes: errors propagate as the Python method's would. */
    PyObject *out = NULL;
    if (ga_release(self, rid, c.computed - c.in_flight) == 0) {
        Py_ssize_t slots_end = end + c.lookahead;
        if (slots_end > self->max_model_len) slots_end = self->max_model_len;
        out = ga_grow(self, rid, slots_end, end, c.reserved, c.computed);
    }
    if (out != NULL && out != Py_None && !c.delay
        && ga_cache(self, request, rid, cache_end) < 0) {
        Py_CLEAR(out);
    }
    Py_DECREF(rid);
    return out;
}

/* KVCacheManager.cache_blocks(request, n) for a held request with a plain count within its
 * slots (KVCacheManager.cache_blocks's checks, Coordinator.num_token_slots) in C; every
 * other call to the Python method, which raises the documented errors. */
static PyObject *ga_cache_blocks(GroupsAllocate *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames) {
    Py_ssize_t n;
    if (kwnames != NULL || PyVectorcall_NARGS(nargsf) != 2 || !ga_exact_count(args[1], &n)) {
        return ga_python(self, self->cache_function, args, nargsf, kwnames);
    }
    PyObject *mgr = da_manager_of(self->manager_ref);
    if (mgr == NULL) return NULL;
    Py_DECREF(mgr);
    PyObject *request = args[0], *rid = PyObject_GetAttr(request, str_request_id);
    if (rid == NULL) PyErr_Clear();
    Py_ssize_t num_tokens = -1, slots = (Py_ssize_t)1 << 62;
    if (rid == NULL || !PyUnicode_CheckExact(rid) || da_get(self->live, rid) != request
        || (num_tokens = request_num_tokens(self->request_type, request)) < 0) goto fallback;
    for (Py_ssize_t i = 0; i < self->num_cache; i++) {
        PyObject *table = ga_table(self->c[i].tables, rid);
        if (table == NULL) goto fallback;
        Py_ssize_t s = PyList_GET_SIZE(table) * self->c[i].block_size;
        if (s < slots) slots = s;
    }
    if (n > num_tokens) n = num_tokens;
    if (n > slots) goto fallback; /* past its slots: the Python method raises */
    int rc = ga_cache(self, request, rid, n);
    Py_DECREF(rid);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
fallback:
    Py_XDECREF(rid);
    return ga_python(self, self->cache_function, args, nargsf, kwnames);
}

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
