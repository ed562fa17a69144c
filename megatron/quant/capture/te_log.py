"""TE's statistics log: one value per (layer, tensor, statistic) and step, under TE's names.

Captures of one step (its micro-batches) are folded as TE folds them (``te_names.fold``; a weight,
the same in every micro-batch, is taken once), then written as nvdlfw-inspect writes them, to
``<TENSOR_SAVE_DIR>/nvdlfw_inspect_statistics_logs/nvdlfw_inspect_globalrank-<rank>.log``::

    INFO - decoder.layers.0.mlp.linear_fc1_activation_max \t\t\t\t iteration=000004 \t\t\t\t value=4.3188

and returned as ``<layer>_<tensor>_<stat>`` scalars for TensorBoard. Statistics stay per rank (TE
reduces them over the data-parallel group first).
"""
from __future__ import annotations

import os
import warnings
from collections import defaultdict
from typing import Mapping, Optional

from megatron.quant.capture.inspect_config import StatRequest
from megatron.quant.capture.manifest import ManifestFile
from megatron.quant.stats import TE_STAT, fold, stat_parts

LOG_DIR = "nvdlfw_inspect_statistics_logs"
LINE = "INFO - {} \t\t\t\t iteration={:06d} \t\t\t\t value={:.6g}\n"  # nvdlfw-inspect's, 6 significant digits


def log_path(save_dir: str, rank: int) -> str:
    return os.path.join(save_dir, LOG_DIR, f"nvdlfw_inspect_globalrank-{rank}.log")


class TeStatsLog:
    """The current step's parts per (layer, tensor, request); ``finish`` folds, writes and forgets them."""

    def __init__(self, save_dir: str) -> None:
        self._save_dir = save_dir
        self._file: Optional[ManifestFile] = None
        self._rows: dict[tuple[str, str, StatRequest], list[tuple[float, ...]]] = defaultdict(list)
        self._stopped = False

    def add(self, layer: str, te_tensor: str, requests: tuple[StatRequest, ...], stats: Mapping) -> None:
        for request in requests:
            rows = self._rows[(layer, te_tensor, request)]
            if te_tensor == "weight" and rows:
                continue  # the same weight in every micro-batch: TE logs it once
            source = stats if request.source is None else stats.get("whatif", {}).get(request.source)
            parts = None if source is None else stat_parts(TE_STAT[request.stat], source, request.logged)
            if parts is not None:
                rows.append(parts)

    def finish(self, step: int, rank: int) -> dict[str, float]:
        """The step's values (``<layer>_<tensor>_<stat>``), appended to ``rank``'s log; nothing when empty."""
        values = {f"{layer}_{tensor}_{request.logged}": fold(TE_STAT[request.stat], rows)
                  for (layer, tensor, request), rows in sorted(self._rows.items(), key=lambda item: item[0][:2])
                  if rows}
        self._rows.clear()
        if values and not self._stopped:
            self._write("".join(LINE.format(name, step, value) for name, value in values.items()), rank)
        return values

    def close(self) -> None:
        """Close the log; a failing close (a full disk) is said once, as a failing write is: never raised."""
        if self._file is not None:
            try:
                self._file.close()
            except OSError as exc:
                self._stop(exc)
            self._file = None

    def _write(self, text: str, rank: int) -> None:
        path = log_path(self._save_dir, rank)
        if self._stopped:
            return
        try:
            if self._file is None:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                self._file = ManifestFile(path)
            self._file.append(text)
        except OSError as exc:
            self._stop(exc)

    def _stop(self, exc: OSError) -> None:
        if not self._stopped:
            warnings.warn(f"TE statistics log in {os.path.join(self._save_dir, LOG_DIR)}: {exc}; no more TE-named "
                          f"statistics are written, training continues", RuntimeWarning, stacklevel=4)
        self._stopped = True
