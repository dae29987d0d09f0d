/* hash_keyed: BlockHasher's chained SHA-256 over canonical CBOR for blocks that carry
 * extra keys (LoRA, multimodal items, a cache salt), one already-encoded keys tail per
 * block. Its pure-Python twin and specification: pagedkv.core.kernels_hybrid.hash_keyed.
 * Included by ccore.c after cbor_head, read_tokens and push_digest. */

PyDoc_STRVAR(hash_keyed_doc,
"hash_keyed(hashes, tokens, start, stop, block_size, parent, tails) -> bool\n\n"
"Append to `hashes` the SHA-256 CBOR chained hashes of the blocks of `tokens` (a list)\n"
"in [start, stop) (multiples of block_size), block k's hash input being\n"
"[parent, tokens, keys] with `tails[k]` the canonical CBOR of its keys (bytes). The first\n"
"parent is `parent` (32 bytes). False, with nothing changed, when a token is not an int\n"
"in 0 .. 2**17 - 1 or the parent is not 32 bytes.");

/* One block's hash input [parent, tokens, <tail>] into out; its length. */
static size_t hk_encode(uint8_t *out, const uint8_t *parent, const uint32_t *tokens,
                        Py_ssize_t bs, PyObject *tail) {
    size_t len = encode_block(out, parent, tokens, bs) - 1; /* drop encode_block's None */
    Py_ssize_t n = PyBytes_GET_SIZE(tail);
    memcpy(out + len, PyBytes_AS_STRING(tail), (size_t)n);
    return len + (size_t)n;
}

/* The longest tail, or -1 (TypeError set) when `tails` is not n bytes objects. */
static Py_ssize_t hk_longest_tail(PyObject *tails, Py_ssize_t n) {
    if (!PyList_Check(tails) || PyList_GET_SIZE(tails) != n) {
        PyErr_SetString(PyExc_TypeError, "hash_keyed: tails must be a list, one per block");
        return -1;
    }
    Py_ssize_t longest = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *t = PyList_GET_ITEM(tails, k);
        if (!PyBytes_Check(t)) {
            PyErr_SetString(PyExc_TypeError, "hash_keyed: every tail must be bytes");
            return -1;
        }
        if (PyBytes_GET_SIZE(t) > longest) longest = PyBytes_GET_SIZE(t);
    }
    return longest;
}

static PyObject *hash_keyed(PyObject *self, PyObject *args) {
    PyObject *hashes, *tokens, *parent_obj, *tails;
    Py_ssize_t start, stop, bs;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!nnnOO:hash_keyed", &PyList_Type, &hashes, &PyList_Type,
                          &tokens, &start, &stop, &bs, &parent_obj, &tails)) {
        return NULL;
    }
    if (bs <= 0 || start < 0 || stop > PyList_GET_SIZE(tokens) || start > stop ||
        (stop - start) % bs != 0) {
        PyErr_SetString(PyExc_ValueError, "hash_keyed: bad block range");
        return NULL;
    }
    Py_ssize_t n = stop - start, longest = hk_longest_tail(tails, n / bs);
    if (longest < 0) return NULL;
    if (!PyBytes_Check(parent_obj) || PyBytes_GET_SIZE(parent_obj) != DIGEST_BYTES) {
        Py_RETURN_FALSE;
    }
    uint8_t parent[DIGEST_BYTES];
    memcpy(parent, PyBytes_AS_STRING(parent_obj), DIGEST_BYTES);
    uint32_t *ids = PyMem_Malloc(sizeof(uint32_t) * (size_t)(n ? n : 1));
    uint8_t *buf = PyMem_Malloc((size_t)bs * 5 + 64 + (size_t)longest);
    PyObject *result = NULL;
    if (ids == NULL || buf == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (!read_tokens(tokens, start, stop, ids)) {
        result = Py_False;
        goto done;
    }
    for (Py_ssize_t k = 0; k < n; k += bs) {
        size_t len = hk_encode(buf, parent, ids + k, bs, PyList_GET_ITEM(tails, k / bs));
        if (push_digest(hashes, buf, len, parent) < 0) goto done;
    }
    result = Py_True;
done:
    PyMem_Free(ids);
    PyMem_Free(buf);
    Py_XINCREF(result);
    return result;
}
