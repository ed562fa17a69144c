"""Bounded background writer: statistics, capture files (write, then link), manifest lines.

The training thread hands over snapshots; one daemon thread finishes their statistics (all
queued statistics before any file, so a summary never waits on the disk), then saves the
files and appends the manifest lines in order. When the bytes held exceed the bound, the
training thread waits (nothing is dropped) and every wait is counted. The first error (e.g.
ENOSPC) or the quota stops all capture with one warning; training goes on.

A file is written under a hidden temporary name and then hard-linked to its final name, which
fails if the name exists: writers sharing a directory (restarts, concurrent runs) never
overwrite each other; the loser takes the next counter.
"""
from __future__ import annotations

import errno
import json
import os
import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from megatron.quant.capture.manifest import ManifestFile
from megatron.quant.capture.naming import file_name, manifest_name, temporary_name
from megatron.quant.capture.snapshot import Snapshot


class _QuotaReached(Exception):
    pass


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class _ErrorKeepingSink:
    """The file object torch.save writes to; keeps the OSError that torch's zip writer would
    replace with an opaque 'unexpected pos' error, so a full disk is reported as one."""

    def __init__(self, handle) -> None:
        self._handle = handle
        self.error: Optional[OSError] = None

    def write(self, data) -> int:
        try:
            return self._handle.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self._handle.flush()


def _save(obj: dict, path: str) -> None:
    with open(path, "wb") as handle:
        sink = _ErrorKeepingSink(handle)
        try:
            torch.save(obj, sink)
        except Exception:
            if sink.error is not None:
                raise sink.error from None
            raise


@dataclass
class WriteJob:
    directory: str
    metadata: dict  # JSON-serialisable; holds "rank"; the writer adds "stats"
    snapshot: Snapshot  # its tensor (if any) is saved to a file; None: a manifest line only

    @property
    def nbytes(self) -> int:
        return self.snapshot.nbytes


