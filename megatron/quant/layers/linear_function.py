"""The autograd function of a fake-quantized linear layer, forward and backward, and its capture calls.

Its operations are exactly megatron-core's stock linear function's (same calls, same order)
when no operand has a format, so passthrough is bit-identical to it. Saved for backward: the
operands megatron-core saves, high precision, since each backward GEMM quantizes along its own
reduction axis; where a backward GEMM's format gives the same result whatever the axis and
equals the forward's, the forward's quantized copy is saved instead and reused. Where one kernel
quantizes both axes (``quantize_both_axes``), the input is quantized for fprop and wgrad in one
read in the forward and wgrad's copy saved (as TE saves its columnwise copy), and the gradient for
dgrad and wgrad in one read in the backward: each operand is quantized once per use.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import List, Mapping, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from megatron.quant import tensor_saver
from megatron.quant.compat import grad_accum_fusion_available
from megatron.quant.formats.accumulation import fp8_kind
from megatron.quant.formats.interface import QuantFormat
from megatron.quant.formats.random_bits import RandomBits
from megatron.quant.layers.operand import (
    NoiseScope,
    Quantized,
    capturing,
    check_gemm_transforms,
    noise_scope,
    quantize_both_axes,
    quantize_operand,
    reusable_amax,
    same_quantization,
)
from megatron.quant.layers.scaled_gemm import HopperAccumulator, matmul, scaled_product
from megatron.quant.layers.weight_cache import QuantizedWeightCache
from megatron.quant.recipes import operands
from megatron.quant.recipes.operands import OperandSpec, Parallel
from megatron.quant.tensor_saver import CaptureSite


@dataclass(frozen=True)
class LinearQuant:
    """Operand specs of a linear layer's GEMMs by recipe key ("fprop.input", ...): one per row of
    ``recipes.operands.LINEAR_TABLE``, whose axes and shard dimensions they take. ``dequantized``: the
    backward operands quantized (or, unformatted, used as they are) from their forward twin's dequantized
    operand (``operands.FORWARD_TWINS``) instead of the original tensor."""

    specs: Mapping[str, OperandSpec]
    dequantized: frozenset[str] = frozenset()
    accumulate: tuple[tuple[str, str], ...] = ()  # ``QuantRecipe.accumulate``: (gemm, "fast" | "promoted")

    def __getitem__(self, key: str) -> OperandSpec:
        return self.specs[key]

    @classmethod
    def from_formats(cls, formats: Mapping[str, Optional[QuantFormat]], dequantized: frozenset[str] = frozenset(),
                     accumulate: tuple[tuple[str, str], ...] = ()) -> "LinearQuant":
        """From recipe keys to formats (None: not quantized); axes are fixed by the GEMMs."""
        return cls({op.key: OperandSpec(formats[op.key], op.axis, op.key) for op in operands.LINEAR_TABLE},
                   frozenset(dequantized), tuple(accumulate))

    def accumulator(self, gemm: str) -> Optional[HopperAccumulator]:
        """How ``gemm`` adds its products: None for exact FP32 sums (also where an operand is not
        quantized: no FP8 GEMM runs there, TE runs such a GEMM in high precision, as its FakeQuant and
        DisableFP8GEMM do), else the Hopper FP8 accumulator of its operands' formats."""
        mode = dict(self.accumulate).get(gemm, "exact")
        fmts = [self.specs[op.key].fmt for op in operands.LINEAR_TABLE if op.gemm == gemm]
        if mode == "exact" or any(fmt is None for fmt in fmts):
            return None
        kinds = tuple(fp8_kind(fmt) for fmt in fmts)
        if None in kinds:
            shown = ", ".join(f"{f.name} ({f.scaling} scaling)" for f in fmts)
            raise ValueError(f"accumulate.{gemm}: {mode!r} models an FP8 tensor core, whose operands are per-tensor "
                             f"scaled FP8 (fp8_e4m3, fp8_e5m2); this GEMM's are {shown} (give it accumulate: "
                             f"{{{gemm}: exact}})")
        return HopperAccumulator(mode == "fast", kinds)  # type: ignore[arg-type]

    def sharded(self, parallel: Parallel, groups: int = 1) -> "LinearQuant":
        """The same specs with the TP shard dimensions of a ``parallel`` layer; ``groups``: separately
        sharded runs along them (2 for a fused SwiGLU fc1)."""
        specs = dict(self.specs)
        for op in operands.LINEAR_TABLE:
            if op.shard_dim(parallel) is not None:
                specs[op.key] = replace(specs[op.key], shard_dim=op.shard_dim(parallel), shard_groups=groups)
        return replace(self, specs=specs)

    def check_shards(self, parallel: Parallel, shard_size: int, module: str) -> None:
        """ValueError when a block (or n x n tile) would straddle two TP shards of ``shard_size``
        elements: the operand's blocks run along its shard dimension, or tiles span both dimensions."""
        for op in operands.LINEAR_TABLE:
            dim, fmt = op.shard_dim(parallel), self.specs[op.key].fmt
            if dim is None or fmt is None or fmt.block_size is None:
                continue
            if (fmt.tiled or (dim - op.axis) % 2 == 0) and shard_size % fmt.block_size:
                raise ValueError(
                    f"{module}: {op.key} is quantized by {fmt.name} in blocks of {fmt.block_size} along a "
                    f"tensor-parallel shard of {shard_size} elements; the shard size must be a multiple of "
                    f"{fmt.block_size} (change the tensor-parallel size or the format)")

    def from_forward(self, key: str) -> bool:
        """True when backward operand ``key`` is taken from its forward twin's dequantized operand."""
        return key in self.dequantized

    def __post_init__(self) -> None:
        for key in self.dequantized:
            twin = self.specs[operands.FORWARD_TWINS[key]].fmt
            if twin is not None and twin.transforms_operand:
                raise ValueError(f"{key} is taken from {operands.FORWARD_TWINS[key]}'s dequantized operand, which "
                                 f"{twin.name} leaves Hadamard-transformed; drop its hadamard or the dequantized "
                                 f"source")
        gemms: dict[str, list[OperandSpec]] = {}
        for op in operands.LINEAR_TABLE:
            gemms.setdefault(op.gemm, []).append(self.specs[op.key])
        check_gemm_transforms(gemms)
        for gemm in gemms:
            self.accumulator(gemm)  # refuses an accumulator model for operands it does not model


