"""Reading a recipe, in one direction: the environment (``env_sources``), a file (``read_file``:
YAML/JSON, alias expansion bounded by ``yaml_safe``) and a dict (``recipe_fields``) become the fields
of a ``QuantRecipe``, every value checked into a ``FormatChoice`` or ``Rule`` or refused with a
``RecipeError`` naming where it came from. ``recipe`` builds the recipe from those fields and
never calls back.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Optional, get_args

import yaml

from megatron.quant import formats, yaml_safe
from megatron.quant.formats.accumulation import ACCUMULATIONS
from megatron.quant.formats.show import show_value
from megatron.quant.recipes import ablations, presets
from megatron.quant.recipes.operands import ALL_OPERANDS, LINEAR_GEMMS, ROLES, SCOPES, TWINNED_ROLES
from megatron.quant.recipes.rules import DEFAULT_SCOPE, PASSTHROUGH_DEFAULT, FormatChoice, Rule
from megatron.quant.settings.names import NAME_RULE, name_problem

# Layer selectors share their grammar and parser with the capture filters (TENSOR_SAVE_LAYERS).
from megatron.quant.settings.selectors import SIGNED_GRAMMAR, parse_selectors
from megatron.quant.settings.selectors import Selector as LayerSelector
from megatron.quant.settings.switches import switch_value, unknown_variables
from megatron.quant.settings.variables import (
    ACCUMULATE_ENV,
    COMPILE_ENV,
    RECIPE_ENV,
    RECIPE_PREFIX,
    RECIPE_VARIABLES,
    SCOPE_ENV,
    TYPE_ENV,
)

TOP_KEYS = ("name", "format", "options", "scope", "operands", "rules", "compile", "seed", "schedule", "evaluation",
            "backward_override", "columnwise_source", "accumulate")
_RULE_KEYS = ("match", "format", "options", "operands")
_MATCH_KEYS = ("roles", "layers")
_OVERRIDE_KEYS = ("format", "options")
# Transformer Engine's per-direction settings (``recipe.backward_override``, ``HybridQuantizer``'s
# ``columnwise_source``); ``QuantRecipe`` says what each does.
BackwardOverride = Literal["high_precision", "dequantized"]
"""``backward_override``: backward GEMMs on the original high-precision tensors, or on the forward's
dequantized operands (the gradient unquantized either way)."""
BACKWARD_OVERRIDES: tuple[BackwardOverride, ...] = get_args(BackwardOverride)
ColumnwiseSource = Literal["original", "rowwise_dequantized"]
"""``columnwise_source``: a tensor's backward operand quantized from the tensor, or from the forward's
dequantized operand."""
COLUMNWISE_SOURCES: tuple[ColumnwiseSource, ...] = get_args(ColumnwiseSource)


class RecipeError(ValueError):
    """A recipe value that cannot be used; the message names where it came from."""


ENV_VARS = tuple(RECIPE_VARIABLES)  # spelled once, in settings.variables


def check_env_names(environ: Mapping[str, str]) -> None:
    """RecipeError for a CUSTOM_QUANT_* variable that is none of ENV_VARS (e.g. CUSTOM_QUANT_TPYE)."""
    unknown = unknown_variables(environ, (RECIPE_PREFIX,), ENV_VARS, "recipe")
    if unknown:
        raise RecipeError(unknown)


def load_yaml(text: str, source: str) -> Any:
    """The recipe document in ``text``, its alias expansion bounded (``yaml_safe``)."""
    try:
        return yaml_safe.load_yaml(text, source)
    except yaml_safe.YamlError as error:
        raise RecipeError(f"{error} (a recipe needs a few hundred)") from None


# ---- parsing helpers ------------------------------------------------------------------------
def _where(path: str) -> str:
    return path or "<top level>"


def _freeze(value: Any) -> Any:
    """Lists (YAML/JSON ``block_shape: [16, 16]``) as tuples: FormatChoice keys the shared formats."""
    return tuple(_freeze(v) for v in value) if isinstance(value, list) else value


def frozen_options(options: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple((k, _freeze(v)) for k, v in options.items())


def check_keys(data: Mapping, allowed: tuple[str, ...], path: str, source: str) -> None:
    for key in data:
        if key not in allowed:
            raise RecipeError(f"{source}: {_where(path + '.' + str(key) if path else str(key))}: "
                              f"unknown key {key!r}; allowed: {', '.join(allowed)}")


def as_mapping(value: Any, path: str, source: str) -> dict:
    if not isinstance(value, Mapping):
        raise RecipeError(f"{source}: {path}: expected a mapping, got {show_value(value)}")
    return dict(value)


def _valid_format_names() -> list[str]:
    return sorted(set(formats.list_formats()) | set(formats.ALIASES))


def _is_format_name(name: str) -> bool:
    try:
        formats.canonical_name(name)
    except ValueError:
        return False
    return True


def check_top_format(name: Any, options: Mapping, source: str) -> str:
    """The top-level format, where an unknown name's message also lists the presets."""
    if isinstance(name, str) and not _is_format_name(name):
        raise RecipeError(f"{source}: format: unknown format or preset {show_value(name)}; valid: "
                          f"{', '.join(_valid_format_names() + presets.preset_names())}, or a variant "
                          f"(PRESET-no-COMPONENT, FORMAT+COMPONENT; components: {', '.join(ablations.COMPONENTS)})")
    return check_format(name, options, "format", source)


