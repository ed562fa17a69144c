"""Captures from the real quantized Llama layers: one training iteration of a tiny model."""
import json
from pathlib import Path

import pytest
import torch

from megatron.quant import position, tensor_saver
from megatron.quant.capture.naming import parse_file_name

LINEAR_NAMES = {("forward", "pre"): {"input", "weight"}, ("forward", "post"): {"output"},
                ("backward", "pre"): {"grad_output", "weight"}, ("backward", "post"): {"grad_input", "grad_weight"}}
ATTENTION_NAMES = {("forward", "pre"): {"query", "key", "value"}, ("forward", "post"): {"output"},
                   ("backward", "pre"): {"grad_output"}, ("backward", "post"): {"grad_query", "grad_key", "grad_value"}}


@pytest.fixture(scope="module")
def tiny_llama():
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron.quant import cpu
    from megatron.quant.layers.spec import build_llama_model
    from megatron.quant.recipes.recipe import QuantRecipe

    cpu.init_parallel(seed=5)
    config = TransformerConfig(num_layers=2, hidden_size=128, ffn_hidden_size=256, num_attention_heads=4,
                               num_query_groups=2, normalization="RMSNorm", gated_linear_unit=True,
                               activation_func=torch.nn.functional.silu, add_bias_linear=False,
                               use_cpu_initialization=True, attention_dropout=0.0, hidden_dropout=0.0)
    recipe = QuantRecipe.uniform("mxfp8")
    yield build_llama_model(config, recipe, vocab_size=128, max_sequence_length=32), recipe
    cpu.destroy_parallel()


def test_real_layers_capture_a_complete_iteration(tmp_path, tiny_llama, capture_session):
    model, recipe = tiny_llama
    capture_session(iterations="0")
    position.set_iteration(0)
    for mb in range(2):
        position.set_microbatch(mb, 2 * mb)
        tokens = torch.randint(0, 128, (2, 32))
        model(tokens, torch.arange(32).expand(2, 32), None, labels=tokens).float().mean().backward()
    tensor_saver.close()

    directory = Path(tmp_path, recipe.name)
    entries = [json.loads(line) for line in Path(directory, "manifest-rank00.jsonl").read_text().splitlines()]
    assert sorted(e["file"] for e in entries) == sorted(p.name for p in directory.glob("*.pt"))
    seen: dict[tuple, set] = {}
    for entry in entries:
        fields = parse_file_name(entry["file"])
        saved = torch.load(Path(directory, entry["file"]), weights_only=True)
        meta = saved["metadata"]
        assert all(meta[key] == value for key, value in fields.items() if key not in ("timestamp", "counter"))
        assert list(saved["tensor"].shape) == meta["shape"] and meta == entry["metadata"]
        assert ("overflow" in meta["stats"]) == (meta["format"] is not None)
        seen.setdefault((meta["module"], meta["microbatch"]), set()).add(
            (meta["operation"], meta["phase"], meta["tensor_name"]))
    modules = {module for module, _ in seen}
    assert {m.rsplit(".", 1)[-1] for m in modules} >= {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2",
                                                       "core_attention"}
    for (module, _), names in seen.items():
        expected = ATTENTION_NAMES if module.endswith("core_attention") else LINEAR_NAMES
        assert names == {(op, ph, n) for (op, ph), ns in expected.items() for n in ns}, module
    assert {mb for _, mb in seen} == {0, 1}
