"""Llama shape (dense or MoE) -> megatron-core TransformerConfig and GPTModel with the quantized layer spec."""
from __future__ import annotations

from typing import Mapping

import torch

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# megatron-core's unfused SwiGLU and RoPE (its defaults would ask for TE's RoPE kernel and the jit SwiGLU).
_UNFUSED = {"bias_activation_fusion": False, "apply_rope_fusion": False}


def transformer_config(shape: Mapping, *, precision: str = "fp32", tensor_parallel: int = 1,
                       pipeline_parallel: int = 1, sequence_parallel: bool = False,
                       init_method_std: float = 0.02, attention_dropout: float = 0.0,
                       hidden_dropout: float = 0.0, fp8_format: str | None = None, tp_only_amax_red: bool = False,
                       recompute_granularity: str | None = None, recompute_method: str | None = None,
                       recompute_num_layers: int | None = None, fusion_flags: Mapping | None = None,
                       quant_recipe=None, moe_run: Mapping | None = None):
    """megatron-core's TransformerConfig for a Llama shape (preset-style keys); ``recompute_*``:
    megatron-core's activation recompute (selective recomputes core attention); ``fusion_flags``:
    ``FastPaths.config_flags()`` (``layers/fusions.py``; none: megatron-core's unfused operations);
    ``quant_recipe``: the per-module precision (``layers.spec.precision_config``); ``moe_run``: an MoE
    shape's run settings (``moe.moe_run_fields``; default: megatron-core's)."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    from megatron.quant.training.mla import mla_config_fields
    from megatron.quant.training.moe import moe_config_fields

    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    mla = mla_config_fields(shape)
    return (MLATransformerConfig if mla else TransformerConfig)(
        num_layers=shape["num_layers"], hidden_size=shape["hidden_size"],
        ffn_hidden_size=shape["ffn_hidden_size"], num_attention_heads=shape["num_attention_heads"],
        num_query_groups=shape["num_query_groups"], normalization="RMSNorm",
        layernorm_epsilon=shape.get("norm_epsilon", 1e-5), gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False,
        init_method_std=init_method_std, attention_dropout=attention_dropout, hidden_dropout=hidden_dropout,
        tensor_model_parallel_size=tensor_parallel, pipeline_model_parallel_size=pipeline_parallel,
        sequence_parallel=sequence_parallel, params_dtype=PRECISIONS[precision],
        pipeline_dtype=PRECISIONS[precision],
        bf16=precision == "bf16", fp16=precision == "fp16", use_cpu_initialization=not torch.cuda.is_available(),
        masked_softmax_fusion=False, persist_layer_norm=False, bias_dropout_fusion=False,
        fp8=fp8_format, tp_only_amax_red=tp_only_amax_red,
        recompute_granularity=recompute_granularity, recompute_method=recompute_method,
        recompute_num_layers=recompute_num_layers, quant_recipe=quant_recipe,
        **moe_config_fields(shape, **(moe_run or {})), **mla, **{**_UNFUSED, **(fusion_flags or {})})


def build_gpt(config, shape: Mapping, *, vocab_size: int | None = None, sdpa: bool = True):
    """GPTModel for ``shape`` with the quantized Llama spec of ``config.quant_recipe`` (``sdpa``: see
    ``build_llama_model``)."""
    from megatron.core import parallel_state

    from megatron.quant.layers.spec import build_llama_model

    if config.fp8:
        return _build_te_fp8_model(config, shape, vocab_size or shape["vocab_size"])
    model = build_llama_model(
        config, vocab_size=vocab_size or shape["vocab_size"],
        max_sequence_length=shape["max_position_embeddings"], rotary_base=shape["rotary_base"],
        share_embeddings_and_output_weights=not shape["untie_embeddings_and_output_weights"],
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(), sdpa=sdpa)
    if shape.get("rope_scaling_factor"):
        _use_llama3_rope_scaling(model, shape)
    return model


def _use_llama3_rope_scaling(model, shape: Mapping) -> None:
    # build_llama_model has no RoPE-scaling arguments; GPTModel builds its RotaryEmbedding
    # from them, so an equal one with Llama 3.1 scaling (megatron-core's defaults match the
    # published low/high frequency factors and original context 8192) replaces it.
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    model.rotary_pos_emb = RotaryEmbedding(
        kv_channels=model.config.kv_channels, rotary_percent=1.0, rotary_base=shape["rotary_base"],
        rope_scaling=True, rope_scaling_factor=shape["rope_scaling_factor"],
        use_cpu_initialization=model.config.use_cpu_initialization, cp_group=model.pg_collection.cp)


def _build_te_fp8_model(config, shape: Mapping, vocab_size: int):
    # Real FP8 GEMMs (DTYPE=fp8) go through Transformer Engine's layers, i.e. megatron-core's
    # stock TE spec: no fake quantization and no capture hooks in this mode.
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

    model = GPTModel(
        config, get_gpt_layer_with_transformer_engine_spec(), vocab_size=vocab_size,
        max_sequence_length=shape["max_position_embeddings"], position_embedding_type="rope",
        rotary_base=shape["rotary_base"],
        share_embeddings_and_output_weights=not shape["untie_embeddings_and_output_weights"],
        pre_process=parallel_state.is_pipeline_first_stage(), post_process=parallel_state.is_pipeline_last_stage())
    if shape.get("rope_scaling_factor"):
        _use_llama3_rope_scaling(model, shape)
    return model
