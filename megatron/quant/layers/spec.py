"""The Llama model: megatron-core's local GPT layer spec and GPTModel, built with our backend; with
``num_moe_experts`` in the config, megatron-core's local MoE block spec (``decoder_spec``).

The layer is ``get_gpt_layer_local_spec(normalization="RMSNorm")`` (SwiGLU via the config's gated
linear unit, RoPE and GQA via the config, no biases via ``add_bias_linear=False``) with
``QuantSpecProvider``'s modules (``layers/backend.py``). The recipe travels in the config:
``TransformerConfig.quant_recipe`` is a ``PrecisionConfig`` (``recipes/precision.py``), which
``GPTModel`` matches to every quantized module as it finishes building it.

The LM head has no spec in megatron-core (``GPTModel`` builds a ``ColumnParallelLinear`` itself),
so when the recipe quantizes it, it is rebuilt as our layer and finished like the others.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec
from megatron.core.quantization.utils import get_quant_config_or_none
from megatron.core.transformer.spec_utils import ModuleSpec, build_module
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron.quant.layers import mla, recompute
from megatron.quant.layers.backend import QuantSpecProvider, with_backend
from megatron.quant.layers.linear import QuantColumnParallelLinear
from megatron.quant.layers.module_quant import warn_idle_matchers
from megatron.quant.recipes.precision import PrecisionConfig
from megatron.quant.recipes.recipe import QuantRecipe

OUTPUT_LAYER = "output_layer"  # GPTModel's attribute, the path megatron-core matches it by


def llama_layer_spec(backend: QuantSpecProvider | None = None, multi_latent_attention: bool = False) -> ModuleSpec:
    """megatron-core's local RMSNorm layer spec with ``backend``'s modules (default: ``QuantSpecProvider()``);
    ``multi_latent_attention``: its MLA layer (RMSNorm on the query and key/value latents, as DeepSeek-V3).

    The quantized modules behave as stock ones until a config is matched to them, so the spec itself
    does not depend on a recipe."""
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", multi_latent_attention=multi_latent_attention,
                                    qk_layernorm=multi_latent_attention)
    return with_backend(spec, backend or QuantSpecProvider())


def decoder_spec(config: TransformerConfig, backend: QuantSpecProvider) -> Any:
    """The decoder's spec: the Llama layer for a dense model; for an MoE one (``num_moe_experts``),
    megatron-core's local block spec, whose layers are MoE or dense as ``moe_layer_freq`` says. Attention
    is multi-latent where the config says so (``config.multi_latent_attention``, ``layers/mla.py``)."""
    problem = mla.build_problem() if config.multi_latent_attention else None
    if problem:
        raise ValueError(problem)
    if not config.num_moe_experts:
        return llama_layer_spec(backend, config.multi_latent_attention)
    return with_backend(get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm"),
                        backend)


def precision_config(recipe: QuantRecipe | PrecisionConfig) -> PrecisionConfig:
    """``recipe`` as megatron-core's per-module precision (a lab recipe matches every module)."""
    return recipe if isinstance(recipe, PrecisionConfig) else PrecisionConfig.uniform(recipe)


def _output_layer(model: GPTModel) -> torch.nn.Module:
    """``model``'s LM head rebuilt as a quantized layer with GPTModel's arguments; it holds the built
    one's weight (the same Parameter, or None when tied to the embedding), so initialisation, tying
    and the random stream stay those of the stock model."""
    stock = model.output_layer
    layer = build_module(ModuleSpec(module=QuantColumnParallelLinear, params={"gemm_role": "output_layer"}),
                         stock.input_size, stock.output_size,
                         config=model.config, init_method=model.config.init_method, bias=False, skip_bias_add=False,
                         gather_output=stock.gather_output, skip_weight_param_allocation=True,
                         embedding_activation_buffer=stock.embedding_activation_buffer,
                         grad_output_buffer=stock.grad_output_buffer, tp_group=stock.tp_group)
    layer.weight = stock.weight
    return layer


def build_llama_model(config: TransformerConfig, recipe: QuantRecipe | PrecisionConfig | None = None, *,
                      vocab_size: int, max_sequence_length: int, rotary_base: float = 500000.0,
                      share_embeddings_and_output_weights: bool = True, pre_process: bool = True,
                      post_process: bool = True, sdpa: bool = True) -> GPTModel:
    """GPTModel with the quantized Llama spec whose modules take their formats from ``config.quant_recipe``.

    ``recipe`` (one recipe for every module, or a ``PrecisionConfig``): the model gets a copy of ``config``
    with it as ``quant_recipe``; None: ``config`` itself, whose ``quant_recipe`` a training run sets (its
    schedule and DDP read the model's config, so it must be the one they were given). ``sdpa``:
    ``QuantSpecProvider``'s ``allow_fused`` (``layers/fusions.py`` chooses it for training runs)."""
    spec = decoder_spec(config, QuantSpecProvider(allow_fused=sdpa))
    first_layer = spec.layer_specs[0] if config.num_moe_experts else spec
    if config.sequence_parallel and first_layer.submodules.input_layernorm is WrappedTorchNorm:
        raise ValueError("sequence_parallel=True needs Transformer Engine or Apex norms, which megatron-core "
                         "requires for sequence parallelism; neither is installed here. Set sequence_parallel=False.")
    if recipe is not None:
        if config.quant_recipe is not None:
            raise ValueError("build_llama_model: config.quant_recipe is set and a recipe is given; give one")
        config = replace(config, quant_recipe=precision_config(recipe))
    if not isinstance(config.quant_recipe, PrecisionConfig):
        raise ValueError(f"build_llama_model: config.quant_recipe is {type(config.quant_recipe).__name__}; give a "
                         f"recipe or set it to a PrecisionConfig (megatron.quant.layers.spec.precision_config)")
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=vocab_size,
                     max_sequence_length=max_sequence_length, pre_process=pre_process, post_process=post_process,
                     share_embeddings_and_output_weights=share_embeddings_and_output_weights,
                     position_embedding_type="rope", rotary_base=rotary_base)
    matched = get_quant_config_or_none(OUTPUT_LAYER, config.quant_recipe) if post_process else None
    if matched is not None and config.quant_recipe.recipe(matched).quantizes_output_layer(config.num_layers):
        model.output_layer = _output_layer(model)
        model.output_layer.finish_init(matched)
    warn_idle_matchers(model, config.quant_recipe, extra=(OUTPUT_LAYER,))
    if config.recompute_granularity is not None:
        recompute.route_recompute(model)  # recomputed forwards reproduce the first one (layers/recompute.py)
    return model
