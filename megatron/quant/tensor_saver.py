"""The shared capture module: layers call ``is_active``/``capture``; the training loop drives it.

One capture session per process. The saver follows the run position (``megatron.quant.position``,
which the training loop sets whether or not anything is captured): every call here first hands the
session the iteration and micro-batch the loop has moved to since. See docs/interfaces.md section 2
for the contract and docs/capture.md for usage.

Layers::

    if tensor_saver.is_active():
        tensor_saver.capture(site, "forward", "pre", {"input": Operand(x, fmt, axis=-1), "weight": w_op})

Training loop::

    tensor_saver.configure(run_iterations=range(start_iteration, train_iters))  # config from env
    for iteration in ...:
        position.set_iteration(iteration)
        for mb in ...:
            position.set_microbatch(mb, first_sample)
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

from megatron.quant import position
from megatron.quant.capture.config import ENV_VARS, IterationWindow, SaverConfig
from megatron.quant.capture.directory import check_writable
from megatron.quant.capture.inspect_config import InspectConfigError, inspect_config_from_dict, load_inspect_config
from megatron.quant.capture.inspect_features import InspectFeature, Translation, operand_items
from megatron.quant.capture.inspect_plan import InspectPlan, resolve_inspect
from megatron.quant.capture.session import CaptureSession
from megatron.quant.capture.site import CaptureSite, Operand, expert_index, expert_module
from megatron.quant.capture.te_log import LOG_DIR as INSPECT_LOG_DIR

__all__ = [
    "CaptureSite", "Operand", "expert_index", "expert_module", "SaverConfig", "IterationWindow", "ENV_VARS",
    "configure", "is_active", "capture", "capture_complete", "iteration_summary", "paused", "flush", "close",
    "writer_stats", "stats_level", "check_writable", "InspectConfigError", "InspectPlan", "inspect_config_from_dict",
    "load_inspect_config",
    "resolve_inspect", "InspectFeature", "Translation", "operand_items", "INSPECT_LOG_DIR",
]

_session: Optional[CaptureSession] = None
_seen = position.current()  # the loop's position the session last heard of


def configure(config: Optional[SaverConfig] = None, *, run_iterations: Optional[range] = None,
              plan: Optional[InspectPlan] = None, num_layers: Optional[int] = None) -> None:
    """Start a capture session (replacing any previous one, which is flushed first).

    ``config`` None reads the TENSOR_SAVE_* environment (``SaverConfig.from_env()``); a bad
    value raises ``ValueError`` here. ``run_iterations`` (e.g. ``range(start, train_iters)``)
    lets the saver guarantee a captured iteration when the window lies outside the run. ``plan``: the
    config's nvdlfw-inspect config resolved against the run (``capture.inspect_plan``), which then
    chooses what is recorded when. ``num_layers``: the model's, which what-if recipes' layer rules count
    from (TENSOR_SAVE_WHATIF).
    """
    global _session, _seen
    new = CaptureSession(SaverConfig.from_env() if config is None else config, run_iterations=run_iterations,
                         plan=plan, num_layers=num_layers)
    if _session is not None:
        _follow()
        _session.close()
    _session, _seen = new, position.current()  # it starts at the loop's next set_iteration


def _follow() -> None:
    """Tell the session the iteration / micro-batch the loop has set since it last heard (not inside a
    recompute, whose position is an earlier forward's)."""
    global _seen
    now = position.current()
    if _session is None or now is _seen or position.recomputing():
        return
    if now.serial != _seen.serial:
        _session.set_iteration(now.iteration)
    if now.microbatch is not None:
        _session.set_microbatch(now.microbatch, now.sample)
    _seen = now


def is_active() -> bool:
    """Cheap: capture is on and the current iteration, micro-batch and rank are selected."""
    _follow()
    return _session is not None and _session.active


def stats_level() -> Optional[str]:
    """The statistics level (``TENSOR_SAVE_STATS``) of the capture session; None without one."""
    return None if _session is None else _session.config.stats


def capture(site: CaptureSite, operation: str, phase: str,
            tensors: Mapping[str, Union[Tensor, Operand]]) -> None:
    """Record ``tensors`` (name -> tensor or Operand) seen at ``site``; a no-op when not active, and
    for forward records in a recomputed forward (``position.recomputing``: the first forward made them)."""
    if operation == "forward" and position.recomputing():
        return
    _follow()
    if _session is not None and _session.active:
        _session.capture(site, operation, phase, tensors)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Record nothing inside the block (e.g. validation forwards during a captured iteration)."""
    _follow()
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
    _follow()
    return _session is not None and _session.capture_complete()


def iteration_summary() -> dict[str, float]:
    """Aggregates of the current iteration's captures (call before the next position.set_iteration)."""
    _follow()
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
        _follow()
        _session.close()
        _session = None


atexit.register(close)
