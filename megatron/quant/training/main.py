"""``python -m megatron.quant.training`` / ``megatron-quant-train``: pretrain Llama on megatron-core.

Flags are Megatron-LM's (see ``megatron.quant.training.arguments``); the precision comes from a
precision file, the precision flags or ``CUSTOM_QUANT_*``, capture from ``TENSOR_SAVE_*``, parsed
once into a ``run_config.RunConfiguration``.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Sequence

from megatron.quant import notices

notices.hide_known()  # before megatron-core is imported: its import-time fallback warnings are known

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from megatron.quant import kernels, tensor_saver  # noqa: E402
from megatron.quant.layers import fusions  # noqa: E402
from megatron.quant.output_dir import OutputDirError, check_output_dir  # noqa: E402
from megatron.quant.recipes.precision import PrecisionConfig  # noqa: E402
from megatron.quant.recipes.presets import emulates_precision  # noqa: E402
from megatron.quant.tensor_saver import check_writable  # noqa: E402
from megatron.quant.training import checkpoint, metrics, optimizer  # noqa: E402
from megatron.quant.training.arguments import ArgumentError, parse_args, validate_args  # noqa: E402
from megatron.quant.training.config import TrainingConfig  # noqa: E402
from megatron.quant.training.data import BatchLayout, build_datasets, check_data  # noqa: E402
from megatron.quant.training.hf_import import check_hf_checkpoint, load_hf_weights  # noqa: E402
from megatron.quant.training.lifetime import trainer_dies_with_parent  # noqa: E402
from megatron.quant.training.loop import Run, iterations_run, train  # noqa: E402
from megatron.quant.training.model import build_gpt, transformer_config  # noqa: E402
from megatron.quant.training.moe import check_router_precision, moe_run_fields  # noqa: E402
from megatron.quant.training.presets import SHAPE_KEYS  # noqa: E402
from megatron.quant.training.recipe_fit import check_hadamard_fit  # noqa: E402
from megatron.quant.training.run_config import RunConfiguration, build_capture, build_precision, precision_origin  # noqa: E402
from megatron.quant.training.tokenizers import build_tokenizer, padded_vocab_size  # noqa: E402
from megatron.quant.training.variables import environment_of  # noqa: E402


def _precision(args) -> str:
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"


def _model_vocab_size(args, tokenizer) -> int:
    if args.vocab_size is None:
        return padded_vocab_size(tokenizer.vocab_size, args.make_vocab_size_divisible_by,
                                 args.tensor_model_parallel_size)
    if args.vocab_size < tokenizer.vocab_size:
        raise ArgumentError(f"--vocab-size {args.vocab_size} is smaller than the {args.tokenizer_type} "
                            f"vocabulary ({tokenizer.vocab_size})")
    if args.vocab_size % args.tensor_model_parallel_size:
        raise ArgumentError(f"--vocab-size {args.vocab_size} is not divisible by --tensor-model-parallel-size "
                            f"{args.tensor_model_parallel_size}")
    return args.vocab_size


def _te_fp8_format(args) -> str | None:
    """The FP8 format Transformer Engine runs for real: --fp8-format alone (with --fp8-recipe it is emulated)."""
    return None if emulates_precision(args) else args.fp8_format


def _quantization(precision: PrecisionConfig, num_layers: int) -> str:
    if len(precision.configs) > 1:
        return precision.describe()
    (recipe,) = precision.configs.values()
    kept = recipe.unquantized_layers(num_layers)
    return (recipe.name + (f" (decoder layers {', '.join(map(str, kept))} kept in bf16)" if kept else "")
            + (f" (schedule: {recipe.schedule.describe()})" if recipe.schedule else ""))


def _check_fp8_recipe(args, recipe) -> None:
    from megatron.quant import formats

    simulated = not formats.is_passthrough(recipe.format.name) or recipe.operands or recipe.rules
    if _te_fp8_format(args) and simulated:
        raise ArgumentError(f"DTYPE=fp8 (--fp8-format) runs real FP8 GEMMs in Transformer Engine; it cannot be "
                            f"combined with the simulated format {recipe.name!r}: "
                            "unset CUSTOM_QUANT_TYPE or use DTYPE=bf16")


def _wrap(args, config, gpt, cuda: bool) -> list:
    """Float16Module for 16-bit runs, then megatron-core DDP (fp32 gradient reduction)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer.module import Float16Module

    model = gpt.cuda() if cuda else gpt
    if args.bf16 or args.fp16:
        model = Float16Module(config, model)
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True,
                                               use_distributed_optimizer=args.use_distributed_optimizer)
    return [DistributedDataParallel(config, ddp_config, model)]


