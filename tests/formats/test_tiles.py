"""2D block scaling (one scale per n x n tile of the last two dimensions) against a per-tile
Python loop over the 1D oracles; W and W^T quantize to the same values."""
import numpy as np
import pytest
import torch

from megatron.quant.formats import get_format
from megatron.quant.formats.random_bits import RandomBits, Shard
from tests.formats._blocks_oracle import mx_reference, nvfp4_blocks_reference, tiled_reference
from tests.formats._oracle import MX_ELEMENTS, mismatches


def _weights(shape, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = rng.integers(-12, 12, (*shape[:-1], 1))  # row-wise magnitudes: tiles mix binades
    w = (rng.standard_normal(shape) * np.exp2(rows)).astype(np.float32)
    w[..., :3, :5] = 0.0  # part of a tile
    return w


@pytest.mark.parametrize("shape", [(64, 48), (40, 37), (2, 33, 20)])  # whole tiles, padded ones, a batch
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_16x16_tiles(shape, dtype):
    x = torch.from_numpy(_weights(shape, seed=len(shape))).to(dtype)
    w = x.float().numpy()
    amax = np.abs(w).max()
    expected, expected_scale = tiled_reference(w, 16, lambda b: nvfp4_blocks_reference(b, amax))
    fmt = get_format("nvfp4", block_shape=(16, 16))
    for axis in (-1, -2):
        q, scale = fmt.quantize_with_scale(x, axis=axis)
        assert q.dtype == dtype
        assert not mismatches(q, torch.from_numpy(expected).to(dtype), w)
        assert not mismatches(scale, expected_scale)


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp4_e2m1"])
@pytest.mark.parametrize("scale_mode", ["floor", "rceil"])
def test_mx_32x32_tiles(name, scale_mode):
    w = _weights((96, 70), seed=3)
    element = MX_ELEMENTS[name]
    expected, expected_scale = tiled_reference(w, 32, lambda b: mx_reference(b, element, scale_mode, block=b.shape[-1]))
    q, scale = get_format(name, block_shape="32x32", scale_mode=scale_mode).quantize_with_scale(torch.from_numpy(w))
    assert not mismatches(q, expected, w) and not mismatches(scale, expected_scale)


@pytest.mark.parametrize("name, side", [("nvfp4", 16), ("mxfp4", 32), ("fp8_e4m3", 128)])
def test_w_and_w_transposed_quantize_alike(name, side):
    options = {"scaling": "block"} if name == "fp8_e4m3" else {}
    fmt = get_format(name, block_shape=[side, side], **options)
    w = torch.from_numpy(_weights((3 * side + 5, 2 * side), seed=side))
    q = fmt.quantize(w, axis=-1)
    assert torch.equal(fmt.quantize(w, axis=0), q)
    assert torch.equal(fmt.quantize(w.t().contiguous(), axis=-1).t(), q)
    operand, tensor_scale = fmt.quantize_for_gemm(w.t().contiguous())
    same, same_scale = fmt.quantize_for_gemm(w)
    assert torch.equal(operand.t(), same) and (tensor_scale is None or torch.equal(tensor_scale, same_scale))


def test_stochastic_tiles_use_each_elements_own_noise():
    """A tensor-parallel shard of whole tiles rounds as its slice of the whole tensor."""
    fmt = get_format("nvfp4", block_shape=(16, 16), rounding="stochastic")
    w = torch.from_numpy(_weights((64, 32), seed=9))
    key = RandomBits.derive("weight")
    amax = w.abs().amax()
    whole = fmt.quantize(w, amax=amax, noise=key)
    shards = [fmt.quantize(part, amax=amax, noise=key.sharded(Shard(dim=0, rank=r, world=2)))
              for r, part in enumerate(w.chunk(2, dim=0))]
    assert torch.equal(torch.cat(shards), whole)
    assert not torch.equal(whole, get_format("nvfp4", block_shape=(16, 16)).quantize(w))


def test_tiles_need_two_dimensions():
    with pytest.raises(ValueError, match="at least two dimensions"):
        get_format("nvfp4", block_shape=(16, 16)).quantize(torch.ones(32))
