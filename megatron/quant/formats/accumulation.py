"""How an FP8 GEMM on a Hopper tensor core (sm_90, cuBLAS's FP8 kernels) adds its products: a model of
the accumulator, in pure torch, bit for bit on finite FP8 operands.

The tensor core adds a block of 32 products to the running FP32 accumulator c in one step:

- each product's exponent is the sum of its operands' exponents, each clamped at its format's smallest
  normal exponent (E4M3 -6, E5M2 -14: a subnormal keeps its short significand); zero products have none;
- all terms (the products and c) are aligned to the block's largest exponent E and truncated toward
  zero to 13 fraction bits below 2^E, then summed exactly;
- the sum is truncated toward zero to 13 fraction bits of its own exponent; a zero result is +0.

A GEMM chains these steps over K (zero padding a ragged last block leaves the result unchanged):

- fast accumulation (TE's ``use_split_accumulator=False``, torch's ``use_fast_accum=True``): one chain
  over all of K;
- promoted accumulation (TE's split accumulator, ``use_fast_accum=False``): a chain over each 128-long
  slice of K, each started from +0, added in K order into an FP32 accumulator from +0 (round to nearest);
- split-K over S splits: K in 128-wide tiles, split s owns the contiguous tiles [s q, (s + 1) q),
  q = ceil(tiles / S); fast: one chain per split; promoted: each tile its own chain, added in order;
  the splits' partial sums are then added in order in FP32. Which S cuBLAS picks is its heuristic's
  decision (GPU, SM count, cuBLASLt version, workspace, output dtype): the caller passes it; without one
  the model does not split.

How it runs: one block step (``_block_step``) of all chains at once, in float32 operations that are each
exact (so any order of its sums gives the same bits); on the CPU under torch.compile for a GEMM of
``COMPILE_FROM`` products or more (inductor fuses the step into one loop, about ten times faster), eager
below (no compilation to pay) and where torch cannot compile.

The epilogue (``hopper_epilogue``) multiplies the FP32 accumulator by alpha = RN32(scale_a * scale_b)
once, rounding to FP32, then to the output dtype (bf16: round to nearest even from FP32).

Sources: NVIDIA PTX ISA (``wgmma.mma_async`` with .e4m3/.e5m2 inputs and an .f32 accumulator); the
DeepSeek-V3 technical report (section 3.3.2: about 14 bits of accumulator, promotion to FP32 every
128 elements); Transformer Engine's ``MMParams(use_split_accumulator=...)``; the block step, the slice
and tile lengths as measured on an H100 PCIe with cuBLASLt 12.8 (Khattak and Mikaitis, "Accurate
Models of NVIDIA Tensor Cores", arXiv:2512.07004, and the measurements the ``mmaemu`` package
publishes, which the tests compare against). Not modelled: Inf and NaN operands, Blackwell's
block-scaled MMA, Ada's 16-product blocks, other cuBLAS versions' split decisions.
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Callable, Literal, Optional

import torch
from torch import Tensor
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from .interface import QuantFormat

FP8Kind = Literal["e4m3", "e5m2"]
ACCUMULATIONS = ("exact", "fast", "promoted")  # a recipe's ``accumulate``: exact FP32, or the Hopper model's two
MIN_NORMAL_EXPONENT = {"e4m3": -6, "e5m2": -14}  # an operand's exponent is clamped at its format's
BLOCK = 32  # products per tensor-core step
FRACTION_BITS = 13  # kept below the block's alignment exponent, and in the block's result
PROMOTE_EVERY = 128  # promoted accumulation: a new chain every 128 elements of K
K_TILE = 128  # split-K cuts K into tiles this wide
# Every accumulator value is a multiple of 2^(-28 - FRACTION_BITS) (the smallest product exponent is
# -14 - 14), so alignment exponents below FLOOR change nothing and 2^(E - FRACTION_BITS) stays normal.
FLOOR = -29 - FRACTION_BITS
_NO_EXPONENT = -1000
COMPILE_FROM = 1 << 24  # products (chains x M x N x L) from which the CPU runs the block step compiled
PER_TENSOR = ("tensor", "delayed")  # the scalings of an FP8 tensor core's operands (one FP32 scale a tensor)


def fp8_kind(fmt: Optional[QuantFormat]) -> Optional[FP8Kind]:
    """The FP8 kind of a format's operands where a Hopper tensor core takes them (per-tensor scaled
    E4M3 or E5M2 elements); None for any other format, or none."""
    if fmt is None or fmt.scaling not in PER_TENSOR or fmt.element is None:
        return None
    name = fmt.element.name
    return name if name in MIN_NORMAL_EXPONENT else None  # type: ignore[return-value]


@dataclass(frozen=True)
class Operands:
    """Two GEMM operands holding FP8 values, a [M, K] and b [N, K] (C = a b^T), and their formats."""

    a: Tensor
    b: Tensor
    kind_a: FP8Kind = "e4m3"
    kind_b: FP8Kind = "e4m3"


def _exponent_powers(x: Tensor, kind: FP8Kind) -> Tensor:
    """2^e for FP8 values held in float32, e = floor(log2 |x|) clamped at the format's smallest normal
    exponent; 0 for zeros (read from the bits: FP8 values are normal in float32)."""
    biased = ((x.view(torch.int32) >> 23) & 0xFF).clamp_min(MIN_NORMAL_EXPONENT[kind] + 127)
    return torch.where(x == 0, 0.0, (biased << 23).view(torch.float32))


def _exponent_of(x: Tensor) -> Tensor:
    """floor(log2 |x|) of normal float32 values; ``_NO_EXPONENT`` for zeros."""
    return torch.where(x == 0, _NO_EXPONENT, ((x.view(torch.int32) >> 23) & 0xFF) - 127)


def _pow2(e: Tensor) -> Tensor:
    """2^e as float32 for integer e in the normal range, from the bits."""
    return ((e + 127) << 23).view(torch.float32)


def _truncate_fraction(d: Tensor) -> Tensor:
    """d (normal float32 or zero) truncated toward zero to FRACTION_BITS fraction bits; +0 for zero."""
    mask = ~((1 << (23 - FRACTION_BITS)) - 1)
    return (d.view(torch.int32) & mask).view(torch.float32) + 0.0


def _block_step(acc: Tensor, a: Tensor, pa: Tensor, bt: Tensor, pbt: Tensor) -> Tensor:
    """One block step of every chain: acc [C, M, N], a [C, M, BLOCK] and bt [C, BLOCK, N] (b transposed,
    so the products' rows run along N), pa and pbt their elements' 2^exponent (``_exponent_powers``) -> the
    new acc. Every operation is exact in float32: products of FP8 values and of powers of two, scalings
    by powers of two, and sums of integers below 2^24; so the order of the sums does not matter."""
    top = (pa[..., None] * pbt[:, None]).amax(2)  # 2^E: the block's largest product exponent (0: all zero)
    aligned = torch.maximum(_exponent_of(top), _exponent_of(acc)).clamp_min(FLOOR)
    unit, per_unit = _pow2(aligned - FRACTION_BITS), _pow2(FRACTION_BITS - aligned)  # exact scalings
    total = torch.trunc(a[..., None] * bt[:, None] * per_unit[:, :, None]).sum(2) + torch.trunc(acc * per_unit)
    return _truncate_fraction(total * unit)


@functools.cache
def _compiled_step() -> Callable[..., Tensor]:
    """``_block_step`` under torch.compile: inductor fuses it into one loop over the block's products,
    about ten times the eager step's speed on llama-tiny's GEMMs; shapes dynamic, so one compilation
    (seconds; inductor's cache keeps it for the next process) serves every GEMM. The eager step where
    torch cannot compile for the CPU (no C++ compiler), with a warning."""
    compiled = torch.compile(_block_step, dynamic=True, fullgraph=True)
    probe = torch.ones(1, 2, BLOCK)
    try:
        compiled(torch.zeros(1, 2, 2), probe, probe, probe.transpose(1, 2), probe.transpose(1, 2))
    except Exception as error:  # inductor's failures (no compiler, a broken toolchain) have no common type
        warnings.warn(f"the Hopper accumulation model runs eager, 10x slower: torch.compile failed ({error})",
                      stacklevel=2)
        return _block_step
    return compiled


def _chains(a: Tensor, pa: Tensor, b: Tensor, pb: Tensor, compiled: Optional[bool]) -> Tensor:
    """The chains of a batch: a [C, M, L], b [C, N, L] (L a multiple of BLOCK), pa and pb their elements'
    2^exponent -> float32 [C, M, N], chain c over its L elements from +0, one block step at a time
    (``compiled``: the step under torch.compile; None: on the CPU from ``COMPILE_FROM`` products, below
    which the eager step costs less than a compilation, and under a dispatch mode)."""
    chains, m, length = a.shape
    if compiled is None:  # torch.compile refuses to run under a dispatch mode (graph checks, work counts)
        compiled = (a.device.type == "cpu" and chains * m * b.shape[1] * length >= COMPILE_FROM
                    and not is_in_torch_dispatch_mode(include_infra_modes=False))
    step = _compiled_step() if compiled else _block_step
    blocks = zip(a.split(BLOCK, 2), pa.split(BLOCK, 2), b.transpose(1, 2).contiguous().split(BLOCK, 1),
                 pb.transpose(1, 2).contiguous().split(BLOCK, 1))
    acc = torch.zeros(chains, m, b.shape[1], dtype=torch.float32, device=a.device)
    for block in blocks:
        acc = step(acc, *block)
    return acc


def _serial_sum(parts: Tensor) -> Tensor:
    """parts [P, M, N] added in order into an FP32 accumulator from +0."""
    total = torch.zeros_like(parts[0])
    for part in parts:
        total = total + part
    return total


def _as_slices(x: Tensor, length: int, count: int) -> Tensor:
    """x [R, K] zero-padded to count * length along K, as [count, R, length]."""
    x = torch.nn.functional.pad(x, (0, count * length - x.shape[1]))
    return x.unflatten(1, (count, length)).transpose(0, 1).contiguous()


def hopper_accumulate(ops: Operands, fast: bool, splits: int = 1, compiled: Optional[bool] = None) -> Tensor:
    """The FP32 accumulator [M, N] of a b^T as a Hopper FP8 GEMM computes it (module docstring), with
    ``fast`` or promoted accumulation and ``splits`` split-K partitions; a and b hold finite FP8 values
    of ``ops``' kinds in any float dtype. ``compiled``: the block step under torch.compile or eager (the
    same bits); None: compiled for a large GEMM on the CPU (``_chains``)."""
    if splits < 1:
        raise ValueError(f"splits={splits}: at least 1")
    a, b = ops.a.float(), ops.b.float()
    k = a.shape[1]
    tiles = -(-k // K_TILE)
    per_split = -(-tiles // splits) if splits > 1 else 0
    if fast:  # one chain per split (or one in all), over its tiles
        length = per_split * K_TILE if splits > 1 else -(-k // BLOCK) * BLOCK
        count = splits if splits > 1 else 1
    else:  # one chain per 128-long slice (a split's tiles are such slices)
        length, count = PROMOTE_EVERY, (splits * per_split if splits > 1 else -(-k // PROMOTE_EVERY))
    sa, sb = _as_slices(a, length, count), _as_slices(b, length, count)
    chains = _chains(sa, _exponent_powers(sa, ops.kind_a), sb, _exponent_powers(sb, ops.kind_b), compiled)
    if fast or splits == 1:
        return _serial_sum(chains)
    partials = torch.stack([_serial_sum(group) for group in chains.unflatten(0, (splits, per_split))])
    return _serial_sum(partials)


def hopper_epilogue(acc: Tensor, scale: Tensor | None, out_dtype: torch.dtype) -> Tensor:
    """The output of an FP32 accumulator: times alpha (the product of the operands' scales, an FP32
    value) rounded once to FP32, then rounded to ``out_dtype``."""
    if scale is not None:
        acc = (acc.double() * scale.double() + 0.0).float()  # exact, one rounding; a zero product is +0
    return acc.to(out_dtype)
