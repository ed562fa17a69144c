"""Capture statistics computed on the test device equal the CPU's to the bit, sums included: their
order is defined (``stats.packing``), not left to each device's reductions."""
import math

import pytest
import torch

from megatron.quant import stats
from megatron.quant.formats import get_format

pytestmark = pytest.mark.device


def _assert_same(dev: dict, cpu: dict) -> None:
    assert dev.keys() == cpu.keys()
    for key, value in cpu.items():
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(dev[key]), key
        else:
            assert dev[key] == value, key


def _data() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 64, generator=g) * torch.logspace(-8, 8, 64)  # columns across 16 decades
    x[0, :4] = torch.tensor([0.0, float("inf"), float("nan"), 1e-45])
    return x


def test_tensor_stats_on_device_equal_cpu(device):
    x = _data()
    _assert_same(stats.tensor_stats(x.to(device)), stats.tensor_stats(x))


@pytest.mark.parametrize("name", ["hifp8", "fp8_e4m3", "mxfp8", "mxfp4", "nvfp4"])
def test_quant_stats_on_device_equal_cpu(device, name):
    fmt = get_format(name)
    x = _data().nan_to_num(nan=0.0, posinf=3e4)
    _assert_same(stats.quant_stats(x.to(device), fmt), stats.quant_stats(x, fmt))
