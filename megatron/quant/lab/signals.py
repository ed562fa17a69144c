"""SIGTERM/SIGINT during a sweep: forwarded to the running training processes' groups, which end
(killed ``KILL_AFTER_S`` after the signal if still alive); the sweep then raises ``SweepInterrupted``.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Sequence

from megatron.quant.training.lifetime import die_with_parent


class SweepInterrupted(Exception):
    """The sweep received SIGTERM or SIGINT; the runs' processes got it too and have ended."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


KILL_AFTER_S = 60.0  # a run still alive this long after the forwarded signal is killed


class SignalForwarder:
    """While entered (main thread), SIGTERM (what a scheduler sends) and SIGINT to the sweep go
    to the whole process group of every run started by ``run`` (torchrun and its workers), from
    any slot thread; ``run`` then waits for its run to end (SIGKILL after ``kill_after`` s) and
    raises SweepInterrupted, so run.json records "interrupted"."""

    def __init__(self, kill_after: float = KILL_AFTER_S) -> None:
        self.kill_after, self.signum = kill_after, None
        self._children: set[subprocess.Popen] = set()
        self._previous: dict = {}

    def __enter__(self) -> "SignalForwarder":
        self.signum = None
        self._previous = {signum: signal.signal(signum, self._forward) for signum in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _forward(self, signum: int, _frame=None) -> None:
        self.signum = self.signum or signum
        for child in list(self._children):  # list(): one C call, safe against slot threads
            _signal_group(child, signum)

    def run(self, command: Sequence[str], **popen: object) -> int:
        """``command``'s exit status, in its own process group, killed if this process dies."""
        child = subprocess.Popen(command, start_new_session=True, preexec_fn=die_with_parent, **popen)
        self._children.add(child)
        try:
            if self.signum is not None:  # arrived while it started
                _signal_group(child, self.signum)
            deadline = None
            while True:
                try:
                    returncode = child.wait(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    if self.signum is not None:
                        deadline = deadline or time.monotonic() + self.kill_after
                        if time.monotonic() > deadline:
                            _signal_group(child, signal.SIGKILL)
        finally:
            self._children.discard(child)
        if self.signum is not None:
            raise SweepInterrupted(self.signum)
        return returncode


def _signal_group(child: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(child.pid, signum)
    except ProcessLookupError:
        pass


FORWARDER = SignalForwarder()
