"""Quantized column/row-parallel linear layers against megatron-core's stock layers and a
reference built from megatron.quant.formats plus a plain matmul."""
import pytest
import torch
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

from megatron.quant.layers.linear import QuantColumnParallelLinear, QuantRowParallelLinear, invalidate_quantized_weights
from megatron.quant.layers.linear_function import LinearQuant
from megatron.quant.tensor_saver import CaptureSite
from tests.layers._helpers import (
    BLOCK_FORMAT,
    TENSOR_FORMAT,
    CountingFormat,
    RecordingSaver,
    gemm,
    linear_formats,
    operand,
    q,
    transformer_config,
)

IN, OUT, SEQ, BATCH = 64, 96, 32, 2
KINDS = {"column": (ColumnParallelLinear, QuantColumnParallelLinear, dict(gather_output=False)),
         "row": (RowParallelLinear, QuantRowParallelLinear, dict(input_is_parallel=True, skip_bias_add=False))}
SITE = CaptureSite("linear", "linear", 0, "test.linear", "fc1", "test")


def _build(kind, dtype=torch.float32, bias=True, quant=True, **config):
    stock_cls, quant_cls, kwargs = KINDS[kind]
    cfg = transformer_config(params_dtype=dtype, bf16=dtype == torch.bfloat16, **config)
    cls = quant_cls if quant else stock_cls
    return cls(IN, OUT, config=cfg, init_method=torch.nn.init.normal_, bias=bias, **kwargs)


def _run(layer, x, grad):
    x = x.clone().requires_grad_()
    y, _ = layer(x)
    y.backward(grad)
    grads = {"input": x.grad, "weight": layer.weight.grad}
    if layer.bias is not None:
        grads["bias"] = layer.bias.grad
    return y.detach(), grads


def _data(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SEQ, BATCH, IN, generator=g).to(dtype)
    grad = torch.randn(SEQ, BATCH, OUT, generator=g).to(dtype)
    return x, grad


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("passthrough", [None, "bf16"])
def test_passthrough_is_bit_identical_to_stock(parallel, kind, dtype, passthrough):
    stock, quant = _build(kind, dtype, quant=False), _build(kind, dtype)
    quant.load_state_dict(stock.state_dict())
    with torch.no_grad():
        stock.bias.normal_()
        quant.bias.copy_(stock.bias)
    quant.configure_quant(LinearQuant.from_formats(linear_formats(passthrough)), SITE)
    x, grad = _data(dtype)
    y_stock, g_stock = _run(stock, x, grad)
    y_quant, g_quant = _run(quant, x, grad)
    assert torch.equal(y_stock, y_quant)
    for name in g_stock:
        assert torch.equal(g_stock[name], g_quant[name]), name


def _reference(x, w, b, grad, fmts):
    """Y = q(X) q(W)^T along in; dX = q(dY) q(W) along out; dW = q(dY)^T q(X) along tokens; each
    GEMM on the formats' operands with their per-tensor scales applied to the FP32 product."""
    f = fmts
    y = gemm(lambda a, c: torch.matmul(a, c.t()), operand(x, f["fprop.input"], -1),
             operand(w, f["fprop.weight"], 1)) + b
    dx = gemm(torch.matmul, operand(grad, f["dgrad.grad_output"], -1), operand(w, f["dgrad.weight"], 0))
    dy2, x2 = grad.reshape(-1, OUT), x.reshape(-1, IN)
    dw = gemm(lambda a, c: a.t().matmul(c), operand(dy2, f["wgrad.grad_output"], 0), operand(x2, f["wgrad.input"], 0))
    return y, {"input": dx, "weight": dw, "bias": dy2.sum(0)}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt_name", [BLOCK_FORMAT, TENSOR_FORMAT])
