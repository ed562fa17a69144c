"""An MoE layer's routed experts as grouped GEMMs: ``QuantGroupedMLP``, megatron-core's ``SequentialMLP``
(same experts, parameters, checkpoint layout, module paths, recipes and capture sites) whose ``forward``
runs all local experts' fc1 and fc2 as one grouped GEMM each, forward and backward, instead of one GEMM
per expert.

Every expert's operands are quantized with that expert's own scales, all experts in one call of the
format (``grouped_operand.quantize_groups``; weights stacked, quantized once per optimizer step), and the
operands are the per-expert path's bits; on the CPU so are the outputs, input and weight gradients, experts
with no tokens included (``tests/layers/test_grouped_experts.py``, against megatron-core's ``SequentialMLP``
with our quantized linear layers); a GPU's grouped GEMM adds each expert's products in its own order.

Where the experts' settings are ones the grouped path does not reproduce, the layer runs
``SequentialMLP.forward`` (one expert after another, exactly as before): a capture in progress (so
captured tensors and their names stay per expert), formats whose scales read a per-tensor amax or an
amax history, stochastic rounding, Hadamard transforms, accumulator models, backward operands taken
from the forward's dequantized ones, experts that differ in precision, one local expert, expert tensor
parallelism, biases, gradient-accumulation fusion, and megatron-core's fused or Transformer Engine
activations. ``grouped_reason`` names which.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
from megatron.core.transformer.moe.experts import SequentialMLP
from torch import Tensor

from megatron.quant.layers.grouped_gemm import grouped_product
from megatron.quant.layers.grouped_operand import StackedWeights, TokenGroups, groupable, quantize_groups
from megatron.quant.layers.linear import QuantLinearMixin
from megatron.quant.layers.linear_function import LinearQuant
from megatron.quant.layers.operand import capturing, same_quantization
from megatron.quant.layers.weight_cache import CachesQuantizedWeights
from megatron.quant.recipes.operands import LINEAR_GEMMS, LINEAR_OPERANDS

UNQUANTIZED = LinearQuant.from_formats({key: None for key in LINEAR_OPERANDS})


@dataclass(frozen=True)
class GroupedGemmConfig:
    quant: LinearQuant  # every local expert's (they are equal)
    groups: TokenGroups
    weights: StackedWeights


class GroupedLinearFunction(torch.autograd.Function):
    """``QuantLinearFunction`` (no bias, no parallelism, no capture) for all local experts at once:
    tokens [T, in] sorted by expert, one weight [out, in] per expert."""

    @staticmethod
    def forward(ctx, x: Tensor, cfg: GroupedGemmConfig, *weights: Tensor) -> Tensor:
        q = cfg.quant
        xq = quantize_groups(x, q["fprop.input"], cfg.groups)
        ctx.reuse_input = same_quantization(q["fprop.input"], q["wgrad.input"])
        ctx.cfg = cfg
        ctx.save_for_backward(xq if ctx.reuse_input else x, *weights)
        return grouped_product("fprop", xq, cfg.weights.get(weights, q["fprop.weight"]), cfg.groups)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        x, *weights = ctx.saved_tensors
        cfg: GroupedGemmConfig = ctx.cfg
        q, groups = cfg.quant, cfg.groups
        dy = quantize_groups(grad_output, q["dgrad.grad_output"], groups)
        grad_input = grouped_product("dgrad", dy, cfg.weights.get(weights, q["dgrad.weight"]), groups)
        grads: list[Optional[Tensor]] = [None] * len(weights)
        if weights[0].requires_grad:
            dy_w = dy if same_quantization(q["dgrad.grad_output"], q["wgrad.grad_output"]) else \
                quantize_groups(grad_output, q["wgrad.grad_output"], groups)
            x_w = x if ctx.reuse_input else quantize_groups(x, q["wgrad.input"], groups)
            grads = list(grouped_product("wgrad", dy_w, x_w, groups).unbind(0))
        return (grad_input, None, *grads)


def _same_quant(a: LinearQuant, b: LinearQuant) -> bool:
    def key(q: LinearQuant) -> tuple:
        return (tuple(None if s.fmt is None else (type(s.fmt), s.fmt.name, repr(s.fmt.options))
                      for s in (q[k] for k in LINEAR_OPERANDS)), q.dequantized, q.accumulate)
    return key(a) == key(b)


def _groupable(q: LinearQuant) -> bool:
    return (all(groupable(q[key]) for key in LINEAR_OPERANDS) and not q.dequantized
            and all(q.accumulator(gemm) is None for gemm in LINEAR_GEMMS))


class QuantGroupedMLP(CachesQuantizedWeights, SequentialMLP):
    """``SequentialMLP`` whose local experts run as grouped GEMMs where that gives the same bits (see the
    module docstring); its experts' linear layers are built, configured and checkpointed as before."""

    stacked: Optional[dict[str, StackedWeights]] = None

    def invalidate_quantized_weights(self) -> None:
        for cache in (self.stacked or {}).values():
            cache.invalidate()

    def _linears(self, name: str) -> list[torch.nn.Module]:
        return [getattr(expert, name) for expert in self.local_experts]

    def grouped_reason(self) -> Optional[str]:
        """Why the local experts run one after another now (None: they run grouped)."""
        c = self.config
        if self.num_local_experts == 1:
            return "one local expert"
        for flag in ("fp8", "fp4", "moe_apply_probs_on_input", "use_te_activation_func", "bias_activation_fusion",
                     "gradient_accumulation_fusion", "cpu_offloading", "add_bias_linear"):
            if getattr(c, flag):
                return f"{flag} is set"
        linears = self._linears("linear_fc1") + self._linears("linear_fc2")
        if not all(isinstance(m, QuantLinearMixin) for m in linears):
            return "experts' linear layers are not megatron.quant's"
        if dist.is_initialized() and dist.get_world_size(linears[0].tp_group) > 1:
            return "expert tensor parallelism"
        if any(capturing(m.capture_site) for m in linears):
            return "a capture is in progress"
        if len({m.weight.requires_grad for m in linears}) > 1:
            return "some experts' weights are frozen"
        for name in ("linear_fc1", "linear_fc2"):
            quants = [m.quant or UNQUANTIZED for m in self._linears(name)]
            if not all(_same_quant(quants[0], q) for q in quants[1:]):
                return f"experts' {name} differ in precision"
            if not _groupable(quants[0]):
                return f"{name}'s operands need per-expert amaxes, noise, transforms or accumulators"
        return None

    def forward(self, permuted_local_hidden_states: Tensor, tokens_per_expert: Tensor, permuted_probs: Tensor):
        """``SequentialMLP.forward``'s contract; grouped GEMMs where ``grouped_reason`` is None."""
        for linear in self._linears("linear_fc1") + self._linears("linear_fc2"):
            if isinstance(linear, QuantLinearMixin):
                linear.enter_phase()  # the phase the per-expert forwards would take
        counts = tuple(tokens_per_expert.tolist())
        if self.grouped_reason() is not None or not any(counts):  # no tokens at all: nothing to group
            return super().forward(permuted_local_hidden_states, tokens_per_expert, permuted_probs)
        if self.stacked is None:
            self.stacked = {"linear_fc1": StackedWeights(), "linear_fc2": StackedWeights()}
        groups = TokenGroups(counts, permuted_local_hidden_states.device)
        hidden = self._grouped_linear("linear_fc1", permuted_local_hidden_states, groups)
        hidden = self._activation(hidden, permuted_probs)
        return self._grouped_linear("linear_fc2", hidden, groups), None

    def _grouped_linear(self, name: str, x: Tensor, groups: TokenGroups) -> Tensor:
        linears = self._linears(name)
        cfg = GroupedGemmConfig(linears[0].quant or UNQUANTIZED, groups, self.stacked[name])
        return GroupedLinearFunction.apply(x, cfg, *(m.weight for m in linears))

    def _activation(self, x: Tensor, probs: Tensor) -> Tensor:
        """megatron-core's ``MLP`` activation, unfused and without bias, each token weighted by its
        routing probability (elementwise, so the concatenated tokens give each expert's bits)."""
        c = self.config
        if c.gated_linear_unit:
            gate, linear = torch.chunk(x, 2, dim=-1)
            if (val := c.activation_func_clamp_value) is not None:
                gate, linear = gate.clamp(min=None, max=val), linear.clamp(min=-val, max=val)
            out = c.activation_func(gate) * (linear + c.glu_linear_offset)
        else:
            out = self.local_experts[0].activation_func(x)
        return (out * probs.unsqueeze(-1)).to(out.dtype)
