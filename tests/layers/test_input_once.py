"""A linear layer's input quantized once for fprop and wgrad: where one kernel does both axes (block formats
on the Triton path, run here in Triton's interpreter), the forward quantizes X along features and tokens
from one read and saves wgrad's copy, and the backward quantizes only dY (both of its layouts from one read).
The oracle is the eager torch path, which quantizes X twice (fprop's copy in the forward, wgrad's from the
saved input in the backward): the output and both gradients are the same bits, stochastic rounding
included; a scheduled recipe takes the one read in the phases that allow it. Where the one read does not
apply (no backward follows, a frozen weight, sequence parallelism, a capture) X is quantized along features alone."""
import dataclasses

import pytest
import torch

from bench.gpu.step_work import WorkCount
from megatron.quant import position
from megatron.quant.layers.linear import QuantColumnParallelLinear
from megatron.quant.layers.linear_function import LinearGemmConfig, LinearQuant, QuantLinearFunction
from megatron.quant.layers.module_quant import format_builder
from megatron.quant.layers.weight_cache import QuantizedWeightCache
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.tensor_saver import CaptureSite
from tests.layers._helpers import RecordingSaver, transformer_config

try:  # Triton fixes a kernel as interpreted when its module is imported: now, under the root conftest's
    import megatron.quant.kernels.triton_format  # noqa: F401  TRITON_INTERPRET=1, not after another test's env
except ImportError:
    pass

TOKENS, IN, OUT = 64, 128, 64


@pytest.fixture
def triton(monkeypatch):
    pytest.importorskip("triton", reason="Triton does not import here: its kernels are not tested")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read when a kernel launches


def _layer(recipe: QuantRecipe, kernels: str, monkeypatch) -> QuantColumnParallelLinear:
    monkeypatch.setenv("CUSTOM_QUANT_KERNELS", kernels)
    layer = QuantColumnParallelLinear(IN, OUT, config=transformer_config(params_dtype=torch.bfloat16, bf16=True),
                                      init_method=torch.nn.init.normal_, bias=False, gather_output=False)
    phases = recipe.resolve_phases("fc1", 0, 2, build=format_builder(recipe))
    kinds = {type(f).__name__ == "TritonFormat" for phase in phases for f in phase.values() if f is not None}
    assert kinds == {kernels == "triton"}
    layer.configure_phases(lambda formats: layer.configure_quant(LinearQuant.from_formats(formats), None, seed=5),
                           phases, recipe.schedule.phase_of if len(phases) > 1 else None)
    return layer


