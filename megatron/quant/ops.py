"""Autograd functions for fake-quantized GEMMs, forward and backward, and their capture calls.

Every GEMM operand is quantized with its own ``OperandSpec`` (format, block axis along that
GEMM's reduction dimension). A spec without a format leaves the operand untouched, and the
functions then run exactly the operations of megatron-core's stock layers (same calls, same
order), so passthrough is bit-identical to them.

Saved for backward: the operands megatron-core saves, high precision, since each backward
GEMM quantizes along its own reduction axis. When a backward GEMM's format gives the same
result whatever the axis (no blocks, round-to-nearest) and equals the forward's, the
forward's quantized copy is saved instead and reused (no re-quantization, same memory except
for attention probabilities, whose high-precision copy softmax keeps anyway), and a gradient
feeding both backward GEMMs is quantized once. Quantized weights are cached per axis
(``QuantizedWeightCache``) because weights are constant within an iteration.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, List, Mapping, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from megatron.quant import tensor_saver
from megatron.quant.formats import abs_max
from megatron.quant.tensor_saver import CaptureSite, Operand


class CompiledFormat:
    """A NumericFormat whose ``quantize`` runs under ``torch.compile`` (static shapes).

    Same results as the eager format (the formats are written to compile to the same bit
    operations); several times faster on CPU after a one-off compilation per tensor shape and
    axis. Share one instance per format across a model so that those compilations are shared.
    """

    # A Llama layer quantizes ~20 distinct (shape, axis) combinations per format.
    RECOMPILE_LIMIT = 64

    def __init__(self, fmt: Any) -> None:
        self.fmt = fmt
        self._compiled = torch.compile(fmt.quantize, dynamic=False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fmt, name)

    def quantize(self, x: Tensor, axis: int = -1, amax: Optional[Tensor] = None) -> Tensor:
        with torch._dynamo.config.patch(recompile_limit=self.RECOMPILE_LIMIT):
            return self._compiled(x, axis=axis, amax=amax)


@dataclass(frozen=True)
class OperandSpec:
    """How one GEMM operand is fake-quantized: ``fmt`` None means not at all."""

    fmt: Any = None  # megatron.quant.formats.NumericFormat
    axis: int = -1


def tensor_amax(x: Tensor, fmt: Any, group: Optional[dist.ProcessGroup]) -> Optional[Tensor]:
    """The amax a per-tensor-scaled format must use so results do not depend on the TP size.

    None when the format needs none, or when there is no group to reduce over (the format
    then computes the same value itself).
    """
    if not fmt.needs_tensor_amax or group is None or dist.get_world_size(group) == 1:
        return None
    amax = abs_max(x.detach()).float()
    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
    return amax


def quantize_operand(x: Tensor, spec: OperandSpec, group: Optional[dist.ProcessGroup]
                     ) -> tuple[Tensor, Optional[Tensor]]:
    """(fake-quantized x, amax used); x itself when the spec has no format."""
    if spec.fmt is None:
        return x, None
    amax = tensor_amax(x, spec.fmt, group)
    return spec.fmt.quantize(x, axis=spec.axis, amax=amax), amax


def captured_operand(x: Tensor, spec: OperandSpec, amax: Optional[Tensor]) -> Operand:
    """What the saver records for ``x``: quantized with the amax its GEMM used, the scale kept so
    the capture statistics need not quantize ``x`` a second time. No collective."""
    if spec.fmt is None:
        return Operand(tensor=x, axis=spec.axis)
    q, scale = spec.fmt.quantize_with_scale(x, axis=spec.axis, amax=amax)
    return Operand(tensor=x, fmt=spec.fmt, axis=spec.axis, quantized=q, amax=amax, scale=scale)


def quantize_seen_operand(x: Tensor, spec: OperandSpec, group: Optional[dist.ProcessGroup], capture: bool
                          ) -> tuple[Tensor, Optional[Operand]]:
    """``quantize_operand``'s values; when ``capture``, also the Operand the saver records."""
    if not capture:
        return quantize_operand(x, spec, group)[0], None
    seen = captured_operand(x, spec, None if spec.fmt is None else tensor_amax(x, spec.fmt, group))
    return (x if seen.quantized is None else seen.quantized), seen


def same_quantization(first: OperandSpec, second: OperandSpec) -> bool:
    """True when ``second`` quantizes a tensor exactly as ``first`` did, whatever the axes: the
    same deterministic format without blocks (elementwise or one scale per tensor)."""
    a, b = first.fmt, second.fmt
    return (a is not None and b is not None and a.block_size is None and b.block_size is None
            and a.name == b.name and a.options == b.options and a.options.get("rounding") != "stochastic")


