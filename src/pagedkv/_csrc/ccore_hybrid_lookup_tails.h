/* extra_tails: per block of a request's new full blocks, the canonical CBOR of its extra
 * keys (LoRA, multimodal items, cache salt), and the keys themselves for the stored
 * events. Pure-Python twin and specification:
 * pagedkv.core.kernels_hybrid_lookup.extra_tails (which is
 * pagedkv.core.kernels_hybrid.block_tails). Included by ccore.c after cbor_head.
 *
 * Not covered (None, nothing changed; the caller takes the pure path): prompt
 * embeddings, a LoRA path that is not a str, text that UTF-8 cannot encode, anything that
 * is not the HashExtras shape. */

/* A growable byte buffer; its storage starts on the stack. */
typedef struct {
    uint8_t *p;
    size_t len, cap;
    uint8_t small[256];
} et_buf;

static int et_put(et_buf *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = (b->len + n) * 2;
        uint8_t *grown = PyMem_Malloc(cap);
        if (grown == NULL) return -1;
        memcpy(grown, b->p, b->len);
        if (b->p != b->small) PyMem_Free(b->p);
        b->p = grown;
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

static int et_head(et_buf *b, unsigned major, uint64_t value) {
    uint8_t head[9];
    return et_put(b, head, cbor_head(head, major, value));
}

/* A text string: its head and its UTF-8 bytes. */
static int et_text(et_buf *b, const char *s, Py_ssize_t n) {
    if (et_head(b, 3, (uint64_t)n) < 0) return -1;
    return et_put(b, s, (size_t)n);
}

/* One str's UTF-8 (borrowed from the str); NULL, error cleared, when not encodable. */
static const char *et_utf8(PyObject *s, Py_ssize_t *n) {
    if (!PyUnicode_CheckExact(s)) return NULL;
    const char *u = PyUnicode_AsUTF8AndSize(s, n);
    if (u == NULL) PyErr_Clear();
    return u;
}

/* What one call reads from the HashExtras: borrowed objects and their UTF-8. */
typedef struct {
    PyObject *lora_name, *lora_path, *salt, *mm;
    const char *name_u, *path_u, *salt_u;
    Py_ssize_t name_n, path_n, salt_n, num_mm;
    const char **mm_u;
    Py_ssize_t *mm_n, *mm_off, *mm_len;
} et_extras;

/* Interned names, made once: the HashExtras fields read, then the key tags. */
static PyObject *et_names[6];
enum { ET_LORA_TAG = 4, ET_MM_TAG = 5 };

static int et_init_names(void) {
    static const char *text[6] = {"lora", "mm_items", "cache_salt", "prompt_embeds", "lora",
                                  "mm"};
    for (int i = 0; i < 6; i++) {
        if (et_names[i] == NULL) et_names[i] = PyUnicode_InternFromString(text[i]);
        if (et_names[i] == NULL) return -1;
    }
    return 0;
}

/* 1: read; 0: a shape not covered; -1: error. The caller frees mm_u (one allocation). */
static int et_read_extras(PyObject *extras, et_extras *x, PyObject *holder[4]) {
    for (int i = 0; i < 4; i++) {
        holder[i] = PyObject_GetAttr(extras, et_names[i]);
        if (holder[i] == NULL) {
            PyErr_Clear();
            return 0;
        }
    }
    PyObject *lora = holder[0], *mm = holder[1], *salt = holder[2];
    if (holder[3] != Py_None || !PyTuple_CheckExact(mm)) return 0;
    x->lora_name = x->lora_path = NULL;
    if (lora != Py_None) {
        if (!PyTuple_Check(lora) || PyTuple_GET_SIZE(lora) != 3) return 0;
        x->lora_name = PyTuple_GET_ITEM(lora, 0);
        x->lora_path = PyTuple_GET_ITEM(lora, 2);
        x->name_u = et_utf8(x->lora_name, &x->name_n);
        x->path_u = et_utf8(x->lora_path, &x->path_n);
        if (x->name_u == NULL || x->path_u == NULL) return 0;
    }
    x->salt = NULL;
    if (salt != Py_None) {
        if (!PyUnicode_CheckExact(salt)) return 0;
        if (PyUnicode_GET_LENGTH(salt) > 0) {
            x->salt = salt;
            x->salt_u = et_utf8(salt, &x->salt_n);
            if (x->salt_u == NULL) return 0;
        }
    }
    x->mm = mm;
    x->num_mm = PyTuple_GET_SIZE(mm);
    size_t per = sizeof(char *) + 3 * sizeof(Py_ssize_t);
    x->mm_u = PyMem_Malloc(per * (size_t)(x->num_mm ? x->num_mm : 1));
    if (x->mm_u == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    x->mm_n = (Py_ssize_t *)(x->mm_u + x->num_mm);
    x->mm_off = x->mm_n + x->num_mm;
    x->mm_len = x->mm_off + x->num_mm;
    for (Py_ssize_t i = 0; i < x->num_mm; i++) {
        PyObject *item = PyTuple_GET_ITEM(mm, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) return 0;
        x->mm_u[i] = et_utf8(PyTuple_GET_ITEM(item, 0), &x->mm_n[i]);
        x->mm_off[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 1));
        x->mm_len[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 2));
        if (PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        if (x->mm_u[i] == NULL) return 0;
    }
    return 1;
}

/* [tag, a, b] (b NULL: [tag, a]) as a new list; NULL on error. */
static PyObject *et_key(PyObject *tag, PyObject *a, PyObject *b) {
    PyObject *out = PyList_New(b == NULL ? 2 : 3);
    if (out == NULL) return NULL;
    PyList_SET_ITEM(out, 0, Py_NewRef(tag));
    PyList_SET_ITEM(out, 1, Py_NewRef(a));
    if (b != NULL) PyList_SET_ITEM(out, 2, Py_NewRef(b));
    return out;
}

/* Appends one key (as a list, when keys is not NULL) and its encoding to b. */
static int et_lora_key(et_buf *b, PyObject *keys, const et_extras *x) {
    if (et_head(b, 4, 3) < 0 || et_text(b, "lora", 4) < 0
        || et_text(b, x->name_u, x->name_n) < 0 || et_text(b, x->path_u, x->path_n) < 0)
        return -1;
    if (keys == NULL) return 0;
    PyObject *key = et_key(et_names[ET_LORA_TAG], x->lora_name, x->lora_path);
    if (key == NULL) return -1;
    int rc = PyList_Append(keys, key);
    Py_DECREF(key);
    return rc;
}

static int et_mm_key(et_buf *b, PyObject *keys, const et_extras *x, Py_ssize_t i,
                     Py_ssize_t rel) {
    if (et_head(b, 4, 3) < 0 || et_text(b, "mm", 2) < 0
        || et_text(b, x->mm_u[i], x->mm_n[i]) < 0
        || (rel >= 0 ? et_head(b, 0, (uint64_t)rel) : et_head(b, 1, (uint64_t)(-1 - rel))) < 0)
        return -1;
    if (keys == NULL) return 0;
    PyObject *off = PyLong_FromSsize_t(rel);
    if (off == NULL) return -1;
    PyObject *ident = PyTuple_GET_ITEM(PyTuple_GET_ITEM(x->mm, i), 0);
    PyObject *key = et_key(et_names[ET_MM_TAG], ident, off);
    Py_DECREF(off);
    if (key == NULL) return -1;
    int rc = PyList_Append(keys, key);
    Py_DECREF(key);
    return rc;
}

static int et_salt_key(et_buf *b, PyObject *keys, const et_extras *x) {
    if (et_head(b, 4, 2) < 0 || et_text(b, "cache_salt", 10) < 0
        || et_text(b, x->salt_u, x->salt_n) < 0)
        return -1;
    if (keys == NULL) return 0;
    PyObject *key = et_key(et_names[2], x->salt, NULL);
    if (key == NULL) return -1;
    int rc = PyList_Append(keys, key);
    Py_DECREF(key);
    return rc;
}

/* Block [s, s + bs)'s keys (a new list, or None) into *keys_obj when want_keys, and
 * their encoding (b"\xf6" for none) into *tail. -1 on error. */
static int et_block(const et_extras *x, Py_ssize_t s, Py_ssize_t bs, int want_keys,
                    PyObject **keys_obj, PyObject **tail) {
    Py_ssize_t count = x->lora_name != NULL;
    for (Py_ssize_t i = 0; i < x->num_mm; i++)
        count += x->mm_off[i] < s + bs && x->mm_off[i] + x->mm_len[i] > s;
    count += x->salt != NULL && s == 0;
    if (count == 0) {
        *keys_obj = Py_NewRef(Py_None);
        *tail = PyBytes_FromStringAndSize("\xf6", 1);
        return *tail == NULL ? -1 : 0;
    }
    PyObject *keys = want_keys ? PyList_New(0) : NULL;
    if (want_keys && keys == NULL) return -1;
    et_buf b = {NULL, 0, sizeof b.small, {0}};
    b.p = b.small;
    int rc = et_head(&b, 4, (uint64_t)count);
    if (rc == 0 && x->lora_name != NULL) rc = et_lora_key(&b, keys, x);
    for (Py_ssize_t i = 0; rc == 0 && i < x->num_mm; i++) {
        if (x->mm_off[i] < s + bs && x->mm_off[i] + x->mm_len[i] > s)
            rc = et_mm_key(&b, keys, x, i, x->mm_off[i] - s);
    }
    if (rc == 0 && x->salt != NULL && s == 0) rc = et_salt_key(&b, keys, x);
    *tail = rc == 0 ? PyBytes_FromStringAndSize((const char *)b.p, (Py_ssize_t)b.len) : NULL;
    if (b.p != b.small) PyMem_Free(b.p);
    if (*tail == NULL) {
        Py_XDECREF(keys);
        return -1;
    }
    *keys_obj = want_keys ? keys : Py_NewRef(Py_None);
    return 0;
}

/* Whether block [s, s + bs) has keys beyond the LoRA key (a multimodal item or the salt). */
static int et_special(const et_extras *x, Py_ssize_t s, Py_ssize_t bs) {
    if (x->salt != NULL && s == 0) return 1;
    for (Py_ssize_t i = 0; i < x->num_mm; i++)
        if (x->mm_off[i] < s + bs && x->mm_off[i] + x->mm_len[i] > s) return 1;
    return 0;
}

/* The tails and keys of blocks [start, stop) into the new lists tails and keys (NULL:
 * no keys wanted). Blocks with only the LoRA key, or none, share one tail. */
static int et_fill(const et_extras *x, Py_ssize_t start, Py_ssize_t bs, Py_ssize_t n,
                   PyObject *tails, PyObject *keys) {
    PyObject *shared = NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t s = start + k * bs;
        PyObject *key = NULL, *tail = NULL;
        if (et_special(x, s, bs) || shared == NULL) {
            if (et_block(x, s, bs, keys != NULL, &key, &tail) < 0) goto fail;
            if (shared == NULL && !et_special(x, s, bs)) shared = Py_NewRef(tail);
        } else {
            tail = Py_NewRef(shared);
            if (keys != NULL && x->lora_name != NULL) {
                PyObject *lora = et_key(et_names[ET_LORA_TAG], x->lora_name, x->lora_path);
                key = lora == NULL ? NULL : PyList_New(1);
                if (key == NULL) {
                    Py_XDECREF(lora);
                    Py_DECREF(tail);
                    goto fail;
                }
                PyList_SET_ITEM(key, 0, lora);
            } else {
                key = Py_NewRef(Py_None);
            }
        }
        PyList_SET_ITEM(tails, k, tail);
        if (keys != NULL) PyList_SET_ITEM(keys, k, key);
        else Py_XDECREF(key);
    }
    Py_XDECREF(shared);
    return 0;
fail:
    Py_XDECREF(shared);
    return -1;
}

