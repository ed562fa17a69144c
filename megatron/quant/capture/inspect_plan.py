"""An ``InspectConfig`` resolved against a run: which layers each section takes, what each capture
records at each step, and the recipe rules ``DisableQuantizationGEMM``, ``FakeQuant``, ``PerTensorScaling``
and features of your own stand for (``describe`` is the start line's account of them).

Layers are the run's linear modules, named as megatron-core names them (``decoder.layers.0.mlp.
linear_fc1``; TE's debug features see linear layers only). TE's tensors are the lab's captures
(``TENSORS``); TE's steps count from 0 at the run's first iteration, as Megatron-LM steps its debug
API after each iteration: step = iteration - 1. Every check that needs the run (a selector that matches
no layer, a layer in two sections, a run-recipe statistic of an unquantized operand) fails here, before
the model is built, in one line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Optional

from megatron.core.quantization.quant_config import MatchContext

from megatron.quant import formats
from megatron.quant.capture.extras import ExtraNeeds
from megatron.quant.capture.inspect_config import FeatureEntry, InspectConfig, InspectConfigError, StatRequest
from megatron.quant.capture.whatif import COLUMNWISE, ORIENTATIONS, RUN, WhatIfFormats
from megatron.quant.recipes.operands import LINEAR_ROLES, LINEAR_TABLE
from megatron.quant.recipes.precision import PrecisionConfig
from megatron.quant.recipes.rules import FormatChoice, Rule
from megatron.quant.settings.selectors import Selector

# TE's tensor -> (the lab's capture name, the pass that captures it)
TENSORS = {"activation": ("input", "forward"), "weight": ("weight", "forward"), "output": ("output", "forward"),
           "gradient": ("grad_output", "backward"), "dgrad": ("grad_input", "backward"),
           "wgrad": ("grad_weight", "backward")}
TE_TENSOR = {capture: te for te, capture in TENSORS.items()}
GEMM_OPERANDS = {gemm: tuple(op.key for op in LINEAR_TABLE if op.gemm == gemm) for gemm in ("fprop", "dgrad", "wgrad")}
MODULE_PATHS = {"qkv": "self_attention.linear_qkv", "proj": "self_attention.linear_proj", "fc1": "mlp.linear_fc1",
                "fc2": "mlp.linear_fc2"}
DISABLING = ("DisableQuantizationGEMM", "DisableFP8GEMM", "DisableQuantizationLayer", "DisableFP8Layer")
PASSTHROUGH = FormatChoice("bf16")
# TE's PerTensorScaling needs a Float8Quantizer (DelayedScaling); these options are delayed scaling's own
DELAYED_OPTIONS = ("scaling", "amax_history_len", "amax_compute_algo", "margin")
PER_TENSOR_FORMATS = ("fp8_e4m3", "fp8_e5m2")
_DECODER = re.compile(r"decoder\.layers\.(\d+)\.(.+)")


def linear_modules(num_layers: int, roles: Iterable[str]) -> dict[str, tuple[str, int]]:
    """The run's linear modules: path -> (role, 0-based layer; -1 for the output layer)."""
    modules = {f"decoder.layers.{i}.{MODULE_PATHS[role]}": (role, i)
               for i in range(num_layers) for role in LINEAR_ROLES}
    if "output_layer" in roles:
        modules["output_layer"] = ("output_layer", -1)
    return modules


def section_layers(config: InspectConfig, modules: Iterable[str]) -> dict[str, list[str]]:
    """Section name -> the modules it takes; InspectConfigError when one takes none or a module two."""
    modules = list(modules)
    taken: dict[str, str] = {}
    result = {}
    for section in config.sections:
        matched = [m for m in modules if section.layers.matches(m)]
        if not matched:
            shown = ", ".join(modules[:6]) + (", ..." if len(modules) > 6 else "")
            raise InspectConfigError(f"{config.source}: section {section.name}: {section.layers.describe()} matches "
                                     f"no layer; the run's layers: {shown}")
        for module in matched:
            if module in taken:
                raise InspectConfigError(f"{config.source}: layer {module} is in sections {taken[module]} and "
                                         f"{section.name}; each layer belongs to one section")
            taken[module] = section.name
        result[section.name] = matched
    return result


