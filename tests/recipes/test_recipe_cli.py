"""``python -m megatron.quant.recipes show``: preset list, operand tables, layers that differ."""
import subprocess
import sys

from megatron.quant.recipes import presets
from megatron.quant.recipes.cli import main


def _show(capsys, *argv):
    code = main(["show", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_show_without_a_name_lists_the_presets(capsys):
    code, out, _ = _show(capsys)
    assert code == 0
    for name in presets.preset_names():
        assert name in out


def test_show_without_a_name_lists_the_plain_format_names_and_their_aliases(capsys):
    from megatron.quant.formats import list_formats

    _, out, _ = _show(capsys)
    listed = out.split("presets (")[0]
    assert listed.startswith("formats (CUSTOM_QUANT_TYPE=NAME")
    assert all(f" {name}," in listed or f" {name}\n" in listed for name in list_formats())
    assert "mxfp8 = mxfp8_e4m3" in listed and "mxfp4 = mxfp4_e2m1" in listed


def test_show_preset_gives_the_operand_table_and_the_source(capsys):
    code, out, _ = _show(capsys, "te-nvfp4", "--num-layers", "4")
    assert code == 0 and "NVFP4BlockScaling" in out and "layers 0-3:" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  ")}
    assert rows["fprop.weight"][:4] == ["fprop.weight", "nvfp4", "16x16", "1"]
    assert "hadamard" in rows["wgrad.input"] and rows["wgrad.grad_output"][-1] == "stochastic8"
    assert rows["fprop.input"][-1] == "nearest"
    assert "core_attention: not quantized" in out


def test_show_recipe_file_separates_the_layers_rules_change(capsys, tmp_path):
    path = tmp_path / "edges.yaml"
    path.write_text("format: te-fp8-current\nrules:\n  - match: {layers: '0,-1'}\n    format: bf16\n")
    code, out, _ = _show(capsys, str(path), "--num-layers", "6")
    assert code == 0 and "recipe edges" in out
    assert "layers 1-4:" in out and "layers 0,5:\n qkv, proj, fc1, fc2: not quantized" in out
    assert "fp8_e5m2" in out


def test_show_format_name_and_refusals(capsys):
    code, out, _ = _show(capsys, "mxfp8", "--num-layers", "1")
    assert code == 0 and "qk.query" in out and "e8m0 block (floor)" in out
    code, _, err = _show(capsys, "te-fp8-lazy")
    assert code == 2 and "te-fp8-lazy" in err and "te-fp8-delayed" in err
    code, out, _ = _show(capsys, "te-fp8-delayed", "--num-layers", "1")
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert code == 0 and "DelayedScaling" in out and "delayed (max of 1024)" in rows["wgrad.grad_output"]
    assert "fp8_e5m2" in rows["wgrad.grad_output"] and "fp8_e4m3" in rows["fprop.weight"]


def test_module_entry_point():
    result = subprocess.run([sys.executable, "-m", "megatron.quant.recipes", "show", "te-mxfp8",
                             "--num-layers", "2"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "rceil" in result.stdout and "MXFP8BlockScaling" in result.stdout
