"""Multi-latent attention (DeepSeek-V3's) with quantized projections: megatron-core's MLASelfAttention built
from its local spec with our backend, each projection fake-quantized per its role, equals bit for bit, forward
and backward, an independent reference: the operands quantized with the formats, plain torch matmuls, RMSNorm,
RoPE and softmax attention written out. Where megatron-core cannot build MLA (0.16 without Transformer Engine,
``layers/mla.py``) the refusal is one line."""
import math

import pytest
import torch
from megatron.core.transformer.spec_utils import build_module

from megatron.quant import formats, position
from megatron.quant.layers import mla
from megatron.quant.layers.backend import QuantSpecProvider
from megatron.quant.layers.module_quant import finish_init
from megatron.quant.layers.spec import decoder_spec, llama_layer_spec, precision_config
from megatron.quant.recipes.recipe import QuantRecipe
from tests.layers._helpers import gemm, operand, transformer_config

SEQ, BATCH, HIDDEN, HEADS = 16, 2, 64, 2
SHAPE = dict(q_lora_rank=32, kv_lora_rank=64, qk_head_dim=32, qk_pos_emb_head_dim=32, v_head_dim=32)
# A role mix-up shows: two projections take a per-tensor format, the others blocks of 32.
RECIPE = QuantRecipe.from_dict({"format": "mxfp8", "scope": ["linear"],
                                "rules": [{"match": {"roles": ["q_down", "kv_up"]}, "format": "fp8_e4m3"}]})
FORMATS = {role: formats.get_format("fp8_e4m3" if role in ("q_down", "kv_up") else "mxfp8")
           for role in ("q_down", "q_up", "kv_down", "kv_up", "proj")}


def _config(**overrides):
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    values = dict(num_layers=1, hidden_size=HIDDEN, num_attention_heads=HEADS, ffn_hidden_size=128,
                  normalization="RMSNorm", add_bias_linear=False, use_cpu_initialization=True, attention_dropout=0.0,
                  hidden_dropout=0.0, rope_type="rope", apply_rope_fusion=False, qk_layernorm=True,
                  masked_softmax_fusion=False, quant_recipe=precision_config(RECIPE), **SHAPE)
    values.update(overrides)
    return MLATransformerConfig(**values)


class _Linear(torch.autograd.Function):
    """Y = q(X) q(W)^T along in; dX = q(dY) q(W) along out; dW = q(dY)^T q(X) along tokens."""

    @staticmethod
    def forward(ctx, x, w, fmt):
        ctx.save_for_backward(x, w)
        ctx.fmt = fmt
        return gemm(lambda a, c: torch.matmul(a, c.t()), operand(x, fmt, -1), operand(w, fmt, 1))

    @staticmethod
    def backward(ctx, dy):
        (x, w), f = ctx.saved_tensors, ctx.fmt
        dx = gemm(torch.matmul, operand(dy, f, -1), operand(w, f, 0))
        dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
        return dx, gemm(lambda a, c: a.t().matmul(c), operand(dy2, f, 0), operand(x2, f, 0)), None


