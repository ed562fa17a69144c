"""The NumericFormat interface shared by every format, and option checking."""
from __future__ import annotations

import math
import numbers
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Literal, get_args

import torch
from torch import Tensor

from . import bits
from .contract import KernelContract, Transform
from .grid import ElementGrid, GridRule, Overflow
from .hadamard import Hadamard
from .interface import QuantFormat, Scaling, along_both_axes
from .quantization import VALUE, Quantization, Want
from .random_bits import RandomBits
from .rounding import ROUNDING_MODES, Rounding, is_stochastic
from .saturation import overflow_bound

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Eager CPU work runs in pieces of this many elements so that the temporaries of the
# rounding routine stay in cache; each fresh full-size tensor would cost page faults.
EAGER_CHUNK_ELEMENTS = 1 << 17  # 512 KB of float32: a few temporaries fit in L2


@dataclass(frozen=True)
class Option:
    """One option a format accepts: its default, and either its allowed values, its type
    (``bool``, ``int``, or ``float``: positive and finite), or a ``parse`` function that
    returns the value in canonical form or raises ValueError saying what is allowed."""

    default: Any
    choices: tuple | None = None
    kind: type | None = None
    parse: Callable[[Any], Any] | None = None
    allowed: str | None = None  # what ``parse`` accepts, for listings

    def describe(self) -> str:
        """The allowed values in a few words, for ``python -m megatron.quant.formats list``."""
        if self.choices is not None:
            return "|".join(map(str, self.choices))
        if self.allowed is not None:
            return self.allowed
        return {bool: "true|false", int: "integer", float: "positive number"}.get(self.kind, "any")

    def check(self, format_name: str, key: str, value: Any) -> Any:
        if value is None and self.default is None:
            return None
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{format_name}: {key}={value!r} is not one of {list(self.choices)}")
        if self.parse is not None:
            try:
                return self.parse(value)
            except ValueError as error:
                raise ValueError(f"{format_name}: {key}={value!r} {error}") from None
        if self.kind is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{format_name}: {key}={value!r} must be true or false")
            return value
        if self.kind is int:
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"{format_name}: {key}={value!r} must be an integer")
            return int(value)
        if self.kind is float:
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0 < value < math.inf):
                raise ValueError(f"{format_name}: {key}={value!r} must be a positive finite number")
            return float(value)
        return value


def non_negative_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError("must be an integer >= 0")
    return int(value)


def positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError("must be an integer >= 1")
    return int(value)


ROUNDING_OPTION = Option("nearest", ROUNDING_MODES)
SEED_OPTION = Option(0, kind=int)
Nonfinite = Literal["propagate", "te"]
"""The ``nonfinite`` option of scaled formats: what Inf and NaN inputs do to a scale. ``"propagate"``:
amaxes take NaN in, and a block holding Inf or NaN turns NaN (the OCP reference's behaviour).
``"te"``: as Transformer Engine's kernels, whose amax reductions are fmaxf (NaN skipped) and whose
scale rules give an Inf amax scale 1 (FP8) or E8M0 0xFE (MXFP8); the finite elements are cast with
that scale."""
NONFINITE_MODES: tuple[Nonfinite, ...] = get_args(Nonfinite)
NONFINITE_OPTION = Option("propagate", NONFINITE_MODES)


def resolve_options(format_name: str, specs: dict[str, Option], given: dict[str, Any]) -> dict[str, Any]:
    """Defaults overlaid with ``given``; unknown keys and bad values raise ValueError."""
    unknown = sorted(set(given) - set(specs))
    if unknown:
        raise ValueError(f"{format_name}: unknown option(s) {unknown}; valid options: {sorted(specs) or 'none'}")
    return {key: spec.check(format_name, key, given.get(key, spec.default)) for key, spec in specs.items()}


