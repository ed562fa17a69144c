"""One model, several recipes: ``python -m megatron.quant.training.sweep OUTPUT_DIR RECIPES -- FLAGS``.

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
threads, ``training.slots``) with its output in ``OUTPUT_DIR/NAME/train.log`` and, without
``--data-cache-path``, its own dataset index cache ``OUTPUT_DIR/NAME/data_cache``; ``--print``
prints one command per run (a job array) instead of running them; ``--only NAME`` runs one of them.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from megatron.quant.analysis.output_dir import OutputDirError, check_output_dir
from megatron.quant.recipes.sets import RECIPE_SUFFIXES, SETS, expand_sets
from megatron.quant.training import checkpoint
from megatron.quant.training.arguments import ArgumentError, parse_args
from megatron.quant.training.metrics import DIVERGED
from megatron.quant.training.slots import SlotError, run_in_slots, slot_environments, visible_gpus

RUN_JSON = "run.json"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tensorboard"
FINISHED, DIVERGED_STATUS, CRASHED, INCOMPLETE, RUNNING, INTERRUPTED = (
    "finished", "diverged", "crashed", "incomplete", "running", "interrupted")
DONE = (FINISHED, DIVERGED_STATUS)  # statuses a re-run skips
SEED_SUFFIX = "-seed"  # run NAME-seedN: recipe NAME with --seed N (the report's seed bands)
TRAIN_LOG = "train.log"  # a parallel run's output
DATA_CACHE = "data_cache"  # a parallel run's dataset index cache, unless --data-cache-path is given
_RECIPE_ENV = ("CUSTOM_QUANT_TYPE", "CUSTOM_QUANT_RECIPE")
# The sweep sets these per run.
_OWN_FLAGS = ("save", "load", "tensorboard_dir")


class SweepError(ValueError):
    """Bad sweep input; the message names the value and what is allowed."""


class SweepInterrupted(Exception):
    """The sweep received SIGTERM or SIGINT; the runs' processes got it too and have ended."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


KILL_AFTER_S = 60.0  # a run still alive this long after the forwarded signal is killed


