"""One sweep at a time per run: a sweep locks each run it is about to execute (``fcntl.flock`` on
``OUTPUT_DIR/.locks/NAME.lock``, which holds the owner's pid) for as long as it lives, so a second
sweep into the same OUTPUT_DIR refuses at start, naming the run and its owner, instead of training
into the same checkpoints. The kernel drops a lock when its owner dies (``kill -9`` included): a
lock never outlives its sweep."""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator, Sequence

LOCKS = ".locks"  # hidden: the runs report skips it (no event files)


class RunLockedError(RuntimeError):
    """A run is being executed by another live process; the message names it and the owner's pid."""


@contextlib.contextmanager
def run_locks(output_dir: Path, names: Sequence[str]) -> Iterator[None]:
    """Hold the lock of every run in ``names`` inside the block; RunLockedError (before any is
    kept) when another process holds one."""
    directory = output_dir / LOCKS
    directory.mkdir(parents=True, exist_ok=True)
    held: list[int] = []
    try:
        for name in names:
            fd = os.open(directory / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
                os.close(fd)
                raise RunLockedError(f"run {name} in {output_dir} is being run by another sweep (pid {owner}); wait "
                                     f"for it to end, or give another OUTPUT_DIR") from None
            held.append(fd)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        for fd in held:
            os.close(fd)  # closing the descriptor releases the lock
