"""Helpers shared by the reliability tests: run a command the way a user does and look at
what they would see."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_command(argv: list[str], timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """``argv`` from the repository root with this worktree's package first on PYTHONPATH."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(argv, cwd=REPO, env=environment, capture_output=True, text=True, timeout=timeout)


def python_module(module: str, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return run_command([sys.executable, "-m", module, *args], timeout=timeout, **env)


def error_lines(stderr: str) -> list[str]:
    """Non-blank stderr lines without Python warnings (megatron-core warns about Transformer
    Engine and Apex on import)."""
    return [line for line in stderr.splitlines() if line.strip() and "Warning:" not in line
            and not line.strip().startswith("warnings.warn(")]


def assert_one_line_error(result: subprocess.CompletedProcess, *expected: str) -> str:
    """Exit status 2, no traceback, and exactly one error line holding every ``expected`` text."""
    lines = error_lines(result.stderr)
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in lines if "error" in line.lower()]
    assert len(errors) == 1, lines
    for text in expected:
        assert text in errors[0], (text, errors[0])
    return errors[0]


@contextmanager
def deadline(seconds: int):
    """TimeoutError if the block runs longer than ``seconds`` (a hang fails the test, not the suite)."""
    def _expired(*_):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, _expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
