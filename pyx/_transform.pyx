# cython: freethreading_compatible = False
"""Single-image transform kernels (owner: loaderlib/transforms.py).

The same fixed-point resampling and counter-based randomness the fused executor
(_pipeline.pyx) uses, exposed for one image at a time so that a transform called on a
numpy image computes what the fused chain computes.
"""

from libc.stdint cimport int64_t, uint8_t, uint64_t

from _common cimport *
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