class BackgroundWriter:
    """One per capture session; the thread starts with the first job."""

    def __init__(self, queue_bytes: int, quota_bytes: Optional[int],
                 on_stats: Callable[[dict], None] = lambda metadata: None) -> None:
        self._queue_bytes = queue_bytes
        self._quota_bytes = quota_bytes
        self._on_stats = on_stats  # called in the writer thread with each job's finished metadata
        self._cond = threading.Condition()
        self._stats_todo: deque[WriteJob] = deque()
        self._write_todo: deque[WriteJob] = deque()
        self._exit = False
        self._pending_bytes = 0  # queued plus in progress
        self._pending_jobs = 0
        self._pending_stats = 0
        self._thread: Optional[threading.Thread] = None
        self._stop_reason: Optional[str] = None
        self._warned = False
        self._counter = 0
        self._manifests: dict[str, ManifestFile] = {}
        self.wait_seconds = 0.0
        self.waits = 0  # times the training thread waited: full queue, summary, flush
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
            self._wait_locked(lambda: self.stopped or not self._pending_bytes
                              or self._pending_bytes + cost <= self._queue_bytes)
            if self._stop_reason is None:
                self._stats_todo.append(job)
                self._pending_bytes += cost
                self._pending_jobs += 1
                self._pending_stats += 1
                self._ensure_thread()
                self._cond.notify_all()
        self.warn_if_stopped()

    def wait_for_stats(self) -> None:
        """Wait until the statistics of every queued job are finished (files may still be pending)."""
        self._wait_until(lambda: not self._pending_stats)

    def flush(self) -> None:
        """Wait until every queued job is written (or dropped after a stop)."""
        self._wait_until(lambda: not self._pending_jobs)

    def _wait_until(self, done: Callable[[], bool]) -> None:
        with self._cond:
            self._wait_locked(done)
        self.warn_if_stopped()

    def _wait_locked(self, done: Callable[[], bool]) -> None:
        """Wait (holding the lock) until ``done()``; a training-thread wait, so it is timed and counted."""
        if not done():
            start = time.perf_counter()
            while not done():
                self._cond.wait()
            self.wait_seconds += time.perf_counter() - start
            self.waits += 1

    def close(self) -> None:
        self.flush()
        with self._cond:
            thread, self._thread = self._thread, None
            self._exit = True
            self._cond.notify_all()
        if thread is not None:
            thread.join()
        self._exit = False
        for manifest in self._manifests.values():
            try:
                manifest.close()
            except OSError as exc:  # reported like any disk error: a run never fails at exit
                with self._cond:
                    self._stop_locked(self._stop_message(os.path.dirname(manifest.path), exc))
        self._manifests.clear()
        self.warn_if_stopped()

    def warn_if_stopped(self) -> None:
        """Emit the stop warning once, on the calling (training) thread."""
        if self._stop_reason is not None and not self._warned:
            self._warned = True
            warnings.warn(self._stop_reason, RuntimeWarning, stacklevel=3)

    def stats(self) -> dict[str, float]:
        return {"files": self.files_written, "manifest_lines": self.lines_written,
                "bytes": self.bytes_written, "waits": self.waits, "wait_s": self.wait_seconds,
                "stopped": float(self.stopped)}

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tensor-saver-writer", daemon=True)
            self._thread.start()

    def _stop_locked(self, reason: str) -> None:
        if self._stop_reason is None:
            self._stop_reason = reason
        dropped = [*self._stats_todo, *self._write_todo]
        self._pending_stats -= len(self._stats_todo)
        self._stats_todo.clear()
        self._write_todo.clear()
        self._pending_bytes -= sum(job.nbytes for job in dropped)
        self._pending_jobs -= len(dropped)
        self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._stats_todo or self._write_todo or self._exit):
                    self._cond.wait()
                if self._stats_todo:
                    job, finishing_stats = self._stats_todo.popleft(), True
                elif self._write_todo:
                    job, finishing_stats = self._write_todo.popleft(), False
                else:
                    return
            try:
                if finishing_stats:
                    self._finish_stats(job)
                else:
                    self._write(job)
            except Exception as exc:  # a disk error (or any other) ends capture, never training
                with self._cond:
                    self._stop_locked(self._stop_message(job.directory, exc))
            with self._cond:
                if finishing_stats:
                    self._pending_stats -= 1
                if finishing_stats and self._stop_reason is None:
                    self._write_todo.append(job)
                else:
                    self._pending_bytes -= job.nbytes
                    self._pending_jobs -= 1
                self._cond.notify_all()

    def _stop_message(self, directory: str, exc: Exception) -> str:
        if isinstance(exc, OSError) and exc.errno in _DISK_FULL:
            return (f"disk full at {directory}: capture stopped after {self.files_written} files "
                    f"({self.bytes_written} bytes)")
        reason = str(exc) if isinstance(exc, _QuotaReached) else f"capturing to {directory} failed: {exc!r}"
        return f"tensor capture stopped: {reason}; training continues without capture"

    def _finish_stats(self, job: WriteJob) -> None:
        for event in job.snapshot.copied:
            event.synchronize()
        job.metadata["stats"] = job.snapshot.finish_stats()
        self._on_stats(job.metadata)

    def _write(self, job: WriteJob) -> None:
        os.makedirs(job.directory, exist_ok=True)
        name, file_size = None, 0
        if job.snapshot.tensor is not None:
            # The name is settled only by the link; the file's own metadata never holds it.
            candidate = file_name(job.metadata, self._counter)
            tmp = os.path.join(job.directory, temporary_name(candidate, os.getpid()))
            try:
                _save({"tensor": job.snapshot.tensor, "metadata": job.metadata}, tmp)
                file_size = os.path.getsize(tmp)
                self._check_quota(file_size + len(self._manifest_line(candidate, job)))
                name = self._link_unused_name(tmp, job)
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
        line = self._manifest_line(name, job)
        if name is None:
            self._check_quota(len(line))
        try:
            self._manifest(job.directory, job.metadata["rank"]).append(line)
        except OSError:
            if name is not None:  # no file without its manifest line
                os.remove(os.path.join(job.directory, name))
            raise
        self.files_written += name is not None
        self.bytes_written += file_size + len(line)
        self.lines_written += 1

    @staticmethod
    def _manifest_line(name: Optional[str], job: WriteJob) -> str:
        return json.dumps({"file": name, "metadata": job.metadata}) + "\n"

    def _check_quota(self, size: int) -> None:
        if self._quota_bytes is not None and self.bytes_written + size > self._quota_bytes:
            raise _QuotaReached(f"the size quota of {self._quota_bytes / 2**30:g} GB (TENSOR_SAVE_MAX_GB) "
                                f"is reached after {self.bytes_written} bytes")

    def _link_unused_name(self, tmp: str, job: WriteJob) -> str:
        """Link ``tmp`` to the first free name from this rank's counter on; exclusive across processes."""
        while True:
            name = file_name(job.metadata, self._counter)
            self._counter += 1
            try:
                os.link(tmp, os.path.join(job.directory, name))
            except FileExistsError:
                continue  # another writer (or an earlier run) owns it
            return name

    def _manifest(self, directory: str, rank: int) -> ManifestFile:
        path = os.path.join(directory, manifest_name(rank))
        if path not in self._manifests:
            self._manifests[path] = ManifestFile(path)
        return self._manifests[path]
