"""Capture configuration: SaverConfig, its env-var grammar, the iteration window and the filters.

Every value is validated when the config is built; a bad one raises ``ValueError`` naming
the variable (env var or field), the value and what is allowed.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from megatron.quant.capture.inspect_config import InspectConfig, load_inspect_config
from megatron.quant.capture.whatif import parse_whatif
from megatron.quant.recipes.operands import ROLES
from megatron.quant.settings.environment import settings_of
from megatron.quant.settings.selectors import UNSIGNED_GRAMMAR, IndexSet, parse_selectors
from megatron.quant.settings.switches import switch_value, unknown_variables
from megatron.quant.stats import STATS_LEVELS

MODES = ("full", "stats")
# Tensor names the layers emit (docs/interfaces.md section 2; roles are operands.ROLES); filters reject others
# so that a typo cannot silently capture nothing.
LINEAR_TENSORS = ("input", "weight", "output", "grad_output", "grad_input", "grad_weight")
ATTENTION_TENSORS = ("query", "key", "value", "output", "grad_output", "grad_query", "grad_key", "grad_value")
# An MoE router's gating GEMM, and the tokens it routes to each expert (layers/router.py).
ROUTER_TENSORS = LINEAR_TENSORS + ("tokens_per_expert",)
KNOWN_TENSOR_NAMES = tuple(dict.fromkeys(ROUTER_TENSORS + ATTENTION_TENSORS))


def tensors_of_role(role: str) -> tuple[str, ...]:
    """The tensor names a module of ``role`` captures (core attention's differ from the GEMMs')."""
    return {"core_attention": ATTENTION_TENSORS, "router": ROUTER_TENSORS}.get(role, LINEAR_TENSORS)


def _bad(source: str, value: object, allowed: str) -> ValueError:
    return ValueError(f"{source}={value!r} is invalid; allowed: {allowed}")


def parse_bool(value: str, source: str) -> bool:
    switch = switch_value(value)
    if switch is None:
        raise _bad(source, value, "true/false, 1/0, yes/no, on/off")
    return switch


def _parse_int(text: str, source: str, whole: str, allowed: str) -> int:
    if not text.strip().isdigit():
        raise _bad(source, whole, allowed)
    return int(text)


def parse_index_set(value: str, source: str) -> IndexSet:
    """'0,1,15' or '0-3,7' -> {0, 1, 2, 3, 7}; ranges are inclusive and stay ranges (never listed)."""
    try:
        selectors = parse_selectors(value, signed=False)
    except ValueError as exc:
        raise _bad(source, value, f"{UNSIGNED_GRAMMAR} ({exc})") from None
    return IndexSet.from_selectors(selectors)


def _name_set_parser(known: tuple[str, ...]) -> Callable[[str, str], frozenset[str]]:
    def parse(value: str, source: str) -> frozenset[str]:
        names = frozenset(item.strip() for item in value.split(","))
        unknown = sorted(names - set(known))
        if unknown:
            raise _bad(source, value, f"comma-separated names from {', '.join(known)} (unknown: {', '.join(unknown)})")
        return names
    return parse


parse_roles = _name_set_parser(ROLES)
parse_tensor_names = _name_set_parser(KNOWN_TENSOR_NAMES)


_WINDOW_GRAMMAR = ("an iteration 'N', a list '0,10,100', an inclusive range '0-3' (lists and ranges "
                   "combine: '0-3,10'), or 'every:N' with N >= 1")


@dataclass(frozen=True)
class IterationWindow:
    """Which iterations to capture: a finite set, or every N-th iteration (i % N == 0)."""

    spec: str
    members: Optional[IndexSet] = None
    every: Optional[int] = None

    @classmethod
    def parse(cls, value: str, source: str = "iterations") -> "IterationWindow":
        text = value.strip()
        if text.startswith("every:"):
            step = _parse_int(text[len("every:"):], source, value, _WINDOW_GRAMMAR)
            if step < 1:
                raise _bad(source, value, _WINDOW_GRAMMAR)
            return cls(spec=text, every=step)
        try:
            return cls(spec=text, members=parse_index_set(text, source))
        except ValueError:
            raise _bad(source, value, _WINDOW_GRAMMAR) from None

    @classmethod
    def only(cls, iteration: int) -> "IterationWindow":
        return cls(spec=str(iteration), members=IndexSet.from_values([iteration]))

    def __contains__(self, iteration: int) -> bool:
        if self.every is not None:
            return iteration % self.every == 0
        return iteration in self.members

    def last(self) -> Optional[int]:
        """The last iteration of a finite window; None for 'every:N'."""
        return None if self.members is None else self.members.max()

    def restricted_to(self, first: int, end: Optional[int]) -> "IterationWindow":
        """The members that lie in the run's iterations [first, end) (end None: unbounded)."""
        if self.every is not None and end is None:
            return self
        if self.every is not None:
            members = IndexSet.from_values(range(first + -first % self.every, end, self.every))
        else:
            members = self.members.clip(first, None if end is None else end - 1)
        return IterationWindow(spec=self.spec, members=members)

    def is_empty(self) -> bool:
        return self.members is not None and not self.members


