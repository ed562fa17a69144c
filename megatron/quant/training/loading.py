"""Build a ready model from a preset, one of our checkpoints, or a local Hugging Face Llama."""
from __future__ import annotations

import os

import torch

from megatron.quant.training import checkpoint, hf_import
from megatron.quant.training.model import PRECISIONS, build_gpt, transformer_config
from megatron.quant.training.presets import PRESETS, SHAPE_KEYS, get_preset
from megatron.quant.training.tokenizers import VOCAB_DIVISOR, padded_vocab_size

_PRECISION_OF = {dtype: name for name, dtype in PRECISIONS.items()}


def _ensure_parallel() -> None:
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        from megatron.quant.cpu import init_parallel

        init_parallel()


def _shape_of(source: str) -> tuple[str, dict]:
    """(kind, shape) with kind "preset" | "checkpoint" | "hf"; ValueError for anything else."""
    if source.startswith("preset:"):
        return "preset", get_preset(source.removeprefix("preset:"))
    if os.path.isdir(source):
        if hf_import.is_hf_directory(source):
            return "hf", hf_import.hf_shape(source)
        try:
            return "checkpoint", checkpoint.read_run_config(source)["shape"]
        except FileNotFoundError:
            pass
    raise ValueError(f"cannot load a model from {source!r}: expected 'preset:NAME' (NAME in "
                     f"{', '.join(PRESETS)}), a checkpoint directory written by megatron-quant-train, "
                     "or a local Hugging Face Llama directory (config.json + *.safetensors)")


def load_model(source: str, recipe, *, seed: int = 0, params_dtype: torch.dtype = torch.float32):
    """``(model, shape)``: a GPTModel in eval mode with ``recipe``'s quantized layers.

    ``source``: ``"preset:NAME"`` (random init from ``seed``), a checkpoint directory of ours
    (the run root or one ``iter_*`` directory), or a local Hugging Face Llama directory.
    Initialises a single-process parallel state when none exists; otherwise uses the
    current tensor-parallel layout.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from megatron.quant.layers.spec import precision_config

    if params_dtype not in _PRECISION_OF:
        raise ValueError(f"params_dtype {params_dtype} is not supported; valid: {list(_PRECISION_OF)}")
    kind, shape = _shape_of(source)
    shape = {key: shape.get(key) for key in SHAPE_KEYS}
    _ensure_parallel()
    torch.manual_seed(seed)  # also when the parallel state existed already
    model_parallel_cuda_manual_seed(seed)
    tp = parallel_state.get_tensor_model_parallel_world_size()
    config = transformer_config(shape, precision=_PRECISION_OF[params_dtype], tensor_parallel=tp,
                                quant_recipe=precision_config(recipe))
    vocab = padded_vocab_size(shape["vocab_size"], VOCAB_DIVISOR, tp) if kind == "hf" else shape["vocab_size"]
    model = build_gpt(config, shape, vocab_size=vocab)
    if kind == "hf":
        hf_import.load_hf_weights(model, source, shape)
    elif kind == "checkpoint":
        checkpoint.load_checkpoint(source, model, restore_rng=False)
    return model.eval(), shape
