"""The sources of a Pipeline that mix other pipelines, with tf.data's semantics:
``Pipeline.sample_from_datasets`` and ``Pipeline.choose_from_datasets``.

NOTE [ Mixing pipelines ]
``sample_from_datasets(pipelines, weights, seed, stop_on_empty_dataset)`` draws, for each
element, a pipeline with probability ``weights[k]`` (normalised) and takes its next element.
A drawn pipeline that has no element left ends the output with ``stop_on_empty_dataset=True``;
otherwise it leaves the draw, which continues over the others with their weights
renormalised, until every pipeline of positive weight is used up (tf.data's two behaviours).
The draws come from ``numpy.random.default_rng([seed, 3, iteration])`` (``seed``: the
pipeline's own when not given), one uniform per draw, so an iteration is a pure function of
the seed and the iteration number, as every node is (NOTE [ Pipeline nodes ] in ``ops.py``),
and a resumed iteration replays it exactly (NOTE [ Pipeline resume ]). Unlike tf.data's
default, each iteration draws afresh (tf.data's ``rerandomize_each_iteration=True``).
``choose_from_datasets(pipelines, choices, stop_on_empty_dataset)`` takes the next element of
pipeline ``c`` for each integer ``c`` of ``choices``; an exhausted chosen pipeline ends the
output (``stop_on_empty_dataset=True``, the default) or is passed over.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from .ops import Context, Node, close, nested_key
from .plan import PipelineLike

__all__ = ["ChooseFrom", "SampleFrom"]

_SAMPLE = 3   # rng key tag (NOTE [ Mixing pipelines ])
_BLOCK = 256  # uniforms drawn at a time (the sequence does not depend on it)


class SampleFrom(Node):
    """``Pipeline.sample_from_datasets`` (NOTE [ Mixing pipelines ])."""

    label = "source Pipeline.sample_from_datasets"

    def __init__(self, parts: Sequence[PipelineLike], weights: np.ndarray, seed: int | None, stop: bool,
                 ctx: Context) -> None:
        self.parts = parts
        self.weights = weights
        self.seed = seed
        self.stop = stop
        self.ctx = ctx
        self.opens = 0

    def describe(self) -> list:
        w = ", ".join(f"{x:.3g}" for x in self.weights.tolist())
        end = "stops at the first exhausted one" if self.stop else "skips exhausted ones"
        return [("source", "python", f"sample from {len(self.parts)} pipelines, weights ({w}); {end}")]

    def open(self) -> Iterator:
        key = nested_key(self.ctx, self.opens)
        self.opens += 1
        seed = self.ctx.seed if self.seed is None else self.seed
        rng = np.random.default_rng([seed, _SAMPLE, self.ctx.iteration])
        its = [p._open_nested(key) for p in self.parts]
        live = self.weights.copy()
        cum = np.cumsum(live)
        uniforms = np.zeros(0)
        u = 0
        try:
            while cum[-1] > 0:
                if u == uniforms.size:
                    uniforms, u = rng.random(_BLOCK), 0
                k = int(np.searchsorted(cum, uniforms[u] * cum[-1], side="right"))
                u += 1
                k = min(k, len(live) - 1)
                while live[k] == 0:   # a float edge: the nearest live pipeline below
                    k -= 1
                try:
                    el = next(its[k])
                except StopIteration:
                    if self.stop:
                        return
                    live[k] = 0.0
                    cum = np.cumsum(live)
                    continue
                yield el
        finally:
            for it in its:
                close(it)


class ChooseFrom(Node):
    """``Pipeline.choose_from_datasets`` (NOTE [ Mixing pipelines ])."""

    label = "source Pipeline.choose_from_datasets"

    def __init__(self, parts: Sequence[PipelineLike], choices: PipelineLike, stop: bool, ctx: Context) -> None:
        self.parts = parts
        self.choices = choices
        self.stop = stop
        self.ctx = ctx
        self.opens = 0

    def describe(self) -> list:
        end = "stops at the first exhausted one" if self.stop else "skips exhausted ones"
        return [("source", "python", f"choose from {len(self.parts)} pipelines by a pipeline of indices; {end}")]

    def open(self) -> Iterator:
        key = nested_key(self.ctx, self.opens)
        self.opens += 1
        its = [p._open_nested(key) for p in self.parts]
        choices = self.choices._open_nested(key)
        n = len(its)
        try:
            for pos, c in enumerate(choices):
                if isinstance(c, np.ndarray) and c.ndim == 0:
                    c = c.item()
                if isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, np.integer)):
                    raise TypeError(f"choices: element {pos} is {c!r}, not an integer index of a pipeline")
                if not 0 <= int(c) < n:
                    raise ValueError(f"choices: element {pos} is {int(c)}, not in [0, {n}) (there are {n} pipelines)")
                try:
                    el = next(its[int(c)])
                except StopIteration:
                    if self.stop:
                        return
                    continue
                yield el
        finally:
            close(choices)
            for it in its:
                close(it)
