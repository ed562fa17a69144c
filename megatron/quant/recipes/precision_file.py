"""Per-module precision files as Megatron users write them (``--kitchen-config-file``,
``--te-precision-config-file``): megatron-core's ``RecipeConfig`` YAML, read into a ``PrecisionConfig``.

```yaml
configs:                      # name -> payload
  attention: bf16             # a format or preset name (CUSTOM_QUANT_TYPE's values)
  mlp: te-nvfp4
  rest: {format: mxfp8, options: {rounding: stochastic}}   # a recipe mapping (docs/recipes.md)
matchers:                     # in order, first match wins (megatron-core's GlobMatcher)
  attn: {type: glob, pattern: "*self_attention*", config: attention, enabled: true}
  fc: {type: glob, pattern: "*linear_fc*", config: mlp, enabled: true}
  default: {type: glob, pattern: "*", config: rest, enabled: true}
```

A payload written for Transformer Engine's per-module recipes (Megatron-LM's
``TransformerEngineMixedPrecision.md``: ``transformer_engine_config_type: TEQuantizationParams`` with a
``training_recipe``) becomes the lab's preset for the same TE recipe, read as Megatron-LM reads its
``--fp8-recipe``/``--fp8-format``/``--fp4-format`` flags (``presets.recipe_from_megatron_flags``); one the
lab has no emulation for is refused in one line that names the config. Matchers are built by
megatron-core itself (``RecipeConfig.from_config_dict``: only ``enabled: true`` ones count, as in
Megatron-LM); a matcher naming no config or an unknown one is refused here, before any model exists.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml
from megatron.core.quantization.quant_config import RecipeConfig

from megatron.quant.formats.show import show_value
from megatron.quant.recipes.parse import RecipeError, load_yaml
from megatron.quant.recipes.precision import PrecisionConfig
from megatron.quant.recipes.presets import GivenFlags, PresetError, recipe_from_megatron_flags
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.settings.names import name_problem
from megatron.quant.yaml_safe import YamlError, read_text_file

FILE_KEYS = ("configs", "matchers")
TE_TYPE_KEY = "transformer_engine_config_type"  # megatron-core's _TE_CONFIG_TYPE_KEY
KITCHEN_TYPE_KEY = "kitchen_config_type"
# TEQuantizationRecipe's fields (0.16 and 0.19) -> the value under which the lab emulates the recipe
# as given; a field holding anything else is refused (why: the value in TE_REFUSED, or "not emulated").
TE_FIELDS = ("fp8_quantization_recipe", "fp4_quantization_recipe", "custom_recipe_factory", "fp8_format",
             "override_quantized_autocast", "override_nonquantized_autocast", "tp_only_amax_red", "fp8_param",
             "fp4_param")
TE_NEUTRAL = {"custom_recipe_factory": None, "tp_only_amax_red": False, "fp8_param": False, "fp4_param": False}
TE_REFUSED = {
    "custom_recipe_factory": "a custom TE recipe factory is code the lab cannot emulate",
    "tp_only_amax_red": "set it for the whole run (TransformerConfig.tp_only_amax_red) instead",
    "fp8_param": "FP8 parameter storage is not emulated",
    "fp4_param": "FP4 parameter storage is not emulated",
}


def load_precision_file(path: str | Path, source: str | None = None) -> PrecisionConfig:
    """The ``PrecisionConfig`` of a megatron-core ``RecipeConfig`` YAML; ``RecipeError`` (one line,
    naming the file and the bad value) for anything that cannot run. ``name``: the file's stem."""
    path = Path(path)
    source = source or str(path)
    try:
        text = read_text_file(path, source)
    except YamlError as exc:
        raise RecipeError(f"{exc} (a precision file)") from None
    try:
        data = load_yaml(text, source)
    except yaml.YAMLError as exc:
        raise RecipeError(f"{source}: not a valid YAML precision file: {' '.join(str(exc).split())[:300]}") from None
    problem = name_problem(path.stem)
    if problem is not None:
        raise RecipeError(f"{source}: the file's stem names the run's captures; {path.stem!r} is invalid ({problem})")
    return precision_from_dict(data, path.stem, source)


def precision_from_dict(data: Any, name: str, source: str) -> PrecisionConfig:
    """``data`` (the file's mapping) as a ``PrecisionConfig`` named ``name``."""
    if not isinstance(data, Mapping):
        raise RecipeError(f"{source}: a precision file is a mapping with {' and '.join(FILE_KEYS)}, "
                          f"got {show_value(data)}")
    unknown = sorted(set(data) - set(FILE_KEYS))
    if unknown:
        raise RecipeError(f"{source}: unknown key {unknown[0]!r}; allowed: {', '.join(FILE_KEYS)}")
    configs, matchers = data.get("configs") or {}, data.get("matchers") or {}
    if not isinstance(configs, Mapping) or not isinstance(matchers, Mapping):
        raise RecipeError(f"{source}: configs and matchers are mappings (name -> entry)")
    for key, matcher in matchers.items():
        if not isinstance(matcher, Mapping):
            raise RecipeError(f"{source}: matchers.{key}: expected a mapping, got {show_value(matcher)}")
        _check_matcher_values(matcher, f"{source}: matchers.{key}")
        if matcher.get("enabled", False) and matcher.get("config") is None:
            raise RecipeError(f"{source}: matchers.{key} names no config; give config: one of {', '.join(configs)}")
        if matcher.get("enabled", False) and matcher["config"] not in configs:
            raise RecipeError(f"{source}: matchers.{key}: unknown config {show_value(matcher['config'])}; "
                              f"configs: {', '.join(map(str, configs)) or 'none'}")
    try:
        built = RecipeConfig.from_config_dict({"matchers": dict(matchers), "configs": {}})
    except (AssertionError, NotImplementedError) as exc:  # megatron-core's own checks of a matcher
        raise RecipeError(f"{source}: matchers: {exc}") from None
    if not built.matchers:
        raise RecipeError(f"{source}: no enabled matcher (megatron-core counts only matchers with enabled: true)")
    parsed = {str(key): payload_recipe(payload, f"{source}: configs.{key}") for key, payload in configs.items()}
    return PrecisionConfig(built.matchers, parsed, name, source)


