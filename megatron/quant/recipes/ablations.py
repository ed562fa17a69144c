"""Recipe variants with one component removed or added: ``te-nvfp4-no-sr``, ``mxfp4+sr+rht``.

A variant name is a base (a preset such as ``te-nvfp4`` or a format name such as ``mxfp4``)
followed by edits applied left to right: ``-no-COMPONENT`` removes a component the recipe has,
``+COMPONENT`` adds one it lacks. Components (the parts the NVFP4 pretraining report and the
MXFP4 training work ablate; TE's ``disable_*`` switches):

| component | in the recipe | removed | added |
|---|---|---|---|
| ``sr`` | stochastic rounding | every stochastic ``rounding`` | ``stochastic8`` on the gradients (grad_output) |
| ``rht`` | random Hadamard transform | every ``hadamard`` | on the wgrad operands (16 for NVFP4, else 32) |
| ``2d`` | 2D weight tiles (16x16, 128x128) | the weights' ``block_shape`` (1D blocks) | — |
| ``rceil`` | MX scales rounded up | ``scale_mode: rceil`` (OCP floor) | — |
| ``bf16-layers`` | first/last layers in BF16 | rules keeping whole layers in BF16 | first and last layer's linears |
| ``bf16-fwd-tail`` | forward GEMMs late in BF16 | phases moving the forward to BF16 | one from 80 % of training |
| ``4over6`` | NVFP4 4over6 scales | every ``four_over_six``, ``e4m3_max`` | MAE, bound 256, inputs and weights |
| ``row-scaled`` | NVFP4 FP32 scales per row | every ``row_scaled`` | on the input's operands |
| ``bwd-hp``, ``bwd-dq`` | TE's ``backward_override`` | ``backward_override`` | ``high_precision``, ``dequantized`` |
| ``hopper-acc`` | Hopper FP8 accumulation | ``accumulate`` (exact sums) | TE's: fprop fast, dgrad/wgrad promoted |

``te-fp8-current`` and ``te-fp8-delayed`` have ``hopper-acc`` (TE's default on Hopper), so their
ablation runs each against ``-no-hopper-acc``, its exact FP32 sums.

``2d`` added tiles the weights (16x16 for NVFP4, 128x128 for FP8 blocks, 32x32 otherwise: TE's
``enable_2d_quantization`` for MXFP8).

``bf16-layers`` added is Megatron-LM's ``--first-last-layers-bf16`` with its defaults: TE's
recipes (and so the ``te-*`` presets) keep no layers in BF16, so the NVFP4 report's full recipe is
``te-nvfp4+bf16-layers`` and its ablation is ``ablation("te-nvfp4+bf16-layers")``.

``bf16-fwd-tail`` added is a schedule phase (``recipes.schedule``) moving only the forward GEMMs to BF16
for the last 20 % of training: NVIDIA's NVFP4 pretraining report (appendix D) switches them before the
learning-rate decay and so closes most of the loss gap to BF16 (``te-nvfp4+bf16-fwd-tail``).

A variant name is accepted wherever a preset name is (``CUSTOM_QUANT_TYPE``, ``format:`` in a
recipe file, the sweep, ``recipes show``, ``compare_formats``). Variants are data: a variant's
recipe dict is its base's with the edits applied, so it differs from the base in that component
only (tests compare the resolved per-operand formats).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from megatron.quant import formats
from megatron.quant.formats.rounding import ROUNDING_MODES, is_stochastic
from megatron.quant.recipes import presets
from megatron.quant.recipes.operands import DECODER_LINEAR_ROLES, LINEAR_TABLE

GRADIENTS, WEIGHTS, WGRAD = presets.GRADIENTS, presets.WEIGHTS, presets.WGRAD
INPUTS = tuple(op.key for op in LINEAR_TABLE if op.role == "input")
INPUTS_AND_WEIGHTS = tuple(op.key for op in LINEAR_TABLE if op.role != "grad_output")  # 4over6's scope "all"
BF16_LAYERS = ["0:1", "-1:"]  # Megatron-LM --first-last-layers-bf16 defaults: one layer at each end
BF16_FORWARD_TAIL = {"from": 0.8, "forward": "bf16"}  # the NVFP4 report's appendix D: the last 20 % in BF16
_EDIT = re.compile(r"(-no-|\+)([a-z0-9]+(?:-[a-z]+)*?)(?=-no-|\+|$)")
# --ablate adds these to a base's removals (the questions the published ablations ask).
STOCHASTIC_MODES = tuple(mode for mode in ROUNDING_MODES if is_stochastic(mode))
ADDITIONS = {"te-nvfp4": ("bf16-layers", "bf16-fwd-tail"), "mxfp4": ("sr", "rht", "sr+rht"),
             "nvfp4": ("sr", "rht", "sr+rht")}


class AblationError(ValueError):
    """A variant name that cannot be built; the message names the component and what is allowed."""


def _options(recipe: dict[str, Any]) -> list[dict[str, Any]]:
    """Every options dict of a recipe dict: top level, operand overrides, rules and their operands."""
    rules = recipe.get("rules", [])
    holders = [recipe, *recipe.get("operands", {}).values(), *rules]
    holders += [value for rule in rules for value in rule.get("operands", {}).values()]
    return [h["options"] for h in holders if isinstance(h, dict) and isinstance(h.get("options"), dict)]


def _has_option(recipe: dict[str, Any], key: str, values: Optional[tuple[Any, ...]] = None) -> bool:
    return any(key in opts and (values is None or opts[key] in values) for opts in _options(recipe))


def _drop_option(recipe: dict[str, Any], key: str, values: Optional[tuple[Any, ...]] = None) -> None:
    for opts in _options(recipe):
        if key in opts and (values is None or opts[key] in values):
            del opts[key]


def _set_operands(recipe: dict[str, Any], keys: tuple[str, ...], options: dict[str, Any]) -> None:
    """``options`` added to the operand overrides of ``keys`` (keeping their format)."""
    operands = recipe.setdefault("operands", {})
    for key in keys:
        entry = operands.get(key, {})
        entry = {"format": entry} if isinstance(entry, str) else entry
        operands[key] = {**entry, "options": {**entry.get("options", {}), **options}}


def _weight_blocks_2d(recipe: dict[str, Any]) -> bool:
    operands = recipe.get("operands", {})
    return any(isinstance(operands.get(k), dict) and "block_shape" in operands[k].get("options", {})
               and min(operands[k]["options"]["block_shape"]) > 1 for k in WEIGHTS)


def _drop_weight_blocks(recipe: dict[str, Any]) -> None:
    for key in WEIGHTS:
        entry = recipe.get("operands", {}).get(key)
        if isinstance(entry, dict):
            entry.get("options", {}).pop("block_shape", None)


def _tile_weights(recipe: dict[str, Any]) -> None:
    options = recipe.get("options", {})
    side = 16 if str(recipe.get("format", "")).startswith("nvfp") else 128 if options.get("scaling") == "block" else 32
    _set_operands(recipe, WEIGHTS, {"block_shape": [side, side]})


def _override(name: str, value: str) -> "Component":
    return Component(name, f"backward_override {value}",
                     lambda r: r.get("backward_override") == value, lambda r: r.pop("backward_override"),
                     lambda r: r.update(backward_override=value))


def _is_bf16_layer_rule(rule: dict[str, Any]) -> bool:
    return rule.get("format") == "bf16" and "layers" in rule.get("match", {})


def _is_bf16_forward_phase(phase: Any) -> bool:
    return isinstance(phase, dict) and phase.get("forward") == "bf16"


def _drop_bf16_forward_phases(recipe: dict[str, Any]) -> None:
    recipe["schedule"] = [phase for phase in recipe.get("schedule", []) if not _is_bf16_forward_phase(phase)]


def _hadamard_size(recipe: dict[str, Any]) -> int:
    return 16 if str(recipe.get("format", "")).startswith("nvfp4") else 32


def _accumulate(recipe: dict[str, Any]) -> dict[str, Any]:
    value = recipe.get("accumulate") or {}
    return dict(value) if isinstance(value, dict) else {"all": value}


@dataclass(frozen=True)
class Component:
    name: str
    description: str
    present: Callable[[dict[str, Any]], bool]
    remove: Callable[[dict[str, Any]], None]
    add: Optional[Callable[[dict[str, Any]], None]] = None


COMPONENTS = {c.name: c for c in (
    Component("sr", "stochastic rounding (on the gradients)",
              lambda r: _has_option(r, "rounding", STOCHASTIC_MODES),
              lambda r: _drop_option(r, "rounding", STOCHASTIC_MODES),
              lambda r: _set_operands(r, GRADIENTS, {"rounding": "stochastic8"})),
    Component("rht", "random Hadamard transform (on the wgrad operands)",
              lambda r: _has_option(r, "hadamard"),
              lambda r: _drop_option(r, "hadamard"),
              lambda r: _set_operands(r, WGRAD, {"hadamard": _hadamard_size(r)})),
    Component("2d", "2D weight scaling blocks (tiles; removed: 1D blocks)", _weight_blocks_2d, _drop_weight_blocks,
              _tile_weights),
    Component("rceil", "MX block scales rounded up (rceil; OCP rounds down)",
              lambda r: _has_option(r, "scale_mode", ("rceil",)),
              lambda r: _drop_option(r, "scale_mode", ("rceil",))),
    Component("bf16-layers", "the first and last decoder layers in BF16",
              lambda r: any(_is_bf16_layer_rule(rule) for rule in r.get("rules", [])),
              lambda r: r.update(rules=[rule for rule in r.get("rules", []) if not _is_bf16_layer_rule(rule)]),
              lambda r: r.update(rules=[*r.get("rules", []), {"match": {"layers": list(BF16_LAYERS),
                                                                        "roles": list(DECODER_LINEAR_ROLES)},
                                                              "format": "bf16"}])),
    Component("bf16-fwd-tail", "the forward GEMMs in BF16 for the last 20 % of training",
              lambda r: any(_is_bf16_forward_phase(phase) for phase in r.get("schedule", [])),
              _drop_bf16_forward_phases,
              lambda r: r.update(schedule=[*r.get("schedule", []), dict(BF16_FORWARD_TAIL)])),
    Component("4over6", "NVFP4 4over6 block scales (MAE, E4M3 bound 256; on the inputs and weights)",
              lambda r: any(o.get("four_over_six", "off") != "off" for o in _options(r)),
              lambda r: (_drop_option(r, "four_over_six"), _drop_option(r, "e4m3_max")),
              lambda r: _set_operands(r, INPUTS_AND_WEIGHTS, {"four_over_six": "mae", "e4m3_max": 256})),
    Component("row-scaled", "NVFP4 FP32 scales per row (on the input's operands)",
              lambda r: _has_option(r, "row_scaled", (True,)), lambda r: _drop_option(r, "row_scaled"),
              lambda r: _set_operands(r, INPUTS, {"row_scaled": True})),
    Component("hopper-acc", "a Hopper FP8 tensor core's accumulator (TE's: fprop fast, dgrad and wgrad promoted)",
              lambda r: any(mode != "exact" for mode in _accumulate(r).values()),
              lambda r: r.pop("accumulate", None),
              lambda r: r.update(accumulate=dict(presets.TE_HOPPER_ACCUMULATE))),
    _override("bwd-hp", "high_precision"),
    _override("bwd-dq", "dequantized"),
)}


def _base_recipe(name: str) -> Optional[dict[str, Any]]:
    """A preset's recipe dict, or ``{"format": name}`` for a format name; None otherwise."""
    if presets.is_preset(name):
        return presets.get_preset(name)
    try:
        formats.canonical_name(name)
    except ValueError:
        return None
    return {"format": name}


