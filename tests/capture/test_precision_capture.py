"""A precision file with three matchers (attention in bf16, fc1/fc2 in te-nvfp4, the rest te-mxfp8) gives
those formats per module in a tiny Llama: the capture manifest shows each module's."""
import json
from pathlib import Path

import pytest
import torch

from megatron.quant import position, tensor_saver
from megatron.quant.layers.spec import build_llama_model
from megatron.quant.recipes.precision_file import load_precision_file
from tests._parallel import parallel  # noqa: F401
from tests.layers._helpers import transformer_config
from tests.recipes.test_precision_file import THREE_MATCHERS

EXPECTED = {"linear_qkv": None, "linear_proj": None, "core_attention": None,  # attention: bf16
            "linear_fc1": "nvfp4", "linear_fc2": "nvfp4",                       # te-nvfp4
            "output_layer": None}  # te-mxfp8 is scope linear: the LM head is quantized by no rule


@pytest.mark.usefixtures("parallel")
def test_each_module_gets_its_matched_format(tmp_path, capture_session):
    path = tmp_path / "three.yaml"
    path.write_text(THREE_MATCHERS.replace("te-mxfp8, name: rest", "te-mxfp8, name: rest, "
                                           "rules: [{match: {roles: [output_layer]}, format: mxfp8}]"))
    precision = load_precision_file(path)
    torch.manual_seed(0)
    model = build_llama_model(transformer_config(), precision, vocab_size=128, max_sequence_length=32)
    capture_session(tmp_path / "captures", iterations="0", mode="stats")
    position.set_iteration(0)
    position.set_microbatch(0, 0)
    tokens = torch.randint(0, 128, (2, 32))
    model(tokens, torch.arange(32).expand(2, 32), None, labels=tokens).float().mean().backward()
    tensor_saver.close()
    manifest = Path(tmp_path, "captures", "three", "manifest-rank00.jsonl").read_text().splitlines()
    formats = {}
    for entry in map(json.loads, manifest):
        meta = entry["metadata"]
        if meta["operation"] == "forward" and meta["phase"] == "pre" and meta["tensor_name"] in ("input", "query"):
            formats[meta["module"]] = meta["format"] and meta["format"]["name"]
    assert formats["output_layer"] == "mxfp8_e4m3"  # the rest: te-mxfp8 (its rule puts the LM head in MXFP8)
    del formats["output_layer"]
    assert {module: EXPECTED[module.rsplit(".", 1)[-1]] for module in formats} == formats
    assert len(formats) == 2 * 5
