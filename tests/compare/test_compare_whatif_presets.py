"""What-if with recipe presets next to format names, on captures written by the real tensor
saver: a preset's rows equal the formats the preset documents, applied directly with
megatron.quant.formats to each GEMM operand the captured tensor feeds, along that GEMM's
axis (wgrad operands: the 2-D [tokens, features] view along tokens), with SQNR from numpy;
attention stays unquantized under a linear-scope preset; bad names are one clear error."""
import csv
import math

import numpy as np
import pytest
import torch

from megatron.quant import formats, position, tensor_saver
from megatron.quant.analysis.captures.catalog import CaptureRecord
from megatron.quant.analysis.captures.selection import CaptureFilter
from megatron.quant.compare import run_whatif, whatif
from megatron.quant.recipes import presets
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.tensor_saver import CaptureSite, Operand, SaverConfig

LAYERS = (0, 1)
# The te-nvfp4 preset as its documentation states it (presets.py): operand -> (format options,
# captured tensor, on the 2-D view along tokens). Gradients round stochastically, weights use
# 16x16 tiles, the two wgrad operands get a 16-point random Hadamard transform.
TE_NVFP4 = {
    "fprop.input": ({}, ("forward", "input"), False),
    "fprop.weight": ({"block_shape": (16, 16)}, ("forward", "weight"), False),
    "dgrad.grad_output": ({"rounding": "stochastic8"}, ("backward", "grad_output"), False),
    "dgrad.weight": ({"block_shape": (16, 16)}, ("backward", "weight"), False),
    "wgrad.grad_output": ({"hadamard": 16, "rounding": "stochastic8"}, ("backward", "grad_output"), True),
    "wgrad.input": ({"hadamard": 16}, ("forward", "input"), True),
}
MXFP8 = formats.get_format("mxfp8").name


def _linear(layer: int) -> CaptureSite:
    return CaptureSite("linear", "linear", layer, f"decoder.layers.{layer}.mlp.linear_fc1", "fc1", "bf16")


def _attention(layer: int) -> CaptureSite:
    return CaptureSite("attention", "FA", layer, f"decoder.layers.{layer}.self_attention.core_attention",
                       "core_attention", "bf16")


@pytest.fixture(scope="module")
def capture_dir(tmp_path_factory):
    """A bf16 run's fc1 operands in two layers with the axes QuantLinearFunction records (input
    and grad_output along features, the weight along in_features forward and out_features
    backward), and layer 0's attention query."""
    root = tmp_path_factory.mktemp("captures")
    gen = torch.Generator().manual_seed(0)
    tensor_saver.configure(SaverConfig(enabled=True, save_dir=str(root), iterations="0"))
    try:
        position.set_iteration(0)
        position.set_microbatch(0, 0)
        for layer in LAYERS:
            # Outlier channels and tokens: the block shape, the axis and the RHT all matter.
            x = torch.randn(32, 2, 64, generator=gen) * torch.logspace(-3, 2, 64)
            w = torch.randn(128, 64, generator=gen) * torch.logspace(-2, 0, 128).view(128, 1)
            dy = torch.randn(32, 2, 128, generator=gen) * torch.logspace(-4, 1, 32).view(32, 1, 1)
            tensor_saver.capture(_linear(layer), "forward", "pre", {
                "input": Operand(x.bfloat16(), axis=-1), "weight": Operand(w, axis=1)})
            tensor_saver.capture(_linear(layer), "backward", "pre", {
                "grad_output": Operand(dy.bfloat16(), axis=-1), "weight": Operand(w, axis=0)})
        query = torch.randn(32, 2, 4, 16, generator=gen)
        tensor_saver.capture(_attention(0), "forward", "pre", {"query": Operand(query, axis=-1)})
    finally:
        tensor_saver.close()
    return root


def _run(capture_dir, out, *names: str, plots: bool = True) -> dict:
    log: list[str] = []
    args = run_whatif.build_parser().parse_args(
        ["--tensor_dir", str(capture_dir), "--output_dir", str(out), "--formats", *names,
         *([] if plots else ["--no_plots"])])
    written = run_whatif.run(args, log=log.append)
    folder = out / "format_comparison"
    tables = {}
    for name in ("format_comparison", "best_formats", "not_quantized"):
        with open(folder / f"{name}.csv") as handle:
            tables[name] = list(csv.DictReader(handle))
    return {"folder": folder, "log": log, "written": written, **tables}


@pytest.fixture(scope="module")
def outcome(capture_dir, tmp_path_factory):
    return _run(capture_dir, tmp_path_factory.mktemp("draw"), "te-nvfp4", "mxfp8")


def _captured(capture_dir, row: dict) -> torch.Tensor:
    return torch.load(capture_dir / row["file"], weights_only=True)["tensor"].float()