def _parse_positive_float(value: str, source: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not number > 0 or number == float("inf"):
        raise _bad(source, value, "a positive number, e.g. 0.5 or 20")
    return number


def _parse_positive_int(value: str, source: str) -> int:
    number = _parse_int(value, source, value, "a positive integer")
    if number < 1:
        raise _bad(source, value, "a positive integer")
    return number


def _parse_mode(value: str, source: str) -> str:
    if not isinstance(value, str) or value.strip() not in MODES:
        raise _bad(source, value, " or ".join(MODES))
    return value.strip()


def _parse_stats_level(value: str, source: str) -> str:
    if not isinstance(value, str) or value.strip() not in STATS_LEVELS:
        raise _bad(source, value, " or ".join(STATS_LEVELS))
    return value.strip()


def _parse_dir(value: str, source: str) -> str:
    if not value.strip():
        raise _bad(source, value, "a directory path")
    return value


# field name -> (env var, parser of its string form)
_ENV: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "enabled": ("TENSOR_SAVE_ENABLED", parse_bool),
    "save_dir": ("TENSOR_SAVE_DIR", _parse_dir),
    "iterations": ("TENSOR_SAVER_ITERATION", IterationWindow.parse),
    "layers": ("TENSOR_SAVE_LAYERS", parse_index_set),
    "roles": ("TENSOR_SAVE_ROLES", parse_roles),
    "tensors": ("TENSOR_SAVE_TENSORS", parse_tensor_names),
    "ranks": ("TENSOR_SAVE_RANKS", parse_index_set),
    "microbatches": ("TENSOR_SAVE_MICROBATCHES", parse_index_set),
    "mode": ("TENSOR_SAVE_MODE", _parse_mode),
    "max_gb": ("TENSOR_SAVE_MAX_GB", _parse_positive_float),
    "save_quantized": ("TENSOR_SAVE_QUANTIZED", parse_bool),
    "exit_after_capture": ("TENSOR_SAVE_EXIT_AFTER", parse_bool),
    "queue_mb": ("TENSOR_SAVE_QUEUE_MB", _parse_positive_int),
    "stats": ("TENSOR_SAVE_STATS", _parse_stats_level),
    "whatif": ("TENSOR_SAVE_WHATIF", parse_whatif),
    "block_scales": ("TENSOR_SAVE_BLOCK_SCALES", parse_bool),
    "inspect": ("TENSOR_INSPECT_CONFIG", load_inspect_config),
}
# What an inspect config decides itself (its sections' layers, tensors and steps; dumps per tensor).
_INSPECT_DECIDES = ("iterations", "layers", "roles", "tensors", "mode", "save_quantized", "exit_after_capture")
_SET_FIELDS = ("layers", "roles", "tensors", "ranks", "microbatches")
# index filter -> what it counts, for check_selectors
_COUNTED = {"layers": "transformer layers", "ranks": "ranks", "microbatches": "micro-batches per iteration"}


ENV_VARS = tuple(env for env, _ in _ENV.values())
_DEFAULTS: dict[str, object] = {}  # the fields' defaults, filled below the class
_ENV_PREFIXES = ("TENSOR_SAVE_", "TENSOR_SAVER_")