def split_name(name: str) -> Optional[tuple[str, list[tuple[str, str]]]]:
    """(base, [(edit, component), ...]) for a variant name, None when ``name`` has no edits or no known base."""
    key = name.strip().lower()
    for match in re.finditer(r"-no-|\+", key):
        base, rest = key[:match.start()], key[match.start():]
        edits = [(m[1], m[2]) for m in _EDIT.finditer(rest)]
        if base and _base_recipe(base) is not None and "".join(e + c for e, c in edits) == rest:
            return base, edits
    return None


def is_variant(name: Any) -> bool:
    return isinstance(name, str) and split_name(name) is not None


def get_variant(name: str) -> dict[str, Any]:
    """Variant ``name``'s recipe dict (its base's with the edits applied); AblationError when an edit
    names an unknown component, removes one the recipe lacks or adds one it has."""
    parsed = split_name(name)
    if parsed is None:
        raise AblationError(f"{name!r} is not a recipe variant: give BASE-no-COMPONENT or BASE+COMPONENT "
                            f"with BASE a preset or format name and COMPONENT one of {', '.join(COMPONENTS)}")
    base, edits = parsed
    recipe, so_far = _base_recipe(base), base
    for edit, component_name in edits:
        component = COMPONENTS.get(component_name)
        if component is None:
            raise AblationError(f"{name!r}: unknown component {component_name!r}; components: "
                                f"{', '.join(COMPONENTS)}")
        present = component.present(recipe)
        what = f"{component_name!r} ({component.description})"
        if edit == "-no-" and not present:
            hint = f"; add it with {so_far}+{component_name}" if component.add else ""
            raise AblationError(f"{name!r}: {so_far} has no {what} to remove{hint}")
        if edit == "+" and present:
            raise AblationError(f"{name!r}: {so_far} has {what} already; remove it with {so_far}-no-{component_name}")
        if edit == "+" and component.add is None:
            raise AblationError(f"{name!r}: {what} can only be removed, not added")
        (component.remove if edit == "-no-" else component.add)(recipe)
        so_far += edit + component_name
    return recipe


