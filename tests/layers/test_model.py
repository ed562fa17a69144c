"""A tiny Llama GPTModel built by spec.build_llama_model: every CUSTOM_QUANT_TYPE runs forward
and backward, bf16 equals megatron-core's stock model bit for bit (SDPA off; with it, to a
tolerance), modules are tagged."""
import pytest
import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

from megatron.quant import formats
from megatron.quant.layers.spec import build_llama_model
from megatron.quant.recipes.recipe import QuantRecipe
from tests._dist import run_distributed
from tests.layers._helpers import BLOCK_FORMAT, transformer_config

VOCAB, SEQ, BATCH = 128, 32, 2
QUANT_TYPES = sorted(set(formats.list_formats()) | set(formats.ALIASES) | {"bf16", "fp16", "none"})


def _tokens():
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))


def _loss_and_grads(model):
    tokens = _tokens()
    loss = model(tokens, torch.arange(SEQ).expand(BATCH, SEQ), None, labels=tokens).float().mean()
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def _build(recipe, sdpa=True, **config):
    torch.manual_seed(0)
    return build_llama_model(transformer_config(**config), recipe, vocab_size=VOCAB, max_sequence_length=SEQ,
                             sdpa=sdpa)


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
def test_every_quant_type_runs_forward_and_backward(parallel, monkeypatch, quant_type):
    monkeypatch.setenv("CUSTOM_QUANT_TYPE", quant_type)
    model = _build(QuantRecipe.from_env())
    loss, grads = _loss_and_grads(model)
    assert torch.isfinite(loss)
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())


@pytest.mark.parametrize("sdpa", [False, True])
def test_bf16_model_equals_stock_gpt(parallel, sdpa):
    config = transformer_config()
    torch.manual_seed(0)
    stock = GPTModel(config, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=VOCAB,
                     max_sequence_length=SEQ, position_embedding_type="rope", rotary_base=500000.0,
                     share_embeddings_and_output_weights=True)
    ours = _build(QuantRecipe.uniform("bf16"), sdpa=sdpa)
    ours.load_state_dict(stock.state_dict())
    loss_s, grads_s = _loss_and_grads(stock)
    loss_q, grads_q = _loss_and_grads(ours)
    if not sdpa:  # megatron-core's own operations: bit for bit
        assert torch.equal(loss_s, loss_q)
        assert all(torch.equal(grads_s[n], grads_q[n]) for n in grads_s)
    else:  # fp32 attention through SDPA: the summation order changes, nothing else
        torch.testing.assert_close(loss_q, loss_s, rtol=1e-6, atol=0)
        for n in grads_s:
            torch.testing.assert_close(grads_q[n], grads_s[n], rtol=1e-4, atol=1e-6, msg=n)


def test_quantization_changes_the_model_output(parallel):
    loss_bf16, _ = _loss_and_grads(_build(QuantRecipe.uniform("bf16")))
    loss_q, _ = _loss_and_grads(_build(QuantRecipe.uniform(BLOCK_FORMAT)))
    assert loss_bf16 != loss_q


def test_modules_are_tagged_with_sites(parallel):
    recipe = QuantRecipe.from_dict({"format": BLOCK_FORMAT, "name": "tagged",
                                    "rules": [{"match": {"roles": ["output_layer"]}, "format": BLOCK_FORMAT}]})
    model = _build(recipe)
    sites = {name: m.capture_site for name, m in model.named_modules() if getattr(m, "capture_site", None)}
    roles = {"self_attention.linear_qkv": "qkv", "self_attention.core_attention": "core_attention",
             "self_attention.linear_proj": "proj", "mlp.linear_fc1": "fc1", "mlp.linear_fc2": "fc2"}
    expected = {f"decoder.layers.{i}.{suffix}": (i, role) for i in range(2) for suffix, role in roles.items()}
    expected["output_layer"] = (-1, "output_layer")
    assert {n: (s.layer_idx, s.role) for n, s in sites.items()} == expected
    assert all(s.module == n and s.quant_type == "tagged" for n, s in sites.items())
    assert sites["decoder.layers.1.self_attention.core_attention"].component == "FA"
    assert sites["output_layer"].layer_type == "linear"


def test_lm_head_stays_stock_unless_named(parallel):
    model = _build(QuantRecipe.uniform(BLOCK_FORMAT))
    assert type(model.output_layer).__name__ == "ColumnParallelLinear"


