"""The Triton launches as torch operators (``torch.library.custom_op``, namespace ``megatron_quant``),
each with a fake implementation that gives its outputs' shapes and dtypes without running it, as
torchao registers its MX kernels: ``torch.compile`` traces through a format's kernel path as a few
opaque nodes instead of breaking its graph at each launch, and the profiler names the operators.

An operator takes the format's ``KernelContract`` as its JSON text (``formats.contract``: a string
is a constant of the compiled graph) and returns new tensors; an output it was not asked for is an
empty tensor. The launchers below them (``elementwise``, ``blocks``, ``amax``) stay plain functions
over preallocated outputs.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
from torch import Tensor

from megatron.quant.formats.contract import from_json

from . import blocks, elementwise
from .amax import abs_max as one_read_abs_max
from .amax import abs_max_rows_of, fold_rows
from .stats import abs_max_rows, stats_rows

_NOTHING = (0,)  # the shape of an output that was not asked for


def _empty(x: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.empty(_NOTHING, dtype=dtype, device=x.device)


# --- elementwise formats -------------------------------------------------------------------------

@torch.library.custom_op("megatron_quant::elementwise", mutates_args=())
def quantize_elementwise(x: Tensor, encode: Optional[Tensor], decode: Optional[Tensor], noise: list[int],
                         contract: str, out_dtype: torch.dtype, stats: int) -> tuple[Tensor, Tensor]:
    """(contiguous x quantized by the contract in ``out_dtype``, the programs' rows of statistics
    with ``stats``): ``elementwise.launch``."""
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    rows = elementwise.launch(x, out, from_json(contract), encode, decode, tuple(noise), stats)
    return out, _empty(x, torch.float64) if rows is None else rows


@quantize_elementwise.register_fake
def _(x, encode, decode, noise, contract, out_dtype, stats):
    return (x.new_empty(x.shape, dtype=out_dtype),
            stats_rows(elementwise.programs(x), stats, x.device) if stats else _empty(x, torch.float64))


@torch.library.custom_op("megatron_quant::elementwise_tensor_scaled", mutates_args=())
def quantize_elementwise_tensor_scaled(x: Tensor, amax: Optional[Tensor], noise: list[int], contract: str,
                                       out_dtype: torch.dtype, split: bool, take_amax: bool
                                       ) -> tuple[Tensor, Tensor, Tensor]:
    """(contiguous x quantized by the contract with a per-tensor scale, the scale's float32 decode factor,
    with ``take_amax`` x's own amax (0-d, x's dtype) from the quantizing read). The quantizing kernel
    computes the scale itself: from ``amax`` (one float32 value, delayed scaling's history or a reduced
    amax: one launch), or from x's own amax (two launches: the amax kernel's rows, ``tensor_rows``); with
    ``take_amax`` a launch more folds the rows of x's amax it wrote. No torch op between the launches.
    ``split``: the values leave the decode factor out."""
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    rules = from_json(contract)
    if amax is None:
        rows, decode = tensor_rows(x, rules.nonfinite_te)
    else:  # the float32 amax's bits as one row of magnitudes: encode_scale's result for any sign, NaN or Inf
        rows, decode = amax.reshape(1).view(torch.int32), torch.empty(amax.shape, dtype=torch.float32, device=x.device)
    own_rows = abs_max_rows(elementwise.programs(x, True), x.device) if take_amax else None
    elementwise.launch(x, out, rules, None, decode, tuple(noise), amax_rows=own_rows, fold_rows=rows, split=split)
    return out, decode, _empty(x) if own_rows is None else fold_rows(own_rows, rules.nonfinite_te, x.dtype)


@quantize_elementwise_tensor_scaled.register_fake
def _(x, amax, noise, contract, out_dtype, split, take_amax):
    return (x.new_empty(x.shape, dtype=out_dtype), x.new_empty(() if amax is None else amax.shape, dtype=torch.float32),
            x.new_empty((), dtype=x.dtype) if take_amax else _empty(x))


# --- block formats -------------------------------------------------------------------------------

@torch.library.custom_op("megatron_quant::blocks", mutates_args=())
def quantize_blocks(x: Tensor, tensor: Optional[Tensor], noise: list[int], contract: str, axis: int, split: bool,
                    stats: int, transform: Optional[str], out_dtype: torch.dtype, fold: bool
                    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(contiguous x quantized by a block format's contract in ``out_dtype``, with ``stats`` the
    blocks' scales in block order and the programs' rows of statistics, with ``fold`` the 0-d float32
    global decode): ``blocks.launch_blocks``. ``fold`` (no ``tensor``): the FP32 tensor scale from x's
    own amax in two launches and nothing between them (``tensor_rows``)."""
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    rules = from_json(contract)
    tensor, decode = tensor_rows(x, rules.nonfinite_te) if fold else (tensor, None)
    captured = blocks.launch_blocks(x, out, rules, axis, tuple(noise), tensor, split, stats, transform, decode)
    decode = _empty(x) if decode is None else decode
    if captured is None:
        return out, _empty(x), _empty(x, torch.float64), decode
    return out, *captured, decode


