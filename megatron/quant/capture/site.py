"""What a layer hands to the saver: where a capture comes from and the operands it saw."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from torch import Tensor

if TYPE_CHECKING:  # formats never need importing here: the saver only passes them to stats
    from megatron.quant.formats.interface import QuantFormat


# A routed expert's site names it by its global index: "<moe layer>.experts.<e>.<linear>".
_EXPERT = re.compile(r"\.experts\.(\d+)\.")


def expert_module(moe_layer: str, expert: int, linear: str) -> str:
    """The module name of global expert ``expert``'s ``linear`` in the MoE layer ``moe_layer``."""
    return f"{moe_layer}.experts.{expert}.{linear}"


def expert_index(module: str) -> Optional[int]:
    """The global expert a site's module name belongs to (``expert_module``'s); None outside routed experts."""
    found = _EXPERT.search(module)
    return None if found is None else int(found.group(1))


@dataclass(frozen=True)
class CaptureSite:
    """Where a capture comes from; built once per module (spec.py tags modules)."""

    layer_type: str  # "linear" | "attention"
    component: str  # "linear" | "FA"
    layer_idx: int  # 0-based transformer layer index (-1 outside the decoder layers)
    module: str  # qualified module name, e.g. "decoder.layers.0.self_attention.linear_qkv"
    role: str  # "qkv" | "proj" | "fc1" | "fc2" | "core_attention" | "output_layer" | ...
    quant_type: str  # directory and file-name token, e.g. "hifp8", "bf16", or a recipe's name


@dataclass
class Operand:
    """One GEMM operand as the layer saw it."""

    tensor: Tensor  # high-precision value entering quantization
    fmt: Optional["QuantFormat"] = None  # format applied; None = not quantized
    axis: int = -1  # block/reduction axis used for fmt
    quantized: Optional[Tensor] = None  # the fake-quantized value, when the layer has it
    amax: Optional[Tensor] = None  # TP-reduced amax that was used, if any
    scale: Optional[Tensor] = None  # fmt.quantize_with_scale's scale; with `quantized`, the
    # statistics need not quantize again (the costliest part of stats mode)
    kernel_stats: Optional[Tensor] = None  # the packed statistics the quantizing kernel took in its
    # pass (stats.packing: the exact fields, or all): the statistics then need no pass of their own
