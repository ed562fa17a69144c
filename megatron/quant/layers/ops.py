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

from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Iterable, List, Mapping, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from megatron.quant import tensor_saver
from megatron.quant.layers import recompute
from megatron.quant.recipes.delayed import AmaxHistory, is_delayed
from megatron.quant.recipes.operands import BMM_AXES, LINEAR_AXES, OperandSpec
from megatron.quant.formats.random_bits import RandomBits, Shard
from megatron.quant.tensor_saver import CaptureSite, Operand


@dataclass(frozen=True)
class NoiseScope:
    """Where a module's stochastic rounding draws during one forward (and its backward): the
    module's stream, the run position it ran at, and its TP rank. Every operand's noise is then
    keyed by (seed, module, operand, its format's seed, iteration, micro-batch, global element index)."""

    root: RandomBits
    iteration: int
    sample: int
    rank: int
    world: int

    def bits(self, spec: OperandSpec, groups: int = 1, per_sample: bool = True) -> Optional[RandomBits]:
        """Noise for ``spec``'s operand; ``per_sample`` False for weights (one draw per iteration),
        ``groups`` as in ``Shard`` (attention's [batch * heads] dimension)."""
        if not spec.stochastic:
            return None
        bits = self.root.child(spec.name, spec.fmt.options.get("seed", 0), self.iteration,
                               self.sample if per_sample else -1)
        if spec.shard_dim is None or self.world == 1:
            return bits
        return bits.sharded(Shard(spec.shard_dim, self.rank, self.world, groups * spec.shard_groups))


def noise_scope(root: Optional[RandomBits], group: Optional[dist.ProcessGroup]) -> Optional[NoiseScope]:
    """The scope of a forward starting now (None when the module rounds nothing stochastically)."""
    if root is None:
        return None
    iteration, sample = tensor_saver.position()
    rank, world = (dist.get_rank(group), dist.get_world_size(group)) if _distributed(group) else (0, 1)
    return NoiseScope(root, iteration, sample, rank, world)


def module_noise_root(seed: int, module: str, specs: Iterable[OperandSpec]) -> Optional[RandomBits]:
    """A module's stream, or None when none of its operands is rounded stochastically."""
    return RandomBits.derive("module", seed, module) if any(s.stochastic for s in specs) else None


def _distributed(group: Optional[dist.ProcessGroup]) -> bool:
    return group is not None and dist.is_initialized() and dist.get_world_size(group) > 1


@dataclass(frozen=True)
class Quantized:
    """A quantized GEMM operand: what the kernel decodes, the per-tensor factor it applies to its
    FP32 accumulator (None: none), the TP-reduced amax used, and what the saver records."""

    values: Tensor
    tensor_scale: Optional[Tensor] = None
    amax: Optional[Tensor] = None
    seen: Optional[Operand] = None

    def reshape(self, shape) -> "Quantized":
        return replace(self, values=self.values.reshape(shape))


def tensor_amax(x: Tensor, spec: OperandSpec, group: Optional[dist.ProcessGroup]) -> Optional[Tensor]:
    """The amax a per-tensor-scaled format must use so results do not depend on the TP size: reduced
    over the TP group for a sharded operand. None where the format's own amax is already that value
    (no per-tensor amax, an operand identical on every rank, or no group): no collective."""
    if not spec.fmt.needs_tensor_amax or spec.shard_dim is None or not _distributed(group):
        return None
    amax = spec.fmt.amax_of(x.detach(), spec.axis).float()  # after a Hadamard transform, if any
    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
    return amax


