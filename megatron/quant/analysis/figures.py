"""Matplotlib (Agg) building blocks shared by the analyses (``figure_render`` draws and saves a figure)."""
from __future__ import annotations

import math
import statistics
from typing import Mapping, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator, NullLocator  # noqa: E402

from megatron.quant.analysis.figure_budget import MAX_SERIES  # noqa: E402
from megatron.quant.analysis.figure_layout import (  # noqa: E402,F401
    VALUE_TICKS,
    colour_bar,
    decade,
    honest_limits,
    label_heatmap,
    legend_above,
    make_headroom,
    merge_hidden_lines,
    one_value,
    room_for_row_names,
    row_fontsize,
)

_STANDARD_NORMAL = statistics.NormalDist()
DENSITY_LABEL = "probability density (1/value)"
_LEGEND_FONT = 8
_UPRIGHT_BOXES = 12  # box plots with more boxes lie down
_MIN_BOX = 5  # fewer values are drawn as they are, not as a box


# Fixed layout in inches (tight_layout measures every text and costs about a third of a
# figure's drawing time): room for tick labels, axis labels and two-line panel titles.
_LEFT, _RIGHT, _TOP, _BOTTOM = 0.95, 0.3, 0.9, 0.3
_GAP_WIDTH, _GAP_HEIGHT = 1.15, 1.45


def subplot_grid(n_panels: int, ncols: int = 3, panel_size: tuple[float, float] = (5.0, 3.8),
                 legend_width: float = 0.0) -> tuple[Figure, list[Axes]]:
    """``n_panels`` axes (row-major) of about ``panel_size`` inches with labels, ``legend_width`` free at the right."""
    ncols = max(1, min(ncols, n_panels))
    nrows = math.ceil(n_panels / ncols)
    width = panel_size[0] * ncols + legend_width
    height = panel_size[1] * nrows + 0.6
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False)
    axes_width = (width - legend_width - _LEFT - _RIGHT - (ncols - 1) * _GAP_WIDTH) / ncols
    axes_height = (height - _TOP - _BOTTOM - (nrows - 1) * _GAP_HEIGHT) / nrows
    fig.subplots_adjust(left=_LEFT / width, right=1 - (_RIGHT + legend_width) / width,
                        bottom=(_BOTTOM + 0.75) / height, top=1 - _TOP / height,
                        wspace=_GAP_WIDTH / axes_width, hspace=_GAP_HEIGHT / axes_height)
    flat = list(axes.flat)
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    return fig, flat[:n_panels]


def series_colors(count: int) -> list:
    """``count`` distinct line colours: matplotlib's ten, or tab20's twenty beyond ten series."""
    if count <= 10:
        return [f"C{i}" for i in range(count)]
    cmap = plt.get_cmap("tab20")
    return [cmap(i % 20) for i in range(count)]


def legend_width(labels: Sequence[str], minimum: float = 1.6) -> float:
    """Inches to keep free on the right for a shared legend of ``labels`` (``subplot_grid``)."""
    return max(minimum, 0.7 + 0.065 * max((len(label) for label in labels), default=0))


def finish(fig: Figure, title: str, shared_legend: Optional[Sequence[Axes]] = None) -> Figure:
    """The title; ``shared_legend``: axes drawing the same series, one legend to their right (``legend_width``)."""
    for ax in fig.axes:  # a line drawn exactly over another hides it: drawn once, named "a = b"
        merge_hidden_lines(ax)
    make_headroom(fig)
    fig.suptitle(title, fontsize=13, y=1 - 0.2 / fig.get_figheight(), va="top")
    if shared_legend:
        entries: dict = {}
        for ax in shared_legend:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                entries.setdefault(label, handle)
        right = max(ax.get_position().x1 for ax in shared_legend)
        if not entries:  # panels drawn as heatmaps name their rows themselves
            return fig
        fig.legend(list(entries.values()), list(entries), loc="upper left",
                   fontsize=_LEGEND_FONT, bbox_to_anchor=(right + 0.1 / fig.get_figwidth(),
                                                          1 - _TOP / fig.get_figheight()))
    return fig


