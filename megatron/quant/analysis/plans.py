"""The contract between the analyses, the figure renderer and the report: figures to draw, files
written, notes, plot settings.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class FigureJob:
    """A figure to draw in a worker: ``draw(payload)`` returns a matplotlib Figure.

    ``draw`` is a module-level function and ``payload`` plain data, so both pickle.
    """
    path: str        # relative to the output directory, e.g. "distributions/hifp8_linear_forward.png"
    caption: str
    draw: Callable[[Any], Any]
    payload: Any


@dataclass(frozen=True)
class OutputFile:
    """A non-figure output already written (text, CSV), listed in the report."""
    path: str
    caption: str


@dataclass
class AnalysisPlan:
    figures: list[FigureJob] = field(default_factory=list)
    files: list[OutputFile] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was not drawn, and why

    def first_panels(self, what: str, groups: Iterable[T], limit: int) -> list[T]:
        """The first ``limit`` of ``groups``, one panel each; a note names ``what`` when some are left out."""
        groups = list(groups)
        if len(groups) > limit:
            self.notes.append(f"{what}: only the first {limit} of {len(groups)} groups are drawn "
                              f"(--max_panels; use filters to choose others).")
        return groups[:limit]


@dataclass(frozen=True)
class PlotSettings:
    figure_budget: int = 100_000     # sampled values drawn per figure, all series together
    min_trend_iterations: int = 3    # distinct iterations needed for curves over training
    max_panels: int = 12             # subplots per figure (extra groups are named in a note)


def figure_path(folder: str, *parts: object) -> str:
    """``folder/part1_part2.png`` with characters unsafe in file names or URLs replaced."""
    stem = "_".join(re.sub(r"[^A-Za-z0-9._+-]+", "-", str(part)) for part in parts)
    return f"{folder}/{stem}.png" if folder else f"{stem}.png"


