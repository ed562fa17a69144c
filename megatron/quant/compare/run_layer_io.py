"""``save_first_layer_io``: one fixed input through the model under every mode; the chosen
layers' input and output into one .npz, a _stats.json, a screen report and difference histograms."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from megatron.quant.compare import inputs, report
from megatron.quant.compare.layer_io import SUBMODULE_ALIASES, Target, capture_layer_io, resolve_targets
from megatron.quant.compare.modes import Mode, resolve_modes
from megatron.quant.recipes.sets import REFERENCE

DEFAULT_MODEL = "preset:llama-tiny"
DEFAULT_OUTPUT = "first_layer_io/first_layer_io_all_modes.npz"  # one folder, not four files in the cwd
QUANT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Capture chosen layers' input/output under fp32 (the reference), bf16 and "
                    "fake-quantized formats on one fixed input, and compare every mode with fp32.")
    parser.add_argument("--model", "--pretrained_dir", dest="model", default=DEFAULT_MODEL,
                        help="'preset:NAME' (random init with --seed), a checkpoint directory of ours, "
                             f"or a local Hugging Face Llama directory (default {DEFAULT_MODEL})")
    parser.add_argument("--seed", type=int, default=1234, help="weight seed for preset models (default 1234)")
    parser.add_argument("--modes", nargs="+", default=["all"],
                        help="presets all|essential|quant_only, fp32, bf16, fp16, format names, or recipe "
                             "files; fp32 always runs first as the reference (default all)")
    parser.add_argument("--quant_dtype", choices=sorted(QUANT_DTYPES), default="fp32",
                        help="dtype the model runs in for format and recipe modes (default fp32, so the "
                             "error is the format's alone)")
    parser.add_argument("--layers", nargs="+", type=int, default=[0],
                        help="decoder layer indices; negative counts from the end (default 0)")
    parser.add_argument("--submodule", default=None,
                        help=f"capture a sub-module of each layer instead: {', '.join(SUBMODULE_ALIASES)}, "
                             "or a path inside the layer such as self_attention.linear_qkv")
    parser.add_argument("--output_file", default=DEFAULT_OUTPUT,
                        help="the .npz; the stats go beside it as <stem>_stats.json, the plots as "
                             f"<stem>_diff_<tensor>.png (default {DEFAULT_OUTPUT})")
    parser.add_argument("--seq_len", type=int, default=512, help="tokens per sequence (default 512)")
    parser.add_argument("--batch_size", type=int, default=1, help="sequences in the batch (default 1)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--data_path", default=None,
                        help="megatron indexed dataset prefix (PREFIX.bin/.idx) to take tokens from; "
                             "default: seeded random tokens")
    source.add_argument("--prompt", default=None, help="a text prompt, encoded with --tokenizer")
    parser.add_argument("--data_offset", type=int, default=0, help="first token taken from --data_path")
    parser.add_argument("--input_seed", type=int, default=0, help="seed of the random token batch (default 0)")
    parser.add_argument("--tokenizer", default=None,
                        help="local Hugging Face tokenizer directory for --prompt (default: --model when a directory)")
    parser.add_argument("--no_plots", action="store_true", help="skip the difference histograms")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        stats = run(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(report.format_screen_report(stats))
    return 0


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict:
    """Everything the command does except printing the screen report; returns the stats document."""
    from megatron.quant import cpu

    modes = resolve_modes(args.modes, QUANT_DTYPES[args.quant_dtype])
    _check_source(args.model)
    output = Path(args.output_file)
    if output.suffix != ".npz":
        raise ValueError(f"--output_file {args.output_file!r} must end in .npz")
    cpu.init_parallel(seed=args.seed)
    results, header = capture_modes(args, modes, log)
    stats = report.build_stats(results, REFERENCE, header)
    output.parent.mkdir(parents=True, exist_ok=True)
    report.write_npz(output, results)
    report.write_json(report.stats_path_for(output), stats)
    log(f"wrote {output} and {report.stats_path_for(output)}")
    if not args.no_plots:
        for name in report.identical_tensors(results, REFERENCE):
            log(f"{name}: every mode equals {REFERENCE} exactly, no difference figure")
        for path, drawn in report.plot_difference_histograms(results, REFERENCE, output.with_suffix("")):
            log(f"wrote {path}" if drawn.drawn else f"error: figure {path} could not be drawn: {drawn.error}")
            if drawn.warning():
                log(f"warning: figure {path} is drawn, but may hide something: {drawn.warning()}")
    return stats


def capture_modes(args: argparse.Namespace, modes: Sequence[Mode],
                  log: Callable[[str], None]) -> tuple[dict, dict]:
    """{mode: {tensor_name: array}} for every mode, all on the reference model's weights and one input."""
    reference, shape = load_model(args.model, modes[0], args.seed)
    targets = resolve_targets(args.layers, args.submodule, shape["num_layers"])
    tokens = make_tokens(args, shape["vocab_size"])
    weights = dict(reference.named_parameters())
    results = {}
    for position, mode in enumerate(modes, 1):
        started = time.perf_counter()
        model = reference if mode.name == REFERENCE else load_model(args.model, mode, args.seed)[0]
        if model is not reference:
            _copy_weights(weights, model)
        results[mode.name] = _named(capture_layer_io(model, tokens, targets), targets)
        log(f"[{position}/{len(modes)}] mode {mode.name}: {time.perf_counter() - started:.1f}s")
        del model
    header = {
        "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"),
        "model": args.model,
        "seed": args.seed,
        "seq_len": int(tokens.shape[1]),
        "batch_size": int(tokens.shape[0]),
        "input": _input_description(args),
        "layout": "batch-first: [batch, seq, ...]",
        "quant_dtype": args.quant_dtype,
        "targets": {t.label: t.module_path for t in targets},
        "mode_info": {m.name: {"kind": m.kind, "params_dtype": str(m.params_dtype).removeprefix("torch."),
                               "recipe": m.recipe.name} for m in modes},
    }
    return results, header


