"""Mode names and presets: what each expands to, and clear errors for names that are not modes."""
import pytest
import torch

from megatron.quant import formats
from megatron.quant.compare.modes import ESSENTIAL, expand_presets, quantized_formats, resolve_modes


def _changes_values(name: str) -> bool:
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 3
    return not torch.equal(formats.quantize(x, name), x)


def test_essential_is_the_original_list_with_fp32_first():
    assert expand_presets(["essential"]) == ["fp32", "bf16", "hifp8", "mxfp8", "mxfp4"] == list(ESSENTIAL)


def test_quant_only_is_every_format_that_changes_values():
    quant_only = expand_presets(["quant_only"])
    assert quant_only[0] == "fp32"  # the reference always runs, first
    assert sorted(quant_only[1:]) == sorted(name for name in formats.list_formats() if _changes_values(name))


def test_all_adds_the_dtypes_and_drops_duplicates():
    everything = expand_presets(["mxfp4", "all", "bf16"])
    assert everything[:4] == ["fp32", "mxfp4", "bf16", "fp16"]
    assert set(everything) == {"fp32", "bf16", "fp16", *quantized_formats()}
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


@pytest.mark.parametrize("token, message", [
    ("mxfp9", r"unknown mode 'mxfp9'; valid: presets \['all', 'essential', 'quant_only'\], dtypes .*formats .*mxfp4"),
    ("none", r"mode 'none' does no fake quantization; use one of \['fp32', 'bf16', 'fp16'\]"),
])
def test_bad_mode_names_are_clear_errors(token, message):
    with pytest.raises(ValueError, match=message):
        resolve_modes([token])


def test_missing_recipe_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="recipe file .*absent.yaml' does not exist"):
        resolve_modes([str(tmp_path / "absent.yaml")])
