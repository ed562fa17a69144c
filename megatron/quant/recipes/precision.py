"""Per-module precision as megatron-core states it: ``TransformerConfig.quant_recipe``.

megatron-core's ``RecipeConfig`` (``megatron/core/quantization/quant_config.py``) holds named
``configs`` and an ordered list of ``matchers`` (glob on the module path, first match wins);
``GPTModel`` matches every module that has ``finish_init`` and hands it the matched config
(``get_quant_config_or_none``), logging the modules no matcher takes. ``PrecisionConfig`` is that
class with our recipes as the configs' payloads, parsed once when the config is made, so a module
resolves its formats from an already checked ``QuantRecipe``.

The lab's own recipe (``CUSTOM_QUANT_*``, a recipe file) is the one-matcher case: ``uniform``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable, Mapping, Optional

from megatron.core.quantization.quant_config import (
    GlobMatcher,
    MatchContext,
    Matcher,
    QuantizationConfig,
    RecipeConfig,
)

from megatron.quant.formats.base import NumericFormat
from megatron.quant.formats.interface import QuantFormat
from megatron.quant.recipes.operands import ROLES
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.recipes.schedule import ScheduleError

ALL_MODULES = "*"


class PrecisionConfig(RecipeConfig):
    """megatron-core's RecipeConfig whose configs are ``QuantRecipe`` objects.

    Equal format choices of modules matched to the same config share one built format (and, with
    ``compile``, its kernels), as ``QuantRecipe.resolve``'s ``shared`` does within one recipe.
    """

    configs: dict[str, QuantRecipe]

    def __init__(self, matchers: list[Matcher], configs: Mapping[str, QuantRecipe], name: str, source: str):
        super().__init__(list(matchers), dict(configs))
        self.name = name  # the capture quant_type: one capture directory for the run
        self.source = source
        self._built: dict[str, dict] = {}  # config key -> FormatChoice -> built format

    @classmethod
    def uniform(cls, recipe: QuantRecipe) -> "PrecisionConfig":
        """Every module matched to ``recipe`` (the lab's own recipe language)."""
        return cls([GlobMatcher(ALL_MODULES, recipe.name)], {recipe.name: recipe}, recipe.name, recipe.name)

    def with_seed(self, seed: int) -> "PrecisionConfig":
        """Each recipe without a seed of its own takes ``seed`` (a training run's ``--seed``)."""
        configs = {key: recipe if recipe.seed is not None else replace(recipe, seed=seed)
                   for key, recipe in self.configs.items()}
        return type(self)(self.matchers, configs, self.name, self.source)

    def with_exact_sums(self) -> "PrecisionConfig":
        """Every recipe adds its GEMMs' products exactly in FP32 (CUSTOM_QUANT_ACCUMULATE=exact)."""
        configs = {key: replace(recipe, accumulate=()) for key, recipe in self.configs.items()}
        return type(self)(self.matchers, configs, self.name, self.source)

    def with_kernels(self, kernels: str) -> "PrecisionConfig":
        """Every recipe quantizes through the kernel path ``kernels`` (the run's CUSTOM_QUANT_KERNELS)."""
        configs = {key: replace(recipe, kernels=kernels) for key, recipe in self.configs.items()}
        return type(self)(self.matchers, configs, self.name, self.source)

    def for_run(self, train_iters: int, num_layers: int) -> "PrecisionConfig":
        """Each scheduled recipe's phases placed in a run of ``train_iters`` iterations of a
        ``num_layers``-layer model: ScheduleError for a switch past the end, overlapping phases
        (``Schedule.bind``) or delayed scaling (a module registers its amax histories once, per operand,
        not per phase)."""
        configs = dict(self.configs)
        for key, recipe in self.configs.items():
            if not recipe.schedule:
                continue
            where = recipe.name if self.source == recipe.name else f"{self.source}: {recipe.name}"
            delayed = _delayed_phase(recipe, num_layers)
            if delayed is not None:
                raise ScheduleError(f"{where}: {delayed[0]}: a recipe that changes during the run cannot use delayed "
                                    f"scaling ({delayed[1]}: its amax histories belong to the operands, not to a "
                                    f"phase); use current scaling (scaling: tensor)")
            configs[key] = replace(recipe, schedule=recipe.schedule.bind(train_iters, where))
        return type(self)(self.matchers, configs, self.name, self.source)

    def schedules(self) -> dict[str, str]:
        """Config key -> its schedule's description, for the recipes that change during the run."""
        return {key: recipe.schedule.describe() for key, recipe in self.configs.items() if recipe.schedule}

    def recipe(self, matched: QuantizationConfig) -> QuantRecipe:
        """The recipe a module's matched config names (megatron-core hands modules a copy)."""
        return self.configs[matched.config_key]

    def resolve_phases(self, matched: QuantizationConfig, role: str, layer_idx: int, num_layers: int,
                       build: Callable[[NumericFormat], QuantFormat] = lambda fmt: fmt
                       ) -> list[dict[str, Optional[QuantFormat]]]:
        """Operand key -> built format for the module ``matched`` was made for, per phase of its
        recipe's schedule (``QuantRecipe.resolve_phases``; one without a schedule); ``build`` as there."""
        shared = self._built.setdefault(matched.config_key, {})
        return self.recipe(matched).resolve_phases(role, layer_idx, num_layers, shared, build)

    def formats(self, num_layers: int) -> list[NumericFormat]:
        """Every distinct format some module may quantize with (``QuantRecipe.formats``, over the configs)."""
        found = {repr(f): f for recipe in self.configs.values() for f in recipe.formats(num_layers)}
        return [found[key] for key in sorted(found)]

    @property
    def compile(self) -> bool:
        """Some config quantizes through torch.compile."""
        return any(recipe.compile for recipe in self.configs.values())

    def capture_roles(self, num_layers: int, moe: bool = False, mla: bool = False) -> tuple[str, ...]:
        """The roles of the modules that capture (``QuantRecipe.capture_roles``, over the configs)."""
        roles = {role: None for recipe in self.configs.values()
                 for role in recipe.capture_roles(num_layers, moe, mla)}
        return tuple(roles)

    def matcher_problems(self, paths: Iterable[str]) -> list[str]:
        """One line per matcher that decides no module of ``paths`` (the model's matched modules): one that
        matches none of them (a typo in a pattern trains those modules in another precision, silently),
        or one shadowed by earlier matchers (first match wins: every module it matches is taken)."""
        paths = list(paths)
        taken: set[str] = set()
        problems = []
        for i, matcher in enumerate(self.matchers):
            matched = {p for p in paths if matcher.match(MatchContext(p, None)) is not None}
            shown = _matcher_name(matcher)
            if not matched:
                problems.append(f"{self.source}: matcher {shown} matches no module of the model; its config "
                                f"{matcher.config_key!r} quantizes nothing (modules: {_some(paths)})")
            elif matched <= taken:
                problems.append(f"{self.source}: matcher {shown} is shadowed: every module it matches is taken by "
                                f"an earlier matcher (first match wins), so its config {matcher.config_key!r} "
                                f"quantizes nothing")
            taken |= matched
        return problems

    def describe(self) -> str:
        """One line: each matcher's pattern and config, in matching order."""
        pairs = [f"{m.pattern} -> {m.config_key}" for m in self.matchers if isinstance(m, GlobMatcher)]
        return f"{self.source}: " + ", ".join(pairs)


def _delayed_phase(recipe: QuantRecipe, num_layers: int) -> Optional[tuple[str, str]]:
    """(the phase's name, its formats) of the first phase of ``recipe`` that some module runs with delayed scaling."""
    found: dict[int, set[str]] = {}
    for role in ROLES:
        for layer in range(num_layers):
            for phase, choices in enumerate(recipe.phase_choices(role, layer, num_layers)):
                found.setdefault(phase, set()).update(
                    c.name for c in choices.values() if dict(c.options).get("scaling") == "delayed")
    first = min((phase for phase, names in found.items() if names), default=None)
    return None if first is None else (recipe.schedule.phase_names()[first], ", ".join(sorted(found[first])))


def _matcher_name(matcher: Matcher) -> str:
    return f"{matcher.pattern!r}" if isinstance(matcher, GlobMatcher) else repr(matcher)


def _some(paths: list[str]) -> str:
    return ", ".join(paths[:4]) + (f", ... ({len(paths)} in all)" if len(paths) > 4 else "")