def test_each_gemm_equals_formats_reference(parallel, kind, fmt_name):
    layer = _build(kind)
    fmts = linear_formats(fmt_name)
    # Distinct formats per operand would hide a swapped operand only if they coincided; use the
    # uniform format and, for dgrad, a different one, so a mix-up of fprop/dgrad shows.
    fmts["dgrad.weight"] = linear_formats(TENSOR_FORMAT if fmt_name == BLOCK_FORMAT else BLOCK_FORMAT)["dgrad.weight"]
    layer.configure_quant(LinearQuant.from_formats(fmts), SITE)
    x, grad = _data(torch.float32, seed=1)
    y, grads = _run(layer, x, grad)
    y_ref, grads_ref = _reference(x, layer.weight.detach(), layer.bias.detach(), grad, fmts)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    for name, ref in grads_ref.items():
        torch.testing.assert_close(grads[name], ref, rtol=0, atol=0, msg=name)
    # The quantization is real: the unquantized GEMMs give something else.
    assert not torch.equal(y, torch.matmul(x, layer.weight.detach().t()) + layer.bias.detach())


def test_fprop_and_dgrad_quantize_the_weight_along_different_axes(parallel):
    from megatron.quant.formats import get_format

    fmt = get_format(BLOCK_FORMAT)
    w = torch.randn(OUT, IN, generator=torch.Generator().manual_seed(3))
    assert not torch.equal(fmt.quantize(w, axis=1), fmt.quantize(w, axis=0))


@pytest.mark.parametrize("fmt_name,activation_quantizations,weight_quantizations", [
    # one scale per tensor: fprop's X and dgrad's dY are reused by wgrad, fprop's W by dgrad
    (TENSOR_FORMAT, 2, 1),
    # blocks along another axis: wgrad quantizes dY and X again, dgrad quantizes W again
    (BLOCK_FORMAT, 4, 2),
])
def test_no_quantization_beyond_what_the_axes_require(parallel, fmt_name, activation_quantizations,
                                                      weight_quantizations):
    layer = _build("column", bias=False)
    counting = CountingFormat(linear_formats(fmt_name)["fprop.input"], layer.weight.shape)
    layer.configure_quant(LinearQuant.from_formats({k: counting for k in linear_formats(None)}), SITE)
    x, grad = _data(torch.float32, seed=7)
    y, grads = _run(layer, x, grad)
    assert (counting.calls - counting.weight_calls, counting.weight_calls) == (activation_quantizations,
                                                                           weight_quantizations)
    y_ref, grads_ref = _reference(x, layer.weight.detach(), 0, grad, linear_formats(fmt_name))
    torch.testing.assert_close(grads["weight"], grads_ref["weight"], rtol=0, atol=0)


def test_weight_quantized_once_per_optimizer_step(parallel):
    layer = _build("column", bias=False)
    counting = CountingFormat(linear_formats(BLOCK_FORMAT)["fprop.weight"], layer.weight.shape)
    layer.configure_quant(LinearQuant.from_formats({k: counting for k in linear_formats(None)}), SITE)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    x, grad = _data(torch.float32, seed=2)
    for _ in range(3):  # three micro-batches: fprop and dgrad weights quantized once each
        _run(layer, x, grad)
    assert counting.weight_calls == 2
    optimizer.step()  # in-place update bumps the version counter
    y, _ = _run(layer, x, grad)
    assert counting.weight_calls == 4
    w_q = counting.fmt.quantize(layer.weight.detach(), axis=1)
    torch.testing.assert_close(y, torch.matmul(counting.fmt.quantize(x, axis=-1), w_q.t()), rtol=0, atol=0)
    with torch.no_grad():  # writes through .data bypass the counter: explicit invalidation
        layer.weight.data.mul_(0.5)
    _run(layer, x, grad)
    assert counting.weight_calls == 4
    invalidate_quantized_weights(layer)
    _run(layer, x, grad)
    assert counting.weight_calls == 6


