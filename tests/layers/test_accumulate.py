"""A linear layer whose GEMMs add their products as a Hopper FP8 tensor core does (the recipe's
``accumulate``: fprop fast, dgrad and wgrad promoted, as Transformer Engine runs them) against
``mmaemu``'s accumulator and ``torch._scaled_mm``'s epilogue on the same FP8 operands, bit for bit;
exact accumulation stays the layer's default, and formats a tensor core does not take are refused."""
import warnings

import pytest
import torch

from megatron.quant.formats import get_format
from megatron.quant.layers.linear import QuantColumnParallelLinear
from megatron.quant.layers.linear_function import LinearQuant
from megatron.quant.recipes.operands import LINEAR_OPERANDS
from megatron.quant.tensor_saver import CaptureSite
from tests.layers._helpers import RecordingSaver, operand, transformer_config

mmaemu = pytest.importorskip("mmaemu", reason="the oracle: pip install mmaemu (the test extra)")

IN, OUT, TOKENS = 80, 48, 24  # K of 80 and 24: ragged against 32-product blocks and 128-long promotion
SITE = CaptureSite("linear", "linear", 0, "test.linear", "fc1", "test")
TE_HOPPER = (("fprop", "fast"), ("dgrad", "promoted"), ("wgrad", "promoted"))
DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def formats():
    e4m3, e5m2 = get_format("fp8_e4m3", nonfinite="te"), get_format("fp8_e5m2", nonfinite="te")
    return {key: e5m2 if key.endswith("grad_output") else e4m3 for key in LINEAR_OPERANDS}


def oracle(a, b, fast: bool):
    """mmaemu's C = a b^T of two (values, scale) operands (a [M, K], b [N, K]), rounded to float32."""
    from mmaemu.model.epilogue import apply

    (av, sa), (bv, sb) = a, b
    kinds = [next(k for k, d in DTYPES.items() if torch.equal(v.to(d).float(), v.float())) for v in (av, bv)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        acc = mmaemu.accumulate(av.float().to(DTYPES[kinds[0]]), bv.float().to(DTYPES[kinds[1]]),
                                use_fast_accum=fast, splitk=1, backend="reference")
    return apply(acc, sa.reshape(1), sb.reshape(1), out_dtype=torch.float32)


def test_linear_gemms_accumulate_as_the_tensor_core(parallel):
    layer = QuantColumnParallelLinear(IN, OUT, config=transformer_config(), init_method=torch.nn.init.normal_,
                                      bias=False, gather_output=False)
    fmts = formats()
    layer.configure_quant(LinearQuant.from_formats(fmts, accumulate=TE_HOPPER), SITE)
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(TOKENS, 1, IN, generator=g) * torch.exp(2 * torch.randn(TOKENS, 1, IN, generator=g)))
    grad = torch.randn(TOKENS, 1, OUT, generator=g)
    x.requires_grad_()
    y, _ = layer(x)
    y.backward(grad)
    w, x2, dy = layer.weight.detach(), x.detach().reshape(-1, IN), grad.reshape(-1, OUT)
    expected_y = oracle(operand(x2, fmts["fprop.input"], -1), operand(w, fmts["fprop.weight"], 1), fast=True)
    dy_q, w_q = operand(dy, fmts["dgrad.grad_output"], -1), operand(w, fmts["dgrad.weight"], 0)
    expected_dx = oracle(dy_q, (w_q[0].t(), w_q[1]), fast=False)
    dy_w, x_w = operand(dy, fmts["wgrad.grad_output"], 0), operand(x2, fmts["wgrad.input"], 0)
    expected_dw = oracle((dy_w[0].t(), dy_w[1]), (x_w[0].t(), x_w[1]), fast=False)
    assert torch.equal(y.reshape(-1, OUT), expected_y)
    assert torch.equal(x.grad.reshape(-1, IN), expected_dx)
    assert torch.equal(layer.weight.grad, expected_dw)
    exact = LinearQuant.from_formats(fmts)  # the default: exact FP32 sums, another result
    layer.configure_quant(exact, SITE)
    assert not torch.equal(layer(x.detach())[0], y.detach())


