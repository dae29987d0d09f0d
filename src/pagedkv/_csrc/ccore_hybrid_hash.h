/* hash_keyed: BlockHasher's chained SHA-256 over canonical CBOR for blocks that carry
 * extra keys (LoRA, multimodal items, a cache salt), one already-encoded keys tail per
 * block. Its pure-Python twin and specification: pagedkv.core.kernels_hybrid.hash_keyed.
 * Included by ccore.c after its one block encoder and loop (encode_block, hash_blocks),
 * which hash_plain shares. */

PyDoc_STRVAR(hash_keyed_doc,
"hash_keyed(hashes, tokens, start, stop, block_size, parent, tails) -> bool\n\n"
"Append to `hashes` the SHA-256 CBOR chained hashes of the blocks of `tokens` (any\n"
"sequence) in [start, stop) (multiples of block_size), block k's hash input being\n"
"[parent, tokens, keys] with `tails[k]` the canonical CBOR of its keys (bytes). The first\n"
"parent is `parent` (32 bytes). False, with nothing changed, when a token is not an int\n"
"in 0 .. 2**17 - 1 or the parent is not 32 bytes.");

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
    if (!PyArg_ParseTuple(args, "O!OnnnOO:hash_keyed", &PyList_Type, &hashes, &tokens,
                          &start, &stop, &bs, &parent_obj, &tails)) {
        return NULL;
    }
    if (check_block_range("hash_keyed", tokens, start, stop, bs) < 0) return NULL;
    Py_ssize_t longest = hk_longest_tail(tails, (stop - start) / bs);
    if (longest < 0) return NULL;
    if (!PyBytes_Check(parent_obj) || PyBytes_GET_SIZE(parent_obj) != DIGEST_BYTES) {
        Py_RETURN_FALSE;
    }
    uint8_t parent[DIGEST_BYTES];
    memcpy(parent, PyBytes_AS_STRING(parent_obj), DIGEST_BYTES);
    return hash_blocks(hashes, tokens, start, stop, bs, parent, tails, longest);
}
