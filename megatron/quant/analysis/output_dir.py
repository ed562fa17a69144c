"""Refuse an output directory that cannot be one before any work is done."""
from __future__ import annotations

from pathlib import Path


class OutputDirError(Exception):
    """The output directory is, or lies under, an existing non-directory."""


def check_output_dir(path: Path, option: str = "--output_dir") -> None:
    """OutputDirError naming ``path`` when it or its nearest existing ancestor is not a
    directory (so it could not be created or written into); nothing is created here."""
    for candidate in (path, *path.parents):
        if candidate.is_dir():
            return
        if candidate.exists() or candidate.is_symlink():
            where = "" if candidate == path else f": {candidate}"
            raise OutputDirError(f"{option} {path}{where} is an existing file, not a directory; "
                                 "give a directory path")
