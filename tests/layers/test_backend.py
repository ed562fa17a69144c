"""Our BackendSpecProvider: the Llama model megatron-core's builders make with it equals, bit for bit, the
model the earlier spec made (megatron-core's local spec with the classes swapped in, then every module
configured after the build: written out below as the reference), in forward, backward and a 3-iteration
run under stochastic rounding; the block and MoE builders take it too."""
import functools
from dataclasses import replace

import pytest
import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec
from megatron.core.transformer.transformer_layer import TransformerLayer

from megatron.quant import position
from megatron.quant.layers.attention import AttentionQuant, QuantDotProductAttention
from megatron.quant.layers.backend import QuantSpecProvider, with_backend
from megatron.quant.layers.linear import QuantColumnParallelLinear, QuantLinearMixin, QuantRowParallelLinear
from megatron.quant.layers.linear_function import LinearQuant
from megatron.quant.layers.module_quant import finish_init
from megatron.quant.layers.spec import build_llama_model, precision_config
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.tensor_saver import CaptureSite
from tests.layers._helpers import transformer_config

VOCAB, SEQ = 128, 32
RECIPE = QuantRecipe.from_dict({"format": "mxfp8", "options": {"rounding": "stochastic"}, "seed": 7,
                                "scope": ["linear", "attention"],
                                "rules": [{"match": {"roles": ["output_layer"]}, "format": "nvfp4"}]})
ROLES = {"linear_qkv": "qkv", "linear_proj": "proj", "linear_fc1": "fc1", "linear_fc2": "fc2",
         "core_attention": "core_attention"}


def _earlier_model(config, recipe: QuantRecipe) -> GPTModel:
    """The reference: the classes put into megatron-core's local spec, each module configured after the build."""
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    attention, mlp = spec.submodules.self_attention, spec.submodules.mlp
    attention = replace(attention, submodules=replace(attention.submodules, linear_qkv=QuantColumnParallelLinear,
                                                      core_attention=QuantDotProductAttention,
                                                      linear_proj=QuantRowParallelLinear))
    linears = {"linear_fc1": QuantColumnParallelLinear, "linear_fc2": QuantRowParallelLinear}
    if isinstance(mlp, functools.partial):  # 0.19: partial(MLP.as_mlp_submodule, submodules=...)
        mlp = functools.partial(mlp.func, *mlp.args, **{**mlp.keywords,
                                                        "submodules": replace(mlp.keywords["submodules"], **linears)})
    else:
        mlp = replace(mlp, submodules=replace(mlp.submodules, **linears))
    spec = replace(spec, submodules=replace(spec.submodules, self_attention=attention, mlp=mlp))
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=SEQ,
                     position_embedding_type="rope", rotary_base=500000.0, share_embeddings_and_output_weights=True)
    stock = model.output_layer
    head = QuantColumnParallelLinear(stock.input_size, stock.output_size, config=config,
                                     init_method=config.init_method, bias=False, skip_bias_add=False,
                                     gather_output=stock.gather_output, skip_weight_param_allocation=True,
                                     embedding_activation_buffer=stock.embedding_activation_buffer,
                                     grad_output_buffer=stock.grad_output_buffer, tp_group=stock.tp_group)
    head.weight = stock.weight
    model.output_layer = head
    shared, n = {}, config.num_layers

    def configure(module, name, layer_idx, role):
        formats = recipe.resolve(role, layer_idx, n, shared)
        attention = role == "core_attention"
        site = CaptureSite("attention" if attention else "linear", "FA" if attention else "linear", layer_idx, name,
                           role, recipe.name)
        if attention:
            module.configure_quant(AttentionQuant.from_formats(formats), site, seed=recipe.seed)
        else:
            module.configure_quant(LinearQuant.from_formats(formats), site, seed=recipe.seed,
                                   shard_groups=2 if role == "fc1" else 1)

    for layer_name, layer in model.named_modules():
        if isinstance(layer, TransformerLayer):
            for sub_name, module in layer.named_modules():
                attribute = sub_name.rsplit(".", 1)[-1]
                if attribute in ROLES:
                    configure(module, f"{layer_name}.{sub_name}", layer.layer_number - 1, ROLES[attribute])
    configure(model.output_layer, "output_layer", -1, "output_layer")
    return model


