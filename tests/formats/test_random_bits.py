"""The stateless noise source: uniform, independent across keys, a pure function of
(key, global element index), identical eager and compiled."""
import numpy as np
import pytest
import torch
from scipy import stats

from megatron.quant.formats.random_bits import RandomBits, Shard, global_index


def test_uniform_24_bit_values_in_unit_interval():
    u = RandomBits.derive(0).uniform((1 << 20,), "cpu")
    assert u.dtype == torch.float32 and 0 <= u.min() and u.max() < 1
    assert torch.equal(u * 2**24, torch.floor(u * 2**24))  # exactly 24-bit fractions
    # Kolmogorov-Smirnov against U[0, 1), and every 24-bit top byte equally likely.
    assert stats.kstest(u.numpy(), "uniform").pvalue > 1e-4
    counts = np.bincount((u.numpy() * 256).astype(int), minlength=256)
    assert stats.chisquare(counts).pvalue > 1e-4


def test_consecutive_elements_are_not_correlated():
    u = RandomBits.derive(1).uniform((1 << 20,), "cpu").double() - 0.5
    for lag in (1, 2, 32, 1024):
        corr = float((u[:-lag] * u[lag:]).mean() / u.var())
        assert abs(corr) < 5 / np.sqrt(u.numel()), (lag, corr)


def test_streams_keyed_by_operand_layer_iteration_microbatch_are_independent():
    root = RandomBits.derive("seed", 0)
    keys = [root.child("decoder.layers.0.mlp.linear_fc1", "fprop.input", 5, 0),
            root.child("decoder.layers.1.mlp.linear_fc1", "fprop.input", 5, 0),   # another layer
            root.child("decoder.layers.0.mlp.linear_fc1", "fprop.weight", 5, 0),  # another operand
            root.child("decoder.layers.0.mlp.linear_fc1", "fprop.input", 6, 0),   # next iteration
            root.child("decoder.layers.0.mlp.linear_fc1", "fprop.input", 5, 1)]   # next micro-batch
    n = 1 << 18
    streams = torch.stack([k.uniform((n,), "cpu") for k in keys]).double() - 0.5
    corr = np.corrcoef(streams.numpy())
    off_diagonal = corr[~np.eye(len(keys), dtype=bool)]
    assert np.abs(off_diagonal).max() < 5 / np.sqrt(n), corr
    # Different keys never coincide elementwise beyond chance (1 in 2**24).
    assert int((streams[0] == streams[1]).sum()) < 10


def test_derive_is_stable_and_typed():
    assert RandomBits.derive("a", 1) == RandomBits.derive("a", 1)
    assert RandomBits.derive("a", 1) != RandomBits.derive("a", "1")
    assert RandomBits.derive(0).key == int.from_bytes(
        __import__("hashlib").blake2b(b"int:0", digest_size=8).digest(), "little")


@pytest.mark.parametrize("shape,dim,groups", [((6, 8), 1, 1), ((6, 8), 0, 1), ((12, 4, 5), 0, 3), ((3, 4, 10), -1, 1)])
def test_global_index_of_shards(shape, dim, groups):
    world = 2
    full = torch.arange(int(np.prod(shape)) * world, dtype=torch.int32)
    global_shape = list(shape)
    d = dim % len(shape)
    global_shape[d] *= world
    full = full.view(global_shape)
    if groups > 1:  # [groups * heads]: each group's run of heads is split across ranks
        grouped = full.view(*global_shape[:d], groups, -1, *global_shape[d + 1:])
        parts = grouped.chunk(world, dim=d + 1)
        parts = [p.reshape(shape) for p in parts]
    else:
        parts = full.chunk(world, dim=d)
    for rank in range(world):
        assert torch.equal(global_index(shape, torch.device("cpu"), Shard(dim, rank, world, groups)), parts[rank])


def test_index_wraps_at_32_bits():
    # This rank's row of a global tensor of 2**33 elements starts at 2**32 + 4: indices wrap.
    index = global_index((1, 4), torch.device("cpu"), Shard(dim=0, rank=2 ** 30 + 1, world=2 ** 31))
    assert index.tolist() == [[4, 5, 6, 7]]


def test_compiled_equals_eager():
    bits = RandomBits.derive("compiled")
    compiled = torch.compile(lambda: bits.uniform((64, 48), "cpu"), dynamic=False)
    assert torch.equal(compiled(), bits.uniform((64, 48), "cpu"))


def _lowbias32(x: int) -> int:
    """Wellons' lowbias32 on Python ints (the oracle: unbounded ints, explicit masking)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_tensor_hash_equals_a_python_integer_oracle():
    bits = RandomBits.derive("oracle", 7)
    k0, k1 = bits.key & 0xFFFFFFFF, bits.key >> 32
    expected = []
    for i in range(257):
        h = _lowbias32(((i * 0x9E3779B1) & 0xFFFFFFFF) ^ k0)
        expected.append((_lowbias32(h ^ k1) >> 8) / 2**24)
    assert bits.uniform((257,), "cpu").tolist() == expected
