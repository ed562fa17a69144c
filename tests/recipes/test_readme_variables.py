"""The README's variable table says what CUSTOM_QUANT_TYPE takes: the formats and presets it names are ones
``python -m megatron.quant.recipes show`` lists, and each of them builds a recipe from the variable."""
import re
from pathlib import Path

from megatron.quant.recipes.cli import main as recipes_cli
from megatron.quant.recipes.recipe import QuantRecipe

REPO = Path(__file__).resolve().parents[2]


def _row(name: str) -> str:
    [row] = [line for line in (REPO / "README.md").read_text().splitlines() if line.startswith(f"| `{name}`")]
    return row


def test_custom_quant_type_names_formats_and_presets_that_recipes_show_lists(capsys):
    row = _row("CUSTOM_QUANT_TYPE")
    assert "python -m megatron.quant.recipes show" in row and "preset" in row
    named = [name for name in re.findall(r"`([\w.-]+)`", row) if name != "CUSTOM_QUANT_TYPE"]
    assert recipes_cli(["show"]) == 0
    shown = capsys.readouterr().out
    listed = set(re.findall(r"[\w.+-]+", shown))
    assert {"te-mxfp8", "te-nvfp4", "hifp8", "mxfp8"} <= set(named)
    for name in named:
        assert name in listed, f"README names {name!r}, which recipes show does not list"
        assert QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": name}).name