def log_scale(ax, axis: str = "y", linthresh: Optional[float] = None) -> None:
    """Log scale (symlog from ``linthresh``), major ticks only (minor ones cost most of a log axis)."""
    set_scale, target = (ax.set_yscale, ax.yaxis) if axis == "y" else (ax.set_xscale, ax.xaxis)
    if linthresh is None:
        set_scale("log")
        low, high = ax.get_ylim() if axis == "y" else ax.get_xlim()
        if 0 < low < high and math.floor(math.log10(high)) - math.ceil(math.log10(low)) < 1:
            # fewer than two powers of ten in view, so at most one labelled tick: show the enclosing decades
            (ax.set_ylim if axis == "y" else ax.set_xlim)(10 ** math.floor(math.log10(low)),
                                                          10 ** math.ceil(math.log10(high)))
    else:
        set_scale("symlog", linthresh=linthresh)
    target.set_minor_locator(NullLocator())


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
    if len(series) > MAX_SERIES:
        densities = [np.histogram(values, bins=edges, density=density)[0] for values in series.values()]
        sizes = {values.size for values in series.values()}
        rows = list(series) if len(sizes) == 1 else [f"{label} (n={v.size:,})" for label, v in series.items()]
        label_heatmap(ax, rows, [f"{edge:.3g}" for edge in edges[:-1]], np.array(densities),
                      f"{title} (n={sizes.pop():,} each)" if len(sizes) == 1 else title,
                      DENSITY_LABEL if density else "count", log=True, written=False)
        ax.set_xlabel(f"{xlabel} (bin start)")
        return
    heights = []
    for label, values in series.items():
        counts, _, _ = ax.hist(values, bins=edges, density=density, histtype="step",
                               linewidth=1.4, label=f"{label} (n={values.size:,})")
        heights.extend(counts)
    if spans_decades(heights):
        log_scale(ax)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=VALUE_TICKS))  # small values' labels are long ("-0.0075")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(DENSITY_LABEL if density else "count (sampled values)")
    legend_above(ax)
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
    if one_value(ax, np.concatenate(list(series.values())), ylabel):
        return
    if log is None:
        log = all((v > 0).all() for v in series.values()) and spans_decades(
            np.concatenate(list(series.values())))
    if len(series) > _UPRIGHT_BOXES:  # too many names to write under the boxes: boxes lie down, named on the left
        boxed = {label: v for label, v in series.items() if _boxable(v)}
        if boxed:
            ax.boxplot(list(boxed.values()), positions=[i + 1 for i, label in enumerate(series) if label in boxed],
                       whis=(1, 99), showfliers=False, orientation="horizontal")
        for i, (label, v) in enumerate(series.items()):
            if label not in boxed:  # a few values, or one repeated: the values themselves
                ax.plot(v, np.full(v.size, i + 1.0), "|", markersize=8, markeredgewidth=1.5, color="C0")
        fontsize = row_fontsize(ax, len(series))
        ax.set_yticks(range(1, len(series) + 1), list(series), fontsize=fontsize)
        ax.set_ylim(len(series) + 0.5, 0.5)
        room_for_row_names(ax, list(series), fontsize)
        if log:
            log_scale(ax, "x")
        ax.set_xlabel(ylabel + (" (log scale)" if log else ""))
        ax.grid(alpha=0.3, axis="x")
        return
    boxed = {label: v for label, v in series.items() if _boxable(v)}
    if boxed:
        positions = [i + 1 for i, label in enumerate(series) if label in boxed]
        ax.boxplot(list(boxed.values()), positions=positions, whis=(1, 99), showfliers=False)
    for i, (label, v) in enumerate(series.items()):
        if label not in boxed:  # a box of a few values, or of one repeated value, hides them: the values
            ax.plot(np.full(v.size, i + 1.0), v, "_", markersize=12, markeredgewidth=1.5, color="C0")
    ax.set_xticks(range(1, len(series) + 1), list(series), rotation=30, ha="right", fontsize=8)
    ax.set_xlim(0.5, len(series) + 0.5)
    if log:
        log_scale(ax)
    ax.set_ylabel(ylabel + (" (log scale)" if log else ""))
    ax.grid(alpha=0.3, axis="y")


