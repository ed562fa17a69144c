"""quick_analysis.png (values of all tensors; captures by quant type, layer type, operation)
and tensor_stats.txt, as the original quick_visualize.py made them."""
from __future__ import annotations

from collections import Counter
from typing import Callable

from matplotlib.figure import Figure

from megatron.quant.analysis import figures
from megatron.quant.analysis.captures.inputs import AnalysisInput
from megatron.quant.analysis.captures.summary import TensorSummary, pooled_moments, pooled_sample
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


def build(inp: AnalysisInput) -> AnalysisPlan:
    summaries = inp.originals
    values = pooled_sample(inp.with_values, inp.settings.figure_budget)
    payload = {
        "values": values,
        "n_tensors": len(inp.with_values),
        "pies": {name: dict(Counter(_COUNTED_BY[name](s) for s in summaries))
                 for name in ("quant type", "layer type", "operation")},
    }
    (inp.output_dir / "tensor_stats.txt").write_text(tensor_stats_text(inp), encoding="utf-8")
    return AnalysisPlan(
        figures=[FigureJob("quick_analysis.png",
                           "Values of all captured tensors (sampled) and how the captures split "
                           "by quant type, layer type and operation.", draw_quick, payload)],
        files=[OutputFile("tensor_stats.txt", "Totals, value statistics and capture counts.")])


def draw_quick(payload: dict) -> Figure:
    fig, axes = figures.subplot_grid(4, ncols=2, panel_size=(6.5, 4.8))
    values = payload["values"]
    axes[0].hist(values, bins=100, color="tab:blue")
    axes[0].set_yscale("log")
    axes[0].set_title(f"Values of {payload['n_tensors']} tensors ({values.size:,} sampled)",
                      fontsize=10)
    axes[0].set_xlabel("value")
    axes[0].set_ylabel("count (log scale)")
    axes[0].grid(alpha=0.3)
    for ax, (name, counts) in zip(axes[1:], payload["pies"].items()):
        labels = sorted(counts, key=str)
        ax.set_title(f"Captures by {name} ({sum(counts.values())} in all)", fontsize=10)
        if len(labels) == 1:  # a one-slice pie says one thing: say it
            figures.no_data(ax, f"all {sum(counts.values())} captures: {name} {labels[0]}")
            continue
        ax.pie([counts[k] for k in labels], labels=[str(k) for k in labels], autopct="%1.1f%%",
               startangle=90, counterclock=False)
    return figures.finish(fig, "Quick analysis of captured tensors")


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

