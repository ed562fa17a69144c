"""QuantDotProductAttention against megatron-core's stock attention and an independent
reference (formats on the stated axes, plain matmuls, torch softmax); fused vs unfused."""
import pytest
import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType

from megatron.quant.layers.attention import AttentionQuant, QuantDotProductAttention
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.tensor_saver import CaptureSite
from tests.layers._helpers import (
    BLOCK_FORMAT,
    TENSOR_FORMAT,
    CountingFormat,
    RecordingSaver,
    attention_formats,
    q,
    transformer_config,
)

SEQ, BATCH, HEADS, GROUPS, HEAD_DIM = 64, 2, 4, 2, 64  # head_dim 64: softmax scale 1/8 is exact
SITE = CaptureSite("attention", "FA", 0, "test.core_attention", "core_attention", "test")


def _config(dtype=torch.float32, **overrides):
    return transformer_config(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, num_query_groups=GROUPS,
                              params_dtype=dtype, bf16=dtype == torch.bfloat16, **overrides)


def _attention(cls, dtype=torch.float32, **overrides):
    return cls(_config(dtype, **overrides), layer_number=1, attn_mask_type=AttnMaskType.causal,
               attention_type="self")


def _inputs(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = [torch.randn(SEQ, BATCH, h, HEAD_DIM, generator=g).to(dtype) for h in (HEADS, GROUPS, GROUPS)]
    grad = torch.randn(SEQ, BATCH, HEADS * HEAD_DIM, generator=g).to(dtype)
    return qkv, grad


def _run(module, qkv, grad):
    leaves = [t.clone().requires_grad_() for t in qkv]
    out = module(*leaves, attention_mask=None)
    out.backward(grad)
    return out.detach(), [t.grad for t in leaves]


def _passthrough(dtype, allow_fused, **overrides):
    module = _attention(QuantDotProductAttention, dtype, **overrides)
    formats = QuantRecipe.uniform("bf16").resolve("core_attention", 0, 1)
    module.configure_quant(AttentionQuant.from_formats(formats), SITE, allow_fused=allow_fused)
    return module


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_passthrough_without_sdpa_is_bit_identical_to_stock(parallel, dtype):
    stock, quant = _attention(DotProductAttention, dtype), _passthrough(dtype, allow_fused=False)
    assert quant.path() == "unfused"
    qkv, grad = _inputs(dtype)
    out_s, grads_s = _run(stock, qkv, grad)
    out_q, grads_q = _run(quant, qkv, grad)
    assert torch.equal(out_s, out_q)
    assert all(torch.equal(a, b) for a, b in zip(grads_s, grads_q))


# SDPA against megatron-core's unfused path: fp32 differs by the summation order only; in bf16 the
# unfused path rounds the scores and probabilities to bf16 between its GEMMs (SDPA keeps fp32).
SDPA_TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unquantized_attention_runs_sdpa_and_equals_the_unfused_path(parallel, monkeypatch, dtype):
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *args, **kwargs: calls.append(kwargs) or sdpa(*args, **kwargs))
    fast, exact = _passthrough(dtype, allow_fused=True), _passthrough(dtype, allow_fused=False)
    assert fast.path() == "sdpa"
    qkv, grad = _inputs(dtype, seed=7)
    (out_f, grads_f), (out_e, grads_e) = _run(fast, qkv, grad), _run(exact, qkv, grad)
    assert len(calls) == 1 and calls[0]["is_causal"] and calls[0]["enable_gqa"]
    torch.testing.assert_close(out_f, out_e, **SDPA_TOLERANCE[dtype])
    for name, a, b in zip(("query", "key", "value"), grads_f, grads_e):
        torch.testing.assert_close(a, b, **SDPA_TOLERANCE[dtype], msg=name)


@pytest.mark.parametrize("overrides", [dict(attention_dropout=0.1), dict(window_size=(8, 0))])
def test_unquantized_attention_keeps_the_exact_path_where_sdpa_differs(parallel, overrides):
    module = _passthrough(torch.float32, allow_fused=True, **overrides)
    assert module.path() == "unfused"  # megatron's dropout RNG, a sliding window
    if "attention_dropout" in overrides:
        module.eval()
        assert module.path() == "sdpa"


