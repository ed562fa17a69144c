"""The training loop: micro-batches, gradient accumulation, optimizer step, logging, eval, checkpoints.

One iteration = ``num_microbatches`` forward/backward passes per data-parallel rank, then one
optimizer step. On GPU megatron-core's schedule (pipeline-aware) runs the passes; on CPU a
plain loop does, with the loss scaled exactly as the schedule scales it.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import torch
import torch.distributed as dist

from megatron.quant import tensor_saver
from megatron.quant.layers.linear import invalidate_quantized_weights
from megatron.quant.training import checkpoint
from megatron.quant.training.data import BatchLayout, get_batch
from megatron.quant.training.metrics import DIVERGED, MetricsLogger, capture_digest, format_line


@dataclass
class Run:
    """Everything the loop needs, built by ``megatron.quant.training.main.setup``."""

    args: Any
    model_chunks: list          # DDP-wrapped model(s): what forward/backward runs on
    gpt: torch.nn.Module        # the unwrapped GPTModel: what checkpoints hold
    optimizer: Any
    scheduler: Any
    train_data: Any
    valid_data: Any
    layout: BatchLayout
    flops_per_iteration: float
    peak_tflops: float | None
    run_config: dict
    cuda: bool
    start_iteration: int = 0
    history: list = field(default_factory=list)  # per-iteration logged values


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """Megatron-LM's 3-tuple loss: (sum of token losses, token count, {"lm loss": [sum, count]})."""
    mask = loss_mask.reshape(-1).float()
    loss_sum = (output_tensor.float().reshape(-1) * mask).sum()
    num_tokens = mask.sum().to(torch.int)
    return loss_sum, num_tokens, {"lm loss": torch.stack([loss_sum.detach(), mask.sum()])}


def _forward(model, batch: dict) -> torch.Tensor:
    return model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])


def _batches(run: Run, dataset, iteration: int, on_microbatch: Callable[[int, int], None] | None):
    """This rank's micro-batches of ``iteration``, announcing each one first."""
    from megatron.core import parallel_state

    dp_rank = parallel_state.get_data_parallel_rank()
    device = torch.cuda.current_device() if run.cuda else "cpu"
    for mb in range(run.args.num_microbatches):
        if on_microbatch is not None:
            on_microbatch(mb, run.layout.first_sample(iteration, mb, dp_rank))
        batch = get_batch(dataset, run.layout, iteration, mb, dp_rank)
        yield {key: value.to(device) for key, value in batch.items()}


def _reduce_loss(reports: list[torch.Tensor]) -> float:
    """Token-weighted mean loss over micro-batches and data-parallel ranks."""
    from megatron.core import parallel_state

    if not reports:
        return float("nan")  # not the last pipeline stage
    total = torch.stack(reports).sum(0).double()
    if parallel_state.get_data_parallel_world_size() > 1:
        dist.all_reduce(total, group=parallel_state.get_data_parallel_group())
    return (total[0] / total[1].clamp(min=1)).item()


def _forward_backward_cpu(run: Run, batches, forward_only: bool) -> list[torch.Tensor]:
    model, n = run.model_chunks[0], run.args.num_microbatches
    reports = []
    for batch in batches:
        with torch.set_grad_enabled(not forward_only):
            loss_sum, num_tokens, report = loss_func(batch["loss_mask"], _forward(model, batch))
            if not forward_only:
                # The scaling megatron-core's schedule applies: per-token mean, averaged over micro-batches.
                (loss_sum / num_tokens.clamp(min=1) / n).backward()
        reports.append(report["lm loss"])
    if not forward_only:
        for chunk in run.model_chunks:
            chunk.finish_grad_sync()
    return reports


def _forward_backward_gpu(run: Run, batches, forward_only: bool) -> list[torch.Tensor]:
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def forward_step(data_iterator, model):
        batch = next(data_iterator)
        return _forward(model, batch), partial(loss_func, batch["loss_mask"])

    outputs = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter(batches), model=run.model_chunks,
        num_microbatches=run.args.num_microbatches, seq_length=run.args.seq_length,
        micro_batch_size=run.args.micro_batch_size, forward_only=forward_only)
    return [out["lm loss"] for out in outputs]


def train_step(run: Run, iteration: int) -> dict[str, float]:
    """One iteration; returns loss, grad norm, learning rate."""
    for chunk in run.model_chunks:
        chunk.train()
        chunk.zero_grad_buffer()
    run.optimizer.zero_grad()
    batches = _batches(run, run.train_data, iteration, tensor_saver.set_microbatch)
    step = _forward_backward_gpu if run.cuda else _forward_backward_cpu
    reports = step(run, batches, forward_only=False)
    ok, grad_norm, _ = run.optimizer.step()
    # megatron-core's GPU optimizers write weights through .data and buffer views, which the
    # quantized-weight cache's version check cannot see.
    for chunk in run.model_chunks:
        invalidate_quantized_weights(chunk)
    lr = run.optimizer.param_groups[0]["lr"]
    if ok:
        run.scheduler.step(increment=1)
    return {"lm loss": _reduce_loss(reports), "learning rate": lr,
            "grad norm": float(grad_norm) if grad_norm is not None else float("nan"),
            "skipped iterations": 0 if ok else 1}


