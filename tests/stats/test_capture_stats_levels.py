"""Statistics levels (TENSOR_SAVE_STATS) and the precision-debug fields, against brute force numpy; the
format docs/extending.md adds with a new element grid among the formats checked."""
import math

import numpy as np
import pytest
import torch
from _extending_guide import GUIDE_FORMAT
from test_capture_quant_stats import brute_force_overflow

from megatron.quant import formats
from megatron.quant.capture.config import SaverConfig
from megatron.quant.stats import LOG2_EDGES, SAMPLE_ELEMENTS, capture_stats, quant_stats, tensor_stats


def wide_range_tensor(rows: int = 24, cols: int = 64) -> torch.Tensor:
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(rows, cols, generator=generator) * torch.logspace(-6, 3, cols)
    x[0, :20] = 0.0  # a block with zeros in it
    x[1, :32] = 0.0  # an all-zero MX block (not counted among the block statistics)
    x[2, 16:32] = 1e-9  # an NVFP4 block whose scale rounds to zero
    return x


def numpy_blocks(values: np.ndarray, axis: int, size: int) -> np.ndarray:
    """[n_blocks, size] with zero padding, blocks running along ``axis`` of a 2-D array."""
    moved = np.moveaxis(values, axis, -1)
    pad = -moved.shape[-1] % size
    moved = np.concatenate([moved, np.zeros(moved.shape[:-1] + (pad,))], axis=-1)
    return moved.reshape(-1, size)


def test_dynamic_range_matches_numpy():
    x = wide_range_tensor()
    x[3, 3] = float("inf")
    a = np.abs(x.numpy().astype(np.float64))
    a = a[np.isfinite(a) & (a > 0)]
    assert tensor_stats(x)["dynamic_range_log2"] == pytest.approx(math.log2(a.max() / a.min()), rel=1e-12)
    assert tensor_stats(torch.zeros(5))["dynamic_range_log2"] is None


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp4_e2m1", "nvfp4", GUIDE_FORMAT], indirect=True)
@pytest.mark.parametrize("axis", [-1, 0])
def test_block_statistics_and_mse_match_brute_force(name, axis):
    fmt = formats.get_format(name)
    x = wide_range_tensor()
    q, scale = fmt.quantize_with_scale(x, axis=axis)
    stats = quant_stats(x, fmt, axis=axis)
    xs, qs = x.numpy().astype(np.float64), q.numpy().astype(np.float64)
    assert stats["mse"] == pytest.approx(((qs - xs) ** 2).mean(), rel=1e-5)
    blocks = numpy_blocks(np.abs(xs), axis, fmt.block_size)
    scales = numpy_blocks(scale.expand_as(x).numpy().astype(np.float64), axis, fmt.block_size)[:, 0]
    used = blocks.max(axis=1) > 0
    ranges = [math.log2(b.max() / b[b > 0].min()) for b in blocks[used]]
    assert stats["block_dynamic_range_log2_max"] == pytest.approx(max(ranges), rel=1e-12)
    assert (stats["block_scale_min"], stats["block_scale_max"]) == (scales[used].min(), scales[used].max())
    positive = scales[used & (scales > 0)]
    assert stats["block_scale_spread_log2"] == pytest.approx(math.log2(positive.max() / positive.min()), rel=1e-12)
    binade = np.floor(np.log2(positive)).astype(int)
    expected = [int((binade < LOG2_EDGES[0]).sum()), *[int((binade == e).sum()) for e in LOG2_EDGES[:-1]],
                int((binade >= LOG2_EDGES[-1]).sum())]
    assert stats["block_scale_hist"] == {"edges": LOG2_EDGES, "counts": expected}
    if name == "nvfp4":
        assert stats["block_scale_min"] == 0.0  # the block whose E4M3 scale rounded to zero


def test_per_tensor_formats_have_no_block_statistics():
    stats = quant_stats(wide_range_tensor(), formats.get_format("fp8_e4m3"))
    assert stats["block_scale_hist"] is None and stats["block_dynamic_range_log2_max"] is None


