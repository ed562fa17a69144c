"""nvdlfw-inspect's grammar shared by the lab's features and the ones users register: the error every
config check raises, TE's ``tensors``/``tensors_struct`` and ``gemms``/``gemms_struct`` lists (a single
name stands for a list of one, as nvdlfw-inspect reads it), and scalar checks."""
from __future__ import annotations

from typing import Any, Mapping

from megatron.quant.formats.show import show_value

GEMMS = ("fprop", "dgrad", "wgrad")
ALL_TENSORS = ("activation", "gradient", "weight", "output", "wgrad", "dgrad")
QUANTIZED_TENSORS = ("activation", "gradient", "weight")


class InspectConfigError(ValueError):
    """A config the lab cannot run: one line naming the file, the place and the value."""


def struct_items(options: Mapping[str, Any], kind: str, names: tuple[str, ...], allowed: tuple[str, ...],
                 where: str) -> list[tuple[str, dict]]:
    """(name, options) per listed tensor or GEMM: ``<kind>s`` (a list, or one name) with the feature's
    options, or ``<kind>s_struct`` items whose own options win over the feature's."""
    plain, struct = f"{kind}s", f"{kind}s_struct"
    defaults = {k: v for k, v in options.items() if k not in (plain, struct)}
    for key in defaults:
        if key not in allowed:
            raise InspectConfigError(f"{where}: unknown option {key!r}; allowed: "
                                     f"{', '.join((plain, struct) + allowed)}")
    if (plain in options) == (struct in options):
        raise InspectConfigError(f"{where}: give one of {plain} and {struct}")
    if plain in options:
        listed = options[plain]
        listed = [listed] if isinstance(listed, str) else listed  # nvdlfw-inspect: `tensors: activation`
        if not isinstance(listed, list) or not listed:
            raise InspectConfigError(f"{where}.{plain}: expected a name or a list of names, got {show_value(listed)}")
        items = [(name, dict(defaults)) for name in listed]
    else:
        listed = options[struct]
        if not isinstance(listed, list) or not listed or not all(isinstance(i, Mapping) and kind in i for i in listed):
            raise InspectConfigError(f"{where}.{struct}: expected a list of mappings, each with {kind!r}")
        items = []
        for item in listed:
            own = {k: v for k, v in item.items() if k != kind}
            for key in own:
                if key not in allowed:
                    raise InspectConfigError(f"{where}.{struct}: unknown option {key!r}; allowed: {kind}, "
                                             f"{', '.join(allowed) or 'nothing else'}")
            items.append((item[kind], {**defaults, **own}))
    for name, _ in items:
        if name not in names:
            raise InspectConfigError(f"{where}: {kind} {show_value(name)} is unknown; allowed: {', '.join(names)}")
    return items


def gemm_tensor_items(options: Mapping[str, Any], tensors: tuple[str, ...], allowed: tuple[str, ...],
                      where: str) -> list[tuple[str, str, dict]]:
    """(gemm, tensor, options) for a feature that takes GEMMs and their tensors (TE's ``TEConfigAPIMapper``:
    ``gemms``/``gemms_struct``, each with ``tensors``/``tensors_struct``; inner options win)."""
    inner = ("tensors", "tensors_struct")
    result = []
    for gemm, gemm_options in struct_items(options, "gemm", GEMMS, inner + allowed, where):
        for tensor, tensor_options in struct_items(gemm_options, "tensor", tensors, allowed, f"{where} ({gemm})"):
            result.append((gemm, tensor, tensor_options))
    return result


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def bool_value(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InspectConfigError(f"{where}: expected True or False, got {show_value(value)}")
    return value