def test_gradient_accumulation_into_main_grad(parallel):
    layer = _build("column", bias=False, gradient_accumulation_fusion=False)
    layer.configure_quant(LinearQuant.from_formats(linear_formats(BLOCK_FORMAT)), SITE)
    x, grad = _data(torch.float32, seed=4)
    _, plain = _run(layer, x, grad)
    layer.weight.grad = None
    layer.weight.main_grad = torch.ones_like(layer.weight)
    layer.gradient_accumulation_fusion = True  # megatron-core's flag, set after build (no apex here)
    _run(layer, x, grad)
    torch.testing.assert_close(layer.weight.main_grad, plain["weight"] + 1)


def test_a_scaled_wgrad_accumulates_into_main_grad_unrounded(parallel):
    """A per-tensor-scaled wgrad GEMM adds its FP32 result into the FP32 main_grad, as TE's fused wgrad
    GEMM and apex's kernel do: never rounded to bf16 on the way (which had cost the scaled recipes a
    rounding the bf16 baseline's kernel does not make)."""
    from megatron.quant.formats import get_format

    layer = _build("column", dtype=torch.bfloat16, bias=False, gradient_accumulation_fusion=False)
    layer.configure_quant(LinearQuant.from_formats(linear_formats(TENSOR_FORMAT)), SITE)  # per-tensor scales
    x, grad = _data(torch.bfloat16, seed=5)
    layer.weight.main_grad = torch.zeros(layer.weight.shape, dtype=torch.float32)
    layer.gradient_accumulation_fusion = True
    _run(layer, x, grad)
    fmt = get_format(TENSOR_FORMAT)
    dy, dy_scale = fmt.quantize_for_gemm(grad.reshape(-1, OUT), axis=0)
    xq, x_scale = fmt.quantize_for_gemm(x.reshape(-1, IN), axis=0)
    exact = (dy.double().t() @ xq.double()) * (dy_scale.double() * x_scale.double())  # float64 oracle
    main_grad = layer.weight.main_grad
    torch.testing.assert_close(main_grad.double(), exact, rtol=1e-6, atol=1e-9)
    assert not torch.equal(main_grad, main_grad.bfloat16().float())  # FP32 digits kept


def test_frozen_weight_gets_no_grad_and_same_dgrad(parallel):
    layer = _build("column", bias=False)
    layer.configure_quant(LinearQuant.from_formats(linear_formats(BLOCK_FORMAT)), SITE)
    x, grad = _data(torch.float32, seed=5)
    _, trained = _run(layer, x, grad)
    layer.weight.requires_grad_(False)
    layer.weight.grad = None
    _, frozen = _run(layer, x, grad)
    assert frozen["weight"] is None
    torch.testing.assert_close(frozen["input"], trained["input"], rtol=0, atol=0)


def test_capture_offers_quantized_operands_and_changes_nothing(parallel, monkeypatch):
    layer = _build("row")
    fmts = linear_formats(BLOCK_FORMAT)
    layer.configure_quant(LinearQuant.from_formats(fmts), SITE)
    x, grad = _data(torch.float32, seed=6)
    y_off, g_off = _run(layer, x, grad)
    layer.weight.grad = layer.bias.grad = None
    saver = RecordingSaver().install(monkeypatch)
    y_on, g_on = _run(layer, x, grad)
    assert torch.equal(y_off, y_on) and all(torch.equal(g_off[k], g_on[k]) for k in g_off)
    assert saver.names() == [("forward", "pre", ("input", "weight")), ("forward", "post", ("output",)),
                             ("backward", "pre", ("grad_output", "weight")),
                             ("backward", "post", ("grad_input", "grad_weight"))]
    fwd_pre = saver.calls[0][3]
    assert fwd_pre["weight"].axis == 1 and saver.calls[2][3]["weight"].axis == 0
    torch.testing.assert_close(fwd_pre["input"].quantized, q(x, fmts["fprop.input"], -1), rtol=0, atol=0)
    assert torch.equal(saver.calls[1][3]["output"], y_on)
    assert torch.equal(saver.calls[3][3]["grad_input"], g_on["input"])


