"""Panel layouts that keep a figure within its budget (``figure_budget``): legends that cover no
data, and heatmaps with their values written in for panels with more series than lines can keep
apart."""
from __future__ import annotations

import math
import textwrap
import weakref
from typing import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm

from megatron.quant.analysis.figure_budget import HIDDEN_PT, MIN_TEXT_PT, PAGE_WIDTH_IN

_BAR = 0.85  # inches: a colour bar, its tick labels and its label
_DIGIT_IN = 0.07  # inches: a character of an 8-pt number
_HEADROOM: "weakref.WeakKeyDictionary[Axes, float]" = weakref.WeakKeyDictionary()  # inches above a panel
VALUE_TICKS = 5  # ticks at most on a linear axis of values: "-0.0075" and its like fit a third of the page


def decade(values: np.ndarray) -> tuple[float, str]:
    """The power of ten of the largest finite |value| and the axis-label suffix naming it ("" for 1): values
    divided by it keep short tick labels, and panels of tensors decades apart name their scales apart."""
    finite = np.abs(values[np.isfinite(values)])
    top = float(finite.max()) if finite.size else 0.0
    exponent = math.floor(math.log10(top)) if top > 0 else 0
    return 10.0 ** exponent, f" (x 1e{exponent})" if exponent else ""


