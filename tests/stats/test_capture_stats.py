"""tensor_stats against numpy."""

import math

import numpy as np
import pytest
import torch

from megatron.quant.stats import LOG2_EDGES, packing, tensor_stats
from megatron.quant.stats import reference as stats_module


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


def tree_sum(values: list) -> float:
    """The definition of the sums' order, written out: adjacent pairs, zero-padded to a power of two."""
    size = 1
    while size < len(values):
        size *= 2
    values = values + [0.0] * (size - len(values))
    while len(values) > 1:
        values = [values[i] + values[i + 1] for i in range(0, len(values), 2)]
    return values[0]


def test_sums_are_float64_in_the_defined_order(monkeypatch):
    """mean and std come from float64 sums of x and x^2 in the order ``packing`` defines (so the
    kernels can give the same bits), whatever the tile size; exact for a constant tensor."""
    x = awkward_tensor()
    finite = [v for v in x.double().flatten().tolist() if math.isfinite(v)]
    flat = [v if math.isfinite(v) else 0.0 for v in x.double().flatten().tolist()]
    n = len(finite)
    mean = tree_sum(flat) / n
    expected_std = math.sqrt(tree_sum([v * v for v in flat]) / n - mean * mean)
    monkeypatch.setitem(stats_module._TILE_ELEMENTS, "cpu", 16)
    stats = tensor_stats(x)
    assert stats["mean"] == mean and stats["std"] == expected_std
    assert stats["std"] == pytest.approx(np.std(finite), rel=1e-12)
    constant = tensor_stats(torch.full((1000,), 3.0))
    assert constant["mean"] == 3.0 and constant["std"] == 0.0


def test_pairwise_sum_is_the_tree_of_adjacent_pairs():
    values = torch.tensor([1e16, 1.0, -1e16, 1.0, 3.0])  # order-sensitive in float64
    assert packing.pairwise_sum(values.double()).item() == tree_sum(values.double().tolist()) == 3.0  # not 4
    assert packing.pairwise_sum(torch.zeros(0, dtype=torch.float64)).item() == 0.0
