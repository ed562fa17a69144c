"""One model, several recipes: ``python -m megatron.quant.lab.sweep OUTPUT_DIR RECIPES -- FLAGS``.

Every run gets the same training flags (model, data order, initialisation, seed) and differs
only in its recipe (``CUSTOM_QUANT_TYPE`` for a format name, ``CUSTOM_QUANT_RECIPE`` for a recipe
file). Run ``NAME`` lives in ``OUTPUT_DIR/NAME/``: ``checkpoints/``, ``tensorboard/``, ``run.json``
(recipe, flags, git commit, machine, status and every attempt's start/end) and, with capture
enabled and no ``TENSOR_SAVE_DIR``, ``tensor_logs/``.

Re-running the sweep skips runs whose status is finished or diverged and resumes the others
from their checkpoints. ``--seeds`` adds runs ``<recipe>-seed<N>`` of every recipe (with
``--baseline NAME``, of that recipe only): the report's bands and uncertainties; ``--ablate
PRESET`` adds the preset and its variants with one component removed or added
(``recipes.ablations``); ``--parallel N`` runs N at once, each in its own slot (GPUs or CPU
threads, ``training.slots``) with its output in ``OUTPUT_DIR/NAME/train.log`` (``--runs-per-gpu
K``: K of them share each GPU); ``--print`` prints one command per run (a job array) instead of
running them; ``--only NAME[,NAME...]`` runs those of them. Without ``--data-cache-path`` every
run keeps its dataset index cache in ``OUTPUT_DIR/NAME/data_cache``, not beside the data (which
may be read-only).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

from megatron.quant import notices
from megatron.quant.formats.show import show_value
from megatron.quant.lab.machine import git_commit, machine, utc_now
from megatron.quant.lab.run_lock import RunLockedError, run_locks
from megatron.quant.lab.signals import FORWARDER, SweepInterrupted
from megatron.quant.lab.slots import SlotError, run_in_slots, slot_environments, visible_gpus
from megatron.quant.lab.sweep_plan import (
    CHECKPOINTS,
    SweepError,
    SweepRun,
    check_flags,
    check_schedules,
    plan_runs,
    print_command,
    train_command,
)
from megatron.quant.output_dir import OutputDirError, check_output_dir
from megatron.quant.settings.environment import child_environment, read_environment
from megatron.quant.settings.variables import DIE_WITH_PARENT
from megatron.quant.training import checkpoint
from megatron.quant.training.arguments import MAX_SEED, ArgumentError
from megatron.quant.training.metrics import DIVERGED
from megatron.quant.training.variables import RECIPE_NAMING, environment_of

RUN_JSON = "run.json"


FINISHED, DIVERGED_STATUS, CRASHED, INCOMPLETE, RUNNING, INTERRUPTED = (
    "finished", "diverged", "crashed", "incomplete", "running", "interrupted")
DONE = (FINISHED, DIVERGED_STATUS)  # statuses a re-run skips


TRAIN_LOG = "train.log"  # a parallel run's output
DATA_CACHE = "data_cache"  # a run's dataset index cache, unless --data-cache-path is given


def read_run(run_dir: Path) -> dict | None:
    """``run_dir``'s run.json; None when the run never started."""
    path = run_dir / RUN_JSON
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as error:
        raise SweepError(f"{path} is not valid JSON ({error}); move it away to restart that run") from error


def _write_run(run_dir: Path, record: dict) -> None:
    tmp = run_dir / f".{RUN_JSON}.tmp"
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, run_dir / RUN_JSON)


def outcome(run_dir: Path, returncode: int, train_iters: int) -> str:
    """A finished attempt's status: diverged (the loop's marker), crashed, finished or incomplete."""
    checkpoints = run_dir / CHECKPOINTS
    if (checkpoints / DIVERGED).is_file():
        return DIVERGED_STATUS
    if returncode != 0:
        return CRASHED
    done = checkpoint.latest_iteration(str(checkpoints)) if checkpoints.is_dir() else None
    return FINISHED if done == train_iters else INCOMPLETE  # e.g. --exit-interval: the next sweep resumes


