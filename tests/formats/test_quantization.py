"""The narrow format interface: every format object writes one record method, ``run(x, axis, amax,
want=...)``, and the named quantize methods are conveniences written once in ``QuantFormat`` on top of
it; a ``Want`` asks for the value or the GEMM operand, never a mix; no class calls a private member of
the format it holds."""
import inspect
import re

import numpy as np
import pytest
import torch

from megatron.quant import formats
from megatron.quant.formats.interface import QuantFormat
from megatron.quant.formats.quantization import GEMM, GEMM_BOTH_AXES, Quantization, Want
from tests.formats._blocks_oracle import mx_reference
from tests.formats._package_lines import package_lines_matching

CONVENIENCES = ("quantize", "quantize_with_scale", "quantize_for_gemm", "quantize_with_stats",
                "quantize_for_gemm_with_amax", "quantize_for_gemm_both")


def _format_classes() -> list[type]:
    """Every class of the package that implements ``QuantFormat``, the Triton wrapper included where it imports."""
    import megatron.quant.formats.compiled  # noqa: F401  (each module defines its classes when imported)
    try:
        import megatron.quant.kernels.triton_format  # noqa: F401
    except ImportError:  # no Triton here: its wrapper is not checked
        pass
    found, todo = [], [QuantFormat]
    while todo:
        for cls in todo.pop().__subclasses__():
            if cls.__module__.startswith("megatron.quant.") and cls not in found:
                found.append(cls)
                todo.append(cls)
    return found


def test_the_conveniences_are_written_once_on_the_record_method():
    classes = _format_classes()
    names = {cls.__name__ for cls in classes}
    assert {"NumericFormat", "FormatWrapper", "CompiledFormat", "BlockFormat"} <= names, names
    rewritten = [f"{cls.__name__}.{name}" for cls in classes for name in CONVENIENCES if name in vars(cls)]
    assert not rewritten, f"conveniences written again outside QuantFormat: {rewritten}"
    abstract = {name for name, value in vars(QuantFormat).items() if getattr(value, "__isabstractmethod__", False)}
    assert abstract == {"run", "amax_of", "transform"}
    for name in CONVENIENCES:
        assert "self.run(" in inspect.getsource(getattr(QuantFormat, name)), name


def test_no_module_calls_a_private_member_of_the_format_it_holds():
    found = package_lines_matching(r"\b(fmt|fallback|format|spec\.fmt)\._[a-z]")
    assert not found, found


@pytest.mark.parametrize("fields, bad", [
    ({"gemm": True, "scale": True}, "scale"), ({"gemm": True, "stats": "full"}, "stats"),
    ({"amax": True}, "amax"), ({"both_axes": True}, "both_axes"), ({"stats": "all"}, "'all'"),
    ({"gemm": True, "amax": True, "both_axes": True}, "amax=True with both_axes=True")])
def test_a_request_mixing_value_and_operand_is_refused_naming_the_field(fields, bad):
    with pytest.raises(ValueError, match=re.escape(bad)) as error:
        Want(**fields)
    assert "\n" not in str(error.value)


def test_the_record_holds_only_what_was_asked_for():
    fmt = formats.get_format("nvfp4")
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    value = fmt.run(x, -1)
    assert value.value is not None and value.value.shape == x.shape
    assert all(field is None for field in (value.scale, value.stats, value.operand, value.tensor_scale,
                                           value.amax, value.cross))
    operand = fmt.run(x, -1, want=GEMM)
    assert operand.value is None and operand.operand is not None and operand.tensor_scale.shape == ()
    # NVFP4's value is its operand times the FP32 tensor scale (rounded to x's dtype, float32 here).
    torch.testing.assert_close(operand.operand * operand.tensor_scale, value.value, rtol=0, atol=0)
    with_stats = fmt.run(x, -1, want=Want(scale=True, stats="full"))
    assert with_stats.stats is None and with_stats.scale.shape == x.shape  # the torch path takes no statistics


@pytest.mark.parametrize("axis", [-2, -1, 0, 1])
def test_both_axes_put_the_requested_axis_first_and_the_other_in_cross(axis):
    fmt = formats.get_format("mxfp8_e4m3", scale_mode="floor")
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(2)) * 4
    both = fmt.run(x, axis, want=GEMM_BOTH_AXES)
    assert isinstance(both.cross, Quantization) and both.tensor_scale is None and both.cross.tensor_scale is None
    first, other = (0, 1) if axis in (-2, 0) else (1, 0)
    for operand, along in ((both.operand, first), (both.cross.operand, other)):
        expected, _ = mx_reference(x.numpy().swapaxes(along, -1), "fp8_e4m3", "floor")  # blocks along the last axis
        np.testing.assert_array_equal(operand.numpy(), expected.swapaxes(along, -1))
    with pytest.raises(ValueError, match="both_axes needs axis -2 or -1"):
        fmt.run(torch.zeros(2, 64, 64), 0, want=GEMM_BOTH_AXES)
