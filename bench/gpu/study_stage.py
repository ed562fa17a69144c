"""Stage ``study``: the next runs of a GPU study (docs/study/anchor-3m.yaml unless --study-plan names
another) that fit the stage's time,
through the study runner (``python -m megatron.quant.lab.study``, which leaves out the runs the
committed ledger holds). The ledger entries of the runs that finished come back inside
``study.json`` (``entries``; a run's name may hold a '+', which no file coming back from a device
may), to be put into the ledger here with ``python -m megatron.quant.lab.study --plan
docs/study/anchor-3m.yaml --add study.json --ledger docs/study/ledger`` (docs/comparing.md)."""
from __future__ import annotations

import json
from pathlib import Path

from .stage import REPO, Context

PLAN = REPO / "docs" / "study" / "anchor-3m.yaml"
LEDGER = REPO / "docs" / "study" / "ledger"
MARGIN_S = 20  # the runner's start and its last entry written, inside the stage's deadline
PREFIX = "study: "  # the runner's lines


def run(context: Context) -> dict:
    out = context.scratch / "study"
    plan = context.study_plan or PLAN
    budget = context.remaining() - MARGIN_S
    # The check trains the tree it was given, committed or not: --allow-dirty, and each entry says which
    # (tree_clean, dirty_allowed), so the report marks pairs of changed or differing code as mixed.
    args = ["--plan", str(plan), "--ledger", str(LEDGER), "--budget-s", f"{budget:.0f}", "--out", str(out),
            "--allow-dirty"]
    result = context.python("megatron.quant.lab.study", *args, *(["--dry-run"] if context.dry_run else []))
    entries = [json.loads(path.read_text()) for path in sorted((out / "ledger").glob("*.json"))]
    sized = out / "plan.yaml"  # a plan sized here (its sizing block): the text to commit, and the measurements
    return {"stopped": result.killed, "exit_code": result.returncode, "budget_s": round(budget), "plan": str(plan),
            "runner": [line[len(PREFIX):] for line in result.output.splitlines() if line.startswith(PREFIX)],
            "entries": entries, "sized_plan": sized.read_text() if sized.is_file() else None,
            "sizing": json.loads((out / "sizing.json").read_text()) if (out / "sizing.json").is_file() else None}


def summarize(record: dict) -> list[str]:
    lines = [f"runner exit code {record['exit_code']} in a budget of {record['budget_s']} s; "
             f"{len(record['entries'])} runs finished:", "",
             "| run | status | final loss | step (s) | run (s) | at once | corpus |", "|---|---|---|---|---|---|---|"]
    for entry in record["entries"]:
        loss = entry["scalars"].get("train/lm loss", {}).get("values") or [None]
        final = f"{loss[-1]:.4f}" if loss[-1] is not None else "-"
        step = f"{entry['step_s']:.4f}" if entry["step_s"] else "-"
        lines.append(f"| {entry['run']} | {entry['status']} | {final} | {step} | {entry['wall_s']:.0f} | "
                     f"{entry.get('runs_at_once', 1)} | {entry['corpus']['sha256'][:8]} |")
    if record.get("sizing") and record["sizing"]["chosen"]:
        chosen = record["sizing"]["chosen"]
        lines += ["", f"sized: {chosen['preset']} ({chosen['parameters'] / 1e6:.2f}M parameters, "
                      f"{chosen['train_iters']} iterations), the tier ~{chosen['tier_s']:.0f} s; "
                      f"{record['sizing']['measurements'][0]['at_once']} at once: each step "
                      f"{record['sizing']['shared_slowdown']:.2f}x alone"]
    lines += ["", *[f"    {line}" for line in record["runner"]],
              "", f"Into the ledger: `python -m megatron.quant.lab.study --plan {_in_repo(record['plan'])} --add "
                  "study.json --ledger docs/study/ledger`."]
    return lines


def _in_repo(plan: str) -> str:
    """The plan's path as a checkout names it (the device's copy of the tree lies elsewhere)."""
    path = Path(plan)
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else plan