class NumericFormat(QuantFormat):
    """A numeric format: ``quantize`` returns x fake-quantized (quantized, then dequantized).

    Inputs may be float32, bfloat16 or float16 of any shape; the arithmetic is float32 and
    the result has x's dtype and shape. Block formats put their blocks along ``axis``.
    The class attributes are the defaults of ``QuantFormat``'s members for a format without
    blocks, scale or kernel; subclasses set what differs.
    """

    name: str
    bits: int
    max_value: float
    min_positive: float
    options: dict
    block_size: int | None = None
    block_shape: tuple[int, int] | None = None
    tiled: bool = False
    axis_free: bool = True  # ``QuantFormat.axis_free``; blocks along an axis set it False
    scaling: Scaling = "none"
    needs_tensor_amax: bool = False
    amax_per_row: bool = False
    element: ElementGrid | None = None
    dtype: torch.dtype | None = None
    dual_axis: bool = False  # the torch path quantizes one axis per call
    kernel_contract: KernelContract | None = None  # formats with a kernel declare theirs (``_contract``)
    eager_chunks: bool = True  # False where chunking cannot help (plain casts)
    default_noise: RandomBits
    """The noise stochastic rounding draws without ``noise=`` or ``generator=`` (the kernels too): a pure
    function of the ``seed`` option and the element index, so the same call gives the same result in any
    process."""

    def __init__(self, options: dict[str, Any]):
        self.options = dict(options)
        signs = options.get("hadamard_signs")
        self.hadamard = None if signs is None else Hadamard(signs)
        self.default_noise = RandomBits.derive("format", options.get("seed", 0))

    def _contract(self, element: GridRule, overflow: Overflow, **fields: Any) -> KernelContract:
        """This format's ``KernelContract``: what every format shares (name, rounding, the nonfinite
        rule, the overflow bound, the Hadamard transform) and the format's own ``fields``."""
        transform = None if self.hadamard is None else Transform(
            self.hadamard.size, tuple(self.options["hadamard_signs"]), float(self.hadamard.norm))
        return KernelContract(self.name, element, overflow, self.rounding, self.options.get("nonfinite") == "te",
                              overflow_bound(self), transform=transform, **fields)

    def _describe_elements(self, name: str, element) -> None:
        """Name the format; bits, max and min positive are those of its element grid."""
        self.name, self.element = name, element
        self.bits, self.max_value, self.min_positive = element.bits, element.max_value, element.min_positive

    def run(self, x: Tensor, axis: int = -1, amax: Tensor | None = None, *, want: Want = VALUE,
            noise: RandomBits | None = None, generator: torch.Generator | None = None,
            cross_noise: RandomBits | None = None) -> Quantization:
        """``QuantFormat.run`` in torch. ``amax`` (0-d) replaces ``amax_of(x, axis)`` where a per-tensor
        amax enters (``needs_tensor_amax``). Stochastic rounding draws its noise from ``noise``
        (stateless, keyed per element: what the layers pass), else from ``generator``, else from
        ``default_noise`` (so repeated calls give the same result). With a Hadamard transform the
        value is back in x's domain (inverse applied), the operand stays in the transformed one.
        No kernel here: the record's ``stats`` is None."""
        check_input(self.name, x)
        if want.both_axes:
            return along_both_axes(self, x, axis, amax, noise, generator, cross_noise)
        if want.gemm:
            operand, tensor_scale = self._operand(x, axis, amax, noise, generator)
            own = self.amax_of(x.detach(), axis) if want.amax else None
            return Quantization(operand=operand, tensor_scale=tensor_scale, amax=own)
        if x.numel() == 0:
            return Quantization(x.clone(), torch.ones((), dtype=torch.float32, device=x.device) if want.scale else None)
        xt = self.transform(x, axis)
        if not want.scale and self._in_chunks(xt):
            return Quantization(self.inverse_transform(self._quantize_in_chunks(xt, axis, amax), axis).to(x.dtype))
        q, scale, _ = self._quantize(xt, axis, amax, self._noise(x, noise, generator), False)
        return Quantization(self.inverse_transform(q, axis).to(x.dtype),
                            self.expand_scale(scale, x, axis) if want.scale else None)

    def _operand(self, x: Tensor, axis: int, amax: Tensor | None, noise: RandomBits | None,
                 generator: torch.Generator | None) -> tuple[Tensor, Tensor | None]:
        """(operand, tensor scale) (``Quantization``). The operand holds element-grid values times their
        block scales only, which every format here represents exactly in x's dtype; the value is
        operand x tensor scale, rounded to x's dtype, which for bf16 inputs would leave the grid."""
        if not (self.needs_tensor_amax or self.transforms_operand):
            return self.run(x, axis, amax, noise=noise, generator=generator).value, None
        if x.numel() == 0:
            one = torch.ones((), dtype=torch.float32, device=x.device)
            return x.clone(), one if self.needs_tensor_amax else None
        xt = self.transform(x, axis)
        q, _, tensor_scale = self._quantize(xt, axis, amax, self._noise(x, noise, generator), self.needs_tensor_amax)
        return q.to(x.dtype), tensor_scale if self.needs_tensor_amax else None

    def amax_of(self, x: Tensor, axis: int = -1) -> Tensor:
        """max |x| in the format's quantization domain (after its Hadamard transform, if any):
        the per-tensor amax to reduce over tensor-parallel ranks and pass back as ``amax``."""
        return self._abs_max(self.transform(x, axis))

    def _abs_max(self, x: Tensor, dim: int | None = None) -> Tensor:
        """``abs_max`` as the format's ``nonfinite`` option reads it: NaN skipped under "te"."""
        return abs_max(x, dim, skip_nan=self.options.get("nonfinite") == "te")

    @property
    def transforms_operand(self) -> bool:
        """True when the format quantizes a Hadamard transform of x (``hadamard`` option):
        ``quantize_for_gemm`` then returns the operand in the transformed domain."""
        return self.hadamard is not None

    def transform(self, x: Tensor, axis: int = -1) -> Tensor:
        """x in the quantization domain: its Hadamard transform along ``axis`` (float32), or x
        itself for formats without one."""
        return x if self.hadamard is None else self.hadamard.forward(x, axis, self.name)

    def inverse_transform(self, q: Tensor, axis: int) -> Tensor:
        """q (in the quantization domain, float32) back in x's: the inverse of ``transform``."""
        return q if self.hadamard is None else self.hadamard.inverse(q, axis, self.name)

    def _in_chunks(self, x: Tensor) -> bool:
        """Chunk eager CPU round-to-nearest calls on big tensors (same result; stochastic
        rounding keys its noise on whole-tensor element indices, so it is left whole)."""
        return (self.eager_chunks and x.device.type == "cpu" and self.rounding == "nearest"
                and x.numel() > 2 * EAGER_CHUNK_ELEMENTS and not torch.compiler.is_compiling())

    def _quantize_in_chunks(self, x: Tensor, axis: int, amax: Tensor | None) -> Tensor:
        """``quantize`` a slice of whole blocks at a time, into one output (x is already in the
        quantization domain)."""
        if self.needs_tensor_amax and amax is None:
            amax = abs_max(x)
        if self.block_size is not None:
            axis = normalize_axis(self.name, axis, x.dim())
            if axis != x.dim() - 1:
                return self._quantize_in_slabs(x, axis, amax)
        length = x.shape[-1]
        if self.block_size is None:
            width = 1
        else:
            width = self.block_size if length % self.block_size == 0 else length
        rows = x.reshape(-1, width)
        out = torch.empty_like(rows)
        step = max(1, EAGER_CHUNK_ELEMENTS // width)
        for start in range(0, rows.shape[0], step):
            out[start : start + step] = self._quantize(rows[start : start + step], -1, amax, None, False)[0]
        return out.reshape(x.shape)

    def _quantize_in_slabs(self, x: Tensor, axis: int, amax: Tensor | None) -> Tensor:
        """Blocks along a middle axis: x as (before, axis, after), cut across ``before`` (or
        ``after`` when there is one ``before`` row); every slab holds whole blocks."""
        view = x.reshape(math.prod(x.shape[:axis]), x.shape[axis], -1)
        dim = 0 if view.shape[0] > 1 else 2
        out = torch.empty_like(view)
        step = max(1, EAGER_CHUNK_ELEMENTS * view.shape[dim] // view.numel())
        for start in range(0, view.shape[dim], step):
            size = min(step, view.shape[dim] - start)
            out.narrow(dim, start, size).copy_(self._quantize(view.narrow(dim, start, size), 1, amax, None, False)[0])
        return out.reshape(x.shape)

    @abstractmethod
    def _quantize(self, x: Tensor, axis: int, amax: Tensor | None, uniform: Tensor | None,
                  split: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        """(values in float32 or x's dtype, scale in the format's own layout, tensor scale).

        ``uniform``: U[0, 1) noise of x's shape for stochastic rounding (None otherwise).
        Values are the fake-quantized x, or with ``split`` the same without the per-tensor
        factor, which is then returned as the tensor scale (None where there is none).
        """

    def expand_scale(self, scale: Tensor, x: Tensor, axis: int) -> Tensor:
        """A scale in the format's own layout (one per block, as ``_quantize`` and the kernels give it)
        broadcastable to x: block formats expand their per-block scales, others return it as it is."""
        return scale

    def _noise(self, x: Tensor, noise: RandomBits | None, generator: torch.Generator | None) -> Tensor | None:
        """U[0, 1) noise of x's shape for stochastic rounding (None for round-to-nearest)."""
        if not is_stochastic(self.rounding):
            return None
        if noise is not None and generator is not None:
            raise ValueError(f"{self.name}: pass noise= or generator=, not both")
        if generator is not None:
            return torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float32)
        return (noise or self.default_noise).uniform(tuple(x.shape), x.device)

    @property
    def rounding(self) -> Rounding:
        return self.options.get("rounding", "nearest")

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({self.name!r}{', ' if options else ''}{options})"


def normalize_axis(name: str, axis: int, ndim: int) -> int:
    """``axis`` as a non-negative index; ValueError names the valid range."""
    if ndim == 0:
        raise ValueError(f"{name}: axis={axis} needs a tensor with at least one dimension, got a 0-d tensor")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}: axis={axis} is out of range for a {ndim}-D tensor (valid: {-ndim}..{ndim - 1})")
    return axis % ndim


def check_input(name: str, x: Tensor) -> None:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name}: input dtype {x.dtype} is not one of {list(SUPPORTED_DTYPES)}")


