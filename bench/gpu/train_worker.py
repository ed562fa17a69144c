"""``python -m bench.gpu.train_worker OUT.json --variant SPEC ...``: one training run, its step times.

The run is megatron-quant's own (``check_inputs``, ``setup``, the loop's ``train``), with the variant's
environment (bench_train's ``FORMAT[+compile][+linear][+stats|+full]``). With ``--profile-steps K`` the
data holds K more iterations, which run after the timed ones under ``torch.profiler``.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from bench.bench_train import train_argv, variant_env

from .profile_buckets import bucket_times, profiler_rows


def profiled(run, iterations: range) -> dict:
    from megatron.quant.training.loop import train_step

    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if run.cuda else [])
    with torch.profiler.profile(activities=activities) as profiler:
        for iteration in iterations:
            train_step(run, iteration)
        if run.cuda:
            torch.cuda.synchronize()
    return bucket_times(profiler_rows(profiler.key_averages(), run.cuda), len(iterations))


def train_run(variant: str, argv: list[str], iters: int, profile_steps: int) -> dict:
    from megatron.quant import tensor_saver
    from megatron.quant.cpu import destroy_parallel
    from megatron.quant.settings.environment import scoped_environ
    from megatron.quant.training.loop import train
    from megatron.quant.training.main import check_inputs, setup

    with scoped_environ(variant_env(variant)):
        run, logger = setup(check_inputs(argv))
        try:
            run.config = replace(run.config, train_iters=iters)  # the data holds iters + profile_steps
            history = train(run, logger)
            profile = profiled(run, range(iters, iters + profile_steps)) if profile_steps else None
        finally:  # as training.main ends a run: no process group is left for the interpreter's exit
            logger.close()
            tensor_saver.close()
            destroy_parallel()
    return {"history": history, "flops_per_iteration": run.flops_per_iteration, "peak_tflops": run.peak_tflops,
            "profile": profile}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path)
    parser.add_argument("--variant", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--seq-length", type=int, required=True)
    parser.add_argument("--micro-batch-size", type=int, required=True)
    parser.add_argument("--iters", type=int, required=True)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--profile-steps", type=int, default=0)
    args = parser.parse_args()
    argv = train_argv(args.model, args.iters + args.profile_steps, args.micro_batch_size, args.seq_length, args.bf16)
    args.json.write_text(json.dumps(train_run(args.variant, argv, args.iters, args.profile_steps)))


if __name__ == "__main__":
    main()
