"""Matplotlib (Agg) building blocks shared by the analyses, and the figure renderer."""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Mapping, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)
import numpy as np  # noqa: E402
import scipy.stats  # noqa: E402

from megatron.quant.analysis.plans import FigureJob  # noqa: E402

DENSITY_LABEL = "probability density (1/value)"
_LEGEND_FONT = 8


def subplot_grid(n_panels: int, ncols: int = 3, panel_size: tuple[float, float] = (5.0, 3.8)):
    """A figure with ``n_panels`` axes (row-major); unused cells are hidden."""
    ncols = max(1, min(ncols, n_panels))
    nrows = math.ceil(n_panels / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel_size[0] * ncols, panel_size[1] * nrows),
                             squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    return fig, flat[:n_panels]


def finish(fig, title: str):
    fig.suptitle(title, fontsize=13)
    fig.tight_layout()
    return fig


def spans_decades(values: Sequence[float], decades: float = 2.0) -> bool:
    """True when the positive values range over more than ``decades`` powers of ten."""
    positive = np.asarray([v for v in values if v is not None and np.isfinite(v) and v > 0])
    return positive.size > 1 and math.log10(positive.max() / positive.min()) > decades


def no_data(ax, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def value_histograms(ax, series: Mapping[str, np.ndarray], title: str,
                     xlabel: str = "value", bins: int = 80, density: bool = True) -> None:
    """Overlaid step histograms on shared bins; log y when the densities span decades."""
    series = {label: values[np.isfinite(values)] for label, values in series.items()}
    series = {label: values for label, values in series.items() if values.size}
    ax.set_title(title, fontsize=10)
    if not series:
        no_data(ax, "no finite values")
        return
    pooled = np.concatenate(list(series.values()))
    low, high = float(pooled.min()), float(pooled.max())
    if low == high:
        low, high = low - 0.5, high + 0.5
    edges = np.linspace(low, high, bins + 1)
    heights = []
    for label, values in series.items():
        counts, _, _ = ax.hist(values, bins=edges, density=density, histtype="step",
                               linewidth=1.4, label=f"{label} (n={values.size:,})")
        heights.extend(counts)
    if spans_decades(heights):
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(DENSITY_LABEL if density else "count (sampled values)")
    ax.legend(fontsize=_LEGEND_FONT)
    ax.grid(alpha=0.3)


def box_plot(ax, series: Mapping[str, np.ndarray], title: str, ylabel: str,
             log: Optional[bool] = None) -> None:
    """Boxes (quartiles), whiskers at the 1st/99th percentiles; log y when data span decades."""
    series = {label: np.asarray(v, dtype=float) for label, v in series.items()}
    series = {label: v[np.isfinite(v)] for label, v in series.items() if np.isfinite(v).any()}
    ax.set_title(title, fontsize=10)
    if not series:
        no_data(ax, "no finite values")
        return
    if log is None:
        log = all((v > 0).all() for v in series.values()) and spans_decades(
            np.concatenate(list(series.values())))
    ax.boxplot(list(series.values()), whis=(1, 99), showfliers=False)
    ax.set_xticks(range(1, len(series) + 1), list(series), rotation=30, ha="right", fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel + (" (log scale)" if log else ""))
    ax.grid(alpha=0.3, axis="y")


def qq_normal(ax, series: Mapping[str, np.ndarray], title: str) -> None:
    """Quantiles of the standardised values against a standard normal's."""
    probabilities = np.linspace(0.001, 0.999, 199)
    theoretical = scipy.stats.norm.ppf(probabilities)
    ax.set_title(title, fontsize=10)
    drawn = False
    for label, values in series.items():
        values = values[np.isfinite(values)].astype(np.float64)
        if values.size < 3 or values.std() == 0:
            continue
        standardised = (values - values.mean()) / values.std()
        ax.plot(theoretical, np.quantile(standardised, probabilities), ".", markersize=3,
                label=label)
        drawn = True
    if not drawn:
        no_data(ax, "not enough varying values")
        return
    ax.plot(theoretical, theoretical, "k--", linewidth=1, label="normal")
    ax.set_xlabel("standard normal quantile")
    ax.set_ylabel("standardised sample quantile")
    ax.legend(fontsize=_LEGEND_FONT)
    ax.grid(alpha=0.3)


def grouped_bars(ax, categories: Sequence[str], groups: Mapping[str, Sequence[float]],
                 title: str, ylabel: str, log: Optional[bool] = None) -> None:
    """One bar per (category, group); NaN bars are left out."""
    ax.set_title(title, fontsize=10)
    values = [v for vs in groups.values() for v in vs if np.isfinite(v)]
    if not categories or not values:
        no_data(ax, "no data")
        return
    width = 0.8 / max(1, len(groups))
    positions = np.arange(len(categories))
    for i, (label, heights) in enumerate(groups.items()):
        heights = np.asarray(heights, dtype=float)
        heights = np.where(np.isfinite(heights), heights, np.nan)  # e.g. infinite SQNR
        ax.bar(positions + (i - (len(groups) - 1) / 2) * width, heights, width, label=label)
    ax.set_xticks(positions, list(categories), rotation=30, ha="right", fontsize=8)
    if log if log is not None else spans_decades(values):
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    if len(groups) > 1:
        ax.legend(fontsize=_LEGEND_FONT)
    ax.grid(alpha=0.3, axis="y")


def line_panel(ax, series: Mapping[str, tuple[Sequence[float], Sequence[float]]], title: str,
               xlabel: str, ylabel: str, log: Optional[bool] = None) -> None:
    """One line with markers per label, (x, y) each; log y when the values span decades."""
    ax.set_title(title, fontsize=10)
    values = [v for _, ys in series.values() for v in ys if np.isfinite(v)]
    if not values:
        no_data(ax, "no data")
        return
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, "o-", markersize=3, linewidth=1.2, label=label)
    if log if log is not None else (min(values) > 0 and spans_decades(values)):
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, ncol=2 if len(series) > 6 else 1)
    ax.grid(alpha=0.3)


