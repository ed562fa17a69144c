"""The figure budget: what a reader must be able to see in every figure the package draws.

Checked after layout, on the renderer's extents: legends, tick labels, axis labels, titles and
colour bars lie inside the figure; tick labels of one axis do not overlap each other; a legend
covers no title, axis or tick label, no other legend, no axes of another panel and no data
point of its own panel; no panel draws more series than a reader can tell apart (``MAX_SERIES``: beyond that a
figure becomes small multiples, a heatmap with its values written in, or a table).

And what the data let a reader see: no panel draws a single point or constant data (one sentence
says that instead); no linear axis zooms into a range far narrower than the magnitude of its
values (``MIN_RELATIVE_SPAN``: differences in the 4th digit look like trends); panels that show the
same quantity (the same axis label, the same scale) are drawn on comparable scales
(``MAX_SCALE_RATIO``: separate scales hide a difference of magnitude between them); bars are not all of
one height; a panel of several series is not all flat lines of two points (``FLAT_SHARE``: the x axis
then carries nothing, a table or bars say it); no legend series lies under another (``HIDDEN_PT``); text written
in a panel (heatmap cells, notes) reads at ``MIN_TEXT_PT`` or more once the figure is shrunk to the
report page's width (``PAGE_WIDTH_IN``); a share of elements (``SHARES``) is drawn in %, as in every
other figure of the package, never as a fraction.
"""
from __future__ import annotations

import math

import numpy as np
from matplotlib import cbook
from matplotlib.axes import Axes
from matplotlib.collections import PathCollection
from matplotlib.colors import to_hex
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.text import Text
from matplotlib.transforms import Bbox

MAX_SERIES = 8
MIN_RELATIVE_SPAN = 0.01  # an axis spans at least 1 % of the magnitude of its values
MAX_SCALE_RATIO = 10.0    # panels of one quantity: their axis spans within a factor of 10
FLAT_SHARE = 0.02        # a series varying under 2 % of its panel's y span is a flat line
MIN_TEXT_PT = 8.0        # in-panel text, in points at the page's width
PAGE_WIDTH_IN = 12.0     # the report page's column (1,250 px) at the default 100 dpi
SHARES = ("overflow", "underflow", "zeros")  # quantities counted in % of elements in every figure
_FLAT_POINTS = 2         # series of this many points at most are judged flat
HIDDEN_PT = 1.0         # a series whose every point is this close to another's (points) is hidden under it
_SLACK = 1.0  # pixels: extents touching at a rounded pixel are not an overlap


def problems(fig: Figure) -> list[str]:
    """Every way ``fig`` breaks the budget, one line each; empty when it keeps it. ``fig`` must
    have been drawn (saved) at its own dpi: the check reads that layout."""
    renderer = fig.canvas.get_renderer()
    frame = fig.bbox.padded(_SLACK)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    legends = [(_name(ax), legend) for ax in axes if (legend := ax.get_legend()) is not None]
    legends += [("figure", legend) for legend in fig.legends]
    found = []
    for ax in axes:
        name = _name(ax)
        for text in _texts(ax):
            if not _inside(text.get_window_extent(renderer), frame):
                found.append(f"{name}: text {text.get_text()!r} runs off the figure")
        for axis, labels in (("x", _tick_labels(ax.xaxis)), ("y", _tick_labels(ax.yaxis))):
            clash = _first_overlap(labels, renderer)
            if clash:
                found.append(f"{name}: {axis} tick labels {clash[0]!r} and {clash[1]!r} overlap "
                             f"({len(labels)} labels)")
        found += _data_problems(ax, name)
        found += _hidden_series(ax, name)
        found += _small_text(ax, name, fig.get_figwidth())
        found += _unit_problems(ax, name)
        series = _series_count(ax)
        if series > MAX_SERIES:
            found.append(f"{name}: {series} series in one panel (at most {MAX_SERIES} can be told "
                         "apart: small multiples, a heatmap or a table instead)")
    for where, legend in legends:
        box = legend.get_window_extent(renderer)
        if not _inside(box, frame):
            found.append(f"{where}: legend runs off the figure")
        for ax in axes:
            if legend.axes is not ax and _overlap(box, ax.bbox):
                found.append(f"{where}: legend covers the panel {_name(ax)}")
            labels = [t for t in _texts(ax) if _overlap(box, t.get_window_extent(renderer))]
            if labels:
                found.append(f"{where}: legend covers {labels[0].get_text()!r} of {_name(ax)}")
        if legend.axes is not None and _covers_data(legend.axes, box):
            found.append(f"{where}: legend covers data points")
    title = [t for t in fig.texts if t.get_text() == fig.get_suptitle()] if fig.get_suptitle() else []
    for text in title:  # the figure title: clear of every panel's title and legend
        box = text.get_window_extent(renderer)
        if not _inside(box, frame):
            found.append("the figure title runs off the figure")
        covered = [_name(ax) for ax in axes if _overlap(box, ax.title.get_window_extent(renderer))]
        covered += [where for where, legend in legends if _overlap(box, legend.get_window_extent(renderer))]
        if covered:
            found.append(f"the figure title overlaps {covered[0]}")
    for i, (where, legend) in enumerate(legends):
        for other_where, other in legends[i + 1:]:
            if _overlap(legend.get_window_extent(renderer), other.get_window_extent(renderer)):
                found.append(f"legends of {where} and {other_where} overlap")
    found += _scale_problems(axes)
    return list(dict.fromkeys(found))


