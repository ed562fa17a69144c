"""Is a ``--data-path`` prefix an intact megatron-core indexed dataset? Checked from the ``.idx``
header and two sizes, without mapping either file, so a missing, empty, truncated or foreign
dataset is one line naming the file before any run starts, not a traceback in every rank's
first step (megatron-core's reader memory-maps whatever it is given)."""
from __future__ import annotations

import os
import stat
import struct

# megatron-core's _IndexWriter: magic, version <Q, dtype code <B, sequence count <Q, document count <Q,
# then int32 lengths, int64 pointers, int64 document indices (and int8 modes for multimodal data).
_MAGIC = b"MMIDIDX\x00\x00"
_HEADER = struct.Struct("<QBQQ")
_HEADER_SIZE = len(_MAGIC) + _HEADER.size
_ITEM_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}  # DType code -> bytes per token


class DatasetError(ValueError):
    """A prefix that is not a usable indexed dataset; the message names the file and the fault."""


def _regular_size(path: str) -> int:
    try:
        info = os.stat(path)
    except OSError as error:
        raise DatasetError(f"--data-path: {path}: {error.strerror or error}") from None
    if not stat.S_ISREG(info.st_mode):
        raise DatasetError(f"--data-path: {path} is not a regular file")
    return info.st_size


def _read_at(handle, offset: int, size: int) -> bytes:
    handle.seek(offset)
    return handle.read(size)


def check_indexed_dataset(prefix: str) -> int:
    """The number of documents in ``prefix.bin/.idx``; DatasetError when either file is missing,
    unreadable, not a regular file, not an index, truncated, or the dataset holds no document."""
    idx, bin_ = prefix + ".idx", prefix + ".bin"
    idx_size, bin_size = _regular_size(idx), _regular_size(bin_)
    try:
        open(bin_, "rb").close()
    except OSError as error:
        raise DatasetError(f"--data-path: {bin_}: {error.strerror or error}") from None
    what = "need the .bin/.idx pair megatron's preprocess_data (or python -m megatron.quant.training.preprocess) writes"
    try:
        with open(idx, "rb") as handle:
            header = handle.read(_HEADER_SIZE)
            if len(header) < _HEADER_SIZE or not header.startswith(_MAGIC):
                raise DatasetError(f"--data-path: {idx} is not a megatron-core index ({idx_size} bytes, no "
                                   f"MMIDIDX header); {what}")
            version, code, sequences, documents = _HEADER.unpack(header[len(_MAGIC):])
            if version != 1 or code not in _ITEM_SIZES:
                raise DatasetError(f"--data-path: {idx}: unknown index version {version} or token type {code}; {what}")
            needed = _HEADER_SIZE + 4 * sequences + 8 * sequences + 8 * documents
            if idx_size not in (needed, needed + sequences):
                raise DatasetError(f"--data-path: {idx} is truncated or damaged ({idx_size} bytes, its header "
                                   f"needs {needed}); {what}")
            if sequences == 0:
                raise DatasetError(f"--data-path: {prefix} holds no documents")
            [length] = struct.unpack("<i", _read_at(handle, _HEADER_SIZE + 4 * (sequences - 1), 4))
            [pointer] = struct.unpack("<q", _read_at(handle, _HEADER_SIZE + 4 * sequences + 8 * (sequences - 1), 8))
    except OSError as error:
        raise DatasetError(f"--data-path: {idx}: {error.strerror or error}") from None
    end = pointer + length * _ITEM_SIZES[code]
    if length < 0 or pointer < 0 or bin_size < end:
        raise DatasetError(f"--data-path: {bin_} is truncated ({bin_size} bytes, the index needs {end})")
    return documents - 1
