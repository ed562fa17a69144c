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
    ("bf16", 16, ml_dtypes.finfo(ml_dtypes.bfloat16).max, ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_subnormal,
     None, "none"),
    ("fp16", 16, np.finfo(np.float16).max, np.finfo(np.float16).smallest_subnormal, None, "none"),
    ("hifp8", 8, 32768.0, 2.0**-22, None, "none"),
    ("fp8_e4m3", 8, 448.0, 2.0**-9, None, "tensor"),
    ("fp8_e5m2", 8, 57344.0, 2.0**-16, None, "tensor"),
    *[(name, ml_dtypes.finfo(ELEMENT_DTYPES[element]).bits, ml_dtypes.finfo(ELEMENT_DTYPES[element]).max,
       ml_dtypes.finfo(ELEMENT_DTYPES[element]).smallest_subnormal, 32, "block")
      for name, element in MX_ELEMENTS.items()],
    ("nvfp4", 4, 6.0, 0.5, 16, "block"),
    ("nvfp6", 6, 7.5, 0.125, 16, "block"),
]


@pytest.mark.parametrize("name, bits, max_value, min_positive, block_size, scaling", EXPECTED)
def test_attributes(name, bits, max_value, min_positive, block_size, scaling):
    fmt = get_format(name)
    assert (fmt.name, fmt.bits, fmt.block_size, fmt.scaling) == (name, bits, block_size, scaling)
    assert fmt.max_value == float(max_value) and fmt.min_positive == float(min_positive)
    assert fmt.needs_tensor_amax == (scaling == "tensor" or name.startswith("nvfp"))
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
    with pytest.raises(ValueError, match=r"rounding='up' is not one of \['nearest', 'stochastic', 'stochastic8'\]"):
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


ROUND_TRIP = [
    ("nvfp4", {}), ("nvfp4", {"block_shape": [16, 16]}), ("nvfp4", {"hadamard": 16, "rounding": "stochastic"}),
    ("mxfp4", {"hadamard": 32, "scale_mode": "even"}), ("mxfp8", {"block_shape": "32x32", "scale_mode": "ceil"}),
    ("fp8_e4m3", {"scaling": "block"}), ("fp8_e4m3", {"scaling": "block", "block_shape": (128, 128)}),
    ("fp8_e5m2", {"margin": 2, "power_of_two_scales": True}), ("fp8_e4m3", {"scaling": "none"}),
    ("hifp8", {"scaling": "tensor", "margin": 1}), ("fp8_e4m3", {"hadamard": 16, "hadamard_signs": [1, -1] * 8}),
]


@pytest.mark.parametrize("name, options", ROUND_TRIP)
def test_options_are_json_and_accepted_back(name, options):
    fmt = get_format(name, **options)
    stored = json.loads(json.dumps(fmt.options))  # as capture metadata and recipes (YAML lists) hold them
    again = get_format(name, **stored)
    assert again.options == fmt.options and type(again) is type(fmt)
    x = torch.randn(64, 128)
    assert torch.equal(again.quantize(x), fmt.quantize(x))


def test_block_shape_spellings_and_attributes():
    for spelling in ((16, 16), [16, 16], "16x16", " 16X16 "):
        fmt = get_format("nvfp4", block_shape=spelling)
        assert fmt.options["block_shape"] == (16, 16) and fmt.block_size == 16 and fmt.block_shape == (16, 16)
    assert get_format("nvfp4").block_shape == (1, 16) and get_format("mxfp4").block_shape == (1, 32)
    fmt = get_format("fp8_e4m3", scaling="block")
    assert ((fmt.name, fmt.scaling, fmt.block_size, fmt.needs_tensor_amax, fmt.max_value)
            == ("fp8_e4m3", "block", 128, False, 448.0))
    assert not get_format("nvfp4").transforms_operand and get_format("nvfp4", hadamard=16).transforms_operand


@pytest.mark.parametrize("name, options, message", [
    ("nvfp4", {"block_shape": (8, 16)}, r"nvfp4: block_shape=\(8, 16\) must be \(1, n\)"),
    ("nvfp4", {"block_shape": "16by16"}, r"block_shape='16by16' must be"),
    ("mxfp4", {"block_shape": [0, 0]}, r"block_shape=\[0, 0\] must be"),
    ("mxfp4", {"block_shape": 32}, r"block_shape=32 must be"),
    ("mxfp4", {"hadamard": 64}, r"hadamard=64 does not divide the block length 32"),
    ("fp8_e4m3", {"scaling": "block", "block_shape": (1, 96), "hadamard": 64}, r"does not divide the block length 96"),
    ("fp8_e4m3", {"margin": -1}, r"margin=-1 must be an integer >= 0"),
    ("fp8_e4m3", {"margin": 1.5}, r"margin=1.5 must be an integer >= 0"),
    ("fp8_e4m3", {"power_of_two_scales": 1}, r"power_of_two_scales=1 must be true or false"),
    ("fp8_e4m3", {"scaling": "block", "margin": 1},
     r"margin needs scaling in \['tensor', 'delayed'\], not scaling='block'"),
    ("fp8_e4m3", {"block_shape": (1, 128)}, r"block_shape needs scaling='block', not scaling='tensor'"),
    ("fp8_e4m3", {"scaling": "block", "overflow": "inf"}, r"overflow needs scaling in \['none', 'tensor', 'delayed'\]"),
    ("fp8_e5m2", {"scaling": "none", "power_of_two_scales": True}, r"power_of_two_scales needs scaling in"),
    ("hifp8", {"margin": 2}, r"hifp8: margin needs scaling in \['tensor', 'delayed'\]"),
    ("fp8_e4m3", {"amax_history_len": 16}, r"amax_history_len needs scaling='delayed', not scaling='tensor'"),
    ("fp8_e4m3", {"scaling": "delayed", "amax_history_len": 0}, r"amax_history_len=0 must be an integer >= 1"),
    ("fp8_e5m2", {"scaling": "delayed", "amax_compute_algo": "mean"}, r"amax_compute_algo='mean' is not one of"),
    ("fp8_e4m3", {"scaling": "delayed", "power_of_two_scales": True}, r"power_of_two_scales needs scaling in"),
    ("fp8_e4m3", {"scaling": "none", "hadamard": 16}, r"hadamard needs scaling in \['tensor', 'block'\]"),
    ("nvfp4", {"hadamard": 0}, r"hadamard=0 must be a power of two from 2 to 256"),
    ("nvfp4", {"hadamard": True}, r"hadamard=True must be a power of two"),
    ("nvfp4", {"margin": 1}, r"unknown option\(s\) \['margin'\]"),
])
def test_new_option_errors(name, options, message):
    with pytest.raises(ValueError, match=message):
        get_format(name, **options)


def test_list_cli_shows_the_options(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for text in ("block_shape=(1, 16)", "hadamard=- (power of two", "scale_mode=floor (floor|ceil|even|rceil)",
                 "scaling=tensor (tensor|none|block|delayed)", "margin=0 (integer >= 0)",
                 "power_of_two_scales=- (true|false)"):
        assert text in out, text
