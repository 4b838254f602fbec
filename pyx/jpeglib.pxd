# The libjpeg(-turbo) interface used by loaderlib: the guarded C helpers of
# include/ll_jpeg.h (see NOTE [ Why libjpeg is wrapped in C ] there) and the version
# macros. This is the only file that declares anything from libjpeg.

cdef extern from "ll_jpeg.h":
    const int LIBJPEG_TURBO_VERSION_NUMBER
    const int JPEG_LIB_VERSION
    const int LL_JPEG_SIMD
    const int JCS_GRAYSCALE, JCS_RGB, JCS_YCbCr, JCS_CMYK, JCS_YCCK

    ctypedef struct ll_jpeg_err:
        char msg[200]
        char warn[200]
        int nwarn

    ctypedef struct ll_jpeg_dec:
        ll_jpeg_err err

    ctypedef struct ll_jpeg_info:
        int width, height, components, color_space, subsampling
        int progressive, arithmetic, precision, adobe
        int imcu_w, imcu_h

    void ll_huff_set(int on) noexcept nogil
    int ll_huff_enabled() noexcept nogil
    void ll_huff_counts(unsigned long long* installed, unsigned long long* bailed) noexcept nogil
    int ll_jpeg_create(ll_jpeg_dec* d) noexcept nogil
    void ll_jpeg_destroy(ll_jpeg_dec* d) noexcept nogil
    int ll_jpeg_header(ll_jpeg_dec* d, const unsigned char* buf, size_t size,
                       ll_jpeg_info* info) noexcept nogil
    int ll_jpeg_region(const ll_jpeg_info* info, int denom, int cx, int cy, int cw, int ch,
                       int* x0, int* y0, int* w, int* h) noexcept nogil
    int ll_jpeg_decode(ll_jpeg_dec* d, int mode, int denom, int x0, int y0, int w, int h,
                       unsigned char* out, Py_ssize_t out_stride, int strict, int fast) noexcept nogil
    int ll_jpeg_plan_item(ll_jpeg_dec* d, const unsigned char* buf, size_t size, int mode, int denom,
                          int cx, int cy, int cw, int ch, long long max_pixels, ll_jpeg_info* info,
                          int* x0, int* y0, int* oh, int* ow, int* oc, char* msg) noexcept nogil
    int ll_jpeg_decode_item(ll_jpeg_dec* d, const unsigned char* buf, size_t size, int mode, int denom,
                            int cx, int cy, int cw, int ch, long long max_pixels, int strict,
                            unsigned char* out, Py_ssize_t out_stride, int out_h, int out_w, int out_c,
                            char* msg, int fast) noexcept nogil

    # The compressor (NOTE [ The encoder ] in include/ll_jpeg.h).
    ctypedef struct ll_jpeg_enc:
        ll_jpeg_err err

    int ll_jpeg_enc_create(ll_jpeg_enc* e) noexcept nogil
    void ll_jpeg_enc_destroy(ll_jpeg_enc* e) noexcept nogil
    int ll_jpeg_encode(ll_jpeg_enc* e, const unsigned char* px, int h, int w, int c, Py_ssize_t stride,
                       int quality, int app_marker, const unsigned char* app, unsigned int app_len, void* out,
                       size_t* out_len, char* msg) noexcept nogil   # out: an ll_buf* (worker.pxd)
