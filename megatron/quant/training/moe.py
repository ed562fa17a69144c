"""Mixture-of-experts settings: Megatron-LM's MoE flags, their checks, and the TransformerConfig fields they set.

The flags mean what they mean in Megatron-LM. The experts are megatron-core's ``SequentialMLP`` experts,
each with its own scales, run as grouped GEMMs by ``QuantGroupedMLP`` (``layers/grouped_experts.py``;
megatron-core's ``GroupedMLP``, ``moe_grouped_gemm``, has no emulated counterpart and stays off), routed by
``QuantTopKRouter`` (``layers/router.py``). A model shape with ``num_experts`` (a preset
or ``--num-experts``) is an MoE model; without it every MoE flag is inert, as in Megatron-LM.
"""
from __future__ import annotations

import argparse
import ast
from typing import TYPE_CHECKING, Any, Mapping

from megatron.quant.training.run_tree import RunTree

if TYPE_CHECKING:
    from megatron.quant.recipes.precision import PrecisionConfig

# Shape keys (presets set them; explicit flags override) and their defaults when neither does.
MOE_SHAPE_DEFAULTS = dict(num_experts=None, moe_router_topk=2, moe_ffn_hidden_size=None,
                          moe_shared_expert_intermediate_size=None, moe_layer_freq=1,
                          moe_router_score_function="softmax")
# Run settings (flags only) -> Megatron-LM's defaults, as moe_config_fields takes them.
MOE_RUN_DEFAULTS = dict(expert_parallel=1, dispatcher="allgather", router_dtype=None, load_balancing="aux_loss",
                        aux_loss_coeff=0.0, pre_softmax=False)
DISPATCHERS = ("allgather", "alltoall")  # megatron-core's; "flex" needs DeepEP
LOAD_BALANCING = ("aux_loss", "seq_aux_loss", "none")
ROUTER_DTYPES = ("fp32", "fp64")
SCORE_FUNCTIONS = ("softmax", "sigmoid")


class MoEError(ValueError):
    """A mixture-of-experts setting the run cannot take; the message names the value."""


def layer_freq(text: str) -> Any:
    """``--moe-layer-freq``: N (every N-th layer is MoE) or a 0/1 list per layer, e.g. ``[0,1,1,1]``."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise argparse.ArgumentTypeError(f"{text!r} is neither an integer nor a list such as [0,1,1,1]") from None
    if isinstance(value, int) or (isinstance(value, list) and all(v in (0, 1) for v in value)):
        return value
    raise argparse.ArgumentTypeError(f"{text!r} is neither an integer nor a list of 0 and 1")


def add_moe_arguments(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's MoE flags (shape flags absent unless given, so presets can fill them)."""
    S = argparse.SUPPRESS
    g = parser.add_argument_group("mixture of experts")
    g.add_argument("--num-experts", type=int, default=S, help="routed experts per MoE layer (none: a dense model)")
    g.add_argument("--moe-router-topk", type=int, default=S, help="experts per token (default 2)")
    g.add_argument("--moe-ffn-hidden-size", type=int, default=S,
                   help="one expert's FFN size (default: --ffn-hidden-size)")
    g.add_argument("--moe-shared-expert-intermediate-size", type=int, default=S,
                   help="the shared experts' total FFN size (none: no shared expert)")
    g.add_argument("--moe-layer-freq", type=layer_freq, default=S,
                   help="N: every N-th layer is MoE; or a 0/1 list per layer, e.g. [0,1,1,1] (first layer dense)")
    g.add_argument("--moe-router-score-function", choices=SCORE_FUNCTIONS, default=S)
    g.add_argument("--moe-router-pre-softmax", action="store_true",
                   help="softmax over all experts before the top-k choice (on by itself for top-1 softmax routing)")
    run = MOE_RUN_DEFAULTS
    g.add_argument("--expert-model-parallel-size", type=int, default=run["expert_parallel"])
    g.add_argument("--moe-token-dispatcher-type", choices=DISPATCHERS, default=run["dispatcher"],
                   help="alltoall needs a GPU (megatron-core opens a CUDA stream for it)")
    g.add_argument("--moe-router-dtype", choices=ROUTER_DTYPES, default=run["router_dtype"],
                   help="the router's GEMM and softmax dtype (default: the model's, as Megatron-LM)")
    g.add_argument("--moe-router-load-balancing-type", choices=LOAD_BALANCING, default=run["load_balancing"])
    g.add_argument("--moe-aux-loss-coeff", type=float, default=run["aux_loss_coeff"])


