"""Quantized subclasses of megatron-core's tensor-parallel linear layers.

They take megatron-core's construction whole (weight allocation and initialisation, sharding,
checkpoint layout, expert flags) and its public tensor-parallel pieces, and implement the public
``forward`` themselves, as megatron-core's Transformer Engine layers do: the tensor-parallel
communication around the GEMM (``megatron.core.tensor_parallel``'s mappings, sequence parallelism),
the bias, and the GEMM as our autograd function (``QuantLinearFunction``: quantized operands,
``main_grad`` accumulation). Until ``configure_quant`` is called (``finish_init`` does it, with the
config megatron-core matched to the layer) a layer runs megatron-core's own ``forward``: the stock
layer, bit for bit. Nothing private of megatron-core is overridden (``compat.PRIVATE_NAMES``).
Megatron-core's CPU activation offloading is not supported under quantization (refused at
configuration): its switch is private to megatron-core's layers.
"""
from __future__ import annotations

from typing import Optional

import torch
from megatron.core.quantization.quant_config import QuantizationConfig
from megatron.core.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    copy_to_tensor_model_parallel_region,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
)
from torch import Tensor

from megatron.quant.formats.random_bits import RandomBits
from megatron.quant.layers.delayed import amax_reduction_group
from megatron.quant.layers.histories import attach_histories
from megatron.quant.layers.linear_function import LinearGemmConfig, LinearQuant, QuantLinearFunction
from megatron.quant.layers.module_quant import FinishesInit, module_quant
from megatron.quant.layers.operand import module_noise_root
from megatron.quant.layers.phases import Phased
from megatron.quant.layers.weight_cache import CachesQuantizedWeights, QuantizedWeightCache
from megatron.quant.recipes import operands
from megatron.quant.recipes.operands import Parallel
from megatron.quant.tensor_saver import CaptureSite