def _reference(qkv, grad, f, scale):
    """Independent attention with every GEMM operand quantized on its reduction axis."""
    rep = HEADS // GROUPS
    Q = qkv[0].permute(1, 2, 0, 3)
    K, V = (t.permute(1, 2, 0, 3).repeat_interleave(rep, dim=1) for t in qkv[1:])
    S = (torch.matmul(q(Q, f["qk.query"], -1), q(K, f["qk.key"], -1).transpose(-1, -2)) * scale
         ).detach().requires_grad_()
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)
    P = torch.softmax(S.masked_fill(causal, float("-inf")), dim=-1)
    O = torch.matmul(q(P.detach(), f["pv.probs"], -1), q(V, f["pv.value"], -2))
    dO = grad.view(SEQ, BATCH, HEADS, HEAD_DIM).permute(1, 2, 0, 3)
    dP = torch.matmul(q(dO, f["dp.grad_output"], -1), q(V, f["dp.value"], -1).transpose(-1, -2))
    dV = torch.matmul(q(P.detach(), f["dv.probs"], -2).transpose(-1, -2), q(dO, f["dv.grad_output"], -2))
    (dS,) = torch.autograd.grad(P, S, dP)  # torch's own softmax backward
    dQ = torch.matmul(q(dS, f["dq.grad_scores"], -1), q(K, f["dq.key"], -2)) * scale
    dK = torch.matmul(q(dS, f["dk.grad_scores"], -2).transpose(-1, -2), q(Q, f["dk.query"], -2)) * scale

    def sum_groups(t):  # GQA: the repeated heads' gradients add up
        return t.reshape(BATCH, GROUPS, rep, SEQ, HEAD_DIM).sum(2)

    to_sbhd = lambda t: t.permute(2, 0, 1, 3)  # noqa: E731
    out = to_sbhd(O).reshape(SEQ, BATCH, HEADS * HEAD_DIM)
    return out, [to_sbhd(dQ), to_sbhd(sum_groups(dK)), to_sbhd(sum_groups(dV))]


@pytest.mark.parametrize("fmt_name", [BLOCK_FORMAT, TENSOR_FORMAT])
def test_every_gemm_equals_formats_reference(parallel, fmt_name):
    module = _attention(QuantDotProductAttention)
    formats = attention_formats(fmt_name)
    module.configure_quant(AttentionQuant.from_formats(formats), SITE)
    assert not module.uses_fused_path(*_inputs()[0][:2], None)
    qkv, grad = _inputs(seed=1)
    out, grads = _run(module, qkv, grad)
    out_ref, grads_ref = _reference(qkv, grad, formats, module.softmax_scale)
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-6)
    for name, g, ref in zip(("query", "key", "value"), grads, grads_ref):
        torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-5, msg=name)
    unquantized, _ = _reference(qkv, grad, attention_formats(None), module.softmax_scale)
    assert (out - unquantized).abs().max() > 1e-3  # the quantization is real


@pytest.mark.parametrize("fmt_name,options", [(BLOCK_FORMAT, {}), ("hifp8", {}),
                                              (BLOCK_FORMAT, {"rounding": "stochastic", "seed": 1})])
def test_fused_and_unfused_paths_agree(parallel, fmt_name, options):
    formats = QuantRecipe.uniform(fmt_name, scope=["attention.qk"], **options).resolve("core_attention", 0, 1)
    formats["pv.value"] = attention_formats(fmt_name, **options)["pv.value"]
    modules = []
    for allow_fused in (True, False):
        module = _attention(QuantDotProductAttention)
        module.configure_quant(AttentionQuant.from_formats(formats), SITE, allow_fused=allow_fused)
        modules.append(module)
    qkv, grad = _inputs(seed=2)
    assert modules[0].uses_fused_path(qkv[0], qkv[1], None) and not modules[1].uses_fused_path(qkv[0], qkv[1], None)
    (out_f, grads_f), (out_u, grads_u) = (_run(m, qkv, grad) for m in modules)
    torch.testing.assert_close(out_f, out_u, rtol=1e-5, atol=1e-6)
    # The fused backward recomputes the unfused path on the same quantized Q/K/V: identical gradients.
    assert all(torch.equal(a, b) for a, b in zip(grads_f, grads_u))


def _stock_on_quantized_inputs(module, qkv, mask):
    """megatron-core's DotProductAttention (no quantization) on Q/K/V quantized as the recipe says."""
    stock = DotProductAttention(module.config, layer_number=1, attn_mask_type=module.attn_mask_type,
                                attention_type="self")
    specs = module.quant.inputs.values()
    quantized = [spec.fmt.quantize(t, axis=spec.axis) for t, spec in zip(qkv, specs)]
    return stock(*quantized, attention_mask=mask)


@pytest.mark.parametrize("case", ["sliding_window", "fully_masked_rows"])
def test_masks_sdpa_cannot_reproduce_take_the_exact_path(parallel, case):
    # Before: SDPA ran causal-only while the backward recomputed with the window (relative
    # difference 0.74), and fully masked rows came out differently (SDPA: NaN or zeros;
    # megatron-core: a uniform row).
    formats = QuantRecipe.uniform(BLOCK_FORMAT, scope=["attention.qk"]).resolve("core_attention", 0, 1)
    formats["pv.value"] = attention_formats(BLOCK_FORMAT)["pv.value"]
    mask = None
    if case == "sliding_window":
        module = _attention(QuantDotProductAttention, window_size=(8, 0))
    else:
        module = QuantDotProductAttention(_config(), layer_number=1, attn_mask_type=AttnMaskType.padding,
                                          attention_type="self")
        mask = torch.zeros(BATCH, 1, SEQ, SEQ, dtype=torch.bool)
        mask[..., :4, :] = True  # megatron masks True: the first four query rows see nothing
        mask[..., 4:, :] = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)[4:]
    module.configure_quant(AttentionQuant.from_formats(formats), SITE)
    qkv, grad = _inputs(seed=6)
    assert not module.uses_fused_path(qkv[0], qkv[1], mask)
    leaves = [t.clone().requires_grad_() for t in qkv]
    out = module(*leaves, attention_mask=mask)
    torch.testing.assert_close(out, _stock_on_quantized_inputs(module, qkv, mask), rtol=1e-5, atol=1e-6)
    out.backward(grad)
    assert all(torch.isfinite(t.grad).all() for t in leaves)


