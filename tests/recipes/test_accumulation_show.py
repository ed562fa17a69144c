"""``recipes show`` states each recipe's accumulation per linear GEMM and what Transformer Engine runs on
Hopper with the recipe's formats: fprop fast, dgrad and wgrad promoted for per-tensor FP8
(Float8CurrentScaling's MMParams, DelayedScaling's _2X_ACC_* defaults), the split accumulator for FP8
blocks (not modelled), nothing for formats TE has no Hopper FP8 GEMM of."""
import pytest

from megatron.quant.recipes.cli import accumulation_line, load

TE = "fprop fast, dgrad promoted, wgrad promoted"


@pytest.mark.parametrize("name, line", [
    ("fp8_e4m3", f"accumulate: exact FP32 sums; TE on Hopper: {TE}"),
    ("fp8_e5m2+hopper-acc",
     f"accumulate: {TE} (a Hopper FP8 tensor core's accumulator); Transformer Engine's default on Hopper"),
    ("te-fp8-blockwise", "accumulate: exact FP32 sums; TE on Hopper: split accumulator (promoted) in fprop, "
                         "dgrad and wgrad, Float8BlockScaling's only choice; a block-scaled GEMM's accumulator is "
                         "not modelled"),
    ("te-mxfp8", "accumulate: exact FP32 sums"),
    ("te-nvfp4", "accumulate: exact FP32 sums"),
])
def test_the_accumulation_line_says_what_te_runs_on_hopper(name, line):
    assert accumulation_line(load(name), 2) == line


def test_an_accumulation_other_than_te_names_te_s(tmp_path):
    path = tmp_path / "promoted.yaml"
    path.write_text("format: te-fp8-delayed\naccumulate: promoted\n")
    assert accumulation_line(load(str(path)), 2) == (
        f"accumulate: fprop promoted, dgrad promoted, wgrad promoted (a Hopper FP8 tensor core's accumulator); "
        f"TE on Hopper: {TE}")


def test_an_accumulate_mapping_merges_over_the_preset_s_gemm_by_gemm(tmp_path):
    path = tmp_path / "fprop_promoted.yaml"
    path.write_text("format: te-fp8-current+hopper-acc\naccumulate: {fprop: promoted}\n")
    assert load(str(path)).accumulation() == {"fprop": "promoted", "dgrad": "promoted", "wgrad": "promoted"}
    path.write_text("format: te-fp8-current+hopper-acc\naccumulate: exact\n")  # one value: every GEMM
    assert set(load(str(path)).accumulation().values()) == {"exact"}
