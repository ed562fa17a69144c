"""Quantizing one GEMM operand, shared by the linear and the attention autograd functions.

Every GEMM operand is quantized with its own ``OperandSpec`` (format, block axis along that
GEMM's reduction dimension); a spec without a format leaves the operand untouched. Here: the
quantized operand (``Quantized``; ``scaled_gemm`` multiplies two), its TP-reduced per-tensor amax,
the stochastic-rounding noise scope of a module's forward, quantizing one operand along both axes in
one read, and the rules for reusing a forward's quantized copy or amax in the backward
(``same_quantization``, ``reusable_amax``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from megatron.quant import position, tensor_saver
from megatron.quant.formats.quantization import GEMM, GEMM_BOTH_AXES, GEMM_WITH_AMAX, Want
from megatron.quant.formats.random_bits import RandomBits, Shard
from megatron.quant.formats.rounding import is_stochastic
from megatron.quant.layers import recompute
from megatron.quant.layers.delayed import is_delayed
from megatron.quant.recipes.operands import OperandSpec
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
    at = position.current()
    rank, world = (dist.get_rank(group), dist.get_world_size(group)) if _distributed(group) else (0, 1)
    return NoiseScope(root, at.iteration, at.sample, rank, world)


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

    def dequantized(self) -> Tensor:
        """The operand decoded to its dtype: the values, times the tensor scale where there is one
        (what TE's ``rowwise_dequantized`` source and ``backward_override="dequantized"`` read)."""
        if self.tensor_scale is None:
            return self.values
        return (self.values.float() * self.tensor_scale).to(self.values.dtype)


def tensor_amax(x: Tensor, spec: OperandSpec, group: Optional[dist.ProcessGroup]) -> Optional[Tensor]:
    """The amax a per-tensor-scaled format must use so results do not depend on the TP size: reduced
    over the TP group for a sharded operand. None where the format's own amax is already that value
    (no per-tensor amax, an operand identical on every rank, or no group): no collective."""
    if not spec.fmt.needs_tensor_amax or spec.shard_dim is None or not _distributed(group):
        return None
    if spec.fmt.amax_per_row and spec.shard_dim % x.dim() != spec.axis % x.dim():
        return None  # one amax per row, and every rank holds whole rows: its own are the rows'

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
        # The statistics the kernel takes in its pass, all of them at the session's "full" level.
        level = "full" if tensor_saver.stats_level() == "full" else "exact"
        done = spec.fmt.run(x, spec.axis, amax, want=Want(scale=True, stats=level), noise=bits)
        seen = Operand(tensor=x, fmt=spec.fmt, axis=spec.axis, quantized=done.value, amax=amax, scale=done.scale,
                       kernel_stats=done.stats)
        # No per-tensor factor and no transform: the record is the operand. A Hadamard format's operand
        # stays in the transformed domain (the transform cancels in the GEMM), the record is in x's.
        if not spec.fmt.needs_tensor_amax and not spec.fmt.transforms_operand:
            return Quantized(done.value, None, amax, seen)
    # Delayed scaling records x's own amax; an expert that got no tokens has amax 0, which the history skips.
    own_amax = record is not None and x.numel() > 0
    done = spec.fmt.run(x, spec.axis, amax, want=GEMM_WITH_AMAX if own_amax else GEMM, noise=bits)
    if record is not None:
        record(done.amax if own_amax else x.new_zeros((), dtype=torch.float32))
    return Quantized(done.operand, done.tensor_scale, amax, seen)


def quantize_both_axes(x: Tensor, along_rows: OperandSpec, along_cols: OperandSpec,
                       group: Optional[dist.ProcessGroup], noise: Optional[NoiseScope], per_sample: bool = True,
                       groups: int = 1) -> Optional[tuple[Quantized, Quantized]]:
    """x quantized for ``along_rows`` (axis -2) and ``along_cols`` (axis -1) from one read, where
    both use one format object whose kernel does both axes (``kernels``' ``dual_axis``: block
    formats on CUDA); None otherwise. Same values, scales and noise as two ``quantize_operand``
    (``groups``, ``per_sample``: as there)."""
    fmt = along_rows.fmt
    if (fmt is None or fmt is not along_cols.fmt or not fmt.dual_axis or not fmt.serves(x)
            or along_rows.history is not None or along_cols.history is not None
            or along_rows.shard_dim != along_cols.shard_dim):
        return None
    amax = tensor_amax(x, along_rows, group)
    noises = tuple(None if noise is None else noise.bits(spec, groups, per_sample)
                   for spec in (along_rows, along_cols))
    rows = fmt.run(x, -2, amax, want=GEMM_BOTH_AXES, noise=noises[0], cross_noise=noises[1])
    cols = rows.cross
    return Quantized(rows.operand, rows.tensor_scale, amax), Quantized(cols.operand, cols.tensor_scale, amax)


def reusable_amax(done: Quantized, done_spec: OperandSpec, spec: OperandSpec) -> Optional[Tensor]:
    """The amax ``done`` used, when ``spec`` quantizes the same tensor with an amax taken the same
    way (per-tensor amaxes do not depend on the block axis); None otherwise, and always for delayed
    scaling (each operand's scale comes from its own history)."""
    if done.amax is None or spec.fmt is None or not spec.fmt.needs_tensor_amax:
        return None
    if spec.fmt.amax_per_row or done_spec.fmt.amax_per_row:  # rows along one axis are not another's
        return None
    if is_delayed(spec.fmt) or is_delayed(done_spec.fmt):
        return None
    return done.amax if done_spec.fmt.options.get("hadamard") == spec.fmt.options.get("hadamard") else None


def _transform(spec: OperandSpec) -> Optional[tuple]:
    """The transform a spec leaves its GEMM operand in (Hadamard size and signs), or None."""
    fmt = spec.fmt
    if fmt is None or not fmt.transforms_operand:
        return None
    return fmt.options.get("hadamard"), tuple(fmt.options.get("hadamard_signs") or ())


def check_gemm_transforms(gemms: Mapping[str, Sequence[OperandSpec]]) -> None:
    """A transform along the reduction axis cancels in a GEMM only when all its operands have it:
    ValueError naming two of the GEMM's operands otherwise."""
    for gemm, (a, *others) in gemms.items():
        b = next((spec for spec in others if _transform(spec) != _transform(a)), None)
        if b is not None:
            show = lambda s: f"hadamard={_transform(s)[0]}" if _transform(s) else "no transform"  # noqa: E731
            raise ValueError(f"{gemm}: {a.name or 'A'} has {show(a)} but {b.name or 'B'} has {show(b)}; a "
                             f"GEMM's two operands need the same transform (it cancels only then)")


def same_quantization(first: OperandSpec, second: OperandSpec) -> bool:
    """True when ``second`` quantizes a tensor exactly as ``first`` did, whatever the axes: the
    same round-to-nearest format whose scales follow no axis (``QuantFormat.axis_free``: elementwise,
    one scale per tensor, or square tiles of the last two dimensions, such as TE's 2-D NVFP4 weights)
    and no transform along one."""
    a, b = first.fmt, second.fmt
    return (a is not None and b is not None and a.axis_free
            and not a.transforms_operand and a.name == b.name and a.options == b.options
            and not is_stochastic(a.rounding))


def capturing(site: Optional[CaptureSite]) -> bool:
    return site is not None and tensor_saver.is_active()
