"""A quantized GEMM's and a training step's work, counted on the CPU (``bench.gpu.step_work.WorkCount``,
a dispatch mode over the real layers, on the GPU's path of narrow GEMMs into FP32 outputs) and held to
budgets: no host synchronisation and no FP32 GEMM anywhere in the quantization, and the kernel
launches and bytes each preset's quantization takes today as ceilings that must not grow (the goal is
the floor: each operand read and written once, one launch an operand). The counts are the eager torch
path's, which the CPU runs (a GPU runs the Triton kernels where a format has one), and the Triton path's,
run in Triton's interpreter, where each kernel is one ``megatron_quant`` operator: there the block formats
whose kernel does both axes are at the floor of each tensor read once, its two layouts written."""
import math

import pytest
import torch

from bench.gpu.step_work import WorkCount, linear_floor, operand_floor
from megatron.quant.layers.linear import QuantColumnParallelLinear
from megatron.quant.layers.linear_function import LinearQuant
from megatron.quant.layers.module_quant import format_builder
from megatron.quant.recipes.recipe import QuantRecipe
from tests.layers._helpers import transformer_config

try:  # Triton fixes a kernel as interpreted when its module is imported: now, under the root conftest's
    import megatron.quant.kernels.triton_format  # noqa: F401  TRITON_INTERPRET=1, not after another test's env
except ImportError:
    pass

TOKENS, IN, OUT = 64, 128, 256
# preset: (the quantization's launches, its bytes over the floor's) for one linear layer's forward
# and backward on bf16 tensors of (TOKENS, IN) -> OUT, today (the ratio rounded up to 0.1); the floor's ratio is 1.
CEILINGS = {"te-mxfp8": (312, 37.3), "te-fp8-current": (99, 15.6), "te-fp8-delayed": (147, 15.8),
            "te-fp8-blockwise": (174, 33.4), "te-nvfp4": (396, 61.7), "hifp8": (87, 29.1), "mxfp4": (264, 34.9)}


