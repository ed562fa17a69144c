"""Load capture files (``weights_only=True``) and reduce each to a bounded TensorSummary.

Memory per worker stays bounded whatever the tensor size: statistics are taken in chunks,
values are sampled at a fixed number of indices, the heatmap is pooled block by block.
Sample indices depend only on the tensor's element count, so the same tensor captured
under two formats is sampled at the same positions and can be compared element-wise.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import torch

from megatron.quant.analysis.captures.catalog import CaptureRecord, SkippedFile, enrich_from_file, relative_path
from megatron.quant.analysis.captures.summary import (
    LOG2_BINS,
    QUANT_METRICS,
    SAMPLE_MOMENTS,
    TENSOR_STATS,
    FormatView,
    TensorSummary,
    finite,
)
from megatron.quant.analysis.confine import not_regular
from megatron.quant.analysis.parallel import parallel_map
from megatron.quant.formats import NumericFormat, get_format
from megatron.quant.stats import LOG2_EDGES, quant_stats, tensor_stats


class CaptureLoadError(Exception):
    """A capture file that cannot be used; the message is the reason shown in the report."""


@dataclass(frozen=True)
class SummaryOptions:
    sample_size: int = 4096      # values kept per tensor
    heatmap_size: int = 64       # heatmap grid side; 0 disables heatmaps
    format_elements: int = 8192  # elements seen through the format per tensor; 0 disables
    pair_count: int = 512        # (x, quantized x) pairs kept per tensor


def load_capture(path: Path) -> tuple[torch.Tensor, dict]:
    """The tensor and metadata of a capture file; CaptureLoadError says why it is unusable."""
    kind = not_regular(path)  # checked again here: the file may have changed since it was listed
    if kind is not None:
        raise CaptureLoadError(kind)
    try:
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as error:
            if "zip" not in str(error).lower():
                raise
            payload = torch.load(path, map_location="cpu", weights_only=True)  # legacy format
    except Exception as error:  # torch raises many types for damaged or foreign files
        message = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        raise CaptureLoadError(f"cannot be loaded with weights_only=True "
                               f"({type(error).__name__}: {message})") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("tensor"), torch.Tensor):
        raise CaptureLoadError(f"not a capture: expected {{'tensor': Tensor, 'metadata': dict}}, "
                               f"found {_describe(payload)}")
    metadata = payload.get("metadata", {})
    if not isinstance(metadata, dict):
        raise CaptureLoadError(f"metadata is {type(metadata).__name__}, expected dict")
    tensor = payload["tensor"]
    _check_tensor(tensor)
    return tensor, metadata


def _check_tensor(tensor: torch.Tensor) -> None:
    """CaptureLoadError unless ``tensor`` is a dense, strided, non-empty real tensor whose
    elements its file really stores: a view repeating stored bytes (stride 0) could claim 2^40
    elements in a 3 KB file and stall every reader that walks them."""
    if tensor.layout != torch.strided:
        raise CaptureLoadError(f"{tensor.layout} tensor; only dense tensors are read")
    if tensor.is_complex() or tensor.dtype == torch.bool or tensor.is_quantized:
        raise CaptureLoadError(f"unsupported dtype {tensor.dtype}")
    if tensor.numel() == 0:
        raise CaptureLoadError("empty tensor")
    stored = tensor.untyped_storage().nbytes()
    if tensor.numel() * tensor.element_size() > stored:
        raise CaptureLoadError(f"claims {tensor.numel()} elements of shape {list(tensor.shape)} but its file stores "
                               f"{stored} bytes (a view repeating them, strides {list(tensor.stride())})")


def _describe(payload: Any) -> str:
    if isinstance(payload, dict):
        return f"dict with keys {sorted(map(str, payload))[:5]}"
    return type(payload).__name__


def sample_indices(numel: int, size: int) -> np.ndarray:
    """Sorted indices fixed by ``numel``; random, so strided layouts (channels) do not alias."""
    if numel <= size:
        return np.arange(numel)
    return np.sort(np.random.default_rng(numel).integers(0, numel, size))


def summarize(record: CaptureRecord, options: SummaryOptions) -> TensorSummary:
    if record.path is None:
        return _stats_only_summary(record)
    tensor, metadata = load_capture(record.path)
    record = replace(enrich_from_file(record, metadata), shape=tuple(tensor.shape),
                     dtype=str(tensor.dtype).removeprefix("torch."))
    flat = tensor.reshape(-1)
    stats, log2_counts = _saved_tensor_stats(record, flat.numel())
    if stats is None:
        stats, log2_counts = _split_stats(tensor_stats(flat))  # tile by tile: bounded memory
    sample = flat[torch.from_numpy(sample_indices(flat.numel(), options.sample_size))]
    sample = sample.to(torch.float32).numpy()
    stats = {**stats, **sample_shape_moments(sample)}
    quant, quant_source = _saved_quant_stats(record)
    heatmap = (pooled_absmax(tensor, options.heatmap_size)
               if options.heatmap_size and tensor.ndim >= 2 else None)
    view, sampled_quant = None, None
    if options.format_elements:
        fmt, applied = resolve_format(record)
        if fmt is not None:
            view, sampled_quant = format_view(tensor, fmt, applied, record.axis,
                                              float(stats["absmax"] or 0.0), options)
    if quant is None and sampled_quant is not None and view.applied:
        quant, quant_source = sampled_quant, "sampled rows"  # never for a reference format
    return TensorSummary(record, stats, quant, quant_source, log2_counts, sample, heatmap, view)


def _stats_only_summary(record: CaptureRecord) -> TensorSummary:
    stats, log2_counts = _saved_tensor_stats(record, None)
    if stats is None:
        raise CaptureLoadError("manifest entry has neither a file nor statistics")
    quant, quant_source = _saved_quant_stats(record)
    return TensorSummary(record, stats, quant, quant_source, log2_counts, None, None, None)


def _saved_tensor_stats(record: CaptureRecord, numel: Optional[int]
                           ) -> tuple[Optional[dict], Optional[np.ndarray]]:
    stats = record.stats
    if not stats or any(key not in stats for key in TENSOR_STATS):
        return None, None
    if numel is not None and stats["numel"] != numel:
        return None, None  # the file does not hold what the manifest describes
    return _split_stats(stats)


def _split_stats(stats: dict) -> tuple[Optional[dict], Optional[np.ndarray]]:
    """(the TENSOR_STATS of ``stats``, its log2 histogram counts); Nones if it has none."""
    counts = log2_counts_from_stats(stats.get("log2_hist"))
    if counts is None:
        return None, None
    return {key: stats[key] for key in TENSOR_STATS}, counts


def _saved_quant_stats(record: CaptureRecord) -> tuple[Optional[dict], Optional[str]]:
    stats = record.stats or {}
    if "overflow_ratio" not in stats:
        return None, None
    return {key: stats.get(key) for key in QUANT_METRICS}, "saver"


def log2_counts_from_stats(hist: Any) -> Optional[np.ndarray]:
    """The saver's log2 histogram as LOG2_BINS counts (end bins included); None if not that shape."""
    if not isinstance(hist, Mapping):
        return None
    edges, counts = hist.get("edges"), hist.get("counts")
    if list(edges or []) != LOG2_EDGES or not isinstance(counts, list):
        return None
    if len(counts) == LOG2_BINS:
        return np.asarray(counts, dtype=np.int64)
    if len(counts) == LOG2_BINS - 2:  # no end bins
        return np.concatenate([[0], np.asarray(counts, dtype=np.int64), [0]])
    return None


