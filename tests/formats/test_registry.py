"""Names, aliases, options, attributes and the values CLI."""
import json

import en_dtypes
import ml_dtypes
import numpy as np
import pytest
import torch

from megatron.quant.formats import get_format, is_passthrough, list_formats, quantize
from megatron.quant.formats.__main__ import main
from tests.formats._oracle import ELEMENT_DTYPES, MX_ELEMENTS

EXPECTED = [  # name, bits, max, smallest positive, block, scaling (from the issue and the oracles)
    ("fp32", 32, np.finfo(np.float32).max, np.finfo(np.float32).smallest_subnormal, None, "none"),
    ("bf16", 16, ml_dtypes.finfo(ml_dtypes.bfloat16).max, ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_subnormal, None, "none"),
    ("fp16", 16, np.finfo(np.float16).max, np.finfo(np.float16).smallest_subnormal, None, "none"),
    ("hifp8", 8, 32768.0, 2.0**-22, None, "none"),
    ("fp8_e4m3", 8, 448.0, 2.0**-9, None, "tensor"),
    ("fp8_e5m2", 8, 57344.0, 2.0**-16, None, "tensor"),
    *[(name, ml_dtypes.finfo(ELEMENT_DTYPES[element]).bits, ml_dtypes.finfo(ELEMENT_DTYPES[element]).max,
       ml_dtypes.finfo(ELEMENT_DTYPES[element]).smallest_subnormal, 32, "block") for name, element in MX_ELEMENTS.items()],
    ("nvfp4", 4, 6.0, 0.5, 16, "block"),
]


@pytest.mark.parametrize("name, bits, max_value, min_positive, block_size, scaling", EXPECTED)
def test_attributes(name, bits, max_value, min_positive, block_size, scaling):
    fmt = get_format(name)
    assert (fmt.name, fmt.bits, fmt.block_size, fmt.scaling) == (name, bits, block_size, scaling)
    assert fmt.max_value == float(max_value) and fmt.min_positive == float(min_positive)
    assert fmt.needs_tensor_amax == (scaling == "tensor" or name == "nvfp4")
    json.dumps(fmt.options)


def test_names_and_aliases():
    assert sorted(list_formats()) == sorted(row[0] for row in EXPECTED)
    assert get_format("mxfp8").name == "mxfp8_e4m3" and get_format("MXFP4").name == "mxfp4_e2m1"
    assert get_format("none").name == "fp32"
    assert [is_passthrough(n) for n in ("none", "fp32", "bf16", "fp16", "hifp8", "mxfp8")] == [True] * 4 + [False] * 2
    with pytest.raises(ValueError, match="unknown numeric format 'fp7'.*hifp8"):
        get_format("fp7")
    with pytest.raises(ValueError, match="unknown numeric format"):
        is_passthrough("fp7")


def test_bad_options_name_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['block'\].*scale_mode"):
        get_format("mxfp8", block=16)
    with pytest.raises(ValueError, match=r"rounding='up' is not one of \['nearest', 'stochastic'\]"):
        get_format("hifp8", rounding="up")
    with pytest.raises(ValueError, match="scale_mode='round'"):
        get_format("mxfp4", scale_mode="round")
    with pytest.raises(ValueError, match="seed='1' must be an integer"):
        get_format("nvfp4", rounding="stochastic", seed="1")
    with pytest.raises(ValueError, match="valid options: none"):
        get_format("fp32", rounding="stochastic")
    with pytest.raises(ValueError, match="dtype torch.float64"):
        get_format("hifp8").quantize(torch.zeros(2, dtype=torch.float64))


def test_functional_quantize_and_empty_tensors():
    x = torch.randn(5, 64)
    assert torch.equal(quantize(x, "mxfp4", axis=0), get_format("mxfp4").quantize(x, axis=0))
    assert quantize(torch.zeros(0, 32), "nvfp4").shape == (0, 32)


def test_values_cli_prints_every_hifp8_code(capsys):
    assert main(["values", "hifp8"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if not line.startswith("#")][1:]
    assert [int(row[0]) for row in rows] == list(range(256))
    printed = np.array([float(row[3]) for row in rows], np.float32)
    library = np.arange(256, dtype=np.uint8).view(en_dtypes.hifloat8).astype(np.float32)
    assert np.array_equal(printed, library, equal_nan=True)
    assert main(["list"]) == 0 and "mxfp4_e2m1" in capsys.readouterr().out
    assert main(["values", "bf16"]) == 2 and "8-bit" in capsys.readouterr().err


@pytest.mark.parametrize("name", list_formats())
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_input_is_never_modified(name, rounding):
    # The routines work in place on their own temporaries; x must not be one of them.
    fmt = get_format(name) if name == "fp32" else get_format(name, rounding=rounding)
    x = torch.randn(4, 64) * 100
    x[0, :3] = torch.tensor([float("nan"), float("inf"), 0.0])
    before = x.clone()
    for axis in (-1, 0):
        fmt.quantize_with_scale(x, axis=axis)
    assert torch.equal(x.nan_to_num(), before.nan_to_num())