_FP32_MAX = torch.finfo(torch.float32).max


def encode_scale(amax: Tensor, target: float, power_of_two: bool = False, value_for_inf: float = _FP32_MAX) -> Tensor:
    """Transformer Engine's per-tensor (or per-block) encode factor ``target / amax`` (float32):
    values are cast as ``x * encode`` and decoded as ``element * (1 / encode)``.

    As TE's ``compute_scale_from_amax``: an amax of 0, Inf or NaN gives 1; a quotient that
    overflows float32 gives ``value_for_inf`` (float32's max per tensor; TE's block kernels pass
    the input dtype's largest finite value); ``power_of_two`` clears the mantissa (rounds down).
    """
    amax = amax.detach().to(torch.float32)
    # A tensor numerator: torch computes number / tensor as reciprocal(tensor) * number, two roundings.
    # Filled on amax's device: a tensor made from host data would be a host-to-device copy, which
    # waits for the device (a stream sync) on every quantization.
    encode = torch.full_like(amax, target) / amax
    encode = torch.where(torch.isinf(encode), value_for_inf, encode)
    encode = torch.where((amax > 0) & (encode > 0), encode, 1.0)  # amax 0 or NaN; Inf gives encode 0
    return bits.floor_pow2(encode) if power_of_two else encode


def float32_copy(x: Tensor) -> Tensor:
    """A float32 copy of x that the caller may overwrite."""
    return x.clone() if x.dtype == torch.float32 else x.float()


def abs_max(x: Tensor, dim: int | None = None, skip_nan: bool = False) -> Tensor:
    """max |x| over all of x or over ``dim`` (kept), NaN if a NaN is there; with ``skip_nan``
    NaN is left out, as CUDA's fmaxf from 0 does (an all-NaN x gives 0).

    Computed as |max(max x, -min x)|: two reads and no full-size temporary, unlike
    ``x.abs().amax()`` (the outer abs turns the -0 of an all-zero x into +0).
    """
    if skip_nan:
        x = x.nan_to_num(nan=0.0, posinf=math.inf, neginf=-math.inf)
    if dim is None:
        return torch.maximum(x.amax(), x.amin().neg()).abs_()
    return torch.maximum(x.amax(dim, keepdim=True), x.amin(dim, keepdim=True).neg_()).abs_()
