"""One writer per run: a sweep locks each run it is about to execute (``fcntl.flock`` on
``OUTPUT_DIR/.locks/NAME.lock``, which holds the owner's pid) for as long as it lives, and hands the
locked descriptor to the run's trainer, so the lock lives as long as the sweep or its trainer does.
A second sweep into the same OUTPUT_DIR refuses at start, naming the run and the owner, instead of
training into the same checkpoints. The kernel drops a lock when the last process holding it dies
(``kill -9`` included): a lock never outlives its sweep and its trainer, and the trainer dies with
its sweep (``training.lifetime``)."""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator, Mapping, Sequence

LOCKS = ".locks"  # hidden: the runs report skips it (no event files)


class RunLockedError(RuntimeError):
    """A run is being executed by another live process, or its lock cannot be taken; the message
    names the run and the owner's pid or the path in the way."""


def _open_lock(path: Path, name: str) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        raise RunLockedError(f"cannot lock run {name}: {path} is not a writable lock file ({error.strerror}); "
                             f"remove it") from None


def _owner(fd: int) -> str:
    """The pid a lock file names; garbage (not a pid) reads as unknown."""
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return text if text.isdigit() else "unknown"


@contextlib.contextmanager
def run_locks(output_dir: Path, names: Sequence[str]) -> Iterator[Mapping[str, int]]:
    """Hold the lock of every run in ``names`` inside the block (its value: each run's locked
    descriptor, for the run's trainer to inherit); RunLockedError (before any is kept) when another
    process holds one or a lock cannot be made."""
    directory = output_dir / LOCKS
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RunLockedError(f"cannot make the run locks' folder {directory} ({error.strerror}); it must be a "
                             f"writable directory: remove what is there") from None
    held: dict[str, int] = {}
    try:
        for name in names:
            fd = _open_lock(directory / f"{name}.lock", name)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _owner(fd)
                os.close(fd)
                raise RunLockedError(f"run {name} in {output_dir} is being run by another sweep (pid {owner}) or a "
                                     f"trainer it started; wait for it to end, or give another OUTPUT_DIR") from None
            held[name] = fd
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield held
    finally:
        for fd in held.values():
            os.close(fd)  # the lock ends once no trainer holds an inherited copy either
