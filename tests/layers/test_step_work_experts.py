"""An MoE layer's grouped experts' work, counted on the CPU as tests/layers/test_step_work.py counts a GEMM's
(``bench.gpu.step_work.WorkCount``): the same launches whatever the number of experts. In a module of its own:
the training step counted there runs the trainer in this process, which ends megatron-core's parallel state
that this module's ``parallel`` fixture holds."""
import pytest
import torch

from bench.gpu.step_work import WorkCount
from megatron.quant.layers.spec import precision_config
from megatron.quant.recipes.recipe import QuantRecipe
from tests.layers.test_step_work import IN

# An MoE layer's local experts (``QuantGroupedMLP``): their forward and backward on MOE_TOKENS tokens split over
# 4 or 8 experts (one of them without tokens), counted on the experts module alone. preset -> (launches, the
# quantization's launches, GEMMs), the same whatever the number of experts: each GEMM one grouped launch, each
# operand quantized for all experts at once (weights included: the first micro-batch of a step is counted).
MOE_TOKENS = 96
MOE_BUDGETS = {"bf16": (21, 2, 6), "te-mxfp8": (664, 645, 6), "deepseek-v3-fp8": (373, 354, 6)}


def _count_experts(preset: str, experts: int, forward=None) -> WorkCount:
    from tests.layers._helpers import moe_config, moe_layer

    quant = None if preset == "bf16" else precision_config(QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": preset}))
    module = moe_layer(moe_config(num_moe_experts=experts, hidden_size=IN, params_dtype=torch.bfloat16, bf16=True,
                                  quant_recipe=quant)).mlp.experts
    counts = torch.full((experts,), MOE_TOKENS // (experts - 1))
    counts[1] = 0
    counts[0] += MOE_TOKENS - counts.sum()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(MOE_TOKENS, IN, generator=generator).to(torch.bfloat16).requires_grad_()
    probs = torch.rand(MOE_TOKENS, generator=generator)
    with WorkCount() as count:
        y, _ = module(x, counts, probs) if forward is None else forward(module, x, counts, probs)
        y.backward(torch.ones_like(y))
    return count


@pytest.mark.parametrize("preset", sorted(MOE_BUDGETS))
def test_grouped_experts_launch_the_same_whatever_the_number_of_experts(parallel, gpu_gemm_path, preset):
    from megatron.core.transformer.moe.experts import SequentialMLP

    from megatron.quant.layers.grouped_gemm import grouped_mm_runs

    assert grouped_mm_runs("cpu", torch.bfloat16)  # torch's grouped GEMM, asked once a process (not counted)
    four, eight = _count_experts(preset, 4), _count_experts(preset, 8)
    print(f"{preset}: 4 experts {four.summary()}, 8 experts {eight.summary()}")
    assert (four.launches, four.quant_launches, four.gemms) == (eight.launches, eight.quant_launches, eight.gemms)
    assert (eight.launches, eight.quant_launches, eight.gemms) <= MOE_BUDGETS[preset], eight.ops
    assert (eight.fp32_gemms, eight.quant_host_syncs) == (0, 0)
    sequential = _count_experts(preset, 8, SequentialMLP.forward)  # the per-expert path: launches grow with experts
    print(f"{preset}: 8 experts one after another {sequential.summary()}")
    assert (sequential.gemms, sequential.launches) > (eight.gemms, eight.launches), sequential.summary()
