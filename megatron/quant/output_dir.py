"""Refuse an output directory that cannot be one before any work is done: the check the
visualizer, compare_formats, compare_runs and the sweep share."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


class OutputDirError(Exception):
    """The output directory is, or lies under, an existing non-directory, or cannot be written."""


def check_output_dir(path: Path, option: str = "--output_dir") -> None:
    """OutputDirError naming ``path`` when it or its nearest existing ancestor is not a
    directory, or that directory cannot be written (a read-only file system, no permission):
    probed by creating and removing a hidden directory there, so nothing is left behind."""
    for candidate in (path, *path.parents):
        if candidate.is_dir():
            _probe(path, candidate, option)
            return
        if candidate.exists() or candidate.is_symlink():
            where = "" if candidate == path else f": {candidate}"
            raise OutputDirError(f"{option} {path}{where} is an existing file, not a directory; "
                                 "give a directory path")


def _probe(path: Path, directory: Path, option: str) -> None:
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-probe-", dir=directory))
    except OSError as error:
        where = "" if directory == path else f": {directory}"
        raise OutputDirError(f"{option} {path}{where} cannot be written ({error.strerror or error}); "
                             "give a writable directory") from None
