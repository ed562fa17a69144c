"""What-if re-quantization: captured high-precision tensors quantized with other formats, along
the axis their GEMM blocks them on (from the capture metadata), with format-aware statistics."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import torch

# Metadata copied into every result row, in CSV column order.
IDENTITY_KEYS = ("file", "quant_type", "layer_type", "layer_idx", "module", "role", "operation", "phase",
                 "tensor_name", "iteration", "microbatch", "sample", "rank", "shape", "axis")
# Metadata filters: command-line option -> metadata key.
FILTER_KEYS = {"layer_types": "layer_type", "roles": "role", "operations": "operation",
               "tensor_names": "tensor_name", "layers": "layer_idx", "quant_types": "quant_type"}


@dataclass(frozen=True)
class CaptureRef:
    """A capture file and its metadata, before its tensor is loaded."""
    path: Path
    metadata: Mapping


def find_captures(tensor_dir: str | Path, log: Callable[[str], None] = print) -> list[CaptureRef]:
    """High-precision captures under ``tensor_dir`` (any depth), sorted by path. Metadata comes from
    the per-rank manifests where present, else from the file; ``_quantized`` copies are skipped;
    unreadable files are reported through ``log`` and skipped."""
    root = Path(tensor_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"--tensor_dir {str(tensor_dir)!r} is not a directory")
    from_manifests = _manifest_metadata(root, log)
    refs = []
    for path in sorted(root.rglob("*.pt")):
        metadata = from_manifests.get(path)
        if metadata is None:
            loaded = _load(path, log)
            if loaded is None:
                continue
            metadata = loaded[1]
        if not _is_quantized_copy(metadata):
            refs.append(CaptureRef(path, metadata))
    return refs


def select(refs: Iterable[CaptureRef], **allowed: Sequence | None) -> list[CaptureRef]:
    """Captures whose metadata matches every given filter (see FILTER_KEYS); None = no filter."""
    unknown = set(allowed) - set(FILTER_KEYS)
    if unknown:
        raise ValueError(f"unknown filters {sorted(unknown)}; valid: {sorted(FILTER_KEYS)}")
    wanted = {FILTER_KEYS[name]: set(values) for name, values in allowed.items() if values}
    return [ref for ref in refs if all(ref.metadata.get(key) in values for key, values in wanted.items())]


def gemm_axis(metadata: Mapping, ndim: int) -> int:
    """The block axis the layer used for this operand (metadata ``axis``), as a non-negative index."""
    axis = metadata.get("axis")
    if not isinstance(axis, int) or not -ndim <= axis < ndim:
        raise ValueError(f"capture metadata axis {axis!r} is not an axis of a {ndim}-d tensor")
    return axis % ndim


def requantize(tensor: torch.Tensor, metadata: Mapping, fmt) -> torch.Tensor:
    """``tensor`` fake-quantized with ``fmt`` (a NumericFormat) along its GEMM's axis, in float32
    (captures in bf16/fp16 upcast exactly)."""
    return fmt.quantize(tensor.float(), axis=gemm_axis(metadata, tensor.dim()))


def evaluate(tensor: torch.Tensor, metadata: Mapping, fmts: Sequence, file: str) -> list[dict]:
    """One row per format: the capture's identity, the format and its quant_stats on this tensor."""
    from megatron.quant.stats import quant_stats

    x = tensor.float()
    axis = gemm_axis(metadata, x.dim())
    identity = {key: metadata.get(key) for key in IDENTITY_KEYS}
    identity.update(file=file, shape=list(x.shape), axis=axis)
    rows = []
    for fmt in fmts:
        stats = quant_stats(x, fmt, axis=axis, q=requantize(x, metadata, fmt))
        rows.append({**identity, "format": fmt.name, "bits": fmt.bits,
                     "relative_error": math.sqrt(stats["rel_mse"]), **stats})
    return rows


def evaluate_all(refs: Sequence[CaptureRef], fmts: Sequence, root: Path,
                 log: Callable[[str], None] = print) -> list[dict]:
    """Rows for every capture (loaded one at a time), with progress through ``log``."""
    rows = []
    for position, ref in enumerate(refs, 1):
        loaded = _load(ref.path, log)
        if loaded is None:
            continue
        rows += evaluate(loaded[0], ref.metadata, fmts, str(ref.path.relative_to(root)))
        if position % 50 == 0 or position == len(refs):
            log(f"re-quantized {position}/{len(refs)} tensors")
    return rows


def tensor_class(row: Mapping) -> str:
    """What a format choice is made for: the operand of one GEMM role, e.g. ``fc1/forward/input``."""
    return f"{row['role']}/{row['operation']}/{row['tensor_name']}"


def best_formats(rows: Sequence[Mapping]) -> list[dict]:
    """Per tensor class and bit width, the format with the highest mean SQNR over the class's
    tensors; ``bits`` None is the best over all widths."""
    means: dict[tuple[str, str, int], list[float]] = {}
    for row in rows:
        means.setdefault((tensor_class(row), row["format"], row["bits"]), []).append(row["sqnr_db"])
    candidates = [{"tensor_class": cls, "format": name, "bits": bits, "tensors": len(values),
                   "mean_sqnr_db": sum(values) / len(values)} for (cls, name, bits), values in means.items()]
    best: dict[tuple[str, int | None], dict] = {}
    for cand in candidates:
        for width in (None, cand["bits"]):
            key = (cand["tensor_class"], width)
            if key not in best or cand["mean_sqnr_db"] > best[key]["mean_sqnr_db"]:
                best[key] = {**cand, "among_bits": "all" if width is None else width}
    return [best[key] for key in sorted(best, key=lambda k: (k[0], -1 if k[1] is None else k[1]))]


def _is_quantized_copy(metadata: Mapping) -> bool:
    return bool(metadata.get("quantized")) or str(metadata.get("tensor_name", "")).endswith("_quantized")


def _load(path: Path, log: Callable[[str], None]) -> tuple[torch.Tensor, dict] | None:
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        tensor, metadata = payload["tensor"], payload["metadata"]
        if not isinstance(tensor, torch.Tensor) or not isinstance(metadata, dict):
            raise TypeError("expected {'tensor': Tensor, 'metadata': dict}")
    except Exception as err:  # a corrupt or partial capture is reported and skipped
        log(f"skipping unreadable capture {path}: {type(err).__name__}: {err}")
        return None
    return tensor, metadata


def _manifest_metadata(root: Path, log: Callable[[str], None]) -> dict[Path, Mapping]:
    found: dict[Path, Mapping] = {}
    for manifest in sorted(root.rglob("manifest-rank*.jsonl")):
        for number, line in enumerate(manifest.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as err:
                log(f"skipping {manifest}:{number}: {err}")
                continue
            if entry.get("file"):
                found[manifest.parent / entry["file"]] = entry["metadata"]
    return found
