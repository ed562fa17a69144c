"""Megatron-LM flags the trainer honours by translation, and Megatron-LM's own adjustments, with their notices.

Samples become iterations (``--train-samples`` and the learning-rate ``*-samples``, as Megatron-LM's
scheduler counts them, rounded down to whole iterations); values Llama fixes (``--kv-channels``,
``--rotary-percent``, ``--context-parallel-size``) are checked; and what Megatron-LM or the machine
changes quietly is changed with a one-line notice: sequence parallelism at tensor-parallel size 1,
the distributed optimizer on CPU, and ``--fp8-format`` where Transformer Engine cannot run it.
"""
from __future__ import annotations

import argparse


class MegatronLMFlagError(ValueError):
    """A Megatron-LM flag's value the trainer cannot honour; the message names it and what is allowed."""


def add_translated_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Megatron-LM flags honoured by translation")
    g.add_argument("--train-samples", type=int, default=None,
                   help="instead of --train-iters: --train-iters is this over --global-batch-size")
    g.add_argument("--lr-decay-samples", type=int, default=None,
                   help="with --train-samples: --lr-decay-iters in samples")
    g.add_argument("--lr-warmup-samples", type=int, default=None,
                   help="with --train-samples: --lr-warmup-iters in samples")
    g.add_argument("--kv-channels", type=int, default=None,
                   help="the head width: --hidden-size / --num-attention-heads")
    g.add_argument("--rotary-percent", type=float, default=1.0, help="1.0 only (Llama rotates whole heads)")
    g.add_argument("--context-parallel-size", type=int, default=1, help="1 only (sequences are not split over ranks)")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise MegatronLMFlagError(message)


def check_llama_values(args: argparse.Namespace) -> None:
    """The translated flags' values that Llama fixes (after the shape is known)."""
    head = args.hidden_size // args.num_attention_heads
    _require(args.kv_channels in (None, head), f"--kv-channels {args.kv_channels} must be --hidden-size / "
                                               f"--num-attention-heads = {head} (Llama's head width)")
    _require(args.rotary_percent == 1.0, f"--rotary-percent {args.rotary_percent}: Llama rotates whole heads; "
                                         "allowed: 1.0")
    _require(args.context_parallel_size == 1, f"--context-parallel-size {args.context_parallel_size}: the trainer "
                                              "does not split sequences over ranks; allowed: 1")


def samples_to_iterations(args: argparse.Namespace) -> None:
    """``--train-samples`` and the learning rate's sample counts into iterations of ``--global-batch-size``."""
    batch, samples = args.global_batch_size, args.train_samples
    if samples is None:
        _require(args.train_iters is not None, "give --train-iters N or --train-samples N")
        for flag, given in (("--lr-decay-samples", args.lr_decay_samples),
                            ("--lr-warmup-samples", args.lr_warmup_samples)):
            _require(given is None, f"{flag} needs --train-samples (Megatron-LM)")
        return
    _require(args.train_iters is None, "give one of --train-iters and --train-samples, not both")
    _require(samples >= batch, f"--train-samples {samples} is less than one --global-batch-size ({batch})")
    _require(args.lr_decay_iters is None and args.lr_warmup_iters == 0,
             "with --train-samples give the learning rate's schedule in samples (--lr-decay-samples, "
             "--lr-warmup-samples), as Megatron-LM does")
    args.train_iters = samples // batch
    if args.lr_decay_samples is not None:
        _require(args.lr_decay_samples >= batch,
                 f"--lr-decay-samples {args.lr_decay_samples} is less than one --global-batch-size ({batch})")
        args.lr_decay_iters = args.lr_decay_samples // batch
    if args.lr_warmup_samples is not None:
        _require(args.lr_warmup_samples >= 0, f"--lr-warmup-samples must be non-negative, got {args.lr_warmup_samples}")
        args.lr_warmup_iters = args.lr_warmup_samples // batch


def adjust(args: argparse.Namespace, cuda: bool, te: bool) -> list[str]:
    """Megatron-LM's quiet adjustments, and the machine's, made here with a notice each (one line)."""
    notices = []
    args.split = args.split.strip("'\"")  # Megatron-LM reads only the numbers: a quoted '99,1,0' is 99,1,0
    if args.sequence_parallel and args.tensor_model_parallel_size == 1:
        args.sequence_parallel = False
        notices.append("--sequence-parallel ignored at --tensor-model-parallel-size 1 (Megatron-LM turns it off too)")
    if args.use_distributed_optimizer and not cuda:
        args.use_distributed_optimizer = False
        notices.append("--use-distributed-optimizer ignored on CPU: megatron-core's is CUDA-only; the plain optimizer "
                       "makes the same updates without sharding their state")
    if args.fp8_format is not None and args.fp8_recipe is None and args.fp4_format is None and not (te and cuda):
        args.fp8_recipe = "delayed"
        notices.append(f"--fp8-format {args.fp8_format} without Transformer Engine on a GPU: emulated with "
                       "Megatron-LM's default --fp8-recipe delayed")
    return notices