def _boxable(values: np.ndarray) -> bool:
    """Whether a box says more than the values: at least ``_MIN_BOX`` of them, and quartiles apart."""
    return values.size >= _MIN_BOX and bool(np.subtract(*np.percentile(values, [75, 25])))


def qq_normal(ax, series: Mapping[str, np.ndarray], title: str) -> None:
    """Quantiles of the standardised values against a standard normal's."""
    probabilities = np.linspace(0.001, 0.999, 199)
    theoretical = np.array([_STANDARD_NORMAL.inv_cdf(p) for p in probabilities])
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
    legend_above(ax)
    ax.grid(alpha=0.3)


def grouped_bars(ax, categories: Sequence[str], groups: Mapping[str, Sequence[float]],
                 title: str, ylabel: str, log: Optional[bool] = None) -> None:
    """One bar per (category, group); NaN bars are left out. Beyond ``MAX_SERIES`` groups: a
    heatmap (categories x groups) with the values written in. A group that is zero everywhere is named
    in the title, not drawn: zero bars look like missing data."""
    zero = [label for label, heights in groups.items() if not np.nan_to_num(np.asarray(heights, dtype=float)).any()]
    if zero and len(zero) < len(groups):
        groups = {label: heights for label, heights in groups.items() if label not in zero}
        title = f"{title}\n({', '.join(zero)}: 0 everywhere)"
    ax.set_title(title, fontsize=10)
    values = [v for vs in groups.values() for v in vs if np.isfinite(v)]
    if not categories or not values:
        no_data(ax, "no data")
        return
    if one_value(ax, values, ylabel):
        return
    if len(groups) > MAX_SERIES:
        label_heatmap(ax, list(categories), list(groups), np.array(list(groups.values()), dtype=float).T,
                      title, ylabel, log=log if log is not None else spans_decades(values))
        return
    width = 0.8 / max(1, len(groups))
    positions = np.arange(len(categories))
    for i, (label, heights) in enumerate(groups.items()):
        heights = np.asarray(heights, dtype=float)
        heights = np.where(np.isfinite(heights), heights, np.nan)  # e.g. infinite SQNR
        ax.bar(positions + (i - (len(groups) - 1) / 2) * width, heights, width, label=label)
    ax.set_xticks(positions, list(categories), rotation=30, ha="right", fontsize=8)
    if log if log is not None else spans_decades(values):
        log_scale(ax)
    ax.set_ylabel(ylabel)
    if len(groups) > 1 or zero:  # one group left of several: its name still says what the bars are
        legend_above(ax)
    ax.grid(alpha=0.3, axis="y")


