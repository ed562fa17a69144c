"""``TritonFormat``: a NumericFormat whose quantization runs as Triton kernels on the tensors the
kernels serve (CUDA, or CPU under Triton's interpreter), and as its fallback (the eager format
or its compiled twin) everywhere else. Same results as the format, bit for bit. A ``QuantFormat``
(``formats.interface``): its members are the format's (``FormatWrapper``) but for the methods here."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from megatron.quant.formats.base import SUPPORTED_DTYPES, NumericFormat, check_input, encode_scale, normalize_axis
from megatron.quant.formats.contract import KernelContract
from megatron.quant.formats.interface import QuantFormat, along_both_axes, cross_axis
from megatron.quant.formats.quantization import VALUE, Quantization, Want
from megatron.quant.formats.random_bits import RandomBits
from megatron.quant.formats.rounding import is_stochastic
from megatron.quant.formats.wrapper import FormatWrapper
from megatron.quant.stats import packing

from . import blocks, ops
from .launch import interpreting
from .noise import noise_args
from .ops import abs_max as one_read_abs_max
from .select import supported
from .stats import COUNTS, FULL, NONE


class TritonFormat(FormatWrapper):
    """``fmt`` with Triton kernels for the tensors they serve; ``fallback`` (``fmt`` or its
    ``CompiledFormat``) for the others. The kernels read the format's ``kernel_contract`` alone."""

    fmt: NumericFormat  # its torch path: transforms the kernels do not apply, the scales' layout, the noise seed

    def __init__(self, fmt: NumericFormat, fallback: QuantFormat) -> None:
        if not supported(fmt):
            raise ValueError(f"{fmt.name}: no Triton kernel for {fmt!r}")
        super().__init__(fmt)
        self.fallback = fallback
        self.contract: KernelContract = fmt.kernel_contract
        self._contract_json = self.contract.to_json()  # how the operators (``ops``) take it

    def serves(self, x: Tensor, generator: Optional[torch.Generator] = None) -> bool:
        """True when the kernels quantize x (generator-drawn noise stays with the torch path)."""
        return (generator is None and isinstance(x, Tensor) and x.dtype in SUPPORTED_DTYPES and x.numel() > 0
                and (x.is_cuda or (x.device.type == "cpu" and interpreting())) and not self._identity(x))

    def _identity(self, x: Tensor) -> bool:
        return x.dtype == self.contract.unchanged_dtype

    def run(self, x: Tensor, axis: int = -1, amax: Optional[Tensor] = None, *, want: Want = VALUE,
            noise: Optional[RandomBits] = None, generator: Optional[torch.Generator] = None,
            cross_noise: Optional[RandomBits] = None) -> Quantization:
        """As ``NumericFormat.run``, with the kernels where they serve x. ``Want.stats``: the packed
        statistics the kernel took in the same pass (``stats.packing``'s layout, float64 on x's device, no
        host sync); None where it took none (a Hadamard transform the kernel does not apply itself: it
        sees only the transformed values). ``Want.amax``: for per-tensor formats with the caller's amax,
        x's own taken by the quantizing kernel in the same read. ``Want.both_axes``: one read where
        ``dual_axis``."""
        if not self.serves(x, generator):
            return self.fallback.run(x, axis, amax, want=want, noise=noise, generator=generator,
                                     cross_noise=cross_noise)
        check_input(self.name, x)
        if want.both_axes:
            if not (self.dual_axis and x.dim() >= 2):
                return along_both_axes(self, x, axis, amax, noise, generator, cross_noise)
            return self._both_axes(x, axis, amax, noise, cross_noise)
        if want.gemm:
            return self._for_gemm(x, axis, amax, noise, want.amax)
        if not (want.scale or want.stats):
            return Quantization(self._kernel(x, axis, amax, noise, split=False, back=True)[0])
        q, _, (scale, rows), _ = self._kernel(x, axis, amax, noise, split=False, back=True,
                                           stats=FULL if want.stats == "full" else COUNTS)
        packed = packing.combine(rows) if want.stats and self._sees_operand else None
        return Quantization(q, self.fmt.expand_scale(scale, x, axis) if want.scale else None, packed)

    def _for_gemm(self, x: Tensor, axis: int, amax: Optional[Tensor], noise: Optional[RandomBits],
                  own_amax: bool) -> Quantization:
        """The operand and tensor scale of a tensor the kernels serve, with ``own_amax`` x's own amax:
        taken by the quantizing kernel for per-tensor formats given the caller's ``amax``."""
        fmt = self.fmt
        if (own_amax and fmt.needs_tensor_amax and amax is not None and not fmt.transforms_operand
                and not self.contract.blocked):
            q, decode, _, own = self._kernel(x, axis, amax, noise, split=True, back=False, take_amax=True)
            return Quantization(operand=q, tensor_scale=decode, amax=own)
        if not (fmt.needs_tensor_amax or fmt.transforms_operand):
            operand, tensor_scale = self._kernel(x, axis, amax, noise, split=False, back=True)[0], None
        else:
            q, decode, _, _ = self._kernel(x, axis, amax, noise, split=fmt.needs_tensor_amax, back=False)
            operand, tensor_scale = q, decode if fmt.needs_tensor_amax else None
        own = self.amax_of(x.detach(), axis) if own_amax else None
        return Quantization(operand=operand, tensor_scale=tensor_scale, amax=own)

    def amax_of(self, x: Tensor, axis: int = -1) -> Tensor:
        """As ``NumericFormat.amax_of``: one read of x (of its transform, for Hadamard formats; the
        kernel transforms on the fly where it can; per row: the format's own)."""
        if not self.serves(x) or self.contract.per_row:
            return self.fallback.amax_of(x, axis)
        if self._fused_transform:
            return self._transformed_abs_max(x, axis)
        return self._abs_max(self.fmt.transform(x, axis))

    def _abs_max(self, x: Tensor) -> Tensor:
        """The format's ``_abs_max`` of a tensor the kernels serve (NaN skipped under nonfinite='te')."""
        return one_read_abs_max(x.contiguous(), self._skips_nan)

    def _transformed_abs_max(self, x: Tensor, axis: int) -> Tensor:
        fmt = self.fmt
        axis = normalize_axis(fmt.name, axis, x.dim())
        fmt.hadamard.check(x.shape[axis], axis, fmt.name)
        return ops.transformed_abs_max(x.contiguous(), self._contract_json, axis)

    @property
    def _skips_nan(self) -> bool:
        return self.contract.nonfinite_te

    @property
    def _fused_transform(self) -> bool:
        """True when the kernel applies the format's Hadamard transform itself (``KernelContract.fused_transform``)."""
        return self.contract.fused_transform

    @property
    def _sees_operand(self) -> bool:
        """True when the kernel sees x itself (no transform, or one it applies): it can take x's statistics."""
        return not self.fmt.transforms_operand or self._fused_transform

    @property
    def dual_axis(self) -> bool:
        """True when one kernel quantizes a tensor along both of its last two axes (``KernelContract.dual_axis``)."""
        return self.contract.dual_axis

    def _both_axes(self, x: Tensor, axis: int, amax: Optional[Tensor], noise: Optional[RandomBits],
                   cross_noise: Optional[RandomBits]) -> Quantization:
        """The operand along ``axis`` (one of the last two) and along the other (``Quantization.cross``),
        from one read of x by one kernel (``dual_axis``)."""
        fmt = self.fmt
        rows_first = cross_axis(fmt.name, x, axis) == -1
        noises = (noise, cross_noise) if rows_first else (cross_noise, noise)
        x = x.contiguous()
        stochastic = is_stochastic(fmt.rounding)
        args = tuple(noise_args((bits or fmt.default_noise) if stochastic else None, tuple(x.shape))
                     for bits in noises)
        fold = self._folds(amax)
        tensor, decode = (None, None) if fold else self._block_tensor_scale(x, amax)
        out0, out1, folded = ops.quantize_blocks_both_axes(x, tensor, list(args[0]), list(args[1]), self._contract_json,
                                                           fmt.needs_tensor_amax, fold)
        decode = folded if fold else decode
        first, second = (out0, out1) if rows_first else (out1, out0)
        return Quantization(operand=first, tensor_scale=decode, cross=Quantization(operand=second, tensor_scale=decode))

    def _folds(self, amax: Optional[Tensor]) -> bool:
        """True when a block format's FP32 tensor scale comes from x's own amax, which the quantizing
        kernel folds from the amax kernel's rows (two launches, nothing between them)."""
        return self.contract.tensor_scale is not None and amax is None

    def _block_tensor_scale(self, x: Tensor, amax: Optional[Tensor]) -> tuple[Optional[Tensor], Optional[Tensor]]:
        """A block format's FP32 tensor scale (NVFP) as the format computes it (x in the quantization
        domain, or ``amax`` of it; per row: ``amax`` is the format's ``amax_of``): the kernel's
        ``blocks.TENSOR_ROWS`` rows (global encode / element max, global decode, global encode, amax;
        one value each, or one per row) and the global decode of a per-tensor scale; (None, None)
        where the contract has none."""
        contract = self.contract
        if contract.tensor_scale is None:
            return None, None
        amax = (self._abs_max(x) if amax is None else amax).to(torch.float32).reshape(-1)
        encode = encode_scale(amax, contract.tensor_scale.target)
        decode = 1 / encode
        rows = torch.stack([encode * (1 / contract.element.max_value), decode, encode, amax])
        return rows, None if contract.per_row else decode.reshape(())

    def _kernel(self, x: Tensor, axis: int, amax: Optional[Tensor], noise: Optional[RandomBits], split: bool,
                back: bool, stats: int = NONE, take_amax: bool = False
                ) -> tuple[Tensor, Optional[Tensor], Optional[tuple[Tensor, Tensor]], Optional[Tensor]]:
        """(x quantized, the per-tensor decode factor or None, with ``stats`` (``COUNTS`` or ``FULL``):
        (the scale in the format's own layout, the programs' rows of statistics), with ``take_amax``
        (per-tensor elementwise formats given an amax): x's own amax from the same pass). With a Hadamard
        transform the values are in the transformed domain, or with ``back`` transformed back to x's; in
        x's dtype either way. ``split``: leave the decode factor out of the values."""
        fmt, contract = self.fmt, self.contract
        stochastic = is_stochastic(fmt.rounding)
        noise = list(noise_args((noise or fmt.default_noise) if stochastic else None, tuple(x.shape)))
        fused = self._fused_transform
        xt = x.contiguous() if fused or not fmt.transforms_operand else fmt.transform(x, axis).contiguous()
        inverse = back and fmt.transforms_operand and not fused  # in torch, after the kernel
        out_dtype = torch.float32 if inverse else x.dtype
        if contract.blocked:
            axis = normalize_axis(fmt.name, axis, x.dim())
            if fused:
                fmt.hadamard.check(x.shape[axis], axis, fmt.name)
            if amax is None and contract.per_row:  # each row's, of the transform where there is one
                amax = fmt.amax_of(x, axis)
            elif amax is None and fused and contract.tensor_scale is not None:
                amax = self._transformed_abs_max(x, axis)
            split = split and not contract.per_row  # the rows' factors stay in the values
            fold = self._folds(amax)
            tensor, decode = (None, None) if fold else self._block_tensor_scale(xt, amax)
            out, scales, rows, folded = ops.quantize_blocks(xt, tensor, noise, self._contract_json, axis, split, stats,
                                                            ("inverse" if back else "forward") if fused else None,
                                                            out_dtype, fold)
            decode = folded if fold else decode
            captured = (scales.view(blocks.scale_layout(contract, x.shape, axis)), rows) if stats else None
            return (fmt.inverse_transform(out, axis).to(x.dtype) if inverse else out), decode, captured, None
        if contract.tensor_scale is not None and not stats and (amax is None or amax.numel() == 1):
            given = None if amax is None else amax.detach().to(torch.float32)  # a float32 amax: no op
            out, decode, own = ops.quantize_elementwise_tensor_scaled(xt, given, noise, self._contract_json, out_dtype,
                                                                      split, take_amax)
            return (fmt.inverse_transform(out, axis).to(x.dtype) if inverse else out), decode, None, own
        encode = decode = None
        if contract.tensor_scale is not None:
            amax = self._abs_max(xt) if amax is None else amax
            encode = encode_scale(amax, contract.tensor_scale.target, contract.tensor_scale.power_of_two)
            decode = 1 / encode
        out, rows = ops.quantize_elementwise(xt, encode, None if split else decode, noise, self._contract_json,
                                             out_dtype, stats)
        out = fmt.inverse_transform(out, axis).to(x.dtype) if inverse else out
        if not stats:
            return out, decode, None, None
        scale = torch.ones((), dtype=torch.float32, device=x.device) if decode is None else decode
        return out, decode, (scale, rows), None
