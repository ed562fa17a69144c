"""QuantRecipe: which numeric format each GEMM operand of each module gets.

A recipe is parsed and validated once (from CUSTOM_QUANT_TYPE / CUSTOM_QUANT_SCOPE /
CUSTOM_QUANT_RECIPE, a dict, or Python) and resolved once per module at model build
(``resolve``); the layers never look anything up per call.

A top-level ``format`` may name a preset (``megatron.quant.recipes.presets``, e.g. ``te-nvfp4``): the
preset's recipe dict, with the other given keys merged over it (``presets.merge_preset``).

Reading (environment, file, dict) and its checks live in ``parse``, which hands this module the
recipe's fields; the parts (``FormatChoice``, ``Rule``) live in ``rules``.

Resolution for one module: start from ``format`` for the operands that ``scope`` covers
(none for the others), apply the global per-operand ``operands`` overrides, then every
matching rule in order (later rules win).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Optional

from megatron.quant import formats
from megatron.quant.formats.base import NumericFormat
from megatron.quant.formats.interface import QuantFormat
from megatron.quant.recipes import parse
from megatron.quant.recipes.operands import (
    BACKWARD_LINEAR_OPERANDS,
    FORWARD_TWINS,
    LINEAR_BY_KEY,
    LINEAR_GEMMS,
    LINEAR_ROLES,
    MLA_ROLES,
    NAMED_ONLY_ROLES,
    ROLES,
    SCOPES,
    operands_for_role,
)
from megatron.quant.recipes.parse import RecipeError, check_env_names
from megatron.quant.recipes.rules import DEFAULT_SCOPE, PASSTHROUGH_DEFAULT, FormatChoice, Rule
from megatron.quant.recipes.schedule import Schedule, ScheduleError, parse_schedule, phase_recipe_value
from megatron.quant.settings.environment import settings_of

__all__ = ["QuantRecipe", "RecipeError", "check_env_names"]  # the errors and the check callers take from here


@dataclass(frozen=True)
class QuantRecipe:
    """Immutable description of a quantization experiment; ``name`` is the capture quant_type."""

    name: str
    format: FormatChoice = FormatChoice(PASSTHROUGH_DEFAULT)
    scope: frozenset[str] = frozenset(DEFAULT_SCOPE)
    operands: tuple[tuple[str, FormatChoice], ...] = ()
    rules: tuple[Rule, ...] = field(default=())
    compile: bool = False  # quantize through torch.compile (round-to-nearest formats)
    seed: Optional[int] = None  # keys stochastic rounding (None: the run's --seed; 0 outside training)
    # Phases with other formats and the evaluation recipe (``recipes.schedule``); run.json shows it apart
    # (``PrecisionConfig.schedules``), so a recipe's repr there is unchanged without one.
    schedule: Schedule = field(default=Schedule(), repr=False)
    # Transformer Engine's per-direction settings of the linear layers' GEMMs. ``backward_override``:
    # "high_precision" leaves every backward operand unquantized (the input precision); "dequantized"
    # does too, the input and the weight being the forward's dequantized operands. ``dequantized_roles``
    # (``columnwise_source: {ROLE: rowwise_dequantized}``): those tensors' backward operands are quantized
    # from the forward's dequantized operand instead of the original tensor (TE's hybrid quantizers).
    backward_override: Optional[str] = None
    dequantized_roles: frozenset[str] = frozenset()
    # How the linear GEMMs add their products (``formats.accumulation``): (gemm, "fast" | "promoted") for
    # those that take a Hopper FP8 tensor core's accumulator; the others accumulate exactly in FP32.
    accumulate: tuple[tuple[str, str], ...] = ()
    # The kernel path a training run's configuration chose (CUSTOM_QUANT_KERNELS, ``kernels.select``);
    # None: the environment's, read when the layers are built. Not a recipe key: it says how, not what.
    kernels: Optional[str] = field(default=None, repr=False)

    # ---- construction: ``parse`` reads, this builds ------------------------------------
    @classmethod
    def uniform(cls, fmt_name: str, scope: Iterable[str] = DEFAULT_SCOPE, *, compile: bool = False,
                **options: Any) -> "QuantRecipe":
        """One format (with ``options``) for every operand in ``scope``."""
        return cls(**parse.uniform_fields(fmt_name, scope, compile, options))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>",
                  defaults: Optional[Mapping[str, Any]] = None) -> "QuantRecipe":
        """Parse the recipe schema (see docs/recipes.md); ``defaults`` fill keys ``data`` omits."""
        fields = parse.recipe_fields(data, source, defaults)
        phases, evaluation = fields.pop("schedule")
        scope = sorted(fields["scope"])

        def build(value: Any, path: str) -> "QuantRecipe":
            phase = parse.recipe_fields(phase_recipe_value(value, scope), f"{source}: {path}")
            if any(part is not None for part in phase.pop("schedule")):
                raise ScheduleError(f"{source}: {path}: a phase's recipe has a schedule or evaluation of its own")
            return cls(**phase)

        return cls(**fields, schedule=parse_schedule(phases, evaluation, source, build))

    @classmethod
    def from_file(cls, path: str | os.PathLike, defaults: Optional[Mapping[str, Any]] = None,
                  source: Optional[str] = None) -> "QuantRecipe":
        """Load a ``.yaml``/``.yml``/``.json`` UTF-8 recipe; ``name`` defaults to the file stem.
        ``source`` names it in errors (default: the path; e.g. ``CUSTOM_QUANT_RECIPE=path``)."""
        data, source = parse.read_file(path, source)
        return cls.from_dict(data, source=source, defaults=defaults)

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "QuantRecipe":
        """CUSTOM_QUANT_RECIPE (file) or CUSTOM_QUANT_TYPE (default bf16) with CUSTOM_QUANT_SCOPE
        and CUSTOM_QUANT_COMPILE.

        With a recipe file, the other variables fill only the keys the file omits.
        """
        defaults, path, source = parse.env_sources(settings_of(environ))
        if path is not None:
            return cls.from_file(path, defaults=defaults, source=source)
        return cls.from_dict(defaults, source=source)

    # ---- resolution ---------------------------------------------------------------------
    def choices(self, role: str, layer_idx: int, num_layers: int) -> dict[str, FormatChoice]:
        """Format choice per operand key of a module with ``role`` at 0-based ``layer_idx``."""
        if role not in ROLES:
            raise ValueError(f"unknown module role {role!r}; valid: {', '.join(ROLES)}")
        keys = operands_for_role(role)
        in_scope = {k for s in self.scope for k in SCOPES[s]} if role not in NAMED_ONLY_ROLES else set()
        none = FormatChoice("none")
        chosen = {k: self.format if k in in_scope else none for k in keys}
        for key, override in self.operands:
            if key in chosen and key in in_scope:
                chosen[key] = override.over(chosen[key])
        for rule in self.rules:
            if not rule.matches(role, layer_idx, num_layers):
                continue
            if rule.format is not None:
                chosen = {k: rule.format for k in keys}
            for key, override in rule.operands:
                if key in chosen:
                    chosen[key] = override.over(chosen[key])
        if self.backward_override is not None:
            chosen.update({key: none for key in BACKWARD_LINEAR_OPERANDS if key in chosen})
        return chosen

    def accumulation(self) -> dict[str, str]:
        """Linear GEMM ("fprop", "dgrad", "wgrad") -> its accumulation (``formats.accumulation.ACCUMULATIONS``)."""
        return {gemm: dict(self.accumulate).get(gemm, "exact") for gemm in LINEAR_GEMMS}

    def dequantized_sources(self) -> frozenset[str]:
        """The backward linear operands taken from their forward twin's dequantized operand
        (``operands.FORWARD_TWINS``) rather than from the original tensor."""
        if self.backward_override == "dequantized":
            return frozenset(FORWARD_TWINS)
        return frozenset(key for key in FORWARD_TWINS if LINEAR_BY_KEY[key].role in self.dequantized_roles)

    def resolve(self, role: str, layer_idx: int, num_layers: int,
                shared: Optional[dict[FormatChoice, QuantFormat]] = None,
                build: Callable[[NumericFormat], QuantFormat] = lambda fmt: fmt) -> dict[str, Optional[QuantFormat]]:
        """Operand key -> format, or None where nothing is fake-quantized.

        A recipe is data: it names formats and options, and ``build`` turns each format into what runs
        it (the layers pass the kernel path's wrapper, ``layers.module_quant.format_builder``; by
        default the format itself). ``shared``: formats already built for other modules of the same
        model, reused (and extended) so that equal choices share one instance (and its kernels).
        """
        return self.resolve_phases(role, layer_idx, num_layers, shared, build)[0]

    def phase_choices(self, role: str, layer_idx: int, num_layers: int) -> list[dict[str, FormatChoice]]:
        """``choices`` per phase of the schedule (``Schedule.phase_of``'s index; one without a schedule)."""
        return self.schedule.choices(self.choices(role, layer_idx, num_layers),
                                     lambda recipe: recipe.choices(role, layer_idx, num_layers))

    def resolve_phases(self, role: str, layer_idx: int, num_layers: int,
                       shared: Optional[dict[FormatChoice, QuantFormat]] = None,
                       build: Callable[[NumericFormat], QuantFormat] = lambda fmt: fmt
                       ) -> list[dict[str, Optional[QuantFormat]]]:
        """``resolve`` per phase of the schedule (``Schedule.phase_of``'s index)."""
        shared = {} if shared is None else shared
        return [{key: self._build(c, shared, build) for key, c in chosen.items()}
                for chosen in self.phase_choices(role, layer_idx, num_layers)]

    def quantizes_output_layer(self, num_layers: int) -> bool:
        """Whether a rule gives the output layer (LM head) a format: only then is it a quantized,
        capturing module."""
        return any(not formats.is_passthrough(c.name) for c in self.choices("output_layer", -1, num_layers).values())

    def quantizes_router(self, num_layers: int) -> bool:
        """Whether a rule gives some layer's MoE router a format (routers stay high precision otherwise)."""
        return any(not formats.is_passthrough(c.name) for layer in range(num_layers)
                   for c in self.choices("router", layer, num_layers).values())

    def capture_roles(self, num_layers: int, moe: bool = False, mla: bool = False) -> tuple[str, ...]:
        """The roles of the modules that capture: every decoder layer's (with ``moe``, the MoE routers': they
        record the tokens each expert receives; with ``mla``, multi-latent attention's projections instead of
        ``qkv``), and the output layer's when it is quantized."""
        linear = tuple(role for role in LINEAR_ROLES if role != "qkv") + MLA_ROLES if mla else LINEAR_ROLES
        return (*linear, "core_attention") + (("router",) if moe else ()) + (
            ("output_layer",) if self.quantizes_output_layer(num_layers) else ())

    def formats(self, num_layers: int) -> list[NumericFormat]:
        """Every distinct format the recipe quantizes with (plain ``NumericFormat`` objects)."""
        chosen = {c for role in ROLES for layer in range(num_layers)
                  for phase in self.phase_choices(role, layer, num_layers)
                  for c in phase.values() if not formats.is_passthrough(c.name)}
        return [formats.get_format(c.name, **dict(c.options)) for c in sorted(chosen, key=repr)]

    def unquantized_layers(self, num_layers: int) -> list[int]:
        """0-based decoder layers whose linear GEMMs rules leave unquantized although the recipe
        without its rules quantizes them (e.g. first and last layers kept in bf16)."""
        def quantized(recipe: QuantRecipe, layer: int) -> bool:
            return any(not formats.is_passthrough(c.name)
                       for role in LINEAR_ROLES for c in recipe.choices(role, layer, num_layers).values())

        if not quantized(replace(self, rules=()), 0):
            return []
        return [layer for layer in range(num_layers) if not quantized(self, layer)]

    @staticmethod
    def _build(choice: FormatChoice, shared: dict[FormatChoice, QuantFormat],
               build: Callable[[NumericFormat], QuantFormat]) -> Optional[QuantFormat]:
        if formats.is_passthrough(choice.name):
            return None
        if choice not in shared:
            shared[choice] = build(formats.get_format(choice.name, **dict(choice.options)))
        return shared[choice]
