"""Features of an nvdlfw-inspect config that change a GEMM's precision, as the lab's recipe rules.

TE's ``FakeQuant`` runs the chosen GEMMs in high precision with the chosen tensors quantized to FP8 and
back (per-tensor current scaling, or MXFP8), which is what every lab recipe does: it becomes operand
formats of those modules, the GEMMs' other operands in BF16. TE's ``PerTensorScaling`` switches the
chosen operands of a delayed-scaling FP8 run to per-tensor current scaling (TE asserts a
``Float8Quantizer``, i.e. ``DelayedScaling``): it becomes the run's own FP8 format with current scaling.

A feature of your own (TE loads them from ``feature_dirs``) is a class with ``translate``, listed in the
``INSPECT_FEATURES`` mapping of an importable Python module; a section names that module as its namespace
(docs/capture.md, "Features of your own")::

    my_section:
      enabled: True
      layers: {layer_types: [fc1]}
      my_package.inspect_features:        # the module; INSPECT_FEATURES = {"E5M2Gradients": ...}
        E5M2Gradients: {enabled: True, gemms: [dgrad]}
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, runtime_checkable

from megatron.quant import formats
from megatron.quant.capture.inspect_grammar import QUANTIZED_TENSORS, InspectConfigError, gemm_tensor_items
from megatron.quant.formats.show import show_value
from megatron.quant.recipes.rules import FormatChoice

# TE's tensor of a GEMM -> the recipe operand key (recipes/operands.py's LINEAR_TABLE)
OPERAND_KEYS = {("fprop", "activation"): "fprop.input", ("fprop", "weight"): "fprop.weight",
                ("dgrad", "gradient"): "dgrad.grad_output", ("dgrad", "weight"): "dgrad.weight",
                ("wgrad", "gradient"): "wgrad.grad_output", ("wgrad", "activation"): "wgrad.input"}
HIGH_PRECISION = FormatChoice("bf16")
_TE = (("nonfinite", "te"),)  # TE's kernels' handling of Inf and NaN (recipes/presets.py's _TE)
# FakeQuant's quant_format (TE's fake_quant.py: _supported_formats) -> the lab's format
FAKE_QUANT_FORMATS = {"FP8E4M3": FormatChoice("fp8_e4m3", _TE), "FP8E5M2": FormatChoice("fp8_e5m2", _TE),
                      "MXFP8E4M3": FormatChoice("mxfp8_e4m3", (("scale_mode", "rceil"),) + _TE),
                      "MXFP8E5M2": FormatChoice("mxfp8_e5m2", (("scale_mode", "rceil"),) + _TE)}
NAMESPACE_ATTRIBUTE = "INSPECT_FEATURES"
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(frozen=True)
class Translation:
    """What a feature means for the modules of its section: operand key -> format (in order, later
    wins), and operand keys switched to per-tensor current scaling of the run's own FP8 format."""

    feature: str
    operands: tuple[tuple[str, FormatChoice], ...] = ()
    rescaled: tuple[str, ...] = ()

    def describe(self) -> str:
        parts = [f"{key} {choice.name}" for key, choice in dict(self.operands).items()]
        parts += [f"{key} per-tensor current scaling" for key in self.rescaled]
        return f"{self.feature}: {', '.join(parts)}"


@runtime_checkable
class InspectFeature(Protocol):
    """A feature that changes GEMM precision: its options (without ``enabled``) as a ``Translation``;
    InspectConfigError, naming ``where``, for options it cannot take."""

    def translate(self, options: Mapping[str, Any], where: str) -> Translation:
        ...


def operand_items(options: Mapping[str, Any], allowed: tuple[str, ...], feature: str,
                  where: str) -> list[tuple[str, str, dict]]:
    """(gemm, operand key, options) for TE's gemms x tensors; a tensor that is no operand of a listed GEMM
    is skipped, as TE never asks about it; none left is refused."""
    items = gemm_tensor_items(options, QUANTIZED_TENSORS, allowed, where)
    found = [(gemm, OPERAND_KEYS[(gemm, tensor)], opts) for gemm, tensor, opts in items
             if (gemm, tensor) in OPERAND_KEYS]
    if not found:
        raise InspectConfigError(f"{where}: no listed tensor is an operand of a listed GEMM (fprop: activation, "
                                 f"weight; dgrad: gradient, weight; wgrad: gradient, activation); {feature} does "
                                 f"nothing")
    return found


class FakeQuant:
    def translate(self, options: Mapping[str, Any], where: str) -> Translation:
        items = operand_items(options, ("quant_format",), "FakeQuant", where)
        operands = [(key, HIGH_PRECISION) for gemm in dict.fromkeys(g for g, _, _ in items)
                    for (g, _), key in OPERAND_KEYS.items() if g == gemm]  # TE: the GEMM runs in high precision
        for gemm, key, opts in items:
            quant_format = opts.get("quant_format")
            if quant_format not in FAKE_QUANT_FORMATS:
                raise InspectConfigError(f"{where} ({gemm}): quant_format {show_value(quant_format)} is invalid; "
                                         f"TE's: {', '.join(FAKE_QUANT_FORMATS)}")
            operands.append((key, FAKE_QUANT_FORMATS[quant_format]))
        return Translation("FakeQuant", tuple(operands))


class PerTensorScaling:
    def translate(self, options: Mapping[str, Any], where: str) -> Translation:
        items = operand_items(options, (), "PerTensorScaling", where)
        return Translation("PerTensorScaling", rescaled=tuple(dict.fromkeys(key for _, key, _ in items)))


def check_translation(translated: Any, where: str) -> None:
    """InspectConfigError unless ``translated`` is a Translation of known operand keys and buildable formats
    (a feature of your own is checked at start, not when the model is built)."""
    if not isinstance(translated, Translation):
        raise InspectConfigError(f"{where} returned {show_value(translated)}, not a Translation")
    keys = set(OPERAND_KEYS.values())
    for key in [k for k, _ in translated.operands] + list(translated.rescaled):
        if key not in keys:
            raise InspectConfigError(f"{where}: operand {show_value(key)} is unknown; allowed: {', '.join(keys)}")
    for key, choice in translated.operands:
        try:
            formats.get_format(choice.name, **dict(choice.options))
        except (ValueError, TypeError) as exc:
            raise InspectConfigError(f"{where}: {key}: {exc}") from None


TE_FEATURES: dict[str, InspectFeature] = {"FakeQuant": FakeQuant(), "PerTensorScaling": PerTensorScaling()}


def namespace_features(namespace: str, where: str) -> Mapping[str, InspectFeature]:
    """The ``INSPECT_FEATURES`` of the Python module named ``namespace`` (a feature directory's equivalent)."""
    hint = (f"a namespace of your own is an importable Python module with {NAMESPACE_ATTRIBUTE} "
            f"(docs/capture.md#features-of-your-own)")
    if not _MODULE_NAME.fullmatch(namespace):
        raise InspectConfigError(f"{where}: unknown feature or namespace {namespace!r}; {hint}")
    try:
        module = importlib.import_module(namespace)
    except ImportError as exc:
        raise InspectConfigError(f"{where}: unknown feature or namespace {namespace!r} ({exc}); {hint}") from None
    features = vars(module).get(NAMESPACE_ATTRIBUTE)
    if not isinstance(features, Mapping) or not all(isinstance(f, InspectFeature) for f in features.values()):
        raise InspectConfigError(f"{where}: module {namespace} has no {NAMESPACE_ATTRIBUTE} mapping of features "
                                 f"with translate(options, where); {hint}")
    return features
