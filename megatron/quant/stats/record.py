"""The keys of a statistics record: what ``tensor_stats`` and ``quant_stats`` return, what a capture's
manifest records and what the reports read, each derived from packed fields (``packing.FIELDS``).

The record is one table, ``KEYS``: a key's name, its group (``tensor``: every record; ``quant``:
with a format; ``block``: with a block format, None for others), the packed fields it reads (and
``numel``) and how its value follows from them. Whether a key is exact at every capture level follows
from what it reads: a key that reads only counts-level fields is taken at the counts level too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Mapping, Optional

from megatron.quant.stats import packing

Group = Literal["tensor", "quant", "block"]
GROUPS: tuple[Group, ...] = ("tensor", "quant", "block")
NUMEL = "numel"  # what a key may read beside the fields: the tensor's element count


@dataclass(frozen=True)
class Key:
    """One key of the record: ``derive`` takes the values of ``reads`` (fields, or ``numel``) in order;
    a histogram field's value is its list of counts."""

    name: str
    group: Group
    reads: tuple[str, ...]
    derive: Callable[..., Any]


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
    return {"edges": packing.LOG2_EDGES, "counts": [int(c) for c in counts]}


def _share(count: float, numel: int) -> Optional[float]:
    return int(count) / numel if numel else None


def _sqnr_db(signal: float, noise: float) -> Optional[float]:
    if signal <= 0:
        return None
    return 10 * math.log10(signal / noise) if noise > 0 else math.inf


_FINITE = (NUMEL, "nans", "infs")
KEYS = (
    Key("min", "tensor", ("min", *_FINITE), _if_finite(lambda lo: lo)),
    Key("max", "tensor", ("max", *_FINITE), _if_finite(lambda hi: hi)),
    Key("mean", "tensor", ("sum", *_FINITE), lambda total, *n: total / _finite(*n) if _finite(*n) else None),
    Key("std", "tensor", ("sum", "sum_squares", *_FINITE), _std),
    Key("absmax", "tensor", ("min", "max", *_FINITE), _if_finite(lambda lo, hi: max(abs(lo), abs(hi)))),
    Key("dynamic_range_log2", "tensor", ("min", "max", "min_nonzero", *_FINITE),
        _if_finite(lambda lo, hi, low: log2_ratio(max(abs(lo), abs(hi)), low))),
    Key("zeros", "tensor", ("nonzero", NUMEL), lambda nonzero, numel: numel - int(nonzero)),
    Key("nans", "tensor", ("nans",), int),
    Key("infs", "tensor", ("infs",), int),
    Key("log2_hist", "tensor", ("log2_hist",), _histogram),
    Key("overflow", "quant", ("overflow",), int),
    Key("overflow_ratio", "quant", ("overflow", NUMEL), _share),
    Key("underflow", "quant", ("underflow",), int),
    Key("underflow_ratio", "quant", ("underflow", NUMEL), _share),
    Key("rel_mse", "quant", ("signal", "noise"), lambda signal, noise: noise / signal if signal > 0 else None),
    Key("sqnr_db", "quant", ("signal", "noise"), _sqnr_db),
    Key("cosine", "quant", ("dot", "signal", "q_power"),
        lambda dot, signal, q_power: dot / math.sqrt(signal * q_power) if signal > 0 and q_power > 0 else None),
    Key("mse", "quant", ("noise", "both_finite"), lambda noise, count: noise / count if count > 0 else None),
    # Over the blocks holding a nonzero finite value (none: the fields keep their identities, the keys None).
    Key("block_dynamic_range_log2_max", "block", ("block_range_max",),
        lambda ratio: math.log2(ratio) if ratio >= 1 else None),
    Key("block_scale_min", "block", ("block_scale_min",), lambda scale: scale if math.isfinite(scale) else None),
    Key("block_scale_max", "block", ("block_scale_max",), lambda scale: scale if math.isfinite(scale) else None),
    Key("block_scale_spread_log2", "block", ("block_scale_max", "block_scale_positive_min"), log2_ratio),
    Key("block_scale_hist", "block", ("scale_hist",), _histogram),
)


def names(*groups: Group, exact: bool = False) -> tuple[str, ...]:
    """The keys of ``groups`` in the record's order (``exact``: only those exact at every level)."""
    return tuple(key.name for key in KEYS if key.group in groups and (not exact or is_exact(key)))


def scalar_names(*groups: Group) -> tuple[str, ...]:
    """The keys of ``groups`` whose value is a number (those that read no histogram)."""
    widths = {f.name: f.width for f in packing.layout().fields}
    return tuple(key.name for key in KEYS
                 if key.group in groups and all(widths.get(name, 1) == 1 for name in key.reads))


def is_exact(key: Key) -> bool:
    """True when ``key`` reads only counts-level fields: every capture level takes it over every element."""
    counts = {f.name for f in packing.layout().fields if f.level == "counts"}
    return all(name == NUMEL or name in counts for name in key.reads)


def derive(values: Mapping[str, Any], numel: int, groups: Iterable[Group], exact: bool = False) -> dict:
    """The keys of ``groups`` from the fields' ``values`` (``packing.Layout.values``) of a tensor of
    ``numel`` elements; ``exact``: only the exact keys (``values`` may then hold the counts prefix only)."""
    given = {**values, NUMEL: numel}
    return {key.name: key.derive(*(given[name] for name in key.reads)) for key in KEYS
            if key.group in groups and (not exact or is_exact(key))}


def record_keys(groups: Iterable[Group]) -> tuple[str, ...]:
    """Every key a record of ``groups`` holds, the element count, shape and dtype first."""
    return (NUMEL, "shape", "dtype", *names(*groups))
