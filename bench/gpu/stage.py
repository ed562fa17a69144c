"""What a stage is and what it is given: its estimate, its run and summary, and its context."""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence, TextIO

from .budget import CommandResult, run_command

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Context:
    """A running stage's view: its deadline, the log, dry run or not, and how to run a command."""

    out: Path
    scratch: Path  # the stage's own files, beside the out folder (which holds at most 8 files)
    dry_run: bool
    device: str
    deadline: float
    log: TextIO
    clock: Callable[[], float] = time.monotonic
    study_plan: Path | None = None  # the study stage's plan (--study-plan); None: docs/study/anchor-3m.yaml

    def remaining(self) -> float:
        return self.deadline - self.clock()

    def command(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> CommandResult:
        """``argv`` run from the repository root, with it on PYTHONPATH (``bench.gpu`` imports there),
        killed at the stage's deadline."""
        environ = dict(os.environ, **(env or {}))
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")]))
        environ.setdefault("PYTHONUNBUFFERED", "1")
        return run_command(argv, self.deadline, self.log, environ, self.clock, cwd=REPO)

    def python(self, module: str, *args: str, env: Mapping[str, str] | None = None) -> CommandResult:
        """``python -m module args`` in a child process."""
        return self.command([sys.executable, "-m", module, *args], env)


@dataclass(frozen=True)
class Stage:
    """One stage: ``run`` returns its JSON fields (``stopped``: True when a command was killed at the
    deadline); ``summarize`` turns them into a few lines of summary.md. Estimates are seconds."""

    name: str
    run: Callable[[Context], dict]
    summarize: Callable[[dict], list[str]]
    estimate_s: float      # on a cold GPU machine (empty compile caches)
    dry_estimate_s: float  # --dry-run on a CPU
    # A stage that fits its work to whatever time it is given (the study runner): run whenever this
    # much is left (its smallest useful work), until the budget's end; None: the estimate gates it.
    fits_itself_from_s: float | None = None
