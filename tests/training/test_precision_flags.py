"""Megatron-LM's precision flags (--fp8-recipe, --fp4-format, ...) mapped onto emulated recipes."""
import pytest

from megatron.quant.recipes.operands import LINEAR_OPERANDS
from megatron.quant.recipes.presets import GRADIENTS, WGRAD, PresetError, recipe_from_megatron_flags
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.training.arguments import ArgumentError, parse_args, validate_args
from megatron.quant.training.main import check_inputs
from megatron.quant.training.run_config import build_recipe

TINY = ["--model", "llama-tiny", "--mock-data", "--train-iters", "2", "--bf16"]
LAYERS = 4


def _recipe(*flags):
    data = recipe_from_megatron_flags(parse_args(TINY + list(flags)))
    return None if data is None else QuantRecipe.from_dict(data)


def _formats(recipe, layer=1):
    return {k: None if f is None else f.name for k, f in recipe.resolve("fc1", layer, LAYERS).items()}


def _all(name, e5m2_gradients=None):
    return {k: e5m2_gradients if e5m2_gradients and k in GRADIENTS else name for k in LINEAR_OPERANDS}


@pytest.mark.parametrize("flags, name, expected", [
    (["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"], "te-fp8-current", _all("fp8_e4m3", "fp8_e5m2")),
    (["--fp8-format", "e4m3", "--fp8-recipe", "tensorwise"], "te-fp8-current-e4m3", _all("fp8_e4m3")),
    (["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"], "te-mxfp8", _all("mxfp8_e4m3")),
    (["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"], "te-mxfp8-hybrid", _all("mxfp8_e4m3", "mxfp8_e5m2")),
    (["--fp8-format", "e4m3", "--fp8-recipe", "blockwise"], "te-fp8-blockwise", _all("fp8_e4m3")),
    (["--fp4-format", "e2m1"], "te-nvfp4", _all("nvfp4")),
    (["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"], "te-nvfp4", _all("nvfp4")),
    (["--fp4-format", "e2m1", "--no-fp8-wgrad"], "te-nvfp4-no-wgrad",
     {k: None if k in WGRAD else "nvfp4" for k in LINEAR_OPERANDS}),
])
def test_flag_mapping(flags, name, expected):
    recipe = _recipe(*flags)
    assert recipe.name == name and _formats(recipe) == expected
    assert set(recipe.resolve("core_attention", 1, LAYERS).values()) == {None}


def test_hybrid_mxfp8_gradients_keep_the_rceil_scales():
    fmts = _recipe("--fp8-format", "hybrid", "--fp8-recipe", "mxfp8").resolve("qkv", 0, LAYERS)
    assert {f.options["scale_mode"] for f in fmts.values()} == {"rceil"}


def _delayed_options(recipe):
    return {(f.name, f.scaling, f.options["amax_history_len"], f.options["amax_compute_algo"], f.options["margin"])
            for f in recipe.resolve("fc2", 0, LAYERS).values()}


def test_hybrid_blockwise_puts_the_gradients_in_e5m2_1x128_blocks():
    """TE accepts HYBRID for Float8BlockScaling: its ``__post_init__`` asserts only
    ``fp8_format != Format.E5M2`` (TE d0067d0, ``transformer_engine/common/recipe/__init__.py``
    line 464), and HYBRID's backward format is E5M2 (lines 49-50)."""
    recipe = _recipe("--fp8-format", "hybrid", "--fp8-recipe", "blockwise")
    assert recipe.name == "te-fp8-blockwise-hybrid" and _formats(recipe) == _all("fp8_e4m3", "fp8_e5m2")
    fmts = recipe.resolve("fc1", 1, LAYERS)
    assert {k: (f.scaling, f.block_shape, f.options["power_of_two_scales"]) for k, f in fmts.items()} == {
        k: ("block", (128, 128) if k in ("fprop.weight", "dgrad.weight") else (1, 128), True) for k in fmts}


def test_delayed_takes_megatron_defaults_and_its_flags():
    recipe = _recipe("--fp8-format", "hybrid", "--fp8-recipe", "delayed")
    assert recipe.name == "te-fp8-delayed-len1-most-recent"
    assert _delayed_options(recipe) == {("fp8_e4m3", "delayed", 1, "most_recent", 0),
                                        ("fp8_e5m2", "delayed", 1, "most_recent", 0)}
    recipe = _recipe("--fp8-format", "e4m3", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "16",
                     "--fp8-amax-compute-algo", "max", "--fp8-margin", "2")
    assert recipe.name == "te-fp8-delayed-e4m3-len16-max-margin2"
    assert _delayed_options(recipe) == {("fp8_e4m3", "delayed", 16, "max", 2)}


@pytest.mark.parametrize("start_end, kept", [([], [0, LAYERS - 1]), (["--num-layers-at-start-in-bf16", "2"], [0, 1, 3]),
                                             (["--num-layers-at-end-in-bf16", "0"], [0])])
def test_first_last_layers_bf16(start_end, kept):
    recipe = _recipe("--fp4-format", "e2m1", "--first-last-layers-bf16", *start_end)
    assert recipe.unquantized_layers(LAYERS) == kept
    assert set(_formats(recipe, kept[0]).values()) == {None}


def test_no_precision_flags_means_no_flag_recipe():
    assert _recipe() is None
    assert _recipe("--fp8-format", "hybrid") is None  # alone: real Transformer Engine FP8, as in Megatron-LM


