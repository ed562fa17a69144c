"""``QuantFormat``: everything a format object offers to the layers, the statistics, the recipes and the
comparisons: the one page that says what a format can do.

Three kinds of object implement it, each by subclassing it (so none is recognised by the shape of its
attributes alone):

- ``NumericFormat`` (``base.py``): the formats themselves, exact fake quantization in torch;
- ``FormatWrapper`` (``wrapper.py``) and its subclasses ``CompiledFormat`` (``compiled.py``) and
  ``kernels.TritonFormat``: a format run another way, every member forwarded explicitly.

Every quantization goes through one method, ``run(x, axis, amax, want=...)``, which returns a
``Quantization`` record holding what the ``Want`` asked for (``quantization.py``); an implementation
writes ``run``, ``amax_of`` and ``transform``, and ``serves`` where a kernel of its own quantizes.
The named methods below (``quantize``, ``quantize_with_scale``, ``quantize_for_gemm`` and the three
composites) are conveniences written once, here, on top of ``run``, and no class overrides them: they
keep the plain spelling of the common calls (``fmt.quantize(x, axis)`` is a tensor, as users and the
bit tests call it) while what a format runs is in one place.

Callers use these members and nothing else (no probing with ``getattr``): a capability a format
lacks has a member saying so (``dual_axis``, ``serves``), or the record says None (statistics where
no kernel took any).
"""
from __future__ import annotations

from abc import abstractmethod
from typing import Any, Literal, Optional, Protocol, runtime_checkable

import torch
from torch import Tensor

from .contract import KernelContract
from .grid import ElementGrid
from .quantization import GEMM, GEMM_BOTH_AXES, GEMM_WITH_AMAX, VALUE, VALUE_WITH_SCALE, Quantization, Want
from .random_bits import RandomBits
from .rounding import Rounding

Scaling = Literal["none", "tensor", "delayed", "block"]
"""Where a format's scale comes from. ``"none"``: no scale (plain casts, unscaled grids);
``"tensor"``: one scale per tensor from its own amax (TE's current scaling); ``"delayed"``: one scale
per tensor from the operand's amax history (TE's ``DelayedScaling``, ``layers.delayed``);
``"block"``: one scale per block or tile (MX, NVFP4, FP8 blocks; NVFP4 adds a per-tensor factor)."""


