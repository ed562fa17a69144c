"""The figure renderer: every figure of the package is drawn, checked against the figure budget and
saved here (``render``)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from megatron.quant.analysis import figure_budget, figures  # noqa: F401  (figures selects the Agg backend)
from megatron.quant.analysis.plans import FigureJob

# Scientific notation outside [1e-3, 1e4], so that small gradients keep short tick labels.
_STYLE = {"axes.formatter.limits": (-3, 4), "axes.titlesize": 10}


def save(fig: Figure, target: Path, dpi: int) -> list[str]:
    """Draw ``fig`` once at ``dpi``, check that layout against the figure budget, write it as a
    PNG (never half-written under the final name) and close it; returns the budget's problems
    (the PNG is written anyway, so that a reader can see what the problem is)."""
    try:
        fig.set_dpi(dpi)
        fig.canvas.draw()
        broken = figure_budget.problems(fig)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        matplotlib.image.imsave(partial, np.asarray(fig.canvas.buffer_rgba()), format="png", dpi=dpi)
        os.replace(partial, target)
        return broken
    finally:
        plt.close(fig)


@dataclass(frozen=True)
class Drawn:
    """What drawing one figure gave: ``error`` when it could not be drawn (no PNG), else the figure
    budget's ``problems`` (the PNG is written anyway: a report warns about them, never fails on them;
    the tests hold every figure family to the budget)."""
    error: Optional[str] = None
    problems: tuple[str, ...] = ()

    @property
    def drawn(self) -> bool:
        return self.error is None

    @property
    def clean(self) -> bool:
        """Drawn within the figure budget."""
        return self.error is None and not self.problems

    def warning(self) -> Optional[str]:
        """One line on what the reader may not see, None within the budget."""
        return f"figure budget: {'; '.join(self.problems)}" if self.problems else None


def render(job: FigureJob, output_dir: Path, dpi: int) -> Drawn:
    """Draw and save one figure (every figure of the package goes through here); a failure is
    reported, not raised."""
    try:
        with plt.rc_context(_STYLE):
            broken = save(job.draw(job.payload), output_dir / job.path, dpi)
    except Exception as error:  # one broken figure must not lose the rest of the report
        return Drawn(error=f"{type(error).__name__}: {error}")
    return Drawn(problems=tuple(broken))