def execute(run: SweepRun, run_dir: Path, command: list[str], flags: Sequence[str], train_iters: int,
            slot: Mapping[str, str] | None = None, lock: int | None = None, phases: Sequence[str] = ()) -> str:
    """Run (or resume) ``run`` with ``command``, keeping run.json up to date; its status. In a
    ``slot`` (``--parallel``): with the slot's environment, output appended to ``run_dir/train.log``.
    A scheduled recipe's ``phases`` (one line each, with its iterations) go into run.json.
    The trainer inherits the run's ``lock`` descriptor and dies with the sweep (``training.lifetime``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = child_environment(drop=RECIPE_NAMING)  # the run's recipe names it
    env.update(run.env)
    env.update(slot or {})
    env[DIE_WITH_PARENT] = "1"
    env.setdefault("TENSOR_SAVE_DIR", str(run_dir / "tensor_logs"))  # captures, when enabled, stay with the run
    record = read_run(run_dir) or {"name": run.name, "recipe": run.recipe, "recipe_env": dict(run.env),
                                   "start_time": utc_now(), "attempts": []}
    attempt = {"start_time": utc_now(), "command": command, "git_commit": git_commit(), "machine": machine(),
               "environment": dict(environment_of(env))}
    record.update(flags=[*flags, *run.extra_flags], git_commit=attempt["git_commit"], machine=attempt["machine"],
                  status=RUNNING, **({"phases": list(phases)} if phases else {}))
    record["attempts"].append(attempt)
    _write_run(run_dir, record)
    status = INTERRUPTED
    try:
        returncode = _run_command(command, env, run_dir / TRAIN_LOG if slot is not None else None,
                                  () if lock is None else (lock,))
        status = outcome(run_dir, returncode, train_iters)
        attempt["returncode"] = returncode
    finally:  # an interrupted sweep still records it, and the next one resumes the run
        attempt.update(end_time=utc_now(), status=status)
        record.update(status=status, end_time=attempt["end_time"])
        if status == DIVERGED_STATUS:
            record["divergence"] = json.loads((run_dir / CHECKPOINTS / DIVERGED).read_text())
        _write_run(run_dir, record)
    return status


def _launcher_value(launcher: Sequence[str], *names: str) -> str | None:
    """The value of a launcher option (``--opt V`` or ``--opt=V``), None when absent."""
    for i, token in enumerate(launcher):
        for name in names:
            if token == name and i + 1 < len(launcher):
                return launcher[i + 1]
            if token.startswith(name + "="):
                return token.split("=", 1)[1]
    return None


def parallel_slots(parallel: int, launcher: Sequence[str], runs_per_gpu: int = 1) -> list[dict[str, str]]:
    """``--parallel``'s slots on this node: its GPUs shared by processes per run (and by
    ``runs_per_gpu`` runs), else its cores."""
    import torch

    if _launcher_value(launcher, "--master-port", "--master_port") is not None:
        raise SweepError(f"--parallel {parallel}: the launcher {shlex.join(launcher)!r} fixes --master-port, so "
                         f"concurrent runs would collide; drop it (torchrun on one node then picks a free port)")
    per_run = _launcher_value(launcher, "--nproc-per-node", "--nproc_per_node") or "1"
    if not per_run.isdigit():
        raise SweepError(f"--parallel {parallel}: the launcher's --nproc-per-node {per_run!r} must be a number")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    given = read_environment().visible_devices
    gpus = visible_gpus({} if given is None else {"CUDA_VISIBLE_DEVICES": given},
                        torch.cuda.device_count() if torch.cuda.is_available() else 0)
    return slot_environments(parallel, gpus, cpus, int(per_run), runs_per_gpu)


def _say(line: str) -> None:
    """One line in one write: runs in parallel threads do not interleave their lines."""
    print(line + "\n", end="", flush=True)


def _run_command(command: list[str], env: dict[str, str], log: Path | None, pass_fds: Sequence[int] = ()) -> int:
    if log is None:
        return FORWARDER.run(command, env=env, pass_fds=pass_fds)
    with open(log, "a") as handle:  # unbuffered: the log follows the run
        return FORWARDER.run(command, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=handle,
                             stderr=subprocess.STDOUT, pass_fds=pass_fds)


def check_launcher(launcher: Sequence[str]) -> None:
    """SweepError, before any run starts, for a launcher whose program cannot be run."""
    if not launcher or shutil.which(launcher[0]) is None:
        program = launcher[0] if launcher else ""
        raise SweepError(f"--launcher {show_value(shlex.join(launcher))}: {show_value(program)} is not a program "
                         f"found on PATH (or not executable); allowed: e.g. torchrun, or a Python interpreter's path")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m megatron.quant.lab.sweep",
        description="Train the same model once per recipe into OUTPUT_DIR/<recipe>/ (training flags after --).")
    p.add_argument("output_dir", type=Path)
    p.add_argument("recipes", help="format names, recipe presets (te-nvfp4, ...), comparison presets "
                                   "(essential, quant_only, all) or recipe files, "
                                   "space- or comma-separated, e.g. \"bf16 mxfp8 mxfp4 nvfp4 hifp8\"")
    p.add_argument("flags", nargs=argparse.REMAINDER, help="megatron-quant-train flags, after --")
    p.add_argument("--launcher", default="torchrun --nproc-per-node 1",
                   help="command that runs '-m megatron.quant.training' (default: %(default)s)")
    p.add_argument("--seeds", default="", help="extra seeds of every recipe, e.g. \"1 2\" (runs NAME-seed1, "
                                               "NAME-seed2 beside NAME, which has the flags' --seed)")
    p.add_argument("--baseline", default=None, help="give the extra seeds to this recipe only (a cheaper noise band)")
    p.add_argument("--ablate", action="append", default=[], metavar="PRESET",
                   help="also run PRESET and its variants with one component removed or added "
                        "(te-nvfp4 -> te-nvfp4-no-sr, -no-rht, -no-2d, +bf16-layers; mxfp4 -> mxfp4+sr, ...); "
                        "repeatable")
    p.add_argument("--parallel", type=int, default=1, metavar="N",
                   help="run N at once, each on its share of the GPUs (CUDA_VISIBLE_DEVICES) or, without GPUs, "
                        "of the CPU cores (OMP_NUM_THREADS); output in OUTPUT_DIR/NAME/train.log")
    p.add_argument("--runs-per-gpu", type=int, default=1, metavar="K",
                   help="with --parallel on GPUs: K runs share each slot's GPUs (small models leave a GPU idle "
                        "between one process's launches); without GPUs it does not apply (default: %(default)s)")
    p.add_argument("--print", action="store_true", help="print one command per run instead of running")
    p.add_argument("--only", default=None, metavar="NAME[,NAME...]", help="run only these of the sweep's runs")
    return p


def parse_seeds(text: str) -> list[int]:
    """``--seeds``' integers; SweepError (a bounded excerpt of the value) for words, fractions, seeds
    outside the trainer's range or a seed given twice (two runs would share one directory)."""
    seeds = []
    for token in text.replace(",", " ").split():
        if not (token.isascii() and token.isdigit() and len(token) <= len(str(MAX_SEED))) or int(token) > MAX_SEED:
            raise SweepError(f"--seeds {show_value(text)}: {show_value(token)} is not a seed; allowed: integers "
                             f"0 to {MAX_SEED}, e.g. \"1 2 3\"")
        if int(token) in seeds:
            raise SweepError(f"--seeds {show_value(text)}: seed {int(token)} is given twice")
        seeds.append(int(token))
    return seeds


