"""``python -m megatron.quant.training`` / ``megatron-quant-train``: pretrain Llama on megatron-core.

Flags are Megatron-LM's (see ``megatron.quant.training.arguments``); the precision comes from a
precision file, the precision flags or ``CUSTOM_QUANT_*``, capture from ``TENSOR_SAVE_*``: read once
into the run's typed configuration (``run_tree_build.build_run_tree``), checked and resolved into a
``run_config.RunConfiguration``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from megatron.quant import notices

notices.hide_known()  # before megatron-core is imported: its import-time fallback warnings are known

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from megatron.quant import kernels, tensor_saver  # noqa: E402
from megatron.quant.layers import fusions  # noqa: E402
from megatron.quant.layers.scaled_gemm import cpu_accumulation_notice  # noqa: E402
from megatron.quant.output_dir import OutputDirError, check_output_dir  # noqa: E402
from megatron.quant.recipes.precision import PrecisionConfig  # noqa: E402
from megatron.quant.recipes.presets import emulates_precision  # noqa: E402
from megatron.quant.tensor_saver import check_writable  # noqa: E402
from megatron.quant.training import checkpoint, metrics, optimizer  # noqa: E402
from megatron.quant.training.arguments import ArgumentError  # noqa: E402
from megatron.quant.training.config import TrainingConfig  # noqa: E402
from megatron.quant.training.cuda_graph import refusal  # noqa: E402
from megatron.quant.training.data import BatchLayout, build_datasets, check_data  # noqa: E402
from megatron.quant.training.hf_import import check_hf_checkpoint, load_hf_weights  # noqa: E402
from megatron.quant.training.lifetime import trainer_dies_with_parent  # noqa: E402
from megatron.quant.training.loop import Run, iterations_run, train  # noqa: E402
from megatron.quant.training.model import build_gpt, transformer_config  # noqa: E402
from megatron.quant.training.moe import check_router_precision, moe_run_fields  # noqa: E402
from megatron.quant.training.presets import SHAPE_KEYS  # noqa: E402
from megatron.quant.training.recipe_fit import check_hadamard_fit  # noqa: E402
from megatron.quant.training.run_config import (  # noqa: E402
    RunConfiguration,
    build_capture,
    build_precision,
    precision_origin,
)
from megatron.quant.training.run_tree import RunTree  # noqa: E402
from megatron.quant.training.run_tree_build import build_run_tree  # noqa: E402
from megatron.quant.training.run_tree_show import show_run_tree  # noqa: E402
from megatron.quant.training.tokenizers import build_tokenizer, padded_vocab_size  # noqa: E402
from megatron.quant.training.variables import environment_of  # noqa: E402


def _model_vocab_size(tree: RunTree, tokenizer) -> int:
    model, tp = tree.model, tree.parallel.tensor_model_parallel_size
    if model.vocab_size is None:
        return padded_vocab_size(tokenizer.vocab_size, model.make_vocab_size_divisible_by, tp)
    if model.vocab_size < tokenizer.vocab_size:
        raise ArgumentError(f"--vocab-size {model.vocab_size} is smaller than the {tree.data.tokenizer_type} "
                            f"vocabulary ({tokenizer.vocab_size})")
    if model.vocab_size % tp:
        raise ArgumentError(f"--vocab-size {model.vocab_size} is not divisible by --tensor-model-parallel-size {tp}")
    return model.vocab_size


def _te_fp8_format(tree: RunTree) -> str | None:
    """The FP8 format Transformer Engine runs for real: --fp8-format alone (with --fp8-recipe it is emulated)."""
    return None if emulates_precision(tree.precision) else tree.precision.fp8_format


def _quantization(precision: PrecisionConfig, num_layers: int) -> str:
    if len(precision.configs) > 1:
        return precision.describe()
    (recipe,) = precision.configs.values()
    kept = recipe.unquantized_layers(num_layers)
    return (recipe.name + (f" (decoder layers {', '.join(map(str, kept))} kept in bf16)" if kept else "")
            + (f" (schedule: {recipe.schedule.describe()})" if recipe.schedule else ""))


def _check_fp8_recipe(tree: RunTree, recipe) -> None:
    from megatron.quant import formats

    simulated = not formats.is_passthrough(recipe.format.name) or recipe.operands or recipe.rules
    if _te_fp8_format(tree) and simulated:
        raise ArgumentError(f"DTYPE=fp8 (--fp8-format) runs real FP8 GEMMs in Transformer Engine; it cannot be "
                            f"combined with the simulated format {recipe.name!r}: "
                            "unset CUSTOM_QUANT_TYPE or use DTYPE=bf16")


def _wrap(tree: RunTree, config, gpt, cuda: bool) -> list:
    """Float16Module for 16-bit runs, then megatron-core DDP (fp32 gradient reduction)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer.module import Float16Module

    model = gpt.cuda() if cuda else gpt
    if tree.precision.compute() != "fp32":
        model = Float16Module(config, model)
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True,
                                               use_distributed_optimizer=tree.optimizer.use_distributed_optimizer)
    return [DistributedDataParallel(config, ddp_config, model)]


