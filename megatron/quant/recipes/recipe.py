"""QuantRecipe: which numeric format each GEMM operand of each module gets.

A recipe is parsed and validated once (from CUSTOM_QUANT_TYPE / CUSTOM_QUANT_SCOPE /
CUSTOM_QUANT_RECIPE, a dict, or Python) and resolved once per module at model build
(``resolve``); the layers never look anything up per call.

A top-level ``format`` may name a preset (``megatron.quant.recipes.presets``, e.g. ``te-nvfp4``): the
preset's recipe dict, with the other given keys merged over it (``presets.merge_preset``).

Resolution for one module: start from ``format`` for the operands that ``scope`` covers
(none for the others), apply the global per-operand ``operands`` overrides, then every
matching rule in order (later rules win).
"""
from __future__ import annotations

import json
import os
import reprlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import yaml

from megatron.quant import formats
from megatron.quant.recipes import ablations, presets
from megatron.quant.recipes.flags import switch_value, unknown_variables
from megatron.quant.recipes.names import NAME_RULE, name_problem
from megatron.quant import kernels
# Layer selectors share their grammar and parser with the capture filters (TENSOR_SAVE_LAYERS).
from megatron.quant.recipes.operands import ALL_OPERANDS, ROLES, SCOPES, operands_for_role
from megatron.quant.recipes.selectors import SIGNED_GRAMMAR, Selector as LayerSelector, parse_selectors
from megatron.quant.recipes.operands import LINEAR_ROLES  # unquantized_layers: the decoder layer's linear roles

DEFAULT_SCOPE = ("linear", "attention")
PASSTHROUGH_DEFAULT = "bf16"

_TOP_KEYS = ("name", "format", "options", "scope", "operands", "rules", "compile", "seed")
_RULE_KEYS = ("match", "format", "options", "operands")
_MATCH_KEYS = ("roles", "layers")
_OVERRIDE_KEYS = ("format", "options")


class RecipeError(ValueError):
    """A recipe value that cannot be used; the message names where it came from."""


ENV_VARS = ("CUSTOM_QUANT_TYPE", "CUSTOM_QUANT_SCOPE", "CUSTOM_QUANT_RECIPE", "CUSTOM_QUANT_COMPILE", kernels.ENV)
# A recipe is a few hundred values; more through YAML aliases is an alias bomb ("billion laughs").
MAX_YAML_VALUES = 100_000
_SHOWN = reprlib.Repr()  # errors show a bounded excerpt of a value, however large or nested it is
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlevel, _SHOWN.maxlist = 80, 80, 3, 8


def check_env_names(environ: Mapping[str, str]) -> None:
    """RecipeError for a CUSTOM_QUANT_* variable that is none of ENV_VARS (e.g. CUSTOM_QUANT_TPYE)."""
    unknown = unknown_variables(environ, ("CUSTOM_QUANT_",), ENV_VARS, "recipe")
    if unknown:
        raise RecipeError(unknown)