def expand_preset(data: dict[str, Any], source: str) -> dict[str, Any]:
    """``data`` with a preset ``format`` replaced by the preset's recipe, ``data``'s other keys merged
    over it; named after the preset (plus ``-<scopes>`` when ``scope`` changes the preset's)."""
    name = data.get("format")
    if not (presets.is_preset(name) or ablations.is_variant(name)):
        return data
    key = name.strip().lower()
    try:
        preset = ablations.lookup(key)
    except (presets.PresetError, ablations.AblationError) as exc:
        raise RecipeError(f"{source}: format: {exc}") from None
    rest = {k: v for k, v in data.items() if k != "format"}
    merged = presets.merge_preset(preset, rest)
    if not merged.get("name"):
        scopes = parse_scope(merged.get("scope", list(DEFAULT_SCOPE)), "scope", source)
        changed = scopes != frozenset(preset.get("scope", DEFAULT_SCOPE))
        merged["name"] = key + ("-" + "+".join(sorted(scopes)) if changed else "")
    return merged


def check_format(name: Any, options: Mapping, path: str, source: str) -> str:
    """Build the format once to validate name and options; return the name as given."""
    if not isinstance(name, str):
        raise RecipeError(f"{source}: {path}: format must be a string, got {show_value(name)}; "
                          f"valid: {', '.join(_valid_format_names())}")
    name = name.strip().lower()
    if formats.is_passthrough(name):
        if options:
            raise RecipeError(f"{source}: {path}: passthrough format {show_value(name)} takes no options, "
                              f"got {show_value(dict(options))}")
        return name
    try:
        formats.get_format(name, **dict(options))
    except (ValueError, TypeError) as exc:  # the formats' message lists the valid names/values
        raise RecipeError(f"{source}: {path}: format {show_value(name)} with options {show_value(dict(options))} "
                          f"is refused: {exc}") from exc
    return name


def parse_bool(value: Any, path: str, source: str) -> bool:
    switch = value if isinstance(value, bool) else switch_value(str(value))
    if switch is not None:
        return switch
    raise RecipeError(f"{source}: {path}: {show_value(value)} is not a boolean; use true/false, 1/0, yes/no or on/off")


