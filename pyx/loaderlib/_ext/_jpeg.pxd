# The cdef classes of loaderlib._ext._jpeg that other kernel modules use, declared here so
# that they cimport them typed (``from loaderlib._ext._jpeg cimport Inputs, Workers``).
# The path mirrors the module's dotted name, which is where Cython imports the types from
# at run time.

from libc.stdint cimport uint8_t

from worker cimport ll_worker


cdef class Workers:
    """The per-thread pool (NOTE [ One per-thread pool ] in include/ll_worker.h)."""
    cdef ll_worker* w
    cdef readonly int size


cdef class Inputs:
    """Borrowed pointers into a list of buffer-protocol objects, held until released."""
    cdef Py_buffer* views
    cdef const uint8_t** ptrs
    cdef size_t* sizes
    cdef Py_ssize_t n, acquired
