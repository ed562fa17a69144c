"""Named recipes reproducing production low-precision recipes, and Megatron-LM's precision flags.

A preset is data: a recipe dict in the ``QuantRecipe.from_dict`` schema, usable wherever a
top-level format name is (``CUSTOM_QUANT_TYPE=te-nvfp4``, ``format: te-nvfp4`` in a recipe
file). All presets quantize the linear layers only (``scope: linear``): Transformer Engine
leaves attention's batched GEMMs in high precision unless ``fp8_dpa`` is set.

| preset | reproduces (Transformer Engine ``transformer_engine/common/recipe/__init__.py``) |
|---|---|
| ``te-nvfp4`` | ``NVFP4BlockScaling`` (defaults: 2D weights, RHT on wgrad operands, SR on gradients with the
hardware's 8-bit draw, ``rounding: stochastic8``) |
| ``te-mxfp8`` | ``MXFP8BlockScaling`` (E4M3 everywhere, E8M0 scales rounded up: "rceil") |
| ``te-fp8-current`` | ``Float8CurrentScaling`` (default HYBRID: E4M3 forward, E5M2 gradients) |
| ``te-fp8-blockwise`` | ``Float8BlockScaling`` (DeepSeek-V3: 1x128 activations/gradients, 128x128 weights) |
| ``te-fp8-delayed`` | ``DelayedScaling`` (defaults: HYBRID, amax history of 1024, "max", margin 0) |
| ``te-nvfp4-4over6`` | ``NVFP4BlockScaling(disable_rht=True, nvfp4_4over6="all")`` (4over6 MAE, bound 256) |
| ``te-nvfp4-row-scaled`` | ``NVFP4BlockScaling(row_scaled_activation=True)`` (an FP32 scale per row of the input) |
| ``te-nvfp4-1d-weight`` | ``quantizer_factory_zoo.nvfp4_1d_weight_factory`` (1D weights, dgrad's from the forward's) |
| ``te-mxfp8-2d`` | ``MXFP8BlockScaling(enable_2d_quantization=True)`` (32x32 weight tiles) |
| ``te-mxfp8-bwd-hp`` | ``MXFP8BlockScaling(backward_override="high_precision")`` |
| ``te-mxfp8-bwd-dq`` | ``MXFP8BlockScaling(backward_override="dequantized")`` |
| ``te-mxfp8-fwd-nvfp4-bwd`` | ``quantizer_factory_zoo.mxfp8_fwd_nvfp4_bwd_factory`` (MXFP8 forward, NVFP4 backward) |

``te-fp8-current`` and ``te-fp8-delayed`` add their GEMMs' products as TE does on Hopper
(``TE_HOPPER_ACCUMULATE``: fprop fast, dgrad and wgrad promoted; ``formats.accumulation``); the other
presets sum exactly in FP32 (their accumulators are not modelled).

Every preset sets ``nonfinite="te"``: Inf and NaN as TE's kernels take them (amaxes skip NaN;
an Inf amax gives scale 1, E8M0 0xFE, or NVFP4's saturated E4M3 block scale).

The RHT of ``te-nvfp4`` uses TE's hard-coded 16-entry sign vector (``get_wgrad_sign_vector`` in
TE's ``nvfp4_tensor.py``), one for all layers and steps; TE's NVFP4 docs (and some later code)
describe signs re-drawn every iteration, which is not emulated.

Merge rule (``merge_preset``): keys given next to a preset override the preset's, except
``options``, ``operands`` and an ``accumulate`` mapping over the preset's, merged key by key (the given
ones win; an operand's options merge while it keeps the preset's format), and ``rules``, appended after
the preset's. This module
imports nothing of ours: ``recipe`` imports it.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Optional, Protocol, Union

from megatron.quant.formats.registry import MAX_AMAX_HISTORY_LEN

# How Transformer Engine runs each linear GEMM of a per-tensor FP8 recipe on Hopper (use_split_accumulator:
# False is fast accumulation, True promoted): Float8CurrentScaling's fp8_gemm_fprop = MMParams(
# use_split_accumulator=False), fp8_gemm_dgrad and fp8_gemm_wgrad True (transformer_engine/common/recipe/
# __init__.py); DelayedScaling has no MMParams and its GEMMs take module/base.py's _2X_ACC_FPROP False,
# _2X_ACC_DGRAD and _2X_ACC_WGRAD True (module/linear.py). The te-fp8-current and te-fp8-delayed presets
# (so Megatron-LM's --fp8-recipe tensorwise and delayed) accumulate so; ``-no-hopper-acc``, a recipe file's
# ``accumulate: exact`` or CUSTOM_QUANT_ACCUMULATE=exact ask for exact sums; ``+hopper-acc`` adds it to a recipe.
TE_HOPPER_ACCUMULATE = {"fprop": "fast", "dgrad": "promoted", "wgrad": "promoted"}
# Float8BlockScaling fixes use_split_accumulator=True for all three GEMMs (its __post_init__ asserts it); the
# accumulator of a block-scaled FP8 GEMM is not modelled (docs/gemm.md).
TE_BLOCK_ACCUMULATE = ("split accumulator (promoted) in fprop, dgrad and wgrad, Float8BlockScaling's only choice; "
                       "a block-scaled GEMM's accumulator is not modelled")


def te_hopper_accumulation(kinds: Iterable[str]) -> Union[dict[str, str], str, None]:
    """What TE's GEMMs do on Hopper in a recipe whose formats are of ``kinds`` ("tensor": per-tensor
    scaled FP8; "block": block-scaled FP8; anything else): the modes per GEMM for per-tensor FP8,
    a sentence for block-scaled FP8, None where TE has no Hopper FP8 GEMM of them (or no format)."""
    found = set(kinds)
    if found == {"tensor"}:
        return dict(TE_HOPPER_ACCUMULATE)
    return TE_BLOCK_ACCUMULATE if found == {"block"} else None


GRADIENTS = ("dgrad.grad_output", "wgrad.grad_output")
WEIGHTS = ("fprop.weight", "dgrad.weight")
WGRAD = ("wgrad.grad_output", "wgrad.input")
# SR as TE's kernels draw it: cvt.rs takes 8 random bits per element (formats.rounding.round_stochastic_).
_STOCHASTIC = {"rounding": "stochastic8"}
_TE = {"nonfinite": "te"}  # Inf and NaN as TE's kernels treat them (fmaxf amaxes; an Inf amax gives scale 1)
_DELAYED = {"scaling": "delayed", "amax_history_len": 1024, "amax_compute_algo": "max", **_TE}

# ---- Transformer Engine's 2026 options (releases 2.19-2.21): NVFP4 4over6 and row scaling, MXFP8 2D
# weights, backward_override, and formats per direction as its quantizer zoo's hybrid quantizers.
_NVFP4_PLAIN = {"format": "nvfp4", "options": dict(_TE)}  # 1D, no RHT, no SR (the zoo's _plain_nvfp4_quantizer)
_4OVER6 = {"four_over_six": "mae", "e4m3_max": 256}  # TE's defaults: err_mode MAE, e4m3_use_256 "all"
_MXFP8 = {"format": "mxfp8_e4m3", "options": {"scale_mode": "rceil", **_TE}, "scope": ["linear"]}
_TE_2026: dict[str, tuple[str, dict[str, Any]]] = {
    "te-nvfp4-4over6": ("TE NVFP4BlockScaling(disable_rht=True, nvfp4_4over6='all'): 4over6 MAE, E4M3 bound 256", {
        "format": "nvfp4", "scope": ["linear"], "options": {**_TE, **_4OVER6},
        "operands": {
            **{key: {"options": {"block_shape": [16, 16]}} for key in WEIGHTS},
            **{key: {"options": {"four_over_six": "off", "e4m3_max": 448, **_STOCHASTIC}} for key in GRADIENTS},
        }}),
    "te-nvfp4-row-scaled": ("TE NVFP4BlockScaling(row_scaled_activation=True)", {
        "format": "nvfp4", "scope": ["linear"], "options": dict(_TE),
        "operands": {
            **{key: {"options": {"block_shape": [16, 16]}} for key in WEIGHTS},
            "fprop.input": {"options": {"row_scaled": True}},
            "dgrad.grad_output": {"options": dict(_STOCHASTIC)},
            "wgrad.grad_output": {"options": {"hadamard": 16, **_STOCHASTIC}},
            "wgrad.input": {"options": {"hadamard": 16, "row_scaled": True}},
        }}),
    "te-nvfp4-1d-weight": ("TE quantizer_factory_zoo.nvfp4_1d_weight_factory", {
        "format": "nvfp4", "scope": ["linear"], "options": dict(_TE),
        "columnwise_source": {"weight": "rowwise_dequantized"},
        "operands": {
            "dgrad.grad_output": {"options": dict(_STOCHASTIC)},
            "wgrad.grad_output": {"options": {"hadamard": 16, **_STOCHASTIC}},
            "wgrad.input": {"options": {"hadamard": 16}},
        }}),
    "te-mxfp8-2d": ("TE MXFP8BlockScaling(enable_2d_quantization=True): 32x32 weight tiles", {
        **_MXFP8, "operands": {key: {"options": {"block_shape": [32, 32]}} for key in WEIGHTS}}),
    "te-mxfp8-bwd-hp": ("TE MXFP8BlockScaling(backward_override='high_precision')", {
        **_MXFP8, "backward_override": "high_precision"}),
    "te-mxfp8-bwd-dq": ("TE MXFP8BlockScaling(backward_override='dequantized')", {
        **_MXFP8, "backward_override": "dequantized"}),
    "te-mxfp8-fwd-nvfp4-bwd": ("TE quantizer_factory_zoo.mxfp8_fwd_nvfp4_bwd_factory", {
        **_MXFP8, "columnwise_source": {"weight": "rowwise_dequantized"},
        "operands": {
            "dgrad.grad_output": {**_NVFP4_PLAIN, "options": {**_TE, **_STOCHASTIC}},
            "dgrad.weight": _NVFP4_PLAIN,
            "wgrad.grad_output": {**_NVFP4_PLAIN, "options": {**_TE, "hadamard": 16, **_STOCHASTIC}},
            "wgrad.input": {**_NVFP4_PLAIN, "options": {**_TE, "hadamard": 16}},
        }}),
}

# name -> (source, recipe dict). Operand overrides without "format" keep the preset's format
# and add options (QuantRecipe's override semantics).
_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "te-nvfp4": ("TE NVFP4BlockScaling; NVIDIA, 'Pretraining LLMs with NVFP4' (2025)", {
        "format": "nvfp4", "scope": ["linear"], "options": dict(_TE),
        "operands": {
            "fprop.weight": {"options": {"block_shape": [16, 16]}},   # 2D: W and W^T quantize alike
            "dgrad.weight": {"options": {"block_shape": [16, 16]}},
            "dgrad.grad_output": {"options": dict(_STOCHASTIC)},     # rowwise gradient: SR, no RHT
            "wgrad.grad_output": {"options": {"hadamard": 16, **_STOCHASTIC}},  # columnwise: RHT + SR
            "wgrad.input": {"options": {"hadamard": 16}},            # columnwise activation: RHT
        }}),
    "te-mxfp8": ("TE MXFP8BlockScaling (fp8_format E4M3)", {
        "format": "mxfp8_e4m3", "options": {"scale_mode": "rceil", **_TE}, "scope": ["linear"]}),
    "te-fp8-current": ("TE Float8CurrentScaling (fp8_format HYBRID); Megatron-LM --fp8-recipe tensorwise", {
        "format": "fp8_e4m3", "scope": ["linear"], "options": dict(_TE), "accumulate": dict(TE_HOPPER_ACCUMULATE),
        "operands": {key: {"format": "fp8_e5m2", "options": dict(_TE)} for key in GRADIENTS}}),
    "te-fp8-blockwise": ("TE Float8BlockScaling (DeepSeek-V3); Megatron-LM --fp8-recipe blockwise", {
        "format": "fp8_e4m3", "scope": ["linear"],
        "options": {"scaling": "block", "block_shape": [1, 128], "power_of_two_scales": True, **_TE},
        "operands": {key: {"options": {"block_shape": [128, 128]}} for key in WEIGHTS}}),
    "te-fp8-delayed": ("TE DelayedScaling (fp8_format HYBRID, amax_history_len 1024, amax_compute_algo max)", {
        "format": "fp8_e4m3", "scope": ["linear"], "options": dict(_DELAYED), "accumulate": dict(TE_HOPPER_ACCUMULATE),
        "operands": {key: {"format": "fp8_e5m2", "options": dict(_DELAYED)} for key in GRADIENTS}}),
    **_TE_2026,
    # Mixture-of-experts recipes. DeepSeek-V3's FP8 training (DeepSeek-V3 technical report, section 3.3;
    # its DeepGEMM kernels): E4M3 for every GEMM operand, forward and backward, 1x128 tiles for
    # activations and gradients and 128x128 blocks for weights, each scaled from its own amax by an FP32
    # factor (not rounded to a power of two, as TE's Float8BlockScaling does by default). The router, the
    # embeddings, the LM head and attention's batched GEMMs stay in high precision, as in the report: the
    # lab leaves them unquantized unless a rule names them.
    "deepseek-v3-fp8": ("DeepSeek-V3 FP8 (1x128 activations and gradients, 128x128 weights, E4M3, FP32 scales)", {
        "format": "fp8_e4m3", "scope": ["linear"],
        "options": {"scaling": "block", "block_shape": [1, 128], "power_of_two_scales": False, **_TE},
        "operands": {key: {"options": {"block_shape": [128, 128]}} for key in WEIGHTS}}),
}
# ---- Stochastic rounding's draw and recipes that change during a run (docs/recipes.md) ----


def _te_nvfp4_with(rounding: str) -> dict[str, Any]:
    """te-nvfp4 with ``rounding`` on its stochastically rounded gradients."""
    recipe = copy.deepcopy(_PRESETS["te-nvfp4"][1])
    for key in GRADIENTS:
        recipe["operands"][key]["options"]["rounding"] = rounding
    return recipe


_PRESETS.update({
    "te-nvfp4-sr24": ("te-nvfp4 with the continuous stochastic-rounding draw (24 bits) instead of the "
                      "hardware's 8 (cvt.rs)", _te_nvfp4_with("stochastic")),
})
PRESETS: Mapping[str, tuple[str, Mapping[str, Any]]] = MappingProxyType(_PRESETS)


class PresetError(ValueError):
    """A preset or precision flag that cannot be emulated; the message names it and the alternatives."""


def preset_names() -> list[str]:
    return list(PRESETS)


def is_preset(name: Any) -> bool:
    return isinstance(name, str) and name.strip().lower() in preset_names()


def preset_source(name: str) -> str:
    return PRESETS[name.strip().lower()][0]


def get_preset(name: str) -> dict[str, Any]:
    """A deep copy of preset ``name``'s recipe dict; PresetError for unknown names."""
    key = name.strip().lower()
    if key not in PRESETS:
        raise PresetError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}")
    return copy.deepcopy(dict(PRESETS[key][1]))


