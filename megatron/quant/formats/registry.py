"""Format names, aliases and options: ``get_format``, ``quantize``, ``list_formats``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from .base import ROUNDING_OPTION, SEED_OPTION, NumericFormat, Option, resolve_options
from .elementwise import CastFormat, ElementwiseFormat
from .grid import FP4_E2M1, FP6_E2M3, FP6_E3M2, FP8_E4M3, FP8_E5M2, OVERFLOW_MODES
from .hifloat8 import HiFloat8Format
from .mx import SCALE_MODES, MXFormat
from .nvfp4 import NVFP4Format

PASSTHROUGH = ("fp32", "bf16", "fp16")
ALIASES = {"none": "fp32", "mxfp8": "mxfp8_e4m3", "mxfp4": "mxfp4_e2m1"}

_OVERFLOW = Option("saturate", OVERFLOW_MODES)
_STOCHASTIC = {"rounding": ROUNDING_OPTION, "seed": SEED_OPTION}


@dataclass(frozen=True)
class _Entry:
    build: Callable[[dict[str, Any]], NumericFormat]
    options: dict[str, Option]


def _cast(name: str, dtype: torch.dtype, options: dict[str, Option]) -> _Entry:
    return _Entry(lambda resolved: CastFormat(name, dtype, resolved), options)


def _fp8(name: str, grid) -> _Entry:
    options = {"scaling": Option("tensor", ("tensor", "none")), "overflow": _OVERFLOW, **_STOCHASTIC}
    return _Entry(lambda resolved: ElementwiseFormat(name, grid, resolved), options)


def _mx(name: str, element) -> _Entry:
    options = {"scale_mode": Option("floor", SCALE_MODES), **_STOCHASTIC}
    return _Entry(lambda resolved: MXFormat(name, element, resolved), options)


_HIFP8_OPTIONS = {
    "scaling": Option("none", ("none", "tensor")),
    "scale_target": Option(None, kind=float),
    "overflow": _OVERFLOW,
    **_STOCHASTIC,
}

_REGISTRY: dict[str, _Entry] = {
    "fp32": _cast("fp32", torch.float32, {}),
    "bf16": _cast("bf16", torch.bfloat16, _STOCHASTIC),
    "fp16": _cast("fp16", torch.float16, _STOCHASTIC),
    "hifp8": _Entry(lambda resolved: HiFloat8Format(resolved), _HIFP8_OPTIONS),
    "fp8_e4m3": _fp8("fp8_e4m3", FP8_E4M3),
    "fp8_e5m2": _fp8("fp8_e5m2", FP8_E5M2),
    "mxfp8_e4m3": _mx("mxfp8_e4m3", FP8_E4M3),
    "mxfp8_e5m2": _mx("mxfp8_e5m2", FP8_E5M2),
    "mxfp6_e3m2": _mx("mxfp6_e3m2", FP6_E3M2),
    "mxfp6_e2m3": _mx("mxfp6_e2m3", FP6_E2M3),
    "mxfp4_e2m1": _mx("mxfp4_e2m1", FP4_E2M1),
    "nvfp4": _Entry(NVFP4Format, _STOCHASTIC),
}


def canonical_name(name: str) -> str:
    """The canonical name for ``name`` or one of its aliases; ValueError lists the valid ones."""
    if not isinstance(name, str):
        raise ValueError(f"format name must be a string, got {name!r}")
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in _REGISTRY:
        valid = sorted(_REGISTRY) + sorted(ALIASES)
        raise ValueError(f"unknown numeric format {name!r}; valid formats: {', '.join(valid)}")
    return key


def get_format(name: str, **options: Any) -> NumericFormat:
    """A new format object; unknown names or options raise ValueError naming the valid ones."""
    key = canonical_name(name)
    entry = _REGISTRY[key]
    resolved = resolve_options(key, entry.options, options)
    if key == "hifp8":
        resolved = _resolve_hifp8_target(resolved)
    return entry.build(resolved)


def _resolve_hifp8_target(options: dict[str, Any]) -> dict[str, Any]:
    """scale_target only means something with scaling="tensor" (default: HiF8's max)."""
    if options["scaling"] == "none":
        if options["scale_target"] is not None:
            raise ValueError("hifp8: scale_target needs scaling='tensor'")
        return {key: value for key, value in options.items() if key != "scale_target"}
    if options["scale_target"] is None:
        return {**options, "scale_target": 32768.0}
    return options


def quantize(x: Tensor, name: str, axis: int = -1, **options: Any) -> Tensor:
    """Functional form: ``get_format(name, **options).quantize(x, axis)``.

    Each call builds a fresh format, so stochastic rounding draws the seed's first noise
    every time; keep a format object to draw a new stream per call.
    """
    return get_format(name, **options).quantize(x, axis)


def list_formats() -> list[str]:
    """Canonical format names."""
    return list(_REGISTRY)


def is_passthrough(name: str) -> bool:
    """True for formats the layers leave alone: "none", "fp32", "bf16", "fp16"."""
    return canonical_name(name) in PASSTHROUGH
