"""The study runner: the next runs of a study plan that fit a time budget, trained through the
sweep, each finished one written as a ledger entry.

``python -m megatron.quant.lab.study --plan docs/study/plan.yaml --ledger docs/study/ledger
--budget-s 600 --out DIR [--dry-run]``:

1. builds the plan's corpus in ``DIR/corpus`` (or reuses the one there): the Python
   installation's text, the plan's tokenizer trained on it (``corpus``, ``bpe``);
2. takes the plan's runs in order, leaves out those the ledger already holds on this corpus
   (same study, same corpus hash), and keeps the first ones whose estimated times fit what is
   left of the budget (``select_runs``), in waves of ``--runs-at-once`` (the plan's
   ``runs_at_once``) that share the GPU (``StudyPlan.wave_seconds``);
3. trains each wave through the sweep (``DIR/runs/NAME``: run.json, checkpoints, event files; a
   re-run skips finished runs and resumes the others), checking before each that it still fits
   (the estimate scaled by how much slower this invocation's waves were than estimated);
4. writes a ledger entry per finished or diverged run into ``DIR/ledger`` (``--add`` puts them
   into the committed ledger, ``docs/study/ledger/<study>/``).

A run for the ledger (not ``--dry-run``) starts only from a git checkout without uncommitted changes:
its entry's commit then names the code that ran. ``--allow-dirty`` trains from a changed tree (or one
without git) anyway, and its entries say so (``tree_clean``, ``dirty_allowed``).

``--add FILE ...``: instead of running, put finished runs' entries into ``--ledger`` under
``<study>/``: entry files (``DIR/ledger/*.json``) or the GPU check's ``study.json`` (its
``entries``). Each entry is read and checked on its own: one that is not JSON, not an entry, of another
study, of a run the plan does not have, a dry run, a run given twice, or from a changed tree without
``--allow-dirty`` is refused in one line naming it, and the good ones are written all the same.

``--measured``: instead of running (an unreadable entry is named and left out), print what the
ledger measured per device (each recipe's step time alone, the slowdown of runs at once, the
start-up) as the plan's ``step_time.measured`` block, and the ``train_iters`` that fit a run into
``--target-s`` (``study_measure``).

``--dry-run``: the same path on CPU in seconds: a toy model (``DRY_RUN_FLAGS``, the plan's model
and sizes overridden), a small corpus (``--corpus-source`` or the standard library's first
``DRY_RUN_BYTES``, a ``DRY_RUN_VOCAB``-token tokenizer); the runs chosen in the plan's order with
``DRY_RUN_RUN_S`` each; entries marked ``dry_run``.

Exit status: 0 every run started finished or diverged (or none fit), 1 a run crashed or stopped
early, 2 bad input (one line).
"""
from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from megatron.quant import notices
from megatron.quant.analysis.runs import ledger
from megatron.quant.analysis.runs.read import LOSS
from megatron.quant.lab import corpus, machine, sweep
from megatron.quant.lab.signals import SweepInterrupted
from megatron.quant.lab.study_checks import SessionError, check_seconds, check_session
from megatron.quant.lab.study_ledger import (
    CORPUS,
    LEDGER,
    RUNS,
    SIZING,
    StudyError,
    add_entries,
    flag_value,
    ledger_entry,
    resolved_today,
)
from megatron.quant.lab.study_measure import describe, describe_measured, measure
from megatron.quant.lab.study_plan import (
    MAX_RUNS_AT_ONCE,
    PlannedRun,
    StudyPlan,
    StudyPlanError,
    load_plan,
    waves,
)
from megatron.quant.lab.study_power import describe_power, for_target
from megatron.quant.lab.study_sizing import (
    Measurement,
    measurement_flags,
    read_measurement,
    size,
    write_sizing,
)
from megatron.quant.settings.environment import scoped_environ
from megatron.quant.training import metrics

DRY_RUN_FLAGS = ("--model", "llama-tiny", "--num-layers", "1", "--seq-length", "32", "--max-position-embeddings", "32",
                 "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters", "2", "--lr-warmup-iters", "0",
                 "--log-interval", "1", "--eval-interval", "2", "--eval-iters", "1", "--save-interval", "2")
DRY_RUN_BYTES, DRY_RUN_VOCAB = 1_000_000, 300
DRY_RUN_RUN_S = 15.0  # a toy run's estimate, for the dry run's choice


