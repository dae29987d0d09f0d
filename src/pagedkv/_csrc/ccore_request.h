/* start_request: a new request's prompt in one call: its token ids checked and copied
 * into a new list, and its full blocks hashed (chained SHA-256 over canonical CBOR, with
 * the extra keys' tails when it has extras, their keys recorded). extend_request: the
 * same hashing for the blocks a request's growth filled. Pure-Python twins and
 * specifications: pagedkv.core.kernels_request. Included by ccore.c after encode_block
 * and push_digest (ccore.c) and the extra_tails helpers (ccore_hybrid_lookup_tails.h),
 * which they reuse.
 *
 * Not covered (None or False, nothing changed; the caller takes its checked path, which
 * raises the documented errors): tokens that are not a list or tuple of exact ints in
 * 0 .. 2**32 - 1 (start_request: non-empty), a parent that is not 32 bytes, extras
 * extra_tails does not cover. */

#define SR_TOKEN_LIMIT (1LL << 32)

/* The ids of the n objects at items into ids: 1; 0 when one is not an exact int in
 * 0 .. SR_TOKEN_LIMIT - 1. Runs no Python code (exact ints only). */
static int sr_read_ids(PyObject *const *items, Py_ssize_t n, uint32_t *ids) {
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = items[i];
        if (!PyLong_CheckExact(t)) return 0;
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(t, &overflow);
        if (overflow || v < 0 || v >= SR_TOKEN_LIMIT) return 0;
        ids[i] = (uint32_t)v;
    }
    return 1;
}

/* A new list holding tokens' n items (a list or tuple); NULL on error. */
static PyObject *sr_copy(PyObject *tokens, Py_ssize_t n) {
    PyObject *copy = PyList_New(n);
    if (copy == NULL) return NULL;
    PyObject **items = PySequence_Fast_ITEMS(tokens);  /* no Python code runs below */
    for (Py_ssize_t i = 0; i < n; i++) PyList_SET_ITEM(copy, i, Py_NewRef(items[i]));
    return copy;
}

/* The tails (a new list, one bytes per block) of the n blocks from token start and their
 * keys,
 * appended to keys_out when it is a list; *tails NULL when the extras hash as none.
 * 1: done; 0: extras not covered (nothing changed); -1: error. */
static int sr_tails(PyObject *extras, Py_ssize_t start, Py_ssize_t n, Py_ssize_t bs,
                    PyObject *keys_out, PyObject **tails, Py_ssize_t *longest) {
    *tails = NULL;
    *longest = 0;
    if (extras == Py_None) return 1;
    if (et_init_names() < 0) return -1;
    PyObject *holder[4] = {NULL, NULL, NULL, NULL};
    et_extras x = {0};
    PyObject *keys = NULL, *out = NULL;
    int rc = et_read_extras(extras, &x, holder);
    /* Nothing set (HashExtras.is_empty): the blocks hash as without extras, no keys. */
    if (rc <= 0 || (x.lora_name == NULL && x.num_mm == 0 && x.salt == NULL)) goto done;
    rc = -1;
    out = PyList_New(n);
    keys = keys_out == Py_None ? NULL : PyList_New(n);
    if (out == NULL || (keys_out != Py_None && keys == NULL)) goto done;
    if (et_fill(&x, start, bs, n, out, keys) < 0) goto done;
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t len = PyBytes_GET_SIZE(PyList_GET_ITEM(out, k));
        if (len > *longest) *longest = len;
    }
    if (keys != NULL) {
        Py_ssize_t end = PyList_GET_SIZE(keys_out);
        if (PyList_SetSlice(keys_out, end, end, keys) < 0) goto done;
    }
    *tails = Py_NewRef(out);
    rc = 1;
done:
    PyMem_Free(x.mm_u);
    Py_XDECREF(out);
    Py_XDECREF(keys);
    for (int i = 0; i < 4; i++) Py_XDECREF(holder[i]);
    return rc;
}

