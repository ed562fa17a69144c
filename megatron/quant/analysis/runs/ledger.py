"""The study ledger: one small JSON file per finished run, committed (``docs/study/ledger/``), so a
study grows across sessions and machines without its checkpoints or event files.

An entry (schema ``SCHEMA_VERSION``) holds what the runs report needs and what makes runs
comparable: the scalars (training loss per log interval, validation loss per evaluation, grad
norm, learning rate, tokens/s), the tokens trained, the device, dates, the git commit, the corpus
hash, and the recipe as given and as resolved. ``read_ledger`` reads a directory of entries (at any
depth); ``ledger_runs`` turns them into the runs report's ``Run`` objects, refusing to mix entries
of different studies or corpora (their losses are not comparable), and labels each run with its
device when the entries come from more than one, and notes a run whose recipe resolved otherwise than
another seed's of the same recipe (``recipe_change``: its definition changed between their commits).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from megatron.quant.analysis.runs.read import (
    DIVERGED,
    GRAD_NORM,
    LOSS,
    LR,
    TIME_TAGS,
    TOKENS_PER_S,
    VALIDATION,
    Run,
    RunsReportError,
)

SCHEMA_VERSION = 1
TAGS = (LOSS, VALIDATION, GRAD_NORM, LR, TOKENS_PER_S, DIVERGED, *TIME_TAGS)  # the scalars an entry keeps
SUFFIX = ".json"
HASH_PREFIX = 8  # hex digits of the corpus hash in file names and messages


class LedgerError(RunsReportError):
    """An entry that cannot be read, or entries that must not be compared; one line naming it."""


@dataclass(frozen=True)
class LedgerEntry:
    study: str
    run: str                      # the sweep's run name: <recipe> or <recipe>-seed<N>
    recipe: str
    seed: int
    status: str                   # finished or diverged (the sweep's statuses)
    device: str                   # the GPU's name, or "cpu"
    start_time: str               # ISO 8601, UTC
    end_time: str
    wall_s: float                 # the run's attempts, start-up included
    step_s: Optional[float]       # median seconds per iteration (from tokens/s); None when not logged
    iterations: int
    tokens: int                   # trained: iterations x global batch x sequence length
    commit: Optional[str]
    corpus: Mapping[str, Any]     # sha256, tokens, bytes, documents, source, tokenizer
    recipe_env: Mapping[str, str]  # CUSTOM_QUANT_TYPE / CUSTOM_QUANT_RECIPE and the plan's environment
    recipe_resolved: Sequence[str]  # `python -m megatron.quant.recipes show` of the recipe as it ran
    flags: Sequence[str]
    machine: Mapping[str, Any]
    scalars: Mapping[str, tuple[list[int], list[float]]]
    dry_run: bool = False
    runs_at_once: int = 1         # runs sharing the device while this one trained (its step_s is theirs too)
    tree_clean: Optional[bool] = None  # the checkout had no uncommitted changes; None: unknown (no git)
    dirty_allowed: bool = False   # the runner was told to train from a tree with changes (--allow-dirty)
    schema: int = field(default=SCHEMA_VERSION)

    @property
    def corpus_hash(self) -> str:
        return str(self.corpus.get("sha256", ""))

    @property
    def provenance(self) -> str:
        """The code that ran: its commit, and whether the tree had changes no commit names."""
        state = {True: "clean", False: "uncommitted changes", None: "tree unknown"}[self.tree_clean]
        return f"{(self.commit or 'no commit')[:12].removesuffix('+dirty')} ({state})"

    @property
    def file_name(self) -> str:
        return f"{self.run}.{self.corpus_hash[:HASH_PREFIX]}{SUFFIX}"


def _finite_or_none(value: float) -> Optional[float]:
    return float(f"{value:.7g}") if math.isfinite(value) else None  # strict JSON; 7 digits: float32's


def to_json(entry: LedgerEntry) -> dict:
    data = asdict(entry)
    data = {"schema": data.pop("schema"), **data}
    data["scalars"] = {tag: {"iterations": [int(i) for i in steps],
                             "values": [_finite_or_none(float(v)) for v in values]}
                       for tag, (steps, values) in entry.scalars.items()}
    return data


_TEXT, _INTEGER, _NUMBER = ((str,), "a string"), ((int,), "an integer"), ((int, float), "a number")
MAX_COUNT = 2**53  # iterations, tokens, seeds: exact in a float, and far beyond any run
DIRTY = "+dirty"  # a commit's suffix for a tree with uncommitted changes (lab/machine.py writes it)
_OBJECT, _LIST = ((dict,), "an object"), ((list,), "a list")
_REQUIRED = {"study": _TEXT, "run": _TEXT, "recipe": _TEXT, "seed": _INTEGER, "status": _TEXT, "device": _TEXT,
             "start_time": _TEXT, "end_time": _TEXT, "wall_s": _NUMBER, "iterations": _INTEGER, "tokens": _INTEGER,
             "corpus": _OBJECT, "recipe_env": _OBJECT, "recipe_resolved": _LIST, "flags": _LIST, "machine": _OBJECT,
             "scalars": _OBJECT}


def from_json(data: Any, source: str) -> LedgerEntry:
    """The entry in ``data`` (a parsed file); LedgerError names ``source`` and the bad key."""
    if not isinstance(data, dict):
        raise LedgerError(f"{source}: not a ledger entry (a JSON {type(data).__name__})")
    if data.get("schema") != SCHEMA_VERSION:
        raise LedgerError(f"{source}: ledger schema {data.get('schema')!r}; this code reads schema {SCHEMA_VERSION}")
    for key, (types, what) in _REQUIRED.items():
        value = data.get(key)
        if not isinstance(value, types) or isinstance(value, bool):
            raise LedgerError(f"{source}: {key}: expected {what}, got {_echo(value)}")
        if types is _NUMBER[0] and not (math.isfinite(value) and 0 <= value < MAX_COUNT) or (
                types is _INTEGER[0] and not 0 <= value < MAX_COUNT):
            raise LedgerError(f"{source}: {key}: expected {what} from 0 to 2**53, got {_echo(value)}")
    scalars = {tag: _series(series, f"{source}: scalars.{tag}") for tag, series in data["scalars"].items()}
    fields = LedgerEntry.__dataclass_fields__
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise LedgerError(f"{source}: unknown key(s) {', '.join(unknown)} for schema {SCHEMA_VERSION}")
    at_once = data.get("runs_at_once", 1)
    if not isinstance(at_once, int) or isinstance(at_once, bool) or at_once < 1:
        raise LedgerError(f"{source}: runs_at_once: expected an integer >= 1, got {at_once!r:.60}")
    step = data.get("step_s")  # study --measured divides by it
    if step is not None and (not isinstance(step, (int, float)) or isinstance(step, bool) or not 0 < step < math.inf):
        raise LedgerError(f"{source}: step_s: expected seconds per iteration above 0 (or null), got {step!r:.60}")
    commit = data.get("commit")
    if commit is not None and not isinstance(commit, str):
        raise LedgerError(f"{source}: commit: expected a string or null, got {_echo(commit)}")
    clean = data.get("tree_clean", None if commit is None else not commit.endswith(DIRTY))  # older: the suffix
    for key, value in (("tree_clean", clean), ("dirty_allowed", data.get("dirty_allowed", False)),
                       ("dry_run", data.get("dry_run", False))):
        if not isinstance(value, bool) and not (key == "tree_clean" and value is None):
            raise LedgerError(f"{source}: {key}: expected true or false, got {_echo(value)}")
    optional = {"dry_run", "runs_at_once", "tree_clean", "dirty_allowed"}  # older entries ran alone, from git
    missing = sorted(set(fields) - set(data) - optional)
    if missing:
        raise LedgerError(f"{source}: missing key(s) {', '.join(missing)} (null where unknown)")
    return LedgerEntry(**{**data, "scalars": scalars, "tree_clean": clean})


def _echo(value: Any) -> str:
    """``value`` for a one-line message: its repr cut to 60 characters (an int of 400 digits included)."""
    if isinstance(value, int) and abs(value) >= 10**60:
        return f"an integer of {len(str(abs(value)))} digits"
    return repr(value)[:60]


def _series(series: Any, source: str) -> tuple[list[int], list[float]]:
    """A scalar's (iterations, values): integer iterations, numbers or null (NaN) as values."""
    if (not isinstance(series, dict) or not isinstance(series.get("iterations"), list)
            or not isinstance(series.get("values"), list) or len(series["iterations"]) != len(series["values"])):
        raise LedgerError(f"{source}: expected {{iterations, values}} of equal length")
    bad_step = next((i for i in series["iterations"] if not isinstance(i, int) or isinstance(i, bool)
                     or not 0 <= i < MAX_COUNT), None)
    if bad_step is not None:
        raise LedgerError(f"{source}: iterations: expected integers from 0 to 2**53, got {_echo(bad_step)}")
    bad = next((v for v in series["values"] if v is not None and (not isinstance(v, (int, float))
                                                                  or isinstance(v, bool) or abs(v) > 1e300)), None)
    if bad is not None:
        raise LedgerError(f"{source}: values: expected numbers (or null), got {_echo(bad)}")
    return list(series["iterations"]), [math.nan if v is None else float(v) for v in series["values"]]


