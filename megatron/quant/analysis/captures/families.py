"""The analyses, in report order, and the named sets the scripts run."""
from __future__ import annotations

from typing import Iterable

from megatron.quant.analysis.captures import (
    attention,
    backward,
    bf16,
    block_scales,
    comparisons,
    distributions,
    experts,
    exponents,
    fp8,
    heatmaps,
    layers,
    overflow,
    quantization,
    quick,
    rank,
    statistics,
    trends,
    whatif,
)
from megatron.quant.analysis.captures.inputs import Analysis

_FORMAT = frozenset({"format"})
ANALYSES: tuple[Analysis, ...] = (
    Analysis("quick", "Quick analysis", "", "How large the weights', activations' and gradients' values are, "
             "per quant type; totals and capture counts in tensor_stats.txt.", quick.build),
    Analysis("distributions", "Distributions", distributions.FOLDER,
             "Histogram, box plot and Q-Q plot against a normal.", distributions.build),
    Analysis("heatmaps", "Heatmaps", heatmaps.FOLDER,
             "Where large magnitudes sit in each tensor (outlier channels).", heatmaps.build,
             frozenset({"heatmap"})),
    Analysis("comparisons", "Comparisons across quant types", comparisons.FOLDER,
             "The same tensor under every quant type.", comparisons.build),
    Analysis("statistics", "Statistics", statistics.FOLDER,
             "Per-capture statistics and the CSV of all of them.", statistics.build, _FORMAT),
    Analysis("attention", "Attention", attention.FOLDER,
             "Attention inputs and outputs, and attention maps.", attention.build),
    Analysis("quantization", "Quantization error", quantization.FOLDER,
             "SQNR, relative MSE, cosine; original vs quantized values.", quantization.build,
             _FORMAT),
    Analysis("layers", "Layers", layers.FOLDER,
             "Attention vs linear, statistics and format errors along the layers, samples.",
             layers.build, _FORMAT),
    Analysis("overflow", "Overflow and underflow", overflow.FOLDER,
             "Clipped (upper) and flushed-to-zero (lower) elements.", overflow.build, _FORMAT),
    Analysis("fp8", "HiFP8 vs MXFP8", fp8.FOLDER,
             "Distributions, statistics, correlation and normal fit of the two FP8 formats.",
             fp8.build),
    Analysis("bf16", "BF16 baseline", bf16.FOLDER,
             "Raw and normalised densities; variance, skewness, kurtosis.", bf16.build),
    Analysis("backward", "Forward vs backward", backward.FOLDER,
             "Gradients against activations.", backward.build),
    Analysis("rank", "Ranks", rank.FOLDER, "Differences between ranks.", rank.build),
    Analysis("exponents", "Exponent histograms", exponents.FOLDER,
             "log2 magnitudes against each format's representable range.", exponents.build,
             _FORMAT),
    Analysis("trends", "Over training", trends.FOLDER,
             "Statistics over training iterations.", trends.build, _FORMAT),
    Analysis("experts", "Mixture of experts", experts.FOLDER,
             "Each routed expert's load beside the quantization error and underflow of its operands.",
             experts.build, _FORMAT),
    Analysis("block_scales", "Block scales", block_scales.FOLDER,
             "Spread of the block scales of block formats, per layer and over training.", block_scales.build),
    Analysis("whatif", "What-if formats", whatif.FOLDER,
             "The captured operands under other formats: underflow, overflow and SQNR over training and per layer.",
             whatif.build),
)
BY_KEY = {analysis.key: analysis for analysis in ANALYSES}
SETS: dict[str, tuple[str, ...]] = {
    "quick": ("quick",),
    # the folders of the original visualize_tensors.py
    "basic": ("distributions", "heatmaps", "comparisons", "statistics", "attention"),
    # the folders of the original enhanced_tensor_visualizer.py, and the new analyses
    "enhanced": ("quantization", "layers", "overflow", "fp8", "bf16", "backward", "rank",
                 "exponents", "trends", "experts", "block_scales", "whatif"),
    "all": tuple(BY_KEY),
}


def resolve(names: Iterable[str]) -> tuple[Analysis, ...]:
    """Analyses named by key or set name, in report order; ValueError lists the valid names."""
    keys: set[str] = set()
    for name in names:
        if name in SETS:
            keys.update(SETS[name])
        elif name in BY_KEY:
            keys.add(name)
        else:
            raise ValueError(f"unknown analysis {name!r}; valid: sets {', '.join(SETS)} or "
                             f"analyses {', '.join(BY_KEY)}")
    return tuple(analysis for analysis in ANALYSES if analysis.key in keys)
