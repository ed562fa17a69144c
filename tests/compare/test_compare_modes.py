"""Mode names and presets: what each expands to, and clear errors for names that are not modes."""
import pytest
import torch

from megatron.quant import formats
from megatron.quant.compare.modes import resolve_modes
from megatron.quant.recipes.sets import ESSENTIAL, expand_sets, quantized_formats


def _changes_values(name: str) -> bool:
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 3
    return not torch.equal(formats.quantize(x, name), x)


def test_essential_is_the_original_list_with_fp32_first():
    assert expand_sets(["essential"]) == ["fp32", "bf16", "hifp8", "mxfp8", "mxfp4"] == list(ESSENTIAL)


def test_quant_only_is_every_fake_quantizing_format():
    quant_only = expand_sets(["quant_only"])
    assert quant_only[0] == "fp32"  # the reference always runs, first
    assert set(quant_only[1:]) == {name for name in formats.list_formats() if not formats.is_passthrough(name)}
    assert all(_changes_values(name) for name in quant_only[1:])


def test_an_alias_of_a_format_already_listed_runs_once():
    assert expand_sets(["essential", "mxfp8_e4m3", "quant_only"])[:5] == list(ESSENTIAL)
    assert expand_sets(["mxfp4_e2m1", "mxfp4"]) == ["fp32", "mxfp4_e2m1"]


def test_all_adds_the_dtypes_and_drops_duplicates():
    everything = expand_sets(["mxfp4", "all", "bf16"])
    assert everything[:4] == ["fp32", "mxfp4", "bf16", "fp16"]
    canonical = {formats.get_format(name).name for name in everything}
    assert canonical == {"fp32", "bf16", "fp16", *quantized_formats()}
    assert len(everything) == len(set(everything))


def test_resolved_modes_carry_dtype_and_kind():
    fp32, bf16, mxfp8 = resolve_modes(["bf16", "mxfp8"], quant_dtype=torch.bfloat16)
    assert (fp32.name, fp32.params_dtype, fp32.kind) == ("fp32", torch.float32, "dtype")
    assert (bf16.params_dtype, bf16.kind) == (torch.bfloat16, "dtype")
    assert (mxfp8.name, mxfp8.params_dtype, mxfp8.kind) == ("mxfp8", torch.bfloat16, "format")


def test_recipe_file_mode_is_named_by_its_recipe(tmp_path):
    path = tmp_path / "fc_only.yaml"
    path.write_text("format: mxfp4\nscope: [linear]\n")
    _, recipe_mode = resolve_modes([str(path)])
    assert (recipe_mode.name, recipe_mode.kind) == ("fc_only", "recipe")


def test_none_is_the_fp32_reference():
    assert [mode.name for mode in resolve_modes(["none", "bf16"])] == ["fp32", "bf16"]


def test_bad_mode_names_are_clear_errors():
    message = r"unknown mode 'mxfp9'; valid: presets \['all', 'essential', 'quant_only'\], dtypes .*formats .*nvfp4"
    with pytest.raises(ValueError, match=message):
        resolve_modes(["mxfp9"])


def test_missing_recipe_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="recipe file .*absent.yaml' does not exist"):
        resolve_modes([str(tmp_path / "absent.yaml")])