def merge_preset(preset: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` (a recipe dict without ``format``) applied over ``preset`` (see the module docstring)."""
    merged = {**preset, **data}
    if "options" in preset and isinstance(data.get("options"), Mapping):
        merged["options"] = {**preset["options"], **data["options"]}
    if "operands" in preset and isinstance(data.get("operands"), Mapping):
        merged["operands"] = {**preset["operands"], **{key: _merge_operand(preset["operands"].get(key), value)
                                                       for key, value in data["operands"].items()}}
    if isinstance(preset.get("accumulate"), Mapping) and isinstance(data.get("accumulate"), Mapping):
        merged["accumulate"] = {**preset["accumulate"], **data["accumulate"]}  # one GEMM changed, the others kept
    if "rules" in data and isinstance(data["rules"], list):
        merged["rules"] = list(preset.get("rules", [])) + data["rules"]
    return merged


def _merge_operand(preset: Any, given: Any) -> Any:
    """A file's operand override over the preset's: options merge while the format is kept (as
    recipe overrides do), a new format replaces the preset's entry."""
    as_dict = lambda v: {"format": v} if isinstance(v, str) else dict(v)  # noqa: E731
    if preset is None or not isinstance(given, (str, Mapping)):
        return given
    base, over = as_dict(preset), as_dict(given)
    if over.get("format", base.get("format")) != base.get("format"):
        return given
    return {**base, **over, "options": {**base.get("options", {}), **over.get("options", {})}}


# ---- Megatron-LM precision flags --------------------------------------------------------------
FP8_RECIPES = ("tensorwise", "delayed", "mxfp8", "blockwise")
_FP8_PRESETS = {"tensorwise": "te-fp8-current", "mxfp8": "te-mxfp8", "blockwise": "te-fp8-blockwise",
                "delayed": "te-fp8-delayed"}
# --fp8-format e4m3 keeps the gradients in E4M3; hybrid puts them in E5M2 (TE's Format enum).
_E4M3_GRADIENTS = {"tensorwise": "fp8_e4m3", "delayed": "fp8_e4m3"}
# blockwise + hybrid: TE's Float8BlockScaling refuses only E5M2 (``__post_init__``), so HYBRID
# gives E5M2 gradients in the same 1x128 blocks.
_E5M2_GRADIENTS = {"mxfp8": "mxfp8_e5m2", "blockwise": "fp8_e5m2"}
class PrecisionFlags(Protocol):
    """Megatron-LM's precision flags as the trainer's configuration holds them (``None``: not given)."""

    fp8_format: Optional[str]
    fp8_recipe: Optional[str]
    fp8_margin: Optional[int]
    fp8_amax_history_len: Optional[int]
    fp8_amax_compute_algo: Optional[str]
    fp4_format: Optional[str]
    fp4_recipe: Optional[str]
    no_fp8_wgrad: bool
    first_last_layers_bf16: bool
    num_layers_at_start_in_bf16: Optional[int]
    num_layers_at_end_in_bf16: Optional[int]


@dataclass(frozen=True)
class GivenFlags:
    """``PrecisionFlags`` from some of them (a precision file's training recipe): the others not given."""

    fp8_format: Optional[str] = None
    fp8_recipe: Optional[str] = None
    fp8_margin: Optional[int] = None
    fp8_amax_history_len: Optional[int] = None
    fp8_amax_compute_algo: Optional[str] = None
    fp4_format: Optional[str] = None
    fp4_recipe: Optional[str] = None
    no_fp8_wgrad: bool = False
    first_last_layers_bf16: bool = False
    num_layers_at_start_in_bf16: Optional[int] = None
    num_layers_at_end_in_bf16: Optional[int] = None


_DELAYED_ONLY = ("fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo")
# Megatron-LM's defaults for its delayed-scaling flags (TE's recipe defaults are 1024 and "max").
MEGATRON_DELAYED_DEFAULTS = {"fp8_margin": 0, "fp8_amax_history_len": 1, "fp8_amax_compute_algo": "most_recent"}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _fp8_gradients(recipe: str, fp8_format: str) -> Optional[str]:
    """The gradient operands' format where ``fp8_format`` changes it from the preset's; None to keep it."""
    if fp8_format == "e4m3":
        return _E4M3_GRADIENTS.get(recipe)
    return _E5M2_GRADIENTS.get(recipe)


def _with_options(recipe: dict[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` added to the top-level format and to every operand override naming its own format."""
    recipe["options"] = {**recipe.get("options", {}), **options}
    for key, value in recipe.get("operands", {}).items():
        if isinstance(value, str):
            recipe["operands"][key] = {"format": value, "options": dict(options)}
        elif "format" in value:
            value["options"] = {**value.get("options", {}), **options}
    return recipe


def _base_recipe(args: PrecisionFlags) -> tuple[str, dict[str, Any]]:
    """(name, recipe dict) for the --fp8-*/--fp4-* flags, before --no-fp8-wgrad and bf16 layers."""
    if args.fp4_format is not None:
        _refuse(args.fp8_format is not None, "--fp4-format and --fp8-format are mutually exclusive; give one")
        return "te-nvfp4", get_preset("te-nvfp4")  # --fp4-recipe nvfp4, the only emulated FP4 recipe
    _refuse(args.fp4_recipe is not None, f"--fp4-recipe {args.fp4_recipe} needs --fp4-format e2m1")
    recipe = args.fp8_recipe
    _refuse(args.fp8_format is None, f"--fp8-recipe {recipe} needs --fp8-format {{e4m3,hybrid}}")
    name, data = _FP8_PRESETS[recipe], get_preset(_FP8_PRESETS[recipe])
    gradients = _fp8_gradients(recipe, args.fp8_format)
    if gradients is not None:
        name += "-" + args.fp8_format
        # Another format name: the override carries the preset's top-level options (e.g. rceil) itself.
        override = {"format": gradients, "options": dict(data.get("options", {}))}
        data["operands"] = {**data.get("operands", {}), **{key: copy.deepcopy(override) for key in GRADIENTS}}
    if recipe == "delayed":
        name, data = _with_megatron_delayed_flags(name, data, args)
    return name, data


def _with_megatron_delayed_flags(name: str, data: dict[str, Any], args: PrecisionFlags) -> tuple[str, dict[str, Any]]:
    """te-fp8-delayed with Megatron-LM's flag values (its defaults where not given: a history of
    1, "most_recent", margin 0); the name spells out the history."""
    given = _delayed_flags(args)
    value = {key: MEGATRON_DELAYED_DEFAULTS[key] if v is None else v for key, v in given.items()}
    _refuse(not 1 <= value["fp8_amax_history_len"] <= MAX_AMAX_HISTORY_LEN,
            f"--fp8-amax-history-len must be 1..{MAX_AMAX_HISTORY_LEN}, got {value['fp8_amax_history_len']}")
    _refuse(value["fp8_margin"] < 0, f"--fp8-margin must be >= 0, got {value['fp8_margin']}")
    name += f"-len{value['fp8_amax_history_len']}-{value['fp8_amax_compute_algo'].replace('_', '-')}"
    if value["fp8_margin"]:
        name += f"-margin{value['fp8_margin']}"
    options = {"amax_history_len": value["fp8_amax_history_len"], "amax_compute_algo": value["fp8_amax_compute_algo"],
               "margin": value["fp8_margin"]}
    return name, _with_options(data, options)


def _refuse(condition: bool, message: str) -> None:
    if condition:
        raise PresetError(message)


def _delayed_flags(args: PrecisionFlags) -> dict[str, Any]:
    """The delayed-scaling flags as given (None: not given), by ``_DELAYED_ONLY`` name."""
    return dict(zip(_DELAYED_ONLY, (args.fp8_margin, args.fp8_amax_history_len, args.fp8_amax_compute_algo)))


def emulates_precision(args: PrecisionFlags) -> bool:
    """True when the flags ask for an emulated recipe: any --fp8-recipe or --fp4-* flag.
    ``--fp8-format`` alone keeps Megatron-LM's meaning: real FP8 GEMMs in Transformer Engine."""
    return any(given is not None for given in (args.fp8_recipe, args.fp4_format, args.fp4_recipe))


