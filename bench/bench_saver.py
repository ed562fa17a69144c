"""Capture overhead on a tiny Llama training step (CPU by default).

Each round runs one training step (forward + backward of every micro-batch, optimizer step)
in each mode, interleaved so machine noise hits all modes alike:
  off           capture disabled (baseline)
  stats-counts  TENSOR_SAVE_MODE=stats, TENSOR_SAVE_STATS=counts, every iteration
  stats-sample  ... TENSOR_SAVE_STATS=sample
  stats         ... TENSOR_SAVE_STATS=full (the default)
  stats-every10 ... full statistics of every 10th iteration: 10 steps, the time per step
  full          TENSOR_SAVE_MODE=full, every iteration: files written by the background writer
  sample-plain  stats-sample without the per-block statistics (TENSOR_SAVE_BLOCK_SCALES=0): the base of
  sample-whatif stats-sample with TENSOR_SAVE_WHATIF (--whatif, default four formats), and
  sample-inspect stats-sample driven by an inspect config (INSPECT_CONFIG: every TE statistic of every
                linear layer's activation, weight and gradient, FP8 and NVFP4 what-ifs, every step)
Reported (medians over rounds): each stats level's overhead vs off (goal <= 10%), the training
thread's wait for the writer in full mode as a fraction of an off step (goal <= 25%), the
full-mode added training-thread time, how long the background writing took, and the disk write
speed (a lower bound: the bytes of one full iteration over its step and the drain after it).

    python bench/bench_saver.py [--model llama-tiny|wide|1b-2layers] [--format mxfp8] [--rounds 7] [--device cuda]
                                [--modes off stats-sample ...]
Models: llama-tiny (hidden 256), wide (llama-tiny at hidden 1024, FFN 3072, 8 heads), 1b-2layers
(Llama 3.2 1B's widths and vocabulary, 2 layers, seq 2048: for a GPU).
Writes bench/results/bench_saver_<model>.json (..._cuda.json on a GPU).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from megatron.quant import position, tensor_saver
from megatron.quant.tensor_saver import SaverConfig
from megatron.quant.training.presets import PRESETS

MODES = ("off", "stats-counts", "stats-sample", "stats", "stats-every10", "full", "sample-plain", "sample-whatif",
         "sample-inspect")
STATS_LEVEL = {"stats-counts": "counts", "stats-sample": "sample", "sample-plain": "sample", "sample-whatif": "sample",
               "sample-inspect": "sample"}  # others: full statistics
EXTRAS = ("stats-sample", "sample-whatif", "sample-inspect")  # their cost over sample-plain
INSPECT_CONFIG = """
everything:
  enabled: True
  layers: {layer_name_regex_pattern: .*}
  transformer_engine:
    LogTensorStats:
      enabled: True
      tensors: [activation, weight, gradient]
      stats: [min, max, mean, std, l1_norm, l2_norm, cur_amax, dynamic_range,
              {max_blockwise_dynamic_range: {block_size: 32, dims: 1}}]
    LogFp8TensorStats:
      enabled: True
      tensors: [activation, weight, gradient]
      stats: [underflows%, mxfp8_underflows%, mxfp8_scale_inv_max_columnwise, fp8_block_scaling_mse]
    LogNvfp4TensorStats: {enabled: True, tensors: [activation, weight, gradient], stats: [underflows%, mse]}
