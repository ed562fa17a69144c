"""The cast kernels' short paths against the torch path, bit for bit: rounding to nearest by float32
additions (``elementwise.nearest_even``), exact below 2**22 grid steps, on values far beyond a grid's
max (up to float32's max, where that rounding is not exact and only the overflow rule may decide);
block ids in int32 or, past 2**31 blocks, int64 (``blocks.block_walk``); an unsharded tensor's noise
indexed without divisions."""
import pytest
import torch

from megatron.quant.formats import get_format
from megatron.quant.formats.random_bits import RandomBits, Shard
from tests.kernels._compare import assert_same_result, triton_twin, wide_values

pytestmark = pytest.mark.device


def _far_values(device, dtype) -> torch.Tensor:
    """Every binade of float32 and, at the largest grid steps (2**5 for E4M3, 2**13 for E5M2 and
    2**15 for HiF8, 2**5 for FP16), odd multiples around 2**22 and 2**23 steps (where adding
    1.5 * 2**23 no longer rounds to an integer), both signs."""
    x = wide_values((16, 64), seed=21, lo=-149, hi=127)
    steps = torch.tensor([2.0**5, 2.0**13, 2.0**15])[:, None]
    around = torch.tensor([2.0**22 - 1, 2.0**22 + 1, 2.0**22 + 3, 2.0**23 - 1, 2.0**23 + 1, 2.0**24 + 2])
    far = (steps * around).flatten()
    x.view(-1)[: 2 * far.numel()] = torch.cat([far, -far])
    return x.to(device=device, dtype=dtype)


@pytest.mark.parametrize("name, options", [
    ("fp8_e4m3", {"scaling": "none"}), ("fp8_e4m3", {"scaling": "none", "overflow": "inf"}),
    ("fp8_e5m2", {"scaling": "none", "overflow": "inf"}), ("fp8_e5m2", {"scaling": "none"}), ("hifp8", {}),
    ("hifp8", {"overflow": "inf"}), ("fp16", {})])
def test_values_far_beyond_a_grid_round_as_the_torch_path(name, options, kernel_device):
    fmt = get_format(name, **options)
    for dtype in (torch.float32, torch.bfloat16):
        x = _far_values(kernel_device, dtype)
        assert_same_result(triton_twin(fmt).quantize(x), fmt.quantize(x), f"{name} {options} {dtype}")


def test_block_ids_past_int32_take_int64_arithmetic(kernel_device):
    from megatron.quant.kernels.blocks import block_walk

    contract = get_format("mxfp8_e4m3").kernel_contract
    _, small = block_walk(torch.empty(1000, 64, device="meta"), contract, 1)
    columns = small.columns  # the ids of the last program run past the blocks by up to columns - 1
    edge = 2**31 - 1 - columns
    assert not small.wide
    assert not block_walk(torch.empty(edge, 32, device="meta"), contract, 1)[1].wide
    assert block_walk(torch.empty(edge + 1, 32, device="meta"), contract, 1)[1].wide
    assert block_walk(torch.empty(32 * (edge + 1), 16, 16, device="meta"), contract, 1)[1].wide  # along a middle axis


@pytest.mark.parametrize("name, options", [("mxfp8_e4m3", {}), ("nvfp4", {"block_shape": (16, 16)})])
def test_int64_block_ids_give_the_int32_ids_bits(name, options, kernel_device, monkeypatch):
    """The int64 path (tensors of 2**31 blocks, too large to test) forced on a small tensor."""
    from megatron.quant.kernels import blocks

    walk = blocks.block_walk
    monkeypatch.setattr(blocks, "block_walk", lambda *args: (lambda s, lay: (s, lay._replace(wide=True)))(*walk(*args)))
    fmt = get_format(name, **options)
    x = wide_values((3, 40, 48), seed=8, device=kernel_device, lo=-20, hi=12)
    for axis in ((0, 1, -1) if "block_shape" not in options else (-1,)):
        assert_same_result(triton_twin(fmt).quantize(x, axis), fmt.quantize(x, axis), f"{name} axis {axis}")


def test_unsharded_noise_is_indexed_by_constants(kernel_device):
    """Unsharded, ``noise.global_index`` is the local index: its arguments are ones (and a zero offset),
    which Triton compiles as constants, so the kernel divides by nothing (the stochastic tests hold
    the bits); a shard keeps its layout."""
    from megatron.quant.kernels.noise import noise_args

    bits = RandomBits.derive("noise", 3)
    assert noise_args(bits, (6, 40, 72))[2:] == (1, 1, 0, 1)
    assert noise_args(bits.sharded(Shard(dim=1, rank=1, world=2)), (6, 40, 72))[2:] == (72, 40, 40, 2 * 40 * 72)
