"""Fault injection for the capture tests: a disk that fills up, a disk that hangs mid-file, and
processes that write into one directory at once (run with ``python -m`` as separate processes)."""
from __future__ import annotations

import builtins
import errno
import sys
import time
from pathlib import Path

import torch

from megatron.quant import position, tensor_saver
from megatron.quant.tensor_saver import CaptureSite, SaverConfig

_REAL_OPEN = builtins.open
SITE = CaptureSite("linear", "linear", 0, "decoder.layers.0.mlp.linear_fc1", "fc1", "bf16")


class FullDisk:
    """Replaces ``open`` for the files under ``root``: counts every write and close on them, and
    the ``fail_at``-th one (1-based; 0: none) writes half its data, then it and every later one
    fail with ENOSPC. Patching ``open`` reaches the capture files and manifests (and, on the
    original code, the manifests it opened with ``open`` too)."""

    def __init__(self, root: str, fail_at: int = 0) -> None:
        self.root, self.fail_at, self.events = str(root), fail_at, 0

    def open(self, file, *args, **kwargs):
        handle = _REAL_OPEN(file, *args, **kwargs)
        return _FillingFile(handle, self) if str(file).startswith(self.root) else handle

    def strike(self) -> bool:
        self.events += 1
        return 0 < self.fail_at <= self.events


class _FillingFile:
    def __init__(self, handle, disk: FullDisk) -> None:
        self._handle, self._disk = handle, disk

    def write(self, data) -> int:
        if self._disk.strike():
            self._handle.write(bytes(memoryview(data)[:len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return self._handle.write(data)

    def close(self) -> None:
        self._handle.close()
        if self._disk.strike():
            raise OSError(errno.ENOSPC, "No space left on device")

    def __enter__(self) -> "_FillingFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getattr__(self, name: str):
        return getattr(self._handle, name)


def capture_iterations(iterations: int = 2, per_iteration: int = 3) -> None:
    """A stand-in training loop: ``per_iteration`` captures of small tensors per iteration."""
    for iteration in range(iterations):
        position.set_iteration(iteration)
        position.set_microbatch(0, first_sample=iteration)
        for i in range(per_iteration):
            if tensor_saver.is_active():
                tensor_saver.capture(SITE, "forward", "pre", {"input": torch.full((64,), float(i))})
        tensor_saver.flush()


class _StallingDisk:
    """A file object that writes its first ``budget`` bytes and then hangs, like a dying disk."""

    def __init__(self, handle, budget: int):
        self._handle, self._budget = handle, budget

    def write(self, data) -> int:
        if len(data) > self._budget:
            self._handle.write(bytes(memoryview(data)[:self._budget]))
            self._handle.flush()
            time.sleep(3600)  # the parent kills the process here, mid-file
        self._budget -= len(data)
        self._handle.write(data)
        return len(data)

    def flush(self) -> None:
        self._handle.flush()


def capture_until_killed(save_dir: str) -> None:
    """Capture 4 MB tensors; the first file completes, the second hangs halfway until killed."""
    real_save = torch.save
    saves = []

    def stalling_save(obj, handle):
        saves.append(handle)
        real_save(obj, _StallingDisk(handle, budget=2**40 if len(saves) == 1 else 2**21))

    torch.save = stalling_save
    tensor_saver.configure(SaverConfig(enabled=True, save_dir=save_dir, iterations="every:1"))
    for iteration in range(2):
        position.set_iteration(iteration)
        tensor_saver.capture(SITE, "forward", "pre", {"input": torch.full((2**20,), float(iteration))})
    tensor_saver.flush()


def capture_concurrently(save_dir: str, gate: str, captures: int) -> None:
    """Wait for ``gate`` to exist, then capture as rank 0 beside the other writers; each file is
    slow to save, so every writer is between choosing a name and publishing it at the same time."""
    real_save = torch.save

    def slow_save(obj, handle):
        time.sleep(0.02)
        real_save(obj, handle)

    torch.save = slow_save
    tensor_saver.configure(SaverConfig(enabled=True, save_dir=save_dir, iterations="0"))
    position.set_iteration(0)
    while not Path(gate).exists():
        time.sleep(0.001)
    for i in range(captures):
        tensor_saver.capture(SITE, "forward", "pre", {"input": torch.full((16,), float(i))})
    tensor_saver.close()


def stats_on_a_full_disk(save_dir: str) -> None:
    """Statistics capture whose disk fills on the second manifest line; the process then exits."""
    tensor_saver.configure(SaverConfig(enabled=True, save_dir=save_dir, mode="stats", iterations="every:1"))
    builtins.open = FullDisk(save_dir, fail_at=2).open
    capture_iterations()


if __name__ == "__main__":
    command, *arguments = sys.argv[1:]
    if command == "killed":
        capture_until_killed(*arguments)
    elif command == "concurrent":
        capture_concurrently(arguments[0], arguments[1], int(arguments[2]))
    elif command == "stats_full":
        stats_on_a_full_disk(*arguments)
