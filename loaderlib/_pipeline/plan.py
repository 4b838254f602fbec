"""A pipeline's plan as data: its steps, their labels, and the digests that identify them.

:class:`PipelineLike` is what the modules of the Pipeline wing need of a pipeline (a nested
one, a part of a zip, the owner of a warm iteration); they name it instead of importing
``Pipeline``, so ``pipeline.py`` is the only module that imports all of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .. import transforms as T
from .._autotune import AUTOTUNE
from .._checks import check_int
from .._loader.analysis import _describe

__all__ = ["INDEX_STEPS", "PipelineLike", "PipelineView", "SourceView", "Step", "check_parallel", "draws_random", "fn_key", "plan_digest", "step_kwargs", "step_label",
           "steps_key"]

#: Steps that only choose and order samples (NOTE [ Pipeline compilation ] in ``pipeline.py``).
INDEX_STEPS = ("shuffle", "repeat", "take", "skip")


@runtime_checkable
class PipelineLike(Protocol):
    """What the Pipeline wing needs of a pipeline (methods only, so ``isinstance`` computes nothing).

    A pipeline also has ``seed`` and ``element_spec`` (its public properties), and ``_src``,
    ``_steps`` and ``_options`` (its source, its tuple of :class:`Step` and its
    ``PipelineOptions``), which the spec computation reads (:class:`PipelineView` types the
    first three).
    """

    def _open_nested(self, iteration: int) -> Iterator:
        """Elements of one pass inside another pipeline, as iteration ``iteration`` (``ops.nested_key``)."""
        ...

    def _fingerprint(self, upto: int | None = None) -> list:
        """What identifies the elements of steps ``1..upto`` (its source's data, its steps, the seed if random)."""
        ...

    def _upstream(self, k: int) -> PipelineLike:
        """The same source and options with the first ``k`` steps only."""
        ...

    def _warm_iteration(self, iteration: int) -> None:
        """Start iteration ``iteration``'s first segment (NOTE [ Warm iterations ] in ``pipeline.py``)."""
        ...

    def close(self) -> None:
        """Stop its engines' threads and free their arenas."""
        ...


class SourceView(Protocol):
    """What the spec computation reads of a pipeline's source (``engine._Source``, which
    imports this module: a Protocol here instead of an import back)."""

    @property
    def one_shot(self) -> bool:
        """Whether the source can be iterated once only (a plain iterator)."""
        ...

    def first(self) -> Any:
        """The source's first element (traced once)."""
        ...


class PipelineView(PipelineLike, Protocol):
    """A :class:`PipelineLike` with what the spec computation reads besides its methods: the
    seed, the element spec and the source. For type checking only: not ``runtime_checkable``,
    since ``isinstance`` would compute ``element_spec``."""

    @property
    def seed(self) -> int: ...

    @property
    def element_spec(self) -> Any: ...

    @property
    def _src(self) -> SourceView: ...


@dataclass(frozen=True)
class Step:
    """One step of a pipeline's plan (configuration only)."""

    kind: str
    fn: Any = None
    args: tuple = ()

    def describe(self) -> str:
        parts = [] if self.fn is None else [_describe(self.fn)]
        parts += [_arg(a) for a in self.args]
        return f".{self.kind}({', '.join(parts)})"


def _arg(a: Any) -> str:
    if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str):
        return f"{a[0]}={a[1]!r}"
    return repr(a)


def step_label(k: int, step: Step) -> str:
    """How messages and ``explain()`` name step ``k`` (1-based)."""
    return f"step {k} {step.describe()}"


def step_kwargs(step: Step) -> dict:
    """The step's keyword arguments (its ``(name, value)`` args)."""
    return {a[0]: a[1] for a in step.args if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str)}


def check_parallel(n: Any) -> None:
    """``num_parallel_calls``: None, ``AUTOTUNE`` or a positive integer."""
    if n is None or n == AUTOTUNE:
        return
    check_int(n, "num_parallel_calls", minimum=1)


def fn_key(fn: Any) -> str:
    """What identifies a step's function across runs: a transform's repr, else its qualified
    name and a digest of its code."""
    if fn is None:
        return ""
    if isinstance(fn, T.Transform):
        return repr(fn)
    mod = getattr(fn, "__module__", "") or ""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    code = getattr(fn, "__code__", None)
    digest = ""
    if code is not None:
        import hashlib  # here, not at import: NOTE [ What import costs ] in loaderlib/__init__.py

        digest = hashlib.sha256(code.co_code + repr(code.co_consts).encode()).hexdigest()[:16]
    return f"{mod}.{name}:{digest}"


def _arg_key(a: Any) -> Any:
    if isinstance(a, PipelineLike):
        return a._fingerprint()
    if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str):
        return [a[0], _arg_key(a[1])]
    try:
        json.dumps(a)
        return a
    except TypeError:
        return repr(a)


def draws_random(steps: tuple) -> bool:
    """Whether a step draws random numbers, or may (Python code does not say)."""
    return any(s.kind == "shuffle" or (s.fn is not None and not (isinstance(s.fn, T.Transform) and not s.fn.random))
               for s in steps)


def steps_key(steps: tuple) -> list:
    """The steps as JSON-able data (a nested pipeline by its fingerprint), for a cache's fingerprint."""
    return [[s.kind, fn_key(s.fn), [_arg_key(a) for a in s.args]] for s in steps]


def plan_digest(source_kind: str, source_what: str, steps: tuple) -> str:
    """A short digest of the source and the steps (a nested pipeline counts as "pipeline"), for ``state_dict``."""
    rows = [[s.kind, fn_key(s.fn), [_arg_key(a) if not isinstance(a, PipelineLike) else "pipeline" for a in s.args]]
            for s in steps]
    import hashlib  # here, not at import: NOTE [ What import costs ] in loaderlib/__init__.py

    return hashlib.sha256(json.dumps([source_kind, source_what, rows], default=repr).encode()).hexdigest()[:16]
