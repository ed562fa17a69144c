"""The kernel path under careless input: a garbage or 100,000-character CUSTOM_QUANT_KERNELS is one
bounded line; a Triton that fails to import (an ImportError, another error raised inside its
import, or an empty package) is refused when ``triton`` is asked for and hidden from torch and
megatron-core otherwise (``auto`` on CPU trains on the torch path and says so); a Hadamard size that
does not divide the micro-batch's tokens is refused at start; odd shapes (sequence 1, widths that
are not a multiple of the block, non-contiguous views) give the torch path's bits through a
quantized linear layer in Triton's interpreter."""
import sys
import textwrap

import pytest
import torch

from megatron.quant import kernels
from megatron.quant.compat import core_imports_triton
from megatron.quant.layers.module_quant import format_builder
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.training.recipe_fit import check_hadamard_fit
from tests.reliability._faults import REPO, run_command

try:  # Triton fixes a kernel as interpreted when its module is imported: now, under the root conftest's
    import megatron.quant.kernels.triton_format  # noqa: F401  TRITON_INTERPRET=1, not after another test's env
except ImportError:
    pass


@pytest.mark.parametrize("value", ["tr1ton", "x" * 100_000, "auto,torch", "\0"])
def test_bad_backend_is_one_bounded_line(value):
    with pytest.raises(ValueError) as error:
        kernels.backend({"CUSTOM_QUANT_KERNELS": value})
    text = str(error.value)
    assert "is not a kernel backend; allowed: auto, torch, compile, triton" in text
    assert len(text) < 250 and "\n" not in text


# A Triton whose import raises (a broken libtriton.so) or that is an empty package, first on the path:
# auto on CPU trains one iteration on the torch path and the start line says why; triton is refused.
_BROKEN_TRITON = {"raises": 'raise RuntimeError("libtriton.so: undefined symbol: foo")\n', "empty": ""}
_SCRIPT = textwrap.dedent("""
    import sys
    from megatron.quant import kernels
    if sys.argv[1] == "train":
        from megatron.quant.training.main import main
        [step] = main(["--model", "llama-tiny", "--num-layers", "1", "--seq-length", "16", "--mock-data",
                       "--train-iters", "1", "--eval-iters", "0"])
        print("trained", step["iteration"])
    else:  # megatron-core imports Triton itself
        import megatron.quant.layers, megatron.core
        print(kernels.describe([], False, "auto", False))
    try:
        kernels.backend({"CUSTOM_QUANT_KERNELS": "triton"})
    except ValueError as error:
        print("refused:", error)
""")


@pytest.mark.skipif(core_imports_triton(), reason="this megatron-core imports Triton itself: a broken one breaks it")
@pytest.mark.parametrize("kind", [pytest.param("raises", marks=pytest.mark.slow), "empty"])
def test_broken_triton_is_hidden_on_auto_and_refused_for_triton(tmp_path, kind):
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "__init__.py").write_text(_BROKEN_TRITON[kind])
    result = run_command([sys.executable, "-c", _SCRIPT, "train" if kind == "raises" else "import"], timeout=300,
                         PYTHONPATH=f"{tmp_path}:{REPO}",
                         CUSTOM_QUANT_KERNELS="auto", TRITON_INTERPRET="0")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert ("trained 1" in result.stdout) == (kind == "raises")
    reason = "RuntimeError: 'libtriton.so: undefined symbol: foo'" if kind == "raises" else \
        "ModuleNotFoundError: \"No module named 'triton.language'\""
    assert f"kernels auto: none (Triton is installed but fails to import ({reason}): the torch path runs)" \
        in result.stdout, result.stdout
    assert f"refused: CUSTOM_QUANT_KERNELS=triton cannot be used: Triton is installed but fails to import ({reason})" \
        in result.stdout


@pytest.mark.parametrize("preset, micro_batch, seq, size", [("te-nvfp4", 1, 60, 16), ("mxfp4+rht", 2, 60, 32)])
def test_hadamard_that_does_not_divide_the_tokens_is_refused_at_start(preset, micro_batch, seq, size):
    recipe = QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": preset})
    with pytest.raises(ValueError) as error:
        check_hadamard_fit(recipe, 2, micro_batch, seq)
    assert f"applies hadamard={size} along the tokens" in str(error.value)
    tokens = f"holds {micro_batch * seq} tokens (--micro-batch-size {micro_batch} x --seq-length {seq})"
    assert tokens in str(error.value)
    check_hadamard_fit(recipe, 2, micro_batch, 64)  # a multiple fits


@pytest.fixture(scope="module")
def parallel():
    pytest.importorskip("triton", reason="Triton does not import here: its kernels are not tested")
    from megatron.quant import cpu

    cpu.init_parallel(seed=11)
    yield
    cpu.destroy_parallel()


def _linear_bits(preset: str, x: torch.Tensor, out_features: int, triton: bool) -> list[torch.Tensor]:
    from megatron.quant.layers.linear import QuantRowParallelLinear
    from megatron.quant.layers.linear_function import LinearQuant
    from tests.layers._helpers import transformer_config

    layer = QuantRowParallelLinear(x.shape[-1], out_features, config=transformer_config(),
                                   init_method=torch.nn.init.normal_, bias=False, input_is_parallel=True,
                                   skip_bias_add=False)
    torch.manual_seed(0)
    torch.nn.init.normal_(layer.weight)
    recipe = QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": preset})
    formats = recipe.resolve("fc2", 0, 1, build=format_builder(recipe))
    assert ({type(f).__name__ for f in formats.values() if f is not None} == {"TritonFormat"}) == triton
    layer.configure_quant(LinearQuant.from_formats(formats), None, seed=3)
    x = x.detach().requires_grad_()
    y, _ = layer(x)
    y.backward(torch.ones_like(y))
    return [y.detach(), x.grad, layer.weight.grad]


@pytest.mark.parametrize("preset, shape, view", [
    ("te-mxfp8", (1, 1, 48), None),                 # sequence 1; 48 features: one and a half blocks of 32
    ("te-fp8-current", (1, 1, 40), None),
    ("te-nvfp4", (16, 1, 40), None),                # 40 features: two and a half blocks of 16
    ("te-mxfp8", (2, 3, 40), "transposed"),         # [b, s, h] seen as [s, b, h]: not contiguous
])
def test_odd_shapes_through_a_linear_layer_give_the_torch_bits(parallel, monkeypatch, preset, shape, view):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read when a kernel launches
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    if view == "transposed":
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
        assert not x.is_contiguous()
    monkeypatch.setenv("CUSTOM_QUANT_KERNELS", "torch")
    expected = _linear_bits(preset, x, 24, triton=False)
    monkeypatch.setenv("CUSTOM_QUANT_KERNELS", "triton")
    for ours, reference in zip(_linear_bits(preset, x, 24, triton=True), expected):
        assert torch.equal(ours, reference)
