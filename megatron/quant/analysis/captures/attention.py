"""attention_analysis/: attention inputs and outputs across quant types, and attention maps
recomputed from captured query and key (head 0 of the first sequence, causal mask)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from megatron.quant.analysis import figures
from megatron.quant.analysis.captures.inputs import AnalysisInput
from megatron.quant.analysis.captures.loading import CaptureLoadError, load_capture
from megatron.quant.analysis.captures.summary import group_by, sampled_series
from megatron.quant.analysis.plans import AnalysisPlan, FigureJob, figure_path

FOLDER = "attention_analysis"
MAX_TOKENS = 128  # attention maps show the first tokens only


def build(inp: AnalysisInput) -> AnalysisPlan:
    plan = AnalysisPlan()
    attention = [s for s in inp.with_values if s.record.layer_type == "attention"]
    if not attention:
        plan.notes.append("Not drawn: no attention captures selected "
                          "(layer_type 'attention' in the capture names).")
        return plan
    by_tensor = list(group_by(attention, lambda s: s.record.tensor_key).items())
    kept = plan.first_panels("attention distributions", by_tensor, inp.settings.max_panels)
    budget = inp.settings.figure_budget // max(1, len(kept))
    plan.figures.append(FigureJob(
        figure_path(FOLDER, "attention_distributions"),
        "Attention inputs, outputs and gradients: value distributions per quant type.",
        figures.draw_histogram_panels,
        {"title": "Attention tensors across quant types", "panels": [{"title": key.label,
                     "series": sampled_series(group_by(items, lambda s: s.record.quant_type),
                                              budget)} for key, items in kept]}))
    pairs = query_key_pairs(attention)
    if pairs:
        plan.figures.append(FigureJob(
            figure_path(FOLDER, "attention_maps"),
            f"Attention probabilities softmax(QK^T/sqrt(d)) of head 0, first sequence, first "
            f"{MAX_TOKENS} tokens, causal mask, recomputed from the captured query and key "
            f"(one capture per quant type).", draw_attention_maps, {"pairs": pairs}))
    else:
        plan.notes.append("No attention map: no capture has both the forward 'query' and 'key' "
                          "of the same layer, iteration, rank and sample.")
    return plan


def query_key_pairs(attention) -> list[dict]:
    """The earliest (query, key) forward-pre pair of each quant type, as file paths."""
    pairs = []
    for quant_type, items in group_by(attention, lambda s: s.record.quant_type).items():
        by_site = group_by([s for s in items if s.record.operation == "forward"
                            and s.record.phase == "pre" and s.record.path is not None],
                           lambda s: s.record.site_key[1:])
        for site, captures in by_site.items():
            names = {s.record.tensor_name: s.record for s in captures}
            if "query" in names and "key" in names:
                query = names["query"]
                pairs.append({"quant_type": quant_type, "query": str(query.path),
                              "key": str(names["key"].path),
                              "label": f"{quant_type}: L{query.layer_idx} iter {query.iteration} "
                                       f"rank {query.rank} sample {query.sample}"})
                break
    return pairs


def attention_probabilities(query: torch.Tensor, key: torch.Tensor) -> np.ndarray:
    """Head 0 of sequence 0 of [seq, batch, heads, head_dim] query/key, causal softmax."""
    if query.ndim != 4 or key.ndim != 4 or query.shape[-1] != key.shape[-1]:
        raise ValueError(f"expected [seq, batch, heads, head_dim] query and key, got "
                         f"{list(query.shape)} and {list(key.shape)}")
    q = query[:MAX_TOKENS, 0, 0, :].to(torch.float32)
    k = key[:MAX_TOKENS, 0, 0, :].to(torch.float32)
    scores = q @ k.T / math.sqrt(q.shape[-1])
    causal = torch.ones_like(scores, dtype=torch.bool).triu(1)
    return torch.softmax(scores.masked_fill(causal, -math.inf), dim=-1).numpy()


def draw_attention_maps(payload: dict) -> Figure:
    pairs = payload["pairs"]
    fig, axes = figures.subplot_grid(len(pairs), ncols=2, panel_size=(5.6, 4.8))
    for ax, pair in zip(axes, pairs):
        ax.set_title(pair["label"], fontsize=10)
        try:
            probabilities = attention_probabilities(load_capture(Path(pair["query"]))[0],
                                                    load_capture(Path(pair["key"]))[0])
        except (CaptureLoadError, ValueError) as error:
            figures.no_data(ax, f"not drawn: {error}")
            continue
        visible = np.ma.masked_less_equal(probabilities, 0)
        image = ax.imshow(visible, cmap="magma", interpolation="nearest",
                          norm=LogNorm(vmin=max(float(visible.min()), 1e-6), vmax=1.0))
        ax.set_xlabel("key position (token)")
        ax.set_ylabel("query position (token)")
        figures.colour_bar(ax, image, "attention probability")
    return figures.finish(fig, "Attention maps (head 0)")
