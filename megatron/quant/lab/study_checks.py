"""The study runner's session checked before anything starts (no corpus built, no run begun): its
seconds are finite and positive, its runs at once fit the machine (a core per run on a CPU, the
GPUs' sharing on a GPU), its launcher can be run and its ``--out`` can be written."""
from __future__ import annotations

import math
import shlex
from pathlib import Path

from megatron.quant.lab import sweep
from megatron.quant.lab.slots import SlotError
from megatron.quant.output_dir import OutputDirError, check_output_dir


class SessionError(ValueError):
    """A session option that cannot work; one line naming it, its value and what is allowed."""


def check_seconds(value: float, option: str) -> None:
    """SessionError unless ``value`` is a finite number of seconds above 0 (nan and inf are not)."""
    if not (math.isfinite(value) and value > 0):
        raise SessionError(f"{option} must be positive, got {value:g}; allowed: a finite number of seconds above 0")


def check_session(out: Path, launcher: str, runs_at_once: int) -> None:
    """SessionError for an ``--out`` that cannot be written, a ``--launcher`` that cannot run, or
    ``runs_at_once`` more than this node gives slots for."""
    try:
        check_output_dir(out, "--out")
        argv = shlex.split(launcher)
        sweep.check_launcher(argv)
        if runs_at_once > 1:
            sweep.parallel_slots(runs_at_once, argv, runs_at_once)
    except (OutputDirError, sweep.SweepError, SlotError, ValueError) as error:
        message = str(error).replace(f"--parallel {runs_at_once} ", "")  # the sweep's name for it
        raise SessionError(f"--runs-at-once {runs_at_once}: {message}" if isinstance(error, SlotError) else message) \
            from None