def _errors(x: torch.Tensor, q: torch.Tensor) -> tuple[float, float]:
    """(SQNR in dB, rel_mse) in float64 numpy."""
    x, q = x.double().numpy(), q.double().numpy()
    signal, noise = np.sum(x ** 2), np.sum((q - x) ** 2)
    return 10 * math.log10(signal / noise), noise / signal


def test_preset_rows_equal_the_documented_format_of_each_operand(outcome, capture_dir):
    rows = [r for r in outcome["format_comparison"] if r["format"] == "te-nvfp4"]
    assert len(rows) == len(LAYERS) * len(TE_NVFP4)
    for row in rows:
        options, (operation, tensor_name), along_tokens = TE_NVFP4[row["operand"]]
        assert (row["operation"], row["tensor_name"]) == (operation, tensor_name)
        x = _captured(capture_dir, row)
        if along_tokens:
            x, axis = x.reshape(-1, x.shape[-1]), 0
        else:
            axis = {"input": -1, "grad_output": -1, "weight": 1 if operation == "forward" else 0}[tensor_name]
        sqnr, rel_mse = _errors(x, formats.get_format("nvfp4", **options).quantize(x, axis=axis))
        assert float(row["sqnr_db"]) == pytest.approx(sqnr, rel=1e-6), row["operand"]
        assert float(row["rel_mse"]) == pytest.approx(rel_mse, rel=1e-6), row["operand"]
        assert row["shape"] == str(list(x.shape)) and int(row["axis"]) % x.dim() == axis % x.dim()
        assert row["bits"] == "4"


def test_each_documented_option_changes_the_numbers(capture_dir):
    """So the equalities above check the options, the GEMM axis and the 2-D view."""
    def load(tensor_name: str) -> torch.Tensor:
        path = next(capture_dir.rglob(f"*L0_*_pre_*_{tensor_name}.pt"))
        return torch.load(path, weights_only=True)["tensor"].float()

    x, dy, w = load("input"), load("grad_output"), load("weight")
    flat = x.reshape(-1, x.shape[-1])
    pairs = [((flat, 0, {"hadamard": 16}), (flat, 0, {})),                   # RHT
             ((flat, 0, {"hadamard": 16}), (flat, -1, {"hadamard": 16})),    # wgrad axis
             ((w, 1, {"block_shape": (16, 16)}), (w, 1, {})),                # 2-D weight tiles
             ((dy, -1, {"rounding": "stochastic"}), (dy, -1, {}))]           # stochastic rounding
    for (a, axis_a, options_a), (b, axis_b, options_b) in pairs:
        sqnr_a = _errors(a, formats.quantize(a, "nvfp4", axis=axis_a, **options_a))[0]
        sqnr_b = _errors(b, formats.quantize(b, "nvfp4", axis=axis_b, **options_b))[0]
        assert abs(sqnr_a - sqnr_b) > 1e-3, (options_a, options_b)


def test_formats_keep_one_row_per_capture_under_its_recorded_operand(outcome):
    rows = [r for r in outcome["format_comparison"] if r["format"] == MXFP8]
    recorded = {("forward", "input"): "fprop.input", ("forward", "weight"): "fprop.weight",
                ("backward", "grad_output"): "dgrad.grad_output", ("backward", "weight"): "dgrad.weight"}
    expected = [(str(layer), op, name, key) for layer in LAYERS for (op, name), key in recorded.items()]
    expected.append(("0", "forward", "query", ""))  # attention tensors have no recipe key here
    assert sorted((r["layer_idx"], r["operation"], r["tensor_name"], r["operand"]) for r in rows) == sorted(expected)


def test_wgrad_uses_are_classes_of_their_own_where_presets_compete_with_formats(outcome):
    rows = outcome["format_comparison"]
    assert {r["tensor_class"] for r in rows if r["operand"] in ("wgrad.input", "wgrad.grad_output")} == {
        "fc1/forward/input@wgrad.input", "fc1/backward/grad_output@wgrad.grad_output"}
    best = {(r["tensor_class"], r["among_bits"]): r["format"] for r in outcome["best_formats"]}
    for cls in {r["tensor_class"] for r in rows}:
        means = {name: np.mean([float(r["sqnr_db"]) for r in rows if r["tensor_class"] == cls and r["format"] == name])
                 for name in {r["format"] for r in rows if r["tensor_class"] == cls}}
        assert best[(cls, "all")] == max(means, key=means.get)
    assert best[("fc1/forward/input@wgrad.input", "all")] == "te-nvfp4"  # formats have no wgrad rows
    assert best[("fc1/forward/input", "4")] == "te-nvfp4" and best[("fc1/forward/input", "8")] == MXFP8
    names = {path.name for path in outcome["folder"].iterdir()}
    assert "by_layer.png" in names
    assert set(outcome["written"]) == {outcome["folder"] / name for name in names}


