"""List the captures under a tensor directory without loading any tensor.

The per-rank manifests (docs/interfaces.md section 2) are the source of truth; ``.pt`` files
that no manifest lists (a directory written without manifests, or a run that died before
its manifest line was flushed) are described from their file names. Anything that cannot be
described is returned as a :class:`SkippedFile` with the reason, never raised.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Optional

from megatron.quant.analysis.confine import unreadable
from megatron.quant.capture.naming import MANIFEST_RE, parse_file_name
from megatron.quant.tensor_saver import INSPECT_LOG_DIR

# Metadata keys every capture must have to be placed in an analysis.
REQUIRED_KEYS = ("quant_type", "layer_type", "layer_idx", "operation", "phase", "component",
                 "tensor_name", "iteration", "rank")


class CatalogError(Exception):
    """The tensor directory cannot be analysed at all (missing, empty, nothing readable)."""


@dataclass(frozen=True)
class SkippedFile:
    path: str     # relative to the tensor directory; manifest lines are "manifest-rank00.jsonl:7"
    reason: str


class TensorKey(NamedTuple):
    layer_type: str
    role: str          # "" when unknown (described from the file name only)
    operation: str
    phase: str
    tensor_name: str

    @property
    def label(self) -> str:
        """e.g. "fc1 fwd pre input", "attn bwd post grad_query" (the role names the layer type)."""
        short = {"forward": "fwd", "backward": "bwd", "core_attention": "attn"}
        parts = (self.role or self.layer_type, self.operation, self.phase, self.tensor_name)
        return " ".join(short.get(part, part) for part in parts)


@dataclass(frozen=True)
class CaptureRecord:
    """One capture: where and when it was taken, and its manifest statistics if any."""
    path: Optional[Path]          # None for a stats-only manifest entry (no tensor file)
    quant_type: str
    layer_type: str
    layer_idx: int
    operation: str
    phase: str
    component: str
    tensor_name: str
    iteration: int
    rank: int
    sample: int = 0
    microbatch: Optional[int] = None
    role: Optional[str] = None    # unknown when described from the file name only
    module: Optional[str] = None
    shape: Optional[tuple[int, ...]] = None
    dtype: Optional[str] = None
    format_name: Optional[str] = None
    format_options: Mapping[str, Any] = field(default_factory=dict)
    axis: int = -1
    quantized: bool = False       # the optional fake-quantized copy of another capture
    stats: Optional[Mapping[str, Any]] = None
    source: str = "manifest"      # "manifest" | "file name" | "file metadata"

    @property
    def tensor_key(self) -> TensorKey:
        """Which tensor of a layer this is, regardless of layer index, time, rank or format."""
        return TensorKey(self.layer_type, self.role or "", self.operation, self.phase,
                         self.tensor_name)

    @property
    def site_key(self) -> tuple:
        """The same capture point and moment: pairs one tensor across quant types."""
        return (self.tensor_key, self.module, self.layer_idx, self.iteration, self.rank,
                self.sample, self.microbatch)

    @property
    def label(self) -> str:
        return f"{self.layer_type} L{self.layer_idx} {self.operation} {self.phase} {self.tensor_name}"


@dataclass(frozen=True)
class Catalog:
    root: Path
    records: tuple[CaptureRecord, ...]
    skipped: tuple[SkippedFile, ...]


def record_from_metadata(metadata: Mapping[str, Any], path: Optional[Path],
                         source: str = "manifest") -> CaptureRecord:
    """Build a record from capture metadata, every field checked once here (the reading
    boundary): integers finite and integral, statistics numbers; ValueError names what is
    missing or malformed."""
    missing = [key for key in REQUIRED_KEYS if metadata.get(key) is None]
    if missing:
        raise ValueError(f"metadata lacks {', '.join(missing)}")
    fmt = metadata.get("format")
    format_name, format_options = _format_reference(fmt)
    shape = metadata.get("shape")
    stats = metadata.get("stats") if isinstance(metadata.get("stats"), Mapping) else None
    try:
        if stats is not None:
            _check_stats(stats, "stats", 0)
        return CaptureRecord(
            path=path,
            quant_type=str(metadata["quant_type"]),
            layer_type=str(metadata["layer_type"]),
            layer_idx=_integer(metadata["layer_idx"], "layer_idx"),
            operation=str(metadata["operation"]),
            phase=str(metadata["phase"]),
            component=str(metadata["component"]),
            tensor_name=str(metadata["tensor_name"]),
            iteration=_integer(metadata["iteration"], "iteration"),
            rank=_integer(metadata["rank"], "rank"),
            sample=_integer(metadata.get("sample") or 0, "sample"),
            microbatch=None if metadata.get("microbatch") is None else _integer(metadata["microbatch"], "microbatch"),
            role=None if metadata.get("role") is None else str(metadata["role"]),
            module=None if metadata.get("module") is None else str(metadata["module"]),
            shape=None if shape is None else tuple(_integer(s, "shape") for s in shape),
            dtype=None if metadata.get("dtype") is None else str(metadata["dtype"]),
            format_name=format_name,
            format_options=format_options,
            axis=-1 if metadata.get("axis") is None else _integer(metadata["axis"], "axis"),
            quantized=bool(metadata.get("quantized", False)),
            stats=stats,
            source=source,
        )
    except (TypeError, ValueError, RecursionError) as error:
        raise ValueError(f"malformed metadata ({error})") from None


def _integer(value: Any, key: str) -> int:
    """An int, an integral finite float (JSON writes 3.0) or digits; ValueError otherwise
    (``Infinity`` would raise OverflowError in ``int``)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise ValueError(f"{key} is {_excerpt(value)}, not an integer")


