"""Hugging Face Llama (local directory: config.json + safetensors) -> megatron-core GPTModel weights.

Layout differences handled here:
- q/k/v are fused into ``linear_qkv`` grouped per KV head: for each query group, its query
  heads, then its key head, then its value head (megatron's GQA layout), so a contiguous
  row slice per tensor-parallel rank holds whole groups;
- gate/up are fused into ``linear_fc1`` as [gate; up] per tensor-parallel shard;
- the vocabulary is padded with zero rows up to the model's (padded) vocabulary size.
"""
from __future__ import annotations

import glob
import json
import math
import os
from typing import Any, Callable, Iterator, Mapping

import torch

from megatron.quant.formats.show import show_value
from megatron.quant.training.checkpoint_files import first_line

# megatron-core's RotaryEmbedding applies Llama 3.1 scaling with these fixed values.
_MEGATRON_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


class HFCheckpointError(ValueError):
    """A Hugging Face directory that cannot be imported; the message names the file and the value."""


def _read_config(path: str) -> dict:
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"{path!r} is not a Hugging Face model directory: no config.json")
    try:
        with open(config_file, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError, RecursionError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise HFCheckpointError(f"{config_file} is not readable JSON ({first_line(error)})") from None
    if not isinstance(config, dict):
        raise HFCheckpointError(f"{config_file} holds {show_value(config)}, not a JSON object")
    return config


def _number(cfg: dict, key: str, path: str, kind: type = int, default: Any = None) -> Any:
    """``cfg[key]``: a positive int (``kind`` int) or a positive finite number (float); HFCheckpointError
    naming config.json, the key and the value otherwise."""
    config_file = os.path.join(path, "config.json")
    value = cfg.get(key)
    if value is None:
        value = default
    if value is None:
        raise HFCheckpointError(f"{config_file} has no {key!r}; a Llama config.json needs it")
    valid = not isinstance(value, bool) and (isinstance(value, int) if kind is int else isinstance(value, (int, float)))
    try:
        number = kind(value) if valid else None
    except OverflowError:  # an integer beyond any float
        number = None
    if number is None or (isinstance(number, float) and not math.isfinite(number)) or number <= 0:
        allowed = "a positive integer" if kind is int else "a positive finite number"
        raise HFCheckpointError(f"{config_file}: {key} is {show_value(value)}; allowed: {allowed}")
    return number


def is_hf_directory(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json")) and bool(glob.glob(os.path.join(path, "*.safetensors")))


def hf_shape(path: str) -> dict:
    """Preset-style shape of the Llama in ``path``; HFCheckpointError for other architectures or a
    config.json that lacks a value or holds a wrong one."""
    cfg = _read_config(path)
    if cfg.get("model_type") != "llama":
        raise HFCheckpointError(f"{path!r} holds model_type {show_value(cfg.get('model_type'))}; only 'llama' is "
                                "supported")
    hidden, heads = _number(cfg, "hidden_size", path), _number(cfg, "num_attention_heads", path)
    head_dim = _number(cfg, "head_dim", path, default=hidden // heads or 1)
    if head_dim * heads != hidden:
        raise HFCheckpointError(f"head_dim {show_value(head_dim)} x heads {show_value(heads)} != hidden_size "
                                f"{show_value(hidden)}: "
                                "megatron's Llama layout needs them equal")
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise HFCheckpointError(f"{os.path.join(path, 'config.json')}: rope_scaling is {show_value(rope)}, "
                                "not an object")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise HFCheckpointError(f"RoPE scaling type {show_value(rope_type)} is not supported (only default and llama3)")
    if rope_type == "llama3":
        fixed = {key: rope.get(key, value) for key, value in _MEGATRON_LLAMA3_ROPE.items()}
        if fixed != _MEGATRON_LLAMA3_ROPE:
            raise HFCheckpointError(f"llama3 RoPE scaling {show_value(fixed)} differs from megatron-core's fixed "
                                    f"{_MEGATRON_LLAMA3_ROPE} (only the factor is configurable)")
    max_positions = _number(cfg, "max_position_embeddings", path)
    return dict(
        num_layers=_number(cfg, "num_hidden_layers", path), hidden_size=hidden,
        ffn_hidden_size=_number(cfg, "intermediate_size", path), num_attention_heads=heads,
        num_query_groups=_number(cfg, "num_key_value_heads", path, default=heads),
        vocab_size=_number(cfg, "vocab_size", path), seq_length=min(max_positions, 8192),
        max_position_embeddings=max_positions,
        rotary_base=_number(cfg, "rope_theta", path, float, default=rope.get("rope_theta", 10000.0)),
        rope_scaling_factor=_number(rope, "factor", path, float) if rope_type == "llama3" else None,
        untie_embeddings_and_output_weights=not cfg.get("tie_word_embeddings", False),
        norm_epsilon=_number(cfg, "rms_norm_eps", path, float, default=1e-5))


def _safetensors_files(path: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path!r}")
    return files


def _tensor_index(path: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensor name -> (file, shape) from every shard's header, without reading a tensor;
    HFCheckpointError naming a shard that is truncated, random bytes or otherwise no safetensors file."""
    from safetensors import SafetensorError, safe_open

    index = {}
    for file in _safetensors_files(path):
        try:
            with safe_open(file, framework="pt") as f:
                index.update({key: (file, tuple(f.get_slice(key).get_shape())) for key in f.keys()})
        except (SafetensorError, OSError) as error:
            raise HFCheckpointError(f"{file} is not a readable safetensors file ({first_line(error)})") from None
    return index


def _hf_shapes(shape: Mapping, vocab: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor name a Llama of ``shape`` needs in its HF checkpoint, with its shape (``vocab``: the
    checkpoint's own vocabulary, padded only when imported), layer by layer: a checker stops at the
    first one missing, however many layers config.json claims."""
    hidden, ffn = shape["hidden_size"], shape["ffn_hidden_size"]
    head_dim = hidden // shape["num_attention_heads"]
    kv = shape["num_query_groups"] * head_dim
    yield from {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}.items()
    if shape["untie_embeddings_and_output_weights"]:
        yield "lm_head.weight", (vocab, hidden)
    for i in range(shape["num_layers"]):
        layer = f"model.layers.{i}."
        yield from {
            layer + "self_attn.q_proj.weight": (hidden, hidden), layer + "self_attn.k_proj.weight": (kv, hidden),
            layer + "self_attn.v_proj.weight": (kv, hidden), layer + "self_attn.o_proj.weight": (hidden, hidden),
            layer + "mlp.gate_proj.weight": (ffn, hidden), layer + "mlp.up_proj.weight": (ffn, hidden),
            layer + "mlp.down_proj.weight": (hidden, ffn), layer + "input_layernorm.weight": (hidden,),
            layer + "post_attention_layernorm.weight": (hidden,)}.items()


def check_hf_checkpoint(path: str, shape: Mapping) -> None:
    """Every tensor the import reads is present with the shape the model has (``shape``: ``hf_shape``'s
    under any explicit flags; the vocabulary config.json's), read from the safetensors headers only:
    HFCheckpointError naming the first missing or misshapen tensor, or the damaged shard, before any
    process group exists."""
    index = _tensor_index(path)
    for name, expected in _hf_shapes(shape, _number(_read_config(path), "vocab_size", path)):
        if name not in index:
            raise HFCheckpointError(f"{name!r} is missing from the safetensors files in {path!r}")
        file, found = index[name]
        if found != expected:
            raise HFCheckpointError(f"{name} in {file} has shape {list(found)}, but config.json (and the shape "
                                    f"flags) give {list(expected)}")


def _tensor_reader(path: str) -> Callable[[str], torch.Tensor]:
    """Reads one named tensor at a time across all safetensors shards (keeps memory flat)."""
    from safetensors import safe_open

    index = _tensor_index(path)

    def read(name: str) -> torch.Tensor:
        if name not in index:
            raise HFCheckpointError(f"{name!r} is missing from the safetensors files in {path!r}")
        with safe_open(index[name][0], framework="pt") as f:
            return f.get_tensor(name)

    return read


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, groups: int) -> torch.Tensor:
    """[q; k; v] (HF) -> megatron's per-group [q heads of group g, k_g, v_g] rows."""
    head_dim = q.shape[0] // heads
    per_group = heads // groups
    q = q.view(groups, per_group * head_dim, -1)
    k = k.view(groups, head_dim, -1)
    v = v.view(groups, head_dim, -1)
    return torch.cat([q, k, v], dim=1).reshape(-1, q.shape[-1])


def _shard(t: torch.Tensor, dim: int, rank: int, size: int) -> torch.Tensor:
    return torch.chunk(t, size, dim=dim)[rank].clone()


def _pad_vocab(t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    if t.shape[0] > vocab_size:
        raise ValueError(f"checkpoint vocabulary {t.shape[0]} exceeds the model's {vocab_size}")
    return torch.cat([t, t.new_zeros(vocab_size - t.shape[0], t.shape[1])]) if t.shape[0] < vocab_size else t


def megatron_state_dict(path: str, shape: Mapping, *, vocab_size: int, model_keys: set[str],
                        tp_rank: int = 0, tp_size: int = 1) -> dict[str, torch.Tensor]:
    """This tensor-parallel rank's GPTModel state dict from the HF checkpoint in ``path``.

    ``model_keys``: the target model's state-dict keys; they decide whether norms live in
    separate modules (local spec) or inside the following linear (``layer_norm_weight``).
    """
    read = _tensor_reader(path)
    heads, groups = shape["num_attention_heads"], shape["num_query_groups"]
    out = {
        "embedding.word_embeddings.weight": _shard(_pad_vocab(read("model.embed_tokens.weight"), vocab_size),
                                                   0, tp_rank, tp_size),
        "decoder.final_layernorm.weight": read("model.norm.weight"),
    }
    if shape["untie_embeddings_and_output_weights"]:
        out["output_layer.weight"] = _shard(_pad_vocab(read("lm_head.weight"), vocab_size), 0, tp_rank, tp_size)
    for i in range(shape["num_layers"]):
        hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
        qkv = fuse_qkv(read(hf + "self_attn.q_proj.weight"), read(hf + "self_attn.k_proj.weight"),
                       read(hf + "self_attn.v_proj.weight"), heads, groups)
        gate, up = read(hf + "mlp.gate_proj.weight"), read(hf + "mlp.up_proj.weight")
        out[mg + "self_attention.linear_qkv.weight"] = _shard(qkv, 0, tp_rank, tp_size)
        out[mg + "self_attention.linear_proj.weight"] = _shard(read(hf + "self_attn.o_proj.weight"),
                                                               1, tp_rank, tp_size)
        out[mg + "mlp.linear_fc1.weight"] = torch.cat([_shard(gate, 0, tp_rank, tp_size),
                                                       _shard(up, 0, tp_rank, tp_size)])
        out[mg + "mlp.linear_fc2.weight"] = _shard(read(hf + "mlp.down_proj.weight"), 1, tp_rank, tp_size)
        for hf_norm, separate, fused in (
                ("input_layernorm", "input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight"),
                ("post_attention_layernorm", "pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight")):
            key = mg + (fused if mg + fused in model_keys else separate)
            out[key] = read(f"{hf}{hf_norm}.weight")
    return out


def load_hf_weights(model: torch.nn.Module, path: str, shape: Mapping) -> None:
    """Copy the HF checkpoint in ``path`` into ``model`` (an unwrapped GPTModel) on this TP rank."""
    from megatron.core import parallel_state

    if parallel_state.get_pipeline_model_parallel_world_size() > 1:
        raise ValueError("importing a Hugging Face checkpoint needs --pipeline-model-parallel-size 1; "
                         "import with PP 1 and --save, then --load with --no-load-rng at the new layout")
    own = model.state_dict()
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    vocab_size = own["embedding.word_embeddings.weight"].shape[0] * tp_size
    state = megatron_state_dict(path, shape, vocab_size=vocab_size, model_keys=set(own),
                                tp_rank=parallel_state.get_tensor_model_parallel_rank(),
                                tp_size=tp_size)
    missing = [k for k in own if k not in state and not k.endswith("_extra_state")]
    if missing:
        raise ValueError(f"the HF checkpoint in {path!r} gives no value for {missing[:5]}")
    for key, value in state.items():
        if own[key].shape != value.shape:
            raise ValueError(f"{key}: checkpoint shape {tuple(value.shape)} != model shape {tuple(own[key].shape)}")
    model.load_state_dict(state, strict=False)