def operand(x: Tensor, spec: OperandSpec, quantized: Tensor, amax: Optional[Tensor]) -> Operand:
    return Operand(tensor=x, fmt=spec.fmt, axis=spec.axis,
                   quantized=quantized if spec.fmt is not None else None, amax=amax)


def capturing(site: Optional[CaptureSite]) -> bool:
    return site is not None and tensor_saver.is_active()


class QuantizedWeightCache:
    """Fake-quantized weights per (format, axis), valid while the weight is unchanged.

    Keyed on the weight's storage and autograd version counter, which every in-place update
    (torch optimizers) bumps: a weight is quantized once per optimizer step, not once per
    micro-batch. Writes through ``.data`` (megatron-core's mixed-precision optimizers copy
    main params that way) bypass the counter: call ``invalidate()`` after such a step.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[int, Optional[int]], tuple[tuple[int, int], Tensor, Optional[Tensor]]] = {}

    def get(self, weight: Tensor, spec: OperandSpec, group: Optional[dist.ProcessGroup]
            ) -> tuple[Tensor, Optional[Tensor]]:
        if spec.fmt is None:
            return weight, None
        # Formats without blocks and without random rounding give the same values on any axis.
        slot = (id(spec.fmt), None if same_quantization(spec, spec) else spec.axis)
        version = (weight.data_ptr(), weight._version)
        entry = self._entries.get(slot)
        if entry is None or entry[0] != version:
            with torch.no_grad():
                q, amax = quantize_operand(weight, spec, group)
            entry = (version, q, amax)
            self._entries[slot] = entry
        return entry[1], entry[2]

    def invalidate(self) -> None:
        self._entries.clear()


# ---- linear layers ---------------------------------------------------------------------------
@dataclass(frozen=True)
class LinearQuant:
    """Operand specs of a linear layer's three GEMMs on 2-D views ([tokens, features]; W [out, in])."""

    fprop_input: OperandSpec = OperandSpec(axis=-1)          # Y = X W^T: along in_features
    fprop_weight: OperandSpec = OperandSpec(axis=1)
    dgrad_grad_output: OperandSpec = OperandSpec(axis=-1)    # dX = dY W: along out_features
    dgrad_weight: OperandSpec = OperandSpec(axis=0)
    wgrad_grad_output: OperandSpec = OperandSpec(axis=0)     # dW = dY^T X: along tokens
    wgrad_input: OperandSpec = OperandSpec(axis=0)

    @classmethod
    def from_formats(cls, formats: Mapping[str, Any]) -> "LinearQuant":
        """From recipe keys ("fprop.input", ...) to formats; axes are fixed by the GEMMs."""
        return cls(**{f.name: OperandSpec(formats[f.name.replace("_", ".", 1)], f.default.axis)
                      for f in fields(cls)})

    def specs(self) -> dict[str, OperandSpec]:
        return {f.name.replace("_", ".", 1): getattr(self, f.name) for f in fields(self)}


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


def _gather_sequence(x: Tensor, group: dist.ProcessGroup) -> Tensor:
    out = torch.empty((x.shape[0] * dist.get_world_size(group),) + tuple(x.shape[1:]),
                      dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.contiguous(), group=group)
    return out


def _accumulate_main_grad(weight: Tensor, main_grad: Tensor, grad_output: Tensor, total_input: Tensor,
                          dtype: torch.dtype) -> Optional[Tensor]:
    """megatron-core's gradient-accumulation fusion: dW += dY^T X into main_grad (same kernels when present)."""
    from megatron.core.tensor_parallel import layers as mlayers

    weight.main_grad = main_grad
    if hasattr(weight, "__fsdp_param__"):
        weight.main_grad = weight.get_main_grad()
        torch.matmul(grad_output.t(), total_input, out=weight.main_grad)
    elif mlayers._grad_accum_fusion_available:
        kernel = (mlayers.fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32
                  if main_grad.dtype == torch.float32 else
                  mlayers.fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp16)
        kernel(total_input, grad_output, main_grad)
    else:  # no apex kernel (CPU): same sum, unfused
        main_grad.add_(grad_output.t().matmul(total_input).to(main_grad.dtype))
    if not hasattr(weight, "grad_added_to_main_grad"):
        return None
    # As megatron-core: hand autograd a dummy so DDP hooks run on the main thread.
    weight.grad_added_to_main_grad = True
    make = torch.zeros if getattr(weight, "zero_out_wgrad", False) else torch.empty
    if mlayers.HAVE_TE:
        return mlayers.get_dummy_wgrad(list(main_grad.shape), dtype, zero=make is torch.zeros)
    return make(main_grad.shape, dtype=dtype, device=main_grad.device, requires_grad=False)


