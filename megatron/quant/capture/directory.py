"""The capture directory is checked once, when a session is configured, not found broken mid-run."""
from __future__ import annotations

import errno
import os


def _unusable(path: str, source: str, reason: str) -> ValueError:
    return ValueError(f"{source}={path!r} is unusable: {reason}; allowed: a writable directory")


def check_writable(path: str, source: str = "TENSOR_SAVE_DIR") -> None:
    """Create ``path`` and write and remove a probe file in it; ValueError naming the path and the reason."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        if isinstance(exc, FileExistsError):
            reason = "it is a file"
        elif exc.errno == errno.ENOTDIR:
            reason = "it lies under a file"
        else:
            reason = f"cannot create it ({exc.strerror})"
        raise _unusable(path, source, reason) from None
    probe = os.path.join(path, f".write-probe.{os.getpid()}.tmp")  # hidden: never taken for a capture
    try:
        with open(probe, "xb") as handle:
            handle.write(b"probe")
    except OSError as exc:
        raise _unusable(path, source, f"cannot write in it ({exc.strerror})") from None
    try:  # the writer names files by hard link (exclusive across processes)
        os.link(probe, probe + ".link")
        os.remove(probe + ".link")
    except OSError as exc:
        raise _unusable(path, source, f"cannot hard-link files in it ({exc.strerror})") from None
    finally:
        os.remove(probe)