"""
STEPS = {"stats-every10": 10}  # steps per measurement (capture on the first); others: 1
_1B = {key: value for key, value in PRESETS["llama3.2-1b"].items()
       if key in ("hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "vocab_size")}
MODELS = {"llama-tiny": {}, "wide": {"hidden_size": 1024, "ffn_hidden_size": 3072, "num_attention_heads": 8,
                                     "num_query_groups": 4},
          "1b-2layers": {**_1B, "num_layers": 2, "seq_length": 2048, "max_position_embeddings": 2048}}


def build_model(fmt: str, model: str, device: str = "cpu"):
    from megatron.quant.cpu import init_parallel
    from megatron.quant.layers.spec import build_llama_model
    from megatron.quant.recipes.recipe import QuantRecipe
    from megatron.quant.training.model import transformer_config
    from megatron.quant.training.presets import get_preset

    init_parallel()
    shape = {**get_preset("llama-tiny"), **MODELS[model]}
    recipe = QuantRecipe.uniform(fmt)
    precision = "bf16" if device == "cuda" else "fp32"
    model = build_llama_model(transformer_config(shape, precision=precision), recipe, vocab_size=shape["vocab_size"],
                              max_sequence_length=shape["max_position_embeddings"],
                              rotary_base=shape["rotary_base"])
    return model.to(device), shape


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def training_step(model, optimizer, batches, iteration: int) -> None:
    position.set_iteration(iteration)
    for index, (tokens, positions) in enumerate(batches):
        position.set_microbatch(index, index * tokens.shape[0])
        model(tokens, positions, None, labels=tokens).float().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def saver_config(mode: str, steps: int, save_dir: str, queue_mb: int, whatif: tuple[str, ...], plan) -> tuple:
    """(SaverConfig, inspect plan or None) of ``mode``."""
    level = STATS_LEVEL.get(mode, "full")
    if mode == "sample-inspect":
        return SaverConfig(stats=level, save_dir=save_dir, queue_mb=queue_mb, inspect=plan[0]), plan[1]
    return SaverConfig(enabled=mode != "off", mode="full" if mode == "full" else "stats", stats=level,
                       iterations=f"every:{steps}", save_dir=save_dir, queue_mb=queue_mb,
                       block_scales=mode != "sample-plain", whatif=whatif if mode == "sample-whatif" else ()), None


def inspect_plan(fmt: str, num_layers: int) -> tuple:
    """(the bench's inspect config, its plan over a uniform ``fmt`` model)."""
    import yaml

    from megatron.quant.recipes.precision import PrecisionConfig
    from megatron.quant.recipes.recipe import QuantRecipe
    from megatron.quant.tensor_saver import inspect_config_from_dict, resolve_inspect

    config = inspect_config_from_dict(yaml.safe_load(INSPECT_CONFIG), "bench inspect config")
    return config, resolve_inspect(config, PrecisionConfig.uniform(QuantRecipe.uniform(fmt)), num_layers)[1]


def timed_step(mode: str, model, optimizer, batches, iteration: int, save_dir: str, queue_mb: int,
               whatif: tuple[str, ...] = (), plan: tuple = (None, None)) -> dict:
    """``STEPS[mode]`` training steps from ``iteration`` (a multiple of them: captured first); per step."""
    steps = STEPS.get(mode, 1)
    config, resolved = saver_config(mode, steps, save_dir, queue_mb, whatif, plan)
    tensor_saver.configure(config, plan=resolved)
    synchronize()
    start, cpu_start = time.perf_counter(), time.process_time()
    for step in range(steps):
        training_step(model, optimizer, batches, iteration + step)
        tensor_saver.iteration_summary()  # what the loop logs each step; waits for pending statistics
    synchronize()
    step_s, cpu_s = (time.perf_counter() - start) / steps, (time.process_time() - cpu_start) / steps
    wait_s = tensor_saver.writer_stats()["wait_s"] / steps
    start = time.perf_counter()
    tensor_saver.close()  # the writer finishes in the background; measured apart
    return {"step_s": step_s, "cpu_s": cpu_s, "wait_s": wait_s, "drain_s": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama-tiny", choices=sorted(MODELS))
    parser.add_argument("--format", default="mxfp8", help="CUSTOM_QUANT_TYPE of the model (default mxfp8)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--microbatches", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--queue-mb", type=int, default=SaverConfig().queue_mb)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="step time for the stats overheads: wall clock, or this process's CPU time "
                             "(steadier on a machine shared with other jobs)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--out", default=None, help="default bench/results/bench_saver_<model>[_cuda].json")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="modes to run (off always)")
    parser.add_argument("--whatif", default="te-mxfp8,te-nvfp4,hifp8,fp8_current_scaling",
                        help="TENSOR_SAVE_WHATIF of sample-whatif")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, shape = build_model(args.format, args.model, args.device)
    out = args.out or f"bench/results/bench_saver_{args.model}{'_cuda' if args.device == 'cuda' else ''}.json"
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    seq = shape["seq_length"]
    batches = [(torch.randint(0, shape["vocab_size"], (args.batch, seq), device=args.device),
                torch.arange(seq, device=args.device).expand(args.batch, seq)) for _ in range(args.microbatches)]
    modes = tuple(m for m in MODES if m == "off" or m in args.modes)
    whatif = tuple(args.whatif.split(","))
    plan = inspect_plan(args.format, shape["num_layers"]) if "sample-inspect" in modes else (None, None)
    samples: dict[str, list[dict]] = {mode: [] for mode in modes}
    bytes_full = 0
    with tempfile.TemporaryDirectory(prefix="bench_saver_") as root:
        training_step(model, optimizer, batches, 0)  # warm-up, capture off
        for round_idx in range(args.rounds):
            for mode in modes:
                save_dir = os.path.join(root, f"{mode}{round_idx}")
                # every mode's first iteration is captured: a multiple of its step count
                samples[mode].append(timed_step(mode, model, optimizer, batches, (round_idx + 1) * STEPS.get(mode, 1),
                                                save_dir, args.queue_mb, whatif, plan))
            bytes_full = sum(p.stat().st_size for p in Path(root, f"full{round_idx}").rglob("*") if p.is_file())
            print(f"round {round_idx + 1}/{args.rounds}: " + ", ".join(
                f"{m} {samples[m][-1]['step_s']:.3f}s" for m in modes) + f", full wrote {bytes_full / 2**20:.1f} MiB",
                file=sys.stderr, flush=True)

    def median(mode: str, key: str) -> float:
        return statistics.median(s[key] for s in samples[mode])

    clock = "cpu_s" if args.clock == "cpu" else "step_s"
    off = median("off", clock)
    levels = [m for m in ("stats-counts", "stats-sample", "stats") if m in modes]
    results = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                   f"torch threads {torch.get_num_threads()}, device "
                   f"{torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}",
        "date": time.strftime("%Y-%m-%d"), "format": args.format, "model": args.model,
        "hidden_size": shape["hidden_size"], "microbatches": args.microbatches, "batch": args.batch,
        "seq_length": seq, "rounds": args.rounds, "queue_mb": args.queue_mb, "modes": list(modes),
        "step_s": {mode: median(mode, "step_s") for mode in modes},
        "clock": args.clock, "step_s_by_clock": {mode: median(mode, clock) for mode in modes},
        "stats_overhead_by_level": {STATS_LEVEL.get(m, "full"): median(m, clock) / off - 1 for m in levels},
        "goals": {"stats_overhead": 0.10, "full_wait_fraction": 0.25},
    }
    if "stats" in modes:
        results["stats_overhead"] = median("stats", clock) / off - 1
    if "stats-every10" in modes:
        results["stats_every10_overhead"] = median("stats-every10", clock) / off - 1
    if "full" in modes:
        results.update(bytes_per_full_iteration=bytes_full,
                       full_wait_fraction=median("full", "wait_s") / median("off", "step_s"),
                       full_added_fraction=median("full", "step_s") / median("off", "step_s") - 1,
                       full_background_drain_s=median("full", "drain_s"),
                       full_write_gbps_at_least=bytes_full / (median("full", "step_s")
                                                              + median("full", "drain_s")) / 1e9)
    if "sample-plain" in modes:  # the new statistics' cost: step time over stats capture without them
        plain = median("sample-plain", clock)
        results["ratio_to_sample_plain"] = {m: median(m, clock) / plain for m in EXTRAS if m in modes}
        results["whatif"] = list(whatif)
    print(f"{'measure':<40}{'value':>10}{'goal':>8}")
    print(f"{f'off step ({args.clock} s, median)':<40}{off:>10.3f}")
    for level, overhead in results["stats_overhead_by_level"].items():
        print(f"{f'stats mode ({level}): added step time':<40}{overhead:>10.1%}{'<=10%':>8}")
    if "stats_every10_overhead" in results:
        print(f"{'stats mode, every 10th: added step time':<40}{results['stats_every10_overhead']:>10.1%}")
    if "full" in modes:
        print(f"{'full mode: training-thread wait / step':<40}{results['full_wait_fraction']:>10.1%}{'<=25%':>8}")
        print(f"{'full mode: added step time (all)':<40}{results['full_added_fraction']:>10.1%}")
        print(f"{'full mode: background drain after (s)':<40}{results['full_background_drain_s']:>10.3f}")
        print(f"{'full mode: disk write GB/s, at least':<40}{results['full_write_gbps_at_least']:>10.2f}")
    for mode, ratio in results.get("ratio_to_sample_plain", {}).items():
        print(f"{f'{mode} / sample-plain step time':<40}{ratio:>10.2f}")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