@runtime_checkable
class QuantFormat(Protocol):
    """A numeric format as a GEMM operand (or a capture's statistics) uses it."""

    name: str
    """Canonical name, e.g. ``"mxfp8_e4m3"`` (a wrapper's is its format's)."""
    bits: int
    """Element bit width."""
    max_value: float
    """Largest finite element value (unscaled)."""
    min_positive: float
    """Smallest positive element value (unscaled, subnormal if the element has any)."""
    options: dict[str, Any]
    """Resolved options, JSON-serialisable, accepted back by ``get_format``."""
    rounding: Rounding
    """The ``rounding`` option: ``"nearest"``, ``"stochastic"`` or ``"stochastic8"`` (``formats.rounding``)."""
    scaling: Scaling
    """Where the scale comes from (``Scaling``)."""
    needs_tensor_amax: bool
    """True when a per-tensor amax enters the result (tensor or delayed scaling, NVFP4): the layers
    pass one reduced over tensor-parallel ranks."""
    amax_per_row: bool
    """True when that amax is one per row, the line along the quantization axis (row-scaled NVFP4):
    ``amax_of`` keeps the axis as a dimension of 1, and an amax taken along one axis serves no other."""
    transforms_operand: bool
    """True with ``hadamard=n``: ``quantize_for_gemm``'s operand is in the transformed domain."""
    block_size: Optional[int]
    """A block's length along any axis (32 for MX, 16 for NVFP4, 128 for FP8 blocks; n for n x n
    tiles); None for formats without blocks."""
    block_shape: Optional[tuple[int, int]]
    """(1, n): blocks along the quantization axis; (n, n): tiles of the last two dimensions; None
    for formats without blocks."""
    tiled: bool
    """True for n x n tiles (``block_shape`` (n, n)): the same blocks along either axis."""
    axis_free: bool
    """True when the result is the same along either axis: no blocks, or tiles whose scales read no
    order (NVFP4's 4over6 tiles sum their error along the axis, so W^T chooses its own scales)."""
    element: Optional[ElementGrid]
    """The element grid values are rounded onto; None for plain dtype casts (``dtype``)."""
    dtype: Optional[torch.dtype]
    """The torch dtype a plain cast rounds to (fp32, bf16, fp16); None for grid formats (``element``)."""
    dual_axis: bool
    """True when ``run`` with ``Want.both_axes`` quantizes along both axes from one read (a kernel does)."""
    kernel_contract: Optional[KernelContract]
    """What a quantization kernel needs of the format (``contract.py``); None where no kernel serves it."""

    @abstractmethod
    def run(self, x: Tensor, axis: int = -1, amax: Optional[Tensor] = None, *, want: Want = VALUE,
            noise: Optional[RandomBits] = None, generator: Optional[torch.Generator] = None,
            cross_noise: Optional[RandomBits] = None) -> Quantization:
        """x quantized along ``axis`` (blocks along it), returning what ``want`` asks for. ``amax`` (0-d,
        or one per row with ``amax_per_row``) replaces ``amax_of(x, axis)`` where a per-tensor amax
        enters. Stochastic rounding draws from ``noise``, else ``generator``, else the format's seed keyed
        by element index; with ``Want.both_axes`` ``axis`` is one of x's last two axes and the other axis
        draws from ``cross_noise``."""

    @abstractmethod
    def amax_of(self, x: Tensor, axis: int = -1) -> Tensor:
        """0-d max |x| in the quantization domain (after the Hadamard transform, if any); with
        ``amax_per_row`` each row's, x's shape with 1 at ``axis``."""

    @abstractmethod
    def transform(self, x: Tensor, axis: int = -1) -> Tensor:
        """x in the quantization domain: its Hadamard transform along ``axis``, or x itself."""

    def serves(self, x: Tensor, generator: Optional[torch.Generator] = None) -> bool:
        """True when a kernel of this object quantizes x (False: the torch path does)."""
        return False

    # The conveniences: each one ``run`` request, written here once.

    def quantize(self, x: Tensor, axis: int = -1, amax: Optional[Tensor] = None, *,
                 noise: Optional[RandomBits] = None, generator: Optional[torch.Generator] = None) -> Tensor:
        """x fake-quantized (x's shape and dtype): ``run``'s value."""
        return self.run(x, axis, amax, want=VALUE, noise=noise, generator=generator).value

    def quantize_with_scale(self, x: Tensor, axis: int = -1, amax: Optional[Tensor] = None, *,
                            noise: Optional[RandomBits] = None, generator: Optional[torch.Generator] = None
                            ) -> tuple[Tensor, Tensor]:
        """(``quantize``'s result, the float32 scale broadcastable to x that the element grid was
        applied to x, or to its transform, divided by)."""
        done = self.run(x, axis, amax, want=VALUE_WITH_SCALE, noise=noise, generator=generator)
        return done.value, done.scale

    def quantize_for_gemm(self, x: Tensor, axis: int = -1, amax: Optional[Tensor] = None, *,
                          noise: Optional[RandomBits] = None, generator: Optional[torch.Generator] = None
                          ) -> tuple[Tensor, Optional[Tensor]]:
        """(operand, tensor scale): what a GEMM kernel decodes, and the per-tensor factor it applies
        to its FP32 accumulator afterwards (None when the format has none)."""
        done = self.run(x, axis, amax, want=GEMM, noise=noise, generator=generator)
        return done.operand, done.tensor_scale

    def quantize_with_stats(self, x: Tensor, axis: int = -1, amax: Optional[Tensor] = None, *,
                            noise: Optional[RandomBits] = None, generator: Optional[torch.Generator] = None,
                            full: bool = False) -> tuple[Tensor, Tensor, Optional[Tensor]]:
        """``quantize_with_scale`` and the packed statistics (``stats.packing``) a kernel took in the
        same pass, all of them with ``full``, else the exact fields; None where no kernel took any
        (then the capture computes them in torch)."""
        want = Want(scale=True, stats="full" if full else "exact")
        done = self.run(x, axis, amax, want=want, noise=noise, generator=generator)
        return done.value, done.scale, done.stats

    def quantize_for_gemm_with_amax(self, x: Tensor, axis: int = -1, amax: Optional[Tensor] = None, *,
                                    noise: Optional[RandomBits] = None
                                    ) -> tuple[Tensor, Optional[Tensor], Tensor]:
        """``quantize_for_gemm`` with ``amax`` (delayed scaling's, from the history), and x's own
        ``amax_of``, which the history records (from the same read where a kernel takes both)."""
        done = self.run(x, axis, amax, want=GEMM_WITH_AMAX, noise=noise)
        return done.operand, done.tensor_scale, done.amax

    def quantize_for_gemm_both(self, x: Tensor, amax: Optional[Tensor] = None, *,
                               noises: tuple[Optional[RandomBits], Optional[RandomBits]] = (None, None)
                               ) -> tuple[tuple[Tensor, Optional[Tensor]], tuple[Tensor, Optional[Tensor]]]:
        """``quantize_for_gemm`` of x along axis -2 (with ``noises[0]``) and along axis -1 (with
        ``noises[1]``), from one read where ``dual_axis``."""
        done = self.run(x, -2, amax, want=GEMM_BOTH_AXES, noise=noises[0], cross_noise=noises[1])
        return (done.operand, done.tensor_scale), (done.cross.operand, done.cross.tensor_scale)


def cross_axis(name: str, x: Tensor, axis: int) -> int:
    """The other of x's last two axes (-2 or -1) than ``axis``, which must be one of them (``Want.both_axes``)."""
    last = x.dim() - 1
    if x.dim() < 2 or axis not in (-2, -1, last - 1, last):
        raise ValueError(f"{name}: both_axes needs axis -2 or -1 of a tensor with at least 2 dimensions, "
                         f"got axis={axis} of a {x.dim()}-D tensor")
    return -1 if axis in (-2, last - 1) else -2


def along_both_axes(fmt: QuantFormat, x: Tensor, axis: int, amax: Optional[Tensor], noise: Optional[RandomBits],
                    generator: Optional[torch.Generator], cross_noise: Optional[RandomBits]) -> Quantization:
    """``Want.both_axes`` as two ``GEMM`` runs of ``fmt``, along ``axis`` and then along the other of x's
    last two axes: what an object without a one-read kernel for both does."""
    other = cross_axis(fmt.name, x, axis)
    first = fmt.run(x, axis, amax, want=GEMM, noise=noise, generator=generator)
    second = fmt.run(x, other, amax, want=GEMM, noise=cross_noise, generator=generator)
    return Quantization(operand=first.operand, tensor_scale=first.tensor_scale, cross=second)
