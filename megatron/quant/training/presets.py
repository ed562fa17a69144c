"""Published Llama shapes, keyed by ``--model``; explicit command-line arguments override them.

Keys are the argparse destinations of Megatron-LM's argument names (``--num-layers`` ->
``num_layers``), plus ``vocab_size`` (Megatron takes it from the tokenizer; a preset gives it
for mock data and random-init models).
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from megatron.quant.training.mla import MLA_SHAPE_DEFAULTS
from megatron.quant.training.moe import MOE_SHAPE_DEFAULTS

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
    # device and keeps the largest whose 15 runs fit (lab/study_sizing.py). GEMM dimensions are
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
    # Mixtures of experts (training/moe.py): Llama 3 attention, megatron-core's MoE layers.
    # CPU-sized, trains in seconds: 4 routed experts (top-2) and one shared expert in each of 2 layers;
    # at TP or expert TP 2 every shard is a multiple of 64, as in llama-tiny.
    "llama-moe-tiny": MappingProxyType(dict(
        _LLAMA3, num_layers=2, hidden_size=128, ffn_hidden_size=256, num_attention_heads=4, num_query_groups=2,
        vocab_size=512, seq_length=128, max_position_embeddings=128, rotary_base=10000.0, rope_scaling_factor=None,
        untie_embeddings_and_output_weights=False, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=128,
        moe_shared_expert_intermediate_size=128,
    )),
    # DeepSeek-V3 (https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json) at a size one H100
    # trains. Its MoE: fine-grained experts, top-8 of 256, one shared expert, the first 3 of 61 layers dense,
    # sigmoid scores; here 64 experts, top-6, the first layer dense. Its multi-latent attention (training/mla.py):
    # V3's head sizes (128 + a 64-wide RoPE part, values 128) and latents scaled with the width (V3: queries
    # 1536, keys/values 512 at hidden 7168), plain RoPE as V3's pre-training at 4K context.
    "deepseek-v3-small": MappingProxyType(dict(
        _LLAMA3, num_layers=8, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16, num_query_groups=16,
        vocab_size=129280, seq_length=2048, max_position_embeddings=4096, rotary_base=10000.0,
        rope_scaling_factor=None, untie_embeddings_and_output_weights=True, num_experts=64, moe_router_topk=6,
        moe_ffn_hidden_size=256, moe_shared_expert_intermediate_size=256, moe_layer_freq=(0,) + (1,) * 7,
        moe_router_score_function="sigmoid", multi_latent_attention=True, q_lora_rank=256, kv_lora_rank=128,
        qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128,
    )),
    # Qwen3-MoE (https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json: 128 experts, top-8, no
    # shared expert, every layer MoE, GQA 32/4) at a size one H100 trains: 64 experts, top-8.
    "qwen3-moe-small": MappingProxyType(dict(
        _LLAMA3, num_layers=8, hidden_size=1024, ffn_hidden_size=3072, num_attention_heads=16, num_query_groups=4,
        vocab_size=151936, seq_length=2048, max_position_embeddings=4096, rotary_base=1000000.0,
        rope_scaling_factor=None, untie_embeddings_and_output_weights=True, num_experts=64, moe_router_topk=8,
        moe_ffn_hidden_size=384,
    )),
})

MOE_KEYS = tuple(MOE_SHAPE_DEFAULTS)  # a dense shape leaves them unset
MLA_KEYS = tuple(MLA_SHAPE_DEFAULTS)  # a GQA shape leaves them unset
SHAPE_KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
              "num_query_groups", "vocab_size", "seq_length", "max_position_embeddings",
              "rotary_base", "rope_scaling_factor", "untie_embeddings_and_output_weights",
              "norm_epsilon") + MOE_KEYS + MLA_KEYS


def get_preset(name: str) -> dict:
    """A copy of preset ``name``; ValueError names the valid presets."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; valid presets: {', '.join(PRESETS)}")
    return dict(PRESETS[name])