def connect_schedule(config, chunks: list, scale_loss: Optional[Callable]) -> None:
    """The hooks megatron-core's schedule calls (Megatron-LM's training.py wires the same ones);
    ``scale_loss``: the optimizer's loss scaling (None: none)."""
    from megatron.core.distributed import finalize_model_grads

    config.grad_scale_func = scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = chunks[0].no_sync


def _print_start(logger, inputs: RunConfiguration, num_params: int, flops: float, fused: str) -> None:
    tree, shape, precision = inputs.tree, inputs.shape, inputs.precision
    parallel, schedule = tree.parallel, tree.schedule
    cuda = torch.cuda.is_available()
    kernel_line = kernels.describe(precision.formats(shape["num_layers"]), precision.compile, inputs.kernels, cuda)
    memory = metrics.memory_estimate_gb(
        shape, num_parameters=num_params, micro_batch_size=schedule.micro_batch_size, seq_length=shape["seq_length"],
        tensor_parallel=parallel.tensor_model_parallel_size, pipeline_parallel=parallel.pipeline_model_parallel_size,
        data_parallel=parallel.data_parallel_size, precision=tree.precision.compute(),
        distributed_optimizer=tree.optimizer.use_distributed_optimizer)
    logger.print(f"model: {tree.model.model or tree.model.hf_checkpoint or 'custom'} | layers "
                 f"{shape['num_layers']}, hidden {shape['hidden_size']}, ffn {shape['ffn_hidden_size']}, heads "
                 f"{shape['num_attention_heads']}, kv groups {shape['num_query_groups']}, vocab {shape['vocab_size']}, "
                 f"seq {shape['seq_length']}"
                 + (f" | experts {shape['num_experts']} (top-{shape['moe_router_topk']}, EP "
                    f"{parallel.expert_model_parallel_size})" if shape["num_experts"] else ""))
    logger.print(f"parallel: TP {parallel.tensor_model_parallel_size} x PP {parallel.pipeline_model_parallel_size} x "
                 f"DP {parallel.data_parallel_size} | micro-batch {schedule.micro_batch_size} x "
                 f"{schedule.num_microbatches} micro-batches = global batch {schedule.global_batch_size} | precision "
                 f"{tree.precision.compute()} | quantization {_quantization(precision, shape['num_layers'])} | "
                 f"device {'cuda' if cuda else 'cpu'} | {kernel_line} | {fused}")
    notice = cpu_accumulation_notice([recipe.accumulation() for recipe in precision.configs.values()], cuda)
    if notice:
        logger.print(notice)
    logger.print(f"parameters: {num_params:,} | FLOPs per iteration: {flops:.3e} {notices.describe_hidden()}".rstrip())
    logger.print("memory estimate per rank (GB): " + ", ".join(f"{k} {v:.3f}" for k, v in memory.items())
                 + f", total {sum(memory.values()):.3f}")


def check_inputs(argv: Sequence[str] | None = None) -> RunConfiguration:
    """``check_run`` of the configuration ``argv`` (None: the command line) and the environment give."""
    return check_run(build_run_tree(argv, cuda=torch.cuda.is_available()))


