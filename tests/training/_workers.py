"""Functions run on spawned ranks (tests/_dist.py) by the training tests."""
from __future__ import annotations

import os

import torch

LOGGED = ("iteration", "lm loss", "grad norm", "learning rate")


def train_runs(rank: int, world_size: int, runs: list[tuple[dict, list[str]]]) -> list[list[dict]]:
    """``main(argv)`` under ``env`` for each run in turn; the logged values of every iteration."""
    from megatron.quant.train import main

    histories = []
    for env, argv in runs:
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        try:
            history = main(argv)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        histories.append([{key: h[key] for key in LOGGED} for h in history])
    return histories


def hf_logits(rank: int, world_size: int, hf_dir: str, tokens: torch.Tensor) -> torch.Tensor:
    """Logits of the imported model; at TP>1 this rank's vocabulary shard."""
    from megatron.quant.cpu import init_parallel
    from megatron.quant.recipe import QuantRecipe
    from megatron.quant.training.loading import load_model

    init_parallel(tensor_model_parallel_size=world_size)
    model, _ = load_model(hf_dir, QuantRecipe.from_env())
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    with torch.no_grad():
        return model(tokens, positions, None)


def model_accounting(rank: int, world_size: int, shapes: list[dict], batch: int) -> list[tuple[int, float]]:
    """(parameter count, FLOPs counted by torch on one forward+backward) for each shape."""
    from torch.utils.flop_counter import FlopCounterMode

    from megatron.quant.cpu import init_parallel
    from megatron.quant.recipe import QuantRecipe
    from megatron.quant.training.model import build_gpt, transformer_config

    init_parallel()
    out = []
    for shape in shapes:
        model = build_gpt(transformer_config(shape), shape, QuantRecipe.from_env())
        seq = shape["seq_length"]
        tokens = torch.randint(0, shape["vocab_size"], (batch, seq))
        counter = FlopCounterMode(display=False)
        with counter:
            model(tokens, torch.arange(seq).expand(batch, seq), None, labels=tokens).sum().backward()
        out.append((sum(p.numel() for p in model.parameters()), float(counter.get_total_flops())))
    return out