def _connect_schedule(config, chunks: list, opt) -> None:
    # megatron-core's schedule calls these hooks (Megatron-LM's training.py wires the same ones).
    from megatron.core.distributed import finalize_model_grads

    config.grad_scale_func = opt.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = chunks[0].no_sync


def _print_start(logger, args, shape, precision: PrecisionConfig, num_params: int, flops: float, fused: str) -> None:
    cuda = torch.cuda.is_available()
    kernel_line = kernels.describe(precision.formats(shape["num_layers"]), precision.compile, kernels.backend(), cuda)
    memory = metrics.memory_estimate_gb(
        shape, num_parameters=num_params, micro_batch_size=args.micro_batch_size, seq_length=args.seq_length,
        tensor_parallel=args.tensor_model_parallel_size, pipeline_parallel=args.pipeline_model_parallel_size,
        data_parallel=args.data_parallel_size, precision=_precision(args),
        distributed_optimizer=args.use_distributed_optimizer)
    logger.print(f"model: {args.model or args.hf_checkpoint or 'custom'} | layers {shape['num_layers']}, hidden "
                 f"{shape['hidden_size']}, ffn {shape['ffn_hidden_size']}, heads {shape['num_attention_heads']}, "
                 f"kv groups {shape['num_query_groups']}, vocab {shape['vocab_size']}, seq {args.seq_length}"
                 + (f" | experts {shape['num_experts']} (top-{shape['moe_router_topk']}, EP "
                    f"{args.expert_model_parallel_size})" if shape["num_experts"] else ""))
    logger.print(f"parallel: TP {args.tensor_model_parallel_size} x PP {args.pipeline_model_parallel_size} x DP "
                 f"{args.data_parallel_size} | micro-batch {args.micro_batch_size} x {args.num_microbatches} "
                 f"micro-batches = global batch {args.global_batch_size} | precision {_precision(args)} | "
                 f"quantization {_quantization(precision, shape['num_layers'])} | "
                 f"device {'cuda' if torch.cuda.is_available() else 'cpu'} | "
                 f"{kernel_line} | {fused}")
    logger.print(f"parameters: {num_params:,} | FLOPs per iteration: {flops:.3e} {notices.describe_hidden()}".rstrip())
    logger.print("memory estimate per rank (GB): " + ", ".join(f"{k} {v:.3f}" for k, v in memory.items())
                 + f", total {sum(memory.values()):.3f}")