@pytest.mark.parametrize("flags, message", [
    (["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-amax-history-len", "16"],
     "--fp8-amax-history-len 16 only applies to delayed scaling"),
    (["--fp8-amax-compute-algo", "max"], "--fp8-amax-compute-algo max only applies to delayed"),
    (["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-margin", "1"],
     "--fp8-margin 1 only applies to delayed scaling.*Megatron-LM ignores it"),
    (["--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "0"],
     "--fp8-amax-history-len must be 1..65536, got 0"),
    (["--fp8-format", "e4m3", "--fp4-format", "e2m1"], "--fp4-format and --fp8-format are mutually exclusive"),
    (["--fp8-recipe", "mxfp8"], r"--fp8-recipe mxfp8 needs --fp8-format \{e4m3,hybrid\}"),
    (["--fp4-recipe", "nvfp4"], "--fp4-recipe nvfp4 needs --fp4-format e2m1"),
    (["--no-fp8-wgrad"], "--no-fp8-wgrad needs an emulated recipe"),
    (["--first-last-layers-bf16"], "--first-last-layers-bf16 needs an emulated recipe"),
    (["--fp4-format", "e2m1", "--num-layers-at-end-in-bf16", "2"], "needs --first-last-layers-bf16"),
])
def test_flag_refusals(flags, message):
    with pytest.raises(PresetError, match=message):
        _recipe(*flags)


def test_flags_and_custom_quant_variables_together_are_refused():
    args = parse_args(TINY + ["--fp4-format", "e2m1"])
    with pytest.raises(ArgumentError, match="CUSTOM_QUANT_TYPE and the precision flags.*te-nvfp4"):
        build_recipe(args, {"CUSTOM_QUANT_TYPE": "mxfp8"})
    assert build_recipe(args, {"CUSTOM_QUANT_COMPILE": "1"}).compile


def test_emulated_fp8_needs_no_transformer_engine_and_check_inputs_builds_it(monkeypatch):
    for key in ("CUSTOM_QUANT_TYPE", "CUSTOM_QUANT_SCOPE", "CUSTOM_QUANT_RECIPE"):
        monkeypatch.delenv(key, raising=False)
    flags = TINY + ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16"]
    validate_args(parse_args(flags), 1, cuda=False)
    inputs = check_inputs(flags)
    (recipe,) = inputs.precision.configs.values()
    assert recipe.name == inputs.precision.name == "te-fp8-current-bf16-first1-last1"
    assert recipe.unquantized_layers(inputs.shape["num_layers"]) == [0, inputs.shape["num_layers"] - 1]
    assert recipe.seed == 1234  # the run's --seed keys stochastic rounding


@pytest.mark.parametrize("flag", ["--kitchen-config-file", "--te-precision-config-file"])
def test_precision_files_under_megatron_lms_flag_names(tmp_path, monkeypatch, flag):
    from tests.recipes.test_precision_file import TE_FILE, THREE_MATCHERS

    for key in ("CUSTOM_QUANT_TYPE", "CUSTOM_QUANT_SCOPE", "CUSTOM_QUANT_RECIPE"):
        monkeypatch.delenv(key, raising=False)
    path = tmp_path / "mixed.yaml"
    path.write_text(TE_FILE if flag.startswith("--te") else THREE_MATCHERS)
    inputs = check_inputs(TINY + [flag, str(path)])
    assert inputs.precision.name == "mixed" and len(inputs.precision.configs) > 2
    assert {recipe.seed for recipe in inputs.precision.configs.values()} == {1234}
    with pytest.raises(ArgumentError, match=f"{flag} and CUSTOM_QUANT_TYPE both choose the precision; give one"):
        monkeypatch.setenv("CUSTOM_QUANT_TYPE", "mxfp8")
        check_inputs(TINY + [flag, str(path)])


def test_a_bad_precision_file_stops_the_driver_in_one_line(tmp_path, capsys):
    from megatron.quant.training.main import main

    path = tmp_path / "bad.yaml"
    path.write_text("configs: {a: bf16}\nmatchers: {m: {type: glob, pattern: '*', config: b, enabled: true}}\n")
    with pytest.raises(SystemExit) as stop:
        main(TINY + ["--kitchen-config-file", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1
    assert err[0] == (f"megatron-quant-train: error: --kitchen-config-file {path}: matchers.m: unknown config 'b'; "
                      f"configs: a")


@pytest.mark.parametrize("recipe", ["tensorwise", "delayed"])
def test_the_fp8_recipes_accumulate_as_te_on_hopper_unless_custom_quant_accumulate_says_exact(recipe):
    """Megatron-LM has no flag for it: CUSTOM_QUANT_ACCUMULATE=exact gives the flags' recipe exact sums."""
    args = parse_args(TINY + ["--fp8-format", "hybrid", "--fp8-recipe", recipe])
    assert build_recipe(args, {}).accumulation() == {"fprop": "fast", "dgrad": "promoted", "wgrad": "promoted"}
    assert build_recipe(args, {"CUSTOM_QUANT_ACCUMULATE": "te"}).accumulation()["fprop"] == "fast"
    assert set(build_recipe(args, {"CUSTOM_QUANT_ACCUMULATE": "exact"}).accumulation().values()) == {"exact"}


def test_custom_quant_accumulate_exact_gives_a_precision_file_s_fp8_configs_exact_sums(tmp_path, monkeypatch):
    from tests.recipes.test_precision_file import TE_FILE

    path = tmp_path / "mixed.yaml"
    path.write_text(TE_FILE)  # its config "current" is --fp8-recipe tensorwise: TE's accumulation on Hopper
    assert check_inputs(TINY + ["--te-precision-config-file", str(path)]).precision.configs[
        "current"].accumulation()["fprop"] == "fast"
    monkeypatch.setenv("CUSTOM_QUANT_ACCUMULATE", "exact")
    configs = check_inputs(TINY + ["--te-precision-config-file", str(path)]).precision.configs
    assert {mode for recipe in configs.values() for mode in recipe.accumulation().values()} == {"exact"}