def test_unconfigured_layer_is_stock(parallel):
    stock, quant = _build("column", quant=False), _build("column")
    quant.load_state_dict(stock.state_dict())
    x, grad = _data(torch.float32)
    assert torch.equal(_run(stock, x, grad)[0], _run(quant, x, grad)[0])


def test_cpu_offloading_is_refused_for_a_quantized_layer(parallel):
    layer = _build("column", cpu_offloading=True, cpu_offloading_num_layers=1)
    with pytest.raises(ValueError, match="test.linear: cpu_offloading is not supported"):
        layer.configure_quant(LinearQuant.from_formats(linear_formats("mxfp8")), SITE)


def test_compiled_quantization_equals_eager(parallel):
    from megatron.quant.layers.module_quant import format_builder
    from megatron.quant.recipes.recipe import QuantRecipe

    x, grad = _data(torch.float32, seed=8)
    results = []
    for compile in (False, True):
        layer = _build("row", bias=False)
        torch.manual_seed(0)
        torch.nn.init.normal_(layer.weight)
        recipe = QuantRecipe.uniform("hifp8", compile=compile)
        formats = recipe.resolve("fc2", 0, 1, build=format_builder(recipe))
        layer.configure_quant(LinearQuant.from_formats(formats), SITE)
        results.append(_run(layer, x, grad))
    (y_eager, g_eager), (y_compiled, g_compiled) = results
    assert type(layer.quant["fprop.input"].fmt).__name__ == "CompiledFormat"
    assert torch.equal(y_eager, y_compiled)
    assert all(torch.equal(g_eager[k], g_compiled[k]) for k in g_eager)


def _on_fp4_times_e4m3_grid(values: torch.Tensor) -> torch.Tensor:
    """Per 16-element block (last axis): is there one E4M3 scale s with every value / s on the
    E2M1 grid? Brute force over every positive E4M3 value (ml_dtypes' table, independent of ours)."""
    import ml_dtypes
    import numpy as np

    codes = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    scales = torch.tensor(np.unique(codes[np.isfinite(codes) & (codes > 0)]))
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    blocks = values.float().reshape(-1, 1, 16).abs()
    ratio = blocks / scales.view(1, -1, 1)
    on_grid = (ratio.unsqueeze(-1) == grid).any(-1).all(-1)  # [blocks, scales]
    return on_grid.any(-1)


@pytest.mark.parametrize("fmt_name", ["fp8_e4m3", "nvfp4"])
def test_bf16_operands_are_on_the_grid_and_scales_go_to_the_fp32_product(parallel, monkeypatch, fmt_name):
    """What the GEMM multiplies is what the hardware decodes: grid values (times block scales);
    the per-tensor scale multiplies the FP32 product. Before, operands were element x scale
    rounded to bf16: ~89 % of fp8_e4m3 and ~88 % of nvfp4 values off the grid."""
    import ml_dtypes

    from megatron.quant.layers import linear_function

    layer = _build("column", torch.bfloat16, bias=False)
    fmts = linear_formats(fmt_name)
    layer.configure_quant(LinearQuant.from_formats(fmts), SITE)
    seen = []
    original = linear_function.scaled_product
    monkeypatch.setattr(linear_function, "scaled_product",
                        lambda p, a, b, accumulator=None: seen.append((a, b)) or original(p, a, b, None, accumulator))
    x, grad = _data(torch.bfloat16, seed=9)
    y, grads = _run(layer, x, grad)
    operands = [t for pair in seen for t in pair]
    assert len(operands) == 6 and all(o.tensor_scale is not None for o in operands)
    block_axes = [-1, 1, -1, 0, 0, 0]  # fprop X, W; dgrad dY, W; wgrad dY, X (2-D views)
    for o, axis in zip(operands, block_axes):
        values = o.values.float().reshape(-1, o.values.shape[-1])
        values = values if axis in (-1, 1) else values.t()
        if fmt_name == "fp8_e4m3":
            on_grid = values.numpy().astype(ml_dtypes.float8_e4m3fn).astype("float32") == values.numpy()
            assert on_grid.all()
        else:
            assert _on_fp4_times_e4m3_grid(values).all()
    y_ref, grads_ref = _reference(x, layer.weight.detach(), 0, grad, fmts)
    assert torch.equal(y, y_ref) and torch.equal(grads["input"], grads_ref["input"])
    assert torch.equal(grads["weight"], grads_ref["weight"])