def quantize_operand(x: Tensor, spec: OperandSpec, group: Optional[dist.ProcessGroup],
                     noise: Optional[NoiseScope], *, amax: Optional[Tensor] = None, groups: int = 1,
                     per_sample: bool = True, capture: bool = False) -> Quantized:
    """``x`` quantized as ``spec`` says (x itself without a format). ``amax``: a TP-reduced amax
    this tensor already had (reused: no second collective), or for delayed scaling the history's
    amax it was quantized with before (a re-quantization: the history is left alone). Without
    it a delayed-scaled operand takes its scale from ``spec.history`` and records its own amax
    there. ``capture``: also describe it for the saver, with the same noise and amax, so the
    record is exactly what the GEMM used."""
    if spec.fmt is None:
        return Quantized(x, seen=Operand(tensor=x, axis=spec.axis) if capture else None)
    record = None  # delayed scaling: records x's own amax in the history once quantized
    if amax is None and spec.history is not None:
        amax, record = recompute.delayed_scale_amax(spec.history, x.device)
    elif amax is None:
        amax = tensor_amax(x, spec, group)
    bits = None if noise is None else noise.bits(spec, groups, per_sample)
    seen = None
    if capture:
        q, scale, packed = _quantize_with_stats(spec.fmt, x, spec.axis, amax, bits)
        seen = Operand(tensor=x, fmt=spec.fmt, axis=spec.axis, quantized=q, amax=amax, scale=scale,
                       kernel_stats=packed)
        if not spec.fmt.needs_tensor_amax:  # no per-tensor factor: the record is the operand
            return Quantized(q, None, amax, seen)
    if record is None:
        values, tensor_scale = spec.fmt.quantize_for_gemm(x, axis=spec.axis, amax=amax, noise=bits)
    else:
        values, tensor_scale, own_amax = _quantize_for_gemm_with_amax(spec.fmt, x, spec.axis, amax, bits)
        record(own_amax)
    return Quantized(values, tensor_scale, amax, seen)


def _quantize_for_gemm_with_amax(fmt, x: Tensor, axis: int, amax: Tensor, bits: Optional[RandomBits]
                                 ) -> tuple[Tensor, Optional[Tensor], Tensor]:
    """``fmt.quantize_for_gemm`` and x's own ``amax_of``: from the same read where a kernel takes both."""
    with_amax = getattr(fmt, "quantize_for_gemm_with_amax", None)  # kernels.TritonFormat
    if with_amax is not None:
        return with_amax(x, axis=axis, amax=amax, noise=bits)
    return (*fmt.quantize_for_gemm(x, axis=axis, amax=amax, noise=bits), fmt.amax_of(x.detach(), axis))


def _quantize_with_stats(fmt, x: Tensor, axis: int, amax: Optional[Tensor], bits: Optional[RandomBits]
                         ) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    """``fmt.quantize_with_scale`` and the statistics its kernel took in the same pass, all of them at
    the session's ``full`` level, else the exact fields (None where the format runs no such kernel:
    the saver then computes them in torch)."""
    with_stats = getattr(fmt, "quantize_with_stats", None)  # kernels.TritonFormat
    if with_stats is not None:
        return with_stats(x, axis=axis, amax=amax, noise=bits, full=tensor_saver.stats_level() == "full")
    return (*fmt.quantize_with_scale(x, axis=axis, amax=amax, noise=bits), None)


def quantize_both_axes(x: Tensor, along_rows: OperandSpec, along_cols: OperandSpec,
                       group: Optional[dist.ProcessGroup], noise: Optional[NoiseScope], per_sample: bool = True,
                       groups: int = 1) -> Optional[tuple[Quantized, Quantized]]:
    """x quantized for ``along_rows`` (axis -2) and ``along_cols`` (axis -1) from one read, where
    both use one format object whose kernel does both axes (``kernels``' ``dual_axis``: block
    formats on CUDA); None otherwise. Same values, scales and noise as two ``quantize_operand``
    (``groups``, ``per_sample``: as there)."""
    fmt = along_rows.fmt
    if (fmt is None or fmt is not along_cols.fmt or not getattr(fmt, "dual_axis", False) or not fmt.serves(x)
            or along_rows.history is not None or along_cols.history is not None
            or along_rows.shard_dim != along_cols.shard_dim):
        return None
    amax = tensor_amax(x, along_rows, group)
    noises = tuple(None if noise is None else noise.bits(spec, groups, per_sample)
                   for spec in (along_rows, along_cols))
    (rows, rows_scale), (cols, cols_scale) = fmt.quantize_for_gemm_both(x, amax, noises=noises)
    return Quantized(rows, rows_scale, amax), Quantized(cols, cols_scale, amax)


