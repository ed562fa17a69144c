"""Llama layer spec with the quantized modules, module tagging, and ``build_llama_model``.

The spec is megatron-core's local GPT layer spec (RMSNorm, SwiGLU via the config's gated
linear unit, RoPE and GQA via the config, no biases via ``add_bias_linear=False``) with the
linear layers and core attention swapped for their quantized subclasses; the LM head comes from
``output_layer_spec`` when the recipe quantizes it. After the model is built,
``configure_quant_modules`` resolves the recipe once per module and tells each quantized module
its formats and its CaptureSite (qualified name, 0-based layer, role).
"""
from __future__ import annotations

from dataclasses import replace

import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.spec_utils import ModuleSpec, build_module
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import TransformerLayer

from megatron.quant.compat import replace_mlp_submodules
from megatron.quant.layers import recompute
from megatron.quant.layers.attention import AttentionQuant, QuantDotProductAttention
from megatron.quant.layers.linear import QuantColumnParallelLinear, QuantLinearMixin, QuantRowParallelLinear
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
    mlp = replace_mlp_submodules(mlp, linear_fc1=QuantColumnParallelLinear, linear_fc2=QuantRowParallelLinear)
    return replace(spec, submodules=replace(spec.submodules, self_attention=attention, mlp=mlp))


def output_layer_spec() -> ModuleSpec:
    """The quantized LM head (``GPTModel.output_layer``)."""
    return ModuleSpec(module=QuantColumnParallelLinear)


def _output_layer_from_spec(model: GPTModel, spec: ModuleSpec) -> torch.nn.Module:
    """``model``'s LM head built from ``spec``: GPTModel builds a ColumnParallelLinear itself (megatron-core
    has no spec for it), so the built one is rebuilt with GPTModel's arguments; it holds the built one's
    weight (the same Parameter, or None when tied to the embedding), so initialisation, tying and the
    random stream stay those of the stock model."""
    stock = model.output_layer
    layer = build_module(spec, stock.input_size, stock.output_size, config=model.config,
                         init_method=model.config.init_method, bias=False, skip_bias_add=False,
                         gather_output=stock.gather_output, skip_weight_param_allocation=True,
                         embedding_activation_buffer=stock.embedding_activation_buffer,
                         grad_output_buffer=stock.grad_output_buffer, tp_group=stock.tp_group)
    layer.weight = stock.weight
    return layer


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
    already offset by the pipeline stage). The output layer (LM head) is configured when it is a
    quantized one (``build_llama_model`` builds it so when a rule names the role ``output_layer``).
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
    if isinstance(output_layer, QuantColumnParallelLinear):
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
    if post_process and recipe.quantizes_output_layer(config.num_layers):
        model.output_layer = _output_layer_from_spec(model, output_layer_spec())
    configure_quant_modules(model, recipe, config.num_layers, sdpa)
    if config.recompute_granularity is not None:
        recompute.route_recompute(model)  # recomputed forwards reproduce the first one (layers/recompute.py)
    return model
