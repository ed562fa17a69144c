"""quick_analysis.png (the magnitudes of weights, activations and gradients, per quant type) and
tensor_stats.txt (totals, value statistics, capture counts), the first look of quick_visualize.py."""
from __future__ import annotations

from collections import Counter
from typing import Callable

from megatron.quant.analysis import figures
from megatron.quant.analysis.captures.inputs import AnalysisInput
from megatron.quant.analysis.captures.summary import TensorSummary, group_by, log2_panels, pooled_moments
from megatron.quant.analysis.plans import AnalysisPlan, FigureJob, OutputFile

_COUNTED_BY: dict[str, Callable[[TensorSummary], object]] = {
    "quant type": lambda s: s.record.quant_type,
    "layer type": lambda s: s.record.layer_type,
    "operation": lambda s: s.record.operation,
    "phase": lambda s: s.record.phase,
    "tensor name": lambda s: s.record.tensor_name,
    "layer": lambda s: s.record.layer_idx,
    "iteration": lambda s: s.record.iteration,
    "rank": lambda s: s.record.rank,
}


def tensor_kind(summary: TensorSummary) -> str:
    """Weights, activations or gradients: three families of values that lie decades apart."""
    if summary.record.operation == "backward":
        return "gradients"
    return "weights" if summary.record.tensor_name == "weight" else "activations"


def build(inp: AnalysisInput) -> AnalysisPlan:
    by_quant = group_by(inp.originals, lambda s: s.record.quant_type)
    plan = AnalysisPlan(files=[OutputFile("tensor_stats.txt", "Totals, value statistics and capture counts.")])
    kept = plan.first_panels("quick analysis", by_quant.items(), inp.settings.max_panels)
    (inp.output_dir / "tensor_stats.txt").write_text(tensor_stats_text(inp), encoding="utf-8")
    plan.figures.append(FigureJob(
        "quick_analysis.png",
        "Magnitudes of all captured values, per quant type: the share of the weights', activations' and "
        "gradients' values per binade of |x| (all elements of every capture). How many captures of each "
        "kind: tensor_stats.txt and the summary above.", figures.draw_log2_panels,
        {"title": "Quick analysis: weights, activations and gradients", "panels": log2_panels(kept, tensor_kind)}))
    return plan


def tensor_stats_text(inp: AnalysisInput) -> str:
    summaries = inp.originals
    with_files = [s for s in summaries if s.record.path is not None]
    moments = pooled_moments(summaries)
    lines = [
        "Tensor statistics",
        "=================",
        f"tensor directory: {inp.tensor_dir}",
        f"filters: {inp.filters}",
        f"captures: {len(summaries)} ({len(with_files)} tensor files, "
        f"{len(summaries) - len(with_files)} statistics-only manifest entries)",
        f"quantized copies (not counted above): {len(inp.summaries) - len(summaries)}",
        f"skipped files: {len(inp.skipped)}",
        f"total values: {moments['numel']:,.0f}",
        f"value range: [{moments['min']:.6g}, {moments['max']:.6g}]",
        f"mean: {moments['mean']:.6g}",
        f"std: {moments['std']:.6g}",
        "",
        "Per quant type (exact, over all elements of the captured tensors)",
        f"  {'quant type':<16}{'captures':>10}{'values':>16}{'min':>13}{'max':>13}"
        f"{'mean':>13}{'std':>13}",
    ]
    for quant_type in sorted({s.record.quant_type for s in summaries}):
        group = [s for s in summaries if s.record.quant_type == quant_type]
        m = pooled_moments(group)
        lines.append(f"  {quant_type:<16}{len(group):>10}{m['numel']:>16,.0f}{m['min']:>13.5g}"
                     f"{m['max']:>13.5g}{m['mean']:>13.5g}{m['std']:>13.5g}")
    for name, key in _COUNTED_BY.items():
        counts = Counter(key(s) for s in summaries)
        lines += ["", f"Captures by {name}"]
        lines += [f"  {str(value):<24}{count:>8}  ({100 * count / len(summaries):5.1f}%)"
                  for value, count in sorted(counts.items(), key=lambda kv: str(kv[0]))]
    if inp.skipped:
        lines += ["", "Skipped files"]
        lines += [f"  {s.path}: {s.reason}" for s in inp.skipped]
    return "\n".join(lines) + "\n"