def check_inputs(argv: Sequence[str] | None = None) -> RunConfiguration:
    """Parse and validate the flags, the files they name and the CUSTOM_QUANT_*/TENSOR_SAVE_* environment
    into the run's configuration (``run_config.PRECEDENCE``); ArgumentError/ValueError/FileNotFoundError
    with a one-line reason."""
    cuda = torch.cuda.is_available()
    args = validate_args(parse_args(argv), int(os.environ.get("WORLD_SIZE", "1")), cuda)
    precision = build_precision(args, os.environ)  # stochastic rounding follows --seed unless a recipe fixes one
    kernel_backend = kernels.backend(os.environ)  # a bad CUSTOM_QUANT_KERNELS fails here, before any process starts
    fast_paths = fusions.choose(os.environ, cuda=cuda, precision=_precision(args))  # and a bad CUSTOM_QUANT_FUSIONS
    check_router_precision(precision, args, precision_origin(args, os.environ))
    for recipe in precision.configs.values():
        _check_fp8_recipe(args, recipe)
        check_hadamard_fit(recipe, args.num_layers, args.micro_batch_size, args.seq_length)
    saver_config, precision, plan = build_capture(args, os.environ, precision, args.num_layers)
    tokenizer = build_tokenizer(args.tokenizer_type, args.tokenizer_model, args.vocab_size)
    shape = {key: getattr(args, key) for key in SHAPE_KEYS}
    shape["vocab_size"] = _model_vocab_size(args, tokenizer)
    saver_config.check_selectors(num_layers=shape["num_layers"], world_size=int(os.environ.get("WORLD_SIZE", "1")),
                                 num_microbatches=args.num_microbatches,
                                 roles=precision.capture_roles(shape["num_layers"], moe=bool(shape["num_experts"])))
    if saver_config.enabled:  # --check-args and the launch scripts refuse it before torchrun starts
        check_writable(saver_config.save_dir)
    for option in ("save", "tensorboard_dir", "data_cache_path"):  # refused now, not at the first write
        if getattr(args, option):
            check_output_dir(Path(getattr(args, option)), f"--{option.replace('_', '-')}")
    check_data(args.data_path)
    if args.hf_checkpoint:
        check_hf_checkpoint(args.hf_checkpoint, shape)
    if args.load and (args.ckpt_step is not None or checkpoint.latest_iteration(args.load) is not None):
        checkpoint.check_resume(checkpoint.verified_checkpoint_dir(args.load, args.ckpt_step), args)
    return RunConfiguration(args, precision, saver_config, fast_paths, kernel_backend, environment_of(os.environ),
                            shape, tokenizer, plan)


