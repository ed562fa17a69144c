"""The quantized linear layer and attention on the test device: every GEMM operand is the format's
quantization of the high-precision operand, computed on the same device (the CPU suite checks the
formats against oracles, tests/device/test_formats_device.py carries that to the GPU)."""
import pytest
import torch

from megatron.quant.layers.attention import AttentionQuant, QuantDotProductAttention
from megatron.quant.layers.linear import QuantColumnParallelLinear
from megatron.quant.layers.linear_function import LinearQuant
from megatron.quant.tensor_saver import CaptureSite
from tests.layers._helpers import attention_formats, gemm, linear_formats, operand, transformer_config

pytestmark = pytest.mark.device

IN, OUT, SEQ, BATCH = 64, 96, 64, 2


@pytest.mark.parametrize("fmt_name", ["mxfp8", "fp8_e4m3", "nvfp4", "hifp8"])
def test_linear_gemms_on_device(parallel, device, fmt_name):
    cfg = transformer_config()
    layer = QuantColumnParallelLinear(IN, OUT, config=cfg, init_method=torch.nn.init.normal_, bias=False,
                                      gather_output=False).to(device)
    fmts = linear_formats(fmt_name)
    layer.configure_quant(LinearQuant.from_formats(fmts),
                          CaptureSite("linear", "linear", 0, "dev.linear", "fc1", "test"))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SEQ, BATCH, IN, generator=g).to(device).requires_grad_()
    grad = torch.randn(SEQ, BATCH, OUT, generator=g).to(device)
    y, _ = layer(x)
    y.backward(grad)
    w = layer.weight.detach()
    xd = x.detach()
    t = lambda a, b: torch.matmul(a, b.t())  # noqa: E731
    assert torch.equal(y.detach(), gemm(t, operand(xd, fmts["fprop.input"], -1), operand(w, fmts["fprop.weight"], 1)))
    assert torch.equal(x.grad, gemm(torch.matmul, operand(grad, fmts["dgrad.grad_output"], -1),
                                    operand(w, fmts["dgrad.weight"], 0)))
    dy2, x2 = grad.reshape(-1, OUT), xd.reshape(-1, IN)
    dw = gemm(lambda a, b: a.t().matmul(b), operand(dy2, fmts["wgrad.grad_output"], 0),
              operand(x2, fmts["wgrad.input"], 0))
    assert torch.equal(layer.weight.grad, dw)


@pytest.mark.parametrize("fmt_name", ["mxfp8", "hifp8"])
def test_attention_runs_and_matches_unquantized_shape_on_device(parallel, device, fmt_name):
    from megatron.core.transformer.enums import AttnMaskType

    heads, groups, head_dim = 4, 2, 64
    cfg = transformer_config(hidden_size=heads * head_dim, num_attention_heads=heads, num_query_groups=groups)
    attn = QuantDotProductAttention(cfg, layer_number=1, attn_mask_type=AttnMaskType.causal,
                                    attention_type="self").to(device)
    g = torch.Generator().manual_seed(2)
    qkv = [torch.randn(SEQ, BATCH, h, head_dim, generator=g).to(device).requires_grad_()
           for h in (heads, groups, groups)]
    outputs = {}
    for name in (None, fmt_name):
        attn.configure_quant(AttentionQuant.from_formats(attention_formats(name)),
                             CaptureSite("attention", "FA", 0, "dev.core_attention", "core_attention", "test"))
        out = attn(*qkv, attention_mask=None)
        out.backward(torch.ones_like(out))
        outputs[name] = (out.detach(), [t.grad.clone() for t in qkv])
        for t in qkv:
            t.grad = None
    (ref, ref_grads), (quant, quant_grads) = outputs[None], outputs[fmt_name]
    assert quant.device.type == device.type and quant.isfinite().all()
    # Quantization error is small but present: the formats really ran on this device.
    assert 0 < (quant - ref).norm() / ref.norm() < 0.1
    for a, b in zip(ref_grads, quant_grads):
        assert b.isfinite().all() and 0 < (a - b).norm() / a.norm() < 0.2
