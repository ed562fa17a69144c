"""What a capture analysis reads (``AnalysisInput``: the summaries of the selected captures) and how it
is registered (``Analysis``: its key, folder and ``build``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from megatron.quant.analysis.captures.catalog import SkippedFile
from megatron.quant.analysis.captures.summary import TensorSummary
from megatron.quant.analysis.plans import AnalysisPlan, PlotSettings


@dataclass(frozen=True)
class AnalysisInput:
    summaries: tuple[TensorSummary, ...]
    output_dir: Path
    tensor_dir: Path
    filters: str
    skipped: tuple[SkippedFile, ...]
    settings: PlotSettings = PlotSettings()

    @property
    def originals(self) -> list[TensorSummary]:
        """Captures of the layers' own tensors (the optional quantized copies left out)."""
        return [s for s in self.summaries if not s.record.quantized]

    @property
    def with_values(self) -> list[TensorSummary]:
        """Originals whose values were sampled (stats-only manifest entries left out)."""
        return [s for s in self.originals if s.has_values]


@dataclass(frozen=True)
class Analysis:
    key: str                 # name on the command line (--analyses)
    title: str
    folder: str              # output sub-folder; "" for files at the top of the output directory
    description: str
    build: Callable[[AnalysisInput], AnalysisPlan]
    needs: frozenset[str] = frozenset()  # extra per-capture data: "heatmap", "format"
