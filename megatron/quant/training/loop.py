"""The training loop: micro-batches, gradient accumulation, optimizer step, logging, eval, checkpoints.

One iteration = ``num_microbatches`` forward/backward passes per data-parallel rank, then one
optimizer step. On GPU megatron-core's schedule (pipeline-aware) runs the passes; on CPU a
plain loop does, with the loss scaled exactly as the schedule scales it.

A step never waits for the device: its loss and gradient norm stay device tensors, and the loop
reads them back (one transfer) only at a read-back point: every ``--log-interval`` iterations, the
last iteration, and before an evaluation, a checkpoint save or an exit. The iteration time is the
window's wall time (the read-back waits for the device) over its iterations, as Megatron-LM's
timers average over the logging interval; the divergence check happens there too (see ``train``).
The capture module reads tensors back on its own, only on the iterations it captures: such an
iteration is timed on its own (its read-back makes it wait for the device, so its time also holds
what the device still had queued) and left out of its window's average, so that the capture line
shows what capturing cost and the next interval line the speed of training alone.

With ``--cuda-graph`` each iteration's forward-backward is a ``cuda_graph.GraphedStep`` (``step_runner``):
captured once as a CUDA graph after a warm-up, then replayed; the optimizer's step stays eager.

Iterations are numbered as the console prints them, from 1: the run position (hence the capture
window ``TENSOR_SAVER_ITERATION``, the capture files' ``iterNNN`` and their manifests) says 16
for the iteration printed as ``iteration 16/N``, and a checkpoint saved after it resumes with 17.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterable, Optional

import torch
import torch.distributed as dist

from megatron.quant import position, tensor_saver
from megatron.quant.layers.linear import invalidate_quantized_weights
from megatron.quant.training import checkpoint
from megatron.quant.training.config import TrainingConfig
from megatron.quant.training.cuda_graph import WARMUP_STEPS, GraphedStep
from megatron.quant.training.data import BatchLayout, get_batch
from megatron.quant.training.metrics import DIVERGED, MetricsLogger, capture_digest, format_line


@dataclass
class Run:
    """Everything the loop needs, built by ``megatron.quant.training.main.setup``."""

    config: TrainingConfig      # the flags the loop reads
    model_chunks: list          # DDP-wrapped model(s): what forward/backward runs on
    gpt: torch.nn.Module        # the unwrapped GPTModel: what checkpoints hold
    optimizer: Any
    scheduler: Any
    train_data: Any
    valid_data: Any
    layout: BatchLayout
    flops_per_iteration: float
    peak_tflops: float | None
    run_config: dict            # what checkpoints record of the run: shape, quant_type, every flag (args)
    cuda: bool
    start_iteration: int = 0
    history: list = field(default_factory=list)  # per-iteration logged values
    # What runs a training iteration's micro-batches (forward and backward, not the optimizer): None for
    # ``forward_backward``; with --cuda-graph a ``cuda_graph.GraphedStep`` over it (made by ``train``).
    step_runner: Optional[Callable[[Iterable[dict]], list]] = None


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
    for mb in range(run.config.num_microbatches):
        if on_microbatch is not None:
            on_microbatch(mb, run.layout.first_sample(iteration, mb, dp_rank))
        batch = get_batch(dataset, run.layout, iteration, mb, dp_rank)
        if run.cuda:  # from pinned memory, asynchronously: a pageable copy would wait for the queued step
            yield {key: value.pin_memory().to(device, non_blocking=True) for key, value in batch.items()}
        else:
            yield batch


def _reduce_loss(reports: list[torch.Tensor]) -> torch.Tensor | float:
    """Token-weighted mean loss over micro-batches and data-parallel ranks, left on the device."""
    from megatron.core import parallel_state

    if not reports:
        return float("nan")  # not the last pipeline stage
    total = torch.stack(reports).sum(0).double()
    if parallel_state.get_data_parallel_world_size() > 1:
        dist.all_reduce(total, group=parallel_state.get_data_parallel_group())
    return total[0] / total[1].clamp(min=1)


def _forward_backward_cpu(run: Run, batches, forward_only: bool) -> list[torch.Tensor]:
    model, n = run.model_chunks[0], run.config.num_microbatches
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


def forward_backward_scheduled(run: Run, batches, forward_only: bool = False) -> list[torch.Tensor]:
    """``forward_backward`` through megatron-core's schedule (the GPU's path; ``main.connect_schedule``)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def forward_step(data_iterator, model):
        batch = next(data_iterator)
        return _forward(model, batch), partial(loss_func, batch["loss_mask"])

    outputs = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter(batches), model=run.model_chunks,
        num_microbatches=run.config.num_microbatches, seq_length=run.config.seq_length,
        micro_batch_size=run.config.micro_batch_size, forward_only=forward_only)
    return [out["lm loss"] for out in outputs]


