"""The MoE router with its gating GEMM in its own precision, and the load it gives each expert.

``QuantTopKRouter`` is megatron-core's ``TopKRouter`` (its top-k, score function, load-balancing
losses, expert bias) whose ``gating`` (logits = X W^T over the experts, in ``moe_router_dtype``)
runs through the lab's linear function: unquantized by default (the ``router`` role is named-only,
as the LM head: Transformer Engine and DeepSeek-V3 keep it in high precision), fake-quantized
forward and backward where a recipe rule names ``router``. It replaces megatron-core's
``router_gating_linear``, which 0.16 cannot run without Transformer Engine.

When capture is on, the router records the tokens each global expert receives in the micro-batch
(``tokens_per_expert``, forward post): the report sets each expert's load beside its quantization
error (``analysis/experts.py``).
"""
from __future__ import annotations

from typing import Optional

import torch
from megatron.core.quantization.quant_config import QuantizationConfig
from megatron.core.transformer.moe.router import TopKRouter

from megatron.quant import tensor_saver
from megatron.quant.formats.random_bits import RandomBits
from megatron.quant.layers.delayed import amax_reduction_group
from megatron.quant.layers.histories import attach_histories
from megatron.quant.layers.linear_function import LinearGemmConfig, LinearQuant, QuantLinearFunction
from megatron.quant.layers.module_quant import FinishesInit, module_quant
from megatron.quant.layers.operand import capturing, module_noise_root
from megatron.quant.layers.weight_cache import QuantizedWeightCache
from megatron.quant.recipes.operands import LINEAR_OPERANDS
from megatron.quant.tensor_saver import CaptureSite

# megatron-core's moe_router_dtype -> the dtype its gating computes in (None: the input's).
ROUTER_DTYPES = {None: None, "fp32": torch.float32, "fp64": torch.float64}
UNQUANTIZED = LinearQuant.from_formats({key: None for key in LINEAR_OPERANDS})


def router_quant_problem(router_dtype: Optional[str], sequence_parallel: bool) -> Optional[str]:
    """Why a quantized router cannot be emulated with megatron-core's ``moe_router_dtype`` and sequence
    parallelism as given (one clause naming the value); None when it can."""
    if router_dtype not in (None, "fp32"):
        return (f"moe_router_dtype {router_dtype!r} computes the router in float64, which a quantized router "
                f"cannot take; use fp32 or none")
    if sequence_parallel:
        return ("under sequence parallelism each rank's router sees a sequence shard, whose scales would depend "
                "on the TP size; keep the router unquantized")
    return None


class QuantTopKRouter(FinishesInit, TopKRouter):
    """megatron-core's TopKRouter with its gating GEMM in the recipe's ``router`` precision."""

    quant: LinearQuant = UNQUANTIZED
    capture_site: Optional[CaptureSite] = None  # where the load per expert is recorded
    gemm_site: Optional[CaptureSite] = None  # where the gating GEMM's operands are (quantized routers only)
    weight_cache: Optional[QuantizedWeightCache] = None
    noise_root: Optional[RandomBits] = None

    def finish_init(self, quantization_config: Optional[QuantizationConfig]) -> None:
        """Take the ``router`` formats of the config megatron-core matched to this module (none: high precision)."""
        if quantization_config is None:
            return
        matched = module_quant(quantization_config, self.config, "router")
        quant = LinearQuant.from_formats(matched.formats)
        quantized = any(spec.fmt is not None for spec in quant.specs.values())
        problem = router_quant_problem(self.config.moe_router_dtype, self.config.sequence_parallel)
        if quantized and problem:
            raise ValueError(f"{matched.site.module}: a quantized router: {problem}")
        # Delayed scaling's histories are reduced as the linear layers' are (Megatron-LM's amax group).
        self.quant = attach_histories(quant, self, amax_reduction_group(self.tp_group, self.config.tp_only_amax_red))
        self.capture_site = matched.site
        # A high-precision router's GEMM is not captured (as the LM head's): only its load record is.
        self.gemm_site = matched.site if quantized else None
        self.weight_cache = QuantizedWeightCache()
        self.noise_root = module_noise_root(matched.seed, matched.site.module, self.quant.specs.values())

    def gating(self, input: torch.Tensor) -> torch.Tensor:
        """The logits, X W^T (+ bias) in ``moe_router_dtype``, with the recipe's router formats."""
        dtype = ROUTER_DTYPES[self.config.moe_router_dtype] or input.dtype
        # The gating's operands are whole on every rank: no per-tensor amax to reduce (quant_group None).
        cfg = LinearGemmConfig(quant=self.quant, weight_cache=self.weight_cache or QuantizedWeightCache(),
                               quant_group=None, site=self.gemm_site, gradient_accumulation_fusion=False,
                               allreduce_dgrad=False, sequence_parallel=False, tp_group=self.tp_group,
                               noise_root=self.noise_root)
        bias = None if self.bias is None else self.bias.to(dtype)
        return QuantLinearFunction.apply(input.to(dtype), self.weight.to(dtype), bias, cfg)

    def routing(self, logits: torch.Tensor, *args, **kwargs):
        """megatron-core's routing; records each expert's token count when capturing."""
        probs, routing_map = super().routing(logits, *args, **kwargs)
        if capturing(self.capture_site):
            counts = routing_map.reshape(-1, routing_map.shape[-1]).sum(dim=0, dtype=torch.float32)
            tensor_saver.capture(self.capture_site, "forward", "post", {"tokens_per_expert": counts})
        return probs, routing_map
