"""Forward+backward time of one quantized Llama block on CPU, unquantized vs each format.

    python bench/bench_layers.py            # hidden 1024, ffn 2816, 16 heads, 4 KV groups, 2048 tokens
    python bench/bench_layers.py --quick    # hifp8 and mxfp8 only, fewer repeats
    python bench/bench_layers.py --compile --formats hifp8 mxfp8   # quantize under torch.compile
    python bench/bench_layers.py --formats te-fp8-current te-fp8-delayed   # recipe presets (linear only)

One TransformerLayer from ``spec.llama_layer_spec`` per recipe (a format name: every linear
and attention GEMM operand quantized, forward and backward; a preset: what it quantizes). Recipes are timed
round-robin (one forward+backward each per round) so machine noise hits them alike; each
time is the median over rounds, and the ratio is against the unquantized (bf16 recipe =
passthrough) block timed in the same run. Goal (issue 3): hifp8 and mxfp8 within 2x.
The warm-up step (untimed; with ``--compile`` it includes compilation) is reported apart.
Writes bench/results/bench_layers.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "bench_layers.json"
SHAPE = dict(hidden_size=1024, ffn_hidden_size=2816, num_attention_heads=16, num_query_groups=4)
GOAL, GOAL_FORMATS = 2.0, ("hifp8", "mxfp8")


def build_block(recipe, dtype: torch.dtype):
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import TransformerLayer

    from megatron.quant.layers.module_quant import finish_init
    from megatron.quant.layers.spec import llama_layer_spec, precision_config

    config = TransformerConfig(num_layers=1, **SHAPE, normalization="RMSNorm", gated_linear_unit=True,
                               activation_func=torch.nn.functional.silu, add_bias_linear=False,
                               use_cpu_initialization=True, attention_dropout=0.0, hidden_dropout=0.0,
                               params_dtype=dtype, bf16=dtype == torch.bfloat16,
                               quant_recipe=precision_config(recipe))
    torch.manual_seed(0)
    spec = llama_layer_spec()
    block = TransformerLayer(config, spec.submodules, layer_number=1)
    finish_init(block, config, prefix="layers.0.")  # as GPTModel finishes its layers
    return block


def step(block, hidden: torch.Tensor, grad: torch.Tensor) -> None:
    x = hidden.detach().requires_grad_()
    out, _ = block(x, attention_mask=None)
    out.backward(grad)
    block.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="hifp8 and mxfp8 only, 3 rounds")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (median), default 5")
    parser.add_argument("--tokens", type=int, default=2048, help="sequence length (batch 1), default 2048")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="params/activations dtype")
    parser.add_argument("--formats", nargs="*", default=None,
                        help="formats or recipe presets, e.g. te-fp8-delayed (default: every format)")
    parser.add_argument("--compile", action="store_true", help="recipes with compile: true (torch.compile)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    from megatron.quant import cpu, formats
    from megatron.quant.recipes import presets
    from megatron.quant.recipes.recipe import QuantRecipe

    torch.set_num_threads(args.threads)
    cpu.init_parallel(seed=0)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    names = args.formats or (list(GOAL_FORMATS) if args.quick else
                             [n for n in formats.list_formats() if not formats.is_passthrough(n)])
    rounds = 3 if args.quick and args.rounds == 5 else args.rounds
    recipes = {"unquantized": QuantRecipe.uniform("bf16"),
               **{n: QuantRecipe.from_dict({"format": n, "compile": args.compile}) for n in names}}
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.tokens, 1, SHAPE["hidden_size"], generator=g).to(dtype)
    grad = torch.randn(args.tokens, 1, SHAPE["hidden_size"], generator=g).to(dtype)
    print(f"{len(recipes)} blocks, {args.tokens} tokens, {args.dtype}, {args.threads} threads, {rounds} rounds"
          f"{', compiled quantization' if args.compile else ''}", flush=True)
    blocks, warmup = {}, {}
    for name, recipe in recipes.items():
        blocks[name] = build_block(recipe, dtype)
        start = time.perf_counter()
        step(blocks[name], hidden, grad)
        warmup[name] = time.perf_counter() - start
        print(f"  warm-up {name}: {warmup[name]:.1f}s", flush=True)
    times: dict[str, list[float]] = {name: [] for name in blocks}
    for r in range(rounds):
        for name, block in blocks.items():
            start = time.perf_counter()
            step(block, hidden, grad)
            times[name].append(time.perf_counter() - start)
        print(f"  round {r + 1}/{rounds}: " + ", ".join(f"{n} {t[-1]:.2f}s" for n, t in times.items()), flush=True)
    goal_formats = {formats.canonical_name(n) for n in GOAL_FORMATS}
    base = statistics.median(times["unquantized"])
    rows = []
    print(f"\n{'recipe':<14}{'median s':>10}{'ratio':>8}")
    for name, samples in times.items():
        median = statistics.median(samples)
        row = {"recipe": name, "median_s": median, "ratio": median / base, "samples_s": samples,
               "warmup_s": warmup[name]}
        has_goal = name != "unquantized" and not presets.is_preset(name) and \
            formats.canonical_name(name) in goal_formats
        if has_goal:
            row.update(goal=GOAL, meets_goal=median / base <= GOAL)
        rows.append(row)
        mark = "" if not has_goal else f"  (goal {GOAL:.0f}x{'' if row['meets_goal'] else ', missed'})"
        print(f"{name:<14}{median:>10.3f}{median / base:>8.2f}{mark}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "benchmark": "bench_layers", "shape": SHAPE, "tokens": args.tokens, "dtype": args.dtype,
        "threads": args.threads, "rounds": rounds, "compile": args.compile,
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "torch": torch.__version__, "load_average": os.getloadavg(), "rows": rows}, indent=2))
    print(f"\nwrote {args.output}")
    cpu.destroy_parallel()


if __name__ == "__main__":
    main()
