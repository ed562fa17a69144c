"""No quantization copies host data to the device: a host-to-device copy waits for the device (a
stream sync), so one per quantization stalls the kernel launches queued behind it. On an H200 that
made te-fp8-current, te-fp8-delayed and te-nvfp4 train 7-8x slower than bf16 (their per-tensor
scale's numerator was a tensor made from a Python float; RHT's signs were copied on every call).

Checked without a GPU, on the meta device: a function mode sees every tensor made from host data
(``torch.tensor``, ``new_tensor``, ``as_tensor``) and every copy from another device onto x's. The
first quantization may place a format's constants on the device once; the second must move nothing."""
import pytest
import torch
from torch.overrides import TorchFunctionMode

from megatron.quant.formats import get_format
from tests.device.test_formats_device import CASES, IDS

_FROM_HOST_DATA = {torch.tensor, torch.as_tensor, torch.Tensor.new_tensor}
_MOVES = {torch.Tensor.to, torch.Tensor.copy_, torch.Tensor.cuda}


class HostCopies(TorchFunctionMode):
    """Records the calls that bring host data, or a tensor of another device, onto ``device``."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device, self.calls = device, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.device == self.device:
            sources = [a for a in args if isinstance(a, torch.Tensor)]
            if func in _FROM_HOST_DATA or (func in _MOVES and any(s.device != self.device for s in sources)):
                self.calls.append(getattr(func, "__qualname__", str(func)))
        return out


@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_quantizing_a_device_tensor_copies_nothing_from_the_host(name, options):
    fmt = get_format(name, **options)
    x = torch.empty(128, 256, device="meta", dtype=torch.bfloat16)
    for axis in (-1, 0):
        fmt.quantize(x, axis=axis)  # constants may reach the device here, once
        with HostCopies(x.device) as copies:
            fmt.quantize(x, axis=axis)
        assert copies.calls == [], f"axis {axis}"
