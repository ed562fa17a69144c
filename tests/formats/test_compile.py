"""The formats compile: torch.compile (inductor, whole graph, no break) gives the same
bits as eager. HiF8 has the most bit tricks; the benchmark compiles every format."""
import torch

from megatron.quant.formats import get_format
from tests.formats._oracle import all_bf16, mismatches, random_fp32


def test_compiled_hifp8_matches_eager_bit_for_bit():
    torch._dynamo.reset()
    fmt = get_format("hifp8")
    compiled = torch.compile(fmt.quantize, fullgraph=True, dynamic=False)
    for data in (all_bf16(), random_fp32(1 << 16, seed=7)):
        x = torch.from_numpy(data)
        assert not mismatches(compiled(x), fmt.quantize(x), x)