class QuantLinearFunction(torch.autograd.Function):
    """megatron-core's LinearWithGradAccumulationAndAsyncCommunication (and its frozen-weight
    twin) with each GEMM operand fake-quantized per ``LinearQuant``."""

    @staticmethod
    def forward(ctx, input: Tensor, weight: Tensor, bias: Optional[Tensor], cfg: LinearGemmConfig) -> Tensor:
        ctx.cfg = cfg
        ctx.use_bias = bias is not None
        ctx.main_grad = weight.main_grad if cfg.gradient_accumulation_fusion and hasattr(weight, "main_grad") else None
        total_input = _gather_sequence(input, cfg.tp_group) if cfg.sequence_parallel else input
        q = cfg.quant
        capture = capturing(cfg.site)
        x_q, x_seen = quantize_seen_operand(total_input, q.fprop_input, cfg.quant_group, capture)
        w_q, w_amax = cfg.weight_cache.get(weight, q.fprop_weight, cfg.quant_group)
        # The input is only needed for wgrad (a frozen weight has none); under sequence
        # parallelism the local shard is kept and gathered again, as megatron-core does.
        ctx.input_quantized = same_quantization(q.fprop_input, q.wgrad_input) and not cfg.sequence_parallel
        saved_input = x_q if ctx.input_quantized else input
        ctx.save_for_backward(saved_input if weight.requires_grad else None, weight)
        output = torch.matmul(x_q, w_q.t())
        if bias is not None:
            output = output + bias
        if capture:
            tensor_saver.capture(cfg.site, "forward", "pre", {
                "input": x_seen,
                "weight": operand(weight, q.fprop_weight, w_q, w_amax)})
            tensor_saver.capture(cfg.site, "forward", "post", {"output": output})
        return output

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        from megatron.core.tensor_parallel.layers import prepare_input_tensors_for_wgrad_compute

        input, weight = ctx.saved_tensors
        cfg: LinearGemmConfig = ctx.cfg
        q = cfg.quant
        wgrad_compute = weight.requires_grad
        if wgrad_compute and cfg.grad_output_buffer is not None:
            if cfg.wgrad_deferral_limit == 0 or len(cfg.grad_output_buffer) < cfg.wgrad_deferral_limit:
                cfg.grad_output_buffer.append(grad_output)
                wgrad_compute = False
        total_input = None
        if wgrad_compute:
            total_input = _gather_sequence(input, cfg.tp_group) if cfg.sequence_parallel else input

        capture = capturing(cfg.site)
        dy_q, dy_seen = quantize_seen_operand(grad_output, q.dgrad_grad_output, cfg.quant_group, capture)
        w_q, w_amax = cfg.weight_cache.get(weight, q.dgrad_weight, cfg.quant_group)
        grad_input = dy_q.matmul(w_q)
        if capture:
            tensor_saver.capture(cfg.site, "backward", "pre", {
                "grad_output": dy_seen,
                "weight": operand(weight, q.dgrad_weight, w_q, w_amax)})

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
            if same_quantization(q.dgrad_grad_output, q.wgrad_grad_output):
                dy_w = dy_q.reshape(grad_output.shape)
            else:
                dy_w, _ = quantize_operand(grad_output, q.wgrad_grad_output, cfg.quant_group)
            x_w = total_input if ctx.input_quantized else quantize_operand(total_input, q.wgrad_input,
                                                                          cfg.quant_group)[0]
            if cfg.gradient_accumulation_fusion:
                grad_weight = _accumulate_main_grad(weight, ctx.main_grad, dy_w, x_w, input.dtype)
            else:
                grad_weight = dy_w.t().matmul(x_w)
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


# ---- batched GEMMs of attention -----------------------------------------------------------------
@dataclass(frozen=True)
class BmmQuant:
    """Specs for C = alpha * A @ B (A [n, m, k], B [n, k, p]) and its two backward GEMMs."""

    a: OperandSpec = OperandSpec(axis=-1)            # forward: along k
    b: OperandSpec = OperandSpec(axis=-2)
    grad_a_dc: OperandSpec = OperandSpec(axis=-1)    # dA = dC B^T: along p
    grad_a_b: OperandSpec = OperandSpec(axis=-1)
    grad_b_a: OperandSpec = OperandSpec(axis=-2)     # dB = A^T dC: along m
    grad_b_dc: OperandSpec = OperandSpec(axis=-2)

    @classmethod
    def from_formats(cls, formats: Mapping[str, Any], keys: tuple[str, ...]) -> "BmmQuant":
        """``keys``: recipe keys in field order (a, b, grad_a_dc, grad_a_b, grad_b_a, grad_b_dc)."""
        return cls(**{f.name: OperandSpec(formats[k], f.default.axis) for f, k in zip(fields(cls), keys)})