def section_operands(config: InspectConfig, modules: Mapping[str, tuple[str, int]],
                     choices: Mapping[str, Mapping[str, FormatChoice]]) -> dict[str, dict[str, FormatChoice]]:
    """Module path -> the operand choices its section changes, over the run's ``choices``: the disabled
    GEMMs' operands in BF16, then each translated feature's (``inspect_features``) in the config's order."""
    layers = section_layers(config, modules)
    changed: dict[str, dict[str, FormatChoice]] = {}
    for section in config.sections:
        gemms = dict.fromkeys(e.gemm for e in section.entries if e.feature in DISABLING)
        if not gemms and not section.translations:
            continue
        for module in layers[section.name]:
            run = choices.get(module, {})
            final = {key: PASSTHROUGH for gemm in gemms for key in GEMM_OPERANDS[gemm]}
            for translation in section.translations:
                final.update(translation.operands)
                for key in translation.rescaled:
                    final[key] = _per_tensor(final.get(key, run.get(key)), module, key, config.source, section.name)
            changed[module] = final
    return changed


def _per_tensor(choice: Optional[FormatChoice], module: str, key: str, source: str, section: str) -> FormatChoice:
    options = dict(choice.options) if choice is not None else {}
    if choice is None or choice.name not in PER_TENSOR_FORMATS or options.get("scaling") != "delayed":
        shown = "no quantization" if choice is None else f"{choice.name} ({options.get('scaling', 'tensor')} scaling)"
        raise InspectConfigError(f"{source}: section {section}: PerTensorScaling of {module}'s {key}: TE allows it "
                                 f"only under delayed scaling (a Float8Quantizer), the run gives {shown}; run "
                                 f"te-fp8-delayed (--fp8-recipe delayed)")
    return FormatChoice(choice.name, tuple((k, v) for k, v in choice.options if k not in DELAYED_OPTIONS))


def section_rules(changed: Mapping[str, Mapping[str, FormatChoice]], modules: Mapping[str, tuple[str, int]],
                  choices: Mapping[str, Mapping[str, FormatChoice]]) -> tuple[Rule, ...]:
    """``section_operands`` as recipe rules, one per module; each names every operand's whole choice
    over BF16, so the run's options (a delayed scaling's history) do not merge into a changed one."""
    rules = []
    for module, operands in changed.items():
        role, layer = modules[module]
        where = None if layer < 0 else (Selector(layer, None),)
        whole = {**choices[module], **operands}
        rules.append(Rule(roles=frozenset({role}), layers=where, format=PASSTHROUGH, operands=tuple(whole.items())))
    return tuple(rules)


def with_rules(precision: PrecisionConfig, rules: tuple[Rule, ...]) -> PrecisionConfig:
    """``precision`` with ``rules`` after each config's own (they win)."""
    if not rules:
        return precision
    configs = {key: replace(recipe, rules=recipe.rules + rules) for key, recipe in precision.configs.items()}
    return PrecisionConfig(precision.matchers, configs, precision.name, precision.source)


def run_choices(precision: PrecisionConfig, modules: Mapping[str, tuple[str, int]],
                num_layers: int) -> dict[str, dict[str, FormatChoice]]:
    """Module path -> operand key -> the format choice the run gives it."""
    result = {}
    for path, (role, layer) in modules.items():
        key = precision.match_to_config_key(MatchContext(path, None if layer < 0 else layer))
        result[path] = {} if key is None else precision.configs[key].choices(role, layer, num_layers)
    return result


@dataclass(frozen=True)
class RecordRequest:
    """What one capture records under an inspect config."""

    te_tensor: str
    stats: tuple[StatRequest, ...]
    keep_tensor: bool
    keep_quantized: bool
    needs: ExtraNeeds