def line_panel(ax, series: Mapping[str, tuple[Sequence[float], Sequence[float]]], title: str,
               xlabel: str, ylabel: str, log: Optional[bool] = None, legend: bool = True) -> None:
    """One line with markers per label, (x, y) each; log y when the values span decades. Beyond
    ``MAX_SERIES`` labels: a heatmap (label x x-value) with the values written in."""
    ax.set_title(title, fontsize=10)
    values = [v for _, ys in series.values() for v in ys if np.isfinite(v)]
    if not values:
        no_data(ax, "no data")
        return
    if one_value(ax, values, ylabel):
        return
    log = log if log is not None else (min(values) > 0 and spans_decades(values))
    if len(series) > MAX_SERIES:
        columns = sorted({x for xs, _ in series.values() for x in xs})
        cells = np.full((len(series), len(columns)), np.nan)
        for row, (xs, ys) in enumerate(series.values()):
            for x, y in zip(xs, ys):
                cells[row, columns.index(x)] = y
        label_heatmap(ax, list(series), [f"{x:g}" for x in columns], cells, title, ylabel, log=bool(log))
        ax.set_xlabel(xlabel)
        return
    for i, (label, (xs, ys)) in enumerate(series.items()):
        ax.plot(xs, ys, marker="os^D"[i % 4], markersize=3, linewidth=1.2, label=label, color=f"C{i}")
    if log:
        log_scale(ax)
    merge_hidden_lines(ax)
    if all(float(x).is_integer() for xs, _ in series.values() for x in xs):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers, iterations
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if legend:
        legend_above(ax)
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
    """Several log2 histograms on one axis, zoomed to the occupied binades; beyond
    ``MAX_SERIES`` a heatmap (histogram x binade)."""
    ax.set_title(title, fontsize=10)
    histograms = {label: entry for label, entry in histograms.items() if np.any(entry[1])}
    if len(histograms) > MAX_SERIES:
        low = min(start for start, _ in histograms.values())
        high = max(start + len(counts) for start, counts in histograms.values())
        cells = np.zeros((len(histograms), high - low))
        for row, (start, counts) in enumerate(histograms.values()):
            counts = np.asarray(counts, dtype=float)
            cells[row, start - low:start - low + counts.size] = 100 * counts / counts.sum()
        used = np.flatnonzero(cells.any(axis=0))
        cells = cells[:, used[0]:used[-1] + 1]
        label_heatmap(ax, list(histograms), list(range(low + used[0], low + used[-1] + 1)), cells, title,
                      "% of nonzero values", log=True, written=False)
        ax.set_xlabel(xlabel)
        return
    ranges = [log2_histogram(ax, start, counts, label)
              for label, (start, counts) in histograms.items() if np.any(counts)]
    if not ranges:
        no_data(ax, "only zeros")
        return
    ax.set_xlim(min(r[0] for r in ranges) - 1, max(r[1] for r in ranges) + 1)
    log_scale(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("% of nonzero values (log scale)")
    legend_above(ax)
    ax.grid(alpha=0.3)


def scatter_against_diagonal(ax, x: np.ndarray, y: np.ndarray, title: str, xlabel: str, ylabel: str,
                             diagonal_label: str, point_label: Optional[str] = None) -> None:
    """y against x element by element, with the y = x line equal values lie on, in the panel's ``decade``."""
    unit, suffix = decade(np.concatenate([x, y]))
    ax.plot(x / unit, y / unit, ".", markersize=2, alpha=0.5, label=point_label)
    finite = np.abs(np.concatenate([x, y])) / unit
    limit = float(np.nanmax(finite)) if finite.size else 1.0
    ax.plot([-limit, limit], [-limit, limit], "k--", linewidth=1, label=diagonal_label)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel + suffix)
    ax.set_ylabel(ylabel + suffix)
    legend_above(ax)
    ax.grid(alpha=0.3)


def draw_log2_panels(payload: dict) -> Figure:
    """A figure of log2 histogram panels: {"title": str, "panels": [{"title", "histograms"}]},
    optionally "xlabel" (default log2|x|)."""
    panels = payload["panels"]
    fig, axes = subplot_grid(len(panels), ncols=2, panel_size=(6.4, 4.6))
    for ax, panel in zip(axes, panels):
        log2_panel(ax, panel["histograms"], panel["title"], payload.get("xlabel", "log2|x| (binade)"))
    return finish(fig, payload["title"])


def box_panel_size(boxes: int, size: tuple[float, float]) -> tuple[float, float]:
    """A box-plot panel's size: ``size``, or, when its boxes lie down (``box_plot``), tall enough
    for a readable name per box."""
    if boxes <= _UPRIGHT_BOXES:
        return size
    return min(max(size[0], 6.5), 9.0), max(size[1], 1.9 + 0.15 * boxes)


def draw_box_plot_panels(payload: dict) -> Figure:
    """A figure of box-plot panels: {"title", "ncols", "panel_size",
    "panels": [{"title", "ylabel", "log", "series"}]}."""
    panels, size = payload["panels"], payload["panel_size"]
    boxes = max(len(panel["series"]) for panel in panels)
    fig, axes = subplot_grid(len(panels), ncols=payload["ncols"], panel_size=box_panel_size(boxes, size))
    for ax, panel in zip(axes, panels):
        box_plot(ax, panel["series"], panel["title"], panel["ylabel"], log=panel["log"])
    return finish(fig, payload["title"])


def draw_histogram_panels(payload: dict) -> Figure:
    """A figure of value-histogram panels: {"title": str, "panels": [{"title", "series"}]}."""
    panels = payload["panels"]
    fig, axes = subplot_grid(len(panels), ncols=3)
    for ax, panel in zip(axes, panels):
        value_histograms(ax, panel["series"], panel["title"])
    return finish(fig, payload["title"])
