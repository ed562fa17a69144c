"""The figure budget: what a reader must be able to see in every figure the package draws.

Checked after layout, on the renderer's extents: legends, tick labels, axis labels, titles and
colour bars lie inside the figure; tick labels of one axis do not overlap each other; a legend
covers no title, axis or tick label, no other legend, no axes of another panel and no data
point of its own panel; no panel draws more series than a reader can tell apart (``MAX_SERIES``: beyond that a
figure becomes small multiples, a heatmap with its values written in, or a table).
"""
from __future__ import annotations

import math

import numpy as np
from matplotlib import cbook
from matplotlib.axes import Axes
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Text
from matplotlib.transforms import Bbox

MAX_SERIES = 8
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
    return list(dict.fromkeys(found))


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
