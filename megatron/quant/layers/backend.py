"""Our megatron-core backend: the ``BackendSpecProvider`` whose modules fake-quantize their GEMMs.

``QuantSpecProvider`` is megatron-core's ``LocalSpecProvider`` (its norms, its activation) with the
column- and row-parallel linear layers, core attention and the experts' linear layers replaced by
the quantized subclasses, the MoE router (``MoESubmodules.router``) by ``QuantTopKRouter`` and the
local experts (``SequentialMLP``) by ``QuantGroupedMLP`` (``layers/grouped_experts.py``). Each
of those modules resolves its formats in ``finish_init``, which ``GPTModel`` calls at the end of its
construction with the config ``TransformerConfig.quant_recipe`` matches to the module's path
(``recipes/precision.py``): nothing is configured after the build.

megatron-core's spec builders that take a backend (``get_mlp_module_spec_for_backend``,
``get_moe_module_spec_for_backend``) take this one as is. Those that build a whole layer
(``get_gpt_layer_local_spec``, ``get_gpt_decoder_block_spec``) choose ``LocalSpecProvider``
themselves in both supported releases (or NVIDIA's Kitchen one, behind ``use_kitchen``): for them,
``with_backend`` puts this backend's module in each place the local backend's module stands, so the
layer stays exactly what megatron-core builds, less nothing and plus nothing.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

from megatron.core.models.backends import LocalSpecProvider
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.spec_utils import ModuleSpec

from megatron.quant.layers.attention import QuantDotProductAttention
from megatron.quant.layers.grouped_experts import QuantGroupedMLP
from megatron.quant.layers.linear import QuantColumnParallelLinear, QuantRowParallelLinear
from megatron.quant.layers.router import QuantTopKRouter


class QuantSpecProvider(LocalSpecProvider):
    """megatron-core's local backend with fake-quantized linear layers and core attention.

    ``allow_fused``: core attention may run ``scaled_dot_product_attention`` where it computes what
    the unfused path does (``layers/attention.py``; ``layers/fusions.py`` chooses it for training).
    """

    def __init__(self, allow_fused: bool = True):
        self.allow_fused = allow_fused

    def column_parallel_linear(self) -> type:
        return QuantColumnParallelLinear

    def row_parallel_linear(self) -> type:
        return QuantRowParallelLinear

    def core_attention(self) -> Any:
        # SelfAttention calls this class itself (not through build_module), so its one option
        # travels bound to it.
        return functools.partial(QuantDotProductAttention, allow_fused=self.allow_fused)

    def grouped_mlp_modules(self, moe_use_grouped_gemm: bool, *legacy: bool) -> Any:
        """The local experts as ``QuantGroupedMLP`` (``SequentialMLP``'s experts run as grouped GEMMs) with
        quantized linear layers. ``legacy``: 0.16's ``moe_use_legacy_grouped_gemm`` (0.19 dropped it)."""
        if moe_use_grouped_gemm:
            raise ValueError("moe_grouped_gemm=True builds megatron-core's GroupedMLP (one weight for all experts), "
                             "which has no emulated counterpart; set moe_grouped_gemm=False (the experts then run "
                             "as grouped GEMMs with SequentialMLP's parameters: QuantGroupedMLP)")
        return with_backend(super().grouped_mlp_modules(moe_use_grouped_gemm, *legacy), self)

    def substitutions(self) -> dict[type, Any]:
        """The local backend's module -> ours, for each place both backends fill."""
        stock = LocalSpecProvider()
        return {stock.column_parallel_linear(): self.column_parallel_linear(),
                stock.row_parallel_linear(): self.row_parallel_linear(),
                stock.core_attention(): self.core_attention(),
                TopKRouter: QuantTopKRouter,  # MoESubmodules' default router, which no backend method names
                SequentialMLP: QuantGroupedMLP}


def with_backend(spec: Any, backend: QuantSpecProvider) -> Any:
    """``spec`` (a ModuleSpec, a block's or layer's submodules, a 0.19 ``functools.partial`` builder,
    or a list of them, as megatron-core's local builders return) with ``backend``'s modules in place of
    the local backend's; everything else, params included, stays."""
    return _swap(spec, backend.substitutions())


def _swap(node: Any, table: dict[type, Any]) -> Any:
    if isinstance(node, type):
        return table.get(node, node)
    if isinstance(node, ModuleSpec):
        return dataclasses.replace(node, module=_swap(node.module, table), submodules=_swap(node.submodules, table))
    if isinstance(node, functools.partial):
        return functools.partial(_swap(node.func, table), *_swap(node.args, table),
                                 **{key: _swap(value, table) for key, value in node.keywords.items()})
    if dataclasses.is_dataclass(node):
        return dataclasses.replace(node, **{f.name: _swap(getattr(node, f.name), table)
                                            for f in dataclasses.fields(node) if f.init})
    if isinstance(node, (list, tuple)):
        return type(node)(_swap(item, table) for item in node)
    return node
