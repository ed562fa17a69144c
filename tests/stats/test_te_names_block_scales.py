"""TE's statistic names read from ours, folded over micro-batches, against values written out by hand
and TE's own definitions; per-block scale statistics against hand-computed blocks; the doc's table."""
import math
import pathlib

import pytest
import torch

from megatron.quant import formats
from megatron.quant.stats import capture_stats
from megatron.quant.stats.block_scales import block_scale_stats
from megatron.quant.stats.te_names import (
    TE_STAT,
    fold,
    markdown_table,
    max_blockwise_dynamic_range,
    parse_quantized_stat,
    stat_parts,
)

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "capture.md"


def test_folded_over_micro_batches_as_te_folds_them():
    a, b = torch.tensor([1.0, -2.0, 0.0, 4.0]), torch.tensor([0.5, 3.0, -1.0, 0.25])
    both = torch.cat([a, b])
    rows = {name: [stat_parts(TE_STAT[name], {**capture_stats(x), "l1_norm": float(x.abs().sum())}, name)
                   for x in (a, b)] for name in ("min", "max", "mean", "std", "l1_norm", "l2_norm", "cur_amax",
                                                  "dynamic_range")}
    values = {name: fold(TE_STAT[name], parts) for name, parts in rows.items()}
    assert values["min"] == -2.0 and values["max"] == 4.0 and values["cur_amax"] == 4.0
    assert values["mean"] == pytest.approx(5.75 / 8)
    assert values["std"] == pytest.approx(math.sqrt(sum((v - 5.75 / 8) ** 2 for v in both.tolist()) / 8))
    assert values["l1_norm"] == pytest.approx(11.75) and values["l2_norm"] == pytest.approx(math.sqrt(31.3125))
    assert values["dynamic_range"] == pytest.approx(math.log2(4.0 / 0.25))  # log2(amax) - log2(nonzero amin)


def test_underflows_percent_and_mse_of_a_quantization():
    x = torch.tensor([[1.0, 2.0 ** -20, -3.0, 0.0]])
    fmt = formats.get_format("fp8_e4m3")  # scale 3/448: 2**-20 / scale is below half E4M3's smallest subnormal
    stats = capture_stats(x, fmt)
    assert fold(TE_STAT["underflows%"], [stat_parts(TE_STAT["underflows%"], stats, "")]) == 25.0
    q = fmt.quantize(x)
    mse = fold(TE_STAT["mse"], [stat_parts(TE_STAT["mse"], stats, "")])
    assert mse == pytest.approx(float(((q - x) ** 2).mean()))


def test_max_blockwise_dynamic_range_is_te_definition():
    x = torch.zeros(2, 8)
    x[0, :4] = torch.tensor([8.0, 1.0, 0.0, 2.0])  # block of 4: log2(8/1) = 3
    x[1, 4:] = torch.tensor([0.5, 4.0, 0.25, 1.0])  # log2(4/0.25) = 4
    assert max_blockwise_dynamic_range(x, 4, 1, False) == pytest.approx(4.0)
    # 2x2 tiles: tile (rows 0-1, cols 0-1) holds 8, 1 -> 3; columnwise blocks of 4 never exceed 4 here
    assert max_blockwise_dynamic_range(x, 2, 2, False) == pytest.approx(3.0)
    assert max_blockwise_dynamic_range(x, 2, 1, True) == pytest.approx(3.0)  # 8 over 1 in row 0's first pair


@pytest.mark.parametrize("name,recipe,stat,columnwise", [
    ("underflows%", None, "underflows%", False), ("mxfp8_scale_inv_min_columnwise", "mxfp8", "scale_inv_min", True),
    ("fp8_block_scaling_mse", "fp8_block_scaling", "mse", False)])
def test_stat_names_split_as_te_splits_them(name, recipe, stat, columnwise):
    parsed = parse_quantized_stat(name, "LogFp8TensorStats")
    assert (parsed.recipe, parsed.stat, parsed.columnwise) == (recipe, stat, columnwise)


def test_block_scales_of_mxfp8_by_hand():
    x = torch.zeros(1, 96)
    x[0, :32] = 1.0                      # amax 1: E8M0 floor scale 2**(0 - 8) = 2**-8
    x[0, 32:64] = 2.0 ** -140            # amax far below: the scale sits at E8M0's floor 2**-127
    x[0, 64] = 3.0                       # amax 3: 2**(1 - 8); one nonzero value, zeros elsewhere
    x[0, 65] = 0.75                      # block range log2(3 / 0.75) = 2
    fmt = formats.get_format("mxfp8_e4m3")
    _, scale = fmt.quantize_with_scale(x, axis=-1)
    stats = block_scale_stats(x, fmt, -1, scale)
    assert stats["blocks"] == 3 and stats["at_floor"] == pytest.approx(1 / 3) and stats["at_ceiling"] == 0
    assert stats["scale_min"] == 2.0 ** -127 and stats["scale_max"] == 2.0 ** -7
    assert stats["scale_log2_hist"]["edges"][0] == -127 and sum(stats["scale_log2_hist"]["counts"]) == 3
    assert stats["range_log2_max"] == pytest.approx(2.0) and stats["range_log2_mean"] == pytest.approx(2 / 3)
    assert block_scale_stats(x, formats.get_format("fp8_e4m3"), -1, scale[0, 0]) is None


def test_doc_table_is_the_code_table():
    assert markdown_table() in DOCS.read_text()
