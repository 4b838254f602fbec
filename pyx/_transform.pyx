# cython: freethreading_compatible = False
"""Single-image transform kernels (owner: the loaderlib/transforms/ package).

The same fixed-point resampling and counter-based randomness the fused executor
(_chain.pyx) uses, exposed for one image at a time so that a transform called on a
numpy image computes what the fused chain computes.
"""

from libc.stdint cimport int64_t, uint8_t, uint64_t

import numpy as np

from _common cimport *
from augment cimport *
from fused cimport *

INTERP_LINEAR = LL_INTERP_LINEAR
INTERP_AREA = LL_INTERP_AREA
INTERP_NEAREST = LL_INTERP_NEAREST


def resize_into(const uint8_t[:, :, ::1] src not None, uint8_t[:, :, ::1] dst not None, int interp,
                bint antialias):
    """Resize one HWC uint8 image into ``dst`` (its shape gives the output size).

    Bilinear and area follow cv2.INTER_LINEAR / cv2.INTER_AREA within +-1, nearest takes
    the pixel under each output pixel's centre (NOTE [ Resampling geometry ] in ll_resize.h). Runs
    without the GIL; thread-safe (scratch is per call).
    """
    cdef int sh = src.shape[0], sw = src.shape[1], C = src.shape[2]
    cdef int dh = dst.shape[0], dw = dst.shape[1]
    if dst.shape[2] != C:
        raise ValueError(f"resize_into: channel mismatch ({C} vs {dst.shape[2]})")
    if C < 1 or C > 4:
        raise ValueError(f"resize_into: 1 to 4 channels supported, got {C}")
    if sh < 1 or sw < 1 or dh < 1 or dw < 1:
        raise ValueError("resize_into: empty image")
    if interp not in (LL_INTERP_LINEAR, LL_INTERP_AREA, LL_INTERP_NEAREST):
        raise ValueError(f"resize_into: unknown interpolation code {interp}")
    cdef int st
    with nogil:
        st = ll_resize_image(&src[0, 0, 0], sh, sw, C, &dst[0, 0, 0], dh, dw, interp, antialias)
    if st != LL_OK:
        raise MemoryError("resize_into: out of memory")


def rng_key(uint64_t seed, uint64_t epoch, uint64_t index, uint64_t pos):
    """The native generator's key (NOTE [ Counter-based sample randomness ] in ll_rng.h)."""
    return ll_rng_key(seed, epoch, index, pos)


def rng_u64(uint64_t key, uint64_t ctr):
    """Draw number ``ctr`` of the stream ``key`` (64 random bits)."""
    return ll_rng_u64(key, ctr)


def rng_uniform(uint64_t key, uint64_t ctr):
    """Draw number ``ctr`` of the stream ``key`` as a double in [0, 1)."""
    return ll_rng_uniform(key, ctr)


def rrc_params(uint64_t key, int width, int height, double s0, double s1, double r0, double r1):
    """RandomResizedCrop's box ``(top, left, height, width)`` as the native executor draws it."""
    cdef int i = 0, j = 0, h = 0, w = 0
    ll_rrc_params(key, width, height, s0, s1, r0, r1, &i, &j, &h, &w)
    return i, j, h, w


# --------------------------------------------------------------------------- augmentations
# One op is a tuple (kind, ints, doubles) (include/ll_augment.h lists what each slot means).

AUG_COLOR_JITTER = LL_AUG_COLOR_JITTER
AUG_GRAYSCALE = LL_AUG_GRAYSCALE
AUG_BLUR = LL_AUG_BLUR
AUG_TRIVIAL = LL_AUG_TRIVIAL
AUG_RANDAUG = LL_AUG_RANDAUG
AUG_AUTOAUG = LL_AUG_AUTOAUG
AUG_RANDOM_CROP = LL_AUG_RANDOM_CROP
AUG_ROTATION = LL_AUG_ROTATION
AUG_AFFINE = LL_AUG_AFFINE
AUG_ERASE = LL_AUG_ERASE
AUG_NPRM = LL_AUG_NPRM


cdef int _aug_from(ll_aug* op, int kind, tuple ints, tuple dbls) except -1:
    if len(ints) > LL_AUG_NI or len(dbls) > LL_AUG_ND:
        raise ValueError("augmentation: too many parameters")
    op.kind = kind
    op.pos = 0
    cdef int i
    for i in range(LL_AUG_NI):
        op.ia[i] = ints[i] if i < len(ints) else 0
    for i in range(LL_AUG_ND):
        op.da[i] = dbls[i] if i < len(dbls) else 0.0
    return 0


