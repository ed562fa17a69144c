"""Every format gives the same bits on the GPU as on the CPU, eager and under torch.compile.

The CPU bits are the ones the format tests check against ml_dtypes / en_dtypes, so equality here
carries that exactness to the GPU. Inputs: every bfloat16 bit pattern (zeros, subnormals, Inf,
NaN, every binade) and heavy-tailed random float32, in each input dtype, along both axes.
"""
import numpy as np
import pytest
import torch

from megatron.quant.formats import get_format, list_formats
from tests.formats._oracle import all_bf16, random_fp32

pytestmark = pytest.mark.device

# Options a format may take; each format is tested with every set it accepts.
_OPTION_SETS = ({}, {"scale_mode": "rceil"}, {"overflow": "inf"}, {"scale_mode": "even"}, {"scaling": "block"},
                {"margin": 1, "power_of_two_scales": True}, {"block_shape": [16, 16]}, {"hadamard": 16})


def _cases() -> list[tuple[str, dict]]:
    cases = []
    for name in list_formats():
        for options in _OPTION_SETS:
            try:
                get_format(name, **options)
            except ValueError:
                continue
            cases.append((name, options))
    return cases


CASES = _cases()
IDS = [name + "".join(f"-{k}={v}".replace(" ", "") for k, v in options.items()) for name, options in CASES]


def _inputs(dtype: torch.dtype) -> torch.Tensor:
    data = np.concatenate([all_bf16(), random_fp32(1 << 16, seed=3)])
    return torch.from_numpy(data).reshape(-1, 64).to(dtype)  # 2048 rows: blocks of 16 and 32 on both axes


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-equal, except that any NaN equals any NaN (payloads are not part of the formats)."""
    a, b = a.cpu(), b.cpu()
    nan = a.isnan()
    if not torch.equal(nan, b.isnan()):
        return False
    ints = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return torch.equal(a[~nan].view(ints), b[~nan].view(ints))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_eager_on_device_equals_cpu(on_gpu, device, name, options, dtype):
    fmt = get_format(name, **options)
    x = _inputs(dtype)
    for axis in (-1, 0):
        assert _same_bits(fmt.quantize(x.to(device), axis=axis), fmt.quantize(x, axis=axis)), f"axis {axis}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_compiled_on_device_equals_cpu(on_gpu, device, name, options, dtype):
    # CPU compile is covered by tests/formats/test_compile.py; here every format compiles on the GPU.
    fmt = get_format(name, **options)
    torch._dynamo.reset()  # every format shares quantize's code object: stay under the recompile limit
    compiled = torch.compile(fmt.quantize, fullgraph=True, dynamic=False)
    x = _inputs(dtype)
    assert _same_bits(compiled(x.to(device)), fmt.quantize(x))