def forward_backward(run: Run, batches: Iterable[dict], forward_only: bool = False) -> list[torch.Tensor]:
    """The micro-batches' forward (and backward) passes, the gradient reduction included: each one's
    loss report (device tensors)."""
    step = forward_backward_scheduled if run.cuda else _forward_backward_cpu
    return step(run, batches, forward_only)


def graphed_step(run: Run) -> GraphedStep:
    """``forward_backward`` as a CUDA graph (--cuda-graph); the capture quantizes the weights itself."""
    def forget_quantized_weights() -> None:
        for chunk in run.model_chunks:
            invalidate_quantized_weights(chunk)

    return GraphedStep(partial(forward_backward, run), run.cuda, before_capture=forget_quantized_weights)


def train_step(run: Run, iteration: int) -> dict[str, torch.Tensor | float]:
    """One iteration; returns loss, grad norm (device tensors or floats: nothing is read back here),
    learning rate, skipped iterations."""
    for chunk in run.model_chunks:
        chunk.train()
        chunk.zero_grad_buffer()
    run.optimizer.zero_grad()
    batches = _batches(run, run.train_data, iteration, position.set_microbatch)
    reports = (run.step_runner or partial(forward_backward, run))(batches)
    ok, grad_norm, _ = run.optimizer.step()
    # megatron-core's GPU optimizers write weights through .data and buffer views, which the
    # quantized-weight cache's version check cannot see.
    for chunk in run.model_chunks:
        invalidate_quantized_weights(chunk)
    lr = run.optimizer.param_groups[0]["lr"]
    if ok:
        run.scheduler.step(increment=1)
    return {"lm loss": _reduce_loss(reports), "learning rate": lr,
            "grad norm": float("nan") if grad_norm is None else grad_norm, "skipped iterations": 0 if ok else 1}


def _read_back(rows: list[dict]) -> list[dict[str, float]]:
    """``rows`` with every tensor value a float, read with one transfer per device."""
    tensors = [(i, key, value) for i, row in enumerate(rows) for key, value in row.items()
               if isinstance(value, torch.Tensor)]
    out = [dict(row) for row in rows]
    for device in {value.device for _, _, value in tensors}:
        here = [(i, key, value) for i, key, value in tensors if value.device == device]
        values = torch.stack([value.detach().double().reshape(()) for _, _, value in here]).tolist()
        for (i, key, _), number in zip(here, values):
            out[i][key] = number
    return out


@torch.no_grad()
def evaluate(run: Run, iteration: int) -> float:
    """Mean validation loss over ``--eval-iters`` global batches."""
    for chunk in run.model_chunks:
        chunk.eval()
    reports = []
    for i in range(run.config.eval_iters):
        reports += forward_backward(run, _batches(run, run.valid_data, iteration * run.config.eval_iters + i, None),
                                    forward_only=True)
    return float(_reduce_loss(reports))


def _speed(run: Run, seconds: float) -> dict[str, float]:
    tokens = run.config.global_batch_size * run.config.seq_length
    tflops = run.flops_per_iteration / seconds / dist.get_world_size() / 1e12
    values = {"iteration time (s)": seconds, "tokens/s": tokens / seconds, "TFLOP/s/device": tflops}
    if run.peak_tflops:
        values["MFU"] = tflops / run.peak_tflops
    return values