def _data_points(ax: Axes) -> np.ndarray:
    """The (x, y) data points of a panel's lines, markers and bars in data coordinates (reference
    lines such as ``axhline`` live in mixed coordinates and do not count); bars by their top (or
    right, lying) edge and their extent."""
    parts = [line.get_xydata() for line in ax.lines if line.get_transform() == ax.transData]
    parts += [collection.get_offsets() for collection in ax.collections
              if isinstance(collection, PathCollection) and collection.get_offset_transform() == ax.transData]
    bars = [patch for patch in ax.patches if isinstance(patch, Rectangle) and patch.get_transform().contains_branch(
        ax.transData)]
    parts += [[(bar.get_x() + bar.get_width(), bar.get_y() + bar.get_height()) for bar in bars]]
    points = np.concatenate([np.asarray(part, dtype=float).reshape(-1, 2) for part in parts]) if parts else \
        np.empty((0, 2))
    return points[np.isfinite(points).all(axis=1)]


def _data_problems(ax: Axes, name: str) -> list[str]:
    """A panel that shows nothing (a single point, constant data), or an axis zoomed into a range
    far narrower than its values' magnitude. Panels drawing images (heatmaps) are not judged."""
    if ax.images or not ax.axison:
        return []
    points = _data_points(ax)
    if not len(points):
        return []
    distinct = np.unique(points, axis=0)
    if len(distinct) == 1:
        return [f"{name}: a single data point (a sentence says it better)"]
    found = []
    bars = {(bar.get_width(), bar.get_height()) for bar in ax.patches if isinstance(bar, Rectangle)
            and bar.get_transform().contains_branch(ax.transData)}
    if np.ptp(points[:, 1]) == 0 and not bars:
        found.append(f"{name}: its data are constant (y = {points[0, 1]:.4g}; a sentence says it better)")
    if len(bars) == 1 and not any(np.ptp(line.get_xydata()[:, 1]) for line in _series(ax)):
        found.append(f"{name}: its bars are all of one height (zero bars look like missing data; a sentence says it)")
    zero = [bars.get_label() for bars in ax.containers if isinstance(bars, BarContainer)
            and not bars.get_label().startswith("_") and not any(bar.get_height() for bar in bars)]
    if zero:
        found.append(f"{name}: the series {zero[0]!r} is zero everywhere (zero bars look like missing data; "
                     "say it in a title)")
    found += _flat_series(ax, name)
    for axis, (low, high) in (("x", ax.get_xlim()), ("y", ax.get_ylim())):
        scale = ax.get_xscale() if axis == "x" else ax.get_yscale()
        magnitude = max(abs(low), abs(high))
        if scale == "linear" and magnitude > 0 and abs(high - low) < MIN_RELATIVE_SPAN * magnitude:
            found.append(f"{name}: the {axis} axis spans {abs(high - low):.3g} of values about {magnitude:.4g} "
                         f"(under {MIN_RELATIVE_SPAN:.0%}: differences look larger than they are)")
    return found


def _series(ax: Axes) -> list[Line2D]:
    """The lines of a panel drawn in data coordinates, with at least one finite point."""
    return [line for line in ax.lines if line.get_transform() == ax.transData and line.get_visible()
            and np.isfinite(np.asarray(line.get_xydata(), dtype=float)).all(axis=1).any()]


