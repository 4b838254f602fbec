"""Element specs of a Pipeline: shapes, dtypes and nested structure, known before the first element.

A spec is a nest (tuple, list, dict or namedtuple: the containers of ``_tree.py``) of
:class:`TensorSpec` leaves, like tf.data's ``element_spec``. ``None`` in a shape is a dimension that is not known before the data is
read (an image's height and width, the size of a batch that may come out short).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np

from .. import transforms as T
from .._tensor_spec import TensorSpec, spec_of
from .._tree import tree_map
from ..batchify import TOKEN_KEYS
from . import ops
from .plan import PipelineLike, PipelineView, Step, step_kwargs, step_label

__all__ = ["TensorSpec", "batch_spec", "relax", "spec_of", "step_spec", "unbatch_spec"]


def relax(a: Any, b: Any, what: str = "") -> Any:
    """The most specific spec both ``a`` and ``b`` fit (dimensions that differ become None).

    Raises ValueError when the structures, ranks or dtypes differ (``what`` prefixes the message).
    """

    def leaf(x: TensorSpec, y: Any) -> TensorSpec:
        if not isinstance(y, TensorSpec):
            raise ValueError(f"{what}structures differ: a single value vs {type(y).__name__}")
        if x.dtype != y.dtype:
            raise ValueError(f"{what}dtypes differ: {x.dtype.name} vs {y.dtype.name}")
        if len(x.shape) != len(y.shape):
            raise ValueError(f"{what}ranks differ: shape {x.shape} vs {y.shape}")
        return TensorSpec(tuple(p if p == q else None for p, q in zip(x.shape, y.shape)), x.dtype)

    try:
        return tree_map(leaf, a, b)
    except ValueError as e:
        msg = str(e)
        raise ValueError(msg if msg.startswith(what) else f"{what}{msg}") from None


def batch_spec(spec: Any, n: int | None) -> Any:
    """The spec of a batch of elements of ``spec`` (``n`` None: a batch may be short).

    A token sample's spec (the keys of :func:`~loaderlib.batchify.collate_tokens`, with
    ``cu_seqlens`` of unknown length) batches as that function collates: the rows stacked,
    ``cu_seqlens`` one array over the flattened batch and ``max_seqlen`` one number.
    """
    if type(spec) is dict and tuple(spec) == TOKEN_KEYS and spec["cu_seqlens"].shape == (None,):
        return {k: (s if k in ("cu_seqlens", "max_seqlen") else TensorSpec((n, *s.shape), s.dtype))
                for k, s in spec.items()}
    return tree_map(lambda s: TensorSpec((n, *s.shape), s.dtype), spec)


def unbatch_spec(spec: Any) -> Any:
    """The spec of the rows of elements of ``spec``; ValueError for a scalar component."""

    def leaf(s: TensorSpec) -> TensorSpec:
        if not s.shape:
            raise ValueError(f"cannot unbatch a scalar component ({s!r}): every component needs a leading dimension")
        return TensorSpec(s.shape[1:], s.dtype)

    return tree_map(leaf, spec)


# --------------------------------------------------------------------------- each step's spec


def _image_spec(s: TensorSpec, label: str) -> Any:
    if len(s.shape) != 3:
        raise ValueError(f"{label}: a loaderlib transform needs an HWC image, the element's image component is {s!r}")
    h, w, c = s.shape
    return T.ImageSpec(h, w, c, s.dtype, "HWC")


def _from_image_spec(spec: Any) -> TensorSpec:
    if spec.layout == "CHW":
        return TensorSpec((spec.channels, spec.height, spec.width), spec.dtype)
    return TensorSpec((spec.height, spec.width, spec.channels), spec.dtype)


def _traced(pipe: PipelineView, k: int, fn: Callable | None, label: str) -> Any:
    """The spec of ``fn``'s output on the first element of steps ``1..k-1`` (ranks and dtypes)."""
    if pipe._src.one_shot:
        # A one-shot iterator has one pass: only its first element can be peeked (and kept).
        if k > 1:
            raise ValueError(f"{label}: cannot trace the element spec through earlier steps of a one-shot iterator "
                             "(pass output_spec=, or a re-iterable source)")
        first = pipe._src.first()
    else:
        up = pipe._upstream(k - 1)
        it = iter(up._open_nested(0))
        try:
            first = next(it, ops.EMPTY)
        finally:
            ops.close(it)
            up.close()
    if first is ops.EMPTY:
        raise ValueError(f"{label}: cannot trace the element spec, the input is empty (pass output_spec=)")
    try:
        out = ops.apply_map(fn, first, ops.Context(pipe.seed, 0), 0) if fn is not None else first
    except Exception as e:
        raise ValueError(f"{label}: tracing the function on the first element failed: {type(e).__name__}: {e}") from e
    if isinstance(out, PipelineLike):
        return cast(PipelineView, out).element_spec   # a Pipeline, the one PipelineLike
    return tree_map(lambda s: TensorSpec((None,) * len(s.shape), s.dtype), spec_of(out))