class SignalForwarder:
    """While entered (main thread), SIGTERM (what a scheduler sends) and SIGINT to the sweep go
    to the whole process group of every run started by ``run`` (torchrun and its workers), from
    any slot thread; ``run`` then waits for its run to end (SIGKILL after ``kill_after`` s) and
    raises SweepInterrupted, so run.json records "interrupted"."""

    def __init__(self, kill_after: float = KILL_AFTER_S) -> None:
        self.kill_after, self.signum = kill_after, None
        self._children: set[subprocess.Popen] = set()
        self._previous: dict = {}

    def __enter__(self) -> "SignalForwarder":
        self.signum = None
        self._previous = {signum: signal.signal(signum, self._forward) for signum in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _forward(self, signum: int, _frame=None) -> None:
        self.signum = self.signum or signum
        for child in list(self._children):  # list(): one C call, safe against slot threads
            _signal_group(child, signum)

    def run(self, command: Sequence[str], **popen: object) -> int:
        """``command``'s exit status, in its own process group."""
        child = subprocess.Popen(command, start_new_session=True, **popen)
        self._children.add(child)
        try:
            if self.signum is not None:  # arrived while it started
                _signal_group(child, self.signum)
            deadline = None
            while True:
                try:
                    returncode = child.wait(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    if self.signum is not None:
                        deadline = deadline or time.monotonic() + self.kill_after
                        if time.monotonic() > deadline:
                            _signal_group(child, signal.SIGKILL)
        finally:
            self._children.discard(child)
        if self.signum is not None:
            raise SweepInterrupted(self.signum)
        return returncode


def _signal_group(child: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(child.pid, signum)
    except ProcessLookupError:
        pass


FORWARDER = SignalForwarder()


@dataclass(frozen=True)
class SweepRun:
    name: str                    # directory under OUTPUT_DIR
    recipe: str                  # the recipe token as given (format name or recipe file)
    env: tuple[tuple[str, str], ...]  # the recipe's environment variables
    extra_flags: tuple[str, ...] = ()  # e.g. a seed run's --seed N


def _recipe_tokens(text: str) -> list[str]:
    """Recipe tokens with the comparison presets (essential, quant_only, all) expanded."""
    tokens: list[str] = []
    for token in text.replace(",", " ").split():
        if token in SETS:  # expand_sets puts its fp32 reference first: keep it only if the set has it
            expanded = expand_sets([token])
            tokens += expanded if token != "quant_only" else expanded[1:]
        else:
            tokens.append(token)
    return tokens


def resolve_recipe(token: str) -> tuple[str, dict[str, str]]:
    """(run name, recipe environment) for a format name, a recipe preset (te-nvfp4, ...) or a recipe file."""
    from megatron.quant import formats
    from megatron.quant.recipes import ablations, presets
    from megatron.quant.recipes.recipe import QuantRecipe, RecipeError

    if token.lower().endswith(RECIPE_SUFFIXES) or Path(token).is_file():
        if not Path(token).is_file():
            raise SweepError(f"recipe file {token!r} does not exist")
        try:
            name = QuantRecipe.from_file(token).name
        except RecipeError as error:
            raise SweepError(str(error)) from error
        return name, {"CUSTOM_QUANT_RECIPE": str(Path(token).resolve())}
    valid = sorted(set(formats.list_formats()) | set(formats.ALIASES)) + presets.preset_names()
    try:
        variant = ablations.is_variant(token) and ablations.get_variant(token)
    except ablations.AblationError as error:
        raise SweepError(str(error)) from error
    if token.lower() not in valid and not variant:
        raise SweepError(f"unknown recipe {token!r}; give format names or recipe presets ({', '.join(valid)}), "
                         f"their variants (te-nvfp4-no-sr, mxfp4+sr, ...; see --ablate), "
                         f"comparison presets ({', '.join(SETS)}) or recipe files ({'/'.join(RECIPE_SUFFIXES)})")
    return token, {"CUSTOM_QUANT_TYPE": token.lower()}


def ablation_tokens(bases: Sequence[str], given: Sequence[str]) -> list[str]:
    """The recipes ``--ablate`` adds: each base and its variants, those not ``given`` already."""
    from megatron.quant.recipes import ablations

    tokens: list[str] = []
    for base in bases:
        try:
            expanded = ablations.ablation(base)
        except ablations.AblationError as error:
            raise SweepError(str(error)) from error
        tokens += [token for token in expanded if token not in given and token not in tokens]
    return tokens


def plan_runs(recipes: str, seeds: Sequence[int] = (), baseline: str | None = None,
              ablate: Sequence[str] = ()) -> list[SweepRun]:
    """The runs of a sweep, in order: one per recipe (``--ablate``'s after the given ones), then
    per extra seed one run of every recipe (of ``baseline`` only, when given)."""
    runs = []
    tokens = _recipe_tokens(recipes)
    for token in tokens + ablation_tokens(ablate, [t.lower() for t in tokens]):
        name, env = resolve_recipe(token)
        runs.append(SweepRun(name, token, tuple(sorted(env.items()))))
    if not runs:
        raise SweepError(f"no recipes in {recipes!r}; give e.g. \"bf16 mxfp8 mxfp4 nvfp4 hifp8\"")
    names = [run.name for run in runs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise SweepError(f"recipes {duplicates} are given twice (a recipe file's name equals another recipe)")
    if baseline is not None and baseline not in names:
        raise SweepError(f"baseline {baseline!r} is not one of the sweep's recipes: {', '.join(names)}")
    seeded = [run for run in runs if baseline is None or run.name == baseline]
    runs += [SweepRun(f"{run.name}{SEED_SUFFIX}{seed}", run.recipe, run.env, ("--seed", str(seed)))
             for seed in seeds for run in seeded]
    return runs


def check_flags(flags: Sequence[str]) -> argparse.Namespace:
    """Parse the training flags once (an error before any run starts) and refuse the per-run ones."""
    try:
        args = parse_args(list(flags))
    except SystemExit as exit_:
        raise SweepError(f"the training flags {shlex.join(flags)!r} are refused (see above)") from exit_
    given = [f"--{key.replace('_', '-')}" for key in _OWN_FLAGS if getattr(args, key) is not None]
    if given:
        raise SweepError(f"the sweep sets {', '.join(given)} per run (OUTPUT_DIR/<recipe>/); drop them")
    return args


def train_command(run: SweepRun, run_dir: Path, launcher: Sequence[str], flags: Sequence[str],
                  wandb: bool) -> list[str]:
    """The launcher running ``megatron.quant.train`` for ``run`` into ``run_dir``."""
    checkpoints = str(run_dir / CHECKPOINTS)
    own = ["--save", checkpoints, "--load", checkpoints, "--tensorboard-dir", str(run_dir / TENSORBOARD)]
    if wandb and "--wandb-exp-name" not in flags:
        own += ["--wandb-exp-name", run.name]
    return [*launcher, "-m", "megatron.quant.train", *flags, *run.extra_flags, *own]


def print_command(output_dir: Path, recipes: str, run: SweepRun, options: argparse.Namespace,
                  flags: Sequence[str]) -> str:
    """The sweep itself restricted to ``run`` (``--only``): a job-array line that keeps run.json,
    skip/resume and divergence handling."""
    argv = [sys.executable, "-m", "megatron.quant.training.sweep", "--only", run.name,
            "--launcher", options.launcher]
    if options.seeds:
        argv += ["--seeds", " ".join(map(str, options.seeds))]
    if options.baseline:
        argv += ["--baseline", options.baseline]
    for base in options.ablate:
        argv += ["--ablate", base]
    return shlex.join([*argv, str(output_dir), recipes, "--", *flags])


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def git_commit() -> str | None:
    """HEAD of the checkout this package runs from (``+dirty`` with local changes); None outside git."""
    root = Path(__file__).resolve().parents[3]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine() -> dict:
    import torch

    return {"host": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cpus": os.cpu_count(),
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}


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
            slot: Mapping[str, str] | None = None) -> str:
    """Run (or resume) ``run`` with ``command``, keeping run.json up to date; its status. In a
    ``slot`` (``--parallel``): with the slot's environment, output appended to ``run_dir/train.log``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {key: value for key, value in os.environ.items() if key not in _RECIPE_ENV}
    env.update(run.env)
    env.update(slot or {})
    env.setdefault("TENSOR_SAVE_DIR", str(run_dir / "tensor_logs"))  # captures, when enabled, stay with the run
    record = read_run(run_dir) or {"name": run.name, "recipe": run.recipe, "recipe_env": dict(run.env),
                                   "start_time": _now(), "attempts": []}
    attempt = {"start_time": _now(), "command": command, "git_commit": git_commit(), "machine": machine()}
    record.update(flags=[*flags, *run.extra_flags], git_commit=attempt["git_commit"], machine=attempt["machine"], status=RUNNING)
    record["attempts"].append(attempt)
    _write_run(run_dir, record)
    status = INTERRUPTED
    try:
        returncode = _run_command(command, env, run_dir / TRAIN_LOG if slot is not None else None)
        status = outcome(run_dir, returncode, train_iters)
        attempt["returncode"] = returncode
    finally:  # an interrupted sweep still records it, and the next one resumes the run
        attempt.update(end_time=_now(), status=status)
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


def parallel_slots(parallel: int, launcher: Sequence[str]) -> list[dict[str, str]]:
    """``--parallel``'s slots on this machine: its GPUs shared by processes per run, else its cores."""
    import torch

    if _launcher_value(launcher, "--master-port", "--master_port") is not None:
        raise SweepError(f"--parallel {parallel}: the launcher {shlex.join(launcher)!r} fixes --master-port, so "
                         f"concurrent runs would collide; drop it (torchrun on one node then picks a free port)")
    per_run = _launcher_value(launcher, "--nproc-per-node", "--nproc_per_node") or "1"
    if not per_run.isdigit():
        raise SweepError(f"--parallel {parallel}: the launcher's --nproc-per-node {per_run!r} must be a number")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    gpus = visible_gpus(os.environ, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    return slot_environments(parallel, gpus, cpus, int(per_run))


def _say(line: str) -> None:
    """One line in one write: runs in parallel threads do not interleave their lines."""
    print(line + "\n", end="", flush=True)


def _run_command(command: list[str], env: dict[str, str], log: Path | None) -> int:
    if log is None:
        return FORWARDER.run(command, env=env)
    with open(log, "a") as handle:  # unbuffered: the log follows the run
        return FORWARDER.run(command, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=handle,
                             stderr=subprocess.STDOUT)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m megatron.quant.training.sweep",
        description="Train the same model once per recipe into OUTPUT_DIR/<recipe>/ (training flags after --).")
    p.add_argument("output_dir", type=Path)
    p.add_argument("recipes", help="format names, recipe presets (te-nvfp4, ...), comparison presets "
                                   "(essential, quant_only, all) or recipe files, "
                                   "space- or comma-separated, e.g. \"bf16 mxfp8 mxfp4 nvfp4 hifp8\"")
    p.add_argument("flags", nargs=argparse.REMAINDER, help="megatron-quant-train flags, after --")
    p.add_argument("--launcher", default="torchrun --nproc-per-node 1",
                   help="command that runs '-m megatron.quant.train' (default: %(default)s)")
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
    p.add_argument("--print", action="store_true", help="print one command per run instead of running")
    p.add_argument("--only", default=None, metavar="NAME", help="run only this one of the sweep's runs")
    return p


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()
    options = parser.parse_args(argv)
    options.flags = options.flags[1:] if options.flags[:1] == ["--"] else options.flags
    try:
        options.seeds = [int(seed) for seed in options.seeds.replace(",", " ").split()]
    except ValueError:
        parser.error(f"--seeds {options.seeds!r}: expected integers, e.g. \"1 2 3\"")
    options.baseline = options.baseline or None
    return options


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: 0 every run finished or diverged, 1 a run crashed or stopped early, 2 bad input."""
    options = _parse(argv)
    try:
        args = check_flags(options.flags)
        runs = plan_runs(options.recipes, options.seeds, options.baseline, options.ablate)
        if options.only is not None:
            chosen = [run for run in runs if run.name == options.only]
            if not chosen:
                raise SweepError(f"--only {options.only!r} is not one of the sweep's runs: "
                                 f"{', '.join(run.name for run in runs)}")
            runs = chosen
        check_output_dir(options.output_dir, "OUTPUT_DIR")
        statuses = {run.name: (read_run(options.output_dir / run.name) or {}).get("status") for run in runs}
    except (SweepError, ArgumentError, OutputDirError) as error:
        print(f"sweep: error: {error}", file=sys.stderr)
        return 2
    launcher = shlex.split(options.launcher)
    if options.print:
        for run in runs:
            print(print_command(options.output_dir, options.recipes, run, options, options.flags))
        return 0
    def sweep_one(run: SweepRun, slot: dict[str, str] | None = None) -> str:
        run_dir = options.output_dir / run.name
        if statuses[run.name] in DONE:
            _say(f"sweep: {run.name}: {statuses[run.name]} already, skipped")
            return statuses[run.name]
        verb = "resuming" if statuses[run.name] else "starting"
        where = "" if slot is None else f" ({' '.join(f'{k}={v}' for k, v in slot.items())}, log {TRAIN_LOG})"
        _say(f"sweep: {verb} {run.name} in {run_dir}{where}")
        command = train_command(run, run_dir, launcher, options.flags, wandb=args.wandb_project is not None)
        if slot is not None and args.data_path is not None and args.data_cache_path is None:
            command += ["--data-cache-path", str(run_dir / DATA_CACHE)]  # runs at once would race on a shared one
        status = execute(run, run_dir, command, options.flags, args.train_iters, slot)
        _say(f"sweep: {run.name}: {status}")
        return status

    try:
        slots = parallel_slots(options.parallel, launcher) if options.parallel > 1 else None
    except (SweepError, SlotError) as error:
        print(f"sweep: error: {error}", file=sys.stderr)
        return 2
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