def sample_shape_moments(sample: np.ndarray) -> dict[str, Optional[float]]:
    """Skewness and excess kurtosis (population moments) estimated from the sampled values."""
    values = finite(sample).astype(np.float64)
    centred = values - values.mean() if values.size else values
    variance = float((centred ** 2).mean()) if values.size else 0.0
    if values.size < 3 or variance == 0.0:
        return dict.fromkeys(SAMPLE_MOMENTS)
    return dict(zip(SAMPLE_MOMENTS, (float((centred ** 3).mean() / variance ** 1.5),
                                     float((centred ** 4).mean() / variance ** 2 - 3.0))))


def pooled_absmax(tensor: torch.Tensor, size: int) -> np.ndarray:
    """max |x| over at most size x size blocks of the view [prod(leading dims), last dim]."""
    matrix = tensor.reshape(-1, tensor.shape[-1])
    rows, cols = matrix.shape
    row_edges = np.unique(np.linspace(0, rows, min(size, rows) + 1).astype(np.int64))
    col_starts = np.unique(np.linspace(0, cols, min(size, cols) + 1).astype(np.int64))[:-1]
    grid = np.empty((len(row_edges) - 1, len(col_starts)), dtype=np.float32)
    for i, (start, stop) in enumerate(zip(row_edges[:-1], row_edges[1:])):
        block = matrix[start:stop].to(torch.float32).abs().numpy()
        grid[i] = np.fmax.reduceat(np.fmax.reduce(block, axis=0), col_starts)
    return grid