def legend_above(ax: Axes, fontsize: int = 7) -> None:
    """The panel's legend in rows between its title and its plot area, so that it never covers
    data (as many entries a row as the panel's width holds; the title moves up to make room)."""
    handles, labels = ax.get_legend_handles_labels()
    if not labels:
        return
    width = ax.get_position().width * ax.figure.get_figwidth()
    fits = max(8, int((width - 0.35) / (0.6 * fontsize / 72)))  # characters a row holds beside the handle
    labels = [textwrap.fill(label, fits) for label in labels]  # a long label takes two lines, not the margin
    entry = 0.35 + 0.6 * fontsize / 72 * max(len(line) for label in labels for line in label.splitlines())
    ncols = max(1, min(len(labels), 4, int(width // entry)))
    rows = sum(max(label.count("\n") + 1 for label in labels[i:i + ncols]) for i in range(0, len(labels), ncols))
    ax.legend(handles, labels, loc="lower left", bbox_to_anchor=(0, 1.0), ncols=ncols, fontsize=fontsize,
              frameon=False, borderaxespad=0.2, handlelength=1.5, columnspacing=1.0)
    pad = 8 + rows * 1.75 * fontsize  # points
    ax.set_title(ax.get_title(), fontsize=ax.title.get_fontsize(), pad=pad)
    _HEADROOM[ax] = pad / 72


def make_headroom(fig) -> None:
    """Grow the figure at the top by what the top row's legends above their panels need, every
    panel keeping its size and its place from the bottom (so the figure title stays clear)."""
    top = max((ax.get_position().y1 for ax in fig.axes), default=1.0)
    extra = max((inches for ax, inches in _HEADROOM.items()
                 if ax.figure is fig and ax.get_position().y1 >= top - 1e-6), default=0.0)
    if not extra:
        return
    height = fig.get_figheight()
    scale = height / (height + extra)
    for ax in fig.axes:
        if ax.get_axes_locator() is None:  # inset axes (colour bars) follow their panel
            x0, y0, width, tall = ax.get_position().bounds
            ax.set_position([x0, y0 * scale, width, tall * scale])
    fig.set_figheight(height + extra)


def colour_bar(ax: Axes, image, label: str, narrow: bool = True) -> None:
    """A colour bar beside ``ax`` inside its cell of the grid (the panel narrows by ``_BAR``
    inches unless the caller made room), so that its tick labels and label stay on the figure."""
    if narrow:
        box = ax.get_position()
        ax.set_position([box.x0, box.y0, box.width - _BAR / ax.figure.get_figwidth(), box.height])
    bar = ax.figure.colorbar(image, cax=ax.inset_axes([1.03, 0.0, 0.04, 1.0]))
    bar.set_label(label, fontsize=8)
    bar.ax.tick_params(labelsize=8)


def readable_pt(fig, size: float = MIN_TEXT_PT) -> float:
    """Points for text written in a panel of ``fig`` that read at ``size`` or more once the figure
    is shrunk to the report page's width (the figure budget's floor for in-panel text)."""
    return max(size, MIN_TEXT_PT * fig.get_figwidth() / PAGE_WIDTH_IN)


def row_fontsize(ax: Axes, rows: int) -> float:
    """Points for ``rows`` names down the panel's height: 8 when they fit, down to 5."""
    height = ax.get_position().height * ax.figure.get_figheight() * 72
    return max(5.0, min(8.0, height / max(1, rows) / 1.3))


def room_for_row_names(ax: Axes, names: Sequence[object], fontsize: float, right: float = 0.0) -> None:
    """Row names need more room on the left than a panel's y label: narrow the panel (inside its
    cell of the grid) instead of letting them run into the next panel or off the figure;
    ``right`` inches are freed on the right too."""
    needed = 0.6 * fontsize / 72 * max((len(str(name)) for name in names), default=0)
    box = ax.get_position()
    figure_width = ax.figure.get_figwidth()
    shift = max(0.0, needed - 0.7) / figure_width
    width = max(box.width - shift - right / figure_width, 0.1 * box.width)
    ax.set_position([box.x0 + shift, box.y0, width, box.height])


def label_heatmap(ax: Axes, rows: Sequence[str], columns: Sequence[object], values: np.ndarray,
                  title: str, colorbar_label: str, log: bool = False, written: bool = True,
                  fmt: str = "{:.3g}") -> None:
    """``values`` (rows x columns) as coloured cells, each with its value written in when
    ``written`` (NaN cells blank): how a panel shows more series than lines can keep apart."""
    values = np.asarray(values, dtype=float)
    finite = values[np.isfinite(values)]
    positive = finite[finite > 0]
    norm = (LogNorm(positive.min(), positive.max())
            if log and positive.size and positive.min() < positive.max() else None)
    shown = np.where(values > 0, values, np.nan) if norm is not None else values
    image = ax.imshow(np.ma.masked_invalid(shown), aspect="auto", cmap="viridis", norm=norm,
                      interpolation="nearest")
    ax.set_title(title, fontsize=10)
    fontsize = row_fontsize(ax, len(rows))
    ax.set_yticks(range(len(rows)), list(rows), fontsize=fontsize)
    figure_width = ax.figure.get_figwidth()
    room_for_row_names(ax, rows, fontsize, right=_BAR)  # and the colour bar with its labels
    width = ax.get_position().width * figure_width
    level = int(width / (0.09 * max(len(str(c)) for c in columns) + 0.15))  # level labels that fit
    upright = level >= len(columns)
    step = 1 if upright else max(1, math.ceil(len(columns) / int(width / 0.2)))  # else rotated ones
    ax.set_xticks(range(0, len(columns), step), [str(c) for c in list(columns)[::step]], fontsize=8,
                  rotation=0 if upright else 30, ha="center" if upright else "right")
    texts = {(i, j): fmt.format(value) for (i, j), value in np.ndenumerate(values) if np.isfinite(value)}
    cell_width, cell_height = width / len(columns), ax.get_position().height * ax.figure.get_figheight() / len(rows)
    points = readable_pt(ax.figure)
    fits = texts and (cell_width >= _DIGIT_IN * points / 8 * max(map(len, texts.values())) + 0.05
                      and cell_height >= 0.02 * points)
    if written and fits:  # values written in only where they read at 8 pt on the page (the figure budget's floor)
        for (i, j), text in texts.items():
            dark = np.isfinite(shown[i, j]) and image.norm(values[i, j]) < 0.5  # viridis is dark below
            ax.text(j, i, text, ha="center", va="center", fontsize=points, color="white" if dark else "black")
    colour_bar(ax, image, colorbar_label, narrow=False)


def one_value(ax: Axes, values: Sequence[float], what: str) -> bool:
    """When every one of ``values`` is the same (or there is one), say so in the panel, unframed,
    instead of drawing it (an all-zero overflow panel carries one number); True when it did."""
    finite = [v for v in values if np.isfinite(v)]
    if not finite or min(finite) != max(finite):
        return False
    said = (f"{what}: {finite[0]:.4g}, a single value" if len(finite) == 1
            else f"{what}: all {len(finite)} values are {finite[0]:.4g},\nnothing to compare")
    ax.text(0.5, 0.5, said, ha="center", va="center", transform=ax.transAxes, fontsize=readable_pt(ax.figure, 9),
            wrap=True)
    ax.set_axis_off()
    return True


def honest_limits(ax: Axes, values: Sequence[float], axis: str = "y", share: float = 0.1) -> None:
    """A linear axis over ``values`` that spans at least ``share`` of their magnitude (``figure_budget``'s
    ``MIN_RELATIVE_SPAN`` is the floor): a change in the 4th digit stays a flat line, not a trend."""
    finite = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if not finite.size:
        return
    low, high = float(finite.min()), float(finite.max())
    magnitude = max(abs(low), abs(high))
    if magnitude == 0 or high - low >= share * magnitude:
        return
    middle, half = (low + high) / 2, share * magnitude / 2
    (ax.set_ylim if axis == "y" else ax.set_xlim)(middle - half, middle + half)


def merge_hidden_lines(ax) -> None:
    """Draw once, labelled "a = b", the labelled lines of ``ax`` that would lie on top of an earlier one
    (every point within the figure budget's ``_HIDDEN_PT``, doubled, as laid out now): no line hides another."""
    ax.autoscale_view()
    tolerance = 2 * HIDDEN_PT * ax.figure.dpi / 72
    kept: list = []
    merged = False
    for line in [line for line in ax.lines if not line.get_label().startswith("_")
                 and line.get_transform() == ax.transData and len(line.get_xydata())]:
        pixels = ax.transData.transform(np.asarray(line.get_xydata(), dtype=float))
        for other, other_pixels in kept:
            if pixels.shape == other_pixels.shape and np.nanmax(np.abs(pixels - other_pixels)) < tolerance:
                other.set_label(f"{other.get_label()} = {_unshared(line.get_label(), other.get_label())}")
                line.remove()
                merged = True
                break
        else:
            kept.append((line, pixels))
    if merged and ax.get_legend() is not None:  # the panel's own legend names the merged lines
        legend_above(ax)


def _unshared(label: str, first: str) -> str:
    """``label`` without the leading words it shares with ``first`` ("fc1 pre input" after "fc1 pre
    weight" is "input"), so that merged labels stay short."""
    words, others = label.split(), first.split()
    shared = next((i for i, (a, b) in enumerate(zip(words, others)) if a != b), min(len(words), len(others)))
    return " ".join(words[shared:]) or label
