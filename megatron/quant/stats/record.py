"""The statistics schema: every statistic declared once, and everything else derived from it.

Three tables:

- ``FIELDS``, the packed fields (``packing``'s layout, in order): a field's name, how rows of tiles,
  blocks and ranks combine it, the capture level from which it is exact, its width, and the functions
  that compute it, by name, on each path: ``torch`` (``stats.reference``) and ``kernel``
  (``kernels.stats``). A name is either a function that writes the field out itself (``WRITERS`` of
  each module) or the key of its element term (``TERMS`` of each module), reduced as it combines. Every
  field is float64 in the packed vector; a count is an integer, exact below 2**53. The kernels take a
  count in int32 and a minimum or maximum in float32 (exact: float64 only carries them); a sum needs
  float64 in the kernel too, since ``packing``'s order rounds each pair's sum there.
- ``KEYS``, the keys of a record (what ``tensor_stats``, ``quant_stats`` and a capture's manifest hold):
  a key's name, its group (``tensor``: every record; ``quant``: with a format; ``block``: with a block
  format, None for others), the fields it reads (and ``numel``), how its value follows from them, and
  the views that keep it besides the manifest (``VIEWS``). A key is exact at every capture level when
  it reads only counts-level fields.
- ``BLOCK_KEYS``, the per-block statistics of a block-scaled operand (``block_scales``, a capture's
  ``block_scales`` entry): a key's name and its value from the used blocks (``Blocks``).

The packed layout, the fields the kernels write out, the record's keys at each level and a what-if
record's keys derive from these tables as they stand when called (a row added later shows everywhere);
the capture report's summary columns and the capture's iteration means as they stand when their modules load.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Mapping, NamedTuple, Optional

import torch
from torch import Tensor

# Histogram of log2|x| over the nonzero finite values: bin k (1..60) holds 2**(LOG2_LOW+k-1) <= |x| <
# 2**(LOG2_LOW+k); bin 0 holds those below 2**LOG2_LOW, bin 61 those at or above 2**LOG2_HIGH.
LOG2_LOW, LOG2_HIGH = -40, 20
LOG2_EDGES = list(range(LOG2_LOW, LOG2_HIGH + 1))
N_BINS = len(LOG2_EDGES) + 1

Combine = Literal["sum", "min", "max"]
"""How a field of several rows (tiles, blocks, ranks) folds into one: counts and sums add, extremes
take the smaller or the larger."""
Level = Literal["counts", "full"]
"""The capture level from which a field is exact: ``counts`` (every level; the counts kernels write it
too) or ``full`` (only a full pass has it)."""


@dataclass(frozen=True)
class Field:
    """One packed field: ``torch`` and ``kernel`` name the function of ``stats.reference`` and of
    ``kernels.stats`` that computes it (one of the module's ``WRITERS``, or a key of its ``TERMS``)."""

    name: str
    combine: Combine
    level: Level
    torch: str
    kernel: str
    width: int = 1

    @property
    def exact(self) -> bool:
        """True when every capture level takes the field over every element."""
        return self.level == "counts"


def _fields(names: str, combine: Combine, level: Level, torch: str, kernel: str) -> tuple[Field, ...]:
    return tuple(Field(name, combine, level, torch, kernel) for name in names.split())


# The layout, in order; the exact fields (capture's counts level) come first, so the counts kernels
# write a prefix of it. nans, infs, nonzero of x; underflow: x != 0 quantized to 0; overflow: Inf, or
# |x / scale| beyond the format's saturation bound where the scale is not 0; min and max of the finite
# elements. both_finite: elements finite in x and in q, over which signal = sum x^2, noise =
# sum (q - x)^2, dot = sum x q and q_power = sum q^2 run; sum and sum_squares run over the finite x;
# min_nonzero: the smallest nonzero finite |x| (an element term).
# Over the blocks holding a nonzero finite value ("used"): the largest block absmax / block min
# nonzero |x| (0 when none), their scales' min and max, the min of their positive scales. Then the
# log2 histograms of the nonzero finite x and of the used blocks' positive scales.
FIELDS: tuple[Field, ...] = (
    *_fields("nans infs nonzero underflow overflow", "sum", "counts", "_tile_row", "write_stats"),
    Field("min", "min", "counts", "_tile_row", "write_stats"),
    Field("max", "max", "counts", "_tile_row", "write_stats"),
    *_fields("both_finite sum sum_squares signal noise dot q_power", "sum", "full", "_tile_row", "write_sums"),
    Field("min_nonzero", "min", "full", "min_nonzero", "min_nonzero_term"),
    *_fields("block_scale_min block_scale_positive_min", "min", "full", "_block_fields", "write_block_stats"),
    *_fields("block_range_max block_scale_max", "max", "full", "_block_fields", "write_block_stats"),
    Field("log2_hist", "sum", "full", "_tile_row", "write_sums", N_BINS),
    Field("scale_hist", "sum", "full", "_block_fields", "write_block_stats", N_BINS),
)

Group = Literal["tensor", "quant", "block"]
GROUPS: tuple[Group, ...] = ("tensor", "quant", "block")
View = Literal["summary", "whatif", "iteration"]
"""Where a key is kept besides the manifest: ``summary``, the capture report's summary of every capture
(its statistics figures and the first columns of ``statistics/tensor_summary.csv``; the csv lists every
numeric key after them); ``whatif``, a what-if record (the same operand under another format);
``iteration``, the capture's per-iteration means for logs and TensorBoard (``quant/<role>/<tensor>/<key>``,
and ``whatif/<format>/<role>/<tensor>/<key>`` for those a what-if record holds)."""
VIEWS: tuple[View, ...] = ("summary", "whatif", "iteration")
NUMEL = "numel"  # what a key may read beside the fields: the tensor's element count; every record's first key


@dataclass(frozen=True)
class Key:
    """One key of the record: ``derive`` takes the values of ``reads`` (fields, or ``numel``) in order;
    a histogram field's value is its list of counts."""

    name: str
    group: Group
    reads: tuple[str, ...]
    derive: Callable[..., Any]
    views: tuple[View, ...] = ()


def _finite(numel: int, nans: float, infs: float) -> int:
    return numel - int(nans) - int(infs)


def _if_finite(value: Callable[..., Any]) -> Callable[..., Any]:
    """``value`` of the fields before the trailing (numel, nans, infs), None without a finite element."""
    return lambda *args: value(*args[:-3]) if _finite(*args[-3:]) else None


def _std(total: float, squares: float, numel: int, nans: float, infs: float) -> Optional[float]:
    n_finite = _finite(numel, nans, infs)
    if not n_finite:
        return None
    mean = total / n_finite
    return math.sqrt(max(squares / n_finite - mean * mean, 0.0))


def log2_ratio(high: float, low: float) -> Optional[float]:
    """log2(high / low) for 0 < low <= high < Inf, else None (in float64: the ratio of two
    float32 extremes may exceed float32's range)."""
    if not (0 < low <= high < math.inf):
        return None
    return math.log2(high) - math.log2(low)


def _histogram(counts: list[float]) -> dict:
    return {"edges": LOG2_EDGES, "counts": [int(c) for c in counts]}


def _share(count: float, numel: int) -> Optional[float]:
    return int(count) / numel if numel else None


def _sqnr_db(signal: float, noise: float) -> Optional[float]:
    if signal <= 0:
        return None
    return 10 * math.log10(signal / noise) if noise > 0 else math.inf


_FINITE = (NUMEL, "nans", "infs")
_SUMMARY: tuple[View, ...] = ("summary",)
_WHATIF: tuple[View, ...] = ("whatif",)
_BOTH: tuple[View, ...] = ("summary", "whatif")
_ALL: tuple[View, ...] = VIEWS
KEYS: tuple[Key, ...] = (
    Key("min", "tensor", ("min", *_FINITE), _if_finite(lambda lo: lo), _SUMMARY),
    Key("max", "tensor", ("max", *_FINITE), _if_finite(lambda hi: hi), _SUMMARY),
    Key("mean", "tensor", ("sum", *_FINITE), lambda total, *n: total / _finite(*n) if _finite(*n) else None, _SUMMARY),
    Key("std", "tensor", ("sum", "sum_squares", *_FINITE), _std, _SUMMARY),
    Key("absmax", "tensor", ("min", "max", *_FINITE), _if_finite(lambda lo, hi: max(abs(lo), abs(hi))), _SUMMARY),
    Key("dynamic_range_log2", "tensor", ("min", "max", "min_nonzero", *_FINITE),
        _if_finite(lambda lo, hi, low: log2_ratio(max(abs(lo), abs(hi)), low)), ("iteration",)),
    Key("zeros", "tensor", ("nonzero", NUMEL), lambda nonzero, numel: numel - int(nonzero), _SUMMARY),
    Key("nans", "tensor", ("nans",), int, _BOTH),
    Key("infs", "tensor", ("infs",), int, _BOTH),
    Key("log2_hist", "tensor", ("log2_hist",), _histogram),
    Key("overflow", "quant", ("overflow",), int, _WHATIF),
    Key("overflow_ratio", "quant", ("overflow", NUMEL), _share, _ALL),
    Key("underflow", "quant", ("underflow",), int, _WHATIF),
    Key("underflow_ratio", "quant", ("underflow", NUMEL), _share, _ALL),
    Key("rel_mse", "quant", ("signal", "noise"), lambda signal, noise: noise / signal if signal > 0 else None, _ALL),
    Key("sqnr_db", "quant", ("signal", "noise"), _sqnr_db, _ALL),
    Key("cosine", "quant", ("dot", "signal", "q_power"),
        lambda dot, signal, q_power: dot / math.sqrt(signal * q_power) if signal > 0 and q_power > 0 else None,
        _SUMMARY),
    Key("mse", "quant", ("noise", "both_finite"), lambda noise, count: noise / count if count > 0 else None,
        ("whatif", "iteration")),
    # Over the blocks holding a nonzero finite value (none: the fields keep their identities, the keys None).
    Key("block_dynamic_range_log2_max", "block", ("block_range_max",),
        lambda ratio: math.log2(ratio) if ratio >= 1 else None),
    Key("block_scale_min", "block", ("block_scale_min",), lambda scale: scale if math.isfinite(scale) else None),
    Key("block_scale_max", "block", ("block_scale_max",), lambda scale: scale if math.isfinite(scale) else None),
    Key("block_scale_spread_log2", "block", ("block_scale_max", "block_scale_positive_min"), log2_ratio),
    Key("block_scale_hist", "block", ("scale_hist",), _histogram),
)


def key_names(*groups: Group, exact: bool = False, view: Optional[View] = None) -> tuple[str, ...]:
    """The keys of ``groups`` (default: all) in the record's order; ``exact``: only those exact at every
    level; ``view``: only those that view keeps."""
    return tuple(key.name for key in KEYS if (not groups or key.group in groups)
                 and (not exact or is_exact(key)) and (view is None or view in key.views))


def scalar_names(*groups: Group) -> tuple[str, ...]:
    """The keys of ``groups`` whose value is a number (those that read no histogram)."""
    widths = {f.name: f.width for f in FIELDS}
    return tuple(key.name for key in KEYS
                 if key.group in groups and all(widths.get(name, 1) == 1 for name in key.reads))


def is_exact(key: Key) -> bool:
    """True when ``key`` reads only counts-level fields: every capture level takes it over every element."""
    exact = {f.name for f in FIELDS if f.exact}
    return all(name == NUMEL or name in exact for name in key.reads)


def derive(values: Mapping[str, Any], numel: int, groups: Iterable[Group], exact: bool = False) -> dict:
    """The keys of ``groups`` from the fields' ``values`` (``packing.Layout.values``) of a tensor of
    ``numel`` elements; ``exact``: only the exact keys (``values`` may then hold the counts prefix only)."""
    given = {**values, NUMEL: numel}
    return {key.name: key.derive(*(given[name] for name in key.reads)) for key in KEYS
            if key.group in groups and (not exact or is_exact(key))}


def record_keys(groups: Iterable[Group]) -> tuple[str, ...]:
    """Every key a record of ``groups`` holds, the element count, shape and dtype first."""
    return (NUMEL, "shape", "dtype", *key_names(*groups))


class Blocks(NamedTuple):
    """The used blocks of a block-scaled operand (those holding a nonzero finite value), in one order:
    their scales (float64), the scales as the format stores them, the stored scale's floor and
    ceiling, log2 of the positive scales, and each block's log2(absmax / min nonzero |x|)."""

    scales: Tensor
    stored: Tensor
    floor: float
    ceiling: float
    log2_scales: Tensor
    ranges: Tensor


@dataclass(frozen=True)
class BlockKey:
    """One per-block statistic: its value from the used blocks (``Blocks``; at least one)."""

    name: str
    derive: Callable[[Blocks], Any]
    histogram: bool = False


def integer_histogram(values: Tensor) -> dict:
    """Counts per integer bin floor(value): ``edges`` the bins' lower ends, over the bins used."""
    if values.numel() == 0:
        return {"edges": [], "counts": []}
    bins = torch.floor(values).long()
    low = int(bins.min())
    counts = torch.bincount(bins - low)
    return {"edges": list(range(low, low + counts.numel())), "counts": counts.tolist()}


def _share_of(mask: Tensor, blocks: Blocks) -> float:
    return float(mask.count_nonzero()) / blocks.scales.numel()


def _if_positive(value: Callable[[Tensor], Tensor]) -> Callable[[Blocks], Optional[float]]:
    """``value`` of the log2 positive scales, None without a positive scale."""
    return lambda b: float(value(b.log2_scales)) if b.log2_scales.numel() else None


BLOCK_COUNT = "blocks"  # the used blocks: 0 leaves every other block key None
BLOCK_KEYS: tuple[BlockKey, ...] = (
    BlockKey(BLOCK_COUNT, lambda b: b.scales.numel()),
    BlockKey("scale_min", lambda b: float(b.scales.min())),
    BlockKey("scale_max", lambda b: float(b.scales.max())),
    BlockKey("scale_std", lambda b: float(b.scales.std(unbiased=False))),
    BlockKey("scale_log2_mean", _if_positive(torch.mean)),
    BlockKey("scale_log2_std", _if_positive(lambda v: v.std(unbiased=False))),
    BlockKey("at_floor", lambda b: _share_of(b.stored <= b.floor, b)),
    BlockKey("at_ceiling", lambda b: _share_of(b.stored >= b.ceiling, b)),
    BlockKey("scale_log2_hist", lambda b: integer_histogram(b.log2_scales), histogram=True),
    BlockKey("range_log2_max", lambda b: float(b.ranges.max())),
    BlockKey("range_log2_mean", lambda b: float(b.ranges.mean())),
    BlockKey("range_log2_hist", lambda b: integer_histogram(b.ranges), histogram=True),
)


def block_key_names(histograms: bool = True) -> tuple[str, ...]:
    """The per-block statistics' keys in order (``histograms``: with the histograms)."""
    return tuple(key.name for key in BLOCK_KEYS if histograms or not key.histogram)


def derive_blocks(blocks: Optional[Blocks]) -> dict:
    """The per-block statistics from the used blocks (None: no block is used)."""
    if blocks is None or not blocks.scales.numel():
        return {**dict.fromkeys(block_key_names()), BLOCK_COUNT: 0}
    return {key.name: key.derive(blocks) for key in BLOCK_KEYS}
