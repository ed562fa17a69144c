"""A quantized training step's work, counted on the CPU and modelled from the model's shapes.

``WorkCount`` is a ``TorchDispatchMode`` over the real layers: each aten op that would launch a
kernel (views and metadata-only ops are not counted), the host synchronisations (a read of a value by
the host, or an op whose output shape depends on the data), the GEMMs with FP32 operands (on a
bf16 model: operands widened to FP32, a GEMM at FP32's rate), and the bytes the quantization's ops
read and write. The GPU's path is taken: a GEMM of
bf16 operands into an FP32 output (``mm``/``bmm`` with ``out_dtype``, which the CPU lacks) is
computed by the mode from widened operands, the same sums, and counted as the narrow GEMM it is.

The floor (``python -m bench.gpu.step_work``): the elements the linear layers' GEMM operands hold in
one optimizer step (X and W for fprop, dY and W for dgrad, dY and X for wgrad; weights once a step,
activations once a micro-batch), each read and written once in bf16, or both layouts from one read,
at a measured bandwidth, against a measured bf16 step.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections import Counter
from pathlib import Path
from typing import Mapping, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from megatron.quant.layers.graph_safety import DATA_DEPENDENT_SHAPES, HOST_READS

GEMMS = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "_scaled_mm", "_grouped_mm"})
HOST_SYNCS = HOST_READS | DATA_DEPENDENT_SHAPES  # the graph-safety checker's: what makes the host wait
NO_LAUNCH = frozenset({"detach", "empty", "empty_strided", "empty_like", "lift_fresh", "_unsafe_view", "alias",
                       "set_", "resize_", "size", "stride", "is_same_size", "_has_compatible_shallow_copy_type"})
QUANTIZATION_CODE = ("/megatron/quant/formats/", "/megatron/quant/kernels/", "/megatron/quant/layers/operand.py",
                     "/megatron/quant/layers/weight_cache.py", "/megatron/quant/layers/delayed.py",
                     "/megatron/quant/layers/grouped_operand.py",
                     "/megatron/quant/layers/histories.py")


def _tensors(tree) -> list[torch.Tensor]:
    return [leaf for leaf in tree_flatten(tree)[0] if isinstance(leaf, torch.Tensor)]


def _quantizing() -> bool:
    """True when the op is called from the formats' or kernels' code (the quantization's own ops)."""
    frame = sys._getframe(2)
    while frame is not None:
        if any(part in frame.f_code.co_filename for part in QUANTIZATION_CODE):
            return True
        frame = frame.f_back
    return False


class WorkCount(TorchDispatchMode):
    """Counts the ops run under it (``launches``, ``host_syncs``, ``fp32_gemms``, ``gemms``; of them
    the quantization's own (called from the formats, the kernels or the layers' operand, weight-cache and
delayed-scaling code): ``quant_launches``, ``quant_host_syncs``, ``quant_bytes``; ``ops``:
    launches by op name)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()
        self.host_syncs = self.fp32_gemms = self.gemms = 0
        self.quant_launches = self.quant_host_syncs = self.quant_bytes = 0

    @property
    def launches(self) -> int:
        return sum(self.ops.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        inputs = _tensors((args, kwargs))
        if func._overloadname == "dtype" and name in ("mm", "bmm") and inputs[0].device.type == "cpu":
            out = getattr(torch, name)(inputs[0].float(), inputs[1].float()).to(kwargs.get("out_dtype", args[-1]))
        else:
            out = func(*args, **kwargs)
        if func.is_view or name in NO_LAUNCH:
            return out
        self.ops[name] += 1
        self.host_syncs += name in HOST_SYNCS
        if name in GEMMS:
            self.gemms += 1
            self.fp32_gemms += all(t.dtype == torch.float32 for t in inputs[:2])
        if _quantizing():
            self.quant_launches += 1
            self.quant_host_syncs += name in HOST_SYNCS
            self.quant_bytes += sum(t.numel() * t.element_size() for t in (*inputs, *_tensors(out)))
        return out

    def summary(self) -> dict:
        return {"launches": self.launches, "host_syncs": self.host_syncs, "gemms": self.gemms,
                "fp32_gemms": self.fp32_gemms, "quant_launches": self.quant_launches,
                "quant_host_syncs": self.quant_host_syncs, "quant_bytes": self.quant_bytes}


def linear_shapes(model: Mapping) -> dict[str, tuple[int, int]]:
    """(in, out) features of a Llama layer's linear layers (a fused SwiGLU fc1), from a preset's shapes."""
    hidden, ffn = model["hidden_size"], model["ffn_hidden_size"]
    head = model.get("kv_channels") or hidden // model["num_attention_heads"]
    qkv = (model["num_attention_heads"] + 2 * model["num_query_groups"]) * head
    return {"qkv": (hidden, qkv), "proj": (model["num_attention_heads"] * head, hidden), "fc1": (hidden, 2 * ffn),
            "fc2": (ffn, hidden)}


def linear_floor(tokens: int, fan_in: int, fan_out: int, micro_batches: int = 1) -> dict:
    """One linear layer's quantized GEMM operands in an optimizer step: X and dY (``tokens`` a
    micro-batch) and W (once a step), each used by two GEMMs; ``operand_elements`` counts each use,
    ``tensor_elements`` each tensor once (both its layouts from one read)."""
    tensors = tokens * (fan_in + fan_out) * micro_batches + fan_in * fan_out
    return {"operand_elements": 2 * tensors, "tensor_elements": tensors}


def operand_floor(model: Mapping, seq: int, micro_batch: int, micro_batches: int) -> dict:
    """``linear_floor`` summed over a model preset's layers."""
    floors = [linear_floor(seq * micro_batch, *shape, micro_batches) for shape in linear_shapes(model).values()]
    return {key: sum(floor[key] for floor in floors) * model["num_layers"] for key in floors[0]}