def dumps(data: Mapping[str, Any]) -> str:
    """Strict JSON, one line per key and per key of a mapping value (a scalar's series on one line):
    small files whose diffs read well."""
    def line(key: str, value: Any, indent: str) -> str:
        if isinstance(value, dict) and value:
            inner = ",\n".join(line(k, v, indent + " ") for k, v in value.items())
            return f"{indent}{json.dumps(key)}: {{\n{inner}\n{indent}}}"
        return f"{indent}{json.dumps(key)}: {json.dumps(value, allow_nan=False)}"
    return "{\n" + ",\n".join(line(key, value, " ") for key, value in data.items()) + "\n}\n"


def write_entry(entry: LedgerEntry, directory: Path) -> Path:
    """Write ``entry`` into ``directory`` (created), atomically; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / entry.file_name
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(dumps(to_json(entry)), encoding="utf-8")
    os.replace(tmp, path)
    return path


MAX_ENTRY_BYTES = 64 * 2**20  # a run's entry is tens of kB; a bigger file is not one


def read_json(path: Path) -> Any:
    """The parsed file ``path``; LedgerError (one line) for what is not a readable, bounded JSON file."""
    try:
        if not path.is_file():
            raise LedgerError(f"{path}: not a regular file")
        if path.stat().st_size > MAX_ENTRY_BYTES:
            raise LedgerError(f"{path}: {path.stat().st_size:,} bytes, above the {MAX_ENTRY_BYTES:,} an entry may have")
        return json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except (OSError, ValueError, RecursionError) as error:
        if isinstance(error, LedgerError):
            raise
        raise LedgerError(f"{path}: not readable as JSON ({type(error).__name__}: {str(error)[:80]})") from error


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: strict JSON writes null


def read_entry(path: Path) -> LedgerEntry:
    return from_json(read_json(path), str(path))


def read_ledger(directory: Path, refused: Optional[list[tuple[str, str]]] = None) -> list[LedgerEntry]:
    """Every entry under ``directory``, in path order. With ``refused``, an unreadable entry is left
    out and added to it as (path, why); without, it raises LedgerError."""
    if not directory.is_dir():
        raise LedgerError(f"ledger directory {str(directory)!r} does not exist")
    entries = []
    for path in sorted(directory.rglob(f"*{SUFFIX}")):
        if path.name.startswith("."):
            continue
        try:
            entries.append(read_entry(path))
        except LedgerError as error:
            if refused is None:
                raise
            refused.append((str(path), str(error)))
    return entries


def _listing(entries: Sequence[LedgerEntry]) -> tuple[int, int, str]:
    """(studies, corpora, "study S on corpus H: N runs, ...") of ``entries``."""
    groups: dict[tuple[str, str], int] = {}
    for entry in entries:
        key = (entry.study, entry.corpus_hash[:HASH_PREFIX])
        groups[key] = groups.get(key, 0) + 1
    text = ", ".join(f"study {study} on corpus {sha}: {n} runs" for (study, sha), n in sorted(groups.items()))
    return len({study for study, _ in groups}), len(groups), text


def select_entries(entries: Sequence[LedgerEntry], corpus: Optional[str] = None) -> list[LedgerEntry]:
    """The entries of one study on one corpus: those whose corpus hash starts with ``corpus`` when
    given; LedgerError when the rest still mixes studies or corpora, or names a run twice."""
    chosen = [entry for entry in entries if corpus is None or entry.corpus_hash.startswith(corpus)]
    if corpus is not None and not chosen:
        raise LedgerError(f"no ledger entry on a corpus whose hash starts with {corpus!r}; the ledger holds "
                          f"{_listing(entries)[2]}")
    studies, corpora, listing = _listing(chosen)
    if studies > 1:
        raise LedgerError(f"the ledger mixes studies ({listing}); give one study's directory")
    if corpora > 1:
        raise LedgerError(f"the ledger holds runs on different corpora, whose losses are not comparable ({listing}); "
                          f"pick one with --corpus HASH_PREFIX")
    names = [entry.run for entry in chosen]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise LedgerError(f"run(s) {', '.join(twice)} appear twice in the ledger on the same corpus; "
                          f"keep one file each")
    return chosen


# a module line that says nothing the model has to have, as entries recorded it (recipes/cli.py writes it)
NOT_QUANTIZED = ": not quantized"
# the GEMMs' accumulation when it is the exact sums every entry ran before recipes could say otherwise
# (recipes/cli.py's accumulation_line; a Hopper accumulator's line stays a difference)
EXACT_SUMS = "accumulate: exact"


def recipe_lines(lines: Sequence[str]) -> list[str]:
    """The lines of a resolution that say how operands are quantized, their spacing normalised."""
    return [" ".join(line.split()) for line in lines if isinstance(line, str) and not line.endswith(NOT_QUANTIZED)
            and not line.startswith(EXACT_SUMS)]


def recipe_change(then: Sequence[str], now: Sequence[str]) -> Optional[str]:
    """None when two resolutions of a recipe (``recipe_resolved``: ``recipes show``'s lines) quantize
    alike; else the first line that differs, as ``'was' -> 'now'``. Spacing is the table's layout, not
    the recipe; lines naming a module that stays unquantized are left out: they say nothing about the
    operands (a module the model may not even have), and a module that becomes quantized brings operand
    lines of its own."""
    kept = [recipe_lines(lines) for lines in (then, now)]
    if kept[0] == kept[1]:
        return None
    first = next((i for i, (a, b) in enumerate(zip(*kept)) if a != b), min(map(len, kept)))
    was, is_now = (lines[first] if first < len(lines) else "(nothing)" for lines in kept)
    return f"{was!r} -> {is_now!r}"


def entry_run(entry: LedgerEntry, label_device: bool = False, recipe_note: str = "") -> Run:
    """The runs report's ``Run`` of ``entry``: its scalars, and a run.json-like record."""
    scalars = {tag: (np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64))
               for tag, (steps, values) in entry.scalars.items()}
    record = {"status": entry.status, "recipe": entry.recipe, "git_commit": entry.commit,
              "machine": dict(entry.machine), "start_time": entry.start_time, "end_time": entry.end_time,
              "attempts": [], "device": entry.device, "corpus_sha256": entry.corpus_hash,
              "tree_clean": entry.tree_clean, "dirty_allowed": entry.dirty_allowed,
              "recipe_resolved": list(entry.recipe_resolved)}
    notes = ([f"ran on {entry.device}"] if label_device else []) + ([recipe_note] if recipe_note else [])
    return Run(entry.run, scalars, record, notes)


def ledger_runs(directory: Path, corpus: Optional[str] = None,
                skipped: Optional[list[tuple[str, str]]] = None) -> list[Run]:
    """The runs of the ledger in ``directory`` (one study, one corpus), labelled with their device
    when they ran on more than one; with ``skipped``, unreadable entries are left out into it."""
    entries = select_entries(read_ledger(directory, skipped), corpus)
    if not entries:
        raise LedgerError(f"no ledger entries (*{SUFFIX}) under {str(directory)!r}")
    several = len({entry.device for entry in entries}) > 1
    return [entry_run(entry, several, _recipe_note(entry, entries)) for entry in entries]


def _recipe_note(entry: LedgerEntry, entries: Sequence[LedgerEntry]) -> str:
    """What sets ``entry``'s recipe apart from the first entry of the same recipe (seeds compared
    across a change of its definition mix two recipes), or ''."""
    first = next(other for other in entries if other.recipe == entry.recipe)
    change = recipe_change(first.recipe_resolved, entry.recipe_resolved)
    return "" if change is None else (f"recipe {entry.recipe} resolved otherwise than in {first.run} "
                                      f"(commit {(first.commit or '?')[:8]} -> {(entry.commit or '?')[:8]}): {change}")