class QuantLinearMixin(FinishesInit, Phased, CachesQuantizedWeights):
    """What the column- and row-parallel quantized layers share: configuration and the GEMM."""

    PHASED = ("quant", "weight_cache", "noise_root")  # what configure_quant sets per phase of a schedule

    # Class-level defaults: an unconfigured layer (or one promoted with __class__) is stock.
    quant: Optional[LinearQuant] = None
    capture_site: Optional[CaptureSite] = None
    weight_cache: Optional[QuantizedWeightCache] = None
    noise_root: Optional[RandomBits] = None
    parallel: Parallel  # which weight dimension tensor parallelism splits
    gemm_role: Optional[str] = None  # the recipe role its spec gave it (``layers/adapters.py``)
    fused_gate: bool = False  # its output is the fused [gate; up] of a gated linear unit (``Adapter.fused_gate``)

    def __init__(self, *args, gemm_role: Optional[str] = None, fused_gate: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.gemm_role, self.fused_gate = gemm_role, fused_gate

    def _shard_size(self) -> int:
        """The length of this rank's shard of the dimension tensor parallelism splits."""
        raise NotImplementedError

    def finish_init(self, quantization_config: Optional[QuantizationConfig]) -> None:
        """Take the formats the config megatron-core matched to this layer gives it (none matched: stock)."""
        if quantization_config is None:
            return
        quant = module_quant(quantization_config, self.config, self.gemm_role)
        gated = self.fused_gate and self.config.gated_linear_unit  # megatron fuses [gate; up] per shard
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
        if self.config.cpu_offloading:
            raise ValueError(f"{site.module if site else type(self).__name__}: cpu_offloading is not supported "
                             "for quantized layers; disable it or leave this layer unquantized")
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

    def forward(self, *args, **kwargs):
        self.enter_phase()
        if self.quant is None:
            return super().forward(*args, **kwargs)
        return self.quantized_forward(*args, **kwargs)

    def gemm(self, input: Tensor, weight: Tensor, bias: Optional[Tensor], *, allreduce_dgrad: bool,
             sequence_parallel: bool, tp_group, grad_output_buffer=None, wgrad_deferral_limit=None) -> Tensor:
        """input @ weight.T (+ bias) on this rank's shard, with quantized operands; the backward's
        TP communication (the dgrad all-reduce, the sequence-parallel gathers) as megatron-core's."""
        cfg = LinearGemmConfig(
            quant=self.quant, weight_cache=self.weight_cache, quant_group=self.tp_group, site=self.capture_site,
            gradient_accumulation_fusion=self.gradient_accumulation_fusion,
            allreduce_dgrad=allreduce_dgrad, sequence_parallel=sequence_parallel,
            tp_group=self.tp_group if tp_group is None else tp_group,
            grad_output_buffer=grad_output_buffer, wgrad_deferral_limit=wgrad_deferral_limit,
            noise_root=self.noise_root)
        return QuantLinearFunction.apply(input, weight, bias, cfg)


class QuantColumnParallelLinear(QuantLinearMixin, ColumnParallelLinear):
    """ColumnParallelLinear (weight sharded along out_features) with quantized GEMMs."""

    parallel = "column"

    def _shard_size(self) -> int:
        return self.output_size_per_partition

    def quantized_forward(self, input_: Tensor, weight: Optional[Tensor] = None,
                          runtime_gather_output: Optional[bool] = None) -> tuple[Tensor, Optional[Tensor]]:
        """``ColumnParallelLinear.forward``'s contract: [s, b, h] in, (output, bias if skip_bias_add)."""
        if weight is None:
            if self.weight is None:
                raise RuntimeError(f"{type(self).__name__}: skip_weight_param_allocation is set, so forward needs "
                                   "the weight")
            weight = self.weight
        elif weight.shape != (self.output_size_per_partition, self.input_size):
            raise RuntimeError(f"supplied weight's shape is {tuple(weight.shape)}, "
                               f"not {(self.output_size_per_partition, self.input_size)} as expected")
        explicit = self.explicit_expert_comm
        if self.allreduce_dgrad or self.sequence_parallel or explicit or self.disable_grad_reduce:
            input_parallel = input_  # the backward's all-reduce or gather is the GEMM's own
        else:
            input_parallel = copy_to_tensor_model_parallel_region(input_, group=self.tp_group)
        deferred = self.config.defer_embedding_wgrad_compute
        if deferred and (self.config.wgrad_deferral_limit == 0
                         or len(self.embedding_activation_buffer) < self.config.wgrad_deferral_limit):
            self.embedding_activation_buffer.append(input_parallel)
        output_parallel = self.gemm(
            input_parallel, weight, None if self.skip_bias_add else self.bias,
            allreduce_dgrad=False if explicit else self.allreduce_dgrad,
            sequence_parallel=False if explicit else self.sequence_parallel, tp_group=self.tp_group,
            grad_output_buffer=self.grad_output_buffer if deferred else None,
            wgrad_deferral_limit=self.config.wgrad_deferral_limit if deferred else None)
        gather = self.gather_output if runtime_gather_output is None else runtime_gather_output
        output = (gather_from_tensor_model_parallel_region(output_parallel, group=self.tp_group) if gather
                  else output_parallel)
        return output, self.bias if self.skip_bias_add else None


class QuantRowParallelLinear(QuantLinearMixin, RowParallelLinear):
    """RowParallelLinear (weight sharded along in_features) with quantized GEMMs."""

    parallel = "row"

    def _shard_size(self) -> int:
        return self.input_size_per_partition

    def quantized_forward(self, input_: Tensor) -> tuple[Tensor, Optional[Tensor]]:
        """``RowParallelLinear.forward``'s contract: [s, b, h / tp] in, (output, bias if skip_bias_add)."""
        if self.input_is_parallel:
            input_parallel = input_
        elif self.sequence_parallel:
            raise ValueError(f"{type(self).__name__}: sequence parallelism needs input_is_parallel")
        else:
            input_parallel = scatter_to_tensor_model_parallel_region(input_, group=self.tp_group)
        output_parallel = self.gemm(input_parallel, self.weight, None, allreduce_dgrad=False,
                                    sequence_parallel=False, tp_group=None)
        if self.explicit_expert_comm:  # the expert dispatcher reduces; megatron-core asserts skip_bias_add
            output = output_parallel
        elif self.sequence_parallel:
            output = reduce_scatter_to_sequence_parallel_region(output_parallel, group=self.tp_group)
        else:
            output = reduce_from_tensor_model_parallel_region(output_parallel, group=self.tp_group)
        if self.skip_bias_add:
            return output, self.bias
        return (output + self.bias if self.bias is not None else output), None


QUANTIZED_LINEARS = {ColumnParallelLinear: QuantColumnParallelLinear, RowParallelLinear: QuantRowParallelLinear}


def quantize_built(layer: torch.nn.Module, role: str) -> None:
    """``layer``, built as megatron-core's own linear class where megatron-core accepts no other
    (``adapters.Adapter.built_stock``), made our quantized layer in place with ``role``: the same object,
    weight and construction; it runs as the stock layer until ``finish_init`` configures it."""
    if type(layer) not in QUANTIZED_LINEARS:
        raise TypeError(f"a {type(layer).__name__} cannot be made a quantized layer; "
                        f"allowed: {', '.join(cls.__name__ for cls in QUANTIZED_LINEARS)}")
    layer.__class__ = QUANTIZED_LINEARS[type(layer)]
    layer.gemm_role = role


def invalidate_quantized_weights(model: torch.nn.Module) -> None:
    """Forget every cached quantized weight in ``model`` (see ``QuantizedWeightCache``)."""
    for module in model.modules():
        if isinstance(module, CachesQuantizedWeights):
            module.invalidate_quantized_weights()
