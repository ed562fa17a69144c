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

from . import amax, blocks, elementwise
from .stats import abs_max_rows, stats_rows

_NOTHING = (0,)  # the shape of an output that was not asked for


def _empty(x: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    return x.new_empty(_NOTHING, dtype=dtype)


# --- elementwise formats -------------------------------------------------------------------------

@torch.library.custom_op("megatron_quant::elementwise", mutates_args=())
def quantize_elementwise(x: Tensor, encode: Optional[Tensor], decode: Optional[Tensor], noise: list[int],
                         contract: str, out_dtype: torch.dtype, stats: int, take_amax: bool
                         ) -> tuple[Tensor, Tensor, Tensor]:
    """(contiguous x quantized by the contract in ``out_dtype``, the programs' rows of statistics
    with ``stats``, x's amax rows with ``take_amax``): ``elementwise.launch``."""
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    amax_rows = abs_max_rows(elementwise.programs(x), x.device) if take_amax else None
    rows = elementwise.launch(x, out, from_json(contract), encode, decode, tuple(noise), stats, amax_rows)
    return out, _empty(x, torch.float64) if rows is None else rows, _empty(x) if amax_rows is None else amax_rows


@quantize_elementwise.register_fake
def _(x, encode, decode, noise, contract, out_dtype, stats, take_amax):
    programs = elementwise.programs(x)
    return (x.new_empty(x.shape, dtype=out_dtype),
            stats_rows(programs, stats, x.device) if stats else _empty(x, torch.float64),
            abs_max_rows(programs, x.device) if take_amax else _empty(x))


@torch.library.custom_op("megatron_quant::elementwise_tensor_scaled", mutates_args=())
def quantize_elementwise_tensor_scaled(x: Tensor, noise: list[int], contract: str, out_dtype: torch.dtype,
                                       split: bool) -> tuple[Tensor, Tensor]:
    """(contiguous x quantized by the contract with a per-tensor scale from x's own amax, the scale's
    0-d float32 decode factor) in two launches, nothing between them: the amax kernel's rows
    (``amax.abs_max_rows_of``), then the quantizing kernel, which folds them into the scale
    (``elementwise.tensor_scale``). ``split``: the values leave the decode factor out."""
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    decode = torch.empty((), dtype=torch.float32, device=x.device)
    rules = from_json(contract)
    rows = amax.abs_max_rows_of(x, rules.nonfinite_te)
    elementwise.launch(x, out, rules, None, decode, tuple(noise), fold_rows=rows, split=split)
    return out, decode


@quantize_elementwise_tensor_scaled.register_fake
def _(x, noise, contract, out_dtype, split):
    return x.new_empty(x.shape, dtype=out_dtype), x.new_empty((), dtype=torch.float32)


# --- block formats -------------------------------------------------------------------------------

@torch.library.custom_op("megatron_quant::blocks", mutates_args=())
def quantize_blocks(x: Tensor, tensor: Optional[Tensor], noise: list[int], contract: str, axis: int, split: bool,
                    stats: int, transform: Optional[str], out_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """(contiguous x quantized by a block format's contract in ``out_dtype``, with ``stats`` the
    blocks' scales in block order and the programs' rows of statistics): ``blocks.launch_blocks``."""
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    captured = blocks.launch_blocks(x, out, from_json(contract), axis, tuple(noise), tensor, split, stats, transform)
    if captured is None:
        return out, _empty(x), _empty(x, torch.float64)
    return out, *captured


@quantize_blocks.register_fake
def _(x, tensor, noise, contract, axis, split, stats, transform, out_dtype):
    shape, layout = blocks.block_walk(x, from_json(contract), axis)
    programs = triton.cdiv(shape[0], layout.columns)
    if not stats:
        return x.new_empty(x.shape, dtype=out_dtype), _empty(x), _empty(x, torch.float64)
    return (x.new_empty(x.shape, dtype=out_dtype), x.new_empty((shape[0],), dtype=torch.float32),
            stats_rows(programs, stats, x.device))


@torch.library.custom_op("megatron_quant::blocks_both_axes", mutates_args=())
def quantize_blocks_both_axes(x: Tensor, tensor: Optional[Tensor], noise0: list[int], noise1: list[int],
                              contract: str, split: bool) -> tuple[Tensor, Tensor]:
    """Contiguous x quantized along axis -2 and along axis -1 from one read: ``blocks.launch_dual``."""
    out0, out1 = torch.empty_like(x), torch.empty_like(x)
    blocks.launch_dual(x, out0, out1, from_json(contract), (tuple(noise0), tuple(noise1)), tensor, split)
    return out0, out1


@quantize_blocks_both_axes.register_fake
def _(x, tensor, noise0, noise1, contract, split):
    return torch.empty_like(x), torch.empty_like(x)


# --- amaxes --------------------------------------------------------------------------------------

@torch.library.custom_op("megatron_quant::abs_max", mutates_args=())
def abs_max(x: Tensor, skip_nan: bool) -> Tensor:
    """max |x| (0-d, x's dtype) in one read: ``amax.abs_max``."""
    return amax.abs_max(x, skip_nan)


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