class InspectPlan:
    """The config's entries per (module, TE tensor), checked against the run's formats."""

    def __init__(self, config: InspectConfig, modules: Mapping[str, tuple[str, int]],
                 choices: Mapping[str, Mapping[str, FormatChoice]], num_layers: int,
                 whatif: tuple[str, ...] = (),
                 changed: Optional[Mapping[str, Mapping[str, FormatChoice]]] = None) -> None:
        self.source = config.source
        self.changed = dict(changed or {})  # module -> operand -> the choice the config gives it (section_operands)
        self.formats = WhatIfFormats(num_layers, choices)
        self._whatif = whatif
        self._entries: dict[tuple[str, str], list[FeatureEntry]] = {}
        layers = section_layers(config, modules)
        for section in config.sections:
            for module in layers[section.name]:
                for entry in section.entries:
                    if entry.tensor is not None:
                        _check_quantized(entry, module, choices.get(module, {}), config.source)
                        self._entries.setdefault((module, entry.tensor), []).append(entry)
        self._schedules = tuple({e.schedule for entries in self._entries.values() for e in entries})
        self._cache: dict[tuple, Optional[RecordRequest]] = {}

    def describe(self) -> str:
        """One line for the start: the config and the per-module, per-GEMM formats it sets."""
        by_formats: dict[tuple, list[str]] = {}
        for module, operands in self.changed.items():
            by_formats.setdefault(tuple(operands.items()), []).append(module)
        parts = [f"{_modules_text(modules)}: " + ", ".join(f"{key} {_shown(choice)}" for key, choice in operands)
                 for operands, modules in by_formats.items()]
        return self.source + (f"; sets {'; '.join(parts)}" if parts else "")

    def runs_at(self, step: int) -> bool:
        return any(schedule.runs_at(step) for schedule in self._schedules)

    def request(self, module: str, tensor_name: str, operation: str, step: int) -> Optional[RecordRequest]:
        te_tensor = TE_TENSOR.get((tensor_name, operation))
        entries = self._entries.get((module, te_tensor), ())
        active = tuple(i for i, e in enumerate(entries) if e.schedule.runs_at(step))
        key = (module, te_tensor, active)
        if key not in self._cache:
            self._cache[key] = self._request(te_tensor, [entries[i] for i in active]) if active else None
        return self._cache[key]

    def _request(self, te_tensor: str, entries: list[FeatureEntry]) -> RecordRequest:
        stats = tuple(dict.fromkeys(s for e in entries for s in e.stats))
        sources = tuple(dict.fromkeys([s.source for s in stats if s.source is not None] + list(self._whatif)))
        needs = ExtraNeeds(whatif=sources, te_fields=bool(stats),
                           blockwise=tuple(dict.fromkeys(s.blockwise for s in stats if s.blockwise)))
        dumps = [e for e in entries if e.feature == "DumpTensors"]
        return RecordRequest(te_tensor, stats, any(e.high_precision for e in dumps), any(e.quantized for e in dumps),
                             needs)


def _check_quantized(entry: FeatureEntry, module: str, choices: Mapping[str, FormatChoice], source: str) -> None:
    """A statistic of the run's own quantization, or a dump of it, needs the operand quantized."""
    capture_name = TENSORS[entry.tensor][0]
    own = [s for s in entry.stats if s.source is None or s.source == RUN + COLUMNWISE]
    if entry.feature == "LogTensorStats" or not (own or entry.quantized):
        return
    orientations = ORIENTATIONS.get(capture_name)
    if orientations is None:
        raise InspectConfigError(f"{source}: {entry.feature} {entry.tensor} of {module}: the lab quantizes GEMM "
                                 f"operands only (activation, weight, gradient)")
    for stat in own or [None]:
        key = orientations[int(stat is not None and stat.source == RUN + COLUMNWISE)][0]
        choice = choices.get(key)
        if choice is None or formats.is_passthrough(choice.name):
            what = f"stat {stat.logged}" if stat is not None else "quantized_tensor"
            hint = f"; name a recipe, e.g. mxfp8_{stat.stat}" if stat is not None else ""
            raise InspectConfigError(f"{source}: {entry.feature} {what} of {module}'s {entry.tensor}: the run "
                                     f"does not quantize it ({key}){hint}")


def resolve_inspect(config: InspectConfig, precision: PrecisionConfig, num_layers: int,
                    whatif: tuple[str, ...] = ()) -> tuple[PrecisionConfig, InspectPlan]:
    """The run's precision with the config's disabled GEMMs in bf16, and the config's plan over it."""
    modules = linear_modules(num_layers, precision.capture_roles(num_layers))
    choices = run_choices(precision, modules, num_layers)
    changed = section_operands(config, modules, choices)
    precision = with_rules(precision, section_rules(changed, modules, choices))
    return precision, InspectPlan(config, modules, run_choices(precision, modules, num_layers), num_layers, whatif,
                                  changed)


def _shown(choice: FormatChoice) -> str:
    scaling = dict(choice.options).get("scaling")
    return choice.name if choice.name in ("bf16", "none") else f"{choice.name} ({scaling or 'tensor'} scaling)" \
        if choice.name in PER_TENSOR_FORMATS else choice.name


def _modules_text(modules: list[str]) -> str:
    """``decoder.layers.{0-7}.mlp.linear_fc1`` for the modules of one role over a range of layers."""
    layers: dict[str, list[int]] = {}
    others = []
    for module in modules:
        found = _DECODER.fullmatch(module)
        if found is None:
            others.append(module)
        else:
            layers.setdefault(found.group(2), []).append(int(found.group(1)))
    spans = []
    for suffix, numbers in layers.items():
        runs: list[list[int]] = []
        for number in sorted(numbers):
            if runs and number == runs[-1][1] + 1:
                runs[-1][1] = number
            else:
                runs.append([number, number])
        text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
        spans.append(f"decoder.layers.{{{text}}}.{suffix}")
    return ", ".join(spans + others)