def _flat_series(ax: Axes, name: str) -> list[str]:
    """Several legend series, each a flat line of two points: the x axis carries nothing (a series of
    more points that stays flat is a finding: stable over training)."""
    lines = [line for line in _series(ax) if not line.get_label().startswith("_") and len(line.get_xydata()) >= 2
             and np.ptp(line.get_xydata()[:, 0])]
    span = abs(np.subtract(*ax.get_ylim()))
    if len(lines) < 2 or any(len(line.get_xydata()) > _FLAT_POINTS for line in lines) \
            or ax.get_yscale() != "linear" or not span:
        return []
    if all(np.ptp(np.asarray(line.get_xydata(), dtype=float)[:, 1]) < FLAT_SHARE * span for line in lines):
        return [f"{name}: its {len(lines)} series are all flat along x (under {FLAT_SHARE:.0%} of the y span: "
                "one value per series, in bars or a table, says it)"]
    return []


def _hidden_series(ax: Axes, name: str) -> list[str]:
    """Legend series whose every point lies within ``HIDDEN_PT`` of another series' points."""
    lines = [line for line in _series(ax) if not line.get_label().startswith("_")]
    pixels = [line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float)) for line in lines]
    hidden_px = HIDDEN_PT * ax.figure.dpi / 72
    found = []
    for i, (line, points) in enumerate(zip(lines, pixels)):
        for other, other_points in zip(lines[:i], pixels[:i]):
            if points.shape == other_points.shape and np.nanmax(np.abs(points - other_points)) < hidden_px:
                found.append(f"{name}: series {line.get_label()!r} is hidden under {other.get_label()!r} "
                             "(say they coincide, or draw them apart)")
                break
    return found


def _small_text(ax: Axes, name: str, figure_width: float) -> list[str]:
    """Text written in a panel that reads under ``MIN_TEXT_PT`` once the figure fits the page."""
    shrink = min(1.0, PAGE_WIDTH_IN / figure_width)
    small = [text for text in ax.texts if text.get_visible() and text.get_text().strip()
             and text.get_fontsize() * shrink < MIN_TEXT_PT - 0.05]
    if not small:
        return []
    return [f"{name}: text {small[0].get_text()!r} written in the panel reads at "
            f"{small[0].get_fontsize() * shrink:.1f} pt at the page's width (at least {MIN_TEXT_PT:g})"]


def _unit_problems(ax: Axes, name: str) -> list[str]:
    """An axis label naming a share of elements without the package's unit for it, %."""
    labels = [label for label in (ax.get_xlabel(), ax.get_ylabel()) if label]
    return [f"{name}: {label!r} is a share of elements drawn without % (every other figure uses %)"
            for label in labels if any(share in label.lower() for share in SHARES) and "%" not in label]


def _scale_problems(axes: list[Axes]) -> list[str]:
    """Panels showing the same quantity (same label and scale on an axis, not shared) whose spans
    differ by more than ``MAX_SCALE_RATIO``."""
    found = []
    for axis in ("x", "y"):
        groups: dict[tuple[str, str], list[Axes]] = {}
        for ax in axes:
            label = (ax.get_xlabel() if axis == "x" else ax.get_ylabel())
            scale = ax.get_xscale() if axis == "x" else ax.get_yscale()
            if label and scale == "linear" and ax.axison and not ax.images and len(_data_points(ax)):
                groups.setdefault((label, scale), []).append(ax)
        for (label, _), members in groups.items():
            spans = {ax: abs(np.subtract(*(ax.get_xlim() if axis == "x" else ax.get_ylim()))) for ax in members}
            widest, narrowest = max(spans, key=spans.get), min(spans, key=spans.get)
            if spans[narrowest] > 0 and spans[widest] > MAX_SCALE_RATIO * spans[narrowest]:
                found.append(f"{_name(widest)} and {_name(narrowest)}: the same {axis} quantity {label!r} on scales "
                             f"{spans[widest] / spans[narrowest]:.0f}x apart (share the axis)")
    return found


def _name(ax: Axes) -> str:
    title = ax.get_title() or ax.get_ylabel() or "untitled"
    return f"panel {title[:50]!r}"


def _texts(ax: Axes) -> list[Text]:
    """The texts of a panel that carry information: titles, axis labels, visible tick labels."""
    texts = [ax.title, ax.xaxis.label, ax.yaxis.label, *_tick_labels(ax.xaxis), *_tick_labels(ax.yaxis)]
    return [t for t in texts if t.get_visible() and t.get_text()]


