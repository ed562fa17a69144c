"""``deepseek-v3-small`` is DeepSeek-V3's multi-latent attention: its preset gives megatron-core's
MLATransformerConfig with V3's head sizes; the model built from a shrunk copy quantizes every MLA projection
by role (a precision file's matchers reach its modules by path; the capture roles are MLA's); the start
line's parameter count and FLOPs count MLA's projections as the built model holds them."""
import pytest
import torch
from megatron.core.quantization.quant_config import GlobMatcher
from megatron.core.transformer.transformer_config import MLATransformerConfig

from megatron.quant.layers import mla
from megatron.quant.recipes.precision import PrecisionConfig
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.training import metrics
from megatron.quant.training.mla import mla_config_fields
from megatron.quant.training.model import build_gpt, transformer_config
from megatron.quant.training.presets import get_preset

TINY = dict(num_layers=2, hidden_size=128, ffn_hidden_size=256, num_attention_heads=2, num_query_groups=2,
            vocab_size=256, seq_length=16, max_position_embeddings=32, num_experts=4, moe_router_topk=2,
            moe_ffn_hidden_size=64, moe_shared_expert_intermediate_size=64, moe_layer_freq=(0, 1))


def test_the_deepseek_preset_is_multi_latent_attention():
    shape = get_preset("deepseek-v3-small")
    config = transformer_config(shape)
    assert isinstance(config, MLATransformerConfig) and config.multi_latent_attention and config.qk_layernorm
    assert (config.q_lora_rank, config.kv_lora_rank, config.qk_head_dim, config.qk_pos_emb_head_dim,
            config.v_head_dim, config.rope_type) == (256, 128, 128, 64, 128, "rope")
    assert type(transformer_config(get_preset("llama-moe-tiny"))) is not MLATransformerConfig
    with pytest.raises(ValueError, match="^a multi-latent attention shape needs kv_lora_rank; allowed: positive"):
        mla_config_fields(dict(shape, kv_lora_rank=None))


@pytest.mark.skipif(mla.build_problem() is not None, reason=str(mla.build_problem()))
def test_a_shrunk_deepseek_model_quantizes_mla_by_role_and_is_counted_as_built(parallel):
    shape = dict(get_preset("deepseek-v3-small"), **TINY)
    recipes = {"kv": QuantRecipe.uniform("fp8_e4m3"), "rest": QuantRecipe.uniform("mxfp8")}
    precision = PrecisionConfig([GlobMatcher("*linear_kv_down_proj", "kv"), GlobMatcher("*", "rest")], recipes,
                                "mla", "mla.yaml")  # a precision file's matchers reach MLA's modules by path
    model = build_gpt(transformer_config(shape, quant_recipe=precision, moe_run=dict(router_dtype="fp32")), shape)
    sites = {m.capture_site.module: m for m in model.modules() if getattr(m, "capture_site", None) is not None}
    roles = {m.capture_site.role for m in sites.values()}
    assert roles == {"q_down", "q_up", "kv_down", "kv_up", "proj", "core_attention", "fc1", "fc2", "router"}
    may_capture = precision.capture_roles(2, moe=True, mla=True)  # what TENSOR_SAVE_ROLES may name in an MLA run
    assert roles <= set(may_capture) and "qkv" not in may_capture
    for name, module in sites.items():
        if module.capture_site.role in ("q_down", "q_up", "kv_down", "kv_up"):
            expected = "fp8_e4m3" if name.endswith("kv_down_proj") else "mxfp8_e4m3"
            assert module.quant["fprop.input"].fmt.name == expected, name
    assert metrics.num_parameters(shape) == sum(p.numel() for p in model.parameters())
    attention = model.decoder.layers[0].self_attention
    projections = sum(m.weight.numel() for name, m in attention.named_children() if name.startswith("linear_"))
    assert metrics.attention_sizes(shape)[1] == projections
    tokens = torch.randint(0, 256, (2, 16))
    loss = model(tokens, torch.arange(16).expand(2, 16), None, labels=tokens).float().mean()
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in attention.parameters())