def reusable_amax(done: Quantized, done_spec: OperandSpec, spec: OperandSpec) -> Optional[Tensor]:
    """The amax ``done`` used, when ``spec`` quantizes the same tensor with an amax taken the same
    way (per-tensor amaxes do not depend on the block axis); None otherwise, and always for delayed
    scaling (each operand's scale comes from its own history)."""
    if done.amax is None or spec.fmt is None or not spec.fmt.needs_tensor_amax:
        return None
    if is_delayed(spec.fmt) or is_delayed(done_spec.fmt):
        return None
    return done.amax if done_spec.fmt.options.get("hadamard") == spec.fmt.options.get("hadamard") else None


def scaled_product(product: Callable[[Tensor, Tensor], Tensor], a: Quantized, b: Quantized) -> Tensor:
    """``product(a, b)`` with the operands' per-tensor scales applied to the FP32 result, then
    rounded once to the operands' dtype, as a scaled low-precision GEMM does. Without scales it
    is exactly ``product`` (stock megatron-core arithmetic)."""
    scales = [s for s in (a.tensor_scale, b.tensor_scale) if s is not None]
    if not scales:
        return product(a.values, b.values)
    scale = scales[0] if len(scales) == 1 else scales[0] * scales[1]
    return product(a.values.float(), b.values.float()).mul_(scale).to(a.values.dtype)


def _transform(spec: OperandSpec) -> Optional[tuple]:
    """The transform a spec leaves its GEMM operand in (Hadamard size and signs), or None."""
    fmt = spec.fmt
    if fmt is None or not fmt.transforms_operand:
        return None
    return fmt.options.get("hadamard"), tuple(fmt.options.get("hadamard_signs") or ())


def check_gemm_transforms(gemms: Mapping[str, tuple[OperandSpec, OperandSpec]]) -> None:
    """A transform along the reduction axis cancels in a GEMM only when both operands have it:
    ValueError naming the GEMM's operands otherwise."""
    for gemm, (a, b) in gemms.items():
        if _transform(a) != _transform(b):
            show = lambda s: f"hadamard={_transform(s)[0]}" if _transform(s) else "no transform"  # noqa: E731
            raise ValueError(f"{gemm}: {a.name or 'A'} has {show(a)} but {b.name or 'B'} has {show(b)}; a "
                             f"GEMM's two operands need the same transform (it cancels only then)")


def same_quantization(first: OperandSpec, second: OperandSpec) -> bool:
    """True when ``second`` quantizes a tensor exactly as ``first`` did, whatever the axes: the
    same round-to-nearest format whose scales follow no axis (elementwise, one scale per tensor, or
    square tiles of the last two dimensions, such as TE's 2-D NVFP4 weights) and no transform along
    one."""
    a, b = first.fmt, second.fmt
    return (a is not None and b is not None and (a.block_size is None or getattr(a, "tiled", False))
            and not a.transforms_operand and a.name == b.name and a.options == b.options
            and a.rounding != "stochastic")


def capturing(site: Optional[CaptureSite]) -> bool:
    return site is not None and tensor_saver.is_active()