def _step(layer, iteration: int = 1) -> tuple[dict, WorkCount]:
    """One forward and backward at ``iteration``: the output and gradients, and the backward's work."""
    position.set_iteration(iteration)
    position.set_microbatch(0, 0)
    generator = torch.Generator().manual_seed(iteration)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(OUT, IN, generator=generator))
    layer.weight.grad = None
    x = torch.randn(TOKENS // 2, 2, IN, generator=generator).to(torch.bfloat16).requires_grad_()
    y, _ = layer(x)
    saved = y.grad_fn.saved_tensors[0]  # wgrad's quantized X where it took one read, else X: the same memory
    assert (saved.shape, saved.dtype) == (x.shape, x.dtype)
    with WorkCount() as backward:
        y.backward(torch.randn(y.shape, generator=generator).to(torch.bfloat16))
    return {"output": y.detach(), "grad_input": x.grad, "grad_weight": layer.weight.grad}, backward


def _same_bits(ours: dict, reference: dict) -> None:
    for key, value in reference.items():
        assert torch.equal(ours[key], value), key


STOCHASTIC = {"format": "mxfp4", "options": {"rounding": "stochastic"}, "seed": 7}  # X's two layouts draw noise


@pytest.mark.parametrize("preset", ["te-mxfp8", "nvfp4", "te-fp8-blockwise", STOCHASTIC],
                         ids=["te-mxfp8", "nvfp4", "te-fp8-blockwise", "mxfp4-stochastic"])
def test_the_input_is_quantized_once_with_the_two_reads_bits(parallel, triton, monkeypatch, preset):
    recipe = QuantRecipe.from_dict(preset) if isinstance(preset, dict) else \
        QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": preset})
    ours, backward = _step(_layer(recipe, "triton", monkeypatch))
    reference, _ = _step(_layer(recipe, "torch", monkeypatch))
    _same_bits(ours, reference)
    # The backward quantizes dY alone, both layouts in one launch: X's wgrad copy came from the forward.
    assert [op for op in backward.ops if op in ("blocks", "blocks_both_axes")] == ["blocks_both_axes"], backward.ops
    assert backward.ops["blocks_both_axes"] == 1


def test_a_scheduled_recipe_reads_the_input_once_where_its_phase_allows(parallel, triton, monkeypatch):
    """Iteration 1: mxfp8 everywhere, one read of X; from iteration 2 the backward runs mxfp4, so wgrad's X
    (mxfp4) is not fprop's (mxfp8) and the backward quantizes it from the saved input (and W for dgrad)."""
    recipe = QuantRecipe.from_dict({"format": "mxfp8", "scope": ["linear"],
                                    "schedule": [{"from": 2, "backward": "mxfp4"}]})
    recipe = dataclasses.replace(recipe, schedule=recipe.schedule.bind(4, "test"))
    ours_layer, reference_layer = _layer(recipe, "triton", monkeypatch), _layer(recipe, "torch", monkeypatch)
    launches = []
    for iteration in (1, 2):
        ours, backward = _step(ours_layer, iteration)
        _same_bits(ours, _step(reference_layer, iteration)[0])
        launches.append((backward.ops["blocks"], backward.ops["blocks_both_axes"]))
    assert launches == [(0, 1), (2, 1)]


def _forward_launches(layer, x: torch.Tensor, **cfg) -> dict:
    """The quantization launches of one forward of ``layer``'s GEMM through ``QuantLinearFunction``."""
    config = LinearGemmConfig(quant=layer.quant, weight_cache=QuantizedWeightCache(), quant_group=None,
                              gradient_accumulation_fusion=False, allreduce_dgrad=False, tp_group=layer.tp_group,
                              **{"sequence_parallel": False, "site": None, **cfg})
    with WorkCount() as count:
        QuantLinearFunction.apply(x, layer.weight, None, config)
    return {op: n for op, n in count.ops.items() if op in ("blocks", "blocks_both_axes")}


def test_the_input_keeps_one_axis_where_no_wgrad_reads_the_forward_copy(parallel, triton, monkeypatch):
    layer = _layer(QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": "te-mxfp8"}), "triton", monkeypatch)
    x = torch.randn(TOKENS, IN).to(torch.bfloat16).requires_grad_()
    # W for fprop and dgrad in one launch; X for fprop and wgrad in one more, or along features alone.
    assert _forward_launches(layer, x) == {"blocks_both_axes": 2}
    with torch.no_grad():  # an evaluation, a recomputed region's first forward: no backward follows
        assert _forward_launches(layer, x) == {"blocks_both_axes": 1, "blocks": 1}
    # Sequence parallelism: the backward gathers the local shard again (a saved gathered copy: TP times the memory).
    assert _forward_launches(layer, x, sequence_parallel=True) == {"blocks_both_axes": 1, "blocks": 1}
    layer.weight.requires_grad_(False)  # a frozen weight: no wgrad
    assert _forward_launches(layer, x) == {"blocks_both_axes": 1, "blocks": 1}
    layer.weight.requires_grad_(True)
    # A capture records fprop's X with its statistics, from its own read: X is not taken along both axes.
    RecordingSaver().install(monkeypatch)
    site = CaptureSite(layer_type="linear", component="linear", layer_idx=0, module="fc1", role="fc1",
                       quant_type="te-mxfp8")
    assert _forward_launches(layer, x, site=site)["blocks_both_axes"] == 1


def test_a_recomputed_forward_reads_the_input_once_with_the_same_bits(parallel, triton, monkeypatch):
    """megatron-core's recompute: the first forward (under no_grad) quantizes X for fprop alone, the recompute in the
    backward for fprop and wgrad from one read, drawing the noise of its first forward's position though the
    schedule has moved on; the bits are those of the run without recompute."""
    from megatron.quant.layers import recompute

    layer = _layer(QuantRecipe.from_dict(STOCHASTIC), "triton", monkeypatch)

    def run(checkpointed: bool) -> tuple[list, WorkCount]:
        position.set_iteration(1)
        position.set_microbatch(0, 0)
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(TOKENS // 2, 2, IN, generator=generator).to(torch.bfloat16).requires_grad_()
        layer.weight.grad = None
        y = recompute.checkpoint(lambda t: layer(t)[0], False, x) if checkpointed else layer(x)[0]
        position.set_microbatch(1, 2)  # the next micro-batch's forward runs before this backward
        with WorkCount() as backward:
            y.backward(torch.randn(y.shape, generator=generator).to(torch.bfloat16))
        return [y.detach(), x.grad, layer.weight.grad], backward

    reference, _ = run(False)
    ours, backward = run(True)
    assert all(torch.equal(a, b) for a, b in zip(ours, reference))
    # The recompute's X and the backward's dY, each both layouts in one launch (W is cached for the step).
    assert {op: n for op, n in backward.ops.items() if op in ("blocks", "blocks_both_axes")} == {"blocks_both_axes": 2}


def test_an_input_that_is_not_contiguous_is_copied_once_on_the_torch_path(parallel):
    """The torch path has no kernel for both axes: the forward copies a non-contiguous input once (for its GEMM
    operand), not once more to look at it along tokens."""
    recipe = QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": "te-mxfp8"})
    layer = QuantColumnParallelLinear(IN, OUT, config=transformer_config(params_dtype=torch.bfloat16, bf16=True),
                                      init_method=torch.nn.init.normal_, bias=False, gather_output=False)
    layer.configure_quant(LinearQuant.from_formats(recipe.resolve("fc1", 0, 2)), None)
    x = torch.randn(2, TOKENS // 2, IN).to(torch.bfloat16)
    launches = []
    for view in (x.transpose(0, 1).contiguous(), x.transpose(0, 1)):
        layer(view.requires_grad_())  # the weight's copies cached
        with WorkCount() as forward:
            layer(view)
        launches.append(forward.launches)
    assert launches[1] == launches[0] + 1, launches