def _rope(t, dim):
    """DeepSeek's RoPE: the interleaved pairs gathered into halves, then rotated by position."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = torch.outer(torch.arange(SEQ, dtype=torch.float32), inv_freq)
    angles = torch.cat((freqs, freqs), dim=-1)[:, None, None, :]
    t = torch.cat((t[..., 0::2], t[..., 1::2]), dim=-1)
    half = torch.cat((-t[..., dim // 2:], t[..., :dim // 2]), dim=-1)
    return t * torch.cos(angles) + half * torch.sin(angles)


def _reference(x, w, norms, eps):
    """MLA's forward written out (DeepSeek-V3, section 2.1.1) on the quantized projections."""
    nope, pe, v_dim = SHAPE["qk_head_dim"], SHAPE["qk_pos_emb_head_dim"], SHAPE["v_head_dim"]
    lin = lambda name, t: _Linear.apply(t, w[name], FORMATS[name])  # noqa: E731
    rms = lambda t, weight: torch.nn.functional.rms_norm(t, (t.shape[-1],), weight, eps)  # noqa: E731
    q = lin("q_up", rms(lin("q_down", x), norms["q"])).view(SEQ, BATCH, HEADS, nope + pe)
    latent, k_pe = lin("kv_down", x).split([SHAPE["kv_lora_rank"], pe], dim=-1)
    kv = lin("kv_up", rms(latent, norms["kv"])).view(SEQ, BATCH, HEADS, nope + v_dim)
    query = torch.cat([q[..., :nope], _rope(q[..., nope:], pe)], dim=-1)
    key = torch.cat([kv[..., :nope], _rope(k_pe.unsqueeze(-2), pe).expand(-1, -1, HEADS, -1)], dim=-1)
    value = kv[..., nope:]
    as_bn = lambda t: t.reshape(SEQ, BATCH * HEADS, -1).transpose(0, 1)  # noqa: E731  [b n, s, d]
    scores = torch.baddbmm(torch.empty(BATCH * HEADS, SEQ, SEQ), as_bn(query), as_bn(key).transpose(1, 2),
                           beta=0.0, alpha=1.0 / math.sqrt(nope + pe))
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)
    probs = torch.softmax(scores.view(BATCH, HEADS, SEQ, SEQ).masked_fill(causal, -10000.0), dim=-1)
    context = torch.bmm(probs.view(BATCH * HEADS, SEQ, SEQ), as_bn(value))
    context = context.view(BATCH, HEADS, SEQ, v_dim).permute(2, 0, 1, 3).reshape(SEQ, BATCH, HEADS * v_dim)
    return lin("proj", context)


@pytest.mark.skipif(mla.build_problem() is not None, reason=str(mla.build_problem()))
def test_mla_with_quantized_projections_equals_the_reference_bit_for_bit(parallel):
    config = _config()
    spec = llama_layer_spec(QuantSpecProvider(allow_fused=False), multi_latent_attention=True)
    torch.manual_seed(0)
    attention = build_module(spec.submodules.self_attention, config=config, layer_number=1)
    finish_init(attention, config, prefix="decoder.layers.0.self_attention.")
    modules = {"q_down": attention.linear_q_down_proj, "q_up": attention.linear_q_up_proj,
               "kv_down": attention.linear_kv_down_proj, "kv_up": attention.linear_kv_up_proj,
               "proj": attention.linear_proj}
    assert {name: m.capture_site.role for name, m in modules.items()} == {name: name for name in modules}
    position.set_iteration(0)
    position.set_microbatch(0, 0)
    x = torch.randn(SEQ, BATCH, HIDDEN, generator=torch.Generator().manual_seed(1), requires_grad=True)
    grad = torch.randn(SEQ, BATCH, HIDDEN, generator=torch.Generator().manual_seed(2))
    output, _ = attention(x, None)
    output.backward(grad)
    weights = {name: m.weight.detach().clone().requires_grad_() for name, m in modules.items()}
    norms = {"q": attention.q_layernorm.weight.detach().clone().requires_grad_(),
             "kv": attention.kv_layernorm.weight.detach().clone().requires_grad_()}
    x_ref = x.detach().clone().requires_grad_()
    expected = _reference(x_ref, weights, norms, config.layernorm_epsilon)
    expected.backward(grad)
    assert torch.equal(output, expected) and torch.equal(x.grad, x_ref.grad)
    for name, module in modules.items():
        assert torch.equal(module.weight.grad, weights[name].grad), name
    assert torch.equal(attention.q_layernorm.weight.grad, norms["q"].grad)
    assert torch.equal(attention.kv_layernorm.weight.grad, norms["kv"].grad)


def test_mla_that_megatron_core_cannot_build_is_refused_in_one_line():
    problem = mla.build_problem()
    config = transformer_config(multi_latent_attention=True)
    if problem is None:  # megatron-core 0.19 builds MLA without Transformer Engine
        assert decoder_spec(config, QuantSpecProvider()) is not None
        return
    with pytest.raises(ValueError) as refused:
        decoder_spec(config, QuantSpecProvider())
    assert str(refused.value) == problem and "\n" not in problem and "Transformer Engine" in problem
