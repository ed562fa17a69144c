"""The kernels' overflow count without a division an element (``kernels.stats.overflow_threshold``):
for every scale, the threshold it gives is the least float32 whose quotient by the scale, as torch's
IEEE division rounds it, lies beyond the format's bound; below it no quotient does."""
import pytest
import torch

from megatron.quant.formats import get_format
from megatron.quant.formats.saturation import overflow_bound

pytestmark = pytest.mark.device

triton = pytest.importorskip("triton", reason="Triton does not import here: its kernels are not tested")
tl = triton.language


@triton.jit
def _thresholds(scale_ptr, out_ptr, N: tl.constexpr, BOUND: tl.constexpr, INCLUSIVE: tl.constexpr):
    from megatron.quant.kernels.stats import overflow_threshold

    i = tl.arange(0, N)
    tl.store(out_ptr + i, overflow_threshold(tl.load(scale_ptr + i), BOUND, INCLUSIVE))


def _scales(device) -> torch.Tensor:
    """Positive float32 scales over the whole range (subnormals and the largest included), and the
    scales that divide nothing: 0, -0, negative, Inf, NaN."""
    generator = torch.Generator().manual_seed(5)
    bits = torch.randint(1, 0x7F7FFFFF, (1000,), generator=generator, dtype=torch.int32)
    special = torch.tensor([1.0, 2.0 ** -126, 2.0 ** -149, 3.4028234663852886e38, 0.0, -0.0, -1.0,
                            float("inf"), float("nan"), 448.0, 1 / 448.0, 6.0, 2.0 ** -10])
    scales = torch.cat([bits.view(torch.float32), special, torch.ones(1024 - 1000 - len(special))])
    return scales.to(device)


def _beyond(a: torch.Tensor, scale: torch.Tensor, bound: float, inclusive: bool) -> torch.Tensor:
    """The oracle: torch's float32 division, compared as the torch statistics compare it."""
    ratio = a / scale
    return ratio >= bound if inclusive else ratio > bound


@pytest.mark.parametrize("name,options", [("fp8_e4m3", {}), ("fp8_e5m2", {}), ("hifp8", {}), ("mxfp4_e2m1", {}),
                                          ("nvfp4", {}), ("bf16", {}), ("fp16", {})])
def test_the_threshold_is_the_least_magnitude_whose_quotient_overflows(name, options, kernel_device):
    bound, inclusive = overflow_bound(get_format(name, **options))
    scales = _scales(kernel_device)
    out = torch.empty_like(scales)
    _thresholds[(1,)](scales, out, scales.numel(), float(bound), bool(inclusive))
    divides = scales > 0
    assert out[~divides].isnan().all()  # nothing overflows by division: the counts take only Inf
    largest = torch.full_like(scales, torch.finfo(torch.float32).max)
    finite = divides & torch.isfinite(out)
    assert not _beyond(largest, scales, bound, inclusive)[divides & ~finite].any()
    threshold = out[finite]
    below = (threshold.view(torch.int32) - 1).view(torch.float32)  # the float32 before it
    assert _beyond(threshold, scales[finite], bound, inclusive).all()
    assert not _beyond(below, scales[finite], bound, inclusive).any()
    assert finite.sum() > 400  # the scales whose threshold is a float32 (bf16: about half)