EXACT = ("numel", "shape", "dtype", "min", "max", "absmax", "zeros", "nans", "infs",
         "overflow", "overflow_ratio", "underflow", "underflow_ratio")


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "nvfp4", "fp8_e4m3", "hifp8", GUIDE_FORMAT], indirect=True)
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("non_finite", [False, True])
def test_cheap_levels_keep_the_counts_exact(name, axis, non_finite):
    fmt = formats.get_format(name)
    x = torch.randn(256, 96, generator=torch.Generator().manual_seed(2)) * torch.logspace(-9, 2, 96)
    x[::7, 5] = 0.0
    if non_finite:
        x[4, 4], x[9, 1], x[20, 0] = float("inf"), -float("inf"), float("nan")
    q, scale = fmt.quantize_with_scale(x, axis=axis)
    values = x.numpy()
    finite = values[np.isfinite(values)]
    brute = {"numel": x.numel(), "shape": [256, 96], "dtype": "float32", "min": float(finite.min()),
             "max": float(finite.max()), "absmax": float(np.abs(finite).max()), "zeros": int((values == 0).sum()),
             "nans": int(np.isnan(values).sum()), "infs": int(np.isinf(values).sum()),
             "overflow": brute_force_overflow(x, scale, fmt),
             "underflow": int(((values != 0) & (q.numpy() == 0)).sum())}
    brute["overflow_ratio"], brute["underflow_ratio"] = brute["overflow"] / x.numel(), brute["underflow"] / x.numel()
    full = capture_stats(x, fmt, axis, q=q, scale=scale, level="full")
    for level in ("counts", "sample"):
        stats = capture_stats(x, fmt, axis, q=q, scale=scale, level=level)
        assert {key: stats[key] for key in EXACT} == brute
        assert stats.keys() == full.keys() and stats["stats_level"] == level
    counts = capture_stats(x, fmt, axis, q=q, scale=scale, level="counts")
    assert counts["sqnr_db"] is None and counts["log2_hist"] is None and counts["stats_sampled"] == 0


def test_sample_level_looks_at_whole_blocks_of_a_fixed_sample():
    fmt = formats.get_format("mxfp8_e4m3")
    x = torch.randn(1024, 64, generator=torch.Generator().manual_seed(3))
    first, again = (capture_stats(x, fmt, axis=0, level="sample") for _ in range(2))
    assert first == again and SAMPLE_ELEMENTS // 2 <= first["stats_sampled"] <= SAMPLE_ELEMENTS
    full = capture_stats(x, fmt, axis=0, level="full")
    assert first["sqnr_db"] == pytest.approx(full["sqnr_db"], abs=0.5)
    assert first["block_scale_max"] <= full["block_scale_max"]
    small = torch.randn(16, 64)
    sampled, exact = (capture_stats(small, fmt, level=level) for level in ("sample", "full"))
    assert {**sampled, "stats_level": "full"} == exact


@pytest.mark.parametrize("name, options", [("nvfp4", {"block_shape": (16, 16)}),
                                           ("fp8_e4m3", {"scaling": "block", "block_shape": (128, 128)})])
def test_sample_level_keeps_tiles_whole(name, options):
    """A sample of a tiled format (16x16 NVFP4, 128x128 FP8 weights) takes whole bands of tile rows: every
    tile here holds the rows 1..side, so its dynamic range is side; a row of it (what a sample whose
    tiles were formed across the wrong dimensions saw as a block) has range 1."""
    fmt = formats.get_format(name, **options)
    side = fmt.block_size
    x = (1.0 + torch.arange(16 * side) % side)[:, None].expand(16 * side, 8 * side).contiguous()
    sampled = capture_stats(x, fmt, axis=-1, level="sample")
    assert sampled["stats_sampled"] < x.numel()
    assert sampled["block_dynamic_range_log2_max"] == math.log2(side)
    assert sampled["block_scale_min"] == sampled["block_scale_max"] == capture_stats(x, fmt, level="full")[
        "block_scale_max"]


def test_statistics_level_is_validated_in_one_line():
    assert SaverConfig.from_env({"TENSOR_SAVE_STATS": "counts"}).stats == "counts"
    with pytest.raises(ValueError, match=r"^TENSOR_SAVE_STATS='fast' is invalid; allowed: counts or sample or full$"):
        SaverConfig.from_env({"TENSOR_SAVE_STATS": "fast"})
    with pytest.raises(ValueError, match="allowed: counts, sample, full"):
        capture_stats(torch.ones(3), level="some")


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp4_e2m1", "nvfp4"])
@pytest.mark.parametrize("axis", [-1, 0])
def test_counts_level_overflow_with_partial_blocks(name, axis):
    fmt = formats.get_format(name)
    x = torch.randn(50, 70, generator=torch.Generator().manual_seed(4)) * 3  # 50 and 70: no whole number of blocks
    q, scale = fmt.quantize_with_scale(x, axis=axis)
    assert capture_stats(x, fmt, axis, q=q, scale=scale, level="counts")["overflow"] == \
        brute_force_overflow(x, scale, fmt)