def load_model(source: str, mode: Mode, seed: int):
    """(model in eval mode, shape dict) for ``source`` under ``mode``'s recipe and dtype."""
    from megatron.quant.training.loading import load_model as load

    return load(source, mode.recipe, seed=seed, params_dtype=mode.params_dtype)


def make_tokens(args: argparse.Namespace, vocab_size: int) -> torch.Tensor:
    if args.prompt is not None:
        tokenizer = args.tokenizer or (args.model if Path(args.model).is_dir() else None)
        if tokenizer is None:
            raise ValueError("--prompt needs --tokenizer (a local Hugging Face tokenizer directory)")
        return inputs.tokens_from_prompt(tokenizer, args.prompt, vocab_size, args.seq_len)
    if args.data_path is not None:
        return inputs.tokens_from_dataset(args.data_path, vocab_size, args.batch_size, args.seq_len, args.data_offset)
    return inputs.seeded_tokens(vocab_size, args.batch_size, args.seq_len, args.input_seed)


def _check_source(source: str) -> None:
    if not source.startswith("preset:") and not Path(source).is_dir():
        raise FileNotFoundError(f"--model {source!r}: no such directory (expected 'preset:NAME', a checkpoint "
                                "directory of ours, or a local Hugging Face Llama directory)")


def _copy_weights(weights: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    # Every mode must see the reference's weights (rounded to its dtype), whatever its own init gave.
    own = dict(model.named_parameters())
    if own.keys() != weights.keys():
        raise RuntimeError(f"parameters differ between modes: {sorted(own.keys() ^ weights.keys())}")
    with torch.no_grad():
        for name, parameter in own.items():
            parameter.copy_(weights[name])


def _named(captured: dict[str, tuple[np.ndarray, np.ndarray]], targets: Sequence[Target]) -> dict[str, np.ndarray]:
    single = len(targets) == 1
    return {report.tensor_name(t.label, io, single): array
            for t in targets for io, array in zip(("input", "output"), captured[t.label])}


def _input_description(args: argparse.Namespace) -> dict:
    if args.prompt is not None:
        return {"kind": "prompt", "prompt": args.prompt, "tokenizer": args.tokenizer or args.model}
    if args.data_path is not None:
        return {"kind": "data", "data_path": args.data_path, "offset": args.data_offset}
    return {"kind": "seeded", "seed": args.input_seed}