@pytest.mark.parametrize("tied", [True, False])
def test_quantized_lm_head_keeps_the_stock_weights(parallel, tied):
    """The LM head built from its spec holds the stock head's weight (tied: the embedding's), so
    every initial weight equals the build that keeps the head stock."""
    from megatron.quant.layers.linear import QuantColumnParallelLinear

    recipe = QuantRecipe.from_dict({"format": BLOCK_FORMAT, "rules": [{"match": {"roles": ["output_layer"]},
                                                                       "format": BLOCK_FORMAT}]})
    models = []
    for each in (QuantRecipe.uniform(BLOCK_FORMAT), recipe):
        torch.manual_seed(0)
        models.append(build_llama_model(transformer_config(), each, vocab_size=VOCAB, max_sequence_length=SEQ,
                                        share_embeddings_and_output_weights=tied))
    stock, quantized = models
    assert type(quantized.output_layer) is QuantColumnParallelLinear and quantized.output_layer.quant is not None
    assert (quantized.output_layer.weight is None) == tied
    assert [n for n, _ in quantized.named_parameters()] == [n for n, _ in stock.named_parameters()]
    assert all(torch.equal(a, b) for a, b in zip(quantized.parameters(), stock.parameters()))


def _pipeline_sites(rank: int, world_size: int) -> list[tuple[str, int]]:
    from megatron.core import parallel_state

    from megatron.quant import cpu

    cpu.init_parallel(pipeline_model_parallel_size=world_size, seed=1)
    config = transformer_config(num_layers=4, pipeline_model_parallel_size=world_size, pipeline_dtype=torch.float32)
    # Untied embeddings: megatron-core syncs tied ones across stages with a hard-coded .cuda().
    model = build_llama_model(config, QuantRecipe.uniform("bf16"), vocab_size=VOCAB, max_sequence_length=SEQ,
                              share_embeddings_and_output_weights=False,
                              pre_process=parallel_state.is_pipeline_first_stage(),
                              post_process=parallel_state.is_pipeline_last_stage())
    sites = sorted({(m.capture_site.module, m.capture_site.layer_idx) for m in model.modules()
                    if getattr(m, "capture_site", None) and m.capture_site.role == "qkv"})
    cpu.destroy_parallel()
    return sites


def test_layer_index_is_global_across_pipeline_stages():
    first, second = run_distributed(_pipeline_sites, 2)
    assert first == [("decoder.layers.0.self_attention.linear_qkv", 0),
                     ("decoder.layers.1.self_attention.linear_qkv", 1)]
    assert second == [("decoder.layers.0.self_attention.linear_qkv", 2),
                      ("decoder.layers.1.self_attention.linear_qkv", 3)]


def test_real_saver_writes_layer_captures(parallel, tmp_path, capture_session):
    from megatron.quant import position, tensor_saver

    model = _build(QuantRecipe.uniform(BLOCK_FORMAT))
    capture_session(iterations=0, layers={0}, save_quantized=True)
    position.set_iteration(0)
    position.set_microbatch(0, 0)
    _loss_and_grads(model)
    tensor_saver.flush()
    names = sorted(p.name.split("_", 3)[3] for p in (tmp_path / BLOCK_FORMAT).glob("*.pt"))
    for expected in ("linear_L0_forward_pre_linear_mxfp8_rank00_sample000_input.pt",
                     "linear_L0_forward_pre_linear_mxfp8_rank00_sample000_input_quantized.pt",
                     "linear_L0_backward_post_linear_mxfp8_rank00_sample000_grad_weight.pt",
                     "attention_L0_forward_pre_FA_mxfp8_rank00_sample000_query_quantized.pt",
                     "attention_L0_backward_post_FA_mxfp8_rank00_sample000_grad_value.pt"):
        assert any(n.endswith(expected) for n in names), expected
    assert not any("_L1_" in n for n in names)
    def by_module(suffix):
        paths = (tmp_path / BLOCK_FORMAT).glob(f"*linear_L0_forward_pre*{suffix}")
        records = (torch.load(p, weights_only=True) for p in paths)
        return {r["metadata"]["module"]: r["tensor"] for r in records}

    inputs, quantized = by_module("_input.pt"), by_module("_input_quantized.pt")
    assert set(inputs) == set(quantized) and len(inputs) == 4  # qkv, proj, fc1, fc2
    fmt = formats.get_format(BLOCK_FORMAT)
    assert all(torch.equal(quantized[m], fmt.quantize(x, axis=-1)) for m, x in inputs.items())