class QuantizedWeightCache:
    """Fake-quantized weights per (format, axis), valid while the weight is unchanged.

    Keyed on the weight's storage and autograd version counter, which every in-place update
    (torch optimizers) bumps: a weight is quantized once per optimizer step, not once per
    micro-batch (stochastic rounding: once per iteration, the noise key being part of the
    entry). Writes through ``.data`` (megatron-core's mixed-precision optimizers copy main
    params that way) bypass the counter: call ``invalidate()`` after such a step.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[int, Optional[int]], tuple[tuple, Quantized, OperandSpec]] = {}

    def get(self, weight: Tensor, spec: OperandSpec, group: Optional[dist.ProcessGroup],
            noise: Optional[NoiseScope], partner: Optional[OperandSpec] = None) -> Quantized:
        """The weight quantized as ``spec`` says; ``partner``: the spec of its other GEMM (dgrad for
        fprop), quantized in the same read where a kernel does both axes."""
        if spec.fmt is None:
            return Quantized(weight)
        slot, version = self._key(weight, spec, noise)
        entry = self._entries.get(slot)
        if (entry is None or entry[0] != version) and partner is not None and weight.dim() == 2 \
                and {spec.axis % 2, partner.axis % 2} == {0, 1}:
            rows, cols = (spec, partner) if spec.axis % 2 == 0 else (partner, spec)
            with torch.no_grad():
                both = quantize_both_axes(weight, rows, cols, group, noise, per_sample=False)
            for done_spec, done in zip((rows, cols), both or ()):
                done_slot, done_version = self._key(weight, done_spec, noise)
                self._entries[done_slot] = (done_version, done, done_spec)
            entry = self._entries.get(slot)
        if entry is None or entry[0] != version:
            # Another axis's entry of the same weight version holds its TP-reduced amax already.
            done = [(e[1], e[2]) for e in self._entries.values() if e[0][:2] == version[:2]]
            amax = next((a for a in (reusable_amax(q, s, spec) for q, s in done) if a is not None), None)
            with torch.no_grad():
                entry = (version, quantize_operand(weight, spec, group, noise, amax=amax, per_sample=False), spec)
            self._entries[slot] = entry
        return entry[1]

    @staticmethod
    def _key(weight: Tensor, spec: OperandSpec, noise: Optional[NoiseScope]) -> tuple[tuple, tuple]:
        """(slot, version) of ``spec``'s entry: formats without blocks and without random rounding
        give the same values on any axis; the noise key is part of the version."""
        slot = (id(spec.fmt), None if same_quantization(spec, spec) else spec.axis)
        bits = None if noise is None else noise.bits(spec, per_sample=False)
        return slot, (weight.data_ptr(), weight._version, bits)

    def seen(self, weight: Tensor, spec: OperandSpec, group: Optional[dist.ProcessGroup],
             noise: Optional[NoiseScope]) -> Operand:
        """The saver's record of the cached weight (quantized again with the same amax and noise)."""
        used = self.get(weight, spec, group, noise)
        with torch.no_grad():
            return quantize_operand(weight, spec, group, noise, amax=used.amax, per_sample=False, capture=True).seen

    def invalidate(self) -> None:
        self._entries.clear()


# ---- linear layers ---------------------------------------------------------------------------
# Which dimension of each operand is split across TP ranks ([tokens, features]; W [out, in]).
_SHARD_DIMS = {"column": {"fprop_weight": 0, "dgrad_grad_output": -1, "dgrad_weight": 0, "wgrad_grad_output": -1},
               "row": {"fprop_input": -1, "fprop_weight": 1, "dgrad_weight": 1, "wgrad_input": -1}}


@dataclass(frozen=True)
class LinearQuant:
    """Operand specs of a linear layer's three GEMMs on 2-D views ([tokens, features]; W [out, in])."""

    fprop_input: OperandSpec = OperandSpec(axis=LINEAR_AXES["fprop.input"])
    fprop_weight: OperandSpec = OperandSpec(axis=LINEAR_AXES["fprop.weight"])
    dgrad_grad_output: OperandSpec = OperandSpec(axis=LINEAR_AXES["dgrad.grad_output"])
    dgrad_weight: OperandSpec = OperandSpec(axis=LINEAR_AXES["dgrad.weight"])
    wgrad_grad_output: OperandSpec = OperandSpec(axis=LINEAR_AXES["wgrad.grad_output"])
    wgrad_input: OperandSpec = OperandSpec(axis=LINEAR_AXES["wgrad.input"])

    @classmethod
    def from_formats(cls, formats: Mapping[str, Any]) -> "LinearQuant":
        """From recipe keys ("fprop.input", ...) to formats; axes are fixed by the GEMMs."""
        return cls(**{f.name: OperandSpec(formats[_key(f.name)], f.default.axis, _key(f.name)) for f in fields(cls)})

    def sharded(self, parallel: str, groups: int = 1) -> "LinearQuant":
        """The same specs with the TP shard dimensions of a ``parallel`` ("column"/"row") layer;
        ``groups``: separately sharded runs along them (2 for a fused SwiGLU fc1)."""
        return replace(self, **{name: replace(getattr(self, name), shard_dim=dim, shard_groups=groups)
                                for name, dim in _SHARD_DIMS[parallel].items()})

    def specs(self) -> dict[str, OperandSpec]:
        return {_key(f.name): getattr(self, f.name) for f in fields(self)}

    def __post_init__(self) -> None:
        check_gemm_transforms({"fprop": (self.fprop_input, self.fprop_weight),
                               "dgrad": (self.dgrad_grad_output, self.dgrad_weight),
                               "wgrad": (self.wgrad_grad_output, self.wgrad_input)})


