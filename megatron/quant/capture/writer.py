"""Bounded background writer: capture files (write, then rename) and manifest lines.

The training thread hands over host copies; one daemon thread saves them. When the bytes
waiting exceed the bound, the training thread waits (nothing is dropped) and the wait is
counted. The first error (e.g. ENOSPC) or the quota stops all capture with one warning;
training goes on.
"""
from __future__ import annotations

import json
import os
import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from megatron.quant.capture.naming import file_name, manifest_name, temporary_name



class _QuotaReached(Exception):
    pass


@dataclass
class WriteJob:
    directory: str
    metadata: dict  # JSON-serialisable; holds "rank", used for the manifest and the name
    tensor: Optional[Tensor] = None  # host copy to save; None: a manifest line only (stats mode)
    copied: Optional[Any] = None  # torch.cuda.Event recorded after the device-to-host copy

    @property
    def nbytes(self) -> int:
        return 0 if self.tensor is None else self.tensor.numel() * self.tensor.element_size()


def host_copy(tensor: Tensor) -> tuple[Tensor, Optional[Any]]:
    """A private host copy of ``tensor`` that later in-place updates cannot touch.

    CUDA: an asynchronous copy into pinned memory plus an event the writer waits on, so the
    compute stream is not synchronised. CPU: a compact clone (a view would save its whole storage).
    """
    tensor = tensor.detach()
    if tensor.is_cuda:
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return host, event
    return tensor.clone(memory_format=torch.contiguous_format), None


class BackgroundWriter:
    def __init__(self, queue_bytes: int, quota_bytes: Optional[int]) -> None:
        self._queue_bytes = queue_bytes
        self._quota_bytes = quota_bytes
        self._cond = threading.Condition()
        self._jobs: deque[Optional[WriteJob]] = deque()  # None asks the thread to exit
        self._pending_bytes = 0  # queued plus in progress
        self._pending_jobs = 0
        self._thread: Optional[threading.Thread] = None
        self._stop_reason: Optional[str] = None
        self._warned = False
        self._counter = 0
        self._manifests: dict[str, Any] = {}
        self.wait_seconds = 0.0
        self.waits = 0  # submissions that had to wait for the queue
        self.files_written = 0
        self.lines_written = 0
        self.bytes_written = 0

    @property
    def stopped(self) -> bool:
        return self._stop_reason is not None

    def submit(self, job: WriteJob) -> None:
        """Queue ``job``; waits while the queue is over its bound. Ignored once stopped."""
        cost = job.nbytes
        with self._cond:
            if self._pending_bytes and self._pending_bytes + cost > self._queue_bytes:
                start = time.perf_counter()
                while self._pending_bytes and self._pending_bytes + cost > self._queue_bytes and not self.stopped:
                    self._cond.wait()
                self.wait_seconds += time.perf_counter() - start
                self.waits += 1
            if self._stop_reason is None:
                self._jobs.append(job)
                self._pending_bytes += cost
                self._pending_jobs += 1
                self._ensure_thread()
                self._cond.notify_all()
        self.warn_if_stopped()

    def flush(self) -> None:
        """Wait until every queued job is written (or dropped after a stop)."""
        with self._cond:
            while self._pending_jobs:
                self._cond.wait()
        self.warn_if_stopped()

    def close(self) -> None:
        self.flush()
        with self._cond:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._jobs.append(None)
                self._cond.notify_all()
        if thread is not None:
            thread.join()
        for handle in self._manifests.values():
            handle.close()
        self._manifests.clear()

    def warn_if_stopped(self) -> None:
        """Emit the stop warning once, on the calling (training) thread."""
        if self._stop_reason is not None and not self._warned:
            self._warned = True
            warnings.warn(f"tensor capture stopped: {self._stop_reason}; training continues without capture",
                          RuntimeWarning, stacklevel=3)

    def stats(self) -> dict[str, float]:
        return {"files": self.files_written, "manifest_lines": self.lines_written,
                "bytes": self.bytes_written, "waits": self.waits, "wait_s": self.wait_seconds, "stopped": float(self.stopped)}

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tensor-saver-writer", daemon=True)
            self._thread.start()

    def _stop_locked(self, reason: str) -> None:
        self._stop_reason = reason
        dropped = [job for job in self._jobs if job is not None]
        self._jobs = deque(job for job in self._jobs if job is None)
        self._pending_bytes -= sum(job.nbytes for job in dropped)
        self._pending_jobs -= len(dropped)
        self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs:
                    self._cond.wait()
                job = self._jobs.popleft()
            if job is None:
                return
            try:
                self._write(job)
            except _QuotaReached as exc:
                with self._cond:
                    self._stop_locked(str(exc))
            except Exception as exc:  # a disk error (or any other) ends capture, never training
                with self._cond:
                    self._stop_locked(f"writing to {job.directory} failed: {exc!r}")
            finally:
                with self._cond:
                    self._pending_bytes -= job.nbytes
                    self._pending_jobs -= 1
                    self._cond.notify_all()

    def _write(self, job: WriteJob) -> None:
        if job.copied is not None:
            job.copied.synchronize()
        os.makedirs(job.directory, exist_ok=True)
        name = path = None
        if job.tensor is not None:
            name, path = self._unused_name(job)
        line = json.dumps({"file": name, "metadata": job.metadata}) + "\n"
        size = len(line)
        if path is not None:
            tmp = os.path.join(job.directory, temporary_name(name, os.getpid()))
            try:
                torch.save({"tensor": job.tensor, "metadata": job.metadata}, tmp)
                size += os.path.getsize(tmp)
                self._check_quota(size)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.remove(tmp)
                raise
            self.files_written += 1
        else:
            self._check_quota(size)
        manifest = self._manifest(job.directory, job.metadata["rank"])
        manifest.write(line)
        manifest.flush()
        self.bytes_written += size
        self.lines_written += 1

    def _check_quota(self, size: int) -> None:
        if self._quota_bytes is not None and self.bytes_written + size > self._quota_bytes:
            raise _QuotaReached(f"the size quota of {self._quota_bytes / 2**30:g} GB (TENSOR_SAVE_MAX_GB) "
                                f"is reached after {self.bytes_written} bytes")

    def _unused_name(self, job: WriteJob) -> tuple[str, str]:
        # The rank in the name separates ranks; skipping taken names separates restarts.
        while True:
            name = file_name(job.metadata, self._counter)
            self._counter += 1
            path = os.path.join(job.directory, name)
            if not os.path.exists(path):
                return name, path

    def _manifest(self, directory: str, rank: int):
        path = os.path.join(directory, manifest_name(rank))
        if path not in self._manifests:
            self._manifests[path] = open(path, "a", encoding="utf-8")
        return self._manifests[path]
