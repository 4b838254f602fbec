# Project-wide status codes, modes and strictness levels, defined once in
# include/ll_common.h (NOTE [ Status codes ]). Extern declarations of what the kernels use;
# Python owners read every code from the table _jpeg.Status builds from ll_status_table.

cdef extern from "ll_common.h":
    enum:
        LL_OK
        LL_ERR_NOMEM
        LL_ERR_SHAPE
        LL_ERR_READ
        LL_MODE_RGB
        LL_MODE_BGR
        LL_MODE_GRAY
        LL_STRICT_NONE
        LL_STRICT_ALL
        LL_STRICT_TRUNCATED
        LL_MSG_LEN

    ctypedef struct ll_status_info:
        int code
        const char* name
        const char* message

    const ll_status_info ll_status_table[]
    const int LL_STATUS_COUNT