def parse_seed(value: Any, source: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise RecipeError(f"{source}: seed: {show_value(value)} must be a non-negative integer")
    return value


def parse_scope(value: Any, path: str, source: str) -> frozenset[str]:
    items = value if isinstance(value, (list, tuple)) else [value]
    if not items or not all(isinstance(s, str) and s in SCOPES for s in items):
        raise RecipeError(f"{source}: {path}: invalid scope {show_value(value)}; "
                          f"allowed (comma list): {', '.join(SCOPES)}")
    return frozenset(items)


def _parse_choice(value: Any, path: str, source: str, base: FormatChoice) -> FormatChoice:
    """``{format:, options:}`` or a bare format name; validated against the inherited format."""
    if isinstance(value, str):
        value = {"format": value}
    data = as_mapping(value, path, source)
    check_keys(data, _OVERRIDE_KEYS, path, source)
    options = as_mapping(data.get("options", {}), path + ".options", source)
    choice = FormatChoice(data.get("format"), frozen_options(options))
    effective = choice.over(base)
    check_format(effective.name, dict(effective.options), path, source)
    return FormatChoice(None if choice.name is None else str(choice.name).strip().lower(), choice.options)


def parse_overrides(value: Any, allowed: tuple[str, ...], path: str, source: str,
                     base: FormatChoice) -> tuple[tuple[str, FormatChoice], ...]:
    data = as_mapping(value, path, source)
    check_keys(data, allowed, path, source)
    return tuple((k, _parse_choice(v, f"{path}.{k}", source, base)) for k, v in data.items())


def _parse_layers(value: Any, path: str, source: str) -> tuple[LayerSelector, ...]:
    selectors: list[LayerSelector] = []
    for i, item in enumerate(value if isinstance(value, list) else [value]):
        try:
            selectors.extend(parse_selectors(item, signed=True))
        except ValueError as exc:
            raise RecipeError(f"{source}: {path}[{i}]: invalid layer selector {show_value(item)} ({exc}); "
                              f"use {SIGNED_GRAMMAR}") from None
    return tuple(selectors)


def parse_rule(value: Any, path: str, source: str, default: FormatChoice) -> Rule:
    data = as_mapping(value, path, source)
    check_keys(data, _RULE_KEYS, path, source)
    match = as_mapping(data.get("match", {}), path + ".match", source)
    check_keys(match, _MATCH_KEYS, path + ".match", source)
    roles = None
    if "roles" in match:
        roles_value = match["roles"] if isinstance(match["roles"], list) else [match["roles"]]
        bad = [r for r in roles_value if r not in ROLES]
        if bad or not roles_value:
            raise RecipeError(f"{source}: {path}.match.roles: invalid role(s) {show_value(bad or roles_value)}; "
                              f"allowed: {', '.join(ROLES)}")
        roles = frozenset(roles_value)
    layers = _parse_layers(match["layers"], path + ".match.layers", source) if "layers" in match else None
    fmt = None
    if "format" in data or "options" in data:
        options = as_mapping(data.get("options", {}), path + ".options", source)
        fmt = FormatChoice(check_format(data.get("format", default.name), options, path + ".format", source),
                           frozen_options(options))
    operands = parse_overrides(data.get("operands", {}), ALL_OPERANDS, path + ".operands", source,
                                fmt or default)
    if fmt is None and not operands:
        raise RecipeError(f"{source}: {path}: a rule needs 'format'/'options' or 'operands'")
    return Rule(roles=roles, layers=layers, format=fmt, operands=operands)


def parse_backward_override(value: Any, source: str) -> Optional[str]:
    if value is None or value in BACKWARD_OVERRIDES:
        return value
    raise RecipeError(f"{source}: backward_override: {show_value(value)} is not one of "
                      f"{', '.join(BACKWARD_OVERRIDES)} (or null)")


def parse_columnwise_source(value: Any, source: str) -> frozenset[str]:
    """The tensors (``TWINNED_ROLES``) whose backward operand is taken from the forward's dequantized one."""
    data = as_mapping({} if value is None else value, "columnwise_source", source)
    check_keys(data, TWINNED_ROLES, "columnwise_source", source)
    for role, choice in data.items():
        if choice not in COLUMNWISE_SOURCES:
            raise RecipeError(f"{source}: columnwise_source.{role}: {show_value(choice)} is not one of "
                              f"{', '.join(COLUMNWISE_SOURCES)}")
    return frozenset(role for role, choice in data.items() if choice == "rowwise_dequantized")


def parse_accumulate(value: Any, source: str) -> tuple[tuple[str, str], ...]:
    """``accumulate``: one of ``ACCUMULATIONS`` for every linear GEMM, or a mapping GEMM -> one of them;
    ((gemm, mode), ...) for the GEMMs that do not accumulate exactly (() for none)."""
    if value is None:
        return ()
    data = {gemm: value for gemm in LINEAR_GEMMS} if isinstance(value, str) else as_mapping(value, "accumulate",
                                                                                             source)
    check_keys(data, LINEAR_GEMMS, "accumulate", source)
    for gemm, mode in data.items():
        if mode not in ACCUMULATIONS:
            raise RecipeError(f"{source}: accumulate.{gemm}: {show_value(mode)} is not one of "
                              f"{', '.join(ACCUMULATIONS)} (exact FP32, or a Hopper FP8 tensor core's fast or "
                              f"promoted accumulation)")
    return tuple((gemm, data[gemm]) for gemm in LINEAR_GEMMS if data.get(gemm, "exact") != "exact")


ACCUMULATE_CHOICES = {"te": {}, "exact": {"accumulate": "exact"}}  # CUSTOM_QUANT_ACCUMULATE -> the recipe keys


def accumulate_override(environ: Mapping[str, str]) -> dict[str, Any]:
    """The recipe keys ``CUSTOM_QUANT_ACCUMULATE`` sets: ``exact`` (exact FP32 sums in every GEMM, the
    te-fp8 presets' Hopper accumulation off), or ``te`` and unset (nothing: the recipe's own, TE's on
    Hopper for te-fp8-current and te-fp8-delayed); RecipeError for another value."""
    value = environ.get(ACCUMULATE_ENV, "").strip().lower() or "te"
    if value not in ACCUMULATE_CHOICES:
        raise RecipeError(f"{ACCUMULATE_ENV}={show_value(value)} is not one of {', '.join(ACCUMULATE_CHOICES)} "
                          f"(te: the recipe's accumulation, TE's on Hopper for the te-fp8 presets; exact: FP32 sums)")
    return dict(ACCUMULATE_CHOICES[value])


def default_name(fmt_name: str, scopes: frozenset[str]) -> str:
    if scopes == frozenset(DEFAULT_SCOPE):
        return fmt_name
    return fmt_name + "-" + "+".join(sorted(scopes))


def uniform_fields(fmt_name: str, scope: Iterable[str], compile: bool, options: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a recipe giving one format (with ``options``) to every operand in ``scope``."""
    scopes = parse_scope(list(scope), "scope", "<python>")
    name = check_format(str(fmt_name).lower(), options, "format", "<python>")
    return dict(name=default_name(name, scopes), format=FormatChoice(name, frozen_options(options)), scope=scopes,
                compile=parse_bool(compile, "compile", "<python>"))


def recipe_fields(data: Mapping[str, Any], source: str, defaults: Optional[Mapping[str, Any]] = None
                  ) -> dict[str, Any]:
    """The fields of a recipe from the recipe schema (docs/recipes.md); ``defaults`` fill keys ``data`` omits."""
    if not isinstance(data, Mapping):
        raise RecipeError(f"{source}: a recipe must be a mapping, got {type(data).__name__}")
    check_keys(data, TOP_KEYS, "", source)
    merged = expand_preset({**(defaults or {}), **data}, source)
    scopes = parse_scope(merged.get("scope", list(DEFAULT_SCOPE)), "scope", source)
    options = as_mapping(merged.get("options", {}), "options", source)
    fmt_name = check_top_format(merged.get("format", PASSTHROUGH_DEFAULT), options, source)
    default = FormatChoice(fmt_name, frozen_options(options))
    overrides = parse_overrides(merged.get("operands", {}), ALL_OPERANDS, "operands", source, default)
    rules = merged.get("rules", [])
    if not isinstance(rules, list):
        raise RecipeError(f"{source}: rules: expected a list of rules, got {show_value(rules)}")
    parsed_rules = tuple(parse_rule(r, f"rules[{i}]", source, default) for i, r in enumerate(rules))
    name = merged.get("name") or default_name(fmt_name, scopes)
    problem = name_problem(name)
    if problem is not None:
        raise RecipeError(f"{source}: name: {show_value(name)} is invalid ({problem}); allowed: {NAME_RULE}")
    return dict(name=name, format=default, scope=scopes, operands=overrides, rules=parsed_rules,
                compile=parse_bool(merged.get("compile", False), "compile", source),
                seed=parse_seed(merged.get("seed"), source),
                schedule=(merged.get("schedule"), merged.get("evaluation")),  # read by ``recipes.schedule``
                backward_override=parse_backward_override(merged.get("backward_override"), source),
                dequantized_roles=parse_columnwise_source(merged.get("columnwise_source"), source),
                accumulate=parse_accumulate(merged.get("accumulate"), source))


def read_file(path: str | os.PathLike, source: Optional[str] = None) -> tuple[Any, str]:
    """(the recipe dict of a ``.yaml``/``.yml``/``.json`` UTF-8 file, its ``name`` defaulting to the file
    stem; the source errors name: ``source``, else the path)."""
    path = Path(path)
    source = source or str(path)
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise RecipeError(f"{source}: unknown recipe file type {suffix!r}; use .yaml, .yml or .json")
    try:  # a FIFO, a device or a huge file is refused, not read
        text = yaml_safe.read_text_file(path, source)
    except yaml_safe.YamlError as exc:
        raise RecipeError(str(exc)) from None
    try:
        data = json.loads(text) if suffix == ".json" else load_yaml(text, source)
    except RecursionError:
        raise RecipeError(f"{source}: nested too deeply to be a recipe") from None
    except (ValueError, yaml.YAMLError) as exc:
        if isinstance(exc, RecipeError):
            raise
        raise RecipeError(f"{source}: not valid {suffix[1:]}: {' '.join(str(exc).split())[:300]}") from exc
    data = {} if data is None else data
    if isinstance(data, Mapping) and data.get("name") in (None, ""):  # absent, `name:` or `name: ""`
        data = {**data, "name": path.stem}
    return data, source


def env_sources(environ: Mapping[str, str]) -> tuple[dict[str, Any], Optional[str], str]:
    """(the recipe keys CUSTOM_QUANT_TYPE, CUSTOM_QUANT_SCOPE, CUSTOM_QUANT_COMPILE and
    CUSTOM_QUANT_ACCUMULATE give, the CUSTOM_QUANT_RECIPE file or None, the source errors name). With a
    file, the keys fill only what the file omits."""
    check_env_names(environ)
    defaults: dict[str, Any] = {}
    if environ.get(TYPE_ENV):
        defaults["format"] = environ[TYPE_ENV].strip().lower()
    if environ.get(SCOPE_ENV):
        defaults["scope"] = [s.strip() for s in environ[SCOPE_ENV].split(",")]
    if environ.get(COMPILE_ENV):
        defaults["compile"] = environ[COMPILE_ENV].strip().lower()
    defaults.update(accumulate_override(environ))
    path = environ.get(RECIPE_ENV) or None
    source = f"{RECIPE_ENV}={path}" if path else f"{TYPE_ENV}/{SCOPE_ENV}"
    return defaults, path, source
