"""Is one iteration's checkpoint directory intact? Checks every file megatron-core's
torch_dist format and the run config need, as the checkpoint's own index lists them, without
loading any tensor, so a damaged checkpoint is reported by file name instead of by a traceback
deep inside the loader."""
from __future__ import annotations

import json
import os
import zipfile
from typing import Optional

from megatron.quant.compat import COMMON_STATE_FILE, COMMON_STATE_KEY, reads_indexed_common_state

# megatron-core torch_dist: format description, PyTorch DCP index.
MEGATRON_METADATA = "metadata.json"
DCP_METADATA = ".metadata"


def find_damage(directory: str) -> Optional[str]:
    """``"FILE: what is wrong"`` for the first damaged or missing file; None when intact."""
    if not os.path.isdir(directory):
        return f"{directory}: no such directory"
    return _json_files(directory) or _indexed_files(directory)


def unreadable_here(directory: str) -> Optional[str]:
    """Why the installed megatron-core cannot load the intact checkpoint in ``directory``; None
    when it can."""
    if reads_indexed_common_state() or os.path.isfile(os.path.join(directory, COMMON_STATE_FILE)):
        return None
    from megatron.core import __version__

    return (f"it keeps its non-tensor state inside its tensor files (the layout megatron-core 0.19 writes) and "
            f"megatron-core {__version__} reads that state only from {COMMON_STATE_FILE}; load it with "
            f"megatron-core 0.19 or later (Python 3.12)")


def _json_files(directory: str) -> Optional[str]:
    if not os.path.isfile(os.path.join(directory, MEGATRON_METADATA)):
        return f"{MEGATRON_METADATA}: missing"
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            try:
                with open(os.path.join(directory, name), encoding="utf-8") as f:
                    json.load(f)
            except (OSError, ValueError) as error:
                return f"{name}: unreadable JSON ({first_line(error)})"
    return None


def _indexed_files(directory: str) -> Optional[str]:
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(directory).read_metadata()
    except Exception as error:  # pickle raises many types for a damaged index
        return f"{DCP_METADATA}: unreadable ({type(error).__name__}: {first_line(error)})"
    # The non-tensor state is either an entry of the index (then the size check below covers
    # it) or, in checkpoints that do not index it, a separate torch file.
    if COMMON_STATE_KEY not in metadata.state_dict_metadata:
        problem = _common_state_file(directory)
        if problem is not None:
            return problem
    needed: dict[str, int] = {}  # each .distcp file must reach the end of its last tensor
    for info in metadata.storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            return f"{name}: missing"
        actual = os.path.getsize(path)
        if actual < size:
            return f"{name}: truncated ({actual} bytes, the index needs {size})"
    return None


def _common_state_file(directory: str) -> Optional[str]:
    path = os.path.join(directory, COMMON_STATE_FILE)
    if not os.path.isfile(path):
        return f"{COMMON_STATE_FILE}: missing (the index {DCP_METADATA} does not hold the common state either)"
    try:  # torch.save writes a zip archive; its CRCs catch truncation and bit rot
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile) as error:
        return f"{COMMON_STATE_FILE}: not a readable torch file ({first_line(error)})"
    return None if bad is None else f"{COMMON_STATE_FILE}: corrupt member {bad}"


def first_line(error: BaseException) -> str:
    """The error's first message line, shortened: enough to say what is wrong in one line."""
    text = str(error).strip()
    return text.splitlines()[0][:160] if text else type(error).__name__