@dataclass(frozen=True)
class SaverConfig:
    """What to capture and where. Fields given as strings are parsed with the env-var grammar.

    iterations None means the first iteration the run executes. A filter None means "all".
    """

    enabled: bool = False
    save_dir: str = "./enhanced_tensor_logs"
    iterations: Optional[IterationWindow] = None
    layers: Optional[IndexSet] = None
    roles: Optional[frozenset[str]] = None
    tensors: Optional[frozenset[str]] = None
    ranks: Optional[IndexSet] = None
    microbatches: Optional[IndexSet] = None
    mode: str = "full"
    max_gb: Optional[float] = None
    save_quantized: bool = False
    exit_after_capture: bool = False
    queue_mb: int = 1024  # bound on tensor bytes waiting for the background writer
    stats: str = "full"  # statistics level: counts, sample or full (megatron.quant.stats.levels.capture_stats)
    whatif: tuple[str, ...] = ()  # formats, presets or TE recipes each GEMM operand's statistics are also taken under
    block_scales: bool = True  # stats mode: per-block statistics of block formats (capture/extras.py)
    inspect: Optional[InspectConfig] = None  # an nvdlfw-inspect config (capture/inspect_config.py): turns capture on

    def __post_init__(self) -> None:
        for name, (_, parse) in _ENV.items():
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, parse(value, f"SaverConfig.{name}"))
            elif name in _SET_FIELDS and value is not None and not isinstance(value, IndexSet):
                object.__setattr__(self, name, parse(",".join(map(str, sorted(value))), f"SaverConfig.{name}"))
            elif name == "iterations" and isinstance(value, int):
                object.__setattr__(self, name, IterationWindow.only(value))
        # Typed values get the same checks as strings, through their string form.
        _parse_mode(self.mode, "SaverConfig.mode")
        if self.max_gb is not None:
            _parse_positive_float(str(self.max_gb), "SaverConfig.max_gb")
        _parse_positive_int(str(self.queue_mb), "SaverConfig.queue_mb")
        _parse_stats_level(self.stats, "SaverConfig.stats")
        if self.inspect is not None:
            given = [_ENV[name][0] for name in _INSPECT_DECIDES if getattr(self, name) != _DEFAULTS[name]]
            if given:
                raise ValueError(f"{self.inspect.source}: the inspect config chooses the layers, tensors and steps; "
                                 f"unset {', '.join(given)}")
            object.__setattr__(self, "enabled", True)

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "SaverConfig":
        """Read the TENSOR_SAVE_* variables; unset or empty ones keep their defaults."""
        environ = settings_of(environ)
        unknown = unknown_variables(environ, _ENV_PREFIXES, ENV_VARS, "capture")
        if unknown:
            raise ValueError(unknown)
        values = {}
        for name, (env, parse) in _ENV.items():
            raw = environ.get(env, "")
            if raw.strip():
                values[name] = parse(raw, env)
        if "inspect" in values and values.get("enabled") is False:
            raise ValueError(f"TENSOR_SAVE_ENABLED={environ['TENSOR_SAVE_ENABLED']!r} and TENSOR_INSPECT_CONFIG: an "
                             f"inspect config turns capture on; unset one of them")
        return cls(**values)

    def check_selectors(self, *, num_layers: int, world_size: int, num_microbatches: Optional[int] = None,
                        roles: Optional[tuple[str, ...]] = None) -> None:
        """Check the filters against the run, once it is known (capture off: nothing to check);
        ``roles``: those of the run's capturing modules (``QuantRecipe.capture_roles``).

        ValueError when a filter can match nothing (the run would exit "successfully" with no capture);
        one RuntimeWarning per filter naming the members that lie outside the run.
        """
        if not self.enabled:
            return
        if roles is not None:
            self._check_names(roles)
        counts = {"layers": num_layers, "ranks": world_size, "microbatches": num_microbatches}
        for name, count in counts.items():
            chosen = getattr(self, name)
            if chosen is None or count is None:
                continue
            env, outside = _ENV[name][0], chosen.clip(count, None)
            run = f"the run has {count} {_COUNTED[name]} (0-{count - 1})"
            if outside == chosen:
                raise ValueError(f"{env}={outside} can never match: {run}")
            if outside:
                warnings.warn(f"{env}: {outside} ignored, {run}", RuntimeWarning, stacklevel=2)

    def _check_names(self, run_roles: tuple[str, ...]) -> None:
        """Roles against the run's capturing modules, then tensor names against what those roles emit."""
        roles = run_roles if self.roles is None else tuple(r for r in run_roles if r in self.roles)
        if self.roles is not None:
            _check_overlap("TENSOR_SAVE_ROLES", self.roles, roles, f"the run captures roles {', '.join(run_roles)}"
                           + ("" if "output_layer" in run_roles else " (output_layer only when the recipe "
                              "quantizes it)"))
        if self.tensors is not None:
            emitted = tuple(dict.fromkeys(name for role in roles for name in tensors_of_role(role)))
            _check_overlap("TENSOR_SAVE_TENSORS", self.tensors, emitted,
                           f"roles {', '.join(roles)} capture {', '.join(emitted)}")


_DEFAULTS.update({name: field.default for name, field in SaverConfig.__dataclass_fields__.items()})


def _check_overlap(env: str, chosen: frozenset[str], available: tuple[str, ...], run: str) -> None:
    outside = sorted(chosen - set(available))
    if len(outside) == len(chosen):
        raise ValueError(f"{env}={','.join(outside)} can never match: {run}")
    if outside:
        warnings.warn(f"{env}: {','.join(outside)} ignored, {run}", RuntimeWarning, stacklevel=4)