def check_moe(args: argparse.Namespace, data_parallel: int, cuda: bool) -> list[str]:
    """MoEError (one line naming the value and what is allowed) for MoE settings the run cannot take;
    the notices of what it turned on."""
    experts, ep = args.num_experts, args.expert_model_parallel_size
    if ep < 1:
        raise MoEError(f"--expert-model-parallel-size must be positive, got {ep}")
    if experts is None:
        if ep > 1:
            raise MoEError(f"--expert-model-parallel-size {ep} needs an MoE model (--num-experts)")
        return []
    if experts < 1:
        raise MoEError(f"--num-experts must be positive, got {experts}")
    if not 1 <= args.moe_router_topk <= experts:
        raise MoEError(f"--moe-router-topk {args.moe_router_topk} must be between 1 and --num-experts {experts}")
    if experts % ep:
        raise MoEError(f"--expert-model-parallel-size {ep} does not divide --num-experts {experts}; "
                       f"allowed: a divisor of {experts}")
    if data_parallel % ep:
        raise MoEError(f"--expert-model-parallel-size {ep} does not divide the data-parallel size {data_parallel} "
                       f"(expert-parallel ranks are data-parallel ranks of the attention)")
    for key, value in (("moe_ffn_hidden_size", args.moe_ffn_hidden_size),
                       ("moe_shared_expert_intermediate_size", args.moe_shared_expert_intermediate_size)):
        if value is not None and value < 1:
            raise MoEError(f"--{key.replace('_', '-')} must be positive, got {value}")
    freq = args.moe_layer_freq
    if isinstance(freq, (list, tuple)) and len(freq) != args.num_layers:
        raise MoEError(f"--moe-layer-freq lists {len(freq)} layers; the model has --num-layers {args.num_layers}")
    if isinstance(freq, int) and freq < 1:
        raise MoEError(f"--moe-layer-freq must be positive, got {freq}")
    if isinstance(freq, (list, tuple)) and 1 not in freq:
        raise MoEError(f"--moe-layer-freq {list(freq)} makes no layer MoE; allowed: at least one 1 (or drop "
                       f"--num-experts for a dense model)")
    if args.moe_token_dispatcher_type == "alltoall" and not cuda:
        raise MoEError("--moe-token-dispatcher-type alltoall needs a GPU (megatron-core opens a CUDA stream); "
                       "use allgather on CPU")
    if args.tensor_model_parallel_size > 1 and not args.sequence_parallel:
        raise MoEError(f"--tensor-model-parallel-size {args.tensor_model_parallel_size} with MoE needs "
                       f"--sequence-parallel (megatron-core refuses MoE training under TP without it)")
    if args.moe_router_topk == 1 and args.moe_router_score_function == "softmax" and not args.moe_router_pre_softmax:
        args.moe_router_pre_softmax = True  # megatron-core demands it: a softmax over one chosen expert is always 1
        return ["--moe-router-pre-softmax turned on for top-1 softmax routing (megatron-core demands it: a softmax "
                "over the one chosen expert would weigh every token 1)"]
    return []


def check_router_precision(precision: "PrecisionConfig", tree: RunTree, origin: str) -> None:
    """MoEError when some config of ``precision`` (chosen by ``origin``) has a router rule for a dense model,
    or quantizes the router where the lab cannot emulate it."""
    from megatron.quant.layers.router import router_quant_problem  # megatron-core: imported once a run starts

    num_layers = tree.model.num_layers
    if tree.moe.num_experts is None:
        for key, recipe in precision.configs.items():
            if recipe.quantizes_router(num_layers):
                raise MoEError(f"{origin}: recipe {key!r} has a rule for the MoE router, but the model is dense "
                               f"(no --num-experts); drop the rule or give --num-experts")
        return
    problem = router_quant_problem(tree.moe.moe_router_dtype, tree.parallel.sequence_parallel)
    if problem is None:
        return
    for key, recipe in precision.configs.items():
        if recipe.quantizes_router(num_layers):
            raise MoEError(f"{precision.source}: recipe {key!r} quantizes the MoE router, but {problem}")


def moe_config_fields(shape: Mapping, **run: Any) -> dict[str, Any]:
    """TransformerConfig's MoE fields for ``shape`` (none for a dense shape); ``run``: ``MOE_RUN_DEFAULTS``'
    keys, those not given at their defaults."""
    if not shape.get("num_experts"):
        return {}
    given = {key: MOE_SHAPE_DEFAULTS[key] if shape.get(key) is None else shape[key] for key in MOE_SHAPE_DEFAULTS}
    run = {**MOE_RUN_DEFAULTS, **run}
    return dict(num_moe_experts=given["num_experts"], moe_router_topk=given["moe_router_topk"],
                moe_ffn_hidden_size=given["moe_ffn_hidden_size"] or shape["ffn_hidden_size"],
                moe_shared_expert_intermediate_size=given["moe_shared_expert_intermediate_size"],
                moe_layer_freq=_layer_freq(given["moe_layer_freq"]),
                moe_router_score_function=given["moe_router_score_function"],
                expert_model_parallel_size=run["expert_parallel"], moe_token_dispatcher_type=run["dispatcher"],
                moe_router_dtype=run["router_dtype"], moe_router_load_balancing_type=run["load_balancing"],
                moe_aux_loss_coeff=run["aux_loss_coeff"], moe_router_pre_softmax=run["pre_softmax"],
                moe_grouped_gemm=False)


def _layer_freq(freq: Any) -> Any:
    return freq if isinstance(freq, int) else list(freq)  # megatron-core takes an int or a list


def moe_run_fields(tree: RunTree) -> dict[str, Any]:
    """``moe_config_fields``' run-level keywords from the run's configuration."""
    args = tree.moe
    return dict(expert_parallel=tree.parallel.expert_model_parallel_size, dispatcher=args.moe_token_dispatcher_type,
                router_dtype=args.moe_router_dtype, load_balancing=args.moe_router_load_balancing_type,
                aux_loss_coeff=args.moe_aux_loss_coeff, pre_softmax=args.moe_router_pre_softmax)
