"""What a quantized module takes from the config megatron-core matched to it.

``GPTModel`` ends its construction by handing every module with a ``finish_init`` the
``QuantizationConfig`` that ``TransformerConfig.quant_recipe`` matches to the module's path (None
when no matcher takes it; megatron-core logs those). ``module_quant`` turns that into the module's
operand formats and capture site: its role (which the model adapter gave it from the spec it was
built from, ``layers/adapters.py``), its 0-based global layer from
the path (megatron-core's own ``layers.N``, a stage-local index) and the pipeline stage's offset.
``finish_init`` does the same for a model megatron-core does not finish (a block or layer built alone).
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
from megatron.core.quantization.quant_config import QuantizationConfig
from megatron.core.quantization.utils import get_quant_config_or_none
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

from megatron.quant import kernels
from megatron.quant.formats.base import NumericFormat
from megatron.quant.formats.interface import QuantFormat
from megatron.quant.layers.adapters import GUIDE
from megatron.quant.position import Position
from megatron.quant.recipes.operands import ROLE_BY_NAME, ROLES
from megatron.quant.recipes.precision import PrecisionConfig
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.tensor_saver import CaptureSite, expert_module

# megatron-core's SequentialMLP holds an MoE layer's experts as ``experts.local_experts.<i>`` on each
# expert-parallel rank; sites name them by the global expert (``capture.site.expert_module``), so
# captures and stochastic rounding do not depend on the expert-parallel size.
_LOCAL_EXPERT = re.compile(r"\.experts\.local_experts\.(\d+)\.")


class FinishesInit:
    """A module megatron-core finishes with its matched quantization config (``GPTModel``'s seam)."""

    def finish_init(self, quantization_config: Optional[QuantizationConfig]) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class ModuleQuant:
    """One module's operand formats (operand key -> format, None where unquantized) per phase of its
    recipe's schedule (one phase without a schedule), the phase running at a position, site and seed, and
    the backward operands taken from the forward's dequantized operand (``QuantRecipe.dequantized_sources``)."""

    phases: Sequence[Mapping[str, Optional[QuantFormat]]]
    phase_of: Optional[Callable[[Position], int]]  # None: the recipe does not change during the run
    site: CaptureSite
    seed: int
    dequantized: frozenset[str] = frozenset()
    accumulate: tuple[tuple[str, str], ...] = ()  # the base recipe's, for every phase (``QuantRecipe.accumulate``)

    @property
    def formats(self) -> Mapping[str, Optional[QuantFormat]]:
        """The base recipe's formats (phase 0)."""
        return self.phases[0]


def module_quant(matched: QuantizationConfig, config: TransformerConfig, role: Optional[str]) -> ModuleQuant:
    """The formats, site and stochastic-rounding seed of the module ``matched`` was made for, whose
    recipe role is ``role`` (None: a module built outside our backend's spec, which has none)."""
    precision = config.quant_recipe
    path = matched.match_input.module_path
    if not isinstance(precision, PrecisionConfig):
        raise TypeError(f"{path}: TransformerConfig.quant_recipe is a {type(precision).__name__}; the quantized "
                        f"modules need a megatron.quant PrecisionConfig (recipes/precision.py)")
    if role not in ROLE_BY_NAME:
        raise ValueError(f"{path}: module role {role!r} is not a recipe role ({', '.join(ROLES)}); a quantized "
                         f"module takes its role from the spec it is built from: build it from a spec that "
                         f"layers.backend.with_backend gave our modules ({GUIDE})")
    layer_idx = -1 if ROLE_BY_NAME[role].part == "head" else _global_layer(matched, config)
    attention = ROLE_BY_NAME[role].gemms == "attention"
    site = CaptureSite(layer_type="attention" if attention else "linear", component="FA" if attention else "linear",
                       layer_idx=layer_idx, module=global_module_name(path, config), role=role,
                       quant_type=precision.name)
    recipe = precision.recipe(matched)
    phases = precision.resolve_phases(matched, role, layer_idx, config.num_layers, format_builder(recipe))
    if recipe.schedule.train_iters is None:  # outside a training run (``PrecisionConfig.for_run``): the base recipe
        phases = phases[:1]
    return ModuleQuant(phases, recipe.schedule.phase_of if len(phases) > 1 else None, site, recipe.seed or 0,
                       recipe.dequantized_sources(), recipe.accumulate)


def format_builder(recipe: QuantRecipe) -> Callable[[NumericFormat], QuantFormat]:
    """How the layers run ``recipe``'s formats: the kernel path ``CUSTOM_QUANT_KERNELS`` chooses (Triton,
    compiled or eager torch; ``kernels.wrap``), with the recipe's ``compile`` switch."""
    return lambda fmt: kernels.wrap(fmt, recipe.compile, recipe.kernels)  # None: the environment's


def global_module_name(path: str, config: TransformerConfig) -> str:
    """``path`` with a routed expert's local index replaced by its global one (``...mlp.experts.5.linear_fc1``
    for ``...mlp.experts.local_experts.1.linear_fc1`` on expert-parallel rank 1 of 2, 4 experts each)."""
    from megatron.core import parallel_state

    found = _LOCAL_EXPERT.search(path)
    if found is None:
        return path
    # megatron-core's BaseMoELayer: expert-parallel rank r holds experts r * local .. (r + 1) * local - 1
    ep_size, ep_rank = ((parallel_state.get_expert_model_parallel_world_size(),
                         parallel_state.get_expert_model_parallel_rank())
                        if parallel_state.model_parallel_is_initialized() else (1, 0))
    expert = ep_rank * (config.num_moe_experts // ep_size) + int(found.group(1))
    return expert_module(path[:found.start()], expert, path[found.end():])


def _global_layer(matched: QuantizationConfig, config: TransformerConfig) -> int:
    local = matched.match_input.layer_number  # megatron-core's: the N of "layers.N", 0-based in the stage
    if local is None:
        raise ValueError(f"{matched.match_input.module_path}: a decoder module outside any 'layers.N'; "
                         f"build it inside a TransformerBlock or name it with finish_init's prefix")
    offset = get_transformer_layer_offset(config) if config.pipeline_model_parallel_size > 1 else 0
    return local + offset


def finish_init(model: torch.nn.Module, config: TransformerConfig, prefix: str = "") -> None:
    """What ``GPTModel.__init__`` does last, for a model it did not build: each module with a
    ``finish_init`` gets the config ``config.quant_recipe`` matches to ``prefix`` + its path."""
    for name, module in model.named_modules():
        if isinstance(module, FinishesInit):
            module.finish_init(get_quant_config_or_none(prefix + name, config.quant_recipe))



def warn_idle_matchers(model: torch.nn.Module, precision: PrecisionConfig, extra: Sequence[str] = ()) -> None:
    """A warning per matcher of ``precision`` that decides none of the modules megatron-core matches in
    ``model`` (those with ``finish_init``, and ``extra`` paths such as the output layer), so a file whose
    only matcher matches nothing does not train BF16 while the start line names a format."""
    paths = [name for name, module in model.named_modules() if isinstance(module, FinishesInit)] + list(extra)
    for problem in precision.matcher_problems(paths):
        warnings.warn(problem, UserWarning, stacklevel=2)
