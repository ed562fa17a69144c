"""``QuantFormat``: everything a format object offers to the layers, the statistics, the recipes and the
comparisons: the one page that says what a format can do.

Three kinds of object implement it, each by subclassing it (so none is recognised by the shape of its
attributes alone):

- ``NumericFormat`` (``base.py``): the formats themselves, exact fake quantization in torch;
- ``FormatWrapper`` (``wrapper.py``) and its subclasses ``CompiledFormat`` (``compiled.py``) and
  ``kernels.TritonFormat``: a format run another way, every member forwarded explicitly.

Callers use these members and nothing else (no probing with ``getattr``): a capability a format
lacks has a member saying so (``dual_axis``, ``serves``) or a default that does the plain thing
(``quantize_with_stats`` without a kernel returns no statistics).
"""
from __future__ import annotations

from abc import abstractmethod
from typing import Any, Literal, Optional, Protocol, runtime_checkable

import torch
from torch import Tensor

from .contract import KernelContract
from .grid import ElementGrid
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
    """True when ``quantize_for_gemm_both`` quantizes along both axes from one read (a kernel does)."""
    kernel_contract: Optional[KernelContract]
    """What a quantization kernel needs of the format (``contract.py``); None where no kernel serves it."""

    @abstractmethod
    def quantize(self, x: Tensor, axis: int = -1, amax: Optional[Tensor] = None, *,
                 noise: Optional[RandomBits] = None, generator: Optional[torch.Generator] = None) -> Tensor:
        """x fake-quantized (x's shape and dtype), blocks along ``axis``. ``amax`` (0-d) replaces
        ``amax_of(x, axis)`` where a per-tensor amax enters. Stochastic rounding draws from ``noise``,
        else ``generator``, else the format's seed keyed by element index."""

    @abstractmethod
    def quantize_with_scale(self, x: Tensor, axis: int = -1, amax: Optional[Tensor] = None, *,
                            noise: Optional[RandomBits] = None, generator: Optional[torch.Generator] = None
                            ) -> tuple[Tensor, Tensor]:
        """(``quantize``'s result, the float32 scale broadcastable to x that the element grid was
        applied to x, or to its transform, divided by)."""

    @abstractmethod
    def quantize_for_gemm(self, x: Tensor, axis: int = -1, amax: Optional[Tensor] = None, *,
                          noise: Optional[RandomBits] = None, generator: Optional[torch.Generator] = None
                          ) -> tuple[Tensor, Optional[Tensor]]:
        """(operand, tensor scale): what a GEMM kernel decodes, and the per-tensor factor it applies
        to its FP32 accumulator afterwards (None when the format has none)."""

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

    def quantize_with_stats(self, x: Tensor, axis: int = -1, amax: Optional[Tensor] = None, *,
                            noise: Optional[RandomBits] = None, generator: Optional[torch.Generator] = None,
                            full: bool = False) -> tuple[Tensor, Tensor, Optional[Tensor]]:
        """``quantize_with_scale`` and the packed statistics (``stats.packing``) a kernel took in the
        same pass, all of them with ``full``, else the exact fields; None where no kernel took any
        (then the capture computes them in torch)."""
        return (*self.quantize_with_scale(x, axis, amax, noise=noise, generator=generator), None)

    def quantize_for_gemm_with_amax(self, x: Tensor, axis: int = -1, amax: Optional[Tensor] = None, *,
                                    noise: Optional[RandomBits] = None
                                    ) -> tuple[Tensor, Optional[Tensor], Tensor]:
        """``quantize_for_gemm`` with ``amax`` (delayed scaling's, from the history), and x's own
        ``amax_of``, which the history records (from the same read where a kernel takes both)."""
        return (*self.quantize_for_gemm(x, axis, amax, noise=noise), self.amax_of(x.detach(), axis))

    def quantize_for_gemm_both(self, x: Tensor, amax: Optional[Tensor] = None, *,
                               noises: tuple[Optional[RandomBits], Optional[RandomBits]] = (None, None)
                               ) -> tuple[tuple[Tensor, Optional[Tensor]], tuple[Tensor, Optional[Tensor]]]:
        """``quantize_for_gemm`` of x along axis -2 (with ``noises[0]``) and along axis -1 (with
        ``noises[1]``), from one read where ``dual_axis``."""
        rows, cols = (self.quantize_for_gemm(x, axis, amax, noise=noise) for axis, noise in zip((-2, -1), noises))
        return rows, cols