@pytest.mark.parametrize("fmt_name,expected", [
    (TENSOR_FORMAT, 4 + 2),   # Q, K, P, V; each product's gradient once, saved copies reused
    (BLOCK_FORMAT, 4 + 8),    # blocks along other axes: every backward operand again
])
def test_no_quantization_beyond_what_the_axes_require(parallel, fmt_name, expected):
    counting = CountingFormat(attention_formats(fmt_name)["qk.query"])
    module = _attention(QuantDotProductAttention)
    module.configure_quant(AttentionQuant.from_formats({k: counting for k in attention_formats(None)}), SITE)
    qkv, grad = _inputs(seed=5)
    out, grads = _run(module, qkv, grad)
    assert counting.calls == expected
    out_ref, grads_ref = _reference(qkv, grad, attention_formats(fmt_name), module.softmax_scale)
    torch.testing.assert_close(grads[1], grads_ref[1], rtol=1e-4, atol=1e-5)


def test_quantized_probabilities_or_per_tensor_scales_disable_the_fused_path(parallel):
    qkv, _ = _inputs()
    module = _attention(QuantDotProductAttention)
    module.configure_quant(AttentionQuant.from_formats(attention_formats(BLOCK_FORMAT)), SITE)
    assert not module.uses_fused_path(qkv[0], qkv[1], None)
    tensor_scaled = QuantRecipe.uniform(TENSOR_FORMAT, scope=["attention.qk"])
    module.configure_quant(AttentionQuant.from_formats(tensor_scaled.resolve("core_attention", 0, 1)), SITE)
    assert not module.uses_fused_path(qkv[0], qkv[1], None)


def test_dropout_runs_unfused_with_megatron_rng(parallel):
    formats = QuantRecipe.uniform(BLOCK_FORMAT, scope=["attention.qk"]).resolve("core_attention", 0, 1)
    module = _attention(QuantDotProductAttention, attention_dropout=0.5)
    module.configure_quant(AttentionQuant.from_formats(formats), SITE)
    qkv, grad = _inputs(seed=3)
    assert not module.uses_fused_path(qkv[0], qkv[1], None)
    module.eval()
    assert module.uses_fused_path(qkv[0], qkv[1], None)


def _captured_without_change(module, seed: int, monkeypatch):
    """Runs ``module`` without and with a recording saver: the results are the same bits and the
    saver sees attention's four capture points; returns the inputs, the saver and the captured run."""
    qkv, grad = _inputs(seed=seed)
    out_off, grads_off = _run(module, qkv, grad)
    saver = RecordingSaver().install(monkeypatch)
    out_on, grads_on = _run(module, qkv, grad)
    assert torch.equal(out_off, out_on) and all(torch.equal(a, b) for a, b in zip(grads_off, grads_on))
    assert saver.names() == [("forward", "pre", ("key", "query", "value")), ("forward", "post", ("output",)),
                             ("backward", "pre", ("grad_output",)),
                             ("backward", "post", ("grad_key", "grad_query", "grad_value"))]
    return qkv, saver, out_on, grads_on


def test_capture_names_and_numerics_unchanged(parallel, monkeypatch):
    module = _attention(QuantDotProductAttention)
    formats = attention_formats(BLOCK_FORMAT)
    module.configure_quant(AttentionQuant.from_formats(formats), SITE)
    qkv, saver, out_on, grads_on = _captured_without_change(module, 4, monkeypatch)
    pre = saver.calls[0][3]
    torch.testing.assert_close(pre["query"].quantized, q(qkv[0], formats["qk.query"], -1), rtol=0, atol=0)
    assert pre["value"].axis == 0 and pre["value"].quantized is not None
    assert torch.equal(saver.calls[3][3]["grad_query"], grads_on[0])


def test_capture_on_the_sdpa_path_records_the_same_names(parallel, monkeypatch):
    module = _passthrough(torch.float32, allow_fused=True)
    assert module.path() == "sdpa"
    qkv, saver, out_on, grads_on = _captured_without_change(module, 8, monkeypatch)
    assert torch.equal(saver.calls[0][3]["query"].tensor, qkv[0]) and torch.equal(saver.calls[1][3]["output"], out_on)
    assert torch.equal(saver.calls[3][3]["grad_query"], grads_on[0])
