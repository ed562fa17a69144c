"""Forward hooks capture what the modules really saw: checked by chaining layers and by
recomputing a linear layer, on a megatron-core GPTModel (stock local spec, no quantization)."""
import numpy as np
import pytest
import torch

from megatron.quant.compare.layer_io import capture_layer_io, resolve_targets

VOCAB, SEQ, BATCH = 64, 8, 2


@pytest.fixture(scope="module")
def model():
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron.quant import cpu

    cpu.init_parallel(seed=5)
    config = TransformerConfig(
        num_layers=3, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=64,
        normalization="RMSNorm", gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        add_bias_linear=False, use_cpu_initialization=True, attention_dropout=0.0, hidden_dropout=0.0)
    return GPTModel(config, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=VOCAB,
                    max_sequence_length=SEQ, position_embedding_type="rope").eval()


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))


def test_layer_output_is_next_layer_input_batch_first(model, tokens):
    captured = capture_layer_io(model, tokens, resolve_targets([0, 1, -1], None, 3))
    assert list(captured) == ["L0", "L1", "L2"]
    inp0, out0 = captured["L0"]
    assert inp0.shape == out0.shape == (BATCH, SEQ, 32) and inp0.dtype == np.float32
    np.testing.assert_array_equal(out0, captured["L1"][0])
    np.testing.assert_array_equal(captured["L1"][1], captured["L2"][0])
    # Layer 0's input is the embedding of the tokens (word embeddings, no learned positions).
    expected = model.embedding.word_embeddings.weight.detach()[tokens].numpy()
    np.testing.assert_array_equal(inp0, expected)


def test_linear_submodule_output_is_its_matmul(model, tokens):
    target = resolve_targets([1], "mlp.linear_fc1", 3)
    (inp, out), = capture_layer_io(model, tokens, target).values()
    weight = model.decoder.layers[1].mlp.linear_fc1.weight.detach().numpy()
    np.testing.assert_allclose(out, inp @ weight.T, rtol=1e-5, atol=1e-6)


def test_submodule_aliases_and_labels():
    attention, = resolve_targets([0], "attention", 3)
    assert (attention.module_path, attention.label) == ("decoder.layers.0.self_attention", "L0_self_attention")
    mlp = resolve_targets([-1, 2], "mlp", 3)
    assert [t.module_path for t in mlp] == ["decoder.layers.2.mlp"]  # -1 and 2 are the same layer


@pytest.mark.parametrize("layer", [3, -4])
def test_layer_out_of_range_is_a_clear_error(layer):
    with pytest.raises(ValueError, match=rf"--layers {layer} is out of range: the model has 3 layers"):
        resolve_targets([layer], None, 3)


def test_unknown_submodule_lists_the_layer_children(model, tokens):
    with pytest.raises(ValueError, match=r"no module 'decoder.layers.0.attn'.*self_attention"):
        capture_layer_io(model, tokens, resolve_targets([0], "attn", 3))
