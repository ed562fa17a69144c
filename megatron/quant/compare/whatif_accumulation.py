"""What-if accumulation: how far a Hopper FP8 tensor core's accumulator (``formats.accumulation``) takes a
linear layer's GEMM output from the exact product of the same quantized operands.

A linear layer's captured operands of one step (forward ``input`` and ``weight``, backward
``grad_output``: the same module, iteration, micro-batch, rank and sample) form its three GEMMs:
fprop X W^T, dgrad dY W, wgrad dY^T X. A candidate whose formats for both operands of a GEMM are
per-tensor scaled FP8 quantizes them as the run would; the GEMM's FP32 accumulator, fast or promoted
(the candidate's ``accumulate``, else what Transformer Engine runs on Hopper:
``presets.TE_HOPPER_ACCUMULATE``), is compared with the float64 product of the same FP8 values. The
per-tensor scales multiply both alike, so the statistics are those of the GEMM's output:

- ``relative_error``: ||acc - exact|| / ||exact|| (Frobenius norms);
- ``sqnr_db``: 10 log10(||exact||^2 / ||acc - exact||^2) (None where the accumulator is exact).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from torch import Tensor

from megatron.quant.analysis.captures.catalog import CaptureRecord, SkippedFile, relative_path
from megatron.quant.analysis.captures.loading import CaptureLoadError, load_capture
from megatron.quant.compare.whatif import Candidate
from megatron.quant.formats.accumulation import FP8Kind, Operands, fp8_kind, hopper_accumulate
from megatron.quant.formats.base import NumericFormat
from megatron.quant.layers.module_quant import format_builder
from megatron.quant.recipes import presets
from megatron.quant.recipes.operands import LINEAR_OPERANDS, ROLES, operands_for_role

# The statistic's columns, in CSV order: where (the step's identity), which GEMM, how it accumulated, the error.
STEP_FIELDS = ("layer_idx", "module", "role", "iteration", "microbatch", "sample", "rank")
COLUMNS = (*STEP_FIELDS, "format", "gemm", "accumulate", "k", "relative_error", "sqnr_db")
# gemm -> its two operands, a then b of C = a b^T (K the last dimension of both): (recipe key, captured
# (operation, tensor), transposed on the 2-D view). dgrad's b is W^T [in, out]; wgrad's are dY^T and X^T.
GEMMS = {
    "fprop": (("fprop.input", ("forward", "input"), False), ("fprop.weight", ("forward", "weight"), False)),
    "dgrad": (("dgrad.grad_output", ("backward", "grad_output"), False), ("dgrad.weight", ("forward", "weight"), True)),
    "wgrad": (("wgrad.grad_output", ("backward", "grad_output"), True), ("wgrad.input", ("forward", "input"), True)),
}
Step = tuple  # STEP_FIELDS' values


def accumulator_error(a: Tensor, b: Tensor, kinds: tuple[FP8Kind, FP8Kind],
                      fast: bool) -> tuple[float, Optional[float]]:
    """(relative error, SQNR in dB or None) of a b^T's Hopper FP8 accumulator (``fast`` or promoted)
    against the float64 product; a [M, K] and b [N, K] hold FP8 values of ``kinds``."""
    exact = a.double() @ b.double().t()
    acc = hopper_accumulate(Operands(a, b, *kinds), fast).double()
    signal, noise = float(exact.square().sum()), float((acc - exact).square().sum())
    if signal == 0:
        return (0.0 if noise == 0 else math.inf), None
    return math.sqrt(noise / signal), (10 * math.log10(signal / noise) if noise else None)


def step_of(record: CaptureRecord) -> Step:
    return tuple(getattr(record, name) for name in STEP_FIELDS)


def linear_steps(records: Sequence[CaptureRecord]) -> dict[Step, dict[tuple[str, str], CaptureRecord]]:
    """The high-precision GEMM operands of linear layers grouped by step: step -> (operation, tensor) -> record."""
    steps: dict[Step, dict[tuple[str, str], CaptureRecord]] = {}
    for record in records:
        if (record.phase == "pre" and not record.quantized and record.path is not None and record.role in ROLES
                and operands_for_role(record.role) == LINEAR_OPERANDS):
            steps.setdefault(step_of(record), {})[(record.operation, record.tensor_name)] = record
    return steps


def _formats(candidate: Candidate, role: str, layer: int, num_layers: int) -> Mapping[str, Optional[NumericFormat]]:
    if candidate.fmt is not None:
        return {key: candidate.fmt for key in LINEAR_OPERANDS}
    return candidate.recipe.resolve(role, layer, num_layers, candidate.built, format_builder(candidate.recipe))


def _modes(candidate: Candidate) -> dict[str, str]:
    """The accumulation per GEMM: the candidate's where it asks for a Hopper accumulator, else TE's on Hopper."""
    own = candidate.recipe.accumulation() if candidate.recipe is not None else {}
    return {gemm: own.get(gemm) if own.get(gemm, "exact") != "exact" else mode
            for gemm, mode in presets.TE_HOPPER_ACCUMULATE.items()}


def _operand(fmt: NumericFormat, x: Tensor, transposed: bool) -> Tensor:
    """x ([rows, cols]) as the GEMM takes it, quantized per tensor: its FP8 values (the scale is left out)."""
    values, _ = fmt.quantize_for_gemm(x, axis=-1, amax=fmt.amax_of(x))
    return values.float().t() if transposed else values.float()


def step_rows(tensors: Mapping[tuple[str, str], Tensor], step: Step, candidates: Sequence[Candidate],
              num_layers: int) -> list[dict]:
    """One row per candidate and GEMM of one step whose two operands are captured and per-tensor FP8."""
    identity = dict(zip(STEP_FIELDS, step))
    rows = []
    for candidate in candidates:
        fmts, modes = _formats(candidate, identity["role"], identity["layer_idx"], num_layers), _modes(candidate)
        for gemm, operands in GEMMS.items():
            kinds = tuple(fp8_kind(fmts[key]) for key, _, _ in operands)
            if None in kinds or any(captured not in tensors for _, captured, _ in operands):
                continue
            a, b = (_operand(fmts[key], tensors[captured], transposed) for key, captured, transposed in operands)
            error, sqnr = accumulator_error(a, b, kinds, modes[gemm] == "fast")  # type: ignore[arg-type]
            rows.append({**identity, "format": candidate.name, "gemm": gemm, "accumulate": modes[gemm],
                         "k": a.shape[1], "relative_error": error, "sqnr_db": sqnr})
    return rows


def evaluate_all(records: Sequence[CaptureRecord], candidates: Sequence[Candidate], root: Path, num_layers: int,
                 log: Callable[[str], None] = print) -> tuple[list[dict], list[SkippedFile]]:
    """``step_rows`` of every step whose captures load, and the files that could not be used; progress
    through ``log`` (the accumulator model costs hundreds of times an exact GEMM on a CPU)."""
    candidates = [c for c in candidates if _any_fp8(c, num_layers)]
    steps = linear_steps(records)
    rows: list[dict] = []
    skipped: list[SkippedFile] = []
    if not candidates or not steps:
        return rows, skipped
    for position, (step, captured) in enumerate(sorted(steps.items(), key=lambda item: repr(item[0])), 1):
        tensors = {}
        for key, record in captured.items():
            try:
                tensor, _ = load_capture(record.path)
                tensors[key] = tensor.float().reshape(-1, tensor.shape[-1])
            except (CaptureLoadError, ValueError, RuntimeError) as err:
                skipped.append(SkippedFile(relative_path(root, record.path), str(err)))
        if ("backward", "weight") in tensors:  # the same weight: either capture serves every GEMM
            tensors.setdefault(("forward", "weight"), tensors[("backward", "weight")])
        rows += step_rows(tensors, step, candidates, num_layers)
        if position % 10 == 0 or position == len(steps):
            log(f"accumulated the GEMMs of {position}/{len(steps)} captured linear-layer steps")
    return rows, skipped


def _any_fp8(candidate: Candidate, num_layers: int) -> bool:
    """Whether ``candidate`` quantizes some linear GEMM operand in per-tensor FP8."""
    if candidate.fmt is not None:
        return fp8_kind(candidate.fmt) is not None
    return any(fp8_kind(fmt) is not None for fmt in candidate.recipe.formats(max(num_layers, 1)))
