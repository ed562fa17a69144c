"""The layers on the Triton path: a quantized linear layer's output and gradients are the torch
path's bits for Transformer Engine's recipes (SR on gradients, RHT, 2-D weights, delayed scaling)."""
import pytest
import torch

from megatron.quant.layers.linear import QuantRowParallelLinear
from megatron.quant.layers.linear_function import LinearQuant
from megatron.quant.layers.module_quant import format_builder
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.tensor_saver import CaptureSite
from tests.layers._helpers import transformer_config

pytestmark = pytest.mark.device
SITE = CaptureSite("linear", "linear", 0, "test.linear", "fc2", "test")


@pytest.fixture(scope="module")
def parallel():
    from megatron.quant import cpu

    cpu.init_parallel(seed=11)
    yield
    cpu.destroy_parallel()


def _run(preset: str, device, dtype, capture: bool = False) -> list[torch.Tensor]:
    layer = QuantRowParallelLinear(64, 48, config=transformer_config(params_dtype=dtype, bf16=dtype == torch.bfloat16),
                                   init_method=torch.nn.init.normal_, bias=False, input_is_parallel=True,
                                   skip_bias_add=False).to(device)
    torch.manual_seed(0)
    torch.nn.init.normal_(layer.weight)
    recipe = QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": preset})
    formats = recipe.resolve("fc2", 0, 1, build=format_builder(recipe))
    layer.configure_quant(LinearQuant.from_formats(formats), SITE, seed=3)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 2, 64, generator=g).to(device, dtype).requires_grad_()
    if capture:
        from megatron.quant import position

        position.set_microbatch(0, 0)
    y, _ = layer(x)
    y.backward(torch.randn(y.shape, generator=g).to(device, dtype))
    return [y.detach(), x.grad, layer.weight.grad, *layer.buffers()], formats  # buffers: delayed histories


@pytest.mark.parametrize("preset", ["te-nvfp4", "te-mxfp8", "te-fp8-current", "te-fp8-blockwise", "te-fp8-delayed"])
def test_linear_layer_on_triton_kernels_gives_the_torch_path_bits(preset, parallel, kernel_device, monkeypatch):
    from megatron.quant.kernels import blocks

    dtype = torch.bfloat16
    monkeypatch.setenv("CUSTOM_QUANT_KERNELS", "torch")
    expected, _ = _run(preset, kernel_device, dtype)
    monkeypatch.setenv("CUSTOM_QUANT_KERNELS", "triton")
    dual_calls = []
    launch_dual = blocks.launch_dual
    monkeypatch.setattr(blocks, "launch_dual", lambda *args, **kw: dual_calls.append(1) or launch_dual(*args, **kw))
    ours, formats = _run(preset, kernel_device, dtype)
    assert {type(f).__name__ for f in formats.values() if f is not None} == {"TritonFormat"}
    assert len(ours) == len(expected) and (len(ours) > 3) == (preset == "te-fp8-delayed")  # histories compared too
    for a, b in zip(ours, expected):
        assert torch.equal(a, b)
    # The weight's fprop and dgrad copies, the input's fprop and wgrad copies and the gradient's dgrad and
    # wgrad copies come from one read where both use one block format along an axis (not 2-D tiles:
    # te-fp8-blockwise's weights).
    assert len(dual_calls) == {"te-mxfp8": 3, "te-fp8-blockwise": 2}.get(preset, 0)


def _captured_stats(capture_session, preset: str, level: str, directory, device) -> dict:
    """The statistics a stats-mode capture of one forward and backward of the layer records, by
    (operation, phase, tensor name)."""
    import json
    from pathlib import Path

    from megatron.quant import position, tensor_saver

    capture_session(directory, iterations="0", mode="stats", stats=level)
    position.set_iteration(0)
    _run(preset, device, torch.bfloat16, capture=True)
    tensor_saver.close()
    records = {}
    for manifest in Path(directory).rglob("*.jsonl"):
        for line in manifest.read_text().splitlines():
            meta = json.loads(line)["metadata"]
            records[meta["operation"], meta["phase"], meta["tensor_name"]] = meta["stats"]
    return records


