"""Command-line arguments with Megatron-LM's names and meanings, presets, and validation.

Megatron users' launch scripts carry over: every flag here means what it means in Megatron-LM,
and every other Megatron-LM flag is parsed and answered (``megatron_lm_flags``: ignored with a
notice, or refused). ``parse_args`` applies a ``--model`` preset under explicit flags, then
``validate_args`` refuses inconsistent combinations with a message naming the values; both add
the run's one-line notices to ``args.notices``.
"""
from __future__ import annotations

import argparse
import importlib.util
from typing import NoReturn, Sequence

from megatron.quant.recipes.presets import FP8_RECIPES, emulates_precision
from megatron.quant.training.cuda_graph import add_cuda_graph_argument
from megatron.quant.training.data import parse_blend
from megatron.quant.training.float_ranges import FLOAT_RANGES, allowed, within_range
from megatron.quant.training.megatron_lm_args import (
    MegatronLMFlagError,
    add_translated_arguments,
    adjust,
    check_llama_values,
    samples_to_iterations,
)
from megatron.quant.training.megatron_lm_flags import add_answered_flags, take_answered
from megatron.quant.training.metrics import wandb_flags_problem
from megatron.quant.training.mla import MLA_SHAPE_DEFAULTS
from megatron.quant.training.moe import MOE_SHAPE_DEFAULTS, MoEError, add_moe_arguments, check_moe
from megatron.quant.training.presets import PRESETS, get_preset
from megatron.quant.training.recompute import RecomputeError, add_recompute_arguments, check_recompute
from megatron.quant.training.run_tree import first_given
from megatron.quant.training.tokenizers import VOCAB_DIVISOR

LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root")
TOKENIZER_TYPES = ("ByteTokenizer", "HuggingFaceTokenizer", "NullTokenizer")
# megatron-core's datasets shuffle with numpy's RandomState, which takes seeds 0 .. 2**32 - 1.
MAX_SEED = 2**32 - 1

# Defaults for shape flags when neither a preset nor the command line sets them
# (Megatron-LM's defaults where it has one).
_SHAPE_DEFAULTS = dict(
    num_query_groups=None, max_position_embeddings=None, rotary_base=10000.0,
    rope_scaling_factor=None, untie_embeddings_and_output_weights=False, norm_epsilon=1e-5,
    normalization="RMSNorm", swiglu=False, group_query_attention=False, vocab_size=None, **MOE_SHAPE_DEFAULTS,
    **MLA_SHAPE_DEFAULTS,
)


MAX_MICRO_BATCH_TOKENS = 2**31 - 2  # int32 token positions, a sample's extra (shifted label) token included


class ArgumentError(ValueError):
    """Inconsistent or unsupported arguments; the message names the bad values."""