def _key(field_name: str) -> str:
    return field_name.replace("_", ".", 1)


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


def _gather_sequence(x: Tensor, group: dist.ProcessGroup) -> Tensor:
    out = torch.empty((x.shape[0] * dist.get_world_size(group),) + tuple(x.shape[1:]),
                      dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.contiguous(), group=group)
    return out


def _accumulate_main_grad(weight: Tensor, main_grad: Tensor, grad_output: Quantized, total_input: Quantized,
                          dtype: torch.dtype) -> Optional[Tensor]:
    """megatron-core's gradient-accumulation fusion: dW += dY^T X into main_grad (same kernels when present)."""
    from megatron.core.tensor_parallel import layers as mlayers

    weight.main_grad = main_grad
    scaled = grad_output.tensor_scale is not None or total_input.tensor_scale is not None
    if hasattr(weight, "__fsdp_param__"):
        weight.main_grad = weight.get_main_grad()
        weight.main_grad.copy_(scaled_product(_wgrad, grad_output, total_input))
    elif mlayers._grad_accum_fusion_available and not scaled:
        kernel = (mlayers.fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32
                  if main_grad.dtype == torch.float32 else
                  mlayers.fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp16)
        kernel(total_input.values, grad_output.values, main_grad)
    else:  # no apex kernel (CPU), or per-tensor scales to apply: same sum, unfused
        main_grad.add_(scaled_product(_wgrad, grad_output, total_input).to(main_grad.dtype))
    if not hasattr(weight, "grad_added_to_main_grad"):
        return None
    # As megatron-core: hand autograd a dummy so DDP hooks run on the main thread.
    weight.grad_added_to_main_grad = True
    make = torch.zeros if getattr(weight, "zero_out_wgrad", False) else torch.empty
    if mlayers.HAVE_TE:
        return mlayers.get_dummy_wgrad(list(main_grad.shape), dtype, zero=make is torch.zeros)
    return make(main_grad.shape, dtype=dtype, device=main_grad.device, requires_grad=False)


def _fprop(x: Tensor, w: Tensor) -> Tensor:
    return torch.matmul(x, w.t())


def _dgrad(dy: Tensor, w: Tensor) -> Tensor:
    return dy.matmul(w)


