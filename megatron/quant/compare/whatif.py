"""What-if re-quantization: captured high-precision tensors quantized with other formats, along
the axis their GEMM blocks them on (the capture's ``axis``), with format-aware statistics.

Captures are listed, filtered and loaded with the analysis package's catalog, so both tools
agree on what a capture is and which files are unusable."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch

from megatron.quant.analysis.catalog import (CaptureRecord, SkippedFile, build_catalog, enrich_from_file,
                                             relative_path)
from megatron.quant.analysis.loading import CaptureLoadError, load_capture
from megatron.quant.analysis.selection import CaptureFilter, select
from megatron.quant.formats.base import normalize_axis

# Capture fields copied into every result row, in CSV column order (then "file", "axis").
IDENTITY_FIELDS = ("quant_type", "layer_type", "layer_idx", "module", "role", "operation", "phase",
                   "tensor_name", "iteration", "microbatch", "sample", "rank", "shape")


def find_captures(tensor_dir: str | Path, capture_filter: CaptureFilter, include_outputs: bool = False
                  ) -> tuple[list[CaptureRecord], list[SkippedFile]]:
    """High-precision captures with a tensor file under ``tensor_dir`` that may match the filter
    (roles known only after loading are checked again then): GEMM operands (phase ``pre``), and
    with ``include_outputs`` also GEMM results (``post``: outputs and gradients); and the files
    the catalog skipped. A filter value no capture has is a FilterError."""
    catalog = build_catalog(tensor_dir)
    records = [r for r in catalog.records if r.path is not None and not r.quantized
               and (include_outputs or r.phase == "pre")]
    capture_filter.validate(records)
    return select(records, capture_filter, unknown_role_passes=True), list(catalog.skipped)


def evaluate(tensor: torch.Tensor, record: CaptureRecord, fmts: Sequence, file: str) -> list[dict]:
    """One row per format: the capture's identity, the format and its quant_stats on this tensor
    (quantized in float32 along the capture's axis, per-tensor amax from the capture itself),
    plus relative_error = sqrt(rel_mse)."""
    from megatron.quant.stats import quant_stats

    x = tensor.float()
    axis = normalize_axis("capture", record.axis, x.dim())
    identity = {name: getattr(record, name) for name in IDENTITY_FIELDS}
    identity.update(shape=list(x.shape), file=file, axis=axis)
    rows = []
    for fmt in fmts:
        stats = quant_stats(x, fmt, axis=axis)
        relative = None if stats["rel_mse"] is None else math.sqrt(stats["rel_mse"])
        rows.append({**identity, "format": fmt.name, "bits": fmt.bits, "relative_error": relative, **stats})
    return rows


def evaluate_all(records: Sequence[CaptureRecord], fmts: Sequence, root: Path, capture_filter: CaptureFilter,
                 log: Callable[[str], None] = print) -> tuple[list[dict], list[SkippedFile]]:
    """Rows for every capture, loaded one at a time, and the files that could not be used (not
    loadable, or a tensor the formats cannot block, e.g. 0-d); progress through ``log``."""
    rows: list[dict] = []
    skipped: list[SkippedFile] = []
    for position, record in enumerate(records, 1):
        file = relative_path(root, record.path)
        try:
            tensor, metadata = load_capture(record.path)
            record = enrich_from_file(record, metadata)
            if not record.quantized and capture_filter.matches(record):
                rows += evaluate(tensor, record, fmts, file)
        except (CaptureLoadError, ValueError, RuntimeError) as err:  # one foreign file must not end the run
            skipped.append(SkippedFile(file, str(err)))
        if position % 50 == 0 or position == len(records):
            log(f"re-quantized {position}/{len(records)} captures")
    return rows, skipped


def tensor_class(row: Mapping) -> str:
    """What a format choice is made for: one operand of one GEMM role, e.g. ``fc1/forward/input``."""
    return f"{row['role']}/{row['operation']}/{row['tensor_name']}"


def best_formats(rows: Sequence[Mapping]) -> list[dict]:
    """Per tensor class, the format with the highest mean SQNR over the class's tensors, among all
    formats (``among_bits`` "all") and among those of each bit width."""
    sqnrs: dict[tuple[str, str, int], list[float]] = {}
    for row in rows:
        if row["sqnr_db"] is not None:
            sqnrs.setdefault((tensor_class(row), row["format"], row["bits"]), []).append(row["sqnr_db"])
    best: dict[tuple[str, str], dict] = {}
    for (cls, name, bits), values in sqnrs.items():
        candidate = {"tensor_class": cls, "format": name, "bits": bits, "tensors": len(values),
                     "mean_sqnr_db": sum(values) / len(values)}
        for among in ("all", str(bits)):
            current = best.get((cls, among))
            if current is None or candidate["mean_sqnr_db"] > current["mean_sqnr_db"]:
                best[(cls, among)] = {**candidate, "among_bits": among}
    return [best[key] for key in sorted(best, key=lambda k: (k[0], k[1] != "all", k[1].zfill(3)))]
