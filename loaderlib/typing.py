"""Type aliases for what a loader yields (for annotations in training code).

``loaderlib`` ships a ``py.typed`` marker, so type checkers read these and the package's
own hints.

Examples
--------
>>> from loaderlib.typing import NumpyBatch
>>> def step(batch: NumpyBatch) -> None:
...     images, labels = batch
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import numpy.typing as npt

__all__ = ["Batch", "ImageArray", "LabelArray", "NumpyBatch", "TorchBatch"]

#: A batch of images: ``(N, C, H, W)`` or ``(N, H, W, C)``; uint8, float32, float16, or
#: uint16 holding bfloat16 bits (NOTE [ bfloat16 as uint16 bits ] in transforms/_base.py).
ImageArray: TypeAlias = npt.NDArray[Any]
#: Integer class labels, ``(N,)`` int64.
LabelArray: TypeAlias = npt.NDArray[np.int64]
#: What ``DataLoader(..., output="numpy")`` yields for ``(image, label)`` datasets.
NumpyBatch: TypeAlias = tuple[ImageArray, LabelArray]

if TYPE_CHECKING:
    import torch

    #: What ``DataLoader(..., output="torch")`` yields for ``(image, label)`` datasets.
    TorchBatch: TypeAlias = tuple[torch.Tensor, torch.Tensor]
else:
    TorchBatch: TypeAlias = tuple[Any, Any]

#: Any batch: nested tuples, lists and dicts of arrays or tensors (``batchify_fn`` decides).
Batch: TypeAlias = Any