def log2_histogram(ax, start: int, counts: np.ndarray, label: str) -> tuple[int, int]:
    """Step outline over binades (bin k covers [start + k, start + k + 1) of log2|x|), in % of
    the nonzero values; returns the occupied range of log2|x| for the caller's x limits."""
    counts = np.asarray(counts, dtype=float)
    occupied = np.flatnonzero(counts)
    if not occupied.size:
        return 0, 0
    edges = start + np.arange(counts.size + 1)
    ax.stairs(100 * counts / counts.sum(), edges, linewidth=1.4, label=label)
    return int(edges[occupied[0]]), int(edges[occupied[-1] + 1])


def log2_panel(ax, histograms: Mapping[str, tuple[int, np.ndarray]], title: str,
               xlabel: str = "log2|x| (binade)") -> None:
    """Several log2 histograms on one axis, zoomed to the occupied binades."""
    ax.set_title(title, fontsize=10)
    ranges = [log2_histogram(ax, start, counts, label)
              for label, (start, counts) in histograms.items() if np.any(counts)]
    if not ranges:
        no_data(ax, "only zeros")
        return
    ax.set_xlim(min(r[0] for r in ranges) - 1, max(r[1] for r in ranges) + 1)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("% of nonzero values (log scale)")
    ax.legend(fontsize=_LEGEND_FONT)
    ax.grid(alpha=0.3)


def draw_histogram_panels(payload: dict):
    """A figure of value-histogram panels: {"title": str, "panels": [{"title", "series"}]}."""
    panels = payload["panels"]
    fig, axes = subplot_grid(len(panels), ncols=3)
    for ax, panel in zip(axes, panels):
        value_histograms(ax, panel["series"], panel["title"])
    return finish(fig, payload["title"])


def render(job: FigureJob, output_dir: Path, dpi: int) -> Optional[str]:
    """Draw and save one figure; the error text if drawing failed (reported, not raised)."""
    target = output_dir / job.path
    target.parent.mkdir(parents=True, exist_ok=True)
    fig = None
    try:
        fig = job.draw(job.payload)
        partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        fig.savefig(partial, dpi=dpi, bbox_inches="tight", format="png")
        os.replace(partial, target)  # never a half-written PNG under the final name
        return None
    except Exception as error:  # one broken figure must not lose the rest of the report
        return f"{type(error).__name__}: {error}"
    finally:
        if fig is not None:
            plt.close(fig)
