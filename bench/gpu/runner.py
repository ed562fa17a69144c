"""Run stages in order under one budget: skip a stage whose estimate does not fit what is left, stop
one that overruns, and write every stage's JSON, the log and summary.md whatever happened."""
from __future__ import annotations

import json
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .budget import Budget
from .stage import Context, Stage

# A stage may overrun its estimate by half before it is stopped, so that one slow stage cannot eat
# the next one's time (the budget's end stops it earlier where that comes first).
OVERRUN = 1.5
LOG_NAME = "gpu_check.log"
SUMMARY_NAME = "summary.md"


def run_stages(names: Sequence[str], stages: Mapping[str, Stage], out: Path, budget_s: float, dry_run: bool,
               device: str, clock: Callable[[], float] = time.monotonic,
               study_plan: Path | None = None) -> dict[str, dict]:
    """Run ``names`` (keys of ``stages``) in order; returns each stage's record as written to ``<name>.json``."""
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(budget_s, clock)
    records: dict[str, dict] = {}
    with open(out / LOG_NAME, "a") as log, tempfile.TemporaryDirectory(prefix="gpu_check_") as scratch:
        for name in names:
            stage = stages[name]
            estimate = stage.dry_estimate_s if dry_run else stage.estimate_s
            fits_itself = stage.fits_itself_from_s is not None and not dry_run
            needed = stage.fits_itself_from_s if fits_itself else estimate
            left = budget.remaining()
            print(f"[{name}] estimate {estimate:.0f} s ({'dry run' if dry_run else 'cold machine'}"
                  f"{f'; fits its work to the time left, from {needed:.0f} s' if fits_itself else ''}); "
                  f"{left:.0f} s of the budget left", flush=True)
            record = {"stage": name, "device": device, "dry_run": dry_run, "estimate_s": estimate}
            if needed > left:
                what = "its smallest useful work" if fits_itself else "its estimate"
                record.update(status="skipped", seconds=0.0,
                              reason=f"{what} ({needed:.0f} s) exceeds the budget left ({left:.0f} s)")
            else:
                deadline = budget.end if fits_itself else min(budget.end, clock() + OVERRUN * estimate)
                (Path(scratch) / name).mkdir()
                context = Context(out, Path(scratch) / name, dry_run, device, deadline, log, clock, study_plan)
                record.update(_run_one(stage, context, log, clock))
            print(f"[{name}] {record['status']} after {record['seconds']:.0f} s", flush=True)
            (out / f"{name}.json").write_text(json.dumps(record, indent=1))
            records[name] = record
    (out / SUMMARY_NAME).write_text(summary(records, stages, budget_s))
    return records


def _run_one(stage: Stage, context: Context, log, clock: Callable[[], float]) -> dict:
    started = clock()
    try:
        fields = stage.run(context)
    except Exception as err:  # the check goes on to the next stage and reports this one's failure
        log.write(traceback.format_exc())
        return {"status": "error", "seconds": clock() - started, "error": f"{type(err).__name__}: {err}"}
    stopped = fields.pop("stopped", False)
    return {"status": "stopped at its deadline" if stopped else "done", "seconds": clock() - started, **fields}


def summary(records: Mapping[str, dict], stages: Mapping[str, Stage], budget_s: float) -> str:
    """One screen: a line per stage (status, time against estimate), then the stage's own lines."""
    device = next(iter(records.values()))["device"] if records else "?"
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# GPU check: {device}, {when}", "",
             f"Budget {budget_s:.0f} s; estimates are for a cold machine (docs/gpu.md).", "",
             "| stage | status | seconds | estimate |", "|---|---|---|---|"]
    lines += [f"| {name} | {r['status']} | {r['seconds']:.0f} | {r['estimate_s']:.0f} |" for name, r in records.items()]
    for name, record in records.items():
        lines += ["", f"## {name}", ""]
        if record["status"] == "skipped":
            lines.append(f"skipped: {record['reason']}")
        elif record["status"] == "error":
            lines.append(f"error: {record['error']} (traceback in {LOG_NAME})")
        else:
            lines += stages[name].summarize(record)
    return "\n".join(lines) + "\n"
