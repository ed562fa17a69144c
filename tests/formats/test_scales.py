"""Scale options against the oracles: FP8 block scaling (1 x 128 and 128 x 128, power-of-two or
not), tensor scaling's margin and power-of-two scales, MX "even" at its rounding ties."""
import numpy as np
import pytest
import torch

from megatron.quant.formats import get_format
from tests.formats._blocks_oracle import (
    MX_EMAX,
    MX_MBITS,
    block_test_data,
    fp8_block_reference,
    mx_reference,
    tiled_reference,
)
from tests.formats._oracle import MX_ELEMENTS, mismatches, tensor_scaled_reference


@pytest.mark.parametrize("name, element", [("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", "fp8_e5m2")])
@pytest.mark.parametrize("power_of_two", [True, False])
@pytest.mark.parametrize("axis", [-1, 0])
def test_fp8_block_scaling_1x128(name, element, power_of_two, axis):
    data = block_test_data(element, rows=6, length=128 * 5 + 9, block=128, seed=axis % 2, binades=(-100, 100))
    data[1, 3] = np.nan
    data[2, 200] = -np.inf
    x = np.ascontiguousarray(data if axis == -1 else data.T)
    fmt = get_format(name, scaling="block", power_of_two_scales=power_of_two)
    q, scale = fmt.quantize_with_scale(torch.from_numpy(x), axis=axis)
    blocks = np.concatenate([data, np.zeros((6, -data.shape[1] % 128), np.float32)], 1).reshape(6, -1, 128)
    expected_q, expected_scale = fp8_block_reference(blocks, element, power_of_two)
    expected_q = expected_q.reshape(6, -1)[:, : data.shape[1]]
    expected_scale = expected_scale.reshape(6, -1)[:, : data.shape[1]]
    if axis == 0:
        expected_q, expected_scale = expected_q.T, expected_scale.T
    assert not mismatches(q, expected_q, x)
    assert not mismatches(scale, expected_scale)
    if power_of_two:  # element x scale is exact in bf16
        finite = torch.isfinite(q)
        assert torch.equal(q[finite].bfloat16().float(), q[finite])


def test_fp8_block_scaling_128x128_tiles_and_defaults():
    fmt = get_format("fp8_e4m3", scaling="block", block_shape=[128, 128])
    assert fmt.options["power_of_two_scales"] is True and fmt.block_size == 128 and not fmt.needs_tensor_amax
    assert get_format("fp8_e4m3", scaling="block").options["block_shape"] == (1, 128)
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((200, 300)) * np.exp2(rng.integers(-10, 10, (200, 1)))).astype(np.float32)
    expected, expected_scale = tiled_reference(w, 128, lambda b: fp8_block_reference(b, "fp8_e4m3", True))
    for axis in (-1, 0):
        q, scale = fmt.quantize_with_scale(torch.from_numpy(w), axis=axis)
        assert not mismatches(q, expected, w) and not mismatches(scale, expected_scale)


@pytest.mark.parametrize("name, target", [("fp8_e4m3", 448.0), ("fp8_e5m2", 57344.0), ("hifp8", 32768.0)])
@pytest.mark.parametrize("margin", [0, 2])
@pytest.mark.parametrize("power_of_two", [False, True])
def test_tensor_scaling_margin_and_power_of_two(name, target, margin, power_of_two):
    scaling = {"scaling": "tensor"} if name == "hifp8" else {}
    fmt = get_format(name, margin=margin, power_of_two_scales=power_of_two, **scaling)
    rng = np.random.default_rng(margin)
    x = (rng.standard_normal(4096) * 3).astype(np.float32)
    amaxes = [None, np.float32(1000.0), np.float32(448.0), np.float32(np.nextafter(np.float32(448), np.float32(0)))]
    for amax in amaxes:
        q, scale = fmt.quantize_with_scale(torch.from_numpy(x), amax=None if amax is None else torch.tensor(amax))
        a = np.abs(x).max() if amax is None else amax
        expected, expected_scale = tensor_scaled_reference(x, name, a, target / 2**margin, power_of_two)
        assert scale.item() == expected_scale
        assert not mismatches(q, expected, x)


@pytest.mark.parametrize("name", list(MX_ELEMENTS))
def test_mx_even_and_ceil_at_their_thresholds(name):
    """Block amaxes at the mantissa rounding tie that decides "even" (2**e * (2 - 2**-(m+1)))
    and at powers of two (where "ceil" and "floor" agree), and one float32 ulp around them."""
    element = MX_ELEMENTS[name]
    tie = np.float32(2 - 2.0 ** -(MX_MBITS[element] + 1))
    edges = np.array([tie, 1.0], np.float32)
    edges = np.concatenate([edges, np.nextafter(edges, 0), np.nextafter(edges, 2)]).astype(np.float32)
    rng = np.random.default_rng(5)
    exponents = rng.integers(-30, 30, (edges.size, 4))
    amaxes = (edges[:, None] * np.exp2(exponents)).astype(np.float32).ravel()
    x = (rng.uniform(-1, 1, (amaxes.size, 32)) * amaxes[:, None]).astype(np.float32)
    x[:, 0] = amaxes
    for mode in ("even", "ceil"):
        q, scale = get_format(name, scale_mode=mode).quantize_with_scale(torch.from_numpy(x))
        expected_q, expected_scale = mx_reference(x, element, mode)
        assert not mismatches(scale, expected_scale, x) and not mismatches(q, expected_q, x), mode
    # The tie itself carries into the next power of two (its kept mantissa is all ones, so odd).
    scale = get_format(name, scale_mode="even").quantize_with_scale(torch.full((1, 32), float(tie)))[1]
    assert scale[0, 0].item() == 2.0 ** (1 - MX_EMAX[element])


@pytest.mark.parametrize("name, target", [("fp8_e4m3", 448.0), ("fp8_e5m2", 57344.0), ("hifp8", 32768.0)])
def test_delayed_scaling_quantizes_with_the_amax_it_is_given(name, target):
    """The history's amax sets the scale (values beyond it saturate); without one, x's own."""
    fmt = get_format(name, scaling="delayed", margin=1)
    x = (np.random.default_rng(3).standard_normal(4096) * 3).astype(np.float32)
    for amax in (np.float32(0.7), np.float32(50.0), None):
        q, scale = fmt.quantize_with_scale(torch.from_numpy(x), amax=None if amax is None else torch.tensor(amax))
        expected, expected_scale = tensor_scaled_reference(x, name, np.abs(x).max() if amax is None else amax,
                                                           target / 2)
        assert scale.item() == expected_scale and not mismatches(q, expected, x)
