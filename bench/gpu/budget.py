"""One wall-clock budget for a whole check, and commands killed when their deadline passes.

Everything a stage measures runs in a child process (``run_command``), in a process group of its
own, so that at the deadline the whole group (pytest's workers, a training run's helpers) is
killed and the check still writes what finished.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence, TextIO


@dataclass
class Budget:
    """``total_s`` seconds of wall time from construction, read off ``clock``."""

    total_s: float
    clock: Callable[[], float] = time.monotonic
    start: float = field(init=False)

    def __post_init__(self) -> None:
        self.start = self.clock()

    @property
    def end(self) -> float:
        return self.start + self.total_s

    def remaining(self) -> float:
        return self.end - self.clock()


@dataclass(frozen=True)
class CommandResult:
    returncode: int | None  # None: killed at the deadline
    seconds: float
    output: str

    @property
    def killed(self) -> bool:
        return self.returncode is None


def run_command(argv: Sequence[str], deadline: float, log: TextIO, env: Mapping[str, str] | None = None,
                clock: Callable[[], float] = time.monotonic, cwd: str | os.PathLike | None = None) -> CommandResult:
    """Run ``argv`` until it exits or ``deadline`` (on ``clock``) passes, then kill its process group.
    Its output (stdout and stderr) goes to ``log`` as it comes and is returned."""
    start = clock()
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    process = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               errors="replace", env=None if env is None else dict(env), cwd=cwd,
                               start_new_session=True)
    lines: list[str] = []

    def pump() -> None:
        for line in process.stdout:
            lines.append(line)
            log.write(line)
        log.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        returncode: int | None = process.wait(timeout=max(0.0, deadline - clock()))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        returncode = None
    reader.join(timeout=10)  # a grandchild that left its group may still hold the pipe
    seconds = clock() - start
    log.write(f"# {'killed at the deadline' if returncode is None else f'exit {returncode}'} after {seconds:.1f} s\n")
    log.flush()
    return CommandResult(returncode, seconds, "".join(lines))