def _show(value: Any, limit: int = 120) -> str:
    text = _SHOWN.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _yaml_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """The values ``node`` expands to with its aliases followed (shared nodes counted per use),
    without expanding them; above MAX_YAML_VALUES (or a cycle) counts as too many."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    sizes[key] = MAX_YAML_VALUES + 1  # while counting: a node that contains itself is too large
    children = ([part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode)
                else node.value if isinstance(node, yaml.SequenceNode) else [])
    total = 1
    for child in children:
        total += _yaml_size(child, sizes)
        if total > MAX_YAML_VALUES:
            break
    sizes[key] = min(total, MAX_YAML_VALUES + 1)
    return sizes[key]


def _load_yaml(text: str, source: str) -> Any:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _yaml_size(node, {}) > MAX_YAML_VALUES:
            raise RecipeError(f"{source}: expands to more than {MAX_YAML_VALUES} values through YAML aliases; "
                              f"refused (a recipe needs a few hundred)")
        return loader.construct_document(node)
    finally:
        loader.dispose()


@dataclass(frozen=True)
class FormatChoice:
    """A format name (or passthrough) and its options; ``name`` None keeps the inherited name."""

    name: Optional[str] = None
    options: tuple[tuple[str, Any], ...] = ()

    def over(self, base: "FormatChoice") -> "FormatChoice":
        """This choice applied on top of ``base`` (options merge only when the format is kept)."""
        if self.name is None or self.name == base.name:
            return FormatChoice(base.name, tuple({**dict(base.options), **dict(self.options)}.items()))
        return self


@dataclass(frozen=True)
class Rule:
    roles: Optional[frozenset[str]] = None
    layers: Optional[tuple[LayerSelector, ...]] = None
    format: Optional[FormatChoice] = None
    operands: tuple[tuple[str, FormatChoice], ...] = ()

    def matches(self, role: str, layer_idx: int, num_layers: int) -> bool:
        if self.roles is None and role == "output_layer":
            return False  # the LM head is quantized only by rules that name it
        if self.roles is not None and role not in self.roles:
            return False
        return self.layers is None or any(s.matches(layer_idx, num_layers) for s in self.layers)


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

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def uniform(cls, fmt_name: str, scope: Iterable[str] = DEFAULT_SCOPE, *, compile: bool = False,
                **options: Any) -> "QuantRecipe":
        """One format (with ``options``) for every operand in ``scope``."""
        scopes = _parse_scope(list(scope), "scope", "<python>")
        name = _check_format(str(fmt_name).lower(), options, "format", "<python>")
        return cls(name=_default_name(name, scopes), format=FormatChoice(name, _options(options)),
                   scope=scopes, compile=_parse_bool(compile, "compile", "<python>"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>",
                  defaults: Optional[Mapping[str, Any]] = None) -> "QuantRecipe":
        """Parse the recipe schema (see docs/recipes.md); ``defaults`` fill keys ``data`` omits."""
        if not isinstance(data, Mapping):
            raise RecipeError(f"{source}: a recipe must be a mapping, got {type(data).__name__}")
        _check_keys(data, _TOP_KEYS, "", source)
        merged = _expand_preset({**(defaults or {}), **data}, source)
        scopes = _parse_scope(merged.get("scope", list(DEFAULT_SCOPE)), "scope", source)
        options = _mapping(merged.get("options", {}), "options", source)
        fmt_name = _check_top_format(merged.get("format", PASSTHROUGH_DEFAULT), options, source)
        default = FormatChoice(fmt_name, _options(options))
        overrides = _parse_overrides(merged.get("operands", {}), ALL_OPERANDS, "operands", source, default)
        rules = merged.get("rules", [])
        if not isinstance(rules, list):
            raise RecipeError(f"{source}: rules: expected a list of rules, got {_show(rules)}")
        parsed_rules = tuple(_parse_rule(r, f"rules[{i}]", source, default) for i, r in enumerate(rules))
        name = merged.get("name") or _default_name(fmt_name, scopes)
        problem = name_problem(name)
        if problem is not None:
            raise RecipeError(f"{source}: name: {_show(name)} is invalid ({problem}); allowed: {NAME_RULE}")
        return cls(name=name, format=default, scope=scopes, operands=overrides, rules=parsed_rules,
                   compile=_parse_bool(merged.get("compile", False), "compile", source),
                   seed=_parse_seed(merged.get("seed"), source))

    @classmethod
    def from_file(cls, path: str | os.PathLike, defaults: Optional[Mapping[str, Any]] = None,
                  source: Optional[str] = None) -> "QuantRecipe":
        """Load a ``.yaml``/``.yml``/``.json`` UTF-8 recipe; ``name`` defaults to the file stem.
        ``source`` names it in errors (default: the path; e.g. ``CUSTOM_QUANT_RECIPE=path``)."""
        path = Path(path)
        source = source or str(path)
        suffix = path.suffix.lower()
        if suffix not in (".yaml", ".yml", ".json"):
            raise RecipeError(f"{source}: unknown recipe file type {suffix!r}; use .yaml, .yml or .json")
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise RecipeError(f"{source}: cannot read recipe file: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise RecipeError(f"{source}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                              f"{exc.start}); save the recipe as UTF-8") from None
        try:
            data = json.loads(text) if suffix == ".json" else _load_yaml(text, source)
        except RecursionError:
            raise RecipeError(f"{source}: nested too deeply to be a recipe") from None
        except (ValueError, yaml.YAMLError) as exc:
            if isinstance(exc, RecipeError):
                raise
            raise RecipeError(f"{source}: not valid {suffix[1:]}: {' '.join(str(exc).split())[:300]}") from exc
        data = {} if data is None else data
        if isinstance(data, Mapping) and data.get("name") in (None, ""):  # absent, `name:` or `name: ""`
            data = {**data, "name": path.stem}
        return cls.from_dict(data, source=source, defaults=defaults)

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "QuantRecipe":
        """CUSTOM_QUANT_RECIPE (file) or CUSTOM_QUANT_TYPE (default bf16) with CUSTOM_QUANT_SCOPE
        and CUSTOM_QUANT_COMPILE.

        With a recipe file, the other variables fill only the keys the file omits.
        """
        env = os.environ if environ is None else environ
        check_env_names(env)
        defaults: dict[str, Any] = {}
        if env.get("CUSTOM_QUANT_TYPE"):
            defaults["format"] = env["CUSTOM_QUANT_TYPE"].strip().lower()
        if env.get("CUSTOM_QUANT_SCOPE"):
            defaults["scope"] = [s.strip() for s in env["CUSTOM_QUANT_SCOPE"].split(",")]
        if env.get("CUSTOM_QUANT_COMPILE"):
            defaults["compile"] = env["CUSTOM_QUANT_COMPILE"].strip().lower()
        if env.get("CUSTOM_QUANT_RECIPE"):
            return cls.from_file(env["CUSTOM_QUANT_RECIPE"], defaults=defaults,
                                 source=f"CUSTOM_QUANT_RECIPE={env['CUSTOM_QUANT_RECIPE']}")
        return cls.from_dict(defaults, source="CUSTOM_QUANT_TYPE/CUSTOM_QUANT_SCOPE")

    # ---- resolution ---------------------------------------------------------------------
    def choices(self, role: str, layer_idx: int, num_layers: int) -> dict[str, FormatChoice]:
        """Format choice per operand key of a module with ``role`` at 0-based ``layer_idx``."""
        if role not in ROLES:
            raise ValueError(f"unknown module role {role!r}; valid: {', '.join(ROLES)}")
        keys = operands_for_role(role)
        in_scope = {k for s in self.scope for k in SCOPES[s]} if role != "output_layer" else set()
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
        return chosen

    def resolve(self, role: str, layer_idx: int, num_layers: int,
                shared: Optional[dict[FormatChoice, Any]] = None) -> dict[str, Any]:
        """Operand key -> built ``NumericFormat``, or None where nothing is fake-quantized.

        ``shared``: formats already built for other modules of the same model, reused (and
        extended) so that equal choices share one instance (and, with ``compile``, its kernels).
        """
        shared = {} if shared is None else shared
        return {key: self._build(c, shared) for key, c in self.choices(role, layer_idx, num_layers).items()}

    def quantizes_output_layer(self, num_layers: int) -> bool:
        """Whether a rule gives the output layer (LM head) a format: only then is it a quantized,
        capturing module."""
        return any(not formats.is_passthrough(c.name) for c in self.choices("output_layer", -1, num_layers).values())

    def capture_roles(self, num_layers: int) -> tuple[str, ...]:
        """The roles of the modules that capture: every decoder layer's, and the output layer's
        when it is quantized."""
        return (*LINEAR_ROLES, "core_attention") + (("output_layer",) if self.quantizes_output_layer(num_layers)
                                                   else ())

    def formats(self, num_layers: int) -> list[Any]:
        """Every distinct format the recipe quantizes with (plain ``NumericFormat`` objects)."""
        chosen = {c for role in ROLES for layer in range(num_layers)
                  for c in self.choices(role, layer, num_layers).values() if not formats.is_passthrough(c.name)}
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

    def _build(self, choice: FormatChoice, shared: dict[FormatChoice, Any]) -> Any:
        if formats.is_passthrough(choice.name):
            return None
        if choice not in shared:
            fmt = formats.get_format(choice.name, **dict(choice.options))
            shared[choice] = kernels.wrap(fmt, self.compile)  # Triton, compiled or eager: CUSTOM_QUANT_KERNELS
        return shared[choice]



# ---- parsing helpers ------------------------------------------------------------------------
def _where(path: str) -> str:
    return path or "<top level>"


def _freeze(value: Any) -> Any:
    """Lists (YAML/JSON ``block_shape: [16, 16]``) as tuples: FormatChoice keys the shared formats."""
    return tuple(_freeze(v) for v in value) if isinstance(value, list) else value


def _options(options: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple((k, _freeze(v)) for k, v in options.items())


def _check_keys(data: Mapping, allowed: tuple[str, ...], path: str, source: str) -> None:
    for key in data:
        if key not in allowed:
            raise RecipeError(f"{source}: {_where(path + '.' + str(key) if path else str(key))}: "
                              f"unknown key {key!r}; allowed: {', '.join(allowed)}")


def _mapping(value: Any, path: str, source: str) -> dict:
    if not isinstance(value, Mapping):
        raise RecipeError(f"{source}: {path}: expected a mapping, got {_show(value)}")
    return dict(value)


def _valid_format_names() -> list[str]:
    return sorted(set(formats.list_formats()) | set(formats.ALIASES))


def _is_format_name(name: str) -> bool:
    try:
        formats.canonical_name(name)
    except ValueError:
        return False
    return True


def _check_top_format(name: Any, options: Mapping, source: str) -> str:
    """The top-level format, where an unknown name's message also lists the presets."""
    if isinstance(name, str) and not _is_format_name(name):
        raise RecipeError(f"{source}: format: unknown format or preset {_show(name)}; valid: "
                          f"{', '.join(_valid_format_names() + presets.preset_names())}, or a variant "
                          f"(PRESET-no-COMPONENT, FORMAT+COMPONENT; components: {', '.join(ablations.COMPONENTS)})")
    return _check_format(name, options, "format", source)


