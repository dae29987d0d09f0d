/* The mask of a sliding window's registration (SlidingWindowManager.reachable_mask, its
 * positions left out: PrefixIndex._register_masked), read once at construction
 * (group_allocation._masked_registration), and index_register's loop (ccore_index.h),
 * declared here for GroupsAllocate's registration (ccore_hybrid_step_register.h), which
 * ccore.c includes before ccore_index.h. */

typedef struct {
    Py_ssize_t per_segment, first, shift;
} IxMask;

/* The mask at table position i: registered iff i >= shift and (i - shift) % per_segment
 * >= first (per_segment > 0: the registration's parser checks it). */
static inline int ix_reachable(const IxMask *mask, Py_ssize_t i) {
    return i >= mask->shift && (i - mask->shift) % mask->per_segment >= mask->first;
}

static PyObject *ix_register(PyObject *blocks, PyObject *hashes, Py_ssize_t start,
                             Py_ssize_t stop, PyObject *index, PyObject *dups, PyObject *bh,
                             PyObject *bg, PyObject *group, PyObject *evict,
                             const IxMask *mask);
