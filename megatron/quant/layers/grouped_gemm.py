"""The experts' GEMMs and operand quantization over token groups, each a fixed number of launches
whatever the number of experts.

An MoE layer's tokens arrive sorted by expert (``tokens_per_expert`` of them each, some possibly none).
``TokenGroups`` holds that split. ``grouped_product`` runs one GEMM per expert as torch's grouped matrix
product (``torch._grouped_mm``: one launch) where the installed torch runs it for the operands' dtype and
device and their strides are 16-byte aligned, else one ``scaled_gemm.matmul`` per expert; on the CPU both
give the per-expert products bit for bit (``tests/layers/test_grouped_experts.py``). ``quantize_groups``
quantizes every expert's operand in one call of the format on the concatenated tokens: blocks along the
features never hold two tokens, and blocks along the tokens (wgrad's operands) are kept inside one expert
by moving each expert's rows to a multiple of the block size in a zero-padded buffer (zeros change no
block's scale, and quantize to zeros). Formats whose scales read a per-tensor amax are not grouped here
(each expert's amax is its own): ``groupable`` says which specs these functions take.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import Literal, Optional

import torch
from torch import Tensor

from megatron.quant.layers.delayed import is_delayed
from megatron.quant.layers.scaled_gemm import matmul
from megatron.quant.recipes.operands import OperandSpec

Gemm = Literal["fprop", "dgrad", "wgrad"]


def groupable(spec: OperandSpec) -> bool:
    """True when ``quantize_groups`` gives ``spec``'s per-expert bits from one call: no format, or one
    whose scales come from the operand's own blocks or elements (no per-tensor amax, delayed history or
    transform) and which rounds to nearest (stochastic noise is keyed per expert module)."""
    fmt = spec.fmt
    return fmt is None or not (fmt.needs_tensor_amax or fmt.transforms_operand or spec.stochastic
                               or is_delayed(fmt) or spec.history is not None)


@dataclass
class TokenGroups:
    """Rows of a [tokens, features] tensor split into consecutive groups, one per local expert."""

    counts: tuple[int, ...]  # tokens of each expert (host integers, as SequentialMLP takes them)
    device: torch.device
    _padded: dict[int, tuple[Tensor, int]] = field(default_factory=dict, repr=False)

    @functools.cached_property
    def ends(self) -> Tensor:
        """Each group's end row (int32 on the tokens' device): the grouped GEMM's ``offs``."""
        return torch.tensor(list(itertools.accumulate(self.counts)), dtype=torch.int32, device=self.device)

    @property
    def total(self) -> int:
        return sum(self.counts)

    def padded_rows(self, block: int) -> tuple[Tensor, int]:
        """(each row's row in a layout where every group starts at a multiple of ``block``, that
        layout's length)."""
        if block not in self._padded:
            starts, padded_starts, at = [], [], 0
            for start, count in zip(itertools.accumulate((0,) + self.counts), self.counts):
                starts.append(start)
                padded_starts.append(at)
                at += -(-count // block) * block
            shift = torch.tensor([p - s for p, s in zip(padded_starts, starts)], device=self.device)
            rows = torch.arange(self.total, device=self.device)
            group = torch.searchsorted(self.ends, rows.to(torch.int32), right=True)
            self._padded[block] = (rows + shift[group], at)
        return self._padded[block]

    def split(self, x: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
        return torch.split(x, list(self.counts), dim=dim)


def _blocks_cross_tokens(spec: OperandSpec, ndim: int) -> bool:
    fmt = spec.fmt
    return fmt.block_size is not None and (fmt.tiled or spec.axis % ndim == 0)


def quantize_groups(x: Tensor, spec: OperandSpec, groups: TokenGroups) -> Tensor:
    """The GEMM operand of [tokens, features] ``x`` quantized per expert as ``spec`` says, in one call of
    its format (``groupable(spec)`` must hold); x itself without a format."""
    if spec.fmt is None:
        return x
    if not _blocks_cross_tokens(spec, x.dim()):
        return spec.fmt.quantize_for_gemm(x, axis=spec.axis)[0]
    rows, length = groups.padded_rows(spec.fmt.block_size)
    padded = x.new_zeros((length,) + tuple(x.shape[1:])).index_copy_(0, rows, x)
    return spec.fmt.quantize_for_gemm(padded, axis=spec.axis)[0].index_select(0, rows)


@functools.cache
def _grouped_mm_runs(device_type: str, dtype: torch.dtype) -> bool:
    """Whether the installed torch has a grouped GEMM for ``dtype`` on ``device_type`` (CUDA's takes
    bf16 only, on recent GPUs; the CPU's bf16 and fp32 since torch 2.9)."""
    try:
        a = torch.ones(16, 8, dtype=dtype, device=device_type)
        b = torch.ones(2, 8, 8, dtype=dtype, device=device_type)
        out = torch._grouped_mm(a, b, offs=torch.tensor([8, 16], dtype=torch.int32, device=device_type))
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return bool((out == 8).all())


def _aligned(*sizes: int, dtype: torch.dtype) -> bool:
    per_16_bytes = 16 // torch.empty((), dtype=dtype).element_size()
    return all(size % per_16_bytes == 0 for size in sizes)


def grouped_product(gemm: Gemm, a: Tensor, b: Tensor, groups: TokenGroups,
                    out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """Each expert's product, in its operands' dtype or summed into ``out_dtype`` as ``scaled_gemm.matmul``:

    - ``fprop``: tokens a [T, k] by stacked weights b [E, n, k], a_e @ b_e^T -> [T, n];
    - ``dgrad``: gradients a [T, n] by stacked weights b [E, n, k], a_e @ b_e -> [T, k];
    - ``wgrad``: gradients a [T, n] by inputs b [T, k], a_e^T @ b_e -> [E, n, k].
    """
    if gemm == "fprop":
        left, right = a, b.transpose(1, 2)
    elif gemm == "dgrad":
        left, right = a, b
    else:
        left, right = a.t(), b
    dtype = out_dtype or a.dtype
    # The CPU widens narrow operands for an FP32 sum itself (scaled_gemm.matmul does the same); CUDA's
    # grouped GEMM writes its operands' dtype only.
    widen = dtype != a.dtype and a.device.type == "cpu"
    run = dtype if widen else a.dtype
    if (dtype == a.dtype or widen) and _grouped_mm_runs(a.device.type, run) and \
            _aligned(*a.shape[1:], *b.shape[1:], dtype=run):  # the feature sizes set every stride
        return torch._grouped_mm(left.to(run), right.to(run), offs=groups.ends)
    if gemm == "wgrad":
        return torch.stack([matmul(d.t(), x, out_dtype) for d, x in zip(groups.split(a), groups.split(b))])
    return torch.cat([matmul(t, w, out_dtype) for t, w in zip(groups.split(left), right.unbind(0))])
