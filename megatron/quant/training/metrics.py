"""FLOPs per iteration, MFU, a memory estimate, and the console/TensorBoard logger.

FLOPs count the matrix multiplications of one training step (forward + backward = 3x the
forward GEMMs), 2 FLOPs per multiply-add, as Megatron-LM's ``num_floating_point_operations``
does: no causal-mask discount, elementwise work ignored.
"""
from __future__ import annotations

import importlib.util
import math
import os
from typing import Mapping

import torch

from megatron.quant.training.mla import mla_attention_sizes

# Dense (no sparsity) bf16 peak TFLOP/s per device, from the vendors' datasheets. Fake
# quantization computes in bf16/fp32, so the bf16 peak is the honest denominator.
PEAK_BF16_TFLOPS = {
    "H200": 989.0, "H100 SXM": 989.0, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H100": 989.0,
    "H800": 989.0, "H20": 148.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0, "L4": 121.0,
    "B200": 2250.0, "GB200": 2500.0,
}
# Written into --save when a run diverged: the sweep records such a run as diverged, not crashed.
DIVERGED = "diverged.json"


def mlp_sizes(shape: Mapping) -> list[tuple[int, int]]:
    """Each decoder layer's MLP as (parameters, multiply-adds per token): a dense SwiGLU (gate, up, down),
    or an MoE layer (every routed expert's weights, top-k of them per token, the shared experts and the
    router), placed by ``moe_layer_freq`` as megatron-core places them."""
    h, ffn, layers = shape["hidden_size"], shape["ffn_hidden_size"], shape["num_layers"]
    dense = (3 * h * ffn, 3 * h * ffn)
    experts = shape.get("num_experts")
    if not experts:
        return [dense] * layers
    expert = 3 * h * (shape.get("moe_ffn_hidden_size") or ffn)
    always = 3 * h * (shape.get("moe_shared_expert_intermediate_size") or 0) + h * experts  # shared + router
    moe = (experts * expert + always, shape["moe_router_topk"] * expert + always)
    freq = shape.get("moe_layer_freq") or 1
    pattern = [i % freq == 0 for i in range(layers)] if isinstance(freq, int) else list(freq)
    return [moe if is_moe else dense for is_moe in pattern]


def attention_sizes(shape: Mapping) -> tuple[int, int, int]:
    """Each decoder layer's attention as (parameters, projection multiply-adds per token, the widths Q K^T
    and P V multiply over per pair of positions): GQA (qkv, proj), or multi-latent attention (``training/mla.py``)."""
    if shape.get("multi_latent_attention"):
        return mla_attention_sizes(shape)
    h = shape["hidden_size"]
    kv = h * shape["num_query_groups"] // shape["num_attention_heads"]
    weights = h * (h + 2 * kv) + h * h
    return weights, weights, 2 * h


def forward_gemm_flops(shape: Mapping, *, tokens: int, seq_length: int, vocab_size: int) -> float:
    """Forward-pass GEMM FLOPs for ``tokens`` tokens in sequences of ``seq_length``."""
    h, layers = shape["hidden_size"], shape["num_layers"]
    _, projections, width = attention_sizes(shape)
    attention = 2 * tokens * seq_length * width  # Q K^T and P V over the full (unmasked) square
    mlp = sum(2 * tokens * active for _, active in mlp_sizes(shape))
    logits = 2 * tokens * h * vocab_size
    return float(layers * (2 * tokens * projections + attention) + mlp + logits)


def flops_per_iteration(shape: Mapping, *, global_batch_size: int, seq_length: int, vocab_size: int) -> float:
    """Training FLOPs of one iteration (all ranks): backward is twice the forward."""
    return 3.0 * forward_gemm_flops(shape, tokens=global_batch_size * seq_length, seq_length=seq_length,
                                    vocab_size=vocab_size)


def wandb_flags_problem(project: str | None, exp_name: str | None, save_dir: str | None) -> str | None:
    """Why the --wandb-* flags cannot log (None when they can, or are not given)."""
    if project is None:
        return None if exp_name is None and save_dir is None else \
            "--wandb-exp-name and --wandb-save-dir need --wandb-project"
    if importlib.util.find_spec("wandb") is None:
        return (f"--wandb-project {project!r} needs the wandb package, which is not installed: "
                "pip install 'megatron-quant[wandb]' (or drop the --wandb-* flags)")
    return None


def peak_tflops(device_name: str | None, override: float | None = None) -> float | None:
    """Peak dense bf16 TFLOP/s of one device: ``override``, else the table; None when unknown (e.g. CPU)."""
    if override is not None:
        return override
    if device_name is None:
        return None
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):  # "H100 SXM" before "H100"
        if key.lower() in device_name.lower():
            return PEAK_BF16_TFLOPS[key]
    return None


