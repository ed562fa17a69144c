"""Which paths the analysis may open: regular files inside the tensor directory, nothing else.

A manifest entry with an absolute path or ``..`` (or a symlink) could make a report read any
file on the machine, and opening a FIFO named ``*.pt`` blocks forever; both are refused here,
from ``os.stat`` alone (which neither opens nor blocks), and the caller lists them as skipped.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Optional

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def not_regular(path: Path) -> Optional[str]:
    """Why ``path`` cannot be opened as a regular file (missing, FIFO, device, ...); None if it can."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as error:
        return f"cannot be inspected ({error.strerror})"
    except ValueError as error:  # e.g. a NUL byte in a manifest's file entry
        return f"cannot be inspected ({error})"
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return f"{kind}, not a regular file; not opened"


def unreadable(real_root: Path, path: Path) -> Optional[str]:
    """``not_regular``, or that ``path`` resolves outside ``real_root`` (an already resolved
    tensor directory); None when the analysis may open it."""
    resolved = Path(os.path.realpath(path))
    if not resolved.is_relative_to(real_root):
        return f"resolves to {resolved}, outside the tensor directory; not opened"
    return not_regular(resolved)
