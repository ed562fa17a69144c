"""Stochastic rounding: always one of the two neighbours (taken from the oracle dtypes),
unbiased (a z-test that a deliberately biased rounding fails), seeded, stateless and
shard-consistent."""
import ml_dtypes
import numpy as np
import pytest
import torch

from megatron.quant.formats import get_format
from megatron.quant.formats.random_bits import RandomBits, Shard
from tests.formats._oracle import MX_ELEMENTS, all_bf16, element_values, random_fp32

ELEMENT_OF = {**MX_ELEMENTS, "nvfp4": "fp4_e2m1", "hifp8": "hifp8", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
FORMATS = ["bf16", "fp16", "hifp8", "fp8_e4m3", "fp8_e5m2", *MX_ELEMENTS, "nvfp4"]


def representable(name: str) -> np.ndarray:
    """Sorted finite values of the format's element, both signs."""
    if name in ("bf16", "fp16"):
        codes = np.arange(1 << 16, dtype=np.uint16)
        values = codes.view(ml_dtypes.bfloat16 if name == "bf16" else np.float16).astype(np.float32)
        return np.unique(values[np.isfinite(values)])
    positive = element_values(ELEMENT_OF[name])
    return np.unique(np.concatenate([-positive, positive]))


def neighbours(values: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(largest representable <= x, smallest representable >= x) for x inside the range."""
    upper = values[np.searchsorted(values, x, side="left")]
    lower = values[np.searchsorted(values, x, side="right") - 1]
    return lower, upper


def stochastic(name: str, seed: int = 0):
    options = {"scaling": "none"} if name.startswith("fp8") else {}
    return get_format(name, rounding="stochastic", seed=seed, **options)


def _rows(fmt, scaled_values: np.ndarray, repeats: int) -> tuple[torch.Tensor, int]:
    """``repeats`` rows of one block each: an anchor at the element max (fixing a block
    format's scale to 1, and NVFP4's global scale too) followed by the values."""
    width = fmt.block_size or len(scaled_values) + 1
    row = np.zeros(width, np.float32)
    row[0] = fmt.max_value
    row[1 : 1 + len(scaled_values)] = scaled_values
    return torch.from_numpy(np.tile(row, (repeats, 1))), 1 + len(scaled_values)


@pytest.mark.parametrize("name", FORMATS)
@np.errstate(divide="ignore", invalid="ignore")  # NVFP4 blocks with scale 0 are skipped below
def test_result_is_always_a_neighbour(name):
    values = representable(name)
    top = values[-1]
    pool = np.concatenate([all_bf16(), random_fp32(200_000, seed=5)])
    pool = pool[np.isfinite(pool) & (np.abs(pool) <= top)]
    fmt = stochastic(name)
    x = torch.from_numpy(pool[: (pool.size // 32) * 32].reshape(-1, 32))
    q, scale = fmt.quantize_with_scale(x)
    q, scale = q.numpy().ravel(), scale.expand_as(x).numpy().ravel()
    # NVFP4 encodes x * (1 / scale) and decodes (element * E4M3 scale) * FP32 scale: its values
    # are element * scale to within two float32 roundings.
    nvfp4 = name == "nvfp4"
    scaled_x = x.numpy().ravel() * (np.float32(1) / scale) if nvfp4 else x.numpy().ravel() / scale
    usable = scale != 0  # NVFP4 blocks whose scale is 0 quantize to 0 (checked elsewhere)
    # MX's floor scale leaves x / scale up to 2**(emax+1): beyond max it saturates to max.
    lower, upper = neighbours(values, np.clip(scaled_x[usable], -top, top))
    tolerance = 2.0**-22 if nvfp4 else 0.0
    hit = (np.isclose(q[usable], lower * scale[usable], rtol=tolerance, atol=0)
           | np.isclose(q[usable], upper * scale[usable], rtol=tolerance, atol=0))
    assert hit.all(), f"{name}: {scaled_x[usable][~hit][:5]} -> {q[usable][~hit][:5]}"


def _bias_z_scores(name: str, repeats: int = 20_000) -> np.ndarray:
    """z-scores of the sample mean against x for values at several positions between two
    neighbours (the element max anchors block scales at 1)."""
    values = representable(name)
    positive = values[(values > 0) & (np.abs(np.log2(np.maximum(values, 1e-45))) < 60)]
    rng = np.random.default_rng(6)
    low = rng.choice(positive[:-1], 12)
    step = positive[np.searchsorted(positive, low) + 1] - low
    fractions = np.array([0.02, 0.1, 0.25, 0.5, 0.75, 0.9] * 2)
    targets = (low + fractions * step).astype(np.float32)
    targets[6:] *= -1
    fmt = stochastic(name, seed=11)
    x, used = _rows(fmt, targets, repeats)
    q = fmt.quantize(x)[:, 1:used].double().numpy()
    lower, upper = neighbours(values, targets)
    sigma = np.sqrt((upper - targets.astype(np.float64)) * (targets - lower.astype(np.float64)) / repeats)
    return (q.mean(0) - targets) / sigma


@pytest.mark.parametrize("name", ["bf16", "fp16", "hifp8", "fp8_e4m3", "mxfp8_e5m2", "mxfp4_e2m1", "nvfp4"])
def test_unbiased(name):
    z = _bias_z_scores(name)
    assert np.abs(z).max() < 5, z


def test_the_bias_test_catches_coarse_noise(monkeypatch):
    # A plausible bug: 4-bit noise, so P(up) = ceil(16 f) / 16 instead of f.
    exact = RandomBits.uniform

    def coarse_uniform(self, shape, device):
        return torch.floor(exact(self, shape, device) * 16) / 16

    monkeypatch.setattr(RandomBits, "uniform", coarse_uniform)
    assert np.abs(_bias_z_scores("hifp8")).max() > 5


def test_seeded_reproducible_and_stateless():
    x = torch.randn(4, 64)
    first, again = stochastic("mxfp4_e2m1", seed=3), stochastic("mxfp4_e2m1", seed=3)
    calls = [first.quantize(x) for _ in range(2)]
    # No stream state: every call with the same seed and no key gives the same values.
    assert torch.equal(calls[0], calls[1]) and torch.equal(calls[0], again.quantize(x))
    assert not torch.equal(calls[0], stochastic("mxfp4_e2m1", seed=4).quantize(x))
    key = RandomBits.derive("layer", 1)
    keyed = first.quantize(x, noise=key)
    assert torch.equal(keyed, again.quantize(x, noise=key)) and not torch.equal(keyed, calls[0])
    assert not torch.equal(keyed, first.quantize(x, noise=key.child("iteration", 1)))
    by_generator = [first.quantize(x, generator=torch.Generator().manual_seed(9)) for _ in range(2)]
    assert torch.equal(*by_generator)
    with pytest.raises(ValueError, match="noise= or generator="):
        first.quantize(x, noise=key, generator=torch.Generator())


@pytest.mark.parametrize("name", ["hifp8", "mxfp8_e4m3", "nvfp4", "bf16"])
def test_a_shard_rounds_as_its_slice_of_the_whole(name):
    """Keyed by global element index: each tensor-parallel shard gets exactly the noise of its
    slice of the unsharded tensor (block formats with blocks inside the shard, and a fixed amax)."""
    fmt = stochastic(name)
    x = torch.randn(8, 128) * 3
    amax = x.abs().amax()
    key = RandomBits.derive("site", "operand")
    whole = fmt.quantize(x, axis=-1, amax=amax, noise=key)
    shards = [fmt.quantize(part, axis=-1, amax=amax, noise=key.sharded(Shard(dim=1, rank=r, world=2)))
              for r, part in enumerate(x.chunk(2, dim=1))]
    assert torch.equal(torch.cat(shards, dim=1), whole)
    unsharded = [fmt.quantize(part, axis=-1, amax=amax, noise=key) for part in x.chunk(2, dim=1)]
    assert not torch.equal(torch.cat(unsharded, dim=1), whole)  # what every rank drawing alike gives
