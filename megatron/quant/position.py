"""The run position: the iteration and micro-batch the training run is at, and the activation-recompute
region whose forward is running.

This is the package's one explicit process-wide context (docs/interfaces.md, "Run position"). The
training loop sets it (``set_iteration``, ``set_microbatch``, ``evaluation``) whether or not anything is captured;
the layers read it to key stochastic rounding and pick a scheduled recipe's phase (``current``) and to
recognise a recomputed forward
(``region``); the capture saver reads it to name and select what it records. It imports nothing of
the package, so the layers' numbers depend on no capture code.
"""
from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Iterator, Optional

from torch import Tensor

__all__ = ["Position", "Region", "current", "set_iteration", "set_microbatch", "evaluation", "region", "within",
           "recomputing"]


@dataclass(frozen=True)
class Position:
    """Where the run is. A new object on every ``set_*`` call, so a reader that keeps the last one it
    saw can tell a change by identity."""

    iteration: int = 0
    microbatch: Optional[int] = None  # index within the iteration; None until the loop announces one
    sample: int = 0  # first global sample of the micro-batch: names it across data-parallel ranks
    serial: int = 0  # how many iterations were started: a new iteration even where its number repeats
    evaluating: bool = False  # a validation forward (a scheduled recipe's evaluation precision applies)


@dataclass(eq=False)
class Region:
    """One activation-recompute region (a checkpointed call, ``layers/recompute.py``): the position its
    first forward ran at, whether its forward is being re-run, and the delayed scales the first forward
    used, in order, for the re-run to take again."""

    at: Position
    replaying: bool = False
    scale_amaxes: deque[Tensor] = field(default_factory=deque)
    outer: Optional["Region"] = None  # the region whose forward encloses this call (nested checkpoints)


_loop = Position()  # as the training loop last set it
_replayed: Optional[Position] = None  # inside a recompute: the position of the forward being re-run
_region: Optional[Region] = None  # the innermost region whose forward is running


def current() -> Position:
    """The position of the forward running now: as the loop last set it, or inside a recompute the
    position the recomputed forward first ran at (so its stochastic rounding draws the same noise,
    whatever micro-batch a pipeline schedule is at, and a checkpoint resume continues the same keys)."""
    return _loop if _replayed is None else _replayed


def set_iteration(iteration: int) -> None:
    """Start ``iteration`` (no micro-batch announced yet)."""
    global _loop
    _loop = Position(iteration, None, 0, _loop.serial + 1)


def set_microbatch(index: int, first_sample: int) -> None:
    """``index``: micro-batch within the iteration (``sample`` in capture file names);
    ``first_sample``: its first global sample index."""
    global _loop
    _loop = Position(_loop.iteration, index, first_sample, _loop.serial)


@contextlib.contextmanager
def evaluation() -> Iterator[None]:
    """Run the block as an evaluation at the current iteration (``Position.evaluating``)."""
    global _loop
    _loop = replace(_loop, evaluating=True)
    try:
        yield
    finally:
        _loop = replace(_loop, evaluating=False)


def region() -> Optional[Region]:
    """The innermost recompute region whose forward is running; None outside any."""
    return _region


def recomputing() -> bool:
    """True inside a recomputed forward (nested regions included): its forward records were made by
    the first forward and are not made again."""
    return _replayed is not None


@contextlib.contextmanager
def within(entered: Region) -> Iterator[None]:
    """Run ``entered``'s forward inside the block; when it replays, ``current()`` is ``entered.at``."""
    global _region, _replayed
    saved = _region, _replayed
    entered.outer, _region = _region, entered
    if entered.replaying:
        _replayed = entered.at
    try:
        yield
    finally:
        _region, _replayed = saved