PyDoc_STRVAR(extra_tails_doc,
"extra_tails(extras, start, stop, block_size, keys_out) -> list | None\n\n"
"Per block of [start, stop), the canonical CBOR of its extra keys; the keys appended to\n"
"keys_out (a list, or None) (pagedkv.core.kernels_hybrid_lookup.extra_tails). None, with\n"
"nothing changed, for extras it does not cover (prompt embeddings, a LoRA path that is\n"
"not a str, text UTF-8 cannot encode).");

static PyObject *extra_tails(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "extra_tails takes 5 arguments");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), stop = PyLong_AsSsize_t(args[2]);
    Py_ssize_t bs = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) return NULL;
    PyObject *keys_out = args[4];
    if (bs <= 0 || start < 0 || stop < start || (stop - start) % bs
        || (keys_out != Py_None && !PyList_Check(keys_out)))
        Py_RETURN_NONE;
    if (et_init_names() < 0) return NULL;
    PyObject *holder[4] = {NULL, NULL, NULL, NULL};
    et_extras x = {0};
    int got = et_read_extras(args[0], &x, holder);
    PyObject *tails = NULL, *keys = NULL, *out = NULL;
    if (got <= 0) {
        out = got < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    Py_ssize_t n = (stop - start) / bs;
    tails = PyList_New(n);
    keys = keys_out == Py_None ? NULL : PyList_New(n);
    if (tails == NULL || (keys_out != Py_None && keys == NULL)) goto done;
    if (et_fill(&x, start, bs, n, tails, keys) < 0) goto done;
    if (keys != NULL) {
        Py_ssize_t end = PyList_GET_SIZE(keys_out);
        if (PyList_SetSlice(keys_out, end, end, keys) < 0) goto done;
    }
    out = Py_NewRef(tails);
done:
    PyMem_Free(x.mm_u);
    Py_XDECREF(tails);
    Py_XDECREF(keys);
    for (int i = 0; i < 4; i++) Py_XDECREF(holder[i]);
    return out;
}