def pending_runs(plan: StudyPlan, done: set[str]) -> list[PlannedRun]:
    """The plan's runs in order, those named in ``done`` left out."""
    return [run for run in plan.order if run.name not in done]


WaveSeconds = Callable[[Sequence[str]], float]  # a wave's recipes -> its seconds


def select_runs(pending: Sequence[PlannedRun], budget_s: float, wave_seconds: WaveSeconds,
                at_once: int = 1) -> list[PlannedRun]:
    """The longest prefix of ``pending`` whose waves of ``at_once`` runs (``wave_seconds`` each) add up
    to at most ``budget_s`` (a prefix: the plan's order is its priority, so a later, shorter run
    never jumps the queue)."""
    chosen: list[PlannedRun] = []
    for run in pending:
        trial = [*chosen, run]
        if sum(wave_seconds([r.recipe for r in wave]) for wave in waves(trial, at_once)) > budget_s:
            break
        chosen = trial
    return chosen


def done_in_ledger(entries: Sequence[ledger.LedgerEntry], study: str, corpus_hash: str,
                   dry_run: bool = False) -> set[str]:
    """Names of the runs the ledger holds for ``study`` on the corpus ``corpus_hash`` (dry runs count
    only for a dry run)."""
    return {entry.run for entry in _held(entries, study, corpus_hash, dry_run)}


def changed_in_ledger(entries: Sequence[ledger.LedgerEntry], study: str, corpus_hash: str, dry_run: bool,
                      resolved: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """The held runs whose recipe no longer resolves as their entry recorded (``resolved``: each
    recipe's lines today), with what changed: their result answers for another recipe, so they are
    trained again (the new entry replaces the old; git keeps it)."""
    changes = {entry.run: ledger.recipe_change(entry.recipe_resolved, resolved[entry.recipe])
               for entry in _held(entries, study, corpus_hash, dry_run) if entry.recipe in resolved}
    return {run: change for run, change in changes.items() if change is not None}


def _held(entries: Sequence[ledger.LedgerEntry], study: str, corpus_hash: str,
          dry_run: bool) -> list[ledger.LedgerEntry]:
    return [entry for entry in entries if entry.study == study and entry.corpus_hash == corpus_hash
            and entry.status in sweep.DONE and entry.dry_run == dry_run]


def corpus_sources(plan: StudyPlan, source: Path | None, dry_run: bool) -> list[Path]:
    """``source`` when given; for a dry run the standard library; else the plan's."""
    if source is not None:
        return [source]
    if dry_run or not plan.data.site_packages:
        return [corpus.default_source()]
    return corpus.installation_sources()


def ensure_corpus(plan: StudyPlan, directory: Path, source: Path | None, dry_run: bool) -> corpus.Corpus:
    """The corpus in ``directory``, built from the plan's data settings unless one built from the
    same sources with the same settings is there already."""
    roots = corpus_sources(plan, source, dry_run)
    max_bytes = DRY_RUN_BYTES if dry_run else plan.data.max_bytes
    built = corpus.read_manifest(directory)
    if built is not None:
        if (built.source, built.seed, built.max_bytes) != ([str(r) for r in roots], plan.data.seed, max_bytes):
            raise StudyError(f"{directory} holds another corpus (sources {built.source}, seed {built.seed}, max bytes "
                             f"{built.max_bytes}); remove it or give another --out")
        return built
    vocab = DRY_RUN_VOCAB if dry_run else plan.data.tokenizer_vocab
    return corpus.build_corpus(directory, roots, plan.data.valid_fraction, plan.data.seed, max_bytes=max_bytes,
                               tokenizer_vocab=vocab, tokenizer_train_bytes=plan.data.tokenizer_train_bytes)


def training_flags(plan: StudyPlan, built: corpus.Corpus, cache: Path | None, dry_run: bool) -> list[str]:
    """The flags every run of the plan gets (the sweep adds the seed runs' --seed). Without ``cache``
    (runs at once, which would race on building one) the sweep gives each run its own."""
    shaped = dataclasses.replace(plan, shape_override={}) if dry_run else plan  # the toy model's shape, not the plan's
    return [*shaped.model_flags(), *plan.training_flags, "--data-path", built.data_path, "--split", built.split,
            *built.tokenizer, *(["--data-cache-path", str(cache)] if cache else []), "--seed", str(plan.seeds[0]),
            *(DRY_RUN_FLAGS if dry_run else ())]


def run_wave(plan: StudyPlan, wave: Sequence[PlannedRun], runs_dir: Path, flags: Sequence[str],
             launcher: str) -> list[str]:
    """Train ``wave`` through the sweep, its runs at once on the same GPU (their run directories,
    run.json, skip and resume); their statuses."""
    argv = ["--only", ",".join(run.name for run in wave), "--launcher", launcher]
    if len(wave) > 1:
        argv += ["--parallel", str(len(wave)), "--runs-per-gpu", str(len(wave))]
    if len(plan.seeds) > 1:
        argv += ["--seeds", " ".join(map(str, plan.seeds[1:]))]
    if (code := sweep.main([*argv, str(runs_dir), " ".join(plan.recipes), "--", *flags])) > 128:
        raise SweepInterrupted(code - 128)  # a signal: its runs stopped and are recorded; start no more
    return [(sweep.read_run(runs_dir / run.name) or {}).get("status", sweep.CRASHED) for run in wave]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m megatron.quant.lab.study",
                                description="Run the next runs of a study plan that fit a time budget and write "
                                            "their ledger entries.")
    p.add_argument("--plan", type=Path, required=True, help="the study plan (docs/study/plan.yaml)")
    p.add_argument("--ledger", type=Path, default=None,
                   help="the committed ledger (docs/study/ledger): its runs on this corpus are not run again")
    p.add_argument("--budget-s", type=float, default=None, help="seconds this invocation may spend, corpus included")
    p.add_argument("--out", type=Path, default=None, help=f"working directory: {CORPUS}/, {RUNS}/, {LEDGER}/ (the "
                                                          "new entries)")
    p.add_argument("--add", type=Path, nargs="+", default=None, metavar="FILE",
                   help="put these entries (entry files, or the GPU check's study.json) into --ledger; run nothing")
    p.add_argument("--launcher", default=shlex.quote(sys.executable),
                   help="runs '-m ...' for each run (default: this Python, %(default)s; a device may have no 'python')")
    p.add_argument("--runs-at-once", type=int, default=None, metavar="K",
                   help="runs sharing the GPU at a time (default: the plan's runs_at_once)")
    p.add_argument("--corpus-source", type=Path, default=None, help="build the corpus from this directory instead")
    p.add_argument("--dry-run", action="store_true", help="a toy model on a small corpus: the whole path in seconds")
    p.add_argument("--show", action="store_true", help="print the plan's sizes and per-run estimates; train nothing")
    p.add_argument("--measured", action="store_true",
                   help="print what --ledger measured per device as the plan's step_time.measured block, and the "
                        "train_iters that fit a run into --target-s; train nothing")
    p.add_argument("--target-s", type=float, default=120.0, help="a run's time to size for (default: %(default)s)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="train for the ledger from a tree with uncommitted changes (or without git); its entries "
                        "say so, and the report marks their pairs mixed")
    return p


