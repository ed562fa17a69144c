"""Megatron-LM's own loop with the lab's layers: ``--spec megatron.quant.training.megatron_lm_spec dense``
(or ``moe``), and one call, ``step``, at the start of each iteration.

Megatron-LM's ``pretrain_gpt.py`` (read at core_v0.19.0: ``gpt_builders.py``) takes ``--spec MODULE NAME``
through megatron-core's ``spec_utils.import_module``: it imports MODULE and passes its attribute NAME to
``GPTModel`` as the decoder's spec as it is (nothing is called). ``dense`` and ``moe`` are such specs:
megatron-core's local Llama layer (RMSNorm, SwiGLU, RoPE and GQA from the config) with the lab's
quantized modules; ``moe`` has megatron-core's MoE MLP (router, SequentialMLP experts, shared expert) in
every layer. A loop that builds its own model takes ``spec_for(config)``, which also follows
``moe_layer_freq``.

The quantized modules take their formats from ``TransformerConfig.quant_recipe``, which Megatron-LM leaves
None (or sets to megatron-core's own recipe). ``step``'s first call binds the run's precision as the
trainer reads it (``CUSTOM_QUANT_*``, or a per-module precision file), starts the capture
(``TENSOR_SAVE_*``), and every call sets the run position, numbered as Megatron-LM logs iterations.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from megatron.core.distributed import DistributedDataParallel
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.module import Float16Module
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron.quant import position, tensor_saver
from megatron.quant.layers.backend import QuantSpecProvider, with_backend
from megatron.quant.layers.module_quant import finish_init
from megatron.quant.layers.spec import decoder_spec, llama_layer_spec
from megatron.quant.recipes.precision import PrecisionConfig
from megatron.quant.recipes.precision_file import load_precision_file
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.settings.environment import settings_of
from megatron.quant.training.loop import iterations_run

# The objects --spec names (megatron-core's import_module takes a module attribute, not a call).
dense = llama_layer_spec()
# megatron-core reads only whether num_experts is set; the config's num_moe_experts sizes the layer
moe = with_backend(get_gpt_layer_local_spec(num_experts=1, normalization="RMSNorm"), QuantSpecProvider())


def spec_for(config: TransformerConfig) -> Any:
    """The lab's spec for ``config``: the Llama layer, or for MoE the block spec ``moe_layer_freq`` lays out."""
    return decoder_spec(config, QuantSpecProvider())


def run_precision(config: TransformerConfig, *, train_iters: int, seed: int, precision_file: str | None = None,
                  environ: Mapping[str, str] | None = None) -> PrecisionConfig:
    """The precision the trainer would run: ``precision_file`` (Megatron-LM's --te-precision-config-file or
    --kitchen-config-file), else the CUSTOM_QUANT_* recipe; seeded, its schedules placed in the run."""
    precision = (load_precision_file(precision_file) if precision_file
                 else PrecisionConfig.uniform(QuantRecipe.from_env(environ)))
    return precision.with_seed(seed).for_run(train_iters, config.num_layers)


def _gpt(chunk: torch.nn.Module) -> GPTModel:
    while isinstance(chunk, (DistributedDataParallel, Float16Module)):  # Megatron-LM's wrappers, outside in
        chunk = chunk.module
    if not isinstance(chunk, GPTModel):
        raise TypeError(f"megatron_lm_spec.step: expected a GPTModel (wrapped or not), got {type(chunk).__name__}")
    return chunk


def _configs(model: torch.nn.Module) -> list[TransformerConfig]:
    """Every TransformerConfig ``model``'s modules hold: megatron-core's MoE layers and experts keep copies
    of the model's (with their own parallel sizes), and each module finishes with its own."""
    found = {id(held): held for module in model.modules()
             for held in [vars(module).get("config")] if isinstance(held, TransformerConfig)}
    return list(found.values())


def step(model: torch.nn.Module | Sequence[torch.nn.Module], iteration: int, *, train_iters: int, seed: int,
         precision_file: str | None = None, environ: Mapping[str, str] | None = None) -> None:
    """Call at the start of each iteration with Megatron-LM's ``iteration`` as it stands there (the
    iterations done: 0 first); the run position becomes ``iteration + 1``, the number Megatron-LM logs
    the iteration under. The first call gives ``model``'s quantized modules the run's precision
    (``run_precision``) and starts the capture over the iterations left."""
    environ = settings_of(environ)  # the recipe and capture read the same variables
    chunks = [_gpt(chunk) for chunk in (model if isinstance(model, Sequence) else [model])]
    config = chunks[0].config
    if not isinstance(config.quant_recipe, PrecisionConfig):
        precision = run_precision(config, train_iters=train_iters, seed=seed, precision_file=precision_file,
                                  environ=environ)
        for chunk in chunks:
            for held in _configs(chunk):
                held.quant_recipe = precision
            finish_init(chunk, config)
        tensor_saver.configure(tensor_saver.SaverConfig.from_env(environ),
                               run_iterations=iterations_run(iteration, train_iters) or None,
                               num_layers=config.num_layers)
    position.set_iteration(iteration + 1)
