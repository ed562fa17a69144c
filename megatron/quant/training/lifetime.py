"""A run's processes end with the sweep that started them. The sweep starts each run in a process
group of its own (so that SIGTERM reaches torchrun and its workers), which ``kill -9`` of the sweep,
or of the study's process group, does not reach: without this a trainer would go on writing into a
run directory whose lock is gone, beside the restarted sweep's. Linux's parent-death signal
(``prctl(PR_SET_PDEATHSIG, SIGKILL)``) ends the run's first process when the sweep ends, and each
trainer process started under a sweep (``DIE_WITH_PARENT`` in its environment) asks the same of its
own parent (torchrun). Elsewhere (no prctl) nothing changes."""
from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Optional

from megatron.quant.settings.environment import Environment, read_environment

_PR_SET_PDEATHSIG = 1
# Resolved once, here, not in the forked child (which must call nothing that could take a lock).
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent() -> None:
    """SIGKILL this process when its parent ends (and now, if it ended while this was asked). Safe as
    a ``preexec_fn``."""
    if _PRCTL is None:
        return
    parent = os.getppid()
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def trainer_dies_with_parent(environment: Optional[Environment] = None) -> None:
    """In a trainer process: die with the parent when a sweep started it (``DIE_WITH_PARENT``)."""
    if (read_environment() if environment is None else environment).die_with_parent:
        die_with_parent()