def check_run(tree: RunTree) -> RunConfiguration:
    """Check the run ``tree`` describes, the files it names and the CUSTOM_QUANT_*/TENSOR_SAVE_* settings,
    and resolve them into the run's configuration (``run_config.PRECEDENCE``);
    ArgumentError/ValueError/FileNotFoundError with a one-line reason."""
    cuda = torch.cuda.is_available()
    settings = tree.environment.settings
    precision = build_precision(tree)  # stochastic rounding follows --seed unless a recipe fixes one
    kernel_backend = kernels.backend(settings)  # a bad CUSTOM_QUANT_KERNELS fails here, before any process starts
    precision = precision.with_kernels(kernel_backend)  # and the layers take it from here, not from the environment
    fast_paths = fusions.choose(settings, cuda=cuda, precision=tree.precision.compute())  # and CUSTOM_QUANT_FUSIONS
    check_router_precision(precision, tree, precision_origin(tree))
    num_layers = tree.model.num_layers
    for recipe in precision.configs.values():
        _check_fp8_recipe(tree, recipe)
        check_hadamard_fit(recipe, num_layers, tree.schedule.micro_batch_size, tree.model.seq_length)
    saver_config, precision, plan = build_capture(tree.output.tensor_inspect_config, settings, precision, num_layers)
    refused = refusal(tree, precision, capturing=saver_config.enabled or plan is not None)
    if refused:
        raise ArgumentError(refused)
    tokenizer = build_tokenizer(tree.data.tokenizer_type, tree.data.tokenizer_model, tree.model.vocab_size)
    shape = tree.shape(SHAPE_KEYS)
    shape["vocab_size"] = _model_vocab_size(tree, tokenizer)
    saver_config.check_selectors(num_layers=num_layers, world_size=tree.environment.world_size,
                                 num_microbatches=tree.schedule.num_microbatches,
                                 roles=precision.capture_roles(num_layers, moe=bool(shape["num_experts"]),
                                                               mla=bool(shape["multi_latent_attention"])))
    if saver_config.enabled:  # --check-args and the launch scripts refuse it before torchrun starts
        check_writable(saver_config.save_dir)
    for flag, directory in (("--save", tree.checkpoint.save), ("--tensorboard-dir", tree.output.tensorboard_dir),
                            ("--data-cache-path", tree.data.data_cache_path)):  # refused now, not at the first write
        if directory:
            check_output_dir(Path(directory), flag)
    check_data(tree.data.data_path)
    if tree.model.hf_checkpoint:
        check_hf_checkpoint(tree.model.hf_checkpoint, shape)
    load, step = tree.checkpoint.load, tree.checkpoint.ckpt_step
    if load and (step is not None or checkpoint.latest_iteration(load) is not None):
        checkpoint.check_resume(checkpoint.verified_checkpoint_dir(load, step), tree)
    return RunConfiguration(tree, precision, saver_config, fast_paths, kernel_backend, environment_of(settings),
                            shape, tokenizer, plan)


