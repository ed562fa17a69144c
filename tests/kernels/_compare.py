"""Inputs and bit-for-bit comparison for the kernel tests."""
import torch


def wide_values(shape, seed: int, dtype=torch.float32, device="cpu", lo: int = -30, hi: int = 20,
                specials: bool = True) -> torch.Tensor:
    """Random signs and mantissas over binades 2**lo..2**hi, values on exact grid ties, and with
    ``specials`` +-0, +-Inf and NaN among them, in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for size in shape:
        n *= size
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(lo, hi, (n,), generator=g).float())
    ties = torch.randint(-64, 64, (n // 8,), generator=g).float() * 0.0625 + 0.03125  # on 1/32 steps
    x[: n // 8] = ties
    if specials:
        x[n // 8: n // 8 + 6] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 448.0])
    return x[torch.randperm(n, generator=g)].reshape(shape).to(device=device, dtype=dtype)


def triton_twin(fmt):
    """``fmt`` run by its Triton kernels (the torch path: ``fmt`` itself)."""
    from megatron.quant.kernels.triton_format import TritonFormat  # imports Triton: only once it is known to

    return TritonFormat(fmt, fmt)


def assert_same_bits(ours: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """Equal dtype, shape and bits (any NaN equals any NaN; -0 differs from +0)."""
    assert ours.dtype == expected.dtype and ours.shape == expected.shape, what
    a, b = ours.detach().float().cpu(), expected.detach().float().cpu()
    nan = a.isnan() & b.isnan()
    bad = (a.view(torch.int32) != b.view(torch.int32)) & ~nan
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.numel()} differ, e.g. {a[bad][:4]} vs {b[bad][:4]}"


def assert_same_result(ours, expected, what: str = "") -> None:
    """Tensors, or tuples of tensors and Nones, equal bit for bit."""
    if isinstance(expected, tuple):
        assert isinstance(ours, tuple) and len(ours) == len(expected), what
        for o, e in zip(ours, expected):
            assert (o is None) == (e is None), what
            if e is not None:
                assert_same_bits(o, e, what)
    else:
        assert_same_bits(ours, expected, what)
