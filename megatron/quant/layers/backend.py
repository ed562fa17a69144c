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
layer stays exactly what megatron-core builds, less nothing and plus nothing. Which place holds which
GEMM, and so each linear's recipe role, the model adapters say (``layers/adapters.py``): GPT's
attention (GQA), multi-latent attention (``layers/mla.py``), the MLP and the MoE router.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

from megatron.core.models.backends import LocalSpecProvider
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.multi_latent_attention import MLASelfAttention
from megatron.core.transformer.spec_utils import ModuleSpec

from megatron.quant.layers.adapters import ADAPTERS, Adapter, GemmSlot, adapter_table, module_class, walk
from megatron.quant.layers.attention import QuantDotProductAttention
from megatron.quant.layers.grouped_experts import QuantGroupedMLP
from megatron.quant.layers.linear import QuantColumnParallelLinear, QuantLinearMixin, QuantRowParallelLinear
from megatron.quant.layers.mla import QuantMLASelfAttention
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
        # SelfAttention calls the spec itself, MLASelfAttention through build_module: a ModuleSpec
        # serves both, its one option among its params.
        return ModuleSpec(module=QuantDotProductAttention, params={"allow_fused": self.allow_fused})

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
                TopKRouter: QuantTopKRouter}  # MoESubmodules' default router, which no backend method names

    def containers(self) -> dict[type, type]:
        """megatron-core's modules that hold GEMM modules -> ours, wherever a spec names them."""
        return {MLASelfAttention: QuantMLASelfAttention, SequentialMLP: QuantGroupedMLP}


def with_backend(spec: Any, backend: QuantSpecProvider, adapters: Sequence[Adapter] = ADAPTERS) -> Any:
    """``spec`` (a ModuleSpec, a block's or layer's submodules, a 0.19 ``functools.partial`` builder,
    or a list of them, as megatron-core's local builders return) with ``backend``'s modules in place of
    the local backend's, each linear bound to the recipe role its model adapter names
    (``layers/adapters.py``; ``adapters``: those of megatron-core's GPT, plus any of a model of your
    own, docs/extending.md#a-new-model); everything else, params included, stays. ``adapters.UnknownModule``
    (one line, before anything is built) for a GEMM module at a place no adapter names."""
    table = backend.substitutions()

    def bind(value: Any, slot: GemmSlot, built_stock: bool) -> Any:
        if built_stock:  # megatron-core takes only its own class there; the parent quantizes it once built
            return value
        ours = table.get(slot.module)
        if ours is None and issubclass(slot.module, QuantLinearMixin):  # the builders that take our backend
            ours = slot.module
        if ours is None:  # no quantized counterpart (Transformer Engine's modules quantize themselves)
            return value
        linear = issubclass(module_class(ours), QuantLinearMixin)
        params = {"gemm_role": slot.role, **({"fused_gate": True} if slot.fused_gate else {})} if linear else {}
        return _with_module(value, ours, params)

    return walk(spec, bind, adapter_table(adapters), backend.containers())


def _with_module(value: Any, ours: Any, params: dict[str, Any]) -> Any:
    """The spec place ``value`` (a class, ModuleSpec or partial) building ``ours`` (a class or a
    ModuleSpec with params) instead, with ``params`` added."""
    params = {**(ours.params if isinstance(ours, ModuleSpec) else {}), **params}
    cls = module_class(ours)
    if isinstance(value, ModuleSpec):
        return dataclasses.replace(value, module=cls, params={**value.params, **params})
    if isinstance(value, functools.partial):
        return functools.partial(cls, *value.args, **{**value.keywords, **params})
    return ModuleSpec(module=cls, params=params) if params else cls