def only_runs(runs: Sequence[SweepRun], only: str) -> list[SweepRun]:
    """The runs ``--only`` names (comma-separated), in the sweep's order; SweepError for a name that
    is not one of them."""
    names = [name.strip() for name in only.split(",") if name.strip()]
    unknown = [name for name in names if name not in {run.name for run in runs}]
    if unknown or not names:
        raise SweepError(f"--only {only!r}: {', '.join(map(repr, unknown)) or 'no name'} is not one of the sweep's "
                         f"runs: {', '.join(run.name for run in runs)}")
    return [run for run in runs if run.name in names]


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()
    options = parser.parse_args(argv)
    options.flags = options.flags[1:] if options.flags[:1] == ["--"] else options.flags
    options.baseline = options.baseline or None
    return options


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: 0 every run finished or diverged, 1 a run crashed or stopped early, 2 bad input."""
    notices.hide_known()  # the flag checks import megatron-core: its known start-up notices stay quiet
    options = _parse(argv)
    try:
        options.seeds = parse_seeds(options.seeds)
        args = check_flags(options.flags)
        if args.seed in options.seeds:
            raise SweepError(f"--seeds: seed {args.seed} is the training flags' --seed, which every recipe's own "
                             "run has already; drop it")
        runs = plan_runs(options.recipes, options.seeds, options.baseline, options.ablate)
        phases = check_schedules(runs, args.train_iters)
        if options.only is not None:
            runs = only_runs(runs, options.only)
        if options.runs_per_gpu != 1 and options.parallel == 1:
            raise SweepError(f"--runs-per-gpu {options.runs_per_gpu}: runs share a GPU only when several go at "
                             f"once; give --parallel N too")
        check_output_dir(options.output_dir, "OUTPUT_DIR")
    except (SweepError, ArgumentError, OutputDirError) as error:
        print(f"sweep: error: {error}", file=sys.stderr)
        return 2
    if options.print:
        for run in runs:
            print(print_command(options.output_dir, options.recipes, run, options, options.flags))
        return 0
    try:
        launcher = shlex.split(options.launcher)
        check_launcher(launcher)
        slots = parallel_slots(options.parallel, launcher, options.runs_per_gpu) if options.parallel > 1 else None
        with run_locks(options.output_dir, [run.name for run in runs]) as locks:  # read the statuses under them
            statuses = {run.name: (read_run(options.output_dir / run.name) or {}).get("status") for run in runs}
            return _sweep(options, args, runs, statuses, launcher, slots, locks, phases)
    except (SweepError, SlotError, RunLockedError, ValueError) as error:  # ValueError: shlex's unclosed quote
        print(f"sweep: error: {error}", file=sys.stderr)
        return 2


def _sweep(options: argparse.Namespace, args: argparse.Namespace, runs: Sequence[SweepRun], statuses: dict,
           launcher: list[str], slots: list[dict[str, str]] | None, locks: Mapping[str, int],
           phases: Mapping[str, list[str]]) -> int:
    """Execute ``runs`` (their locks held; ``phases``: a scheduled run's, for its run.json); the sweep's
    exit status."""

    def sweep_one(run: SweepRun, slot: dict[str, str] | None = None) -> str:
        run_dir = options.output_dir / run.name
        if statuses[run.name] in DONE:
            _say(f"sweep: {run.name}: {statuses[run.name]} already, skipped")
            return statuses[run.name]
        verb = "resuming" if statuses[run.name] else "starting"
        where = "" if slot is None else f" ({' '.join(f'{k}={v}' for k, v in slot.items())}, log {TRAIN_LOG})"
        where += "; its last sweep was killed while it ran" if statuses[run.name] == RUNNING else ""
        _say(f"sweep: {verb} {run.name} in {run_dir}{where}")
        command = train_command(run, run_dir, launcher, options.flags, wandb=args.wandb_project is not None)
        if args.data_path is not None and args.data_cache_path is None:  # not beside the data, which may be
            command += ["--data-cache-path", str(run_dir / DATA_CACHE)]  # read-only; runs at once would race there
        status = execute(run, run_dir, command, options.flags, args.train_iters, slot, locks[run.name],
                         phases.get(run.name, ()))
        _say(f"sweep: {run.name}: {status}")
        return status

    try:
        with FORWARDER:
            done = (run_in_slots([lambda slot, run=run: sweep_one(run, slot) for run in runs], slots) if slots
                    else [sweep_one(run) for run in runs])
    except SweepInterrupted as interrupt:
        print(f"sweep: {interrupt} received: the running runs stopped and are recorded as {INTERRUPTED} in "
              f"their {RUN_JSON}; run the sweep again to resume them", file=sys.stderr, flush=True)
        return 128 + interrupt.signum
    results = {run.name: status for run, status in zip(runs, done)}
    print("sweep: " + ", ".join(f"{name} {status}" for name, status in results.items()))
    return 0 if all(status in DONE for status in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