def floor_ms(floor: Mapping, bytes_per_s: float, element_bytes: int = 2) -> dict:
    """Milliseconds to quantize a step's operands at ``bytes_per_s``: each operand read and written once,
    or each tensor read once and its two layouts written."""
    once = floor["operand_elements"] * 2 * element_bytes
    both = floor["tensor_elements"] * 3 * element_bytes
    return {"each_operand_ms": 1e3 * once / bytes_per_s, "both_layouts_one_read_ms": 1e3 * both / bytes_per_s}


def main(argv: Optional[list[str]] = None) -> int:
    from megatron.quant.training.presets import get_preset

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[2].split(":")[0])
    parser.add_argument("--model", default="llama3.2-1b", help="a model preset (megatron.quant.training.presets)")
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=2, help="micro-batches an optimizer step")
    parser.add_argument("--tbps", type=float, default=3.1, help="the bandwidth, TB/s (an H200's measured copy)")
    parser.add_argument("--train-json", type=Path, default=Path("bench/results/gpu_check_nvidia-h200/train_3.json"),
                        help="a train stage's JSON: its bf16 step is the reference")
    args = parser.parse_args(argv)
    try:
        model = get_preset(args.model)
    except (KeyError, ValueError):
        print(f"--model {args.model!r} is not a model preset: {traceback.format_exc(limit=0).strip()}")
        return 2
    floor = operand_floor(model, args.seq_length, args.micro_batch_size, args.micro_batches)
    times = floor_ms(floor, args.tbps * 1e12)
    out = {"model": args.model, "seq_length": args.seq_length, "micro_batch_size": args.micro_batch_size,
           "micro_batches": args.micro_batches, "tbps": args.tbps, **floor, **times}
    if args.train_json.is_file():
        rows = json.loads(args.train_json.read_text())["rows"]
        bf16 = [row["step_s"] for row in rows if row["variant"] == "bf16" and row["model"] == args.model]
        if bf16:
            step_ms = 1e3 * min(bf16)
            out.update(bf16_step_ms=step_ms, **{key.replace("_ms", "_share_of_bf16_step"): value / step_ms
                                                 for key, value in times.items()})
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