def test_capture_changes_nothing_under_hopper_accumulation(parallel, monkeypatch):
    """Capture takes its own path through the layer's GEMMs (the quantized operands offered): the
    accumulator there is the same, and the captured output is the layer's."""
    layer = QuantColumnParallelLinear(IN, OUT, config=transformer_config(), init_method=torch.nn.init.normal_,
                                      bias=False, gather_output=False)
    layer.configure_quant(LinearQuant.from_formats(formats(), accumulate=TE_HOPPER), SITE)
    x = torch.randn(TOKENS, 1, IN, generator=torch.Generator().manual_seed(3)).requires_grad_()
    grad = torch.randn(TOKENS, 1, OUT, generator=torch.Generator().manual_seed(4))
    y_off, _ = layer(x)
    y_off.backward(grad)
    dx_off, dw_off = x.grad, layer.weight.grad
    x.grad = layer.weight.grad = None
    saver = RecordingSaver().install(monkeypatch)
    y_on, _ = layer(x)
    y_on.backward(grad)
    assert torch.equal(y_off, y_on) and torch.equal(dx_off, x.grad) and torch.equal(dw_off, layer.weight.grad)
    assert torch.equal(saver.calls[1][3]["output"], y_on)


def test_accumulation_of_formats_no_tensor_core_takes_is_refused():
    fmts = {key: get_format("mxfp8") for key in LINEAR_OPERANDS}
    with pytest.raises(ValueError, match=r"accumulate.fprop: 'fast' models an FP8 tensor core.*mxfp8_e4m3"):
        LinearQuant.from_formats(fmts, accumulate=TE_HOPPER)
    assert LinearQuant.from_formats({key: None for key in LINEAR_OPERANDS}, accumulate=TE_HOPPER)


def test_a_gemm_with_an_unquantized_operand_accumulates_exactly():
    """No FP8 GEMM runs there: TE runs it in high precision (FakeQuant, DisableFP8GEMM, a BF16 operand)."""
    fmts = {**formats(), "fprop.weight": None}
    quant = LinearQuant.from_formats(fmts, accumulate=TE_HOPPER)
    assert quant.accumulator("fprop") is None and quant.accumulator("dgrad") is not None


def test_a_cpu_run_with_the_hopper_model_says_so_and_how_to_sum_exactly():
    from megatron.quant.layers.scaled_gemm import cpu_accumulation_notice
    from megatron.quant.recipes.recipe import QuantRecipe

    te = QuantRecipe.from_dict({"format": "te-fp8-current"}).accumulation()
    notice = cpu_accumulation_notice([te, {"fprop": "exact"}], cuda=False)
    assert notice.startswith("notice: the FP8 GEMMs add their products as a Hopper tensor core does (dgrad promoted, "
                             "fprop fast, wgrad promoted;") and notice.endswith("CUSTOM_QUANT_ACCUMULATE=exact")
    assert cpu_accumulation_notice([te], cuda=True) is None  # a GPU runs the tensor core or its kernel
    exact = QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": "te-fp8-current", "CUSTOM_QUANT_ACCUMULATE": "exact"})
    assert cpu_accumulation_notice([exact.accumulation()], cuda=False) is None


def test_an_empty_gemm_under_the_hopper_model_is_zeros():
    """An expert routed no tokens: its fprop has M = 0 and its wgrad K = 0 (a sum of nothing, +0)."""
    from megatron.quant.layers.scaled_gemm import HopperAccumulator

    acc = HopperAccumulator(False, ("e5m2", "e4m3"))
    for a, b in ((torch.ones(0, 2, 8), torch.ones(8, 5)), (torch.ones(3, 0), torch.ones(0, 5))):
        out = acc(a, b)
        assert out.shape == (*a.shape[:-1], 5) and out.dtype == torch.float32 and not out.any()
