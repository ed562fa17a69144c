"""What-if re-quantization: captured high-precision tensors quantized with other formats, along
the axis their GEMM blocks them on (the capture's ``axis``), with format-aware statistics.

A candidate is a format name or a recipe preset (``megatron.quant.recipes.presets``). A format
quantizes each capture once, along its recorded axis. A preset gives every GEMM operand its
own format, so a linear layer's capture is evaluated once per operand it feeds that the
preset quantizes: the forward ``input`` is fprop.input and wgrad.input, the backward
``grad_output`` dgrad.grad_output and wgrad.grad_output; wgrad operands are blocked along
tokens on the layer's 2-D view, the others along the recorded axis.

Captures are listed, filtered and loaded with the analysis package's catalog, so both tools
agree on what a capture is and which files are unusable."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, NamedTuple, Optional, Sequence

import torch

from megatron.quant import formats
from megatron.quant.analysis.captures.catalog import (
    CaptureRecord,
    SkippedFile,
    build_catalog,
    enrich_from_file,
    relative_path,
)
from megatron.quant.analysis.captures.loading import CaptureLoadError, load_capture
from megatron.quant.analysis.captures.selection import CaptureFilter, select
from megatron.quant.formats.base import NumericFormat, normalize_axis
from megatron.quant.layers.module_quant import format_builder
from megatron.quant.recipes import ablations, operands, presets
from megatron.quant.recipes.operands import LINEAR_OPERANDS, ROLES, operands_for_role
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.settings.selectors import format_indices

# Capture fields copied into every result row, in CSV column order (then "file", "axis").
IDENTITY_FIELDS = ("quant_type", "layer_type", "layer_idx", "module", "role", "operation", "phase",
                   "tensor_name", "iteration", "microbatch", "sample", "rank", "shape")


def _along_tokens(operand: str) -> bool:
    """Whether ``operand`` is blocked along tokens (wgrad's dW = dY^T X on [tokens, features] views,
    as ``prepare_input_tensors_for_wgrad_compute`` lays them out): ``LINEAR_TABLE`` says."""
    return any(op.key == operand and op.along_tokens for op in operands.LINEAR_TABLE)


class Captures(NamedTuple):
    records: list[CaptureRecord]
    skipped: list[SkippedFile]
    num_layers: int  # largest layer index in the directory + 1: captures do not record the model's depth


class Evaluation(NamedTuple):
    rows: list[dict]
    not_quantized: list[dict]  # a row's identity, "format" (the preset), "operand" and "reason"
    skipped: list[SkippedFile]


@dataclass(frozen=True)
class Candidate:
    """One ``--formats`` entry: a format (``fmt``), or a preset (``recipe``) whose formats are
    built once per distinct choice (``built``, ``QuantRecipe.resolve``'s shared cache)."""

    name: str
    fmt: Optional[NumericFormat] = None
    recipe: Optional[QuantRecipe] = None
    built: dict = field(default_factory=dict, compare=False, repr=False)


def parse_candidates(names: Sequence[str]) -> list[Candidate]:
    """Candidates for format and preset names; ValueError naming the first bad entry and every
    valid name (a refused preset gives its own reason)."""
    candidates = []
    for name in names:
        if presets.is_preset(name) or ablations.is_variant(name):
            recipe = QuantRecipe.from_dict({"format": name}, source="--formats")
            candidates.append(Candidate(recipe.name, recipe=recipe))
            continue
        try:
            fmt = formats.get_format(name)
        except ValueError:
            valid = sorted(formats.list_formats()) + sorted(formats.ALIASES)
            raise ValueError(f"--formats: {name!r} is neither a format nor a preset; formats: {', '.join(valid)}; "
                             f"presets: {', '.join(presets.preset_names())}") from None
        candidates.append(Candidate(fmt.name, fmt=fmt))
    return candidates


def gemm_operands(role: Optional[str], operation: str, phase: str, tensor_name: str) -> tuple[str, ...]:
    """Recipe operand keys of the GEMM operands a capture feeds, its recorded one first; empty for
    GEMM results and for attention tensors (not mapped to keys)."""
    if phase != "pre" or role not in ROLES or operands_for_role(role) != LINEAR_OPERANDS:
        return ()
    # QuantLinearFunction's capture calls, as the table describes them (the recorded operand first).
    return tuple(op.key for op in operands.LINEAR_TABLE if (op.captured, op.role) == (operation, tensor_name))


def operand_formats(candidate: Candidate, record: CaptureRecord, num_layers: int
                    ) -> tuple[list[tuple[str, NumericFormat]], list[tuple[str, str]]]:
    """(operand key, format) for each use of the capture that ``candidate`` quantizes, and
    (operand key, reason) for what a preset leaves unquantized. A format quantizes the capture
    once, under its recorded operand's key ("" when unknown)."""
    operands = gemm_operands(record.role, record.operation, record.phase, record.tensor_name)
    if candidate.fmt is not None:
        return [(operands[0] if operands else "", candidate.fmt)], []
    if record.role not in ROLES:
        return [], [("", f"role {record.role!r} unknown: cannot tell which operands it feeds")]
    chosen = candidate.recipe.resolve(record.role, record.layer_idx, num_layers, candidate.built,
                                      format_builder(candidate.recipe))
    if all(fmt is None for fmt in chosen.values()):  # out of the preset's scope, or a rule keeps the layer
        return [], [("", "the preset quantizes no operand of this module")]
    if not operands:
        return [], [("", "not mapped to a recipe operand (a GEMM result or an attention tensor)")]
    return ([(key, chosen[key]) for key in operands if chosen[key] is not None],
            [(key, "kept in high precision by the preset") for key in operands if chosen[key] is None])


def gemm_view(x: torch.Tensor, axis: int, operand: str) -> tuple[torch.Tensor, int]:
    """``x`` as ``operand``'s GEMM blocks it, and the block axis: wgrad operands on the 2-D
    [tokens, features] view along tokens, every other operand as captured."""
    if _along_tokens(operand):
        return x.reshape(-1, x.shape[-1]), 0
    return x, axis


def find_captures(tensor_dir: str | Path, capture_filter: CaptureFilter, include_outputs: bool = False) -> Captures:
    """High-precision captures with a tensor file under ``tensor_dir`` that may match the filter
    (roles known only after loading are checked again then): GEMM operands (phase ``pre``), and
    with ``include_outputs`` also GEMM results (``post``: outputs and gradients); the files the
    catalog skipped; and the layer count presets resolve with, from every capture in the
    directory (so filters do not change it). A filter value no capture has is a FilterError."""
    catalog = build_catalog(tensor_dir)
    records = [r for r in catalog.records if r.path is not None and not r.quantized
               and (include_outputs or r.phase == "pre")]
    capture_filter.validate(records)
    num_layers = max((r.layer_idx + 1 for r in catalog.records), default=0)
    return Captures(select(records, capture_filter, unknown_role_passes=True), list(catalog.skipped), num_layers)


def evaluate(tensor: torch.Tensor, record: CaptureRecord, candidates: Sequence[Candidate], file: str,
             num_layers: int) -> tuple[list[dict], list[dict]]:
    """Rows, one per candidate and operand use it quantizes: the capture's identity (``shape``
    and ``axis`` those of the view quantized), the candidate's name as ``format``, the
    ``operand`` key, and quant_stats (in float32, per-tensor amax from the tensor itself) plus
    relative_error = sqrt(rel_mse); and the uses a preset leaves unquantized."""
    from megatron.quant.stats import quant_stats

    x = tensor.float()
    axis = normalize_axis("capture", record.axis, x.dim())
    identity = {name: getattr(record, name) for name in IDENTITY_FIELDS}
    identity["file"] = file
    rows, not_quantized = [], []
    for candidate in candidates:
        uses, left = operand_formats(candidate, record, num_layers)
        for operand, fmt in uses:
            view, view_axis = gemm_view(x, axis, operand)
            stats = quant_stats(view, fmt, axis=view_axis)
            relative = None if stats["rel_mse"] is None else math.sqrt(stats["rel_mse"])
            rows.append({**identity, "shape": list(view.shape), "axis": view_axis, "format": candidate.name,
                         "operand": operand, "bits": fmt.bits, "relative_error": relative, **stats})
        not_quantized += [{**identity, "format": candidate.name, "operand": key, "reason": reason}
                          for key, reason in left]
    return rows, not_quantized


def evaluate_all(records: Sequence[CaptureRecord], candidates: Sequence[Candidate], root: Path,
                 capture_filter: CaptureFilter, num_layers: int, log: Callable[[str], None] = print) -> Evaluation:
    """Rows for every capture, loaded one at a time, the uses presets leave unquantized, and the
    files that could not be used (not loadable, or a tensor a format cannot block, e.g. 0-d);
    progress through ``log``."""
    result = Evaluation([], [], [])
    for position, record in enumerate(records, 1):
        file = relative_path(root, record.path)
        try:
            tensor, metadata = load_capture(record.path)
            record = enrich_from_file(record, metadata)
            if not record.quantized and capture_filter.matches(record):
                rows, not_quantized = evaluate(tensor, record, candidates, file, num_layers)
                result.rows.extend(rows)
                result.not_quantized.extend(not_quantized)
        except (CaptureLoadError, ValueError, RuntimeError) as err:  # one foreign file must not end the run
            result.skipped.append(SkippedFile(file, str(err)))
        if position % 50 == 0 or position == len(records):
            log(f"re-quantized {position}/{len(records)} captures")
    return result


def tensor_class(row: Mapping) -> str:
    """What a format choice is made for: one operand of one GEMM role, e.g. ``fc1/forward/input``.
    A wgrad use of a captured tensor is blocked along another axis than the capture's, so it is a
    class of its own (``fc1/forward/input@wgrad.input``), never averaged with the recorded use."""
    base = f"{row['role']}/{row['operation']}/{row['tensor_name']}"
    return f"{base}@{row['operand']}" if _along_tokens(row.get("operand")) else base


def summarize_not_quantized(entries: Sequence[Mapping]) -> list[dict]:
    """``evaluate``'s not-quantized entries grouped by preset, tensor class, operand and reason,
    with the number of tensors and their layers (e.g. "0-3,7")."""
    groups: dict[tuple[str, str, str, str], list[int]] = {}
    for entry in entries:
        key = (entry["format"], tensor_class(entry), entry["operand"], entry["reason"])
        groups.setdefault(key, []).append(entry["layer_idx"])
    return [{"format": name, "tensor_class": cls, "operand": operand, "reason": reason, "tensors": len(layers),
             "layers": format_indices(sorted(set(layers)))}
            for (name, cls, operand, reason), layers in sorted(groups.items())]


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
