"""Format names, aliases and options: ``get_format``, ``quantize``, ``list_formats``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional, get_args

import torch
from torch import Tensor

from . import hadamard
from .base import (
    NONFINITE_OPTION,
    ROUNDING_OPTION,
    SEED_OPTION,
    NumericFormat,
    Option,
    non_negative_int,
    positive_int,
    resolve_options,
)
from .blocks import parse_block_shape
from .elementwise import CastFormat, ElementwiseFormat
from .fp8_blocks import FP8BlockFormat
from .grid import FP4_E2M1, FP6_E2M3, FP6_E3M2, FP8_E4M3, FP8_E5M2, OVERFLOW_MODES
from .hifloat8 import HiFloat8Format
from .mx import MX_BLOCK_SIZE, SCALE_MODES, MXFormat
from .nvfp import E4M3_BOUNDS, FOUR_OVER_SIX_MODES, NVFP_BLOCK_SIZE, NVFPFormat
from .show import show_value

PASSTHROUGH = ("fp32", "bf16", "fp16")
ALIASES = {"none": "fp32", "mxfp8": "mxfp8_e4m3", "mxfp4": "mxfp4_e2m1"}
FP8_BLOCK_SHAPE = (1, 128)  # TE Float8BlockScaling's activations and gradients; weights use (128, 128)

_OVERFLOW = Option("saturate", OVERFLOW_MODES)
_BLOCK_SHAPES = "[1, n] or [n, n] (tiles)"
_STOCHASTIC = {"rounding": ROUNDING_OPTION, "seed": SEED_OPTION}
_HADAMARD = {"hadamard": Option(None, parse=hadamard.parse_size, allowed="power of two 2..256"),
             "hadamard_signs": Option(None, parse=hadamard.parse_signs, allowed="list of +-1, length hadamard")}
_TENSOR_SCALE = {"margin": Option(0, parse=non_negative_int, allowed="integer >= 0"),
                 "power_of_two_scales": Option(None, kind=bool)}
AmaxComputeAlgo = Literal["max", "most_recent"]
"""The ``amax_compute_algo`` option of delayed scaling (TE ``DelayedScaling``'s): the amax a scale
derives from is the largest in the operand's history (``"max"``, TE's default) or its newest entry."""
AMAX_COMPUTE_ALGOS: tuple[AmaxComputeAlgo, ...] = get_args(AmaxComputeAlgo)
# TE's practical history lengths are 1 (Megatron-LM's default) to 1024 (TE's default), a few thousand at most;
# the bound refuses a typo (1e8 would allocate gigabytes over a model's operands) before any buffer exists.
MAX_AMAX_HISTORY_LEN = 65536


def _history_len(value: Any) -> int:
    length = positive_int(value)
    if length > MAX_AMAX_HISTORY_LEN:
        raise ValueError(f"must be at most {MAX_AMAX_HISTORY_LEN}")
    return length


_DELAYED = {"amax_history_len": Option(None, parse=_history_len, allowed=f"integer 1..{MAX_AMAX_HISTORY_LEN}"),
            "amax_compute_algo": Option(None, AMAX_COMPUTE_ALGOS)}
_DELAYED_DEFAULTS = {"amax_history_len": 1024, "amax_compute_algo": "max"}


@dataclass(frozen=True)
class _Entry:
    build: Callable[[dict[str, Any]], NumericFormat]
    options: dict[str, Option]
    # Options that only mean something under some values of the "scaling" option: elsewhere
    # they are refused when given and left out of the resolved options.
    scoped: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Defaults that depend on the scaling (filled where the option resolved to None).
    scaling_defaults: dict[str, dict[str, Any]] = field(default_factory=dict)


def _cast(name: str, dtype: torch.dtype, options: dict[str, Option]) -> _Entry:
    return _Entry(lambda resolved: CastFormat(name, dtype, resolved), options)


def _fp8(name: str, grid) -> _Entry:
    options = {"scaling": Option("tensor", ("tensor", "none", "block", "delayed")), "overflow": _OVERFLOW,
               **_TENSOR_SCALE, **_DELAYED, "block_shape": Option(None, parse=parse_block_shape, allowed=_BLOCK_SHAPES),
               "nonfinite": NONFINITE_OPTION, **_HADAMARD, **_STOCHASTIC}

    def build(resolved: dict[str, Any]) -> NumericFormat:
        if resolved["scaling"] == "block":
            return FP8BlockFormat(name, grid, resolved)
        return ElementwiseFormat(name, grid, resolved)

    scaled = ("tensor", "block")
    scoped = {"overflow": ("none", "tensor", "delayed"), "margin": ("tensor", "delayed"), "power_of_two_scales": scaled,
              "block_shape": ("block",), "hadamard": scaled, "hadamard_signs": scaled,
              "nonfinite": ("tensor", "block", "delayed"),
              **{key: ("delayed",) for key in _DELAYED}}
    defaults = {"tensor": {"power_of_two_scales": False},
                "block": {"power_of_two_scales": True, "block_shape": FP8_BLOCK_SHAPE}, "delayed": _DELAYED_DEFAULTS}
    return _Entry(build, options, scoped, defaults)


def _mx(name: str, element) -> _Entry:
    options = {"scale_mode": Option("floor", SCALE_MODES),
               "block_shape": Option((1, MX_BLOCK_SIZE), parse=parse_block_shape, allowed=_BLOCK_SHAPES),
               "nonfinite": NONFINITE_OPTION, **_HADAMARD, **_STOCHASTIC}
    return _Entry(lambda resolved: MXFormat(name, element, resolved), options)


_HIFP8 = _Entry(
    lambda resolved: HiFloat8Format(resolved),
    {"scaling": Option("none", ("none", "tensor", "delayed")), "scale_target": Option(None, kind=float),
     **_TENSOR_SCALE, **_DELAYED, "overflow": _OVERFLOW, **_STOCHASTIC},
    scoped={"scale_target": ("tensor", "delayed"), "margin": ("tensor", "delayed"), "power_of_two_scales": ("tensor",),
            **{key: ("delayed",) for key in _DELAYED}},
    scaling_defaults={"tensor": {"scale_target": 32768.0, "power_of_two_scales": False},
                      "delayed": {"scale_target": 32768.0, **_DELAYED_DEFAULTS}},
)

# Transformer Engine's 2026 NVFP4 options (``formats.nvfp``): 4over6 block scales and row scaling.
_NVFP4_OPTIONS = {"four_over_six": Option("off", FOUR_OVER_SIX_MODES), "e4m3_max": Option(448, E4M3_BOUNDS),
                  "row_scaled": Option(False, kind=bool)}


def _nvfp(name: str, element, extra: Optional[dict[str, Option]] = None) -> _Entry:
    options = {"block_shape": Option((1, NVFP_BLOCK_SIZE), parse=parse_block_shape, allowed=_BLOCK_SHAPES),
               "nonfinite": NONFINITE_OPTION, **_HADAMARD, **_STOCHASTIC, **(extra or {})}
    return _Entry(lambda resolved: NVFPFormat(name, element, resolved), options)


_REGISTRY: dict[str, _Entry] = {
    "fp32": _cast("fp32", torch.float32, {}),
    "bf16": _cast("bf16", torch.bfloat16, _STOCHASTIC),
    "fp16": _cast("fp16", torch.float16, _STOCHASTIC),
    "hifp8": _HIFP8,
    "fp8_e4m3": _fp8("fp8_e4m3", FP8_E4M3),
    "fp8_e5m2": _fp8("fp8_e5m2", FP8_E5M2),
    "mxfp8_e4m3": _mx("mxfp8_e4m3", FP8_E4M3),
    "mxfp8_e5m2": _mx("mxfp8_e5m2", FP8_E5M2),
    "mxfp6_e3m2": _mx("mxfp6_e3m2", FP6_E3M2),
    "mxfp6_e2m3": _mx("mxfp6_e2m3", FP6_E2M3),
    "mxfp4_e2m1": _mx("mxfp4_e2m1", FP4_E2M1),
    "nvfp4": _nvfp("nvfp4", FP4_E2M1, _NVFP4_OPTIONS),
    "nvfp6": _nvfp("nvfp6", FP6_E2M3),
}


def canonical_name(name: str) -> str:
    """The canonical name for ``name`` or one of its aliases; ValueError lists the valid ones."""
    if not isinstance(name, str):
        raise ValueError(f"format name must be a string, got {show_value(name)}")
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in _REGISTRY:
        valid = sorted(_REGISTRY) + sorted(ALIASES)
        raise ValueError(f"unknown numeric format {show_value(name)}; valid formats: {', '.join(valid)}")
    return key


def get_format(name: str, **options: Any) -> NumericFormat:
    """A new format object; unknown names or bad options raise ValueError naming the valid ones.

    The resolved ``fmt.options`` are JSON-serialisable and accepted back by ``get_format``."""
    key = canonical_name(name)
    entry = _REGISTRY[key]
    resolved = resolve_options(key, entry.options, options)
    resolved = _scope_to_scaling(key, entry, resolved, options)
    if "hadamard" in resolved:
        resolved = _resolve_hadamard(key, resolved)
    return entry.build(resolved)


def _scope_to_scaling(name: str, entry: _Entry, resolved: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    scaling = resolved.get("scaling")
    for key, scalings in entry.scoped.items():
        if scaling not in scalings:
            if given.get(key) is not None:
                allowed = f"={scalings[0]!r}" if len(scalings) == 1 else f" in {list(scalings)}"
                raise ValueError(f"{name}: {key} needs scaling{allowed}, not scaling={scaling!r}")
            del resolved[key]
    for key, value in entry.scaling_defaults.get(scaling, {}).items():
        if resolved[key] is None:
            resolved[key] = value
    return resolved


def _resolve_hadamard(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """hadamard=n must divide the block length; its signs default to ``hadamard.default_signs``."""
    size, signs = options["hadamard"], options["hadamard_signs"]
    if size is None:
        if signs is not None:
            raise ValueError(f"{name}: hadamard_signs needs hadamard=n")
        return options
    block = options.get("block_shape")
    if block is not None and block[1] % size:
        raise ValueError(f"{name}: hadamard={size} does not divide the block length {block[1]} "
                         f"(block_shape={block}); use a power of two up to {block[1]}")
    if signs is None:
        signs = hadamard.default_signs(size)
    elif len(signs) != size:
        raise ValueError(f"{name}: hadamard_signs has {len(signs)} entries; hadamard={size} needs {size}")
    return {**options, "hadamard_signs": signs}


def quantize(x: Tensor, name: str, axis: int = -1, **options: Any) -> Tensor:
    """Functional form: ``get_format(name, **options).quantize(x, axis)``.

    Each call builds a fresh format, so stochastic rounding draws the seed's first noise
    every time; keep a format object to draw a new stream per call.
    """
    return get_format(name, **options).quantize(x, axis)


def format_options(name: str) -> dict[str, Option]:
    """The options a format accepts (before resolution), by name."""
    return dict(_REGISTRY[canonical_name(name)].options)


def list_formats() -> list[str]:
    """Canonical format names."""
    return list(_REGISTRY)


def is_passthrough(name: str) -> bool:
    """True for formats the layers leave alone: "none", "fp32", "bf16", "fp16"."""
    return canonical_name(name) in PASSTHROUGH