@dataclass
class LinearGemmConfig:
    """Everything megatron-core passes to its linear autograd function, plus quantization."""

    quant: LinearQuant
    weight_cache: QuantizedWeightCache
    quant_group: Optional[dist.ProcessGroup]  # the layer's TP group, for per-tensor amax
    site: Optional[CaptureSite]
    gradient_accumulation_fusion: bool
    allreduce_dgrad: bool
    sequence_parallel: bool
    tp_group: dist.ProcessGroup
    grad_output_buffer: Optional[List[Tensor]] = None
    wgrad_deferral_limit: Optional[int] = 0
    noise_root: Optional[RandomBits] = None  # the module's stochastic-rounding stream, if any
    # Whether autograd records the call, read where the config is built, just before it (inside the
    # function's forward grad mode is always off): no backward follows an evaluation's forward or the
    # first forward of a recomputed region, which run under no_grad.
    grad_enabled: bool = field(default_factory=torch.is_grad_enabled)


def _gather_sequence(x: Tensor, group: dist.ProcessGroup) -> Tensor:
    out = torch.empty((x.shape[0] * dist.get_world_size(group),) + tuple(x.shape[1:]),
                      dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.contiguous(), group=group)
    return out


def _accumulate_main_grad(weight: Tensor, main_grad: Tensor, grad_output: Quantized, total_input: Quantized,
                          dtype: torch.dtype, accumulator: Optional[HopperAccumulator] = None) -> Optional[Tensor]:
    """megatron-core's gradient-accumulation fusion: dW += dY^T X into main_grad (same kernels when present),
    the product summed in main_grad's dtype, never rounded to the operands' on the way (as apex's kernel
    and TE's fused wgrad GEMM accumulate)."""
    from megatron.core.tensor_parallel import layers as mlayers

    weight.main_grad = main_grad
    scaled = grad_output.tensor_scale is not None or total_input.tensor_scale is not None or accumulator is not None
    if hasattr(weight, "__fsdp_param__"):
        weight.main_grad = weight.get_main_grad()
        weight.main_grad.copy_(scaled_product(_wgrad, grad_output, total_input, weight.main_grad.dtype, accumulator))
    elif grad_accum_fusion_available() and not scaled:
        kernel = (mlayers.fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32
                  if main_grad.dtype == torch.float32 else
                  mlayers.fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp16)
        kernel(total_input.values, grad_output.values, main_grad)
    else:  # no apex kernel (CPU), per-tensor scales to apply or an accumulator model: the sum, unfused
        main_grad.add_(scaled_product(_wgrad, grad_output, total_input, main_grad.dtype, accumulator))
    if not hasattr(weight, "grad_added_to_main_grad"):
        return None
    # As megatron-core: hand autograd a dummy so DDP hooks run on the main thread.
    weight.grad_added_to_main_grad = True
    make = torch.zeros if getattr(weight, "zero_out_wgrad", False) else torch.empty
    if mlayers.HAVE_TE:
        return mlayers.get_dummy_wgrad(list(main_grad.shape), dtype, zero=make is torch.zeros)
    return make(main_grad.shape, dtype=dtype, device=main_grad.device, requires_grad=False)


