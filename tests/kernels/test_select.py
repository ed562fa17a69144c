"""Which code quantizes: CUSTOM_QUANT_KERNELS, the recipe's compile switch, the device, and the
words the training start line prints (a GPU run that would quantize eager says so)."""
import pytest

from megatron.quant import kernels
from megatron.quant.formats import get_format
from megatron.quant.formats.compiled import CompiledFormat
from megatron.quant.layers.module_quant import format_builder
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.training.main import main

needs_triton = pytest.mark.skipif(not kernels.triton_available(), reason="triton does not import here")


def test_backend_from_environment():
    assert kernels.backend({}) == "auto"
    assert kernels.backend({"CUSTOM_QUANT_KERNELS": " Torch "}) == "torch"
    with pytest.raises(ValueError, match="CUSTOM_QUANT_KERNELS='cuda' is not a kernel backend; "
                                         "allowed: auto, torch, compile, triton"):
        kernels.backend({"CUSTOM_QUANT_KERNELS": "cuda"})


def test_bad_backend_stops_training_with_status_2(monkeypatch, capsys):
    monkeypatch.setenv("CUSTOM_QUANT_KERNELS", "fast")
    with pytest.raises(SystemExit) as stop:
        main(["--model", "llama-tiny", "--mock-data", "--train-iters", "1", "--check-args"])
    assert stop.value.code == 2
    assert "CUSTOM_QUANT_KERNELS='fast' is not a kernel backend" in capsys.readouterr().err


@pytest.mark.parametrize("chosen, compile, cuda, expected", [
    ("auto", False, False, "eager"), ("auto", True, False, "compiled"), ("torch", True, True, "eager"),
    ("compile", False, True, "compiled"), ("auto", False, True, "triton"), ("triton", False, True, "triton")])
def test_plan(chosen, compile, cuda, expected, monkeypatch):
    monkeypatch.setattr(kernels.select, "triton_available", lambda: True)
    assert kernels.plan(get_format("fp8_e4m3"), compile, chosen, cuda) == expected


def test_unsupported_and_stochastic_formats_fall_back_and_a_gpu_run_says_so(monkeypatch):
    monkeypatch.setattr(kernels.select, "triton_available", lambda: False)
    sr = get_format("nvfp4", rounding="stochastic")
    assert kernels.plan(sr, True, "auto", True) == "eager"  # no Triton: compile refuses SR
    line = kernels.describe([get_format("mxfp8"), sr], True, "auto", cuda=True)
    assert line == ("kernels auto: compiled mxfp8_e4m3; eager nvfp4 (stochastic) "
                    "(WARNING: eager quantization on the GPU)")
    assert "WARNING" not in kernels.describe([sr], False, "auto", cuda=False)


def test_the_layers_run_a_recipe_s_formats_on_the_chosen_path(monkeypatch):
    recipe = QuantRecipe.uniform("fp8_e4m3", compile=True)
    build = format_builder(recipe)
    assert isinstance(recipe.resolve("qkv", 0, 2, build=build)["fprop.input"], CompiledFormat)  # CPU, auto
    assert type(recipe.resolve("qkv", 0, 2)["fprop.input"]).__name__ == "ElementwiseFormat"  # the recipe: data
    monkeypatch.setenv("CUSTOM_QUANT_KERNELS", "torch")
    assert type(recipe.resolve("qkv", 0, 2, build=build)["fprop.input"]).__name__ == "ElementwiseFormat"
    assert [f.name for f in recipe.formats(2)] == ["fp8_e4m3"]


@needs_triton
def test_triton_backend_on_cpu_runs_the_torch_path_outside_the_interpreter(monkeypatch):
    import torch

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    fmt = kernels.wrap(get_format("fp8_e4m3"), compile=False, chosen="triton", cuda=False)
    assert type(fmt).__name__ == "TritonFormat" and not fmt.serves(torch.ones(4))
    assert kernels.plan(get_format("fp8_e4m3"), False, "triton", cuda=False) == "eager"