def _expand_preset(data: dict[str, Any], source: str) -> dict[str, Any]:
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
        scopes = _parse_scope(merged.get("scope", list(DEFAULT_SCOPE)), "scope", source)
        changed = scopes != frozenset(preset.get("scope", DEFAULT_SCOPE))
        merged["name"] = key + ("-" + "+".join(sorted(scopes)) if changed else "")
    return merged


def _check_format(name: Any, options: Mapping, path: str, source: str) -> str:
    """Build the format once to validate name and options; return the name as given."""
    if not isinstance(name, str):
        raise RecipeError(f"{source}: {path}: format must be a string, got {_show(name)}; "
                          f"valid: {', '.join(_valid_format_names())}")
    name = name.strip().lower()
    if formats.is_passthrough(name):
        if options:
            raise RecipeError(f"{source}: {path}: passthrough format {_show(name)} takes no options, "
                              f"got {_show(dict(options))}")
        return name
    try:
        formats.get_format(name, **dict(options))
    except (ValueError, TypeError) as exc:  # the formats' message lists the valid names/values
        raise RecipeError(f"{source}: {path}: format {_show(name)} with options {_show(dict(options))} "
                          f"is refused: {exc}") from exc
    return name


def _parse_bool(value: Any, path: str, source: str) -> bool:
    switch = value if isinstance(value, bool) else switch_value(str(value))
    if switch is not None:
        return switch
    raise RecipeError(f"{source}: {path}: {_show(value)} is not a boolean; use true/false, 1/0, yes/no or on/off")


