"""Is one iteration's checkpoint directory intact? Checks every file megatron-core's
torch_dist format and the run config need, without loading any tensor, so a damaged
checkpoint is reported by file name instead of by a traceback deep inside the loader."""
from __future__ import annotations

import json
import os
import zipfile
from typing import Optional

# megatron-core torch_dist: format description, PyTorch DCP index, non-tensor state.
MEGATRON_METADATA = "metadata.json"
DCP_METADATA = ".metadata"
COMMON_STATE = "common.pt"


def find_damage(directory: str) -> Optional[str]:
    """``"FILE: what is wrong"`` for the first damaged or missing file; None when intact."""
    if not os.path.isdir(directory):
        return f"{directory}: no such directory"
    for check in (_json_files, _common_state, _tensor_files):
        problem = check(directory)
        if problem is not None:
            return problem
    return None


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


def _common_state(directory: str) -> Optional[str]:
    path = os.path.join(directory, COMMON_STATE)
    if not os.path.isfile(path):
        return f"{COMMON_STATE}: missing"
    try:  # torch.save writes a zip archive; its CRCs catch truncation and bit rot
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile) as error:
        return f"{COMMON_STATE}: not a readable torch file ({first_line(error)})"
    return None if bad is None else f"{COMMON_STATE}: corrupt member {bad}"


def _tensor_files(directory: str) -> Optional[str]:
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(directory).read_metadata()
    except Exception as error:  # pickle raises many types for a damaged index
        return f"{DCP_METADATA}: unreadable ({type(error).__name__}: {first_line(error)})"
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


def first_line(error: BaseException) -> str:
    """The error's first message line, shortened: enough to say what is wrong in one line."""
    text = str(error).strip()
    return text.splitlines()[0][:160] if text else type(error).__name__