def _input_both_axes(total_input: Tensor, weight: Tensor, cfg: LinearGemmConfig, noise: Optional[NoiseScope],
                     capture: bool) -> Optional[tuple[Quantized, Quantized]]:
    """(wgrad's input, fprop's input), both in the input's shape, from one read of it where one kernel
    does both axes (``quantize_both_axes``: the same format object for both, blocks along an axis, no
    transform, one tensor scale, no delayed scaling); the same values, scales and noise as two reads.
    None keeps the two reads (fprop's now, wgrad's in the backward from the saved input) where saving
    wgrad's copy is no gain: no wgrad follows (a frozen weight; no backward: an evaluation, or the first
    forward of a recomputed region, both under no_grad, while the recompute itself takes this path);
    sequence parallelism (megatron-core keeps the local shard and gathers it again in the backward, and
    the gathered copy would cost TP times its memory); a capture (it records fprop's operand with its
    statistics, from a read of its own); wgrad's input taken from fprop's dequantized operand.
    Stochastic rounding draws each layout's noise from this forward's scope keyed by its own operand,
    as the backward does: the same bits."""
    q = cfg.quant
    fmt = q["fprop.input"].fmt
    if fmt is None or not fmt.dual_axis or not (cfg.grad_enabled and weight.requires_grad) or \
            cfg.sequence_parallel or capture or q.from_forward("wgrad.input"):
        return None  # (before the reshape below, which copies an input that is not contiguous)
    flat = total_input.reshape(-1, total_input.shape[-1])  # tokens x features, as wgrad reads it
    both = quantize_both_axes(flat, q["wgrad.input"], q["fprop.input"], cfg.quant_group, noise)
    return None if both is None else (both[0].reshape(total_input.shape), both[1].reshape(total_input.shape))