def _parse_seed(value: Any, source: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise RecipeError(f"{source}: seed: {_show(value)} must be a non-negative integer")
    return value


def _parse_scope(value: Any, path: str, source: str) -> frozenset[str]:
    items = value if isinstance(value, (list, tuple)) else [value]
    if not items or not all(isinstance(s, str) and s in SCOPES for s in items):
        raise RecipeError(f"{source}: {path}: invalid scope {_show(value)}; allowed (comma list): {', '.join(SCOPES)}")
    return frozenset(items)


def _parse_choice(value: Any, path: str, source: str, base: FormatChoice) -> FormatChoice:
    """``{format:, options:}`` or a bare format name; validated against the inherited format."""
    if isinstance(value, str):
        value = {"format": value}
    data = _mapping(value, path, source)
    _check_keys(data, _OVERRIDE_KEYS, path, source)
    options = _mapping(data.get("options", {}), path + ".options", source)
    choice = FormatChoice(data.get("format"), _options(options))
    effective = choice.over(base)
    _check_format(effective.name, dict(effective.options), path, source)
    return FormatChoice(None if choice.name is None else str(choice.name).strip().lower(), choice.options)


def _parse_overrides(value: Any, allowed: tuple[str, ...], path: str, source: str,
                     base: FormatChoice) -> tuple[tuple[str, FormatChoice], ...]:
    data = _mapping(value, path, source)
    _check_keys(data, allowed, path, source)
    return tuple((k, _parse_choice(v, f"{path}.{k}", source, base)) for k, v in data.items())


def _parse_layers(value: Any, path: str, source: str) -> tuple[LayerSelector, ...]:
    selectors: list[LayerSelector] = []
    for i, item in enumerate(value if isinstance(value, list) else [value]):
        try:
            selectors.extend(parse_selectors(item, signed=True))
        except ValueError as exc:
            raise RecipeError(f"{source}: {path}[{i}]: invalid layer selector {_show(item)} ({exc}); "
                              f"use {SIGNED_GRAMMAR}") from None
    return tuple(selectors)


def _parse_rule(value: Any, path: str, source: str, default: FormatChoice) -> Rule:
    data = _mapping(value, path, source)
    _check_keys(data, _RULE_KEYS, path, source)
    match = _mapping(data.get("match", {}), path + ".match", source)
    _check_keys(match, _MATCH_KEYS, path + ".match", source)
    roles = None
    if "roles" in match:
        roles_value = match["roles"] if isinstance(match["roles"], list) else [match["roles"]]
        bad = [r for r in roles_value if r not in ROLES]
        if bad or not roles_value:
            raise RecipeError(f"{source}: {path}.match.roles: invalid role(s) {_show(bad or roles_value)}; "
                              f"allowed: {', '.join(ROLES)}")
        roles = frozenset(roles_value)
    layers = _parse_layers(match["layers"], path + ".match.layers", source) if "layers" in match else None
    fmt = None
    if "format" in data or "options" in data:
        options = _mapping(data.get("options", {}), path + ".options", source)
        fmt = FormatChoice(_check_format(data.get("format", default.name), options, path + ".format", source),
                           _options(options))
    operands = _parse_overrides(data.get("operands", {}), ALL_OPERANDS, path + ".operands", source,
                                fmt or default)
    if fmt is None and not operands:
        raise RecipeError(f"{source}: {path}: a rule needs 'format'/'options' or 'operands'")
    return Rule(roles=roles, layers=layers, format=fmt, operands=operands)


def _default_name(fmt_name: str, scopes: frozenset[str]) -> str:
    if scopes == frozenset(DEFAULT_SCOPE):
        return fmt_name
    return fmt_name + "-" + "+".join(sorted(scopes))