@quantize_blocks.register_fake
def _(x, tensor, noise, contract, axis, split, stats, transform, out_dtype, fold):
    shape, layout = blocks.block_walk(x, from_json(contract), axis)
    programs = triton.cdiv(shape[0], layout.columns)
    decode = x.new_empty((), dtype=torch.float32) if fold else _empty(x)
    if not stats:
        return x.new_empty(x.shape, dtype=out_dtype), _empty(x), _empty(x, torch.float64), decode
    return (x.new_empty(x.shape, dtype=out_dtype), x.new_empty((shape[0],), dtype=torch.float32),
            stats_rows(programs, stats, x.device), decode)


@torch.library.custom_op("megatron_quant::blocks_both_axes", mutates_args=())
def quantize_blocks_both_axes(x: Tensor, tensor: Optional[Tensor], noise0: list[int], noise1: list[int],
                              contract: str, split: bool, fold: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Contiguous x quantized along axis -2 and along axis -1 from one read (``blocks.launch_dual``), and
    with ``fold`` the 0-d global decode of the tensor scale taken as ``quantize_blocks`` takes it."""
    out0, out1 = torch.empty_like(x), torch.empty_like(x)
    rules = from_json(contract)
    tensor, decode = tensor_rows(x, rules.nonfinite_te) if fold else (tensor, None)
    blocks.launch_dual(x, out0, out1, rules, (tuple(noise0), tuple(noise1)), tensor, split, decode)
    return out0, out1, _empty(x) if decode is None else decode


@quantize_blocks_both_axes.register_fake
def _(x, tensor, noise0, noise1, contract, split, fold):
    return torch.empty_like(x), torch.empty_like(x), x.new_empty((), dtype=torch.float32) if fold else _empty(x)


def tensor_rows(x: Tensor, skip_nan: bool) -> tuple[Tensor, Tensor]:
    """(x's amax rows, ``amax.abs_max_rows_of``'s launch; the 0-d float32 decode factor the quantizing
    kernel folds them into and writes): the arguments of a tensor scale taken in the kernel."""
    return abs_max_rows_of(x, skip_nan), torch.empty((), dtype=torch.float32, device=x.device)


# --- amaxes --------------------------------------------------------------------------------------

@torch.library.custom_op("megatron_quant::abs_max", mutates_args=())
def abs_max(x: Tensor, skip_nan: bool) -> Tensor:
    """max |x| (0-d, x's dtype) in one read: ``amax.abs_max``."""
    return one_read_abs_max(x, skip_nan)


@abs_max.register_fake
def _(x, skip_nan):
    return x.new_empty((), dtype=x.dtype)


@torch.library.custom_op("megatron_quant::transformed_abs_max", mutates_args=())
def transformed_abs_max(x: Tensor, contract: str, axis: int) -> Tensor:
    """max |transform(x)| (0-d float32) with the contract's Hadamard transform applied in the kernel:
    ``blocks.transformed_abs_max``."""
    return blocks.transformed_abs_max(x, from_json(contract), axis)


@transformed_abs_max.register_fake
def _(x, contract, axis):
    return x.new_empty((), dtype=torch.float32)