@torch.no_grad()
def evaluate(run: Run, iteration: int) -> float:
    """Mean validation loss over ``--eval-iters`` global batches."""
    for chunk in run.model_chunks:
        chunk.eval()
    step = _forward_backward_gpu if run.cuda else _forward_backward_cpu
    reports = []
    for i in range(run.args.eval_iters):
        reports += step(run, _batches(run, run.valid_data, iteration * run.args.eval_iters + i, None), True)
    return _reduce_loss(reports)


def _speed(run: Run, seconds: float) -> dict[str, float]:
    tokens = run.args.global_batch_size * run.args.seq_length
    tflops = run.flops_per_iteration / seconds / dist.get_world_size() / 1e12
    values = {"iteration time (s)": seconds, "tokens/s": tokens / seconds, "TFLOP/s/device": tflops}
    if run.peak_tflops:
        values["MFU"] = tflops / run.peak_tflops
    return values


def _save(run: Run, iteration: int, logger: MetricsLogger) -> None:
    path = checkpoint.save_checkpoint(run.args.save, iteration, run.gpt, run.optimizer, run.scheduler,
                                      run.run_config)
    logger.print(f"saved checkpoint at iteration {iteration} to {path}")


def diverged(loss: float, threshold: float | None) -> bool:
    """A NaN/Inf loss, or one above ``threshold`` (None: no threshold)."""
    return not math.isfinite(loss) or (threshold is not None and loss > threshold)


def _any_rank_diverged(run: Run, loss: float) -> bool:
    """The last pipeline stage's verdict (the others have no loss), agreed on by every rank."""
    from megatron.core import parallel_state

    mine = parallel_state.is_pipeline_last_stage() and diverged(loss, run.args.divergence_threshold)
    if dist.get_world_size() == 1:
        return mine
    flag = torch.tensor([float(mine)], device=torch.cuda.current_device() if run.cuda else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _remove_file(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _record_divergence(run: Run, iteration: int, loss: float, logger: MetricsLogger) -> None:
    logger.print(f"diverged at iteration {iteration}: lm loss {loss} (--divergence-threshold "
                 f"{run.args.divergence_threshold}); stopping without saving this state")
    logger.scalars(iteration, {"diverged": 1.0})
    if run.args.save and dist.get_rank() == dist.get_world_size() - 1:
        os.makedirs(run.args.save, exist_ok=True)
        with open(os.path.join(run.args.save, DIVERGED), "w") as f:
            json.dump({"iteration": iteration, "lm loss": repr(loss),
                       "divergence_threshold": run.args.divergence_threshold}, f)


def train(run: Run, logger: MetricsLogger) -> list[dict]:
    """Iterate from ``run.start_iteration`` to ``--train-iters``; returns the per-iteration values.

    A diverged run (see ``diverged``) stops early, writes ``DIVERGED`` into ``--save`` and saves
    no checkpoint of the diverged state.
    """
    args = run.args
    iteration = run.start_iteration
    if args.save and dist.get_rank() == dist.get_world_size() - 1:
        _remove_file(os.path.join(args.save, DIVERGED))  # a verdict on an earlier attempt
    if args.wandb_project:
        logger.start_wandb(args.wandb_project, args.wandb_exp_name, args.wandb_save_dir,
                           {key: str(value) for key, value in vars(args).items()})
    while iteration < args.train_iters:
        tensor_saver.set_iteration(iteration)
        start = time.perf_counter()
        values = train_step(run, iteration)
        values.update(_speed(run, time.perf_counter() - start))
        capture = tensor_saver.iteration_summary()
        iteration += 1
        run.history.append(dict(values, **capture, iteration=iteration))
        logger.scalars(iteration, {**values, **capture})
        if capture or iteration % args.log_interval == 0 or iteration == args.train_iters:
            logger.print(format_line(iteration, args.train_iters, {**values, **capture_digest(capture)}))
        if _any_rank_diverged(run, values["lm loss"]):
            _record_divergence(run, iteration, values["lm loss"], logger)
            tensor_saver.flush()
            return run.history
        if args.eval_iters and iteration % args.eval_interval == 0:
            with tensor_saver.paused():  # eval forwards are not part of the captured training iteration
                val = evaluate(run, iteration // args.eval_interval)
            logger.scalars(iteration, {"lm loss": val}, prefix="validation/")
            logger.print(f"validation at iteration {iteration} | lm loss: {val:.4f}")
        if args.save and args.save_interval and iteration % args.save_interval == 0:
            _save(run, iteration, logger)
        if args.exit_interval and iteration % args.exit_interval == 0:
            logger.print(f"exiting at iteration {iteration} (--exit-interval {args.exit_interval})")
            break
        if tensor_saver.capture_complete():
            logger.print(f"capture window complete at iteration {iteration}: exiting (TENSOR_SAVE_EXIT_AFTER)")
            break
    if args.save and iteration > run.start_iteration and not (args.save_interval and iteration % args.save_interval == 0):
        _save(run, iteration, logger)
    tensor_saver.flush()
    return run.history
