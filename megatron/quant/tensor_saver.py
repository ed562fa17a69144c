"""The shared capture module: layers call ``is_active``/``capture``; the training loop drives it.

This is the package's only global mutable state: one capture session per process, and the
run's position (iteration, micro-batch), which the training loop sets whether or not anything
is captured: it also keys the layers' stochastic rounding (``position``). See
docs/interfaces.md section 2 for the contract and docs/capture.md for usage.

Layers::

    if tensor_saver.is_active():
        tensor_saver.capture(site, "forward", "pre", {"input": Operand(x, fmt, axis=-1), "weight": w_op})

Training loop::

    tensor_saver.configure(run_iterations=range(start_iteration, train_iters))  # config from env
    for iteration in ...:
        tensor_saver.set_iteration(iteration)
        for mb in ...:
            tensor_saver.set_microbatch(mb, first_sample)
            ...forward/backward...
        log(tensor_saver.iteration_summary())
        if tensor_saver.capture_complete():
            break
    tensor_saver.close()  # or let interpreter exit do it
"""
from __future__ import annotations

import atexit
import contextlib
from typing import Iterator, Mapping, Optional, Union

from torch import Tensor

from megatron.quant.capture.config import IterationWindow, SaverConfig
from megatron.quant.capture.session import CaptureSession
from megatron.quant.capture.site import CaptureSite, Operand

__all__ = [
    "CaptureSite", "Operand", "SaverConfig", "IterationWindow",
    "configure", "is_active", "capture", "set_iteration", "set_microbatch",
    "capture_complete", "iteration_summary", "paused", "flush", "close", "writer_stats", "position",
    "recomputing", "stats_level",
]

_session: Optional[CaptureSession] = None
_position = (0, 0)  # (iteration, first global sample of the micro-batch)
_recomputing = False  # inside an activation-recompute forward (``recomputing``)


def configure(config: Optional[SaverConfig] = None, *, run_iterations: Optional[range] = None) -> None:
    """Start a capture session (replacing any previous one, which is flushed first).

    ``config`` None reads the TENSOR_SAVE_* environment (``SaverConfig.from_env()``); a bad
    value raises ``ValueError`` here. ``run_iterations`` (e.g. ``range(start, train_iters)``)
    lets the saver guarantee a captured iteration when the window lies outside the run.
    """
    global _session
    new = CaptureSession(SaverConfig.from_env() if config is None else config, run_iterations=run_iterations)
    if _session is not None:
        _session.close()
    _session = new


def is_active() -> bool:
    """Cheap: capture is on and the current iteration, micro-batch and rank are selected."""
    return _session is not None and _session.active


def stats_level() -> Optional[str]:
    """The statistics level (``TENSOR_SAVE_STATS``) of the capture session; None without one."""
    return None if _session is None else _session.config.stats


def capture(site: CaptureSite, operation: str, phase: str,
            tensors: Mapping[str, Union[Tensor, Operand]]) -> None:
    """Record ``tensors`` (name -> tensor or Operand) seen at ``site``; a no-op when not active, and
    for forward records while ``recomputing`` (the first forward made them)."""
    if _recomputing and operation == "forward":
        return
    if _session is not None and _session.active:
        _session.capture(site, operation, phase, tensors)


def set_iteration(iteration: int) -> None:
    global _position
    _position = (iteration, 0)
    if _session is not None:
        _session.set_iteration(iteration)


def set_microbatch(index: int, first_sample: int) -> None:
    """``index``: micro-batch within the iteration (``sample`` in names); ``first_sample``: global sample index."""
    global _position
    _position = (_position[0], first_sample)
    if _session is not None:
        _session.set_microbatch(index, first_sample)


def position() -> tuple[int, int]:
    """(iteration, first global sample of the current micro-batch), as last set by the loop.

    The sample index names a micro-batch across data-parallel ranks, so two ranks' micro-batches
    never share stochastic-rounding noise, and a checkpoint resume continues the same keys.
    """
    return _position


@contextlib.contextmanager
def recomputing(at: tuple[int, int]) -> Iterator[None]:
    """Inside the block a forward is re-run for activation recompute: ``position()`` is ``at``, the
    position of the forward being recomputed (so stochastic rounding draws that forward's noise
    again, whatever micro-batch the schedule is at), and forward records are dropped; the
    backward that follows records as usual (its only run)."""
    global _position, _recomputing
    saved = _position, _recomputing
    _position, _recomputing = at, True
    try:
        yield
    finally:
        _position, _recomputing = saved


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Record nothing inside the block (e.g. validation forwards during a captured iteration)."""
    session = _session
    if session is None:
        yield
        return
    session.set_paused(True)
    try:
        yield
    finally:
        session.set_paused(False)


def capture_complete() -> bool:
    """True when exit-after-capture is on and the window's last iteration has been set and run.

    Call it after an iteration's backward passes; the loop may then end the run cleanly.
    """
    return _session is not None and _session.capture_complete()


def iteration_summary() -> dict[str, float]:
    """Aggregates of the current iteration's captures (call before the next set_iteration)."""
    return {} if _session is None else _session.iteration_summary()


def writer_stats() -> dict[str, float]:
    """Cumulative background-writer counters: files, bytes, training-thread wait seconds."""
    return {} if _session is None else _session.writer_stats()


def flush() -> None:
    """Wait until everything captured so far is on disk."""
    if _session is not None:
        _session.flush()


def close() -> None:
    """End the session: flush, close the manifests, warn if the window was never reached.

    Runs at interpreter exit; a later ``configure`` starts a new session.
    """
    global _session
    if _session is not None:
        _session.close()
        _session = None


atexit.register(close)
