# Project-wide status codes and modes (defined once, in include/ll_common.h).

cdef extern from "ll_common.h":
    enum:
        LL_OK
        LL_WARNED
        LL_ERR_DECODE
        LL_ERR_EMPTY
        LL_ERR_NOT_JPEG
        LL_ERR_TOO_LARGE
        LL_ERR_SHAPE
        LL_ERR_CROP
        LL_ERR_STRICT
        LL_ERR_NOMEM
        LL_ERR_UNSUPPORTED
        LL_ERR_STATE
        LL_ERR_READ
        LL_MODE_RGB
        LL_MODE_BGR
        LL_MODE_GRAY
        LL_MSG_LEN