@functools.lru_cache(maxsize=64)
def _format_by_spec(name: str, options_json: str) -> NumericFormat:
    try:
        return get_format(name, **json.loads(options_json))
    except (TypeError, ValueError):
        return get_format(name)  # options of another version of the format: use its defaults


def resolve_format(record: CaptureRecord) -> tuple[Optional[NumericFormat], bool]:
    """(format, applied): the record's format, else its quant type's format as a reference."""
    candidates = ([(record.format_name, record.format_options, True)] if record.format_name
                  else [(record.quant_type, {}, False)])
    for name, options, applied in candidates:
        try:
            return _format_by_spec(name, json.dumps(dict(options), sort_keys=True)), applied
        except (TypeError, ValueError):
            continue
    return None, False


def block_rows(tensor: torch.Tensor, axis: int, budget: int, block: int) -> torch.Tensor:
    """Evenly spaced whole rows along ``axis`` (blocks intact), about ``budget`` elements."""
    moved = (tensor if tensor.ndim else tensor.reshape(1)).movedim(axis, -1)
    length = moved.shape[-1]
    cols = length if length <= budget else max(block, budget // block * block)
    leading = tuple(moved.shape[:-1])
    n_rows = math.prod(leading)
    wanted = max(1, min(n_rows, budget // cols))
    picks = np.unique(np.linspace(0, n_rows - 1, wanted).round().astype(np.int64))
    if leading:
        index = tuple(torch.from_numpy(i) for i in np.unravel_index(picks, leading))
        rows = moved[index]
    else:
        rows = moved.unsqueeze(0)
    return rows[:, :cols].to(torch.float32)


def format_view(tensor: torch.Tensor, fmt: NumericFormat, applied: bool, axis: int, absmax: float,
                options: SummaryOptions) -> tuple[Optional[FormatView], Optional[dict]]:
    """How ``fmt`` sees sampled rows of ``tensor``, and section-3 quant stats of those rows."""
    block = fmt.block_size or 1
    try:
        rows = block_rows(tensor, axis, options.format_elements, block)
        amax = torch.tensor(absmax, dtype=torch.float32) if fmt.needs_tensor_amax else None
        quantized, scale = fmt.quantize_with_scale(rows, axis=-1, amax=amax)
    except (RuntimeError, ValueError, IndexError, NotImplementedError):
        return None, None  # e.g. a row length that is not a whole number of blocks
    scaled = (rows / scale).abs()
    nonzero = scaled[(scaled > 0) & torch.isfinite(scaled)]
    _, exponent = torch.frexp(nonzero)
    exponent = exponent.to(torch.int64) - 1
    start = int(exponent.min()) if exponent.numel() else 0
    counts = np.bincount((exponent - start).numpy(), minlength=1) if exponent.numel() else np.zeros(1)
    numel = rows.numel()
    stats = quant_stats(rows, fmt, axis=-1, amax=amax, q=quantized, scale=scale)
    flat_x, flat_q = rows.reshape(-1), quantized.to(torch.float32).reshape(-1)
    picks = torch.from_numpy(np.linspace(0, numel - 1, min(numel, options.pair_count))
                             .round().astype(np.int64))
    view = FormatView(
        format_name=fmt.name, applied=applied, scaled=fmt.scaling != "none",
        max_value=float(fmt.max_value), min_positive=float(fmt.min_positive),
        log2_start=start, log2_counts=counts.astype(np.int64), numel=numel,
        overflow_share=stats["overflow_ratio"], underflow_share=stats["underflow_ratio"],
        x_pairs=flat_x[picks].numpy().copy(), q_pairs=flat_q[picks].numpy().copy())
    return view, {key: stats.get(key) for key in QUANT_METRICS}


def summarize_or_skip(job: tuple[CaptureRecord, SummaryOptions, Path]
                      ) -> TensorSummary | SkippedFile:
    """Worker entry point: a summary, or the file with the reason it was skipped."""
    record, options, root = job
    try:
        return summarize(record, options)
    except CaptureLoadError as error:
        where = record.label if record.path is None else relative_path(root, record.path)
        return SkippedFile(where, str(error))


def summarize_all(records: Sequence[CaptureRecord], options: SummaryOptions, workers: int,
                  root: Path, progress: bool = True
                  ) -> tuple[list[TensorSummary], list[SkippedFile]]:
    jobs = [(record, options, root) for record in records]
    summaries: list[TensorSummary] = []
    skipped: list[SkippedFile] = []
    for result in parallel_map(summarize_or_skip, jobs, workers, "reading captures", progress):
        (skipped if isinstance(result, SkippedFile) else summaries).append(result)
    return summaries, skipped
