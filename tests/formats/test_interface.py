"""The format interface (``formats.interface.QuantFormat``): every registered format, and every wrapper
the layers may hold (compiled, Triton), offers each member of it, with the wrapped format's values;
nothing in the package probes a format with ``getattr``; docs/interfaces.md lists every member."""
import inspect
import re

import pytest
import torch

from megatron.quant import formats
from megatron.quant.formats.compiled import CompiledFormat
from megatron.quant.formats.interface import QuantFormat
from megatron.quant.formats.wrapper import FormatWrapper
from tests.formats._package_lines import ROOT, package_lines_matching

# Every kind of format object: each registered format, plus the options that change what it offers
# (tiles, a Hadamard transform, stochastic rounding, delayed scaling).
VARIANTS = [(name, {}) for name in formats.list_formats()] + [
    ("mxfp8", {"block_shape": (32, 32)}), ("nvfp4", {"hadamard": 16}), ("mxfp4", {"rounding": "stochastic"}),
    ("fp8_e4m3", {"scaling": "delayed"}), ("fp8_e4m3", {"scaling": "block"})]
ATTRIBUTES = tuple(QuantFormat.__annotations__)
METHODS = tuple(name for name, value in vars(QuantFormat).items() if not name.startswith("_") and callable(value))


def _built(name: str, options: dict):
    return formats.get_format(name, **options)


def _wrapped(fmt) -> list:
    """The wrappers ``kernels.wrap`` may hand the layers for ``fmt``."""
    wrapped = [FormatWrapper(fmt)]
    if fmt.rounding == "nearest":
        wrapped.append(CompiledFormat(fmt))
    try:
        from megatron.quant.kernels import supported
        from megatron.quant.kernels.triton_format import TritonFormat
    except ImportError:  # no Triton here: its wrapper is not built
        return wrapped
    if supported(fmt):
        wrapped.append(TritonFormat(fmt, fmt))
    return wrapped


def test_the_interface_lists_what_the_package_uses():
    assert set(ATTRIBUTES) >= {"name", "bits", "options", "rounding", "scaling", "needs_tensor_amax",
                               "transforms_operand", "block_size", "block_shape", "tiled", "element", "dtype",
                               "dual_axis"}
    assert set(METHODS) >= {"quantize", "quantize_with_scale", "quantize_for_gemm", "quantize_for_gemm_with_amax",
                            "quantize_for_gemm_both", "quantize_with_stats", "amax_of", "transform", "serves"}


@pytest.mark.parametrize("name,options", VARIANTS, ids=lambda v: str(v))
def test_every_format_and_wrapper_offers_every_member(name, options):
    fmt = _built(name, options)
    for candidate in [fmt, *_wrapped(fmt)]:
        assert isinstance(candidate, QuantFormat)
        missing = [m for m in ATTRIBUTES + METHODS if not hasattr(candidate, m)]
        assert not missing, f"{candidate!r} lacks {missing}"
        assert all(callable(getattr(candidate, m)) for m in METHODS)
        if candidate is not fmt:  # a wrapper's attributes are its format's, but for what its kernels add
            same = {m: getattr(candidate, m) == getattr(fmt, m) for m in ATTRIBUTES if m != "dual_axis"}
            assert all(same.values()), (f"{candidate!r} differs from its format in "
                                        f"{[m for m, s in same.items() if not s]}")
    assert fmt.scaling in ("none", "tensor", "delayed", "block")
    assert (fmt.element is None) != (fmt.dtype is None)  # a grid, or a plain cast
    assert fmt.tiled == (fmt.block_shape is not None and fmt.block_shape[0] > 1)
    assert (fmt.block_size is None) == (fmt.block_shape is None) == (fmt.scaling != "block")


def test_no_wrapper_forwards_through_getattr():
    pytest.importorskip("triton", reason="Triton does not import here: TritonFormat is not built")
    from megatron.quant.kernels.triton_format import TritonFormat

    for cls in (FormatWrapper, CompiledFormat, TritonFormat):
        assert "__getattr__" not in {name for klass in cls.__mro__ for name in vars(klass)}, cls


def test_a_plain_format_takes_the_interface_defaults():
    """Without a kernel the composite methods are the plain ones: the same tensors, no statistics."""
    fmt = formats.get_format("fp8_e4m3")
    x = torch.randn(64, 48, generator=torch.Generator().manual_seed(0))
    q, scale = fmt.quantize_for_gemm(x, 0)
    with_amax = fmt.quantize_for_gemm_with_amax(x, 0)
    assert torch.equal(with_amax[0], q) and torch.equal(with_amax[1], scale)
    assert with_amax[2] == x.abs().max()
    q, scale, packed = fmt.quantize_with_stats(x, -1)
    assert packed is None and torch.equal(q, fmt.quantize(x, -1))
    rows, cols = formats.get_format("mxfp8").quantize_for_gemm_both(x)
    assert torch.equal(rows[0], formats.get_format("mxfp8").quantize(x, -2))
    assert torch.equal(cols[0], formats.get_format("mxfp8").quantize(x, -1))
    assert not fmt.serves(x) and not fmt.dual_axis


def test_no_module_probes_a_format_with_getattr():
    found = package_lines_matching(r"getattr\(([a-z_]+\.)?(fmt|fallback)\b|getattr\(specs\[")
    assert not found, found


def test_no_format_is_typed_any():
    typed_any = package_lines_matching(r"\bfmt: (Optional\[)?Any\b|\bformats: list\[Any\]")
    assert not typed_any, typed_any


def test_the_interfaces_guide_lists_every_member():
    guide = (ROOT / "docs" / "interfaces.md").read_text()
    section = guide[guide.index("## 1. Formats"):guide.index("## 2.")]
    missing = [m for m in ATTRIBUTES + METHODS if not re.search(rf"\b{m}\b", section)]
    assert not missing, f"docs/interfaces.md section 1 does not list {missing}"
    assert all(inspect.getdoc(getattr(QuantFormat, m)) for m in METHODS)  # and the interface explains each