class _OneLineErrorParser(argparse.ArgumentParser):
    """Errors in one line: the usage of ~80 flags would bury them (--help still shows it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineErrorParser(
        prog="megatron-quant-train",
        description="Pretrain Llama on megatron-core with fake-quantized GEMM operands "
                    "(format from CUSTOM_QUANT_TYPE, capture from TENSOR_SAVE_*).",
        allow_abbrev=False)
    S = argparse.SUPPRESS  # shape flags: absent unless given, so presets can fill them

    g = p.add_argument_group("model")
    g.add_argument("--model", choices=list(PRESETS), help="shape preset; explicit flags override it")
    g.add_argument("--num-layers", type=int, default=S)
    g.add_argument("--hidden-size", type=int, default=S)
    g.add_argument("--ffn-hidden-size", type=int, default=S)
    g.add_argument("--num-attention-heads", type=int, default=S)
    g.add_argument("--group-query-attention", action="store_true", default=S)
    g.add_argument("--num-query-groups", type=int, default=S)
    g.add_argument("--seq-length", type=int, default=S)
    g.add_argument("--max-position-embeddings", type=int, default=S)
    g.add_argument("--position-embedding-type", choices=["rope"], default="rope")
    g.add_argument("--rotary-base", type=float, default=S)
    g.add_argument("--rope-scaling-factor", type=float, default=S,
                   help="Llama 3.1-style RoPE scaling factor (presets set the published one)")
    g.add_argument("--normalization", default=S, help="RMSNorm (Llama)")
    g.add_argument("--norm-epsilon", type=float, default=S)
    g.add_argument("--swiglu", action="store_true", default=S,
                   help="accepted for compatibility; the Llama MLP is always SwiGLU")
    g.add_argument("--untie-embeddings-and-output-weights", action="store_true", default=S)
    g.add_argument("--disable-bias-linear", action="store_true", default=True,
                   help="accepted for compatibility; Llama linears never have a bias")
    g.add_argument("--vocab-size", type=int, default=S, help="vocabulary size for NullTokenizer / mock data")
    g.add_argument("--make-vocab-size-divisible-by", type=int, default=VOCAB_DIVISOR)
    g.add_argument("--init-method-std", type=float, default=0.02)
    g.add_argument("--attention-dropout", type=float, default=0.0)
    g.add_argument("--hidden-dropout", type=float, default=0.0)
    g.add_argument("--hf-checkpoint", metavar="DIR",
                   help="initialise weights from a local Hugging Face Llama directory (config.json + safetensors)")

    add_moe_arguments(p)

    g = p.add_argument_group("batch")
    g.add_argument("--micro-batch-size", type=int, default=1)
    g.add_argument("--global-batch-size", type=int, default=None,
                   help="default: micro-batch-size x data-parallel size")

    g = p.add_argument_group("optimization")
    g.add_argument("--lr", type=float, default=3e-4)
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--lr-decay-style", choices=LR_DECAY_STYLES, default="cosine")
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--lr-decay-iters", type=int, default=None, help="default: --train-iters")
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.95)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--use-distributed-optimizer", action="store_true",
                   help="GPU only: megatron-core's distributed optimizer (shards optimizer state over DP)")

    g = p.add_argument_group("precision")
    g.add_argument("--bf16", action="store_true", help="bf16 parameters and compute, fp32 master weights")
    g.add_argument("--fp16", action="store_true", help="GPU only: fp16 with dynamic loss scaling")
    g.add_argument("--fp8-format", choices=["e4m3", "hybrid"], default=None,
                   help="alone: real FP8 GEMMs through Transformer Engine (GPU only); with --fp8-recipe: the "
                        "emulated recipe's FP8 format (hybrid: E5M2 gradients)")
    # Megatron-LM's precision flags, mapped onto emulated recipes (megatron.quant.recipes.presets).
    g.add_argument("--fp8-recipe", choices=FP8_RECIPES, default=None,
                   help="emulate TE's recipe: tensorwise (te-fp8-current), delayed (te-fp8-delayed), mxfp8 "
                        "(te-mxfp8), blockwise (te-fp8-blockwise)")
    g.add_argument("--fp8-margin", type=int, default=None,
                   help="with --fp8-recipe delayed: scale margin 2^m (default 0)")
    g.add_argument("--fp8-amax-history-len", type=int, default=None,
                   help="with --fp8-recipe delayed: amaxes kept per operand (default 1, as Megatron-LM)")
    g.add_argument("--fp8-amax-compute-algo", choices=["most_recent", "max"], default=None,
                   help="with --fp8-recipe delayed: which amax sets the scale (default most_recent, as Megatron-LM)")
    g.add_argument("--tp-only-amax-red", action="store_true",
                   help="delayed scaling: reduce amaxes over tensor-parallel ranks only, not data-parallel ones")
    g.add_argument("--no-fp8-wgrad", "--disable-fp8-wgrad", action="store_true",
                   help="emulated recipe: wgrad GEMM operands not quantized")
    g.add_argument("--fp4-format", choices=["e2m1"], default=None, help="emulate FP4 training (te-nvfp4)")
    g.add_argument("--fp4-recipe", choices=["nvfp4"], default=None, help="with --fp4-format: the FP4 recipe")
    # Megatron-LM's per-module precision files (megatron-core RecipeConfig YAML; recipes/precision_file.py).
    g.add_argument("--kitchen-config-file", default=None, metavar="YAML",
                   help="per-module precision: configs (our recipes) and matchers (megatron-core's globs)")
    g.add_argument("--te-precision-config-file", default=None, metavar="YAML",
                   help="per-module precision written for TE's recipes (TEQuantizationParams) or ours")
    g.add_argument("--first-last-layers-bf16", action="store_true",
                   help="emulated recipe: keep the first and last decoder layers unquantized")
    g.add_argument("--num-layers-at-start-in-bf16", type=int, default=None,
                   help="with --first-last-layers-bf16 (default 1)")
    g.add_argument("--num-layers-at-end-in-bf16", type=int, default=None,
                   help="with --first-last-layers-bf16 (default 1)")

    g = p.add_argument_group("parallelism")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--sequence-parallel", action="store_true")
    add_recompute_arguments(g)
    add_cuda_graph_argument(g)
    g = p.add_argument_group("run length, logging and checkpoints")
    g.add_argument("--train-iters", type=int, default=None, help="iterations to train (or --train-samples)")
    g.add_argument("--exit-interval", type=int, default=None,
                   help="stop (saving a checkpoint with --save) when the iteration is a multiple of this")
    g.add_argument("--eval-interval", type=int, default=1000)
    g.add_argument("--eval-iters", type=int, default=10)
    g.add_argument("--log-interval", type=int, default=1)
    g.add_argument("--save", metavar="DIR")
    g.add_argument("--save-interval", "--persistent-save-interval", type=int, default=None)
    g.add_argument("--load", metavar="DIR")
    g.add_argument("--ckpt-step", type=int, default=None, metavar="N",
                   help="with --load: load iteration N (DIR/iter_000000N) instead of the tracker's latest")
    g.add_argument("--no-load-optim", action="store_true", help="with --load: weights and iteration only")
    g.add_argument("--no-load-rng", action="store_true",
                   help="with --load: keep fresh RNG states (needed when the parallel layout changed)")
    g.add_argument("--tensorboard-dir", metavar="DIR")
    g.add_argument("--tensor-inspect-config", metavar="YAML", default=None,
                   help="an nvdlfw-inspect config (TE's precision debug tools) that drives capture "
                        "(as TENSOR_INSPECT_CONFIG; docs/capture.md)")
    g.add_argument("--check-args", action="store_true",
                   help="check the arguments, environment and --load checkpoint, then exit (0 when training "
                        "would start, 2 with the reason); the launch scripts run this before torchrun")
    g.add_argument("--print-config", action="store_true", help="print the resolved configuration, each value with "
                   "where it came from (flag, environment, file, default), then exit 0 without training")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--peak-tflops", type=float, default=None,
                   help="peak dense TFLOP/s of one device for MFU (default: from the device table)")
    g.add_argument("--divergence-threshold", type=float, default=None,
                   help="stop the run as diverged when the training loss exceeds this (a NaN/Inf loss always "
                        "stops it); the last checkpoint is kept, the diverged state is not saved")
    g.add_argument("--wandb-project", default=None,
                   help="also log every scalar to this Weights & Biases project (needs the wandb package; "
                        "WANDB_MODE=offline works without a network)")
    g.add_argument("--wandb-exp-name", default=None, help="W&B run name (default: W&B's)")
    g.add_argument("--wandb-save-dir", default=None, help="W&B's local directory (default: W&B's)")

    g = p.add_argument_group("data")
    g.add_argument("--data-path", nargs="+", default=None,
                   help="indexed dataset prefixes, optionally weighted: [W1] PREFIX1 [W2 PREFIX2 ...]")
    g.add_argument("--split", default="969,30,1")
    g.add_argument("--mock-data", action="store_true")
    g.add_argument("--data-cache-path", default=None)

    g = p.add_argument_group("tokenizer")
    g.add_argument("--tokenizer-type", choices=TOKENIZER_TYPES, default=None,
                   help="default: ByteTokenizer, or NullTokenizer with --mock-data and a preset vocab")
    g.add_argument("--tokenizer-model", default=None, help="local Hugging Face tokenizer directory")
    add_translated_arguments(p)
    add_answered_flags(p)
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse Megatron-LM-style flags; unset shape flags come from ``--model`` or ``--hf-checkpoint``, then defaults."""
    return parse_with_sources(argv)[0]