def lookup(name: Any) -> Optional[dict[str, Any]]:
    """The recipe dict of a preset or a variant name (a copy); None for anything else (a format name)."""
    if presets.is_preset(name):
        return presets.get_preset(name)
    return get_variant(name) if is_variant(name) else None


def describe_variant(name: str) -> str:
    """One line: what the variant changes, e.g. 'te-nvfp4 without stochastic rounding (on the gradients)'."""
    base, edits = split_name(name) or (name, [])
    changes = [("without " if edit == "-no-" else "with ") + COMPONENTS[c].description for edit, c in edits
               if c in COMPONENTS]
    return " ".join([base, *changes]) if changes else base


def ablation(base: str) -> list[str]:
    """``base`` and its variants: one per component it has, removed, and the additions the
    published ablations ask for its family (``ADDITIONS``); AblationError for an unknown base."""
    recipe = lookup(base) or _base_recipe(base)
    if recipe is None:
        raise AblationError(f"--ablate {base!r}: not a preset, variant or format name; presets: "
                            f"{', '.join(presets.preset_names())}")
    key = base.strip().lower()
    family = (split_name(key) or (key, []))[0]
    names = [key] + [f"{key}-no-{c.name}" for c in COMPONENTS.values() if c.present(recipe)]
    for addition in ADDITIONS.get(family, ()):
        candidate = key + "".join(f"+{c}" for c in addition.split("+"))
        if not any(COMPONENTS[c].present(recipe) for c in addition.split("+")):
            names.append(candidate)
    return names
