"""Multi-latent attention (DeepSeek-V2/V3's MLA): the shape keys a preset sets and the TransformerConfig
fields they give (megatron-core's ``MLATransformerConfig``).

A shape with ``multi_latent_attention`` builds megatron-core's MLA in place of GQA attention
(``layers/mla.py``): queries through a latent of ``q_lora_rank`` (none: one projection), keys and values
through a latent of ``kv_lora_rank``, heads of ``qk_head_dim`` plus a shared RoPE part of
``qk_pos_emb_head_dim``, values of ``v_head_dim``, RMSNorm on both latents. Positions use plain RoPE, as
DeepSeek-V3's pre-training at 4K context did (YaRN came with its later context extension).
"""
from __future__ import annotations

from typing import Any, Mapping

# Shape keys (presets set them) and their values when a shape leaves them unset: a GQA model.
MLA_SHAPE_DEFAULTS = dict(multi_latent_attention=False, q_lora_rank=None, kv_lora_rank=None, qk_head_dim=None,
                          qk_pos_emb_head_dim=None, v_head_dim=None)
_SIZES = ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")


def mla_config_fields(shape: Mapping) -> dict[str, Any]:
    """``MLATransformerConfig``'s fields for ``shape`` (none for a GQA shape); ValueError naming a missing size."""
    if not shape.get("multi_latent_attention"):
        return {}
    missing = [key for key in _SIZES if not shape.get(key)]
    if missing:
        raise ValueError(f"a multi-latent attention shape needs {', '.join(missing)}; allowed: positive integers")
    return dict(multi_latent_attention=True, q_lora_rank=shape.get("q_lora_rank"),
                **{key: shape[key] for key in _SIZES}, qk_layernorm=True, rope_type="rope",
                rotary_base=shape["rotary_base"])


def mla_attention_sizes(shape: Mapping) -> tuple[int, int, int]:
    """A multi-latent attention layer's (parameters, projection multiply-adds per token, the widths Q K^T and
    P V multiply over per pair of positions): the down and up projections, the latents' RMSNorm weights,
    the output projection."""
    h, n = shape["hidden_size"], shape["num_attention_heads"]
    q_rank, kv_rank = shape.get("q_lora_rank"), shape["kv_lora_rank"]
    nope, rope, value = shape["qk_head_dim"], shape["qk_pos_emb_head_dim"], shape["v_head_dim"]
    query = h * q_rank + q_rank * n * (nope + rope) if q_rank else h * n * (nope + rope)
    weights = query + h * (kv_rank + rope) + kv_rank * n * (nope + value) + n * value * h
    return weights + (q_rank or 0) + kv_rank, weights, n * (nope + rope) + n * value
