"""Activation recompute: Megatron-LM's flags and rules (its arguments.py and TransformerConfig.__post_init__)."""
from __future__ import annotations

import argparse
from typing import Any

RECOMPUTE_GRANULARITIES = ("full", "selective")
RECOMPUTE_METHODS = ("uniform", "block")


class RecomputeError(ValueError):
    """A recompute setting megatron-core would refuse; the message names the values."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise RecomputeError(message)


def add_recompute_arguments(group: Any) -> None:
    """The recompute flags, into ``group`` (an argparse parser or argument group)."""
    group.add_argument("--recompute-granularity", choices=RECOMPUTE_GRANULARITIES, default=None,
                       help="activation recompute (megatron-core's): full layers, or selective (core attention)")
    group.add_argument("--recompute-method", choices=RECOMPUTE_METHODS, default=None,
                       help="with full: uniform (chunks of --recompute-num-layers) or block (the first N layers)")
    group.add_argument("--recompute-num-layers", type=int, default=None,
                       help="with full: layers per chunk (uniform) or recomputed layers per pipeline stage (block)")


def check_recompute(args: argparse.Namespace) -> None:
    """Megatron-LM's rules (its arguments.py and TransformerConfig.__post_init__), refused up front."""
    granularity, method, count = args.recompute_granularity, args.recompute_method, args.recompute_num_layers
    if granularity is None:
        _require(method is None and count is None,
                 "--recompute-method and --recompute-num-layers need --recompute-granularity full")
    elif granularity == "selective":
        _require(method is None, f"--recompute-method {method} is not supported with --recompute-granularity "
                                 "selective (Megatron-LM); drop it")
        _require(count is None, f"--recompute-num-layers {count} must not be given with --recompute-granularity "
                                "selective (Megatron-LM)")
    else:
        per_stage = args.num_layers // args.pipeline_model_parallel_size
        _require(method is not None, "--recompute-granularity full needs --recompute-method {uniform,block}")
        _require(count is not None and 1 <= count <= per_stage,
                 f"--recompute-granularity full needs --recompute-num-layers between 1 and the layers per pipeline "
                 f"stage ({per_stage}), got {count}")