def parse_with_sources(argv: Sequence[str]) -> tuple[argparse.Namespace, dict[str, str]]:
    """The flags of ``argv`` and where each destination's value came from (``run_tree.SOURCES``): "flag
    --x", "file ..." (a --model preset or a --hf-checkpoint's config.json) or "default"; the tree's
    precedence (``run_tree.first_given``) decides between them."""
    parser = build_parser()
    args = parser.parse_args(argv)
    unset = object()  # parsed again over placeholders, argparse fills no default in: what differs is given
    again = parser.parse_args(argv, namespace=argparse.Namespace(**{key: unset for key in vars(args)}))
    given = {key: value for key, value in vars(again).items() if value is not unset}
    try:
        args.notices = take_answered(args)
    except ValueError as error:
        raise ArgumentError(str(error)) from None
    if args.model and args.hf_checkpoint:
        parser.error("--model and --hf-checkpoint both set the model shape; give one")
    if args.hf_checkpoint:
        from megatron.quant.training.hf_import import hf_shape

        preset = dict(hf_shape(args.hf_checkpoint), group_query_attention=True, swiglu=True)
        file = f"file {args.hf_checkpoint}/config.json"
    else:
        preset, file = (get_preset(args.model) if args.model else {}), f"file preset {args.model}"
    layers = [("flag", given), (file, preset), ("default", {**vars(args), **_SHAPE_DEFAULTS})]
    sources = {}
    for key in {*vars(args), *_SHAPE_DEFAULTS, *preset}:
        value, source = first_given(key, layers)
        setattr(args, key, value)
        sources[key] = f"flag {_flag(key)}" if source == "flag" else source
    return args, sources


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ArgumentError(message)


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _check_sizes(args: argparse.Namespace) -> None:
    """Sizes and divisors are positive before anything divides by them (a 0 would be a ZeroDivisionError)."""
    values = vars(args)  # the flags by destination: the checks name each flag they refuse
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "make_vocab_size_divisible_by"):
        _require(values[key] > 0, f"{_flag(key)} must be positive, got {values[key]}")
    for key in ("num_query_groups", "vocab_size", "max_position_embeddings"):
        value = values.get(key)
        _require(value is None or value > 0, f"{_flag(key)} must be positive, got {value}")
    _require(0 <= args.seed <= MAX_SEED, f"--seed must be between 0 and {MAX_SEED} (numpy's generator range), "
                                         f"got {args.seed}")


