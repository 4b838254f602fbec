"""What this installation of loaderlib was built with."""

from __future__ import annotations

from . import _threads
from ._ext import _chain, _jpeg


def build_info() -> dict:
    """Report how the native extensions were built and what they will use.

    Returns
    -------
    dict
        ``openmp`` (bool): kernels were compiled with OpenMP (False: serial build).
        ``max_threads`` (int): threads a kernel uses by default here.
        ``omp_max_threads`` (int): OpenMP's own default team size.
        ``libjpeg_turbo_version`` (str or None): the libjpeg-turbo the kernels link.
        ``libjpeg_api_version`` (int): libjpeg API level (62, 70 or 80).
        ``simd`` (bool): libjpeg-turbo was built with its SIMD routines.
        ``kernels_simd`` (str): the instruction set loaderlib's own resampling and output
        kernels run with on this CPU, ``"avx512"``, ``"avx2"``, ``"sse2"`` or ``"scalar"``
        (chosen at run time; ``LOADERLIB_SIMD=avx2|sse2|scalar`` caps it, for comparisons;
        results are bitwise equal at every level).
    """
    facts = dict(_jpeg.build_facts())
    facts["kernels_simd"] = _chain.simd_level()
    facts["max_threads"] = _threads.default_num_threads() if facts["openmp"] else 1
    return facts