/* The n blocks of bs ids after parent (updated to the last digest), each with tails[k]
 * (or no keys: tails NULL), appended to hashes. 0, or -1 on error. */
static int sr_hash(PyObject *hashes, const uint32_t *ids, Py_ssize_t n, Py_ssize_t bs,
                   uint8_t *parent, PyObject *tails, Py_ssize_t longest) {
    if (n <= 0) return 0;  /* (no buffer: block_size may be any size then) */
    size_t buf_len = (size_t)bs * 5 + 64 + (size_t)longest;
    uint8_t buf_small[64 * 5 + 64 + 192];
    uint8_t *buf = buf_len <= sizeof buf_small ? buf_small : PyMem_Malloc(buf_len);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int rc = 0;
    for (Py_ssize_t k = 0; k < n && rc == 0; k++) {
        PyObject *tail = tails == NULL ? NULL : PyList_GET_ITEM(tails, k);
        size_t len = encode_block(buf, parent, ids + k * bs, bs,
                                  tail == NULL ? NULL : PyBytes_AS_STRING(tail),
                                  tail == NULL ? 0 : PyBytes_GET_SIZE(tail));
        rc = push_digest(hashes, buf, len, parent);
    }
    if (buf != buf_small) PyMem_Free(buf);
    return rc;
}

PyDoc_STRVAR(start_request_doc,
"start_request(hashes, tokens, block_size, seed, extras, keys_out) -> list | None\n\n"
"A new list of the prompt `tokens`, with the chained hashes of its full blocks of\n"
"block_size (the first parent `seed`) appended to `hashes` and, with `extras` that set\n"
"anything, their keys to `keys_out` (a list, or None)\n"
"(pagedkv.core.kernels_request.start_request). None, with nothing changed, when tokens\n"
"is not a non-empty list or tuple of ints in 0 .. 2**32 - 1, seed is not 32 bytes, or\n"
"extra_tails does not cover extras. TypeError: hashes not a list, keys_out neither a\n"
"list nor None; ValueError: block_size < 1.");

static PyObject *start_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "start_request takes 6 arguments");
        return NULL;
    }
    PyObject *hashes = args[0], *tokens = args[1], *seed = args[3], *keys_out = args[5];
    if (!PyList_CheckExact(hashes) || (keys_out != Py_None && !PyList_CheckExact(keys_out))) {
        PyErr_SetString(PyExc_TypeError,
                        "start_request: hashes must be a list, keys_out a list or None");
        return NULL;
    }
    Py_ssize_t bs = PyLong_AsSsize_t(args[2]);
    if (bs == -1 && PyErr_Occurred()) return NULL;
    if (bs <= 0) {
        PyErr_SetString(PyExc_ValueError, "start_request: block_size must be >= 1");
        return NULL;
    }
    if (!PyBytes_Check(seed) || PyBytes_GET_SIZE(seed) != DIGEST_BYTES
        || !(PyList_CheckExact(tokens) || PyTuple_CheckExact(tokens))
        || PySequence_Fast_GET_SIZE(tokens) == 0)
        Py_RETURN_NONE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(tokens);
    PyObject *copy = sr_copy(tokens, n);
    if (copy == NULL) return NULL;
    uint32_t ids_small[CHUNK_TOKENS];
    uint32_t *ids = n <= CHUNK_TOKENS ? ids_small : PyMem_Malloc(sizeof(uint32_t) * (size_t)n);
    PyObject *tails = NULL, *out = NULL;
    Py_ssize_t longest = 0;
    if (ids == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (!sr_read_ids(PySequence_Fast_ITEMS(copy), n, ids)) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    /* The extras are read (Python attributes) only now: the ids are in hand. */
    int got = sr_tails(args[4], 0, n / bs, bs, keys_out, &tails, &longest);
    if (got <= 0) {
        if (got == 0) out = Py_NewRef(Py_None);
        goto done;
    }
    uint8_t parent[DIGEST_BYTES];
    memcpy(parent, PyBytes_AS_STRING(seed), DIGEST_BYTES);
    if (sr_hash(hashes, ids, n / bs, bs, parent, tails, longest) < 0) goto done;
    out = Py_NewRef(copy);
done:
    if (ids != ids_small) PyMem_Free(ids);
    Py_XDECREF(tails);
    Py_DECREF(copy);
    return out;
}

