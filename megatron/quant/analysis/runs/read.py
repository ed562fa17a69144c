"""Reading training runs: TensorBoard scalars per run directory, damaged event files read around,
run.json records (``Run``, ``load_runs``).
"""
from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

LOSS, GRAD_NORM, LR = "train/lm loss", "train/grad norm", "train/learning rate"
TOKENS_PER_S, VALIDATION, DIVERGED = "train/tokens/s", "validation/lm loss", "train/diverged"
# Where a run's wall time went (training/loop.py): the process's start to the first iteration, then the
# iterations, the validations and the checkpoints; the rest of the wall time is the process's exit.
TIME_TAGS = tuple(f"time/{part} seconds" for part in ("start-up", "training", "evaluation", "checkpoint"))


# Stats-mode capture summaries: train/quant/<role>/<operand>/<metric> (any metric, present or future).
STATS_TAG = re.compile(r"^train/quant/(?P<site>.+)/(?P<metric>[^/]+)$")


SEED_RUN = re.compile(r"^(?P<recipe>.+)-seed(?P<seed>\d+)$")  # the sweep's seed runs
EVENTS_GLOB = "events.out.tfevents.*"


class RunsReportError(ValueError):
    """Missing directory, no runs, or an absent baseline; the message names what exists."""


Series = tuple[np.ndarray, np.ndarray]  # (iterations, values)


@dataclass
class Run:
    name: str
    scalars: dict[str, Series]
    record: dict = field(default_factory=dict)  # run.json, when the sweep wrote one
    notes: list[str] = field(default_factory=list)  # damaged inputs read around (shown in the table)

    def series(self, tag: str) -> Series:
        return self.scalars.get(tag, (np.zeros(0, dtype=np.int64), np.zeros(0)))

    @property
    def diverged(self) -> bool:
        return (self.record.get("status") == "diverged" or DIVERGED in self.scalars
                or first_not_finite(self.series(LOSS)) is not None)

    @property
    def seed_of(self) -> Optional[str]:
        match = SEED_RUN.match(self.name)
        return match["recipe"] if match else None

    @property
    def seed_slot(self) -> str:
        """The seed this run shares with the other recipes' runs: "" for the first seed's (named after
        its recipe), else the N of ``-seed<N>``."""
        match = SEED_RUN.match(self.name)
        return match["seed"] if match else ""


# ---- reading --------------------------------------------------------------------------------
def read_scalars(event_dir: Path) -> dict[str, Series]:
    """Every scalar tag of the event files in ``event_dir`` (all points: no reservoir sampling).

    A resumed run's second event file purges the first one's points from the resume step on."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    events = EventAccumulator(str(event_dir), size_guidance={SCALARS: 0}).Reload()
    out = {}
    for tag in events.Tags()[SCALARS]:
        points = events.Scalars(tag)
        out[tag] = (np.array([p.step for p in points], dtype=np.int64), np.array([p.value for p in points]))
    return out


def event_file_damage(path: Path) -> Optional[tuple[int, str]]:
    """(whole records before the damage, what is wrong) for a damaged event file; None when whole.

    Checks the TFRecord framing (each record's length, its CRC and that the record fits in the
    file), not the payloads: cheap, and what tells random bytes and a cut file apart."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    size, offset, records = path.stat().st_size, 0, 0
    with open(path, "rb") as handle:
        while offset < size:
            header = handle.read(12)
            if len(header) == 12 and masked_crc32c(header[:8]) != struct.unpack("<I", header[8:])[0]:
                return records, f"not a TensorBoard event record at byte {offset}"
            end = offset + 12 + (struct.unpack("<Q", header[:8])[0] if len(header) == 12 else 0) + 4
            if len(header) < 12 or end > size:
                return records, f"truncated at byte {size}"
            offset = handle.seek(end)
            records += 1
    return None


def _read_run(run_dir: Path, event_files: Sequence[Path]) -> tuple[Optional[Run], list[str]]:
    """The run in ``run_dir`` (None when none of its event files is readable) and its problems."""
    notes, readable = [], []
    for path in event_files:
        damage = event_file_damage(path)
        if damage is not None:
            notes.append(f"{path.relative_to(run_dir)}: {damage[1]}"
                         + (", skipped" if damage[0] == 0 else f", read its first {damage[0]} records"))
        if damage is None or damage[0]:
            readable.append(path)
    if not readable:
        return None, notes
    scalars: dict[str, Series] = {}
    for event_dir in sorted({path.parent for path in readable}):
        scalars.update(read_scalars(event_dir))
    record: dict = {}
    record_path = run_dir / "run.json"
    if record_path.is_file():
        try:
            record = json.loads(record_path.read_text(encoding="utf-8"))
            if not isinstance(record, dict):
                raise ValueError(f"a JSON {type(record).__name__}, not an object")
        except (OSError, ValueError, RecursionError) as error:
            notes.append(f"run.json unreadable ({type(error).__name__}), ignored")
            record = {}
    return Run(run_dir.name, scalars, record, notes), notes


def load_runs(output_dir: Path, skipped: Optional[list[tuple[str, str]]] = None) -> list[Run]:
    """The runs under ``output_dir``, sorted by name; runs whose event files are all damaged
    are left out and added to ``skipped`` as (run, reason)."""
    if not output_dir.is_dir():
        raise RunsReportError(f"runs directory {str(output_dir)!r} does not exist")
    runs = []
    for run_dir in sorted(p for p in output_dir.iterdir() if p.is_dir()):
        event_files = sorted(run_dir.rglob(EVENTS_GLOB))
        if not event_files:
            continue
        run, notes = _read_run(run_dir, event_files)
        if run is not None:
            runs.append(run)
        elif skipped is not None:
            skipped.append((run_dir.name, "; ".join(notes)))
    if not runs:
        found = ", ".join(sorted(p.name for p in output_dir.iterdir() if p.is_dir())) or "nothing"
        raise RunsReportError(f"no runs in {str(output_dir)!r}: no subdirectory holds TensorBoard event files "
                              f"({EVENTS_GLOB}); subdirectories: {found}")
    return runs


def first_not_finite(series: Series) -> Optional[int]:
    """The first iteration whose value is NaN or infinite; None when all are finite."""
    bad = np.flatnonzero(~np.isfinite(series[1]))
    return int(series[0][bad[0]]) if bad.size else None
