"""Append-only manifest files that never end in a torn line.

Each line goes out unbuffered, in one write where the system allows, so a failure cannot strand
half a line in a buffer for ``close`` to flush (and fail on) later, and concurrent writers sharing
a manifest append whole lines. When a write fails part-way (e.g. ENOSPC), the file is cut back
to its last complete line before the error propagates.
"""
from __future__ import annotations

import os

_TAIL_CHUNK = 1 << 16


class ManifestFile:
    def __init__(self, path: str) -> None:
        self.path = path
        self._file = open(path, "a+b", buffering=0)

    def append(self, line: str) -> None:
        """Write ``line`` (ending in a newline) whole, or leave the file as it was and raise."""
        data = memoryview(line.encode("utf-8"))
        try:
            while data:
                data = data[self._file.write(data):]
        except OSError:
            self._cut_torn_line()
            raise

    def close(self) -> None:
        self._file.close()  # unbuffered: no half line is left to flush here

    def _cut_torn_line(self) -> None:
        end = keep = self._file.seek(0, os.SEEK_END)
        while keep:
            start = max(0, keep - _TAIL_CHUNK)
            self._file.seek(start)
            newline = self._file.read(keep - start).rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            keep = start
        if keep < end:
            self._file.truncate(keep)
