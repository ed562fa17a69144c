"""HF Llama import gives HF's logits (TP 1 and 2); parameter and FLOP accounting match the model."""
import pytest
import torch

from megatron.quant.training import metrics
from megatron.quant.training.presets import get_preset
from tests.training.conftest import HF_VOCAB, accounting_shapes


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tied", "untied_llama3_rope"])
def test_hf_import_matches_hf_logits(one_rank, hf_models, name):
    expected = hf_models[name][2]
    torch.testing.assert_close(one_rank[f"hf_{name}"][..., :HF_VOCAB], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_hf_import_at_tensor_parallel_2(two_ranks, hf_models):
    expected = hf_models["untied_llama3_rope"][2]
    # Vocab-parallel output: rank r holds the r-th slice of the (padded) vocabulary.
    ours = torch.cat([rank["hf_tp2"] for rank in two_ranks], dim=-1)
    torch.testing.assert_close(ours[..., :HF_VOCAB], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tied", "untied"])
def test_parameter_and_flop_formulas_match_the_built_model(one_rank, name):
    shape = accounting_shapes()[name]
    params, counted_flops = one_rank[f"accounting_{name}"]
    assert metrics.num_parameters(shape) == params
    # torch's FlopCounterMode over one forward+backward of a batch of 2 is the oracle.
    expected = metrics.flops_per_iteration(shape, global_batch_size=2, seq_length=shape["seq_length"],
                                           vocab_size=shape["vocab_size"])
    assert counted_flops == pytest.approx(expected, rel=1e-9)


def test_hf_config_with_other_llama3_rope_constants_is_refused(tmp_path):
    import json

    from megatron.quant.training.hf_import import hf_shape

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_attention_heads": 4, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "vocab_size": 10, "max_position_embeddings": 32,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 16}}))
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        hf_shape(str(tmp_path))


def test_peak_table_lookup_prefers_the_specific_variant():
    assert metrics.peak_tflops("NVIDIA H100 PCIe") == metrics.PEAK_BF16_TFLOPS["H100 PCIe"]
    assert metrics.peak_tflops("NVIDIA H100 80GB HBM3") == metrics.PEAK_BF16_TFLOPS["H100"]
    assert metrics.peak_tflops(None) is None and metrics.peak_tflops("some CPU") is None
    assert metrics.peak_tflops(None, override=123.0) == 123.0


def test_memory_estimate_scales_with_parallelism():
    shape = get_preset("llama3.2-1b")
    n = metrics.num_parameters(shape)
    common = dict(num_parameters=n, micro_batch_size=1, seq_length=4096, pipeline_parallel=1, precision="bf16")
    one = metrics.memory_estimate_gb(shape, tensor_parallel=1, data_parallel=8, distributed_optimizer=False, **common)
    two = metrics.memory_estimate_gb(shape, tensor_parallel=2, data_parallel=8, distributed_optimizer=True, **common)
    assert one["parameters"] == pytest.approx(n * 2 / 1e9)
    assert two["parameters"] == pytest.approx(one["parameters"] / 2)
    assert two["optimizer"] == pytest.approx(one["optimizer"] / 2 / 8)
    assert two["activations"] < one["activations"]


def test_capture_digest_picks_the_worst_entries():
    digest = metrics.capture_digest({
        "capture/records": 3.0, "capture/wait_s": 0.5,
        "quant/qkv/input/overflow_ratio": 0.1, "quant/fc1/weight/overflow_ratio": 0.3,
        "quant/qkv/input/underflow_ratio": 0.0, "quant/qkv/input/sqnr_db": 20.0, "quant/fc2/input/sqnr_db": 10.0})
    assert digest == {"captures": 3, "saver wait (s)": 0.5, "max overflow_ratio": "0.3 (fc1/weight)",
                      "max underflow_ratio": "0 (qkv/input)", "min sqnr_db": "10 (fc2/input)"}
    assert metrics.capture_digest({}) == {}