def _wgrad(dy: Tensor, x: Tensor) -> Tensor:
    return dy.t().matmul(x)


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
        x = quantize_operand(total_input, q.fprop_input, group, noise, capture=capture)
        w = cfg.weight_cache.get(weight, q.fprop_weight, group, noise, partner=q.dgrad_weight)
        # The input is only needed for wgrad (a frozen weight has none); under sequence
        # parallelism the local shard is kept and gathered again, as megatron-core does.
        ctx.input_quantized = x if same_quantization(q.fprop_input, q.wgrad_input) and not cfg.sequence_parallel \
            else None
        ctx.input_amax = reusable_amax(x, q.fprop_input, q.wgrad_input)
        saved_input = x.values if ctx.input_quantized is not None else input
        ctx.save_for_backward(saved_input if weight.requires_grad else None, weight)
        if ctx.input_quantized is not None:
            ctx.input_quantized = replace(x, values=None, seen=None)  # the values travel in saved_tensors
        output = scaled_product(_fprop, x, w)
        if bias is not None:
            output = output + bias
        if capture:
            tensor_saver.capture(cfg.site, "forward", "pre", {
                "input": x.seen, "weight": cfg.weight_cache.seen(weight, q.fprop_weight, group, noise)})
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
            total_input = _gather_sequence(input, cfg.tp_group) if cfg.sequence_parallel else input

        capture = capturing(cfg.site)
        # dY along tokens (wgrad) and features (dgrad) from one read where a kernel does both.
        both = None if capture or not wgrad_compute else quantize_both_axes(
            grad_output.reshape(-1, grad_output.shape[-1]), q.wgrad_grad_output, q.dgrad_grad_output, group, noise)
        dy = both[1].reshape(grad_output.shape) if both else \
            quantize_operand(grad_output, q.dgrad_grad_output, group, noise, capture=capture)
        w = cfg.weight_cache.get(weight, q.dgrad_weight, group, noise)
        grad_input = scaled_product(_dgrad, dy, w)
        if capture:
            tensor_saver.capture(cfg.site, "backward", "pre", {
                "grad_output": dy.seen, "weight": cfg.weight_cache.seen(weight, q.dgrad_weight, group, noise)})

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
            elif same_quantization(q.dgrad_grad_output, q.wgrad_grad_output):
                dy_w = dy.reshape(grad_output.shape)
            else:
                dy_w = quantize_operand(grad_output, q.wgrad_grad_output, group, noise,
                                        amax=reusable_amax(dy, q.dgrad_grad_output, q.wgrad_grad_output))
            if ctx.input_quantized is not None:
                x_w = replace(ctx.input_quantized, values=total_input)
            else:
                x_w = quantize_operand(total_input, q.wgrad_input, group, noise, amax=ctx.input_amax)
            if cfg.gradient_accumulation_fusion:
                grad_weight = _accumulate_main_grad(weight, ctx.main_grad, dy_w, x_w, input.dtype)
            else:
                grad_weight = scaled_product(_wgrad, dy_w, x_w)
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

    a: OperandSpec = OperandSpec(axis=BMM_AXES[0])            # forward: along k
    b: OperandSpec = OperandSpec(axis=BMM_AXES[1])
    grad_a_dc: OperandSpec = OperandSpec(axis=BMM_AXES[2])    # dA = dC B^T: along p
    grad_a_b: OperandSpec = OperandSpec(axis=BMM_AXES[3])
    grad_b_a: OperandSpec = OperandSpec(axis=BMM_AXES[4])     # dB = A^T dC: along m
    grad_b_dc: OperandSpec = OperandSpec(axis=BMM_AXES[5])

    @classmethod
    def from_formats(cls, formats: Mapping[str, Any], keys: tuple[str, ...], shard_dim: Optional[int] = 0
                     ) -> "BmmQuant":
        """``keys``: recipe keys in field order (a, b, grad_a_dc, grad_a_b, grad_b_a, grad_b_dc);
        ``shard_dim``: the batch dimension of every operand, split across TP ranks by heads."""
        return cls(**{f.name: OperandSpec(formats[k], f.default.axis, k, shard_dim)
                      for f, k in zip(fields(cls), keys)})

    def __post_init__(self) -> None:
        check_gemm_transforms({"forward": (self.a, self.b), "grad A": (self.grad_a_dc, self.grad_a_b),
                               "grad B": (self.grad_b_a, self.grad_b_dc)})


def _bmm(a: Tensor, b: Tensor) -> Tensor:
    return torch.bmm(a, b)


def _scaled(t: Tensor, alpha: Optional[float]) -> Tensor:
    return t if alpha is None else t * alpha  # as autograd's baddbmm backward (maybe_multiply)


@dataclass(frozen=True)
class BmmOperands:
    """What ``QuantBmmFunction`` needs besides A and B: the TP group for amaxes, the noise scope,
    the number of batch groups (``Shard.groups``), and forward operands quantized beforehand."""

    group: Optional[dist.ProcessGroup] = None
    noise: Optional[NoiseScope] = None
    groups: int = 1
    a: Optional[Quantized] = None
    b: Optional[Quantized] = None


