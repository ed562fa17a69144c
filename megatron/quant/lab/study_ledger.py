"""A study's ledger entries: made from a finished run's directory (``ledger_entry``), read from
entry files or the GPU check's study.json (``entries_in``), and added to the committed ledger
(``add_entries``)."""
from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Mapping, Sequence

from megatron.quant.analysis.runs import ledger
from megatron.quant.analysis.runs.read import TOKENS_PER_S, read_scalars
from megatron.quant.lab import corpus, sweep
from megatron.quant.lab.machine import git_commit, seconds_between
from megatron.quant.lab.study_plan import PlannedRun, StudyPlan
from megatron.quant.lab.sweep_plan import TENSORBOARD, resolve_recipe
from megatron.quant.training.presets import get_preset


class StudyError(ValueError):
    """Bad runner input; one line naming the value and what is allowed."""


def flag_value(flags: Sequence[str], name: str) -> str:
    """The last value of ``name`` (argparse's rule: the last one given wins)."""
    return [flags[i + 1] for i, flag in enumerate(flags[:-1]) if flag == name][-1]


def _num_layers(flags: Sequence[str]) -> int:
    if "--num-layers" in flags:
        return int(flag_value(flags, "--num-layers"))
    return get_preset(flag_value(flags, "--model"))["num_layers"]


def resolved_recipe(recipe_env: Mapping[str, str], environment: Mapping[str, str], num_layers: int) -> list[str]:
    """``python -m megatron.quant.recipes show`` of the recipe as the run built it from its environment."""
    from megatron.quant.recipes.cli import describe as describe_recipe
    from megatron.quant.recipes.recipe import QuantRecipe

    return describe_recipe(QuantRecipe.from_env({**environment, **recipe_env}), num_layers).splitlines()


def resolved_today(recipe: str, environment: Mapping[str, str], flags: Sequence[str]) -> list[str]:
    """``recipe`` resolved as a run of it with ``flags`` would record it now (``resolved_recipe``)."""
    return resolved_recipe(resolve_recipe(recipe)[1], environment, _num_layers(flags))


def ledger_entry(plan: StudyPlan, run: PlannedRun, run_dir: Path, built: corpus.Corpus,
                 dry_run: bool, runs_at_once: int = 1, tokenizer_vocab: int | None = None) -> ledger.LedgerEntry:
    """The ledger entry of the run in ``run_dir`` (its run.json and event files), trained in a wave
    of ``runs_at_once`` (``tokenizer_vocab``: the corpus's, when not the plan's)."""
    record = sweep.read_run(run_dir)
    flags = record["flags"]
    iterations = int(flag_value(flags, "--train-iters"))
    tokens_per_iteration = int(flag_value(flags, "--global-batch-size")) * int(flag_value(flags, "--seq-length"))
    scalars = read_scalars(run_dir / TENSORBOARD)
    kept = {tag: (scalars[tag][0].tolist(), scalars[tag][1].tolist()) for tag in ledger.TAGS if tag in scalars}
    speed = scalars.get(TOKENS_PER_S, (None, []))[1]
    gpus = record["machine"].get("gpus") or []
    return ledger.LedgerEntry(
        study=plan.name, run=run.name, recipe=run.recipe, seed=run.seed, status=record["status"],
        device=gpus[0] if gpus else "cpu", start_time=record["attempts"][0]["start_time"], end_time=record["end_time"],
        wall_s=round(sum(seconds_between(a["start_time"], a["end_time"]) for a in record["attempts"]
                         if "end_time" in a), 1),
        step_s=round(tokens_per_iteration / statistics.median(speed), 5) if len(speed) else None,
        iterations=iterations, tokens=iterations * tokens_per_iteration, commit=record.get("git_commit"),
        corpus={"sha256": built.sha256, "tokens": built.tokens, "train_tokens": built.train_tokens,
                "bytes": built.bytes, "documents": built.train_documents + built.valid_documents,
                "source": built.source, "tokenizer_vocab": tokenizer_vocab or plan.data.tokenizer_vocab},
        recipe_env={**plan.environment, **record["recipe_env"]},
        recipe_resolved=resolved_recipe(record["recipe_env"], plan.environment, _num_layers(flags)),
        flags=flags, machine=record["machine"], scalars=kept, dry_run=dry_run, runs_at_once=runs_at_once)


def entries_in(path: Path) -> list[ledger.LedgerEntry]:
    """The entries in ``path``: one entry, or a JSON object whose ``entries`` are entries (study.json)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise StudyError(f"{path}: not readable as JSON ({type(error).__name__})") from error
    if isinstance(data, dict) and "entries" in data and "schema" not in data:
        return [ledger.from_json(item, f"{path}: entries[{i}]") for i, item in enumerate(data["entries"])]
    return [ledger.from_json(data, str(path))]


def add_entries(plan: StudyPlan, paths: Sequence[Path], directory: Path) -> list[Path]:
    """Write the entries of ``paths`` into ``directory/<study>/``; StudyError for an entry that is
    not a finished run of ``plan``, or a dry run."""
    runs = {run.name: run for run in plan.order}
    entries = [entry for path in paths for entry in entries_in(path)]
    for entry in entries:
        planned = runs.get(entry.run)
        if entry.study != plan.name or planned is None or (planned.recipe, planned.seed) != (entry.recipe, entry.seed):
            raise StudyError(f"entry {entry.run} of study {entry.study} (recipe {entry.recipe}, seed {entry.seed}) "
                             f"is not a run of the plan {plan.name}")
        if entry.dry_run or entry.status not in sweep.DONE:
            what = "a dry run" if entry.dry_run else entry.status
            raise StudyError(f"entry {entry.run} is {what}: not for the ledger")
    commit = git_commit()
    return [ledger.write_entry(entry if entry.commit else dataclasses.replace(entry, commit=commit),
                               directory / plan.name) for entry in entries]
