"""Quantized subclasses of megatron-core's tensor-parallel linear layers.

They keep all of megatron-core's behaviour (TP communication, sequence parallel, bias,
``main_grad`` accumulation, weight passed at call time, expert flags) and replace only
``_forward_impl``, the point where megatron-core runs its linear autograd function. Until
``configure_quant`` is called (``finish_init`` does it, with the config megatron-core matched to the
layer) they are the stock layers.

``_forward_impl`` is private, and the one place megatron-core leaves for this: ``forward`` does the
tensor-parallel communication, sequence parallelism, the embedding's deferred wgrad and CPU offload
around it (and differs between releases), and the autograd function it calls is a module-level
name; TE's and Kitchen's linear layers are classes of their own instead. No public method of
``ColumnParallelLinear`` or ``RowParallelLinear`` hands the GEMM to a subclass.
"""
from __future__ import annotations

from typing import Optional

import torch
from megatron.core.quantization.quant_config import QuantizationConfig
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

from megatron.quant.formats.random_bits import RandomBits
from megatron.quant.layers.delayed import amax_reduction_group
from megatron.quant.layers.histories import attach_histories
from megatron.quant.layers.linear_function import LinearGemmConfig, LinearQuant, QuantLinearFunction
from megatron.quant.layers.module_quant import FinishesInit, module_quant
from megatron.quant.layers.operand import module_noise_root
from megatron.quant.layers.phases import Phased
from megatron.quant.layers.weight_cache import QuantizedWeightCache
from megatron.quant.recipes import operands
from megatron.quant.recipes.operands import Parallel
from megatron.quant.tensor_saver import CaptureSite


class QuantLinearMixin(FinishesInit, Phased):
    """The quantized ``_forward_impl`` shared by the column- and row-parallel layers."""

    PHASED = ("quant", "weight_cache", "noise_root")  # what configure_quant sets per phase of a schedule

    # Class-level defaults: an unconfigured layer (or one promoted with __class__) is stock.
    quant: Optional[LinearQuant] = None
    capture_site: Optional[CaptureSite] = None
    weight_cache: Optional[QuantizedWeightCache] = None
    noise_root: Optional[RandomBits] = None
    parallel: Parallel  # which weight dimension tensor parallelism splits

    def _shard_size(self) -> int:
        """The length of this rank's shard of the dimension tensor parallelism splits."""
        raise NotImplementedError

    def finish_init(self, quantization_config: Optional[QuantizationConfig]) -> None:
        """Take the formats the config megatron-core matched to this layer gives it (none matched: stock)."""
        if quantization_config is None:
            return
        quant = module_quant(quantization_config, self.config)
        gated = quant.site.role == "fc1" and self.config.gated_linear_unit  # megatron fuses [gate; up] per shard
        self.configure_phases(lambda formats: self.configure_quant(
            LinearQuant.from_formats(formats, quant.dequantized, quant.accumulate), quant.site, seed=quant.seed,
            shard_groups=2 if gated else 1), quant.phases, quant.phase_of)

    def configure_quant(self, quant: LinearQuant, site: Optional[CaptureSite], seed: int = 0,
                        shard_groups: int = 1) -> None:
        """Set this layer's operand formats and capture site; checks block sizes against shards.

        ``seed`` and the module name (the site's) key its stochastic rounding; ``shard_groups``:
        runs of the weight's output dimension that TP splits separately (2 for SwiGLU's fc1,
        whose shards hold [gate; up] slices), so the noise follows the unsharded layout.
        Delayed-scaled operands get fresh amax histories (``amax_histories``, checkpointed with
        the weights)."""
        if torch.distributed.get_world_size(self.tp_group) > 1:
            quant.check_shards(self.parallel, self._shard_size(), site.module if site else type(self).__name__)
        if any(quant[op.key].fmt is not None for op in operands.LINEAR_TABLE if op.gemm == "wgrad"):
            if getattr(self.config, "defer_embedding_wgrad_compute", False) and getattr(
                    self, "grad_output_buffer", None) is not None:
                raise ValueError("defer_embedding_wgrad_compute runs the output layer's wgrad outside this "
                                 "layer, so its wgrad operands cannot be quantized; disable one of them")
        group = amax_reduction_group(self.tp_group, self.config.tp_only_amax_red)
        self.quant = attach_histories(quant.sharded(self.parallel, shard_groups), self, group)
        self.capture_site = site
        self.weight_cache = QuantizedWeightCache()
        self.noise_root = module_noise_root(seed, site.module if site else "", self.quant.specs.values())

    def invalidate_quantized_weights(self) -> None:
        """Forget cached quantized weights (after updating weights through ``.data``), every phase's: a
        phase not running now would otherwise find its entries valid when it runs again."""
        for state in self.phase_states or ({"weight_cache": self.weight_cache},):
            if state["weight_cache"] is not None:
                state["weight_cache"].invalidate()

    def _forward_impl(self, input, weight, **kwargs):
        # megatron-core calls this with keywords: bias, gradient_accumulation_fusion,
        # allreduce_dgrad, sequence_parallel, tp_group (None from RowParallelLinear),
        # grad_output_buffer, wgrad_deferral_limit (ColumnParallelLinear only).
        self.enter_phase()
        if self.quant is None:
            return super()._forward_impl(input=input, weight=weight, **kwargs)
        tp_group = kwargs.get("tp_group")
        cfg = LinearGemmConfig(
            quant=self.quant, weight_cache=self.weight_cache, quant_group=self.tp_group, site=self.capture_site,
            gradient_accumulation_fusion=kwargs["gradient_accumulation_fusion"],
            allreduce_dgrad=kwargs["allreduce_dgrad"], sequence_parallel=kwargs["sequence_parallel"],
            tp_group=self.tp_group if tp_group is None else tp_group,
            grad_output_buffer=kwargs.get("grad_output_buffer"),
            wgrad_deferral_limit=kwargs.get("wgrad_deferral_limit"), noise_root=self.noise_root)
        return QuantLinearFunction.apply(input, weight, kwargs.get("bias"), cfg)


class QuantColumnParallelLinear(QuantLinearMixin, ColumnParallelLinear):
    """ColumnParallelLinear (weight sharded along out_features) with quantized GEMMs."""

    parallel = "column"

    def _shard_size(self) -> int:
        return self.output_size_per_partition


class QuantRowParallelLinear(QuantLinearMixin, RowParallelLinear):
    """RowParallelLinear (weight sharded along in_features) with quantized GEMMs."""

    parallel = "row"

    def _shard_size(self) -> int:
        return self.input_size_per_partition


def invalidate_quantized_weights(model: torch.nn.Module) -> None:
    """Forget every cached quantized weight in ``model`` (see ``QuantizedWeightCache``)."""
    for module in model.modules():
        if isinstance(module, QuantLinearMixin):
            module.invalidate_quantized_weights()
