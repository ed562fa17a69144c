"""tensor_stats against numpy."""

import numpy as np
import pytest
import torch

from megatron.quant.capture.stats import LOG2_EDGES, pack_tensor_stats, tensor_stats, unpack_tensor_stats


def numpy_log2_histogram(values: np.ndarray) -> list[int]:
    """Counts per binade of |x| (finite, nonzero), with end bins below -40 and at or above +20."""
    mags = np.abs(values[np.isfinite(values) & (values != 0)]).astype(np.float64)
    binade = np.floor(np.log2(mags)).astype(np.int64)
    counts = [int((binade < LOG2_EDGES[0]).sum())]
    counts += [int((binade == e).sum()) for e in LOG2_EDGES[:-1]]
    counts.append(int((binade >= LOG2_EDGES[-1]).sum()))
    return counts


def awkward_tensor() -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(37, 11) * 3
    x[0, :4] = 0.0
    x[1, 0], x[1, 1], x[1, 2] = float("nan"), float("inf"), -float("inf")
    x[2, 0], x[2, 1] = 2.0 ** -45, -(2.0 ** 25)  # the two end bins
    x[3, 0] = 2.0 ** 3 * (1 - 2.0 ** -24)  # just below a power of two: binade 2, not 3
    x[3, 1], x[3, 2] = 2.0 ** -126 / 8, 8.0  # a subnormal; an exact power of two
    x[4, 0], x[4, 1] = 2.0 ** 19 * 1.5, 2.0 ** -40  # the last and first binade bins
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_tensor_stats_match_numpy(dtype):
    x = awkward_tensor().to(dtype)
    ref = x.float().numpy()
    finite = ref[np.isfinite(ref)].astype(np.float64)
    stats = tensor_stats(x)
    assert stats["numel"] == ref.size and stats["shape"] == [37, 11] and stats["dtype"] == str(dtype)[6:]
    assert stats["min"] == finite.min() and stats["max"] == finite.max()
    assert stats["absmax"] == np.abs(finite).max()
    assert stats["mean"] == pytest.approx(finite.mean(), rel=1e-5)
    assert stats["std"] == pytest.approx(finite.std(), rel=1e-5)
    assert stats["zeros"] == int((ref == 0).sum())
    assert stats["nans"] == int(np.isnan(ref).sum()) and stats["infs"] == int(np.isinf(ref).sum()) >= 2
    assert stats["log2_hist"]["edges"] == list(range(-40, 21))
    assert stats["log2_hist"]["counts"] == numpy_log2_histogram(ref)
    assert sum(stats["log2_hist"]["counts"]) + stats["zeros"] + stats["nans"] + stats["infs"] == ref.size


def test_tensor_stats_of_empty_and_all_nan_tensors():
    empty = tensor_stats(torch.empty(0, 4))
    assert empty["numel"] == 0 and empty["mean"] is None and sum(empty["log2_hist"]["counts"]) == 0
    nan = tensor_stats(torch.full((3,), float("nan")))
    assert nan["nans"] == 3 and nan["min"] is None and nan["std"] is None


def test_counts_stay_exact_beyond_float32_integers():
    x = torch.zeros(2**24 + 3)
    x[:2] = 1.0
    stats = tensor_stats(x)
    assert stats["zeros"] == 2**24 + 1 and stats["log2_hist"]["counts"][41] == 2


def test_tensor_stats_are_plain_python_numbers():
    stats = tensor_stats(awkward_tensor())
    scalars = [v for k, v in stats.items() if k not in ("shape", "dtype", "log2_hist")]
    assert all(type(v) in (int, float) for v in scalars)
    assert all(type(c) is int for c in stats["log2_hist"]["counts"])


@pytest.mark.parametrize("make", [awkward_tensor, lambda: torch.randn(5, 7)])
def test_packed_route_equals_tensor_stats(make):
    x = make()
    unpacked = unpack_tensor_stats(pack_tensor_stats(x).tolist(), x.shape, x.dtype)
    direct = tensor_stats(x)
    assert unpacked.keys() == direct.keys()
    for key, value in direct.items():
        assert unpacked[key] == (pytest.approx(value, rel=1e-5) if isinstance(value, float) else value)
