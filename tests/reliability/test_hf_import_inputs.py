"""A Hugging Face directory that cannot be imported is one line naming the file and the value
at start: config.json that is not JSON, not an object, lacks a value or holds a wrong one;
safetensors shards that are truncated or random bytes; tensors missing or with shapes that
disagree with config.json (read from the headers, before any process group exists)."""
import json
import os

import pytest
import torch
from safetensors.torch import save_file

from megatron.quant.training.hf_import import HFCheckpointError, check_hf_checkpoint, hf_shape

CONFIG = {"model_type": "llama", "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1,
          "intermediate_size": 16, "num_hidden_layers": 1, "vocab_size": 10, "max_position_embeddings": 32}


def _tensors() -> dict:
    layer = "model.layers.0."
    shapes = {"model.embed_tokens.weight": (10, 8), "model.norm.weight": (8,), "lm_head.weight": (10, 8),
              layer + "self_attn.q_proj.weight": (8, 8), layer + "self_attn.k_proj.weight": (4, 8),
              layer + "self_attn.v_proj.weight": (4, 8), layer + "self_attn.o_proj.weight": (8, 8),
              layer + "mlp.gate_proj.weight": (16, 8), layer + "mlp.up_proj.weight": (16, 8),
              layer + "mlp.down_proj.weight": (8, 16), layer + "input_layernorm.weight": (8,),
              layer + "post_attention_layernorm.weight": (8,)}
    return {name: torch.zeros(shape) for name, shape in shapes.items()}


@pytest.fixture
def hf_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    save_file(_tensors(), str(tmp_path / "model.safetensors"))
    return tmp_path


@pytest.mark.parametrize("config, message", [
    ("{not json", "config.json is not readable JSON (Expecting property name"),
    (b"\xff\xfe", "config.json is not readable JSON"),
    ("[1, 2]", "config.json holds [1, 2], not a JSON object"),
    ({**CONFIG, "hidden_size": None}, "config.json has no 'hidden_size'"),
    ({**CONFIG, "num_attention_heads": 0}, "num_attention_heads is 0; allowed: a positive integer"),
    ({**CONFIG, "num_hidden_layers": "x" * 10_000}, "num_hidden_layers is 'xxxx"),
    ({**CONFIG, "rms_norm_eps": -1}, "rms_norm_eps is -1; allowed: a positive finite number"),
    ({**CONFIG, "rope_scaling": "yes"}, "rope_scaling is 'yes', not an object"),
    ({**CONFIG, "rms_norm_eps": 10**400}, "rms_norm_eps is 1000"),
    ({**CONFIG, "hidden_size": 10**400, "head_dim": 1}, "head_dim 1 x heads 2 != hidden_size 1000"),
])
def test_bad_config_is_one_bounded_line(hf_dir, config, message):
    path = hf_dir / "config.json"
    path.write_bytes(config if isinstance(config, bytes) else
                     (config if isinstance(config, str) else json.dumps(config)).encode())
    with pytest.raises(HFCheckpointError) as error:
        hf_shape(str(hf_dir))
    text = str(error.value)
    assert message in text and "\n" not in text and len(text) < 400, text


def _truncate(path):
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) // 2)


@pytest.mark.parametrize("damage, message", [
    (lambda d: _truncate(d / "model.safetensors"), "model.safetensors is not a readable safetensors file"),
    (lambda d: (d / "model.safetensors").write_bytes(os.urandom(512)), "is not a readable safetensors file"),
    (lambda d: save_file({k: v for k, v in _tensors().items() if "down_proj" not in k}, str(d / "model.safetensors")),
     "'model.layers.0.mlp.down_proj.weight' is missing from the safetensors files"),
    (lambda d: save_file({**_tensors(), "model.layers.0.self_attn.k_proj.weight": torch.zeros(8, 8)},
                         str(d / "model.safetensors")),
     "model.layers.0.self_attn.k_proj.weight in "),
    (lambda d: (d / "config.json").write_text(json.dumps({**CONFIG, "num_hidden_layers": 10**15})),
     "'model.layers.1.self_attn.q_proj.weight' is missing"),  # stops at the first missing layer
])
def test_damaged_or_mismatched_weights_are_found_from_the_headers(hf_dir, damage, message):
    damage(hf_dir)
    with pytest.raises(HFCheckpointError) as error:
        check_hf_checkpoint(str(hf_dir), hf_shape(str(hf_dir)))
    assert message in str(error.value), error.value


def test_intact_directory_passes_and_the_trainer_refuses_a_mismatch_at_start(hf_dir, capsys):
    from megatron.quant.training.main import main

    check_hf_checkpoint(str(hf_dir), dict(hf_shape(str(hf_dir)), untie_embeddings_and_output_weights=True))
    save_file({**_tensors(), "model.layers.0.mlp.up_proj.weight": torch.zeros(12, 8)},
              str(hf_dir / "model.safetensors"))
    with pytest.raises(SystemExit) as exc:
        main(["--hf-checkpoint", str(hf_dir), "--mock-data", "--train-iters", "1", "--check-args"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1, err
    assert "model.layers.0.mlp.up_proj.weight in" in err and "has shape [12, 8], but config.json" in err and \
        "give [16, 8]" in err
