/* Placeholder: the pool's C pieces (added below when they pay). */
static int ccore_pool_add(PyObject *m) { (void)m; return 0; }
