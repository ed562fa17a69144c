"""A study's ledger entries: made from a finished run's directory (``ledger_entry``), read from
entry files or the GPU check's study.json (``entries_in``), and added to the committed ledger
(``add_entries``), each bad one refused on its own. An entry names the code that ran (its commit and
whether the tree was clean) and nothing of the machine it ran on beyond its hardware and software:
no host name, no paths of the runner's working directory (``portable``)."""
from __future__ import annotations

import dataclasses
import statistics
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

from megatron.quant.analysis.runs import ledger
from megatron.quant.analysis.runs.read import TOKENS_PER_S, read_scalars
from megatron.quant.lab import corpus, sweep
from megatron.quant.lab.machine import seconds_between
from megatron.quant.lab.study_plan import PlannedRun, StudyPlan
from megatron.quant.lab.sweep_plan import TENSORBOARD, resolve_recipe
from megatron.quant.training.presets import get_preset

CORPUS, RUNS, LEDGER, SIZING = "corpus", "runs", "ledger", "sizing"  # under --out; and sizing.json, plan.yaml
WORK_PLACES = (CORPUS, RUNS, SIZING, "data_cache")  # a path through one of them is written from there on


class StudyError(ValueError):
    """Bad runner input; one line naming the value and what is allowed."""


def _relative(value: str) -> str:
    """A path into the runner's working directory from the working directory on ("corpus/..."); a
    temporary directory's path as its last part; any other value as it is."""
    if not value.startswith("/"):
        return value
    parts = Path(value).parts
    at = next((i for i, part in enumerate(parts) if part in WORK_PLACES), None)
    if at is not None:
        return str(Path(*parts[at:]))
    temporary = Path(value).is_relative_to(tempfile.gettempdir()) or Path(value).is_relative_to("/tmp")
    return Path(value).name if temporary else value


def portable(entry: ledger.LedgerEntry) -> ledger.LedgerEntry:
    """``entry`` without the host's name and with its paths as ``_relative`` writes them."""
    corpus_facts = {**entry.corpus, **({"source": [_relative(str(p)) for p in entry.corpus["source"]]}
                                       if isinstance(entry.corpus.get("source"), list) else {})}
    return dataclasses.replace(entry, machine={k: v for k, v in entry.machine.items() if k != "host"},
                               flags=[_relative(f) if isinstance(f, str) else f for f in entry.flags],
                               corpus=corpus_facts)


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


def ledger_entry(plan: StudyPlan, run: PlannedRun, run_dir: Path, built: corpus.Corpus, dry_run: bool,
                 runs_at_once: int = 1, tokenizer_vocab: int | None = None,
                 dirty_allowed: bool = False) -> ledger.LedgerEntry:
    """The ledger entry of the run in ``run_dir`` (its run.json and event files), trained in a wave
    of ``runs_at_once`` (``tokenizer_vocab``: the corpus's, when not the plan's; ``dirty_allowed``:
    the runner was told to train from a tree with uncommitted changes)."""
    record = sweep.read_run(run_dir)
    flags = record["flags"]
    iterations = int(flag_value(flags, "--train-iters"))
    tokens_per_iteration = int(flag_value(flags, "--global-batch-size")) * int(flag_value(flags, "--seq-length"))
    scalars = read_scalars(run_dir / TENSORBOARD)
    kept = {tag: (scalars[tag][0].tolist(), scalars[tag][1].tolist()) for tag in ledger.TAGS if tag in scalars}
    speed = scalars.get(TOKENS_PER_S, (None, []))[1]
    gpus = record["machine"].get("gpus") or []
    commit = record.get("git_commit")
    clean = None if commit is None else not commit.endswith(ledger.DIRTY)
    return portable(ledger.LedgerEntry(
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
        flags=flags, machine=record["machine"], scalars=kept, dry_run=dry_run, runs_at_once=runs_at_once,
        tree_clean=clean, dirty_allowed=dirty_allowed and clean is not True))


Found = tuple[str, "ledger.LedgerEntry | str"]  # (where: a file, or a file's entries[i]; the entry or why not)


def entries_in(path: Path) -> list[Found]:
    """The entries in ``path`` (one entry, or a JSON object whose ``entries`` are entries: study.json),
    each read on its own: a bad one comes with why, and takes no good one with it."""
    try:
        data = ledger.read_json(path)
    except ledger.LedgerError as error:
        return [(str(path), str(error))]
    named = [(str(path), data)]
    if isinstance(data, dict) and "entries" in data and "schema" not in data:
        if not isinstance(data["entries"], list):
            return [(str(path), f"{path}: entries: expected a list of entries")]
        named = [(f"{path}: entries[{i}]", item) for i, item in enumerate(data["entries"])]
    found: list[Found] = []
    for where, item in named:
        try:
            found.append((where, ledger.from_json(item, where)))
        except ledger.LedgerError as error:
            found.append((where, str(error)))
    return found


def _refusal(plan: StudyPlan, entry: ledger.LedgerEntry, runs: Mapping[str, PlannedRun]) -> str | None:
    """Why ``entry`` is not for ``plan``'s ledger, or None."""
    planned = runs.get(entry.run)
    if entry.study != plan.name or planned is None or (planned.recipe, planned.seed) != (entry.recipe, entry.seed):
        return (f"entry {entry.run} of study {entry.study} (recipe {entry.recipe}, seed {entry.seed}) "
                f"is not a run of the plan {plan.name}")
    if entry.dry_run or entry.status not in sweep.DONE:
        return f"entry {entry.run} is {'a dry run' if entry.dry_run else entry.status}: not for the ledger"
    if entry.tree_clean is not True and not entry.dirty_allowed:
        tree = "a tree with uncommitted changes" if entry.tree_clean is False else "a checkout without git"
        return (f"entry {entry.run} ran from {tree} and does not say the runner was told to (--allow-dirty): "
                "its commit does not name its code")
    return None


def add_entries(plan: StudyPlan, paths: Sequence[Path], directory: Path) -> tuple[list[Path], list[str]]:
    """Write the good entries of ``paths`` into ``directory/<study>/`` (``portable``); (the paths
    written, one line per entry refused: unreadable, not a finished run of ``plan``, a dry run, a
    run named twice, or from a changed tree without leave)."""
    runs = {run.name: run for run in plan.order}
    written: list[Path] = []
    refused: list[str] = []
    seen: set[str] = set()
    for where, entry in (found for path in paths for found in entries_in(path)):
        why = entry if isinstance(entry, str) else _refusal(plan, entry, runs)
        if why is None and entry.run in seen:
            why = f"entry {entry.run} is given twice: the first one is added"
        if why is not None:
            refused.append(why if why.startswith(where) else f"{where}: {why}")
            continue
        seen.add(entry.run)
        written.append(ledger.write_entry(portable(entry), directory / plan.name))
    return written, refused
