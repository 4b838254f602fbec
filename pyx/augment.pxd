# Per-sample augmentations (include/ll_augment.h): op descriptions, parameter sampling and
# the uint8 kernels. Extern declarations only; cimported by _transform.pyx and _chain.pyx.

from libc.stdint cimport uint8_t, uint64_t

from worker cimport ll_buf


cdef extern from "ll_augment.h":
    const int LL_AUG_COLOR_JITTER, LL_AUG_GRAYSCALE, LL_AUG_BLUR, LL_AUG_TRIVIAL, LL_AUG_RANDAUG
    const int LL_AUG_AUTOAUG, LL_AUG_RANDOM_CROP, LL_AUG_ROTATION, LL_AUG_AFFINE, LL_AUG_ERASE
    const int LL_AUG_MAX, LL_AUG_NPRM, LL_AUG_NI, LL_AUG_ND

    ctypedef struct ll_aug:
        int kind
        int pos
        int ia[8]
        double da[16]

    ctypedef struct ll_aug_plan:
        int n
        ll_aug ops[16]
        int nerase
        ll_aug erase[16]

    int ll_aug_sample(const ll_aug* op, uint64_t key, int h, int w, int C, double* prm) noexcept nogil
    int ll_blur_taps(int k, double sigma, float* wt) noexcept nogil
    void ll_aug_out_size(const ll_aug* op, int h, int w, int* oh, int* ow) noexcept nogil
    int ll_aug_apply(const ll_aug* op, const double* prm, const uint8_t* src, int h, int w, int C, uint8_t* dst,
                     ll_buf* tmp8, ll_buf* tmpf) noexcept nogil
    void ll_aug_erase(const ll_aug* op, const double* prm, uint64_t key, void* out, int is_float, int chw, int h,
                      int w, int C) noexcept nogil