def step_spec(pipe: PipelineView, k: int, step: Step, spec: Any) -> Any:
    """The element spec after step ``k`` (1-based) of ``pipe``, whose input has ``spec``;
    ValueError naming the step when it cannot be computed."""
    label = step_label(k, step)
    kw = step_kwargs(step)
    kind = step.kind
    if kind == "map":
        if kw.get("output_spec") is not None:
            return kw["output_spec"]
        fn = step.fn
        if isinstance(fn, T.Transform) and not (isinstance(fn, T.Compose) and any(
                not isinstance(t, T.Transform) for t in fn.steps)):
            img = spec[0] if isinstance(spec, tuple) else spec
            if not isinstance(img, TensorSpec):
                raise ValueError(f"{label}: a loaderlib transform needs an image component, the element is {spec!r}")
            try:
                out = _from_image_spec(fn.plan(_image_spec(img, label)))
            except (TypeError, ValueError) as e:
                msg = str(e)
                raise ValueError(msg if msg.startswith(label) else f"{label}: {msg}") from None
            return (out, *spec[1:]) if isinstance(spec, tuple) else out
        return _traced(pipe, k, fn, label)
    if kind in ("flat_map", "interleave"):
        return _traced(pipe, k, step.fn, label)
    if kind in ("filter", "shuffle", "repeat", "take", "skip", "prefetch"):
        return spec
    if kind == "cache":
        if kw.get("max_side") is not None:
            return tree_map(lambda s: TensorSpec((None, None, s.shape[2]), s.dtype)
                            if len(s.shape) == 3 and s.dtype == np.uint8 else s, spec)
        return spec
    if kind == "batch":
        return batch_spec(spec, step.args[0] if kw.get("drop_remainder") else None)
    if kind == "padded_batch":
        shapes = kw.get("padded_shapes")
        if shapes is not None:
            def leaf(s: TensorSpec, shape: Any) -> TensorSpec:
                shape = shape.dims if shape.dims is not None else (None,) * len(s.shape)
                if len(shape) != len(s.shape):
                    raise ValueError(f"{label}: padded shape {shape} does not match the component {s!r}")
                return TensorSpec(tuple(None if d is None or d < 0 else d for d in shape), s.dtype)

            try:
                spec = tree_map(leaf, spec, ops.as_leaves(shapes, spec))
            except (ValueError, TypeError, KeyError, IndexError) as e:
                msg = str(e)
                raise ValueError(msg if msg.startswith(label) else f"{label}: {msg}") from None
        return batch_spec(spec, step.args[0] if kw.get("drop_remainder") else None)
    if kind == "unbatch":
        try:
            return unbatch_spec(spec)
        except ValueError as e:
            raise ValueError(f"{label}: {e}") from None
    if kind == "concatenate":
        return relax(spec, step.args[0].element_spec, f"{label}: the element specs are not compatible: ")
    raise ValueError(f"{label}: unknown step")  # pragma: no cover