def setup(inputs: RunConfiguration) -> tuple[Run, metrics.MetricsLogger]:
    """Initialise parallel state, build model, optimizer, data; load a checkpoint."""
    from megatron.quant.cpu import init_parallel

    cuda = torch.cuda.is_available()
    tree, precision, tokenizer, shape = inputs.tree, inputs.precision, inputs.tokenizer, inputs.shape
    model, parallel, schedule, data, ckpt = tree.model, tree.parallel, tree.schedule, tree.data, tree.checkpoint

    init_parallel(parallel.tensor_model_parallel_size, parallel.pipeline_model_parallel_size, schedule.seed,
                  expert_model_parallel_size=parallel.expert_model_parallel_size)
    logger = metrics.MetricsLogger(tree.output.tensorboard_dir, enabled=dist.get_rank() == dist.get_world_size() - 1)
    config = transformer_config(
        shape, precision=tree.precision.compute(), tensor_parallel=parallel.tensor_model_parallel_size,
        pipeline_parallel=parallel.pipeline_model_parallel_size, sequence_parallel=parallel.sequence_parallel,
        init_method_std=model.init_method_std, attention_dropout=model.attention_dropout,
        hidden_dropout=model.hidden_dropout, fp8_format=_te_fp8_format(tree),
        tp_only_amax_red=tree.precision.tp_only_amax_red, recompute_granularity=parallel.recompute_granularity,
        recompute_method=parallel.recompute_method, recompute_num_layers=parallel.recompute_num_layers,
        fusion_flags=inputs.fast_paths.config_flags(), quant_recipe=precision, moe_run=moe_run_fields(tree))
    gpt = build_gpt(config, shape, sdpa=inputs.fast_paths.sdpa)
    if model.hf_checkpoint:
        load_hf_weights(gpt, model.hf_checkpoint, shape)
    chunks = _wrap(tree, config, gpt, cuda)
    opt = optimizer.build_optimizer(tree, chunks, cuda)
    if cuda:
        connect_schedule(config, chunks, opt.scale_loss)
    scheduler = optimizer.build_scheduler(tree, opt)

    train_iters, batch = schedule.train_iters, schedule.global_batch_size
    eval_samples = (train_iters // schedule.eval_interval + 1) * schedule.eval_iters * batch
    train_data, valid_data, _ = build_datasets(
        tokenizer, seq_length=model.seq_length, seed=schedule.seed, data_path=data.data_path, split=data.split,
        num_samples=[train_iters * batch, eval_samples, 0], cache_path=data.data_cache_path)
    if schedule.eval_iters and valid_data is None:
        raise ArgumentError(f"--split {data.split!r} leaves no validation data; give it a validation share "
                            "or set --eval-iters 0")

    start = 0
    if ckpt.load and (ckpt.ckpt_step is not None or checkpoint.latest_iteration(ckpt.load) is not None):
        keep_optim = not ckpt.no_load_optim
        start = checkpoint.load_checkpoint(ckpt.load, gpt, opt if keep_optim else None,
                                           scheduler if keep_optim else None, restore_rng=not ckpt.no_load_rng,
                                           step=ckpt.ckpt_step, shape=shape)
        logger.print(f"resumed from {ckpt.load} at iteration {start}")
    elif ckpt.load:
        logger.print(f"no checkpoint in {ckpt.load}: starting from scratch")
    # a resume at --train-iters trains (and captures) nothing: no window to intersect
    tensor_saver.configure(inputs.capture, run_iterations=iterations_run(start, train_iters) or None,
                           plan=inputs.inspect, num_layers=shape["num_layers"])

    num_params = metrics.num_parameters(shape)
    flops = metrics.flops_per_iteration(shape, global_batch_size=batch, seq_length=model.seq_length,
                                        vocab_size=shape["vocab_size"])
    _print_start(logger, inputs, num_params, flops, inputs.fast_paths.describe(gpt))
    logger.print(inputs.describe())
    run = Run(config=TrainingConfig.from_flags(tree.flags()), model_chunks=chunks, gpt=gpt, optimizer=opt,
              scheduler=scheduler, train_data=train_data, valid_data=valid_data,
              layout=BatchLayout(schedule.micro_batch_size, batch, parallel.data_parallel_size),
              flops_per_iteration=flops,
              peak_tflops=metrics.peak_tflops(metrics.device_name(), tree.output.peak_tflops),
              run_config=inputs.record(), cuda=cuda, start_iteration=start)
    return run, logger


def teardown(owns_process_group: bool) -> None:
    """End what ``setup`` started: the parallel state, and the process group where ``setup`` made it."""
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
    ``--print-config`` prints the resolved configuration with each value's source and ``--check-args``
    stops after checking the arguments and environment (both status 0).
    """
    owns_process_group = not dist.is_initialized()
    try:
        tree = build_run_tree(argv, cuda=torch.cuda.is_available())
        trainer_dies_with_parent(tree.environment)  # under a sweep: not one step beyond its end (lifetime.py)
        if tree.action.print_config:
            print(show_run_tree(tree))
            return []
        inputs = check_run(tree)
        if tree.environment.first_rank():  # one notice per flag, not one per rank
            for notice in tree.notices:
                print(f"megatron-quant-train: notice: {notice}")
        if tree.action.check_args:
            print("megatron-quant-train: arguments OK")
            return []
        run, logger = setup(inputs)
    except (ArgumentError, ValueError, FileNotFoundError, OutputDirError) as err:
        print(f"megatron-quant-train: error: {err}", file=sys.stderr)
        teardown(owns_process_group)
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
        teardown(owns_process_group)


if __name__ == "__main__":
    main()