def _models(parallel):
    config = transformer_config()
    torch.manual_seed(0)
    earlier = _earlier_model(config, RECIPE)
    torch.manual_seed(0)
    ours = build_llama_model(config, RECIPE, vocab_size=VOCAB, max_sequence_length=SEQ)
    return earlier, ours


def _run(model, iterations: int) -> list[torch.Tensor]:
    """Losses of ``iterations`` SGD steps (every parameter's gradient checked equal by the caller via the losses)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for iteration in range(iterations):
        position.set_iteration(iteration)
        position.set_microbatch(0, iteration)
        tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(iteration))
        loss = model(tokens, torch.arange(SEQ).expand(2, SEQ), None, labels=tokens).float().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        for module in model.modules():
            if isinstance(module, QuantLinearMixin):
                module.invalidate_quantized_weights()
        losses.append(loss.detach())
    return losses


def test_backend_model_equals_the_earlier_spec_bit_for_bit(parallel):
    earlier, ours = _models(parallel)
    assert [type(m) for m in earlier.modules()] == [type(m) for m in ours.modules()]
    configured = [[repr((m.capture_site, m.quant)) for m in model.modules()
                   if isinstance(m, (QuantLinearMixin, QuantDotProductAttention))] for model in (earlier, ours)]
    assert configured[0] == configured[1] and "nvfp4" in configured[1][-1]  # the LM head too
    assert all(torch.equal(a, b) for a, b in zip(earlier.state_dict().values(), ours.state_dict().values())
               if isinstance(a, torch.Tensor))
    position.set_iteration(0)
    position.set_microbatch(0, 0)
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
    grads = []
    for model in (earlier, ours):
        loss = model(tokens, torch.arange(SEQ).expand(2, SEQ), None, labels=tokens).float().mean()
        loss.backward()
        grads.append([loss.detach()] + [p.grad for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    earlier.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    assert all(torch.equal(a, b) for a, b in zip(_run(earlier, 3), _run(ours, 3)))


def test_the_block_and_moe_builders_take_the_backend(parallel):
    config = transformer_config(quant_recipe=precision_config(RECIPE))
    model = build_llama_model(config, vocab_size=VOCAB, max_sequence_length=SEQ)
    assert model.config is config  # a training run's schedule and DDP hold this config
    with pytest.raises(ValueError, match="config.quant_recipe is set and a recipe is given"):
        build_llama_model(config, RECIPE, vocab_size=VOCAB, max_sequence_length=SEQ)
    block = with_backend(get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm"),
                         QuantSpecProvider())
    for layer in block.layer_specs:
        qkv = layer.submodules.self_attention.submodules.linear_qkv
        assert qkv.module is QuantColumnParallelLinear and qkv.params == {"gemm_role": "qkv"}
    moe = with_backend(get_gpt_layer_local_spec(num_experts=2, normalization="RMSNorm"), QuantSpecProvider())
    moe_config = transformer_config(num_moe_experts=2, moe_router_topk=2, quant_recipe=precision_config(RECIPE))
    layer = TransformerLayer(moe_config, moe.submodules, layer_number=1)
    finish_init(layer, moe_config, prefix="decoder.layers.0.")
    experts = [m for n, m in layer.named_modules() if "experts" in n and isinstance(m, QuantLinearMixin)]
    assert len(experts) == 4 and all(m.capture_site.layer_idx == 0 and m.quant is not None for m in experts)
    assert {m.capture_site.role for m in experts} == {"fc1", "fc2"}
    with pytest.raises(ValueError, match="moe_grouped_gemm"):
        QuantSpecProvider().grouped_mlp_modules(True, False)