PyDoc_STRVAR(extend_request_doc,
"extend_request(hashes, tokens, block_size, seed, extras, keys_out) -> bool\n\n"
"Append to `hashes` the chained hashes of the full blocks of block_size of `tokens` past\n"
"the len(hashes) already hashed (the first parent: the last of `hashes`, else `seed`)\n"
"and, with `extras` that set anything, their keys to `keys_out` (a list, or None)\n"
"(pagedkv.core.kernels_request.extend_request). True: done (nothing to hash included);\n"
"False, with nothing changed, when tokens is not a list or tuple, one of the new blocks'\n"
"ids is not an int in 0 .. 2**32 - 1, the parent is not 32 bytes, or extra_tails does\n"
"not cover extras. TypeError: hashes not a list, keys_out neither a list nor None;\n"
"ValueError: block_size < 1.");

static PyObject *extend_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "extend_request takes 6 arguments");
        return NULL;
    }
    PyObject *hashes = args[0], *tokens = args[1], *keys_out = args[5];
    if (!PyList_CheckExact(hashes) || (keys_out != Py_None && !PyList_CheckExact(keys_out))) {
        PyErr_SetString(PyExc_TypeError,
                        "extend_request: hashes must be a list, keys_out a list or None");
        return NULL;
    }
    Py_ssize_t bs = PyLong_AsSsize_t(args[2]);
    if (bs == -1 && PyErr_Occurred()) return NULL;
    if (bs <= 0) {
        PyErr_SetString(PyExc_ValueError, "extend_request: block_size must be >= 1");
        return NULL;
    }
    if (!(PyList_CheckExact(tokens) || PyTuple_CheckExact(tokens))) Py_RETURN_FALSE;
    Py_ssize_t done = PyList_GET_SIZE(hashes);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(tokens) / bs - done;  /* blocks to hash */
    if (n <= 0) Py_RETURN_TRUE;
    PyObject *last = done ? PyList_GET_ITEM(hashes, done - 1) : args[3];
    if (!PyBytes_Check(last) || PyBytes_GET_SIZE(last) != DIGEST_BYTES) Py_RETURN_FALSE;
    uint8_t parent[DIGEST_BYTES];
    memcpy(parent, PyBytes_AS_STRING(last), DIGEST_BYTES);
    Py_ssize_t start = done * bs, count = n * bs;
    uint32_t ids_small[CHUNK_TOKENS];
    uint32_t *ids = count <= CHUNK_TOKENS ? ids_small
                                          : PyMem_Malloc(sizeof(uint32_t) * (size_t)count);
    if (ids == NULL) return PyErr_NoMemory();
    PyObject *tails = NULL, *out = NULL;
    Py_ssize_t longest = 0;
    /* The ids are read before the extras (Python attributes): no item is held across. */
    if (!sr_read_ids(PySequence_Fast_ITEMS(tokens) + start, count, ids)) {
        out = Py_NewRef(Py_False);
        goto done;
    }
    int got = sr_tails(args[4], start, n, bs, keys_out, &tails, &longest);
    if (got <= 0) {
        if (got == 0) out = Py_NewRef(Py_False);
        goto done;
    }
    if (sr_hash(hashes, ids, n, bs, parent, tails, longest) < 0) goto done;
    out = Py_NewRef(Py_True);
done:
    if (ids != ids_small) PyMem_Free(ids);
    Py_XDECREF(tails);
    return out;
}
