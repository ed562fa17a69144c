"""HiFloat8 against en_dtypes.hifloat8 and the issue's specification.

en_dtypes overflows to Inf (|x| >= 40960 gives +-Inf); our default saturates to +-32768
as the issue asks, and ``overflow="inf"`` reproduces en_dtypes everywhere.
"""
import en_dtypes
import numpy as np
import pytest
import torch

from megatron.quant.formats import HiFloat8Format, get_format
from tests.formats._oracle import all_bf16, cast, element_values, mismatches, random_fp32

INPUTS = {"all bf16": all_bf16(), "random fp32": random_fp32(2_000_000, seed=3, lo=-30, hi=20)}
OVERFLOW_THRESHOLD = 40960.0


def _en_dtypes_codes(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(en_dtypes.hifloat8).view(np.uint8)


@pytest.mark.parametrize("label", list(INPUTS))
def test_overflow_inf_is_en_dtypes_everywhere(label):
    x = INPUTS[label]
    fmt = get_format("hifp8", overflow="inf")
    assert not mismatches(fmt.quantize(torch.from_numpy(x)), cast(x, "hifp8"), x)
    codes = fmt.encode(torch.from_numpy(x)).numpy()
    differ = codes != _en_dtypes_codes(x)
    assert not differ.any(), f"codes differ for {x[differ][:5]}"


@pytest.mark.parametrize("label", list(INPUTS))
def test_default_saturates_beyond_40960_and_is_en_dtypes_below(label):
    x = INPUTS[label]
    ours = get_format("hifp8").quantize(torch.from_numpy(x)).numpy()
    overflowing = np.abs(x) >= OVERFLOW_THRESHOLD
    assert not mismatches(ours, cast(x, "hifp8"), x, where=~overflowing)
    assert np.array_equal(ours[overflowing], np.sign(x[overflowing]) * 32768.0)


def test_code_table_layout_and_round_trip():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    values = HiFloat8Format.decode(codes)
    library = np.arange(256, dtype=np.uint8).view(en_dtypes.hifloat8).astype(np.float32)
    assert not mismatches(values, library)
    assert torch.equal(get_format("hifp8", overflow="inf").encode(values), codes)
    positive_finite = element_values("hifp8")
    positive_finite = positive_finite[positive_finite > 0]
    assert positive_finite.size == 126
    assert positive_finite.min() == 2.0**-22 and positive_finite.max() == 32768.0
    assert [values[c].item() for c in (0x6F, 0xEF)] == [np.inf, -np.inf] and np.isnan(values[0x80].item())


def test_issue_specification_points():
    fmt = get_format("hifp8")
    cases = {  # from the issue text: thresholds, denormals, ties away from zero
        2.0**-23: 2.0**-22,
        np.nextafter(np.float32(2.0**-23), np.float32(0)): 0.0,
        1.5 * 2.0**-22: 2.0**-21,
        1.0 + 1 / 16: 1.125,  # tie between 1.0 and 1.125: away
        -(2.0 + 1 / 8): -2.25,
        np.nextafter(np.float32(OVERFLOW_THRESHOLD), np.float32(0)): 32768.0,
        OVERFLOW_THRESHOLD: 32768.0,
        np.inf: 32768.0,
        -1e30: -32768.0,
        -0.0: 0.0,
    }
    x = torch.tensor(list(cases), dtype=torch.float32)
    assert fmt.quantize(x).tolist() == list(cases.values())
    assert fmt.encode(torch.tensor([-0.0])).item() == 0x00
    assert get_format("hifp8", overflow="inf").quantize(torch.tensor([OVERFLOW_THRESHOLD])).item() == np.inf
    assert torch.isnan(fmt.quantize(torch.tensor([np.nan]))).all()
    assert (fmt.max_value, fmt.min_positive, fmt.bits) == (32768.0, 2.0**-22, 8)


def test_decode_of_encode_is_quantize():
    x = torch.from_numpy(INPUTS["random fp32"])
    fmt = get_format("hifp8")
    assert not mismatches(HiFloat8Format.decode(fmt.encode(x)), fmt.quantize(x))


def test_scale_target_needs_tensor_scaling():
    with pytest.raises(ValueError, match="scale_target"):
        get_format("hifp8", scale_target=224.0)
    with pytest.raises(ValueError, match="scale_target"):
        get_format("hifp8", scaling="tensor", scale_target=-1.0)
    assert get_format("hifp8", scaling="tensor").options["scale_target"] == 32768.0
