"""Where a run ran: the git commit of this checkout, the machine (its hardware and software, not its
name: records are committed), and the time (run.json's records)."""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def seconds_between(start: str, end: str) -> float:
    """Seconds from one ``utc_now`` time to another."""
    return (datetime.datetime.fromisoformat(end) - datetime.datetime.fromisoformat(start)).total_seconds()


def git_commit() -> str | None:
    """HEAD of the checkout this package runs from (``+dirty`` with local changes); None outside git."""
    root = Path(__file__).resolve().parents[3]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine() -> dict:
    import torch

    return {"platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cpus": os.cpu_count(),
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