def _check_floats(args: argparse.Namespace) -> None:
    """Finite, in range: a NaN learning rate or a dropout of 1.5 is refused here, not found as a NaN loss."""
    for key in FLOAT_RANGES:
        value = vars(args).get(key)
        _require(value is None or within_range(key, value), f"{_flag(key)} must be {allowed(key)}, got {value}")


def _check_shape(args: argparse.Namespace) -> None:
    values = vars(args)
    for key in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "seq_length"):
        _require(key in values, f"{_flag(key)} is required (or pick a --model preset: {', '.join(PRESETS)})")
        _require(values[key] > 0, f"{_flag(key)} must be positive, got {values[key]}")
    _require(args.normalization == "RMSNorm",
             f"--normalization {args.normalization!r} is not supported; Llama uses RMSNorm")
    if args.num_query_groups is None or not args.group_query_attention:
        args.num_query_groups = args.num_attention_heads
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    heads, groups, tp = args.num_attention_heads, args.num_query_groups, args.tensor_model_parallel_size
    _require(args.hidden_size % heads == 0,
             f"--hidden-size {args.hidden_size} is not divisible by --num-attention-heads {heads}")
    _require(heads % groups == 0,
             f"--num-attention-heads {heads} is not divisible by --num-query-groups {groups}")
    _require(heads % tp == 0 and groups % tp == 0 and args.ffn_hidden_size % tp == 0,
             f"--tensor-model-parallel-size {tp} must divide --num-attention-heads {heads}, "
             f"--num-query-groups {groups} and --ffn-hidden-size {args.ffn_hidden_size}")
    _require(args.num_layers % args.pipeline_model_parallel_size == 0,
             f"--num-layers {args.num_layers} is not divisible by --pipeline-model-parallel-size "
             f"{args.pipeline_model_parallel_size}")
    _require(args.seq_length <= args.max_position_embeddings,
             f"--seq-length {args.seq_length} exceeds --max-position-embeddings {args.max_position_embeddings}")


def _check_devices(args: argparse.Namespace, cuda: bool) -> None:
    te = importlib.util.find_spec("transformer_engine") is not None
    _require(not (args.bf16 and args.fp16), "--bf16 and --fp16 are mutually exclusive")
    if args.fp8_format is not None and not emulates_precision(args):  # real FP8 (with --fp8-recipe: emulated)
        _require(te and cuda, f"--fp8-format {args.fp8_format} (DTYPE=fp8) needs Transformer Engine on a GPU, "
                              "which is not available here; to emulate FP8 add --fp8-recipe tensorwise, or use "
                              "DTYPE=bf16 with CUSTOM_QUANT_TYPE=fp8_e4m3")
        _require(args.bf16, "--fp8-format needs --bf16 (Transformer Engine keeps non-FP8 math in bf16)")
    if args.sequence_parallel:
        _require(args.tensor_model_parallel_size > 1, "--sequence-parallel needs --tensor-model-parallel-size > 1")
        _require(te and cuda, "--sequence-parallel needs Transformer Engine on a GPU: megatron-core's "
                              "local (non-TE) norms do not support it; drop --sequence-parallel")
    if not cuda:
        _require(args.pipeline_model_parallel_size == 1,
                 f"--pipeline-model-parallel-size {args.pipeline_model_parallel_size} needs GPUs: "
                 "megatron-core's pipeline schedules are CUDA-only; use 1 on CPU")
        _require(not args.fp16, "--fp16 needs GPUs (megatron-core's loss-scaling optimizer is CUDA-only); "
                                "use --bf16 on CPU")
        _require(not args.use_distributed_optimizer,
                 "--use-distributed-optimizer needs GPUs (megatron-core's optimizer is CUDA-only)")