def test_hadamard_on_both_wgrad_operands_cancels_in_the_gemm(parallel):
    """TE's NVFP4 recipe: the random Hadamard transform on both wgrad operands along tokens; the
    GEMM multiplies the transformed quantized operands and the transform cancels."""
    from megatron.quant.formats import get_format

    layer = _build("column", bias=False)
    fmts = linear_formats("nvfp4")
    fmts["wgrad.grad_output"] = fmts["wgrad.input"] = get_format("nvfp4", hadamard=16)
    layer.configure_quant(LinearQuant.from_formats(fmts), SITE)
    x, grad = _data(torch.float32, seed=10)
    _, grads = _run(layer, x, grad)
    _, reference = _reference(x, layer.weight.detach(), 0, grad, fmts)
    assert torch.equal(grads["weight"], reference["weight"])
    exact = grad.reshape(-1, OUT).t() @ x.reshape(-1, IN)
    plain = linear_formats("nvfp4")
    dy_q = plain["wgrad.grad_output"].quantize(grad.reshape(-1, OUT), axis=0)
    untransformed = dy_q.t() @ plain["wgrad.input"].quantize(x.reshape(-1, IN), axis=0)
    error = lambda w: float((w - exact).norm() / exact.norm())  # noqa: E731
    assert error(grads["weight"]) < 0.2 and error(untransformed) < 0.2  # both quantized, both close


def test_a_transform_on_one_operand_of_a_gemm_is_refused():
    from megatron.quant.formats import get_format

    fmts = linear_formats("nvfp4")
    fmts["wgrad.input"] = get_format("nvfp4", hadamard=16)
    with pytest.raises(ValueError, match="wgrad: wgrad.grad_output has no transform but wgrad.input has hadamard=16"):
        LinearQuant.from_formats(fmts)


@pytest.mark.parametrize("options,shared", [({"block_shape": (16, 16)}, True), ({}, False),
                                            ({"block_shape": (16, 16), "rounding": "stochastic"}, False)])
def test_square_tiles_quantize_a_weight_once_for_both_gemms(options, shared):
    """2-D tiles (TE's NVFP4 weights) scale the same elements whatever the GEMM's axis: fprop and
    dgrad share one quantization of the weight (round to nearest), which equals each axis's own."""
    from megatron.quant.formats import get_format
    from megatron.quant.layers.operand import same_quantization
    from megatron.quant.layers.weight_cache import QuantizedWeightCache
    from megatron.quant.recipes.operands import OperandSpec

    fmt = get_format("nvfp4", **options)
    fprop, dgrad = OperandSpec(fmt, -1, "fprop_weight"), OperandSpec(fmt, 0, "dgrad_weight")
    assert same_quantization(fprop, dgrad) == shared
    weight = torch.randn(48, 64, generator=torch.Generator().manual_seed(3))
    cache = QuantizedWeightCache()
    first, second = cache.get(weight, fprop, None, None), cache.get(weight, dgrad, None, None)
    assert (first is second) == shared
    if shared:
        assert torch.equal(second.values, fmt.quantize_for_gemm(weight, 0)[0])
        assert torch.equal(second.values, fmt.quantize_for_gemm(weight, -1)[0])
    assert not same_quantization(OperandSpec(get_format("nvfp4", hadamard=16), -1, "a"),
                                 OperandSpec(get_format("nvfp4", hadamard=16), 0, "b"))