def _save(run: Run, iteration: int, logger: MetricsLogger) -> None:
    path = checkpoint.save_checkpoint(run.config.save, iteration, run.gpt, run.optimizer, run.scheduler,
                                      run.run_config)
    logger.print(f"saved checkpoint at iteration {iteration} to {path}")


def diverged(loss: float, threshold: float | None) -> bool:
    """A NaN/Inf loss, or one above ``threshold`` (None: no threshold)."""
    return not math.isfinite(loss) or (threshold is not None and loss > threshold)


def _first_divergence(run: Run, rows: list[dict]) -> int | None:
    """The first iteration among ``rows`` whose loss diverged on the last pipeline stage (the others
    have no loss), agreed on by every rank; None when none did."""
    from megatron.core import parallel_state

    mine = None
    if parallel_state.is_pipeline_last_stage():
        mine = next((row["iteration"] for row in rows
                     if diverged(row["lm loss"], run.config.divergence_threshold)), None)
    if dist.get_world_size() == 1:
        return mine
    device = torch.cuda.current_device() if run.cuda else "cpu"
    first = torch.tensor([math.inf if mine is None else mine], device=device)
    dist.all_reduce(first, op=dist.ReduceOp.MIN)
    value = first.item()
    return None if math.isinf(value) else int(value)


def _reads_back(config: TrainingConfig, iteration: int) -> bool:
    """Whether the loop reads the device's values back after ``iteration`` (1-based, completed):
    every rank decides alike (the divergence check there is a collective)."""
    def every(interval: int | None) -> bool:
        return bool(interval) and iteration % interval == 0

    return (every(config.log_interval) or iteration == config.train_iters
            or (bool(config.eval_iters) and every(config.eval_interval))
            or (bool(config.save) and every(config.save_interval))
            or every(config.exit_interval) or tensor_saver.capture_complete())


