"""``deepseek-v3-small`` is DeepSeek-V3's multi-latent attention: its preset gives megatron-core's
MLATransformerConfig with V3's head sizes; the model built from a shrunk copy quantizes every MLA projection
by role; the start line's parameter count and FLOPs count MLA's projections as the built model holds them."""
import pytest
import torch
from megatron.core.transformer.transformer_config import MLATransformerConfig

from megatron.quant.layers import mla
from megatron.quant.layers.spec import precision_config
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
    config = transformer_config(shape, quant_recipe=precision_config(QuantRecipe.from_dict({"format": "mxfp8"})),
                                moe_run=dict(router_dtype="fp32"))
    model = build_gpt(config, shape)
    roles = {m.capture_site.role for m in model.modules() if getattr(m, "capture_site", None) is not None}
    assert roles == {"q_down", "q_up", "kv_down", "kv_up", "proj", "core_attention", "fc1", "fc2", "router"}
    assert metrics.num_parameters(shape) == sum(p.numel() for p in model.parameters())
    attention = model.decoder.layers[0].self_attention
    projections = sum(m.weight.numel() for name, m in attention.named_children() if name.startswith("linear_"))
    assert metrics.attention_sizes(shape)[1] == projections
    tokens = torch.randint(0, 256, (2, 16))
    loss = model(tokens, torch.arange(16).expand(2, 16), None, labels=tokens).float().mean()
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in attention.parameters())
