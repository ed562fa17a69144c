"""Eager CPU calls on big tensors run in cache-sized chunks; the result must be the same as
the whole-tensor computation (quantize_with_scale is never chunked)."""
import pytest
import torch

import megatron.quant.formats.base as formats_base
from megatron.quant.formats import get_format, list_formats
from tests.formats._oracle import mismatches

# Middle axes: cut across the rows before the axis, or (one row before it) across those after.
SHAPES_AND_AXES = [((7, 96, 5), 1), ((7, 100, 5), 1), ((96, 40), 0), ((100, 3, 4), 0), ((7, 96, 5), -1),
                   ((3, 1000), -1), ((4000,), 0)]


@pytest.mark.parametrize("name", [n for n in list_formats() if n not in ("fp32", "bf16", "fp16")])
def test_chunked_equals_whole(name, monkeypatch):
    monkeypatch.setattr(formats_base, "EAGER_CHUNK_ELEMENTS", 64)
    fmt = get_format(name)
    generator = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        for shape, axis in SHAPES_AND_AXES:
            x = (torch.randn(shape, generator=generator)
                 * 2.0 ** torch.randint(-8, 8, shape, generator=generator)).to(dtype)
            x.view(-1)[::97] = 0.0
            assert fmt._in_chunks(x)
            whole, _ = fmt.quantize_with_scale(x, axis=axis)
            chunked = fmt.quantize(x, axis=axis)
            assert chunked.dtype == dtype and chunked.shape == x.shape and chunked.is_contiguous()
            assert not mismatches(chunked, whole, x), f"{name} {dtype} {shape} axis={axis}"


@pytest.mark.parametrize("name, options", [("nvfp4", {"hadamard": 16}), ("mxfp4", {"hadamard": 32}),
                                           ("fp8_e4m3", {"scaling": "block"}),
                                           ("fp8_e5m2", {"margin": 1, "power_of_two_scales": True}),
                                           ("nvfp4", {"block_shape": (16, 16)})])
def test_chunked_equals_whole_with_new_options(name, options, monkeypatch):
    monkeypatch.setattr(formats_base, "EAGER_CHUNK_ELEMENTS", 64)
    fmt = get_format(name, **options)
    generator = torch.Generator().manual_seed(2)
    for shape, axis in [((7, 256, 5), 1), ((96, 64), 0), ((3, 1024), -1)]:
        x = torch.randn(shape, generator=generator) * 2.0 ** torch.randint(-8, 8, shape, generator=generator)
        whole, _ = fmt.quantize_with_scale(x, axis=axis)
        assert not mismatches(fmt.quantize(x, axis=axis), whole, x), f"{name} {options} {shape} axis={axis}"