def memory_estimate_gb(shape: Mapping, *, num_parameters: int, micro_batch_size: int, seq_length: int,
                       tensor_parallel: int, pipeline_parallel: int, data_parallel: int,
                       precision: str, distributed_optimizer: bool) -> dict[str, float]:
    """Per-rank memory in GB: parameters, gradients, optimizer state, activations.

    Activations: Korthikanti et al. 2022 (no recomputation, no sequence parallelism),
    ``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` bytes per layer in 16-bit, scaled for fp32.
    """
    half = precision in ("bf16", "fp16")
    params_here = num_parameters / (tensor_parallel * pipeline_parallel)
    # Adam moments (fp32) plus fp32 master weights when the model is 16-bit.
    optimizer_bytes = 8 + (4 if half else 0)
    if distributed_optimizer:
        optimizer_bytes /= data_parallel
    s, b, h, a = seq_length, micro_batch_size, shape["hidden_size"], shape["num_attention_heads"]
    t = tensor_parallel
    per_layer = s * b * h * (10 + 24 / t + 5 * a * s / (h * t)) * (1 if half else 2)
    layers_here = math.ceil(shape["num_layers"] / pipeline_parallel)
    gb = 1e9
    return {
        "parameters": params_here * (2 if half else 4) / gb,
        "gradients": params_here * 4 / gb,  # megatron-core DDP reduces gradients in fp32 here
        "optimizer": params_here * optimizer_bytes / gb,
        "activations": per_layer * layers_here * pipeline_parallel / gb,  # 1F1B keeps up to PP micro-batches
    }


class MetricsLogger:
    """Console lines, TensorBoard scalars and optionally W&B; only the logging rank writes.

    The TensorBoard writer opens at the first logged step and purges any events from that step
    on, so a resumed run's curve replaces what the interrupted one logged after its checkpoint.
    """

    def __init__(self, tensorboard_dir: str | None, enabled: bool) -> None:
        self.enabled = enabled
        self.tensorboard_dir = tensorboard_dir if enabled else None
        self.writer = None
        self.wandb_run = None

    def start_wandb(self, project: str, name: str | None, save_dir: str | None, config: Mapping) -> None:
        """Log the same scalars to W&B (``wandb`` is checked by the argument validation)."""
        if self.enabled:
            import wandb

            if save_dir:
                os.makedirs(save_dir, exist_ok=True)
            self.wandb_run = wandb.init(project=project, name=name, dir=save_dir, config=dict(config))

    def print(self, text: str) -> None:
        if self.enabled:
            print(text, flush=True)

    def scalars(self, iteration: int, values: Mapping[str, float], prefix: str = "train/") -> None:
        finite = {prefix + key: float(value) for key, value in values.items()
                  if isinstance(value, (int, float)) and math.isfinite(value)}
        if self.tensorboard_dir and self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(self.tensorboard_dir, purge_step=iteration)
        if self.writer is not None:
            for tag, value in finite.items():
                self.writer.add_scalar(tag, value, iteration)
        if self.wandb_run is not None and finite:
            self.wandb_run.log(finite, step=iteration)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()


def process_seconds() -> float | None:
    """Seconds since this process started (Linux's /proc; None elsewhere): the interpreter's start and
    the imports, which no timer inside the program sees."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
            return float(uptime.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def capture_digest(summary: Mapping[str, float]) -> dict[str, float | str]:
    """The console's view of a stats-mode capture summary: records, writer wait, and the worst
    overflow/underflow ratio and SQNR over ``quant/<role>/<tensor>/<metric>`` entries (TensorBoard gets all)."""
    if not summary:
        return {}
    digest: dict[str, float | str] = {"captures": int(summary.get("capture/records", 0)),
                                      "saver wait (s)": summary.get("capture/wait_s", 0.0)}
    for metric, pick in (("overflow_ratio", max), ("underflow_ratio", max), ("sqnr_db", min)):
        entries = {key.removeprefix("quant/").removesuffix("/" + metric): value
                   for key, value in summary.items() if key.startswith("quant/") and key.endswith("/" + metric)}
        if entries:
            where = pick(entries, key=entries.get)
            digest[f"{'max' if pick is max else 'min'} {metric}"] = f"{entries[where]:.4g} ({where})"
    return digest


def format_line(iteration: int, train_iters: int, values: Mapping[str, float]) -> str:
    """Megatron-LM-style ``iteration  N/ M | key: value | ...`` console line."""
    parts = [f"iteration {iteration:>6}/{train_iters}"]
    for key, value in values.items():
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        parts.append(f"{key}: {text}")
    return " | ".join(parts)


def device_name() -> str | None:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def num_parameters(shape: Mapping) -> int:
    """Parameter count of the Llama ``shape`` (whole model, all shards)."""
    h, layers, vocab = shape["hidden_size"], shape["num_layers"], shape["vocab_size"]
    per_layer = attention_sizes(shape)[0] + 2 * h  # attention, two norms; the MLPs from mlp_sizes
    embeddings = vocab * h * (2 if shape["untie_embeddings_and_output_weights"] else 1)
    return embeddings + layers * per_layer + sum(params for params, _ in mlp_sizes(shape)) + h  # + final norm