def _count(preset: str, kernels: bool = False, micro_batches: int = 1) -> WorkCount:
    """One linear layer's forward and backward per micro-batch (the weight unchanged between them, as within
    an optimizer step), counted; ``kernels``: on the kernel path the environment chooses."""
    recipe = QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": preset})
    layer = QuantColumnParallelLinear(IN, OUT, config=transformer_config(params_dtype=torch.bfloat16, bf16=True),
                                      init_method=torch.nn.init.normal_, bias=False, gather_output=False)
    formats = recipe.resolve("fc1", 0, 2, build=format_builder(recipe)) if kernels else recipe.resolve("fc1", 0, 2)
    layer.configure_quant(LinearQuant.from_formats(formats, recipe.dequantized_sources()), None)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(TOKENS // 2, 2, IN, generator=generator).to(torch.bfloat16).requires_grad_()
    grad = torch.randn(TOKENS // 2, 2, OUT, generator=generator).to(torch.bfloat16)
    with WorkCount() as count:
        for _ in range(micro_batches):
            y, _ = layer(x)
            y.backward(grad)
    return count


@pytest.mark.parametrize("preset", sorted(CEILINGS))
def test_a_quantized_gemm_stays_within_its_work_budget(parallel, gpu_gemm_path, preset):
    count = _count(preset)
    floor_bytes = linear_floor(TOKENS, IN, OUT)["operand_elements"] * 2 * 2  # each use read and written in bf16
    launches, ratio = CEILINGS[preset]
    measured = count.quant_bytes / floor_bytes
    print(f"{preset}: {count.summary()}, {measured:.2f}x the floor's bytes")
    assert (count.gemms, count.fp32_gemms, count.host_syncs) == (3, 0, 0), count.summary()
    assert count.quant_launches <= launches, f"{count.quant_launches} launches > {launches}: {count.ops}"
    assert measured <= ratio, f"{measured:.2f}x the floor's bytes > {ratio}x"


# preset: the Triton path's quantization launches for the layer above in an optimizer step of two micro-batches: one a
# tensor (X for fprop and wgrad and dY for dgrad and wgrad each micro-batch, W for fprop and dgrad once a step, each
# from one read; te-fp8-blockwise's W in 128x128 tiles, which serve both GEMMs), against 4 a micro-batch before X
# took one read; its bytes at most the floor's of each tensor read once, its two layouts written (a micro-batch:
# 0.75x the floor of each operand; te-fp8-blockwise's W is written once: 0.61x).
KERNEL_LAUNCHES = {"te-mxfp8": 5, "te-fp8-blockwise": 5}


@pytest.mark.parametrize("preset", sorted(KERNEL_LAUNCHES))
def test_the_kernel_path_reads_each_tensor_once(parallel, gpu_gemm_path, monkeypatch, preset):
    pytest.importorskip("triton", reason="Triton does not import here: its kernels are not tested")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read when a kernel launches
    monkeypatch.setenv("CUSTOM_QUANT_KERNELS", "triton")
    count = _count(preset, kernels=True, micro_batches=2)
    floor = linear_floor(TOKENS, IN, OUT, micro_batches=2)["tensor_elements"] * 3 * 2  # read once, both written, bf16
    print(f"{preset}: {count.summary()}, {count.quant_bytes / floor:.2f}x the one-read floor's bytes")
    assert (count.gemms, count.fp32_gemms, count.host_syncs) == (6, 0, 0), count.summary()
    assert count.quant_launches == KERNEL_LAUNCHES[preset], count.ops
    assert count.quant_bytes <= floor


def test_bf16_runs_three_gemms_and_nothing_else(parallel, gpu_gemm_path):
    count = _count("bf16")
    assert count.summary() == {"launches": 3, "host_syncs": 0, "gemms": 3, "fp32_gemms": 0, "quant_launches": 0,
                               "quant_host_syncs": 0, "quant_bytes": 0}


def test_the_count_sees_fp32_gemms_of_widened_operands(parallel):
    """Without the narrow GEMM (the CPU's own path), a per-tensor-scaled layer widens its operands:
    the FP32 GEMMs that made the per-tensor presets 6x slower on a GPU, which the budget refuses."""
    assert _count("te-fp8-current").fp32_gemms == 3


def test_the_count_sees_host_reads_and_launches():
    x = torch.arange(6.0)
    with WorkCount() as count:
        y = x * 2
        y.sum().item()
        torch.nonzero(y)
        y.view(2, 3).t()  # views launch nothing
    assert (count.launches, count.host_syncs, count.gemms) == (4, 2, 0), count.ops


def test_the_floor_counts_every_operand_use_once():
    floor = linear_floor(tokens=8, fan_in=4, fan_out=2, micro_batches=3)
    x, dy, w = 8 * 4 * 3, 8 * 2 * 3, 4 * 2
    assert floor == {"operand_elements": 2 * (x + dy + w), "tensor_elements": x + dy + w}
    assert math.isclose(floor["operand_elements"] / floor["tensor_elements"], 2.0)


# preset: (the quantization's launches, its bytes over the floor's) in one training step of llama-tiny
# with one layer, sequence 32, one micro-batch of 1, in bf16: forward, backward and the optimizer's step.
STEP_CEILINGS = {"te-fp8-current": (396, 15.6), "te-mxfp8": (1508, 37.5), "te-nvfp4": (1584, 33.8)}
# The bf16 step's own: its 15 GEMMs (the LM head's 3 and the layer's 4 linear layers' 3 each; the
# attention's products run in SDPA) and 8 reads of a value by the host, each torch Adam reading a
# parameter's step counter, which lives on the host on a GPU too.
STEP_GEMMS, STEP_HOST_READS = 15, 8


@pytest.mark.slow  # trains one step of a one-layer llama-tiny (about 5 s a preset)
@pytest.mark.parametrize("preset", sorted(STEP_CEILINGS))
def test_a_training_step_stays_within_its_work_budget(monkeypatch, gpu_gemm_path, preset):
    from megatron.quant.training import loop
    from megatron.quant.training.main import main
    from megatron.quant.training.presets import get_preset

    counts = []
    step = loop.train_step

    def counted_step(run, iteration):
        with WorkCount() as count:
            result = step(run, iteration)
        counts.append(count)
        return result

    monkeypatch.setattr(loop, "train_step", counted_step)
    monkeypatch.setenv("CUSTOM_QUANT_TYPE", preset)
    # the GEMMs' own work is not counted: exact sums (te-fp8-current's Hopper accumulation runs its tensor core
    # on a GPU, a model of it on the CPU, whose work is no GPU's)
    monkeypatch.setenv("CUSTOM_QUANT_ACCUMULATE", "exact")
    main(["--model", "llama-tiny", "--num-layers", "1", "--mock-data", "--seq-length", "32", "--micro-batch-size", "1",
          "--global-batch-size", "1", "--train-iters", "1", "--eval-iters", "0", "--lr", "1e-3", "--bf16"])
    (count,) = counts
    floor = operand_floor(dict(get_preset("llama-tiny"), num_layers=1), seq=32, micro_batch=1, micro_batches=1)
    measured = count.quant_bytes / (floor["operand_elements"] * 2 * 2)
    launches, ratio = STEP_CEILINGS[preset]
    print(f"{preset}: {count.summary()}, {measured:.2f}x the floor's bytes")
    assert (count.gemms, count.fp32_gemms, count.host_syncs, count.quant_host_syncs) == (
        STEP_GEMMS, 0, STEP_HOST_READS, 0), count.summary()
    assert count.quant_launches <= launches, f"{count.quant_launches} launches > {launches}"
    assert measured <= ratio, f"{measured:.2f}x the floor's bytes > {ratio}x"