def _remove_file(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _record_divergence(run: Run, iteration: int, loss: float, logger: MetricsLogger) -> None:
    logger.print(f"diverged at iteration {iteration}: lm loss {loss} (--divergence-threshold "
                 f"{run.config.divergence_threshold}); stopping without saving this state")
    logger.scalars(iteration, {"diverged": 1.0})
    if run.config.save and dist.get_rank() == dist.get_world_size() - 1:
        os.makedirs(run.config.save, exist_ok=True)
        with open(os.path.join(run.config.save, DIVERGED), "w") as f:
            json.dump({"iteration": iteration, "lm loss": repr(loss),
                       "divergence_threshold": run.config.divergence_threshold}, f)


def iterations_run(start: int, train_iters: int) -> range:
    """The iterations a run resumed after iteration ``start`` (0: from scratch) executes, numbered as
    the console, the run position and the capture files number them."""
    return range(start + 1, train_iters + 1)


def window_seconds(rows: list[dict], seconds: float) -> list[float]:
    """Each iteration's time in a window of ``seconds``: a captured iteration's own (``row["seconds"]``),
    the others the window's remaining time shared equally."""
    captured = sum(row["seconds"] for row in rows if row["capture"])
    plain = sum(not row["capture"] for row in rows)
    rest = seconds - captured
    shared = rest / plain if plain and rest > 0 else seconds / len(rows)
    return [row["seconds"] if row["capture"] else shared for row in rows]


def _log_window(run: Run, logger: MetricsLogger, rows: list[dict], seconds: float) -> None:
    """History, TensorBoard/W&B scalars and console lines of a window's iterations, read back."""
    config = run.config
    for row, took in zip(rows, window_seconds(rows, seconds)):
        iteration, values, capture = row["iteration"], {**row["values"], **_speed(run, took)}, row["capture"]
        run.history.append(dict(values, **capture, iteration=iteration))
        logger.scalars(iteration, {**values, **capture})
        if capture or iteration % config.log_interval == 0 or iteration == config.train_iters:
            logger.print(format_line(iteration, config.train_iters, {**values, **capture_digest(capture)}))


def train(run: Run, logger: MetricsLogger) -> list[dict]:
    """Iterate from ``run.start_iteration`` to ``--train-iters``; returns the per-iteration values.

    Values are read back at the read-back points (``_reads_back``), and so is divergence (see
    ``diverged``) checked: a diverged run stops at the first read-back point after it, keeps (logs,
    returns) the iterations up to the first diverged one only, writes ``DIVERGED`` into ``--save``
    and saves no checkpoint of the diverged state (saves come after the check).
    """
    config = run.config
    iteration = run.start_iteration
    if config.cuda_graph and run.step_runner is None:
        run.step_runner = graphed_step(run)
        on_gpu = (f"iterations {iteration + 1}-{iteration + WARMUP_STEPS} warm up, the next is captured and every "
                  "later one replays it")
        logger.print("cuda graph: " + (on_gpu if run.cuda else "no GPU, so no graph: each iteration runs eagerly "
                                       "over the graph's static input buffers"))
    if config.save and dist.get_rank() == dist.get_world_size() - 1:
        _remove_file(os.path.join(config.save, DIVERGED))  # a verdict on an earlier attempt
    if config.wandb_project:
        logger.start_wandb(config.wandb_project, config.wandb_exp_name, config.wandb_save_dir,
                           {key: str(value) for key, value in run.run_config["args"].items()})
    pending: list[dict] = []  # iterations since the last read-back, their values on the device
    spent = dict.fromkeys(("training", "evaluation", "checkpoint"), 0.0)  # seconds, logged as time/...
    start = time.perf_counter()
    while iteration < config.train_iters:
        began = time.perf_counter()
        position.set_iteration(iteration + 1)  # numbered as printed (iterations_run)
        values = train_step(run, iteration)
        capture = tensor_saver.iteration_summary()  # reads tensors back on captured iterations only
        iteration += 1
        pending.append({"iteration": iteration, "values": values, "capture": capture,
                        "seconds": time.perf_counter() - began})
        if not _reads_back(config, iteration):
            continue
        values_read = _read_back([row["values"] for row in pending])
        rows = [dict(row, values=values) for row, values in zip(pending, values_read)]
        seconds, pending = time.perf_counter() - start, []
        spent["training"] += seconds
        first_diverged = _first_divergence(run, [dict(row["values"], iteration=row["iteration"]) for row in rows])
        if first_diverged is not None:
            rows = [row for row in rows if row["iteration"] <= first_diverged]
        _log_window(run, logger, rows, seconds)
        if first_diverged is not None:
            _record_divergence(run, first_diverged, rows[-1]["values"]["lm loss"], logger)
            _log_time(logger, iteration, spent)
            tensor_saver.flush()
            return run.history
        began = time.perf_counter()
        if config.eval_iters and iteration % config.eval_interval == 0:
            with tensor_saver.paused(), position.evaluation():  # not part of the captured iteration; a
                val = evaluate(run, iteration // config.eval_interval)  # scheduled recipe's evaluation precision
            logger.scalars(iteration, {"lm loss": val}, prefix="validation/")
            logger.print(f"validation at iteration {iteration} | lm loss: {val:.4f}")
            spent["evaluation"] += time.perf_counter() - began
            began = time.perf_counter()
        if config.save and config.save_interval and iteration % config.save_interval == 0:
            _save(run, iteration, logger)
            spent["checkpoint"] += time.perf_counter() - began
        if config.exit_interval and iteration % config.exit_interval == 0:
            logger.print(f"exiting at iteration {iteration} (--exit-interval {config.exit_interval})")
            break
        if tensor_saver.capture_complete():
            logger.print(f"capture window complete at iteration {iteration}: exiting (TENSOR_SAVE_EXIT_AFTER)")
            break
        start = time.perf_counter()  # evaluation and checkpoints are not iteration time
    saved = config.save_interval and iteration % config.save_interval == 0
    if config.save and iteration > run.start_iteration and not saved:
        began = time.perf_counter()
        _save(run, iteration, logger)
        spent["checkpoint"] += time.perf_counter() - began
    _log_time(logger, iteration, spent)
    tensor_saver.flush()
    return run.history


def _log_time(logger: MetricsLogger, iteration: int, spent: dict[str, float]) -> None:
    logger.scalars(iteration, {f"{part} seconds": seconds for part, seconds in spent.items()}, prefix="time/")
    logger.print("time: " + ", ".join(f"{part} {seconds:.1f} s" for part, seconds in spent.items()))