def _tick_labels(axis) -> list[Text]:
    """Visible, non-empty major tick labels of the ticks in view, in tick order (what the reader
    sees of an axis; matplotlib keeps the labels of ticks outside the view, undrawn)."""
    ax = axis.axes
    locations = axis.get_majorticklocs()
    if not len(locations):
        return []
    if axis is ax.xaxis:
        where = ax.get_xaxis_transform().transform([(loc, 0) for loc in locations])[:, 0]
        low, high = ax.bbox.x0, ax.bbox.x1
    else:
        where = ax.get_yaxis_transform().transform([(0, loc) for loc in locations])[:, 1]
        low, high = ax.bbox.y0, ax.bbox.y1
    ticks = axis.get_major_ticks(len(locations))
    return [label for tick, at in zip(ticks, where) if low - _SLACK <= at <= high + _SLACK
            for label in (tick.label1, tick.label2) if label.get_visible() and label.get_text()]


def _first_overlap(labels: list[Text], renderer) -> tuple[str, str] | None:
    """The first two neighbouring labels (on the same side) whose (rotated) text boxes overlap."""
    boxes = [_rotated_box(label, renderer) for label in labels]
    for (a, box_a), (b, box_b) in zip(zip(labels, boxes), zip(labels[1:], boxes[1:])):
        if _boxes_overlap(box_a, box_b):
            return a.get_text(), b.get_text()
    return None


def _rotated_box(text: Text, renderer) -> tuple[np.ndarray, float, float, float]:
    """(centre, rotation in radians, width, height) of a text's rotated rectangle in pixels: the
    centre of its axis-aligned extent is the rectangle's centre."""
    extent = text.get_window_extent(renderer)
    content = text.get_text()
    width, height, _ = renderer.get_text_width_height_descent(
        content, text.get_fontproperties(), ismath=cbook.is_math_text(content))
    centre = np.array([(extent.x0 + extent.x1) / 2, (extent.y0 + extent.y1) / 2])
    return centre, math.radians(text.get_rotation()), width, height


def _boxes_overlap(a, b) -> bool:
    """Two rectangles of the same rotation overlap when their centres are closer than their
    half-sizes along both the text direction and its normal."""
    (centre_a, angle, width_a, height_a), (centre_b, _, width_b, height_b) = a, b
    along = np.array([math.cos(angle), math.sin(angle)])
    normal = np.array([-along[1], along[0]])
    delta = centre_b - centre_a
    return (abs(delta @ along) < (width_a + width_b) / 2 - _SLACK
            and abs(delta @ normal) < (height_a + height_b) / 2 - _SLACK)


def _inside(box: Bbox, frame: Bbox) -> bool:
    return box.x0 >= frame.x0 and box.y0 >= frame.y0 and box.x1 <= frame.x1 and box.y1 <= frame.y1


def _overlap(a: Bbox, b: Bbox) -> bool:
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > _SLACK) and (min(a.y1, b.y1) - max(a.y0, b.y0) > _SLACK)


def _covers_data(ax: Axes, box: Bbox) -> bool:
    """Whether a data vertex of a line or patch of ``ax``, inside the plot area, lies under the
    legend box."""
    area = ax.bbox.padded(-_SLACK)
    box = Bbox.intersection(box, area)
    if box is None:
        return False
    for artist in (*ax.lines, *ax.patches):
        if isinstance(artist, Line2D):
            points = artist.get_transform().transform(artist.get_xydata())
        else:
            points = artist.get_transform().transform(artist.get_path().vertices)
        points = points[np.isfinite(points).all(axis=1)]
        inside = ((points[:, 0] > box.x0) & (points[:, 0] < box.x1)
                  & (points[:, 1] > box.y0) & (points[:, 1] < box.y1))
        if inside.any():
            return True
    return False


def _series_count(ax: Axes) -> int:
    """Series a reader has to tell apart in one panel: its legend entries, or the distinct
    colours of its lines and patches when they are unlabelled."""
    labelled = len(ax.get_legend_handles_labels()[1])
    colours = set()
    for artist in (*ax.lines, *ax.patches):
        colour = artist.get_color() if isinstance(artist, Line2D) else (
            artist.get_facecolor() if artist.get_fill() else artist.get_edgecolor())
        colours.add(to_hex(colour))
    return max(labelled, len(colours))