@pytest.mark.parametrize("level", ["counts", "sample", "full"])
@pytest.mark.parametrize("preset", ["te-nvfp4", "te-mxfp8", "te-fp8-current"])
def test_capture_statistics_on_the_kernel_path_equal_the_torch_paths(preset, level, parallel, kernel_device,
                                                                      monkeypatch, tmp_path, capture_session):
    """The captured operands are quantized by the kernels, which take the statistics in the same pass
    (the exact fields; at the full level all of them), TE's 2-D weights and RHT operands included, and
    every recorded statistic is the torch path's, to the bit."""
    from megatron.quant.capture import snapshot
    from megatron.quant.stats import levels

    monkeypatch.setenv("CUSTOM_QUANT_KERNELS", "torch")
    expected = _captured_stats(capture_session, preset, level, tmp_path / "torch", kernel_device)
    monkeypatch.setenv("CUSTOM_QUANT_KERNELS", "triton")
    computed, spied = [], "pack_stats" if level == "full" else "_exact_counts"
    original = getattr(levels, spied)
    spy = lambda *a, **kw: computed.append(a[1] if len(a) > 1 else kw.get("fmt")) or original(*a, **kw)  # noqa: E731
    monkeypatch.setattr(levels, spied, spy)
    if level == "full":  # on CUDA the capture packs the full statistics on the device itself
        monkeypatch.setattr(snapshot, "pack_stats", spy)
    ours = _captured_stats(capture_session, preset, level, tmp_path / "triton", kernel_device)
    assert ours.keys() == expected.keys() and len(ours) >= 4
    assert ours == expected
    # Only operands without a format, or with a Hadamard transform, have their statistics taken in torch.
    assert computed and all(fmt is None or fmt.transforms_operand for fmt in computed)


@pytest.mark.parametrize("name,options", [("mxfp8_e4m3", {"rounding": "stochastic"}), ("nvfp4", {}),
                                          ("fp8_e4m3", {"scaling": "block"})])
def test_attention_products_take_both_axes_of_their_gradient_from_one_read(name, options, kernel_device,
                                                                            monkeypatch):
    """Attention's batched products quantize dC along p (for dA) and along m (for dB) with the dual
    kernel: the same gradients as the torch path's two quantizations, stochastic rounding included."""
    from megatron.quant import kernels
    from megatron.quant.formats import get_format
    from megatron.quant.kernels import blocks
    from megatron.quant.layers.bmm_function import BmmOperands, BmmQuant, QuantBmmFunction
    from megatron.quant.layers.operand import NoiseScope, module_noise_root
    from megatron.quant.recipes.operands import BMM_AXES, OperandSpec

    def grads(fmt):
        quant = BmmQuant(*(OperandSpec(fmt, axis, key) for axis, key in zip(BMM_AXES, ("a", "b", "dc_a", "b2",
                                                                                        "a2", "dc_b"))))
        root = module_noise_root(4, "bmm", [quant.grad_a_dc])
        noise = None if root is None else NoiseScope(root, 0, 0, 0, 1)
        g = torch.Generator().manual_seed(2)
        a = torch.randn(3, 40, 64, generator=g).to(kernel_device, torch.bfloat16).requires_grad_()
        b = torch.randn(3, 64, 72, generator=g).to(kernel_device, torch.bfloat16).requires_grad_()
        c = QuantBmmFunction.apply(a, b, 0.125, quant, BmmOperands(noise=noise))
        c.backward(torch.randn(c.shape, generator=g).to(kernel_device, torch.bfloat16))
        return a.grad, b.grad

    fmt = get_format(name, **options)
    expected = grads(fmt)
    calls = []
    launch_dual = blocks.launch_dual
    monkeypatch.setattr(blocks, "launch_dual",
                        lambda *args, **kw: calls.append(args[0].shape) or launch_dual(*args, **kw))
    ours = grads(kernels.wrap(fmt, compile=False, chosen="triton"))
    assert calls == [(3, 40, 72)]
    for a, b in zip(ours, expected):
        assert torch.equal(a, b)