def _check_matcher_values(matcher: Mapping, where: str) -> None:
    """``enabled`` a boolean (megatron-core tests its truth, so a quoted "false" would enable it), and
    ``type``, ``pattern`` and ``config`` strings (a number is matched only when the model is built, and fails)."""
    if not isinstance(matcher.get("enabled", False), bool):
        raise RecipeError(f"{where}.enabled: expected true or false, got {show_value(matcher['enabled'])}")
    for field in ("type", "pattern", "config"):
        if field in matcher and not (isinstance(matcher[field], str) and matcher[field]):
            raise RecipeError(f"{where}.{field}: expected a non-empty string, got {show_value(matcher[field])}")


def payload_recipe(payload: Any, source: str) -> QuantRecipe:
    """One config's payload: a format or preset name, a recipe mapping, or a TE per-module recipe."""
    if isinstance(payload, str):
        return QuantRecipe.from_dict({"format": payload}, source=source)
    if isinstance(payload, Mapping) and KITCHEN_TYPE_KEY in payload:
        raise RecipeError(f"{source}: a Kitchen recipe ({KITCHEN_TYPE_KEY}: {payload[KITCHEN_TYPE_KEY]}) belongs to "
                          f"NVIDIA's unreleased Kitchen extension, which the lab cannot emulate; give a lab recipe")
    if isinstance(payload, Mapping) and TE_TYPE_KEY in payload:
        return QuantRecipe.from_dict(te_recipe(payload, source), source=source)
    return QuantRecipe.from_dict(payload, source=source)


def te_recipe(payload: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The recipe dict emulating a ``TEQuantizationParams`` payload's training recipe."""
    if payload[TE_TYPE_KEY] != "TEQuantizationParams":
        raise RecipeError(f"{source}: {TE_TYPE_KEY} {show_value(payload[TE_TYPE_KEY])} is unknown; "
                          f"megatron-core knows TEQuantizationParams")
    extra = sorted(set(payload) - {TE_TYPE_KEY, "training_recipe", "evaluation_recipe"})
    if extra or "training_recipe" not in payload:
        raise RecipeError(f"{source}: a TEQuantizationParams config has training_recipe (and evaluation_recipe); "
                          f"got {', '.join(map(str, extra or payload))}")
    training = payload["training_recipe"] or {}
    if payload.get("evaluation_recipe") not in (None, payload["training_recipe"]):
        raise RecipeError(f"{source}: evaluation_recipe differs from training_recipe; the lab evaluates with "
                          f"the training recipe")
    if not isinstance(training, Mapping):
        raise RecipeError(f"{source}: training_recipe: expected a mapping, got {show_value(training)}")
    for key, value in training.items():
        if key not in TE_FIELDS:
            raise RecipeError(f"{source}: training_recipe: unknown field {key!r}; TE's fields: {', '.join(TE_FIELDS)}")
        if key in TE_NEUTRAL and value != TE_NEUTRAL[key]:
            raise RecipeError(f"{source}: training_recipe: {key}: {show_value(value)} is refused: {TE_REFUSED[key]}")
    fp8, fp4 = training.get("fp8_quantization_recipe"), training.get("fp4_quantization_recipe")
    if fp8 is None and fp4 is None:
        return {"format": "bf16"}  # TE: no quantization configured, the module runs in high precision
    if fp8 == "delayed":
        raise RecipeError(f"{source}: fp8_quantization_recipe delayed: megatron-core keeps delayed scaling out of "
                          f"per-module configs; use tensorwise, blockwise or mxfp8 (or --fp8-recipe delayed)")
    if fp4 is not None and fp4 != "nvfp4":
        raise RecipeError(f"{source}: fp4_quantization_recipe {show_value(fp4)} is not emulated; the lab has nvfp4")
    if fp8 is not None and training.get("fp8_format", "e4m3") not in ("e4m3", "hybrid"):
        raise RecipeError(f"{source}: fp8_format {show_value(training['fp8_format'])} is unknown; TE's: e4m3, hybrid")
    flags = GivenFlags(fp8_recipe=fp8, fp8_format=training.get("fp8_format", "e4m3") if fp8 else None,
                       fp4_format="e2m1" if fp4 else None, fp4_recipe=fp4)
    try:
        return recipe_from_megatron_flags(flags)
    except (PresetError, KeyError) as exc:
        raise RecipeError(f"{source}: training_recipe {dict(training)} is not emulated: {exc}") from None
