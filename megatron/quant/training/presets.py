"""Published Llama shapes, keyed by ``--model``; explicit command-line arguments override them.

Keys are the argparse destinations of Megatron-LM's argument names (``--num-layers`` ->
``num_layers``), plus ``vocab_size`` (Megatron takes it from the tokenizer; a preset gives it
for mock data and random-init models).
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

_LLAMA3 = dict(
    normalization="RMSNorm", swiglu=True, norm_epsilon=1e-5, group_query_attention=True,
)
# The GPU study's models: Llama 3 blocks, the study's own 8,192-token vocabulary, 512 positions, untied.
_STUDY = dict(_LLAMA3, vocab_size=8192, seq_length=512, max_position_embeddings=512, rotary_base=10000.0,
              rope_scaling_factor=None, untie_embeddings_and_output_weights=True)

PRESETS: Mapping[str, Mapping] = MappingProxyType({
    # https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json
    "llama3.2-1b": MappingProxyType(dict(
        _LLAMA3, num_layers=16, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=32,
        num_query_groups=8, vocab_size=128256, seq_length=8192, max_position_embeddings=131072,
        rotary_base=500000.0, rope_scaling_factor=32.0, untie_embeddings_and_output_weights=False,
    )),
    # https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json
    "llama3.1-8b": MappingProxyType(dict(
        _LLAMA3, num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
        num_query_groups=8, vocab_size=128256, seq_length=8192, max_position_embeddings=131072,
        rotary_base=500000.0, rope_scaling_factor=8.0, untie_embeddings_and_output_weights=True,
    )),
    # CPU-sized: at TP=2 every sharded dimension (hidden/2, ffn/2, heads*head_dim/2, kv dims/2)
    # is a multiple of 64, so block formats (32/16-element blocks) never straddle a shard.
    "llama-tiny": MappingProxyType(dict(
        _LLAMA3, num_layers=2, hidden_size=256, ffn_hidden_size=768, num_attention_heads=4,
        num_query_groups=2, vocab_size=512, seq_length=128, max_position_embeddings=128,
        rotary_base=10000.0, rope_scaling_factor=None, untie_embeddings_and_output_weights=False,
    )),
    # The GPU study's model (docs/study/plan.yaml): Quartet-II's 30M Llama (6 layers, hidden 640)
    # at half the width, 7.6M parameters outside the embeddings, so that a run of 20 tokens per
    # parameter fits about 2 minutes of one H100 (the plan's estimate). Every GEMM dimension is a
    # multiple of 64: 32-element MX blocks and 16x16 NVFP4 tiles never straddle a boundary.
    "llama-study-8m": MappingProxyType(dict(
        _STUDY, num_layers=6, hidden_size=320, ffn_hidden_size=896, num_attention_heads=5, num_query_groups=5,
    )),
    # The first GPU tier's candidate sizes (docs/study/first-tier.yaml): the study model narrowed until a
    # run of 20 tokens per parameter finishes in well under a minute; the tier measures two of them on the
    # device and keeps the largest whose 15 runs fit (training/study_sizing.py). GEMM dimensions are
    # multiples of 64, as above.
    "llama-study-0.4m": MappingProxyType(dict(
        _STUDY, num_layers=2, hidden_size=128, ffn_hidden_size=384, num_attention_heads=2, num_query_groups=2,
    )),
    "llama-study-1m": MappingProxyType(dict(
        _STUDY, num_layers=4, hidden_size=128, ffn_hidden_size=384, num_attention_heads=2, num_query_groups=2,
    )),
    "llama-study-2m": MappingProxyType(dict(
        _STUDY, num_layers=4, hidden_size=192, ffn_hidden_size=512, num_attention_heads=3, num_query_groups=3,
    )),
    "llama-study-3m": MappingProxyType(dict(
        _STUDY, num_layers=4, hidden_size=256, ffn_hidden_size=640, num_attention_heads=4, num_query_groups=4,
    )),
})

SHAPE_KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
              "num_query_groups", "vocab_size", "seq_length", "max_position_embeddings",
              "rotary_base", "rope_scaling_factor", "untie_embeddings_and_output_weights",
              "norm_epsilon")


def get_preset(name: str) -> dict:
    """A copy of preset ``name``; ValueError names the valid presets."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; valid presets: {', '.join(PRESETS)}")
    return dict(PRESETS[name])
