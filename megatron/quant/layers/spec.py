"""Llama layer spec with the quantized modules, module tagging, and ``build_llama_model``.

The spec is megatron-core's local GPT layer spec (RMSNorm, SwiGLU via the config's gated
linear unit, RoPE and GQA via the config, no biases via ``add_bias_linear=False``) with the
linear layers and core attention swapped for their quantized subclasses. After the model is
built, ``configure_quant_modules`` resolves the recipe once per module and tells each
quantized module its formats and its CaptureSite (qualified name, 0-based layer, role).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import TransformerLayer

from megatron.quant.layers.attention import AttentionQuant, QuantDotProductAttention
from megatron.quant.layers.linear import QuantColumnParallelLinear, QuantLinearMixin, QuantRowParallelLinear
from megatron.quant.layers import recompute
from megatron.quant.layers.linear_function import LinearQuant
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.tensor_saver import CaptureSite

# Attribute name of a module inside its TransformerLayer -> role used by recipes and captures.
ROLE_BY_ATTRIBUTE = {"linear_qkv": "qkv", "linear_proj": "proj", "linear_fc1": "fc1", "linear_fc2": "fc2",
                     "core_attention": "core_attention"}


def llama_layer_spec() -> ModuleSpec:
    """megatron-core's local RMSNorm layer spec with the quantized linear and attention modules.

    The quantized modules behave as stock ones until configured (``configure_quant_modules``),
    so the spec itself does not depend on a recipe.
    """
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    attention = spec.submodules.self_attention
    mlp = spec.submodules.mlp
    attention = replace(attention, submodules=replace(
        attention.submodules, linear_qkv=QuantColumnParallelLinear, core_attention=QuantDotProductAttention,
        linear_proj=QuantRowParallelLinear))
    mlp = replace(mlp, submodules=replace(mlp.submodules, linear_fc1=QuantColumnParallelLinear,
                                          linear_fc2=QuantRowParallelLinear))
    return replace(spec, submodules=replace(spec.submodules, self_attention=attention, mlp=mlp))


def _site(name: str, layer_idx: int, role: str, recipe: QuantRecipe) -> CaptureSite:
    attention = role == "core_attention"
    return CaptureSite(layer_type="attention" if attention else "linear", component="FA" if attention else "linear",
                       layer_idx=layer_idx, module=name, role=role, quant_type=recipe.name)


def _configure(module, name: str, layer_idx: int, role: str, recipe: QuantRecipe, num_layers: int,
               shared: dict, sdpa: bool) -> None:
    formats = recipe.resolve(role, layer_idx, num_layers, shared)
    site = _site(name, layer_idx, role, recipe)
    seed = recipe.seed or 0
    if isinstance(module, QuantDotProductAttention):
        module.configure_quant(AttentionQuant.from_formats(formats), site, allow_fused=sdpa, seed=seed)
    else:
        gated = role == "fc1" and module.config.gated_linear_unit  # megatron fuses [gate; up] per shard
        module.configure_quant(LinearQuant.from_formats(formats), site, seed=seed, shard_groups=2 if gated else 1)


def configure_quant_modules(model: torch.nn.Module, recipe: QuantRecipe, num_layers: int, sdpa: bool = True
                            ) -> list[CaptureSite]:
    """Resolve ``recipe`` for every quantized module of ``model`` (a GPTModel, or any module
    holding TransformerLayers); return their sites. ``sdpa``: core attention may run
    ``scaled_dot_product_attention`` where it computes what the unfused path does (``layers/attention.py``).

    Layer indices are global and 0-based (megatron-core's ``layer_number`` is 1-based and
    already offset by the pipeline stage). The output layer (LM head) is made quantized only
    when a rule names the role ``output_layer``.
    """
    sites = []
    shared: dict = {}  # one format instance per distinct choice across the model
    for layer_name, layer in model.named_modules():
        if not isinstance(layer, TransformerLayer):
            continue
        layer_idx = layer.layer_number - 1
        for sub_name, module in layer.named_modules():
            role = ROLE_BY_ATTRIBUTE.get(sub_name.rsplit(".", 1)[-1])
            if role and isinstance(module, (QuantLinearMixin, QuantDotProductAttention)):
                qualified = ".".join(part for part in (layer_name, sub_name) if part)
                _configure(module, qualified, layer_idx, role, recipe, num_layers, shared, sdpa)
                sites.append(module.capture_site)
    output_layer = getattr(model, "output_layer", None)
    if output_layer is not None and recipe.quantizes_output_layer(num_layers):
        # GPTModel builds its LM head directly (no spec hook); the quantized subclass adds only
        # methods and class-level defaults, so promoting the instance keeps all its state.
        output_layer.__class__ = QuantColumnParallelLinear
        _configure(output_layer, "output_layer", -1, "output_layer", recipe, num_layers, shared, sdpa)
        sites.append(output_layer.capture_site)
    return sites


def build_llama_model(config: TransformerConfig, recipe: QuantRecipe, *, vocab_size: int, max_sequence_length: int,
                      rotary_base: float = 500000.0, share_embeddings_and_output_weights: bool = True,
                      pre_process: bool = True, post_process: bool = True, sdpa: bool = True) -> GPTModel:
    """GPTModel with the quantized Llama spec, every quantized module configured from ``recipe``;
    ``sdpa``: see ``configure_quant_modules`` (``layers/fusions.py`` chooses it for training runs)."""
    spec = llama_layer_spec()
    if config.sequence_parallel and spec.submodules.input_layernorm is WrappedTorchNorm:
        raise ValueError("sequence_parallel=True needs Transformer Engine or Apex norms, which megatron-core "
                         "requires for sequence parallelism; neither is installed here. Set sequence_parallel=False.")
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=vocab_size,
                     max_sequence_length=max_sequence_length, pre_process=pre_process, post_process=post_process,
                     share_embeddings_and_output_weights=share_embeddings_and_output_weights,
                     position_embedding_type="rope", rotary_base=rotary_base)
    configure_quant_modules(model, recipe, config.num_layers, sdpa)
    if config.recompute_granularity is not None:
        recompute.install()  # recomputed forwards reproduce the first one (layers/recompute.py)
    return model