# Statistics that are text (megatron.quant.stats); every other leaf is a number, None or a flag.
_TEXT_STATS = ("dtype", "stats_level")
_MAX_STATS_DEPTH = 4  # stats hold histograms ({"edges": [...], "counts": [...]}) at most one level down


def _check_stats(value: Any, where: str, depth: int) -> None:
    """ValueError naming the first entry of ``value`` that is not a number (a string, a deep nest)."""
    if depth > _MAX_STATS_DEPTH:
        raise ValueError(f"{where} is nested too deeply")
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not (key in _TEXT_STATS and isinstance(item, str)):
                _check_stats(item, f"{where}.{key}", depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_stats(item, where, depth + 1)
    elif value is not None and not isinstance(value, (int, float)):
        raise ValueError(f"{where} is {_excerpt(value)}, not a number")


def _excerpt(value: Any) -> str:
    text = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _format_reference(reference: Any) -> tuple[Optional[str], Mapping[str, Any]]:
    """(name, options) of a manifest's ``format`` entry (a name and options, a bare name, or null)."""
    if isinstance(reference, Mapping) and reference.get("name"):
        options = reference.get("options")
        return str(reference["name"]), dict(options) if isinstance(options, Mapping) else {}
    if isinstance(reference, str) and reference:
        return reference, {}
    return None, {}


def record_from_file_name(path: Path) -> Optional[CaptureRecord]:
    """Describe a capture from its file name alone; None when the name is not a capture name."""
    g = parse_file_name(path.name)
    if g is None:
        return None
    return CaptureRecord(
        path=path, quant_type=g["quant_type"], layer_type=g["layer_type"],
        layer_idx=g["layer_idx"], operation=g["operation"], phase=g["phase"],
        component=g["component"], tensor_name=g["tensor_name"], iteration=g["iteration"],
        rank=g["rank"], sample=g["sample"],
        quantized=g["tensor_name"].endswith("_quantized"), source="file name",
    )


def enrich_from_file(record: CaptureRecord, metadata: Mapping[str, Any]) -> CaptureRecord:
    """Complete a record described from its file name with the metadata stored in the file."""
    if record.source != "file name":
        return record
    try:
        return record_from_metadata(metadata, record.path, "file metadata")
    except ValueError:
        return record


def build_catalog(tensor_dir: str | os.PathLike) -> Catalog:
    """Every capture under ``tensor_dir`` (searched recursively) and every file skipped."""
    root = Path(tensor_dir)
    if not root.exists():
        raise CatalogError(f"tensor directory does not exist: {root}")
    if not root.is_dir():
        raise CatalogError(f"tensor directory is not a directory: {root}")
    records: list[CaptureRecord] = []
    skipped: list[SkippedFile] = []
    real_root = root.resolve()  # every file opened must resolve inside it
    for directory, subdirs, files in os.walk(root):  # symlinked directories are not followed
        subdirs[:] = sorted(name for name in subdirs if name != INSPECT_LOG_DIR)  # the capture's statistics log
        found, lost = _scan_directory(root, real_root, Path(directory), sorted(files))
        records.extend(found)
        skipped.extend(lost)
    if not records:
        if skipped:
            examples = "; ".join(f"{s.path}: {s.reason}" for s in skipped[:3])
            raise CatalogError(f"no readable capture under {root}: {len(skipped)} file(s) "
                               f"skipped ({examples})")
        raise CatalogError(f"no capture files (*.pt) or manifests (manifest-rankNN.jsonl) "
                           f"under {root}")
    return Catalog(root, tuple(records), tuple(skipped))


def _scan_directory(root: Path, real_root: Path, directory: Path, files: list[str]
                    ) -> tuple[list[CaptureRecord], list[SkippedFile]]:
    records: list[CaptureRecord] = []
    skipped: list[SkippedFile] = []
    listed: set[str] = set()
    openable = []
    for name in files:
        reason = unreadable(real_root, directory / name)
        if reason is None:
            openable.append(name)
        else:
            skipped.append(SkippedFile(relative_path(root, directory / name), reason))
    for name in openable:
        if MANIFEST_RE.match(name):
            found, lost, names = _read_manifest(root, real_root, directory / name)
            records.extend(found)
            skipped.extend(lost)
            listed |= names
    for name in openable:
        if MANIFEST_RE.match(name) or name in listed:
            continue
        path = directory / name
        record = record_from_file_name(path) if name.endswith(".pt") else None
        if record is None:
            reason = ("file name does not match the capture naming pattern" if name.endswith(".pt")
                      else "not a capture file (expected *.pt or manifest-rankNN.jsonl)")
            skipped.append(SkippedFile(relative_path(root, path), reason))
        else:
            records.append(record)
    return records, skipped


def _read_manifest(root: Path, real_root: Path, manifest: Path
                   ) -> tuple[list[CaptureRecord], list[SkippedFile], set[str]]:
    records: list[CaptureRecord] = []
    skipped: list[SkippedFile] = []
    listed: set[str] = set()
    where = relative_path(root, manifest)
    try:
        lines = manifest.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as error:
        return [], [SkippedFile(where, f"cannot read manifest ({error.strerror})")], set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = _manifest_record(line, manifest)
        except ValueError as error:
            skipped.append(SkippedFile(f"{where}:{number}", f"bad manifest line ({error})"))
            continue
        path = record.path
        if path is not None:
            if path.parent == manifest.parent:
                listed.add(path.name)
            reason = unreadable(real_root, path)
            if reason is not None:
                skipped.append(SkippedFile(relative_path(root, path), f"listed in {where}:{number} but {reason}"))
                continue
        records.append(record)
    return records, skipped, listed


def _manifest_record(line: str, manifest: Path) -> CaptureRecord:
    """One manifest line as a record; ValueError for anything else (bad JSON, JSON nested past
    the parser's depth, a file entry that is not a string, malformed metadata)."""
    try:
        entry = json.loads(line)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if not isinstance(entry, Mapping) or not isinstance(entry.get("metadata"), Mapping):
        raise ValueError("entry has no metadata object")
    file_name = entry.get("file")
    if file_name is not None and not isinstance(file_name, str):
        raise ValueError(f"file is {_excerpt(file_name)}, not a path")
    return record_from_metadata(entry["metadata"], None if file_name is None else manifest.parent / file_name)


def relative_path(root: Path, path: Path) -> str:
    """``path`` relative to ``root`` when inside it (how skipped files are named)."""
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
