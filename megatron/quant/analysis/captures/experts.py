"""experts/: mixture-of-experts layers, each routed expert's load beside its quantization error and
underflow (do rarely used experts quantize worse?).

The load is what the router recorded (``tokens_per_expert``, the routed token slots per global expert,
summed over the captured iterations, micro-batches and ranks); the error and underflow are those of
the expert's captured activations and gradients (its fc1/fc2 inputs and output gradients: the
operands whose scales depend on the tokens routed to it), element-weighted over the captures.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from megatron.quant.analysis import figures
from megatron.quant.analysis.captures.inputs import AnalysisInput
from megatron.quant.analysis.captures.summary import TensorSummary, group_by
from megatron.quant.analysis.plans import AnalysisPlan, FigureJob, figure_path
from megatron.quant.tensor_saver import expert_index

FOLDER = "experts"
LOAD_TENSOR = "tokens_per_expert"
TOKEN_OPERANDS = ("input", "grad_output")  # scaled from the routed tokens (weights are not)
# (metric, panel title, axis label, factor)
_PANELS = (("sqnr_db", "SQNR of activations and gradients", "SQNR (dB)", 1.0),
           ("underflow_ratio", "Underflow", "underflow (% of elements)", 100.0))


def build(inp: AnalysisInput) -> AnalysisPlan:
    plan = AnalysisPlan()
    for quant_type, items in group_by(inp.originals, lambda s: s.record.quant_type).items():
        loads = _loads([s for s in items if s.record.role == "router" and s.record.tensor_name == LOAD_TENSOR])
        if not loads:
            continue
        errors = _errors([s for s in items if s.record.module and expert_index(s.record.module) is not None
                          and s.record.tensor_name in TOKEN_OPERANDS and s.quant is not None])
        layers = plan.first_panels(f"{quant_type} experts", sorted(loads), inp.settings.max_panels)
        plan.figures.append(FigureJob(
            figure_path(FOLDER, quant_type, "load_and_error"),
            f"{quant_type}: each routed expert's load (token slots the router sent it, over the captured "
            f"iterations) beside the SQNR and underflow of its activations and gradients (element-weighted).",
            draw_experts, {"title": f"{quant_type}: load per expert and its quantization",
                           "layers": {layer: {"load": loads[layer], **errors.get(layer, {})} for layer in layers}}))
    if not plan.figures and any(s.record.role == "router" or expert_index(s.record.module or "") is not None
                                for s in inp.originals):  # a dense model's report has no experts section
        plan.notes.append("No MoE router load in these captures (the router's captures filtered out, or "
                          "statistics-only capture: the counts are in the tensor files that full mode "
                          "writes): no expert figures.")
    return plan


def _loads(records: list[TensorSummary]) -> dict[int, list[float]]:
    """Layer -> token slots per global expert, summed over the records whose values were captured."""
    totals: dict[int, np.ndarray] = {}
    for s in records:
        if not s.has_values or s.sample.size != int(s.stat("numel")):
            continue  # a statistics-only entry: the counts are in the tensor file only
        layer = s.record.layer_idx
        totals[layer] = totals.get(layer, np.zeros(s.sample.size)) + s.sample
    return {layer: counts.tolist() for layer, counts in totals.items()}


def _errors(records: list[TensorSummary]) -> dict[int, dict[str, dict[int, float]]]:
    """Layer -> metric -> expert -> the element-weighted metric over that expert's records."""
    sums: dict[tuple[int, str, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for s in records:
        weight = s.stat("numel")
        for metric, _, _, factor in _PANELS:
            value = s.quant_metric(metric)
            if np.isfinite(value) and weight > 0:
                entry = sums[(s.record.layer_idx, metric, expert_index(s.record.module))]
                entry[0] += factor * value * weight
                entry[1] += weight
    out: dict[int, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for (layer, metric, expert), (total, weight) in sums.items():
        out[layer][metric][expert] = total / weight
    return {layer: dict(metrics) for layer, metrics in out.items()}


def draw_experts(payload: dict) -> Figure:
    layers = payload["layers"]
    fig, axes = figures.subplot_grid(3 * len(layers), ncols=3, panel_size=(4.0, 3.6))  # the page's width: 8-pt labels
    for row, (layer, data) in enumerate(layers.items()):
        load = np.array(data["load"])
        experts = np.arange(load.size)
        share = 100 * load / max(load.sum(), 1.0)
        ax = axes[3 * row]
        ax.bar(experts, share, color="C0")
        ax.axhline(100 / load.size, color="grey", linestyle="--", linewidth=1, label="uniform")
        ax.set_title(f"Layer {layer}: load", fontsize=10)
        ax.set_xlabel("expert")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("% of routed token slots")
        figures.legend_above(ax)
        for ax, (metric, title, ylabel, _) in zip(axes[3 * row + 1:3 * row + 3], _PANELS):
            values = data.get(metric, {})
            if not values:
                figures.no_data(ax, "no quantized expert operand captured")
            elif not figures.one_value(ax, list(values.values()), f"{ylabel}, every expert"):
                measured = sorted(values)
                ax.scatter([share[e] for e in measured], [values[e] for e in measured], color="C1")
                for e in measured:
                    ax.annotate(str(e), (share[e], values[e]), fontsize=8, xytext=(3, 3), textcoords="offset points")
                figures.honest_limits(ax, [values[e] for e in measured])
                ax.set_xlabel("load (% of routed token slots)")
                ax.set_ylabel(ylabel)
            ax.set_title(f"Layer {layer}: {title} vs load", fontsize=10)
            ax.grid(alpha=0.3)
    return figures.finish(fig, payload["title"])