def _scaled(t: Tensor, alpha: Optional[float]) -> Tensor:
    return t if alpha is None else t * alpha  # as autograd's baddbmm backward (maybe_multiply)


class QuantBmmFunction(torch.autograd.Function):
    """``torch.baddbmm(empty, A, B, beta=0, alpha=alpha)`` (or ``torch.bmm`` when alpha is None)
    with fake-quantized operands; the backward mirrors autograd's formulas for those ops."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, alpha: Optional[float], quant: BmmQuant,
                group: Optional[dist.ProcessGroup], amaxes: Optional[dict] = None,
                names: tuple[str, str] = ("a", "b")) -> Tensor:
        """``amaxes``: when given, receives the amax used for A and B under ``names`` (capture)."""
        ctx.alpha, ctx.quant, ctx.group = alpha, quant, group
        a_q, a_amax = quantize_operand(a, quant.a, group)
        b_q, b_amax = quantize_operand(b, quant.b, group)
        if amaxes is not None:
            amaxes.update({names[0]: a_amax, names[1]: b_amax})
        ctx.a_quantized = same_quantization(quant.a, quant.grad_b_a)
        ctx.b_quantized = same_quantization(quant.b, quant.grad_a_b)
        ctx.save_for_backward(a_q if ctx.a_quantized else a, b_q if ctx.b_quantized else b)
        if alpha is None:
            return torch.bmm(a_q, b_q)
        out = torch.empty((a.shape[0], a.shape[1], b.shape[2]), dtype=a.dtype, device=a.device)
        return torch.baddbmm(out, a_q, b_q, beta=0.0, alpha=alpha)

    @staticmethod
    def backward(ctx, grad_c: Tensor):
        a, b = ctx.saved_tensors
        q: BmmQuant = ctx.quant
        grad_a = grad_b = None
        dc_a = None
        if ctx.needs_input_grad[0]:
            dc_a, _ = quantize_operand(grad_c, q.grad_a_dc, ctx.group)
            b_q = b if ctx.b_quantized else quantize_operand(b, q.grad_a_b, ctx.group)[0]
            grad_a = _scaled(dc_a.bmm(b_q.transpose(1, 2)), ctx.alpha)
        if ctx.needs_input_grad[1]:
            a_q = a if ctx.a_quantized else quantize_operand(a, q.grad_b_a, ctx.group)[0]
            if dc_a is not None and same_quantization(q.grad_a_dc, q.grad_b_dc):
                dc_b = dc_a
            else:
                dc_b, _ = quantize_operand(grad_c, q.grad_b_dc, ctx.group)
            grad_b = _scaled(a_q.transpose(1, 2).bmm(dc_b), ctx.alpha)
        return grad_a, grad_b, None, None, None, None, None


class CaptureGradients(torch.autograd.Function):
    """Identity whose backward hands the incoming gradients to the saver under ``names``."""

    @staticmethod
    def forward(ctx, site: CaptureSite, phase: str, names: tuple[str, ...], *tensors: Tensor):
        ctx.site, ctx.phase, ctx.names = site, phase, names
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads: Tensor):
        if tensor_saver.is_active():
            tensor_saver.capture(ctx.site, "backward", ctx.phase,
                                 {n: g for n, g in zip(ctx.names, grads) if g is not None})
        return (None, None, None) + grads


def recompute_backward(forward: Callable[..., Tensor], inputs: tuple[Tensor, ...], grad_output: Tensor
                       ) -> tuple[Optional[Tensor], ...]:
    """Gradients of ``forward(*inputs)`` by re-running it with autograd (flash-attention style)."""
    leaves = tuple(x.detach().requires_grad_(x.requires_grad) for x in inputs)
    with torch.enable_grad():
        out = forward(*leaves)
    wanted = [x for x in leaves if x.requires_grad]
    grads = iter(torch.autograd.grad(out, wanted, grad_output, allow_unused=True))
    return tuple(next(grads) if x.requires_grad else None for x in leaves)
