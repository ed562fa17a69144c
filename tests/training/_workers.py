"""Work run on spawned ranks (tests/_dist.py): one process group serves many checks, since
importing megatron-core dominates a spawned rank's cost."""
from __future__ import annotations

from typing import Any

import torch

LOGGED = ("iteration", "lm loss", "grad norm", "learning rate")


def train(world_size: int, env: dict, argv: list[str]) -> list[dict]:
    """``main(argv)`` under ``env``; the logged values of every iteration."""
    from megatron.quant.settings.environment import scoped_environ
    from megatron.quant.training.main import main

    with scoped_environ(env):
        history = main(argv)
    return [{key: h[key] for key in LOGGED} for h in history]


def hf_logits(world_size: int, hf_dir: str, tokens: torch.Tensor) -> torch.Tensor:
    """Logits of the imported model; at TP>1 this rank's vocabulary shard."""
    from megatron.quant.cpu import init_parallel
    from megatron.quant.recipes.recipe import QuantRecipe
    from megatron.quant.training.loading import load_model

    init_parallel(tensor_model_parallel_size=world_size)
    model, _ = load_model(hf_dir, QuantRecipe.from_env())
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    with torch.no_grad():
        return model(tokens, positions, None)


def model_accounting(world_size: int, shape: dict, batch: int) -> tuple[int, float]:
    """(parameter count, FLOPs torch counts in one forward+backward) of the model built for ``shape``."""
    from torch.utils.flop_counter import FlopCounterMode

    from megatron.quant.cpu import init_parallel
    from megatron.quant.layers.spec import precision_config
    from megatron.quant.recipes.recipe import QuantRecipe
    from megatron.quant.training.model import build_gpt, transformer_config

    init_parallel()
    # The unfused attention: torch's flop counter counts its products, not SDPA's CPU kernel.
    model = build_gpt(transformer_config(shape, quant_recipe=precision_config(QuantRecipe.from_env())), shape,
                      sdpa=False)
    seq = shape["seq_length"]
    tokens = torch.randint(0, shape["vocab_size"], (batch, seq))
    counter = FlopCounterMode(display=False)
    with counter:
        model(tokens, torch.arange(seq).expand(batch, seq), None, labels=tokens).sum().backward()
    return sum(p.numel() for p in model.parameters()), float(counter.get_total_flops())


def load_across_recipes(world_size: int, plain_ckpt: str, delayed_ckpt: str) -> dict[str, bool]:
    """A checkpoint saved without delayed scaling loads into a te-fp8-delayed model (same weights,
    fresh histories) and a te-fp8-delayed checkpoint into an unquantized model."""
    from megatron.quant.cpu import destroy_parallel, init_parallel
    from megatron.quant.recipes.recipe import QuantRecipe
    from megatron.quant.training.loading import load_model

    init_parallel(tensor_model_parallel_size=world_size)
    delayed, _ = load_model(plain_ckpt, QuantRecipe.from_dict({"format": "te-fp8-delayed"}))
    plain, _ = load_model(plain_ckpt, QuantRecipe.from_dict({"format": "bf16"}))
    load_model(delayed_ckpt, QuantRecipe.from_dict({"format": "bf16"}))
    weights, theirs = delayed.state_dict(), plain.state_dict()
    histories = {k: v for k, v in weights.items() if ".amax_histories." in k}
    destroy_parallel()
    return {"same_weights": all(torch.equal(v, weights[k]) for k, v in theirs.items()
                                if not k.endswith("_extra_state")),
            "histories": len(histories),
            "fresh": all(not v.any() if k.endswith("amax_history") else bool(torch.isinf(v))
                         for k, v in histories.items())}


TASKS = {"train": train, "hf_logits": hf_logits, "model_accounting": model_accounting,
         "load_across_recipes": load_across_recipes}


def run_plan(rank: int, world_size: int, plan: list[tuple[str, str, tuple]]) -> dict[str, Any]:
    """Run ``(name, task, args)`` items in order on every rank; results by name."""
    return {name: TASKS[task](world_size, *args) for name, task, args in plan}