def _dgrad_weight(weight: Tensor, cfg: LinearGemmConfig, noise: Optional[NoiseScope], capture: bool) -> Quantized:
    """dgrad's weight operand: the cached quantization of the weight, or, taken from the forward, the
    forward's cached operand dequantized and quantized as dgrad's spec says (described for the saver
    with ``capture``)."""
    q, group = cfg.quant, cfg.quant_group
    if not q.from_forward("dgrad.weight"):
        return cfg.weight_cache.get(weight, q["dgrad.weight"], group, noise)
    forward = cfg.weight_cache.get(weight, q["fprop.weight"], group, noise)
    return quantize_operand(forward.dequantized(), q["dgrad.weight"], group, noise, per_sample=False,
                            capture=capture)


def _fprop(x: Tensor, w: Tensor, out_dtype: Optional[torch.dtype]) -> Tensor:
    return matmul(x, w.t(), out_dtype)


def _dgrad(dy: Tensor, w: Tensor, out_dtype: Optional[torch.dtype]) -> Tensor:
    return matmul(dy, w, out_dtype)


def _wgrad(dy: Tensor, x: Tensor, out_dtype: Optional[torch.dtype]) -> Tensor:
    return matmul(dy.t(), x, out_dtype)


class QuantLinearFunction(torch.autograd.Function):
    """megatron-core's LinearWithGradAccumulationAndAsyncCommunication (and its frozen-weight
    twin) with each GEMM operand fake-quantized per ``LinearQuant``."""

    @staticmethod
    def forward(ctx, input: Tensor, weight: Tensor, bias: Optional[Tensor], cfg: LinearGemmConfig) -> Tensor:
        ctx.cfg = cfg
        ctx.use_bias = bias is not None
        ctx.main_grad = weight.main_grad if cfg.gradient_accumulation_fusion and hasattr(weight, "main_grad") else None
        total_input = _gather_sequence(input, cfg.tp_group) if cfg.sequence_parallel else input
        q, group = cfg.quant, cfg.quant_group
        capture = capturing(cfg.site)
        # The backward draws its noise from the position of this forward (pipeline schedules run
        # other micro-batches' forwards in between).
        ctx.noise = noise = noise_scope(cfg.noise_root, group)
        both = _input_both_axes(total_input, weight, cfg, noise, capture)
        x = both[1] if both else quantize_operand(total_input, q["fprop.input"], group, noise, capture=capture)
        w = cfg.weight_cache.get(weight, q["fprop.weight"], group, noise,
                                 partner=None if q.from_forward("dgrad.weight") else q["dgrad.weight"])
        # The input is only needed for wgrad (a frozen weight has none): wgrad's quantized copy where
        # it is known now (both axes from one read, or fprop's copy serves), else the input itself; under
        # sequence parallelism the local shard is kept and gathered again, as megatron-core does (but
        # the forward's dequantized operand, when wgrad takes its input from it, is kept whole).
        ctx.input_from_forward = q.from_forward("wgrad.input")
        reuse = (same_quantization(q["fprop.input"], q["wgrad.input"]) and not cfg.sequence_parallel
                 and not ctx.input_from_forward)
        wgrad_input = both[0] if both else x if reuse else None
        ctx.input_amax = None if ctx.input_from_forward else reusable_amax(x, q["fprop.input"], q["wgrad.input"])
        saved_input = (wgrad_input.values if wgrad_input is not None else x.dequantized() if ctx.input_from_forward
                       else input)
        ctx.save_for_backward(saved_input if weight.requires_grad else None, weight)
        # The values travel in saved_tensors.
        ctx.input_quantized = None if wgrad_input is None else replace(wgrad_input, values=None, seen=None)
        output = scaled_product(_fprop, x, w, accumulator=q.accumulator("fprop"))
        if bias is not None:
            output = output + bias
        if capture:
            tensor_saver.capture(cfg.site, "forward", "pre", {
                "input": x.seen, "weight": cfg.weight_cache.seen(weight, q["fprop.weight"], group, noise)})
            tensor_saver.capture(cfg.site, "forward", "post", {"output": output})
        return output

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        from megatron.core.tensor_parallel.layers import prepare_input_tensors_for_wgrad_compute

        input, weight = ctx.saved_tensors
        cfg: LinearGemmConfig = ctx.cfg
        q, group, noise = cfg.quant, cfg.quant_group, ctx.noise
        wgrad_compute = weight.requires_grad
        if wgrad_compute and cfg.grad_output_buffer is not None:
            if cfg.wgrad_deferral_limit == 0 or len(cfg.grad_output_buffer) < cfg.wgrad_deferral_limit:
                cfg.grad_output_buffer.append(grad_output)
                wgrad_compute = False
        total_input = None
        if wgrad_compute:
            gather = cfg.sequence_parallel and not ctx.input_from_forward
            total_input = _gather_sequence(input, cfg.tp_group) if gather else input

        capture = capturing(cfg.site)
        # dY along tokens (wgrad) and features (dgrad) from one read where a kernel does both.
        both = None if capture or not wgrad_compute else quantize_both_axes(
            grad_output.reshape(-1, grad_output.shape[-1]), q["wgrad.grad_output"], q["dgrad.grad_output"], group,
            noise)
        dy = both[1].reshape(grad_output.shape) if both else \
            quantize_operand(grad_output, q["dgrad.grad_output"], group, noise, capture=capture)
        w = _dgrad_weight(weight, cfg, noise, capture)
        grad_input = scaled_product(_dgrad, dy, w, accumulator=q.accumulator("dgrad"))
        if capture:
            tensor_saver.capture(cfg.site, "backward", "pre", {
                "grad_output": dy.seen, "weight": w.seen if q.from_forward("dgrad.weight") else
                cfg.weight_cache.seen(weight, q["dgrad.weight"], group, noise)})

        handle = None
        if cfg.sequence_parallel:
            shard = (grad_input.shape[0] // dist.get_world_size(cfg.tp_group),) + tuple(grad_input.shape[1:])
            sub_grad_input = torch.empty(shard, dtype=grad_input.dtype, device=grad_input.device)
            handle = dist.reduce_scatter_tensor(sub_grad_input, grad_input.contiguous(),
                                                group=cfg.tp_group, async_op=True)
        elif cfg.allreduce_dgrad:
            handle = dist.all_reduce(grad_input, group=cfg.tp_group, async_op=True)

        grad_weight = grad_bias = None
        if wgrad_compute:
            grad_output, total_input = prepare_input_tensors_for_wgrad_compute(grad_output, total_input)
            if both:
                dy_w = both[0].reshape(grad_output.shape)
            elif same_quantization(q["dgrad.grad_output"], q["wgrad.grad_output"]):
                dy_w = dy.reshape(grad_output.shape)
            else:
                dy_w = quantize_operand(grad_output, q["wgrad.grad_output"], group, noise,
                                        amax=reusable_amax(dy, q["dgrad.grad_output"], q["wgrad.grad_output"]))
            if ctx.input_quantized is not None:
                x_w = replace(ctx.input_quantized, values=total_input)
            else:
                x_w = quantize_operand(total_input, q["wgrad.input"], group, noise, amax=ctx.input_amax)
            if cfg.gradient_accumulation_fusion:
                grad_weight = _accumulate_main_grad(weight, ctx.main_grad, dy_w, x_w, input.dtype,
                                                    q.accumulator("wgrad"))
            else:
                grad_weight = scaled_product(_wgrad, dy_w, x_w, accumulator=q.accumulator("wgrad"))
        if ctx.use_bias:
            grad_bias = grad_output.sum(dim=0)
        if handle is not None:
            handle.wait()
        if cfg.sequence_parallel:
            grad_input = sub_grad_input
        if capture:
            post = {"grad_input": grad_input}
            if grad_weight is not None and not cfg.gradient_accumulation_fusion:
                post["grad_weight"] = grad_weight
            tensor_saver.capture(cfg.site, "backward", "post", post)
        return grad_input, grad_weight, grad_bias, None
