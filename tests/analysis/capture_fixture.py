"""Writes capture directories exactly as docs/interfaces.md section 2 specifies (test data).

Statistics are computed here with numpy, independently of megatron.quant.stats; the
quantization statistics use a per-tensor-scaled float8_e4m3fn cast from ml_dtypes as the
quantizer, so they are real measurements of a real (if simple) format.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Iterable, Optional

import ml_dtypes
import numpy as np
import torch

LOG2_EDGES = list(range(-40, 21))
# Report options for tests: small figures, few panels, two workers (outputs, not looks).
FAST = ["--workers", "2", "--no_progress", "--max_panels", "4", "--dpi", "40"]
START = datetime(2025, 9, 8, 9, 52, 20)

LINEAR_TENSORS = {("forward", "pre"): ("input", "weight"), ("forward", "post"): ("output",),
                  ("backward", "pre"): ("grad_output", "weight"),
                  ("backward", "post"): ("grad_input", "grad_weight")}
ATTENTION_TENSORS = {("forward", "pre"): ("query", "key", "value"), ("forward", "post"): ("output",),
                     ("backward", "pre"): ("grad_output",),
                     ("backward", "post"): ("grad_query", "grad_key", "grad_value")}
MODULES = (("linear", LINEAR_TENSORS, "qkv"), ("linear", LINEAR_TENSORS, "fc2"),
           ("attention", ATTENTION_TENSORS, "core_attention"))
# Every GEMM of a Llama layer, as the quickstart captures them (36 tensors a quant type).
ALL_MODULES = MODULES + (("linear", LINEAR_TENSORS, "proj"), ("linear", LINEAR_TENSORS, "fc1"))
QUANTIZED_OPERANDS = {"input", "weight", "grad_output", "query", "key", "value"}


@dataclass
class Capture:
    metadata: dict                  # interface metadata without "stats"
    tensor: Optional[torch.Tensor]  # None: a statistics-only manifest entry
    stats: Optional[dict] = None    # default: computed from the tensor


def numpy_tensor_stats(x: np.ndarray) -> dict:
    x = x.astype(np.float64).ravel()
    finite = x[np.isfinite(x)]
    nonzero = np.abs(finite[finite != 0])
    _, exponent = np.frexp(nonzero)
    bins = np.clip(exponent - 1 - (-40) + 1, 0, len(LOG2_EDGES))
    return {"numel": int(x.size), "shape": list(x.shape), "dtype": "float32",
            "min": float(finite.min()), "max": float(finite.max()), "mean": float(finite.mean()),
            "std": float(finite.std()), "absmax": float(np.abs(finite).max()),
            "zeros": int((x == 0).sum()), "nans": int(np.isnan(x).sum()),
            "infs": int(np.isinf(x).sum()),
            "log2_hist": {"edges": LOG2_EDGES,
                          "counts": np.bincount(bins, minlength=len(LOG2_EDGES) + 1).tolist()}}


def e4m3_quant_stats(x: np.ndarray) -> dict:
    """Quantization statistics of a per-tensor-scaled float8_e4m3fn cast (max 448)."""
    x = x.astype(np.float32).ravel()
    scale = float(np.abs(x).max()) / 448.0 or 1.0
    q = (x / scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * scale
    noise = float(((q - x).astype(np.float64) ** 2).sum())
    signal = float((x.astype(np.float64) ** 2).sum())
    underflow = int(((x != 0) & (q == 0)).sum())
    return {"overflow": 0, "overflow_ratio": 0.0, "underflow": underflow,
            "underflow_ratio": underflow / x.size, "rel_mse": noise / signal,
            "sqnr_db": 10 * math.log10(signal / noise) if noise else math.inf,
            "cosine": float(np.dot(x, q) / (np.linalg.norm(x) * np.linalg.norm(q)))}


def metadata(*, quant_type: str, layer_type: str, layer_idx: int, operation: str, phase: str,
             tensor_name: str, role: str, iteration: int = 0, rank: int = 0, sample: int = 0,
             fmt: Optional[str] = None, shape: Iterable[int] = (), quantized: bool = False,
             counter: int = 0) -> dict:
    return {
        "layer_type": layer_type, "layer_idx": layer_idx,
        "module": f"decoder.layers.{layer_idx}.{role}", "role": role,
        "operation": operation, "phase": phase,
        "component": "FA" if layer_type == "attention" else "linear",
        "quant_type": quant_type,
        "format": None if fmt is None else {"name": fmt, "options": {}},
        "axis": -1, "tensor_name": tensor_name, "iteration": iteration, "microbatch": sample,
        "sample": sample, "first_sample": sample * 2, "rank": rank, "tp_rank": rank,
        "pp_rank": 0, "dp_rank": 0, "shape": list(shape), "dtype": "float32",
        "saved_at": (START + timedelta(seconds=counter)).isoformat(), "quantized": quantized,
    }


def file_name(m: dict, counter: int) -> str:
    stamp = datetime.fromisoformat(m["saved_at"]).strftime("%Y%m%d_%H%M%S")
    return (f"{stamp}_{counter:04d}_iter{m['iteration']:03d}_{m['layer_type']}_L{m['layer_idx']}"
            f"_{m['operation']}_{m['phase']}_{m['component']}_{m['quant_type']}"
            f"_rank{m['rank']:02d}_sample{m['sample']:03d}_{m['tensor_name']}.pt")


def write_captures(root: Path, captures: Iterable[Capture], manifests: bool = True) -> list[Path]:
    """Files under root/<quant_type>/ and, if ``manifests``, one manifest per rank there."""
    written: list[Path] = []
    lines: dict[Path, list[str]] = {}
    for counter, capture in enumerate(captures):
        m = capture.metadata
        directory = root / m["quant_type"]
        directory.mkdir(parents=True, exist_ok=True)
        stats = capture.stats
        if stats is None:
            array = capture.tensor.to(torch.float32).numpy()
            stats = numpy_tensor_stats(array)
            if m["format"] is not None:
                stats.update(e4m3_quant_stats(array))
        name = None
        if capture.tensor is not None:
            name = file_name(m, counter)
            torch.save({"tensor": capture.tensor, "metadata": {**m, "stats": stats}},
                       directory / name)
            written.append(directory / name)
        manifest = directory / f"manifest-rank{m['rank']:02d}.jsonl"
        lines.setdefault(manifest, []).append(json.dumps({"file": name,
                                                          "metadata": {**m, "stats": stats}}))
    if manifests:
        for manifest, entries in lines.items():
            manifest.write_text("\n".join(entries) + "\n", encoding="utf-8")
    return written


def _shape(layer_type: str, tensor_name: str) -> tuple[int, ...]:
    if layer_type == "attention":
        return (16, 1, 2, 32)  # [seq, batch, heads, head_dim]
    if "weight" in tensor_name:
        return (64, 64)
    return (8, 2, 64)  # [seq, batch, hidden]


def _values(rng: np.random.Generator, layer_type: str, tensor_name: str, layer_idx: int,
            shape: tuple[int, ...]) -> torch.Tensor:
    scale = (1e-4 if tensor_name.startswith("grad") else 1.0) * (1 + layer_idx)
    x = rng.standard_normal(shape).astype(np.float32) * scale
    if tensor_name == "input":
        x[..., 3] *= 40  # an outlier channel, as real activations have
    return torch.from_numpy(x)


BLOCK_FORMATS = ("mxfp8", "mxfp4", "nvfp4")
WHATIF = ("te-nvfp4", "hifp8", "fp8_current_scaling")


def _capture_extras(fmt: str, layer_idx: int, iteration: int, rng: np.random.Generator) -> dict:
    """What stats-mode captures add (capture/extras.py): per-block statistics of a block format and
    what-if statistics, varying by layer and iteration so that the figures have something to show."""
    spread = 0.3 + 0.2 * layer_idx + 0.05 * iteration + float(rng.uniform(0, 0.05))
    extras = {"whatif": {name: {"underflow_ratio": (i + 1) * 1e-3 * (layer_idx + 1) + float(rng.uniform(0, 1e-4)),
                                "overflow_ratio": i * 1e-4 * (iteration + 1), "sqnr_db": 30.0 - 5 * i + layer_idx}
                         for i, name in enumerate(WHATIF)}}
    if fmt in BLOCK_FORMATS:
        extras["block_scales"] = {"blocks": 64, "scale_log2_std": spread, "at_floor": 0.01 * layer_idx,
                                  "at_ceiling": 0.0, "range_log2_max": 8.0 + layer_idx + iteration,
                                  "scale_log2_hist": {"edges": [-8, -7], "counts": [10, 54]}}
    return extras


def tiny_run(root: Path, quant_types=("hifp8", "mxfp8", "mxfp4", "bf16"), layers=(0, 1),
             ranks=(0, 1), file_iterations=(0,), stats_iterations=(1, 2, 3),
             quantized_copies: bool = True, manifests: bool = True, modules=MODULES) -> list[Path]:
    """A tiny run's captures: every tensor of linear and attention layers (``modules``), forward
    and backward, with files for ``file_iterations`` and statistics-only entries after that."""
    rng = np.random.default_rng(0)
    captures = []
    for quant_type in quant_types:
        fmt = None if quant_type == "bf16" else quant_type
        for iteration in (*file_iterations, *stats_iterations):
            for layer_idx in layers:
                for rank in ranks:
                    for layer_type, tensors, role in modules:
                        for (operation, phase), names in tensors.items():
                            for name in names:
                                shape = _shape(layer_type, name)
                                operand_fmt = fmt if name in QUANTIZED_OPERANDS else None
                                m = metadata(quant_type=quant_type, layer_type=layer_type,
                                             layer_idx=layer_idx, operation=operation,
                                             phase=phase, tensor_name=name, role=role,
                                             iteration=iteration, rank=rank, fmt=operand_fmt,
                                             shape=shape, counter=len(captures))
                                x = _values(rng, layer_type, name, layer_idx, shape)
                                with_file = iteration in file_iterations
                                stats = None
                                if not with_file:
                                    stats = numpy_tensor_stats(x.numpy())
                                    if operand_fmt:
                                        stats.update(e4m3_quant_stats(x.numpy()))
                                        stats.update(_capture_extras(operand_fmt, layer_idx, iteration, rng))
                                captures.append(Capture(m, x if with_file else None, stats))
                                if with_file and operand_fmt and quantized_copies and name == "input":
                                    copy = {**m, "tensor_name": "input_quantized", "quantized": True}
                                    captures.append(Capture(copy, x.clone()))
    return write_captures(root, captures, manifests)
