"""MX and NVFP4 against numpy re-statements of the formulas and ml_dtypes element casts:
ties, subnormals, thresholds, zeros, NaN/Inf, three input dtypes, three axes, partial blocks."""
import numpy as np
import pytest
import torch

from megatron.quant.formats import get_format
from tests.formats._blocks_oracle import block_test_data, mx_reference, nvfp4_reference
from tests.formats._oracle import MX_ELEMENTS, mismatches

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Block binades that stay inside each input dtype's range (fp16 would turn the rest to Inf).
BINADES = {torch.float32: (-135, 127), torch.bfloat16: (-135, 127), torch.float16: (-22, 8)}
AXES = [-1, 0, 1]  # of a 3-D tensor (a, b, c) built by moving the block axis there


def _as_3d(rows_by_length: np.ndarray, axis: int) -> np.ndarray:
    """(rows, length) -> 3-D with the length on ``axis``; rows split as 2 x rows/2."""
    rows, length = rows_by_length.shape
    cube = rows_by_length.reshape(2, rows // 2, length)
    return np.ascontiguousarray(np.moveaxis(cube, -1, axis))


@np.errstate(divide="ignore")
def _check(fmt, reference, data: np.ndarray, dtype, axis: int, amax=None):
    x = torch.from_numpy(_as_3d(data, axis)).to(dtype)
    x32 = x.float().numpy()
    expected_q, expected_scale = reference(np.moveaxis(x32, axis, -1))
    q, scale = fmt.quantize_with_scale(x, axis=axis, amax=amax)
    assert q.dtype == dtype and q.shape == x.shape and scale.shape == x.shape
    expected_q = torch.from_numpy(np.moveaxis(expected_q, -1, axis).copy()).to(dtype)
    assert not mismatches(q, expected_q, x32), f"{fmt} {dtype} axis={axis}: {mismatches(q, expected_q, x32)}"
    assert not mismatches(scale, np.moveaxis(expected_scale, -1, axis))


@pytest.mark.parametrize("name", list(MX_ELEMENTS))
@pytest.mark.parametrize("scale_mode", ["floor", "ceil", "even", "rceil"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", AXES)
def test_mx_matches_reference(name, scale_mode, dtype, axis):
    element = MX_ELEMENTS[name]
    seed = list(MX_ELEMENTS).index(name) * 10 + axis % 3
    data = block_test_data(element, rows=8, length=32 * 24 + 5, block=32, seed=seed, binades=BINADES[dtype])
    fmt = get_format(name, scale_mode=scale_mode)

    def reference(x):
        return mx_reference(x, element, scale_mode)

    _check(fmt, reference, data, dtype, axis)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", AXES)
def test_nvfp4_matches_reference(dtype, axis):
    # Block binades near the tensor's: E4M3 block scales from normal down to zero.
    data = block_test_data("fp4_e2m1", rows=8, length=16 * 40 + 7, block=16, seed=axis % 3, binades=(-14, 4))
    _check(get_format("nvfp4"), nvfp4_reference, data, dtype, axis)


def test_nvfp4_uses_the_given_tensor_amax():
    rng = np.random.default_rng(4)
    data = (rng.standard_normal((4, 64)) * np.exp2(rng.integers(-20, 20, (4, 1)))).astype(np.float32)
    amax = torch.tensor(float(np.abs(data).max()) * 3.7)
    _check(get_format("nvfp4"), lambda x: nvfp4_reference(x, amax.numpy()), data, torch.float32, -1, amax=amax)


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp4_e2m1", "nvfp4"])
def test_nan_or_inf_poisons_only_its_block(name):
    fmt = get_format(name)
    x = torch.randn(4, 3 * fmt.block_size)
    x[1, 5] = float("nan")
    x[2, fmt.block_size + 1] = float("inf")
    q = fmt.quantize(x)
    poisoned = torch.zeros_like(x, dtype=torch.bool)
    poisoned[1, : fmt.block_size] = True
    poisoned[2, fmt.block_size : 2 * fmt.block_size] = True
    assert torch.isnan(q[poisoned]).all()
    assert torch.isfinite(q[~poisoned]).all()


@pytest.mark.parametrize("name", ["mxfp6_e2m3", "nvfp4"])
@pytest.mark.parametrize("length", [1, 31, 33, 70])
def test_short_last_block_equals_zero_padding(name, length):
    fmt = get_format(name)
    x = torch.randn(3, length) * 10
    padded = torch.nn.functional.pad(x, (0, -length % fmt.block_size + fmt.block_size))
    assert torch.equal(fmt.quantize(x), fmt.quantize(padded, amax=x.abs().amax())[:, :length])


def test_all_zero_blocks_stay_zero_and_axis_errors():
    fmt = get_format("mxfp8")
    assert torch.equal(fmt.quantize(torch.zeros(2, 64)), torch.zeros(2, 64))
    with pytest.raises(ValueError, match="axis=3"):
        fmt.quantize(torch.zeros(2, 64), axis=3)
    with pytest.raises(ValueError, match="at least one dimension"):
        fmt.quantize(torch.tensor(1.0))