def aug_params(int kind, tuple ints, tuple dbls, uint64_t key, int height, int width, int channels):
    """The parameters ``ll_aug_sample`` draws for one image (what the fused chain uses):
    a float64 array of AUG_NPRM values, or None when the image is too small (RandomCrop)."""
    cdef ll_aug op
    _aug_from(&op, kind, ints, dbls)
    out = np.zeros(LL_AUG_NPRM, np.float64)
    cdef double[::1] prm = out
    if ll_aug_sample(&op, key, height, width, channels, &prm[0]) != LL_OK:
        return None
    return out


def blur_taps(int k, double sigma):
    """The ``k`` float32 taps the Gaussian blur kernel convolves with at ``sigma`` (each pass),
    those cut as negligible set to 0 (NOTE [ Blur taps ] in ll_augment.h); thread-safe."""
    if k < 1 or k > 4097:
        raise ValueError(f"blur_taps: kernel size {k} outside 1..4097")
    out = np.zeros(k, np.float32)
    cdef float[::1] wt = out
    ll_blur_taps(k, sigma, &wt[0])
    return out


def aug_apply(int kind, tuple ints, tuple dbls, const double[::1] prm not None, const uint8_t[:, :, ::1] src not None):
    """Apply a uint8 augmentation with parameters ``prm`` to one HWC image; returns a new
    image. Runs without the GIL; thread-safe (scratch per call)."""
    cdef ll_aug op
    _aug_from(&op, kind, ints, dbls)
    if prm.shape[0] != LL_AUG_NPRM:
        raise ValueError(f"aug_apply: {prm.shape[0]} parameters, expected {LL_AUG_NPRM}")
    if kind == LL_AUG_ERASE:
        raise ValueError("aug_apply: erasing runs through aug_erase")
    cdef int h = src.shape[0], w = src.shape[1], C = src.shape[2], oh = 0, ow = 0, st
    if C != 1 and C != 3:
        raise ValueError(f"augmentations take 1 or 3 channels, got {C}")
    if h < 1 or w < 1:
        raise ValueError("augmentations need a non-empty image")
    ll_aug_out_size(&op, h, w, &oh, &ow)
    out = np.empty((oh, ow, C), np.uint8)
    cdef uint8_t[:, :, ::1] dst = out
    cdef ll_buf tmp8, tmpf
    tmp8.p = NULL; tmp8.cap = 0
    tmpf.p = NULL; tmpf.cap = 0
    with nogil:
        st = ll_aug_apply(&op, &prm[0], &src[0, 0, 0], h, w, C, &dst[0, 0, 0], &tmp8, &tmpf)
        ll_buf_free(&tmp8)
        ll_buf_free(&tmpf)
    if st == LL_ERR_NOMEM:
        raise MemoryError("aug_apply: out of memory")
    if st != LL_OK:
        raise ValueError(f"aug_apply: inconsistent parameters (status {st})")
    return out


def aug_erase(int kind, tuple ints, tuple dbls, const double[::1] prm not None, uint64_t key, img not None, bint chw):
    """RandomErasing in place on one float32 or uint8 image (HWC, or CHW when ``chw``)."""
    cdef ll_aug op
    _aug_from(&op, kind, ints, dbls)
    if kind != LL_AUG_ERASE or prm.shape[0] != LL_AUG_NPRM:
        raise ValueError("aug_erase: not an erasing op")
    if not isinstance(img, np.ndarray) or img.ndim != 3 or not img.flags.c_contiguous or not img.flags.writeable:
        raise ValueError("aug_erase: img must be a writeable C-contiguous 3-d array")
    if img.dtype != np.float32 and img.dtype != np.uint8:
        raise TypeError(f"aug_erase: float32 or uint8 images, got {img.dtype}")
    cdef int C = img.shape[0] if chw else img.shape[2]
    cdef int h = img.shape[1] if chw else img.shape[0]
    cdef int w = img.shape[2] if chw else img.shape[1]
    if prm[0] != 0 and not (0 <= prm[1] and 0 <= prm[2] and 0 <= prm[3] and 0 <= prm[4]
                            and prm[1] + prm[3] <= h and prm[2] + prm[4] <= w):
        raise ValueError("aug_erase: box outside the image")
    cdef int is_float = img.dtype == np.float32
    cdef uint8_t[::1] raw = img.reshape(-1).view(np.uint8)
    if raw.shape[0] == 0:
        return img
    with nogil:
        ll_aug_erase(&op, &prm[0], key, &raw[0], is_float, chw, h, w, C)
    return img
