"""``recipes show`` states each recipe's accumulation per linear GEMM and what Transformer Engine runs on
Hopper with the recipe's formats: fprop fast, dgrad and wgrad promoted for per-tensor FP8
(Float8CurrentScaling's MMParams, DelayedScaling's _2X_ACC_* defaults), the split accumulator for FP8
blocks (not modelled), nothing for formats TE has no Hopper FP8 GEMM of."""
import pytest

from megatron.quant.recipes.cli import accumulation_line, load

TE = "fprop fast, dgrad promoted, wgrad promoted"
TE_DEFAULT = (f"accumulate: {TE} (a Hopper FP8 tensor core's accumulator); Transformer Engine's default on Hopper "
              f"(exact sums: accumulate: exact, or the variant -no-hopper-acc)")


@pytest.mark.parametrize("name, line", [
    ("fp8_e4m3", f"accumulate: exact FP32 sums; TE on Hopper: {TE}"),
    ("fp8_e5m2+hopper-acc", TE_DEFAULT),
    ("te-fp8-current", TE_DEFAULT),  # the FP8 presets accumulate as TE does on Hopper
    ("te-fp8-delayed", TE_DEFAULT),
    ("te-fp8-current-no-hopper-acc", f"accumulate: exact FP32 sums; TE on Hopper: {TE}"),
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
    path.write_text("format: te-fp8-current\naccumulate: {fprop: promoted}\n")
    assert load(str(path)).accumulation() == {"fprop": "promoted", "dgrad": "promoted", "wgrad": "promoted"}
    path.write_text("format: te-fp8-current\naccumulate: exact\n")  # one value: every GEMM
    assert set(load(str(path)).accumulation().values()) == {"exact"}


def test_custom_quant_accumulate_exact_turns_the_presets_accumulation_off():
    from megatron.quant.recipes.recipe import QuantRecipe

    hopper = {"fprop": "fast", "dgrad": "promoted", "wgrad": "promoted"}
    for value, expected in (("", hopper), ("te", hopper), ("exact", dict.fromkeys(hopper, "exact"))):
        env = {"CUSTOM_QUANT_TYPE": "te-fp8-delayed", "CUSTOM_QUANT_ACCUMULATE": value}
        assert QuantRecipe.from_env(env).accumulation() == expected, value


def test_custom_quant_accumulate_refuses_other_values_in_one_line():
    from megatron.quant.recipes.parse import RecipeError
    from megatron.quant.recipes.recipe import QuantRecipe

    with pytest.raises(RecipeError, match=r"^CUSTOM_QUANT_ACCUMULATE='fast' is not one of te, exact \(") as caught:
        QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": "te-fp8-current", "CUSTOM_QUANT_ACCUMULATE": "fast"})
    assert "\n" not in str(caught.value)


def test_the_hopper_acc_component_removed_gives_exact_sums_and_an_ablation_runs_both():
    from megatron.quant.recipes.ablations import AblationError, ablation, get_variant

    assert "te-fp8-current-no-hopper-acc" in ablation("te-fp8-current")
    assert "te-fp8-delayed-no-hopper-acc" in ablation("te-fp8-delayed")
    assert "accumulate" not in get_variant("te-fp8-current-no-hopper-acc")
    with pytest.raises(AblationError, match="has 'hopper-acc'.*already; remove it with te-fp8-current-no-hopper-acc"):
        get_variant("te-fp8-current+hopper-acc")