class QuantBmmFunction(torch.autograd.Function):
    """``torch.baddbmm(empty, A, B, beta=0, alpha=alpha)`` (or ``torch.bmm`` when alpha is None)
    with fake-quantized operands; the backward mirrors autograd's formulas for those ops."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, alpha: Optional[float], quant: BmmQuant, given: BmmOperands) -> Tensor:
        ctx.alpha, ctx.quant, ctx.given = alpha, quant, replace(given, a=None, b=None)
        a_q = given.a or _quantize_bmm(a, quant.a, given)
        b_q = given.b or _quantize_bmm(b, quant.b, given)
        # Only the scale and amax are kept: the values travel in saved_tensors, the capture record not at all.
        ctx.a_quantized = replace(a_q, values=None, seen=None) if same_quantization(quant.a, quant.grad_b_a) else None
        ctx.b_quantized = replace(b_q, values=None, seen=None) if same_quantization(quant.b, quant.grad_a_b) else None
        ctx.amaxes = (reusable_amax(a_q, quant.a, quant.grad_b_a), reusable_amax(b_q, quant.b, quant.grad_a_b))
        ctx.save_for_backward(a_q.values if ctx.a_quantized else a, b_q.values if ctx.b_quantized else b)
        if alpha is None:
            return scaled_product(_bmm, a_q, b_q)
        if a_q.tensor_scale is None and b_q.tensor_scale is None:
            out = torch.empty((a.shape[0], a.shape[1], b.shape[2]), dtype=a.dtype, device=a.device)
            return torch.baddbmm(out, a_q.values, b_q.values, beta=0.0, alpha=alpha)
        return scaled_product(lambda x, y: torch.bmm(x, y).mul_(alpha), a_q, b_q)

    @staticmethod
    def backward(ctx, grad_c: Tensor):
        a, b = ctx.saved_tensors
        q: BmmQuant = ctx.quant
        given: BmmOperands = ctx.given
        grad_a = grad_b = None
        dc_a = dc_b = None
        if all(ctx.needs_input_grad[:2]) and not same_quantization(q.grad_a_dc, q.grad_b_dc):
            # dC along p (for dA) and along m (for dB) from one read where a kernel does both.
            dc_b, dc_a = quantize_both_axes(grad_c, q.grad_b_dc, q.grad_a_dc, given.group, given.noise,
                                            groups=given.groups) or (None, None)
        if ctx.needs_input_grad[0]:
            if dc_a is None:
                dc_a = _quantize_bmm(grad_c, q.grad_a_dc, given)
            b_q = replace(ctx.b_quantized, values=b) if ctx.b_quantized else \
                _quantize_bmm(b, q.grad_a_b, given, ctx.amaxes[1])
            grad_a = _scaled(scaled_product(lambda x, y: x.bmm(y.transpose(1, 2)), dc_a, b_q), ctx.alpha)
        if ctx.needs_input_grad[1]:
            a_q = replace(ctx.a_quantized, values=a) if ctx.a_quantized else \
                _quantize_bmm(a, q.grad_b_a, given, ctx.amaxes[0])
            if dc_b is None:
                dc_b = dc_a if dc_a is not None and same_quantization(q.grad_a_dc, q.grad_b_dc) else \
                    _quantize_bmm(grad_c, q.grad_b_dc, given,
                                  None if dc_a is None else reusable_amax(dc_a, q.grad_a_dc, q.grad_b_dc))
            grad_b = _scaled(scaled_product(lambda x, y: x.transpose(1, 2).bmm(y), a_q, dc_b), ctx.alpha)
        return grad_a, grad_b, None, None, None


def _quantize_bmm(x: Tensor, spec: OperandSpec, given: BmmOperands, amax: Optional[Tensor] = None) -> Quantized:
    return quantize_operand(x, spec, given.group, given.noise, amax=amax, groups=given.groups)


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