def setup(inputs: RunConfiguration) -> tuple[Run, metrics.MetricsLogger]:
    """Initialise parallel state, build model, optimizer, data; load a checkpoint."""
    from megatron.quant.cpu import init_parallel

    cuda = torch.cuda.is_available()
    args, precision, tokenizer, shape = inputs.args, inputs.precision, inputs.tokenizer, inputs.shape

    init_parallel(args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.seed,
                  expert_model_parallel_size=args.expert_model_parallel_size)
    logger = metrics.MetricsLogger(args.tensorboard_dir, enabled=dist.get_rank() == dist.get_world_size() - 1)
    config = transformer_config(
        shape, precision=_precision(args), tensor_parallel=args.tensor_model_parallel_size,
        pipeline_parallel=args.pipeline_model_parallel_size, sequence_parallel=args.sequence_parallel,
        init_method_std=args.init_method_std, attention_dropout=args.attention_dropout,
        hidden_dropout=args.hidden_dropout, fp8_format=_te_fp8_format(args), tp_only_amax_red=args.tp_only_amax_red,
        recompute_granularity=args.recompute_granularity, recompute_method=args.recompute_method,
        recompute_num_layers=args.recompute_num_layers, fusion_flags=inputs.fast_paths.config_flags(),
        quant_recipe=precision, moe_run=moe_run_fields(args))
    gpt = build_gpt(config, shape, sdpa=inputs.fast_paths.sdpa)
    if args.hf_checkpoint:
        load_hf_weights(gpt, args.hf_checkpoint, shape)
    chunks = _wrap(args, config, gpt, cuda)
    opt = optimizer.build_optimizer(args, chunks, cuda)
    if cuda:
        _connect_schedule(config, chunks, opt)
    scheduler = optimizer.build_scheduler(args, opt)

    eval_samples = (args.train_iters // args.eval_interval + 1) * args.eval_iters * args.global_batch_size
    train_data, valid_data, _ = build_datasets(
        tokenizer, seq_length=args.seq_length, seed=args.seed, data_path=args.data_path, split=args.split,
        num_samples=[args.train_iters * args.global_batch_size, eval_samples, 0], cache_path=args.data_cache_path)
    if args.eval_iters and valid_data is None:
        raise ArgumentError(f"--split {args.split!r} leaves no validation data; give it a validation share "
                            "or set --eval-iters 0")

    start = 0
    if args.load and (args.ckpt_step is not None or checkpoint.latest_iteration(args.load) is not None):
        keep_optim = not args.no_load_optim
        start = checkpoint.load_checkpoint(args.load, gpt, opt if keep_optim else None,
                                           scheduler if keep_optim else None, restore_rng=not args.no_load_rng,
                                           step=args.ckpt_step, shape=shape)
        logger.print(f"resumed from {args.load} at iteration {start}")
    elif args.load:
        logger.print(f"no checkpoint in {args.load}: starting from scratch")
    # a resume at --train-iters trains (and captures) nothing: no window to intersect
    tensor_saver.configure(inputs.capture, run_iterations=iterations_run(start, args.train_iters) or None,
                           plan=inputs.inspect, num_layers=shape["num_layers"])

    num_params = metrics.num_parameters(shape)
    flops = metrics.flops_per_iteration(shape, global_batch_size=args.global_batch_size,
                                        seq_length=args.seq_length, vocab_size=shape["vocab_size"])
    _print_start(logger, args, shape, precision, num_params, flops, inputs.fast_paths.describe(gpt))
    logger.print(inputs.describe())
    run = Run(config=TrainingConfig.from_args(args), model_chunks=chunks, gpt=gpt, optimizer=opt, scheduler=scheduler,
              train_data=train_data, valid_data=valid_data,
              layout=BatchLayout(args.micro_batch_size, args.global_batch_size, args.data_parallel_size),
              flops_per_iteration=flops, peak_tflops=metrics.peak_tflops(metrics.device_name(), args.peak_tflops),
              run_config=inputs.record(),
              cuda=cuda, start_iteration=start)
    return run, logger


def _teardown(owns_process_group: bool) -> None:
    # A caller that set up torch.distributed itself (tests, notebooks) keeps its process group.
    from megatron.core import parallel_state

    from megatron.quant.cpu import destroy_parallel

    if owns_process_group and dist.is_initialized():
        destroy_parallel()
    elif parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()


def main(argv: Sequence[str] | None = None) -> list[dict]:
    """Run training and return the per-iteration logged values.

    Bad arguments, environment or checkpoint exit with status 2 and a one-line reason;
    ``--check-args`` stops after checking the arguments and environment (status 0).
    """
    trainer_dies_with_parent()  # under a sweep: not one step beyond its end (training/lifetime.py)
    owns_process_group = not dist.is_initialized()
    try:
        inputs = check_inputs(argv)
        if os.environ.get("RANK", "0") == "0":  # one notice per flag, not one per rank
            for notice in inputs.args.notices:
                print(f"megatron-quant-train: notice: {notice}")
        if inputs.args.check_args:
            print("megatron-quant-train: arguments OK")
            return []
        run, logger = setup(inputs)
    except (ArgumentError, ValueError, FileNotFoundError, OutputDirError) as err:
        print(f"megatron-quant-train: error: {err}", file=sys.stderr)
        _teardown(owns_process_group)
        raise SystemExit(2) from err
    started = metrics.process_seconds()  # the interpreter, the imports, the checks and the set-up
    if started is not None:
        logger.scalars(run.start_iteration + 1, {"start-up seconds": started}, prefix="time/")
        logger.print(f"ready to train {started:.1f} s after the process started")
    try:
        return train(run, logger)
    finally:
        logger.close()
        tensor_saver.close()
        _teardown(owns_process_group)


if __name__ == "__main__":
    main()
