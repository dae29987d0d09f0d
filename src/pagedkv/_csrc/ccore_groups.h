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
       GA_CACHE_MASKED = 4 /* a window's masked rule: ccore_index_mask.h */ };

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

#include "ccore_groups_step.h"

#include "ccore_buffer_stored.h"
#include "ccore_groups_free.h"
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

#include "ccore_groups_type.h"