def recipe_from_megatron_flags(args: PrecisionFlags) -> Optional[dict[str, Any]]:
    """The recipe dict Megatron-LM's precision flags ask for (None: no emulated recipe requested);
    PresetError for combinations that cannot be emulated."""
    for key, given in _delayed_flags(args).items():  # Megatron-LM hands them to DelayedScaling only
        _refuse(given is not None and args.fp8_recipe != "delayed",
                f"{_flag(key)} {given} only applies to delayed scaling (--fp8-recipe delayed); Megatron-LM "
                f"ignores it for other recipes")
    first_last = args.first_last_layers_bf16
    for key, count in (("num_layers_at_start_in_bf16", args.num_layers_at_start_in_bf16),
                       ("num_layers_at_end_in_bf16", args.num_layers_at_end_in_bf16)):
        _refuse(count is not None and not first_last, f"{_flag(key)} {count} needs --first-last-layers-bf16")
        _refuse(count is not None and count < 0, f"{_flag(key)} must be >= 0, got {count}")
    emulated = emulates_precision(args)
    for key, given in (("no_fp8_wgrad", args.no_fp8_wgrad), ("first_last_layers_bf16", first_last)):
        _refuse(bool(given) and not emulated, f"{_flag(key)} needs an emulated recipe (--fp8-recipe "
                                              f"{{{','.join(FP8_RECIPES)}}} or --fp4-format e2m1)")
    if not emulated:
        return None
    name, data = _base_recipe(args)
    if args.no_fp8_wgrad:  # Megatron-LM: wgrad GEMM in high precision
        name += "-no-wgrad"
        data["operands"] = {**data.get("operands", {}), **{key: "bf16" for key in WGRAD}}
    if first_last:
        start = 1 if args.num_layers_at_start_in_bf16 is None else args.num_layers_at_start_in_bf16
        end = 1 if args.num_layers_at_end_in_bf16 is None else args.num_layers_at_end_in_bf16
        layers = ([f"0:{start}"] if start else []) + ([f"-{end}:"] if end else [])
        if layers:
            name += f"-bf16-first{start}-last{end}"
            data["rules"] = list(data.get("rules", [])) + [{"match": {"layers": layers}, "format": "bf16"}]
    return {**data, "name": name}