def check_tree(allow_dirty: bool) -> None:
    """Refuse a checkout whose commit would not name the code that runs, unless ``allow_dirty``."""
    commit = machine.git_commit()
    if commit is not None and not commit.endswith(ledger.DIRTY):
        return
    what = ("is not a git checkout: its entries could name no commit" if commit is None else
            f"has uncommitted changes (commit {commit[:12]}): its entries' commit would not name the code that ran")
    if not allow_dirty:
        raise StudyError(f"this checkout {what}; commit them (git status), or give --allow-dirty")
    _say(f"--allow-dirty: this checkout {what}; the entries say so")


def _say(line: str) -> None:
    print(f"study: {line}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    notices.hide_known()  # the flag checks import megatron-core: its known start-up notices stay quiet
    started = time.monotonic()
    args = build_parser().parse_args(argv)
    try:
        plan = load_plan(args.plan)
        if args.add is not None:
            if args.ledger is None:
                raise StudyError("--add needs --ledger, the ledger directory to put the entries in")
            written, refused = add_entries(plan, args.add, args.ledger)
            for path in written:
                _say(f"added {path}")
            for why in refused:
                print(f"study: error: refused {why}", file=sys.stderr)
            return 2 if refused else 0
        if args.show:
            entries = ledger.read_ledger(args.ledger, []) if args.ledger is not None else []
            plan, target = for_target(plan, entries)
            _say("\n".join(filter(None, [describe(plan), target, describe_power(plan, entries) if entries else ""]))
                 .replace("\n", "\nstudy: "))
            return 0
        if args.measured:
            return _print_measured(plan, args)
        if args.budget_s is None or args.out is None:
            raise StudyError("give --budget-s and --out (or --show, or --add)")
        check_seconds(args.budget_s, "--budget-s")
        if args.runs_at_once is not None and not 1 <= args.runs_at_once <= MAX_RUNS_AT_ONCE:
            raise StudyError(f"--runs-at-once must be 1 to {MAX_RUNS_AT_ONCE}, got {args.runs_at_once}")
        plan = dataclasses.replace(plan, runs_at_once=args.runs_at_once or plan.runs_at_once)
        at_once = plan.runs_at_once
        check_session(args.out, args.launcher, at_once)
        if not args.dry_run:
            check_tree(args.allow_dirty)
        entries = ledger.read_ledger(args.ledger, []) if args.ledger is not None else []
        plan, target = for_target(plan, entries)
        _say("\n".join(filter(None, [describe(plan), target, describe_power(plan, entries) if entries else ""]))
             .replace("\n", "\nstudy: "))
        built = ensure_corpus(plan, args.out / CORPUS, args.corpus_source, args.dry_run)
    except (StudyError, StudyPlanError, ledger.LedgerError, corpus.CorpusError, SessionError) as error:
        print(f"study: error: {error}", file=sys.stderr)
        return 2
    if plan.sizing is not None and plan.sizing.fixed_on is None:
        try:
            plan = size_tier(plan, built, args, deadline=started + args.budget_s)
        except StudyPlanError as error:
            print(f"study: error: {error}", file=sys.stderr)
            return 1
        except SweepInterrupted as interrupt:
            return _stopped(interrupt)
        if plan is None:
            return 1
    epochs = "" if args.dry_run else f" ({plan.tokens_per_run / built.train_tokens:.1f} epochs a run)"
    _say(f"corpus {built.sha256[:ledger.HASH_PREFIX]}: {built.train_tokens:,} training tokens{epochs}, ready after "
         f"{time.monotonic() - started:.0f} s")
    flags = training_flags(plan, built, None, args.dry_run)
    changed = changed_in_ledger(entries, plan.name, built.sha256, args.dry_run,
                                {recipe: resolved_today(recipe, plan.environment, flags) for recipe in plan.recipes})
    for run, change in changed.items():
        _say(f"{run}: its ledger entry ran another definition of its recipe ({change}): trained again")
    pending = pending_runs(plan, done_in_ledger(entries, plan.name, built.sha256, args.dry_run) - changed.keys())
    wave_seconds = ((lambda recipes: DRY_RUN_RUN_S * plan.slowdown(len(recipes))) if args.dry_run
                    else plan.wave_seconds)
    chosen = select_runs(pending, args.budget_s - (time.monotonic() - started), wave_seconds, at_once)
    _say(f"{len(pending)} of {len(plan.order)} runs pending on this corpus; {len(chosen)} fit the budget"
         + (f" ({at_once} at once)" if at_once > 1 else "") + ": "
         + (", ".join(run.name for run in chosen) or "none"))
    try:
        statuses = run_chosen(plan, waves(chosen, at_once), wave_seconds, built, args, deadline=started + args.budget_s)
    except SweepInterrupted as interrupt:
        return _stopped(interrupt)
    return 0 if all(status in sweep.DONE for status in statuses) else 1


def _stopped(interrupt: SweepInterrupted) -> int:
    """A signal stopped the sweep, its runs recorded "interrupted": the study starts nothing more."""
    print(f"study: error: {interrupt} received: stopped; the finished runs' entries are in --out's {LEDGER}/, the "
          f"stopped runs resume when the study runs again", file=sys.stderr, flush=True)
    return 128 + interrupt.signum


def _print_measured(plan: StudyPlan, args: argparse.Namespace) -> int:
    if args.ledger is None:
        raise StudyError("--measured needs --ledger, the ledger directory to read the runs' times from")
    check_seconds(args.target_s, "--target-s")
    refused: list[tuple[str, str]] = []
    found = measure(plan, ledger.read_ledger(args.ledger, refused))
    for _path, why in refused:
        print(f"study: error: refused {why}; left out", file=sys.stderr)
    if not found:
        _say(f"{args.ledger} holds no timed, finished runs of study {plan.name} yet")
    for device in found:
        print(describe_measured(plan, device, args.target_s))
    return 0


def size_tier(plan: StudyPlan, built: corpus.Corpus, args: argparse.Namespace, deadline: float) -> StudyPlan | None:
    """Measure and size the tier through the sweep (``study_sizing.size``, ``write_sizing``): the sized
    plan, its step times the measured ones; None when no candidate fits."""

    def measure(preset: str, recipes: Sequence[str], at_once: int) -> Measurement:
        left = deadline - time.monotonic()
        if left < plan.step_time.startup_s and not args.dry_run:  # a wave cut short measures nothing
            _say(f"{left:.0f} s left: not enough for a measuring wave at {preset} ({at_once} at once)")
            return Measurement(preset, at_once, {}, {})
        runs_dir = args.out / SIZING / f"{preset}-k{at_once}"
        cache = args.out / "data_cache" if at_once == 1 else None
        flags = measurement_flags(plan, training_flags(plan, built, cache, args.dry_run), preset, args.dry_run)
        with scoped_environ(plan.environment):
            for wave in waves([PlannedRun(recipe, plan.seeds[0], recipe) for recipe in recipes], at_once):
                run_wave(plan, wave, runs_dir, flags, args.launcher)
        tokens = int(flag_value(flags, "--global-batch-size")) * int(flag_value(flags, "--seq-length"))
        return read_measurement(runs_dir, {recipe: recipe for recipe in recipes}, preset, at_once, tokens,
                                plan.sizing.measure_iters)

    budget_left = (lambda: float("inf")) if args.dry_run else (lambda: deadline - time.monotonic())
    result = size(plan, measure, metrics.device_name() or "cpu", budget_left, _say)
    return write_sizing(result, args.plan, args.out, args.dry_run, _say)


def run_chosen(plan: StudyPlan, chosen: Sequence[Sequence[PlannedRun]], wave_seconds: WaveSeconds,
               built: corpus.Corpus, args: argparse.Namespace, deadline: float) -> list[str]:
    """Train the waves ``chosen`` in order while each still fits before ``deadline`` (its estimate
    scaled by how much longer this invocation's waves took than estimated); write the finished runs'
    entries. Their statuses."""
    slower, statuses = 1.0, []
    for wave in chosen:
        names, estimate = ", ".join(run.name for run in wave), wave_seconds([run.recipe for run in wave])
        left = deadline - time.monotonic()
        if estimate * slower > left:
            _say(f"stopping before {names}: {left:.0f} s left, it would take ~{estimate * slower:.0f} s")
            break
        flags = training_flags(plan, built, args.out / "data_cache" if len(wave) == 1 else None, args.dry_run)
        began = time.monotonic()
        with scoped_environ(plan.environment):  # the sweep passes its environment on to the runs
            wave_statuses = run_wave(plan, wave, args.out / RUNS, flags, args.launcher)
        slower = max(slower, (time.monotonic() - began) / estimate)
        statuses += wave_statuses
        for run, status in zip(wave, wave_statuses):
            _report(plan, run, status, built, args, len(wave), estimate)
    return statuses


def _report(plan: StudyPlan, run: PlannedRun, status: str, built: corpus.Corpus, args: argparse.Namespace,
            at_once: int, estimate: float) -> None:
    """Write a finished run's ledger entry and say how it went against the plan."""
    if status not in sweep.DONE:
        _say(f"{run.name}: {status}, no ledger entry")
        return
    entry = ledger_entry(plan, run, args.out / RUNS / run.name, built, args.dry_run, at_once,
                         DRY_RUN_VOCAB if args.dry_run else None, args.allow_dirty)
    path = ledger.write_entry(entry, args.out / LEDGER)
    last = entry.scalars.get(LOSS, ([], [float("nan")]))[1][-1]
    planned = plan.step_seconds(run.recipe) * plan.slowdown(at_once)
    step = f", {entry.step_s:.4f} s/iteration (plan: {planned:.4f})" if entry.step_s else ""
    shared = f", {at_once} at once" if at_once > 1 else ""
    _say(f"{run.name}: {status}, loss {last:.4f}, {entry.wall_s:.0f} s (plan: {estimate:.0f} s{shared}){step} -> "
         f"{path}")


if __name__ == "__main__":
    sys.exit(main())