def test_attention_under_a_linear_preset_is_reported_not_evaluated(outcome):
    assert not [r for r in outcome["format_comparison"] if r["role"] == "core_attention" and r["format"] == "te-nvfp4"]
    [entry] = outcome["not_quantized"]
    assert (entry["format"], entry["tensor_class"], entry["layers"], entry["tensors"]) == (
        "te-nvfp4", "core_attention/forward/query", "0", "1")
    assert entry["reason"] == "the preset quantizes no operand of this module"
    assert "not evaluated: te-nvfp4 leaves core_attention/forward/query unquantized in layer(s) 0 (1 tensor(s)): " \
           "the preset quantizes no operand of this module" in outcome["log"]
    assert "core_attention/forward/query" in (outcome["folder"] / "summary.md").read_text()


def test_only_attention_under_a_linear_preset_is_a_clear_error(capture_dir, tmp_path, capsys):
    code = run_whatif.main(["--tensor_dir", str(capture_dir), "--output_dir", str(tmp_path),
                            "--formats", "te-nvfp4", "--roles", "core_attention"])
    assert code == 2
    assert "te-nvfp4 leaves core_attention/forward/query unquantized" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["te-nvfp5", "mxfp9"])
def test_an_unknown_name_lists_formats_and_presets_and_writes_nothing(capture_dir, tmp_path, capsys, name):
    out = tmp_path / "draw"
    assert run_whatif.main(["--tensor_dir", str(capture_dir), "--output_dir", str(out),
                            "--formats", "mxfp8", name, "te-nvfp4"]) == 2
    err = capsys.readouterr().err
    assert repr(name) in err and "te-nvfp4" in err and "te-fp8-blockwise" in err and "mxfp8_e4m3" in err
    assert not out.exists()


def test_a_refused_preset_gives_its_own_reason(capture_dir, tmp_path, capsys, monkeypatch):
    def refused(name):
        raise presets.PresetError(f"preset {name!r}: refused for this test")

    monkeypatch.setattr(presets, "get_preset", refused)
    out = tmp_path / "draw"
    assert run_whatif.main(["--tensor_dir", str(capture_dir), "--output_dir", str(out),
                            "--formats", "te-mxfp8"]) == 2
    assert "preset 'te-mxfp8': refused for this test" in capsys.readouterr().err
    assert not out.exists()


def test_every_preset_runs_next_to_a_format(capture_dir, tmp_path):
    emulated = list(presets.PRESETS)
    result = _run(capture_dir, tmp_path, *emulated, "mxfp8", plots=False)
    evaluated = {r["format"] for r in result["format_comparison"]}
    assert evaluated == set(emulated) | {MXFP8}


def _record(layer: int) -> CaptureRecord:
    return CaptureRecord(path=None, quant_type="bf16", layer_type="linear", layer_idx=layer, operation="forward",
                         phase="pre", component="linear", tensor_name="input", iteration=0, rank=0, role="fc1")


def test_layer_rules_resolve_with_the_inferred_layer_count(capture_dir):
    assert whatif.find_captures(capture_dir, CaptureFilter(layers=frozenset({0}))).num_layers == len(LAYERS)
    recipe = QuantRecipe.from_dict({"format": "te-nvfp4", "rules": [{"match": {"layers": ["-1:"]}, "format": "bf16"}]})
    candidate = whatif.Candidate(recipe.name, recipe=recipe)
    uses, left = whatif.operand_formats(candidate, _record(1), num_layers=2)  # the last layer: kept in bf16
    assert not uses and left == [("", "the preset quantizes no operand of this module")]
    uses, left = whatif.operand_formats(candidate, _record(1), num_layers=3)
    assert [key for key, _ in uses] == ["fprop.input", "wgrad.input"] and not left
    assert uses[1][1].hadamard is not None and uses[0][1].hadamard is None


def test_an_operand_a_preset_keeps_in_high_precision_is_listed():
    recipe = QuantRecipe.from_dict({"format": "te-nvfp4", "operands": {"wgrad.input": "bf16"}})
    uses, left = whatif.operand_formats(whatif.Candidate(recipe.name, recipe=recipe), _record(0), num_layers=2)
    assert [key for key, _ in uses] == ["fprop.input"]
    assert left == [("wgrad.input", "kept in high precision by the preset")]


def test_wgrad_views_are_megatron_cores_along_tokens():
    from megatron.core.tensor_parallel.layers import prepare_input_tensors_for_wgrad_compute

    dy, x = torch.randn(5, 3, 8), torch.randn(5, 3, 4)
    for tensor, expected, operand in zip((dy, x), prepare_input_tensors_for_wgrad_compute(dy, x),
                                         ("wgrad.grad_output", "wgrad.input")):
        view, axis = whatif.gemm_view(tensor, -1, operand)
        assert torch.equal(view, expected) and axis == 0
    assert whatif.gemm_view(x, 2, "fprop.input") == (x, 2)
