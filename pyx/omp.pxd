# OpenMP access for every kernel. Compiles with or without OpenMP: when the build has no
# OpenMP (_OPENMP undefined), the stand-ins below make every kernel serial. Kernels never
# set the thread count: the Python owner decides it and passes num_threads to prange.

cdef extern from *:
    """
    #if defined(_OPENMP)
    #include <omp.h>
    #define LL_HAVE_OPENMP 1
    #else
    #define LL_HAVE_OPENMP 0
    static inline int omp_get_max_threads(void) { return 1; }
    static inline int omp_get_num_procs(void) { return 1; }
    static inline int omp_get_thread_num(void) { return 0; }
    static inline int omp_in_parallel(void) { return 0; }
    #endif
    """
    const int LL_HAVE_OPENMP
    int omp_get_max_threads() noexcept nogil
    int omp_get_num_procs() noexcept nogil
    int omp_get_thread_num() noexcept nogil
    int omp_in_parallel() noexcept nogil
