"""Transformer Engine's statistic names (its precision debug features, ``transformer_engine/debug/features``)
and how each is read from the lab's statistics: ``TE_STATS``, the one table.

A TE statistic is logged once per step for a (layer, tensor): TE folds the micro-batches of the step.
Here each entry says which parts it takes from one capture's statistics (``parts``), how the parts of
several captures fold (``combine``: sums, minima, maxima) and the value from the folded parts
(``final``). ``LogFp8TensorStats``' names carry an optional recipe prefix and ``_columnwise`` suffix
(``mxfp8_underflows%_columnwise``): ``parse_quantized_stat`` splits them; the value is then read from
the what-if statistics of that recipe (``whatif`` in the capture's statistics) instead of the run's.
``markdown_table`` renders the table for docs/capture.md (a test keeps the two equal).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, Mapping, Optional, Sequence

import torch
from torch import Tensor

Fold = Literal["sum", "min", "max"]
Parts = tuple[float, ...]


def _finite_count(s: Mapping) -> int:
    return s["numel"] - s["nans"] - s["infs"]


def _sum_squares(s: Mapping) -> float:
    return _finite_count(s) * (s["std"] ** 2 + s["mean"] ** 2)


def _log2(value: Optional[float]) -> Optional[float]:
    return math.log2(value) if value is not None and 0 < value < math.inf else None


def _min_nonzero_log2(s: Mapping) -> Optional[float]:
    top, spread = _log2(s["absmax"]), s["dynamic_range_log2"]
    return None if top is None or spread is None else top - spread


def _ratio(parts: Parts) -> float:
    return 100.0 * parts[0] / parts[1] if parts[1] else 0.0


@dataclass(frozen=True)
class TeStat:
    """One statistic as TE names it: the features that log it, the lab's field it comes from and
    where the two definitions differ (empty: none)."""

    name: str
    features: tuple[str, ...]
    ours: str
    differs: str
    parts: Callable[[Mapping], Optional[Parts]]  # from one capture's statistics; None: undefined there
    combine: tuple[Fold, ...]
    final: Callable[[Parts], float]


_LOG = ("LogTensorStats",)
_QUANT = ("LogFp8TensorStats", "LogNvfp4TensorStats")
_FIRST: Callable[[Parts], float] = lambda p: p[0]  # noqa: E731

TE_STATS: tuple[TeStat, ...] = (
    TeStat("min", _LOG, "`min`", "ours is over the finite elements", lambda s: (s["min"],), ("min",), _FIRST),
    TeStat("max", _LOG, "`max`", "ours is over the finite elements", lambda s: (s["max"],), ("max",), _FIRST),
    TeStat("mean", _LOG, "`mean`", "", lambda s: (s["mean"] * _finite_count(s), _finite_count(s)),
           ("sum", "sum"), lambda p: p[0] / p[1]),
    TeStat("std", _LOG, "`std`", "ours is the population std (TE's torch.std divides by n - 1)",
           lambda s: (_finite_count(s), s["mean"] * _finite_count(s), _sum_squares(s)), ("sum", "sum", "sum"),
           lambda p: math.sqrt(max(p[2] / p[0] - (p[1] / p[0]) ** 2, 0.0))),
    TeStat("l1_norm", _LOG, "`l1_norm` (TE names only)", "", lambda s: (s["l1_norm"],), ("sum",), _FIRST),
    TeStat("l2_norm", _LOG, "sqrt(n (`std`^2 + `mean`^2))", "", lambda s: (_sum_squares(s),), ("sum",),
           lambda p: math.sqrt(p[0])),
    TeStat("cur_amax", _LOG, "`absmax`", "", lambda s: (s["absmax"],), ("max",), _FIRST),
    TeStat("dynamic_range", _LOG, "`dynamic_range_log2`", "",
           lambda s: (_log2(s["absmax"]), _min_nonzero_log2(s)), ("max", "min"), lambda p: p[0] - p[1]),
    TeStat("max_blockwise_dynamic_range", _LOG, "`max_blockwise_dynamic_range` (TE names only)",
           "TE's blocks, not the format's: `block_size` elements (`dims: 2`: square tiles) of the 2-D view; "
           "the format's own blocks: `block_dynamic_range_log2_max`",
           lambda s: None, ("max",), _FIRST),  # read by its full name (``blockwise_name``), see ``stat_parts``
    TeStat("underflows%", _QUANT, "100 x `underflow_ratio`", "", lambda s: (s["underflow"], s["numel"]),
           ("sum", "sum"), _ratio),
    TeStat("overflows%", ("LogFp8TensorStats",), "100 x `overflow_ratio`",
           "TE counts \\|x\\| > max x scale_inv, for delayed scaling only; ours counts values that round beyond "
           "max, for every format", lambda s: (s["overflow"], s["numel"]), ("sum", "sum"), _ratio),
    TeStat("scale_inv_min", ("LogFp8TensorStats",), "`scale_min` (TE names only)",
           "the smallest nonzero scale, as TE's (which skips the padding of its scale tensors)",
           lambda s: (s["scale_min"],), ("min",), _FIRST),
    TeStat("scale_inv_max", ("LogFp8TensorStats",), "`scale_max` (TE names only)", "",
           lambda s: (s["scale_max"],), ("max",), _FIRST),
    TeStat("mse", _QUANT, "`mse`", "ours averages over the elements finite in x and q (TE: all)",
           lambda s: (s["mse"] * s["numel"], s["numel"]), ("sum", "sum"), lambda p: p[0] / p[1]),
)
TE_STAT = {stat.name: stat for stat in TE_STATS}
# LogFp8TensorStats' recipe prefixes -> the lab's preset for the same TE recipe; LogNvfp4TensorStats' is nvfp4.
TE_RECIPES = {"fp8_delayed_scaling": "te-fp8-delayed", "fp8_current_scaling": "te-fp8-current",
              "mxfp8": "te-mxfp8", "fp8_block_scaling": "te-fp8-blockwise", "nvfp4": "te-nvfp4"}
COLUMNWISE = "_columnwise"
QUANTIZED_STATS = ("underflows%", "overflows%", "scale_inv_min", "scale_inv_max", "mse")


@dataclass(frozen=True)
class QuantizedStat:
    """A ``LogFp8TensorStats``/``LogNvfp4TensorStats`` name split: the TE recipe (None: the run's own),
    the statistic and the orientation."""

    recipe: Optional[str]
    stat: str
    columnwise: bool


def parse_quantized_stat(name: str, feature: str) -> QuantizedStat:
    """``[<recipe>_]<stat>[_columnwise]`` as ``feature`` reads it; ValueError (one line) naming what is
    wrong. LogNvfp4TensorStats takes the bare statistic (underflows%, mse) and means nvfp4."""
    if feature == "LogNvfp4TensorStats":
        if name not in ("underflows%", "mse"):
            raise ValueError(f"LogNvfp4TensorStats stat {name!r} is unknown; TE's: underflows%, mse")
        return QuantizedStat("nvfp4", name, False)
    columnwise = name.endswith(COLUMNWISE)
    base = name[:-len(COLUMNWISE)] if columnwise else name
    recipe = next((r for r in TE_RECIPES if base.startswith(r + "_")), None)
    stat = base[len(recipe) + 1:] if recipe else base
    if recipe == "nvfp4":
        raise ValueError(f"LogFp8TensorStats stat {name!r}: NVFP4 statistics belong to LogNvfp4TensorStats")
    if stat not in QUANTIZED_STATS:
        raise ValueError(f"LogFp8TensorStats stat {name!r} is unknown; TE's: [<recipe>_]<stat>[_columnwise] with "
                         f"<stat> one of {', '.join(QUANTIZED_STATS)} and <recipe> one of "
                         f"{', '.join(r for r in TE_RECIPES if r != 'nvfp4')}")
    if columnwise and recipe in ("fp8_delayed_scaling", "fp8_current_scaling"):
        raise ValueError(f"LogFp8TensorStats stat {name!r}: TE has no columnwise statistics for {recipe}")
    return QuantizedStat(recipe, stat, columnwise)


def logged_name(feature: str, name: str) -> str:
    """The name TE logs a statistic under (``LogNvfp4TensorStats`` prefixes ``nvfp4_``)."""
    return f"nvfp4_{name}" if feature == "LogNvfp4TensorStats" else name


def blockwise_name(block_size: int, dims: int, both_orientations: bool) -> str:
    """TE's name of ``max_blockwise_dynamic_range`` with its options (``BlockwiseDynamicRangeStat``)."""
    suffix = "_max_over_orientations" if both_orientations else ""
    return f"max_blockwise_dynamic_range_block_size_{block_size}_dims_{dims}{suffix}"


def stat_parts(stat: TeStat, stats: Mapping, full_name: str) -> Optional[Parts]:
    """The parts of ``stat`` in one capture's ``stats`` (None when a part is undefined there)."""
    if stat.name == "max_blockwise_dynamic_range":
        value = stats.get(full_name)
        return None if value is None else (value,)
    try:
        parts = stat.parts(stats)
    except (KeyError, TypeError):  # a field the capture has no value for (e.g. null std of an empty tensor)
        return None
    return None if any(p is None for p in parts) else parts


def fold(stat: TeStat, rows: Sequence[Parts]) -> float:
    """The value of ``stat`` over several captures' parts (one step's micro-batches)."""
    ops = {"sum": math.fsum, "min": min, "max": max}
    return stat.final(tuple(ops[how](row[i] for row in rows) for i, how in enumerate(stat.combine)))


def max_blockwise_dynamic_range(x: Tensor, block_size: int, dims: int, both_orientations: bool) -> float:
    """TE's ``compute_max_blockwise_dynamic_range``: on the 2-D view [-1, last dim], the largest
    log2(block amax) - log2(block min nonzero |x|) over blocks of ``block_size`` consecutive elements
    (``dims`` 2: square tiles), 0 for all-zero blocks; the larger of both orientations when asked.
    A ragged edge is padded with zeros (TE requires divisible shapes)."""
    view = x.detach().reshape(-1, x.shape[-1]).abs().float()
    views = (view, view.t()) if both_orientations else (view,)
    return max(_max_block_range(v, block_size, dims) for v in views)


def _max_block_range(view: Tensor, block_size: int, dims: int) -> float:
    rows, cols = view.shape
    side = block_size if dims == 2 else 1
    view = torch.nn.functional.pad(view, (0, -cols % block_size, 0, -rows % side))
    if dims == 2:
        blocks = view.unflatten(1, (-1, block_size)).unflatten(0, (-1, block_size)).transpose(1, 2).flatten(2)
    else:
        blocks = view.unflatten(1, (-1, block_size))
    amax = blocks.amax(-1)
    amin = torch.where(blocks == 0, math.inf, blocks).amin(-1)
    used = amax > 0
    if not bool(used.any()):
        return 0.0
    return float((torch.log2(amax[used]) - torch.log2(amin[used])).max())


def markdown_table() -> str:
    """``TE_STATS`` as the Markdown table of docs/capture.md."""
    lines = ["| TE statistic | TE features | Ours | Where the definitions differ |", "|---|---|---|---|"]
    for stat in TE_STATS:
        lines.append(f"| `{stat.name}` | {', '.join(stat.features)} | {stat.ours} | {stat.differs or 'same'} |")
    return "\n".join(lines)
