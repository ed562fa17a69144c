"""Does the recipe fit the run's token count? A random Hadamard transform (``hadamard=n``) needs
the length it runs along to be a multiple of n; on the wgrad operands of the linear layers that
length is the micro-batch's tokens (``--micro-batch-size`` x ``--seq-length``), known at start, so
a misfit is refused then, naming the flags, instead of a ValueError in the first backward pass."""
from __future__ import annotations

from megatron.quant import formats
from megatron.quant.recipes.operands import LINEAR_ROLES
from megatron.quant.recipes.recipe import QuantRecipe

_TOKEN_AXIS_OPERANDS = ("wgrad.grad_output", "wgrad.input")  # dW = dY^T X: blocked along the tokens


def hadamard_sizes(recipe: QuantRecipe, num_layers: int) -> dict[int, str]:
    """Hadamard size -> one operand that applies it along the tokens (``fc1 wgrad.input``), over every
    linear module of every layer and the output layer."""
    chosen = {}
    for role, layers in [*((role, range(num_layers)) for role in LINEAR_ROLES), ("output_layer", [-1])]:
        for layer in layers:
            for key, choice in recipe.choices(role, layer, num_layers).items():
                if key in _TOKEN_AXIS_OPERANDS and not formats.is_passthrough(choice.name):
                    chosen.setdefault(choice, f"{role} {key}")
    sizes: dict[int, str] = {}
    for choice, where in chosen.items():
        size = formats.get_format(choice.name, **dict(choice.options)).options.get("hadamard")
        if size:
            sizes.setdefault(int(size), where)
    return sizes


def check_hadamard_fit(recipe: QuantRecipe, num_layers: int, micro_batch_size: int, seq_length: int) -> None:
    """ValueError naming the recipe, the operand, the token count and the flags to change when a
    Hadamard size does not divide ``micro_batch_size`` x ``seq_length``."""
    tokens = micro_batch_size * seq_length
    for size, where in sorted(hadamard_sizes(recipe, num_layers).items()):
        if tokens % size:
            raise ValueError(f"recipe {recipe.name} applies hadamard={size} along the tokens ({where}), but a "
                             f"micro-batch holds {tokens} tokens (--micro-batch-size {micro_batch_size} x "
                             f"--seq-length {seq_length}); allowed: a multiple of {size}: change --seq-length or "
                             f"--micro-batch-size")
