"""Forward+backward time of one MoE layer's routed experts, grouped (``QuantGroupedMLP``) against one expert
after another (megatron-core's ``SequentialMLP.forward`` over the same experts), per recipe.

    python bench/bench_experts.py                 # deepseek-v3-small's experts: 64 of hidden 1024, FFN 256
    python bench/bench_experts.py --presets bf16 deepseek-v3-fp8 te-mxfp8 te-fp8-current --rounds 10

The tokens of a sequence (--tokens, times top-k slots) are routed to the experts at random (a multinomial
draw, so loads differ and some may be empty). Both paths are timed round-robin (one forward+backward each
per round), each time the median over rounds; ``speedup`` is the per-expert time over the grouped one,
measured in the same run. A recipe the grouped path does not take runs per expert both ways (``reason``).
Runs on your GPU when there is one, else on the CPU. Writes bench/results/bench_experts.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Optional

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "bench_experts.json"


def build_experts(preset: str, experts: int, hidden: int, ffn: int, topk: int, device: str):
    """The routed experts of one MoE layer built by megatron-core with our backend, finished as ``GPTModel``
    finishes ``decoder.layers.1.mlp``."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import ModuleSpec, build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron.quant.layers.backend import QuantSpecProvider, with_backend
    from megatron.quant.layers.module_quant import finish_init
    from megatron.quant.layers.spec import precision_config
    from megatron.quant.recipes.recipe import QuantRecipe

    recipe = None if preset == "bf16" else precision_config(QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": preset}))
    config = TransformerConfig(num_layers=2, hidden_size=hidden, num_attention_heads=8, ffn_hidden_size=4 * hidden,
                               num_moe_experts=experts, moe_router_topk=topk, moe_ffn_hidden_size=ffn,
                               moe_grouped_gemm=False, moe_token_dispatcher_type="allgather", moe_router_dtype="fp32",
                               normalization="RMSNorm", gated_linear_unit=True, bias_activation_fusion=False,
                               activation_func=torch.nn.functional.silu, add_bias_linear=False,
                               use_cpu_initialization=True, params_dtype=torch.bfloat16, bf16=True,
                               quant_recipe=recipe)
    torch.manual_seed(0)
    spec = with_backend(get_gpt_layer_local_spec(num_experts=experts, normalization="RMSNorm"), QuantSpecProvider())
    mlp = spec.submodules.mlp  # 0.19: a partial of MoELayer
    moe = build_module(mlp, config=config) if isinstance(mlp, ModuleSpec) else mlp(config=config)
    finish_init(moe, config, prefix="decoder.layers.1.mlp.")
    return moe.experts.to(device)


def step(experts, forward, x: torch.Tensor, counts: torch.Tensor, probs: torch.Tensor, dy: torch.Tensor) -> None:
    out, _ = forward(experts, x.detach().requires_grad_(), counts, probs)
    out.backward(dy)
    experts.zero_grad(set_to_none=True)


def main(argv: Optional[list[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["bf16", "deepseek-v3-fp8", "te-mxfp8"])
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--ffn", type=int, default=256, help="one expert's FFN size")
    parser.add_argument("--topk", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=2048, help="tokens of the sequence routed (times top-k slots)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    for name in ("experts", "hidden", "ffn", "topk", "tokens", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be positive, got {getattr(args, name)}")

    from megatron.core.transformer.moe.experts import SequentialMLP

    from megatron.quant import cpu, position
    from megatron.quant.layers.grouped_experts import QuantGroupedMLP

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cpu.init_parallel(seed=0)
    position.set_iteration(0)
    position.set_microbatch(0, 0)
    g = torch.Generator().manual_seed(0)
    slots = args.tokens * args.topk
    counts = torch.bincount(torch.multinomial(torch.ones(args.experts), slots, replacement=True, generator=g),
                            minlength=args.experts)
    x = torch.randn(slots, args.hidden, generator=g).to(device, torch.bfloat16)
    dy = torch.randn(slots, args.hidden, generator=g).to(device, torch.bfloat16)
    probs = torch.rand(slots, generator=g).to(device)
    paths = {"grouped": QuantGroupedMLP.forward, "per_expert": SequentialMLP.forward}
    print(f"{args.experts} experts (hidden {args.hidden}, FFN {args.ffn}), {slots} token slots, {device}, "
          f"{args.rounds} rounds", flush=True)
    rows = []
    for preset in args.presets:
        experts = build_experts(preset, args.experts, args.hidden, args.ffn, args.topk, device)
        times: dict[str, list[float]] = {name: [] for name in paths}
        for r in range(args.rounds + 1):  # round 0 warms up
            for name, forward in paths.items():
                if device == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                step(experts, forward, x, counts, probs, dy)
                if device == "cuda":
                    torch.cuda.synchronize()
                if r:
                    times[name].append(time.perf_counter() - start)
        grouped, per_expert = (statistics.median(times[name]) for name in paths)
        row = {"preset": preset, "reason": experts.grouped_reason(), "grouped_s": grouped,
               "per_expert_s": per_expert, "speedup": per_expert / grouped}
        rows.append(row)
        print(f"{preset:<18} grouped {grouped:.4f}s  per expert {per_expert:.4f}s  speedup {row['speedup']:.2f}x"
              f"{'' if row['reason'] is None else '  (per expert: ' + row['reason'] + ')'}", flush=True)
    result = {"benchmark": "bench_experts", "device": device, "experts": args.experts, "hidden": args.hidden,
              "ffn": args.ffn, "token_slots": slots, "rounds": args.rounds, "torch": torch.__version__, "rows": rows}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.output}")
    cpu.destroy_parallel()
    return result


if __name__ == "__main__":
    main()