def _check_run(args: argparse.Namespace, world_size: int) -> None:
    model_parallel = args.tensor_model_parallel_size * args.pipeline_model_parallel_size
    _require(world_size % model_parallel == 0,
             f"world size {world_size} is not divisible by tensor ({args.tensor_model_parallel_size}) x "
             f"pipeline ({args.pipeline_model_parallel_size}) model-parallel size")
    args.data_parallel_size = world_size // model_parallel
    per_step = args.micro_batch_size * args.data_parallel_size
    if args.global_batch_size is None:
        args.global_batch_size = per_step
    _require(args.micro_batch_size > 0 and args.global_batch_size > 0,
             "--micro-batch-size and --global-batch-size must be positive")
    samples_to_iterations(args)
    _require(args.global_batch_size % per_step == 0,
             f"--global-batch-size {args.global_batch_size} is not divisible by --micro-batch-size "
             f"{args.micro_batch_size} x data-parallel size {args.data_parallel_size}")
    args.num_microbatches = args.global_batch_size // per_step
    tokens = args.micro_batch_size * args.seq_length
    _require(tokens <= MAX_MICRO_BATCH_TOKENS,
             f"--micro-batch-size {args.micro_batch_size} x --seq-length {args.seq_length} = {tokens:,} tokens cannot "
             f"fit one micro-batch; allowed: at most {MAX_MICRO_BATCH_TOKENS:,} (megatron-core's datasets index "
             f"tokens with int32)")
    _require(args.train_iters > 0, f"--train-iters must be positive, got {args.train_iters}")
    _require(args.log_interval > 0 and args.eval_interval > 0 and args.eval_iters >= 0,
             "--log-interval and --eval-interval must be positive, --eval-iters non-negative")
    if args.lr_decay_iters is None:
        args.lr_decay_iters = args.train_iters
    _require(0 <= args.min_lr <= args.lr, f"need 0 <= --min-lr ({args.min_lr}) <= --lr ({args.lr})")
    _require(0 <= args.lr_warmup_iters < args.lr_decay_iters,
             f"--lr-warmup-iters {args.lr_warmup_iters} must be below --lr-decay-iters {args.lr_decay_iters}")
    _require(args.exit_interval is None or args.exit_interval > 0,
             f"--exit-interval must be positive, got {args.exit_interval}")
    if args.save_interval is not None:
        _require(args.save is not None, "--save-interval needs --save DIR")
        _require(args.save_interval > 0, f"--save-interval must be positive, got {args.save_interval}")
    if args.ckpt_step is not None:
        _require(args.load is not None, f"--ckpt-step {args.ckpt_step} needs --load DIR")
        _require(args.ckpt_step >= 0, f"--ckpt-step must be a non-negative iteration, got {args.ckpt_step}")
    _require(args.divergence_threshold is None or args.divergence_threshold > 0,
             f"--divergence-threshold must be positive, got {args.divergence_threshold}")


def _check_data(args: argparse.Namespace) -> None:
    _require((args.data_path is None) == args.mock_data,
             "give exactly one of --data-path PREFIX... and --mock-data")
    try:
        parse_blend(args.data_path)
    except ValueError as error:
        raise ArgumentError(str(error)) from None
    if args.tokenizer_type is None:
        args.tokenizer_type = "NullTokenizer" if args.mock_data and args.vocab_size else "ByteTokenizer"
    if args.tokenizer_type == "HuggingFaceTokenizer":
        _require(args.tokenizer_model is not None,
                 "--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model DIR (a local directory)")
    if args.tokenizer_type == "NullTokenizer":
        _require(args.vocab_size is not None, "--tokenizer-type NullTokenizer needs --vocab-size")


def validate_args(args: argparse.Namespace, world_size: int, cuda: bool) -> argparse.Namespace:
    """Complete derived values (data-parallel size, micro-batches, ...) and refuse bad combinations."""
    args.notices = [*args.notices, *adjust(args, cuda, importlib.util.find_spec("transformer_engine") is not None)]
    _check_sizes(args)
    _check_floats(args)
    _check_shape(args)
    _check_devices(args, cuda)
    try:
        check_recompute(args)
        check_llama_values(args)
        _check_run(args, world_size)
        args.notices += check_moe(args, args.data_parallel_size, cuda)
    except (MoEError, MegatronLMFlagError, RecomputeError) as error:
        raise ArgumentError(str(error)) from None
    _check_data(args)
    problem = wandb_flags_problem(args.wandb_project, args.wandb_exp_name, args.wandb_save_dir)
    _require(problem is None, str(problem))
    return args
