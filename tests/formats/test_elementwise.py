"""Elementwise formats against ml_dtypes/numpy casts: every bf16 and fp16 bit pattern and
two million random float32 values, all three input dtypes."""
import ml_dtypes
import numpy as np
import pytest
import torch

from megatron.quant.formats import get_format
from megatron.quant.formats.grid import FP4_E2M1, FP6_E2M3, FP6_E3M2, FP8_E4M3, FP8_E5M2
from tests.formats._oracle import (
    ELEMENT_DTYPES,
    all_bf16,
    all_fp16,
    cast,
    mismatches,
    random_fp32,
    saturating_cast,
    tensor_scaled_reference,
)

RANDOM = random_fp32(2_000_000, seed=1)
GRIDS = {"fp8_e4m3": FP8_E4M3, "fp8_e5m2": FP8_E5M2, "fp6_e3m2": FP6_E3M2, "fp6_e2m3": FP6_E2M3, "fp4_e2m1": FP4_E2M1}


def _inputs():
    return {"all bf16": all_bf16(), "random fp32": RANDOM}


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("overflow", ["saturate", "inf"])
def test_fp8_unscaled_is_the_ml_dtypes_cast(name, overflow):
    # overflow="inf" is ml_dtypes' own non-saturating cast (E4M3 has no Inf: NaN);
    # "saturate" clips to +-max first, Inf included.
    fmt = get_format(name, scaling="none", overflow=overflow)
    reference = cast if overflow == "inf" else saturating_cast
    for label, x in _inputs().items():
        report = mismatches(fmt.quantize(torch.from_numpy(x)), reference(x, name), x)
        assert not report, f"{name} {overflow} {label}: {report}"


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2", "hifp8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_give_the_same_values_in_their_dtype(name, dtype):
    options = {} if name == "hifp8" else {"scaling": "none"}
    fmt = get_format(name, **options)
    x = torch.from_numpy(all_bf16()).to(dtype) if dtype == torch.bfloat16 else torch.from_numpy(all_fp16())
    ours = fmt.quantize(x)
    assert ours.dtype == dtype
    x32 = x.float().numpy()
    assert not mismatches(ours, saturating_cast(x32, name), x32)


@pytest.mark.parametrize("name", ["fp6_e3m2", "fp6_e2m3", "fp4_e2m1"])
def test_mx_element_grids_are_the_saturating_ml_dtypes_cast(name):
    grid = GRIDS[name]
    for label, x in _inputs().items():
        report = mismatches(grid.round(torch.from_numpy(x)), saturating_cast(x, name), x)
        assert not report, f"{name} {label}: {report}"


@pytest.mark.parametrize("name", list(GRIDS))
def test_grid_constants_match_ml_dtypes(name):
    finfo = ml_dtypes.finfo(ELEMENT_DTYPES[name])
    grid = GRIDS[name]
    assert grid.max_value == float(finfo.max)
    assert grid.min_positive == float(finfo.smallest_subnormal)
    codes = np.array([code for code, _ in grid.code_values()], np.uint8)
    library_values = codes.view(ELEMENT_DTYPES[name]).astype(np.float32)
    assert not mismatches(np.array([value for _, value in grid.code_values()], np.float32), library_values)


@np.errstate(invalid="ignore", over="ignore")
def test_casts_match_numpy_and_ml_dtypes():
    x = np.concatenate([all_bf16(), RANDOM])
    tx = torch.from_numpy(x)
    assert not mismatches(get_format("bf16").quantize(tx), x.astype(ml_dtypes.bfloat16).astype(np.float32), x)
    assert not mismatches(get_format("fp16").quantize(tx), x.astype(np.float16).astype(np.float32), x)
    assert get_format("none").quantize(tx) is tx
    half = torch.from_numpy(all_fp16())
    assert not mismatches(get_format("bf16").quantize(half), half.numpy().astype(ml_dtypes.bfloat16).astype(np.float16))


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2", "hifp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_tensor_scaling_is_te_arithmetic(name, dtype):
    """The saturating cast of x * encode, encode = target / amax, decoded with 1 / encode."""
    options = {"scaling": "tensor", "scale_target": 224.0} if name == "hifp8" else {}
    fmt = get_format(name, **options)
    target = 224.0 if name == "hifp8" else fmt.max_value
    rng = np.random.default_rng(2)
    x = torch.from_numpy((rng.standard_normal(100_000) * 3).astype(np.float32)).to(dtype)
    for amax in (None, torch.tensor(1000.0), torch.tensor(0.5)):  # 0.5 < |x|: saturation
        q, scale = fmt.quantize_with_scale(x, amax=amax)
        x32 = x.float().numpy()
        expected, expected_scale = tensor_scaled_reference(
            x32, name, np.abs(x32).max() if amax is None else amax.numpy(), target)
        assert scale.item() == expected_scale
        assert q.dtype == dtype
        assert not mismatches(q, torch.from_numpy(expected).to(dtype), x32)


def test_tensor_scaling_edge_cases():
    fmt = get_format("fp8_e4m3")
    zeros = torch.zeros(8)
    assert torch.equal(fmt.quantize(zeros), zeros)
    with_nan = torch.tensor([1.0, float("nan"), 1000.0, -3.0])
    q, scale = fmt.quantize_with_scale(with_nan)
    assert scale.item() == 1.0  # non-finite amax: unscaled
    assert not mismatches(q, saturating_cast(with_nan.numpy(), "fp8_e4m3"))
    tiny = torch.tensor([1e-40, -3e-41])  # 448 / amax overflows: encode is float32's max (TE)
    q, scale = fmt.quantize_with_scale(tiny)
    encode = np.finfo(np.float32).max
    assert scale.item() == np.float32(1) / encode
    assert not mismatches(q, saturating_cast(tiny.numpy() * encode, "fp8_e4m3") * (np.float32(1) / encode))
