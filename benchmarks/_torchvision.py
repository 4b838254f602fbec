"""torchvision imported beside torch's CPU wheel (``check_torchvision.py`` and
``objstore_peers.py``, which run in side environments of their own)."""

from __future__ import annotations

import sys
import types
from typing import Any


def import_torchvision() -> Any:
    """Import torchvision without its compiled ops.

    NOTE [ torchvision beside CPU torch ]
    PyPI's torchvision wheel for torch 2.13 links its C++ ops (_C.so: nms, roi_align, ...)
    against the CUDA build of torch, so beside the CPU wheel the library does not load and
    torchvision's import fails while registering fake kernels for those ops. The benchmarks
    never call them (the v2 transforms are pure Python on torch tensors; MosaicML Streaming
    only imports the vision datasets): stub the registration module and import the rest.
    Raises ImportError when torchvision is not installed.
    """
    try:
        import torchvision
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision
    return torchvision
