"""The statistics the quantization kernels take in the same pass (``kernels.stats``) against
capture's torch path: ``quantize_with_stats`` gives the torch path's values and scales bit for bit,
its exact fields equal ``capture_stats``' (NaN, Inf, zeros, min, max, absmax, overflow, underflow), and
its full statistics (sums, histograms, block statistics) equal ``pack_stats``' bit for bit, for every
kind of kernel, block axis, dtype and rounding, in one program or many."""
import math

import pytest
import torch

from megatron.quant.formats import get_format
from megatron.quant.formats.random_bits import RandomBits
from megatron.quant.stats import capture_stats, exact_fields_from_counts, pack_stats, packing
from tests.kernels._compare import assert_same_result, triton_twin, wide_values

pytestmark = pytest.mark.device

CASES = [  # (format name, options, axes)
    ("bf16", {}, (-1,)),
    ("fp16", {}, (-1,)),
    ("fp8_e4m3", {}, (-1,)),
    ("fp8_e5m2", {"rounding": "stochastic"}, (-1,)),
    ("hifp8", {}, (-1,)),
    ("hifp8", {"scaling": "tensor", "overflow": "inf"}, (-1,)),
    ("mxfp6_e3m2", {"scale_mode": "ceil"}, (1,)),
    ("fp8_e4m3", {"scaling": "tensor", "power_of_two_scales": True}, (-1,)),
    ("mxfp8_e4m3", {}, (0, 1, -1)),
    ("mxfp4_e2m1", {"rounding": "stochastic", "scale_mode": "rceil"}, (0, -1)),
    ("mxfp8_e4m3", {"block_shape": (32, 32), "nonfinite": "te"}, (-1,)),
    ("fp8_e4m3", {"scaling": "block"}, (0, -1)),
    ("fp8_e4m3", {"scaling": "block", "block_shape": (128, 128), "power_of_two_scales": False}, (-1,)),
    ("nvfp4", {}, (0, -1)),
    ("nvfp4", {"block_shape": (16, 16), "rounding": "stochastic"}, (-1,)),
    ("nvfp4", {"nonfinite": "te"}, (-1,)),
]
EXACT = ("numel", "min", "max", "absmax", "zeros", "nans", "infs", "overflow", "overflow_ratio", "underflow",
         "underflow_ratio")


def _input(shape, dtype, device):
    """Wide values with specials, a block holding NaN, saturating values and values that underflow."""
    x = wide_values(shape, seed=11, lo=-40, hi=18)
    x.view(-1)[:7] = torch.tensor([3e38, -1e5, 1e-30, 2.0**-140, 5e4, -7e4, 1e9])
    return x.to(device=device, dtype=dtype)


@pytest.fixture(params=["one program", "many programs"])
def programs(request, monkeypatch, device):
    """Kernels with the interpreter's large programs, or with many small ones (so that the rows of
    partials are reduced across programs) on CPU."""
    if request.param == "many programs" and device.type == "cpu":
        from megatron.quant.kernels import amax, blocks, elementwise

        for module in (amax, blocks, elementwise):
            monkeypatch.setattr(module, "program_elements", lambda on_device: 512)
    return request.param


DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Every case in every input dtype with the interpreter's large programs; with many small programs (the
# partials reduced across programs, a step that reads neither the dtype nor the format) each case once, the
# dtype turning over the cases.
GRID = [(*case, dtype, "one program") for case in CASES for dtype in DTYPES] + [
    (*case, DTYPES[i % len(DTYPES)], "many programs") for i, case in enumerate(CASES)]


@pytest.mark.parametrize("name,options,axes,dtype,programs", GRID, indirect=["programs"],
                         ids=lambda v: str(v) if not isinstance(v, tuple) else "")
def test_statistics_in_the_pass_equal_the_torch_statistics(name, options, axes, dtype, programs, kernel_device):
    fmt = get_format(name, **options)
    twin = triton_twin(fmt)
    noise = RandomBits.derive("counts", name)
    x = _input((48, 160), dtype, kernel_device)
    for axis in axes:
        q, scale, counts = twin.quantize_with_stats(x, axis, noise=noise)
        assert_same_result((q, scale), fmt.quantize_with_scale(x, axis, noise=noise), f"axis {axis}")
        if not twin.serves(x):  # a cast to x's own dtype: nothing to quantize, the torch path counts
            assert counts is None
            continue
        expected = capture_stats(x, fmt, axis, q=q, scale=scale, level="counts")
        ours = exact_fields_from_counts(counts.tolist(), x.numel())
        assert {key: ours[key] for key in EXACT} == {key: expected[key] for key in EXACT}, f"axis {axis}"
        q, scale, packed = twin.quantize_with_stats(x, axis, noise=noise, full=True)
        reference = pack_stats(x, fmt, axis, q=q, scale=scale)
        differ = [name for name, a, b in zip(packing.SCALARS, packed.tolist(), reference.tolist()) if a != b]
        assert not differ and torch.equal(packed, reference), f"axis {axis}: {differ}"
        full = capture_stats(x, fmt, axis, q=q, scale=scale, level="full")
        assert capture_stats(x, fmt, axis, q=q, scale=scale, level="full", kernel_stats=packed) == full
        assert full["stats_sampled"] == x.numel()


def test_statistics_see_an_all_special_tensor_and_a_given_amax(programs, kernel_device):
    fmt = get_format("fp8_e4m3", scaling="tensor")
    x = torch.full((4, 64), math.nan, device=kernel_device)
    x[0, 0] = math.inf
    q, scale, packed = triton_twin(fmt).quantize_with_stats(x, -1, full=True)
    fields = capture_stats(x, fmt, -1, q=q, scale=scale, kernel_stats=packed)
    assert (fields["nans"], fields["infs"], fields["min"], fields["absmax"], fields["mean"]) == (255, 1, None, None,
                                                                                              None)
    assert torch.equal(packed, pack_stats(x, fmt, -1, q=q, scale=scale))
    y = _input((8, 64), torch.bfloat16, kernel_device)
    amax = torch.tensor(1e-3, device=kernel_device)  # a TP-reduced amax far below the shard's: overflow
    q, scale, counts = triton_twin(fmt).quantize_with_stats(y, -1, amax)
    expected = capture_stats(y, fmt, -1, amax, q=q, scale=scale, level="counts")
    assert exact_fields_from_counts(counts.tolist(), y.numel())["overflow"] == expected["overflow"] > 0


@pytest.mark.parametrize("name,options,axis", [("nvfp4", {"hadamard": 16, "rounding": "stochastic"}, 0),
                                               ("mxfp4_e2m1", {"hadamard": 32}, 1), ("nvfp4", {"hadamard": 16}, -1)])
def test_hadamard_transforms_run_inside_the_kernel_statistics_included(name, options, axis, kernel_device,
                                                                        monkeypatch):
    """A transform whose groups are the format's blocks (te-nvfp4's wgrad operands along the token
    axis) is applied by the kernel, never by torch: values, GEMM operand, amax and statistics are the
    torch path's bits."""
    from megatron.quant.formats.hadamard import Hadamard

    fmt, noise = get_format(name, **options), RandomBits.derive("rht")
    x = _input((64, 96, 32), torch.bfloat16, kernel_device)
    expected = {"quantize": fmt.quantize(x, axis, noise=noise), "gemm": fmt.quantize_for_gemm(x, axis, noise=noise),
                "amax": fmt.amax_of(x, axis), "scale": fmt.quantize_with_scale(x, axis, noise=noise)}
    monkeypatch.setattr(Hadamard, "_apply", lambda *a, **k: pytest.fail("transformed in torch"))
    twin = triton_twin(fmt)
    assert_same_result(twin.quantize(x, axis, noise=noise), expected["quantize"])
    assert_same_result(twin.quantize_for_gemm(x, axis, noise=noise), expected["gemm"])
    assert_same_result(twin.amax_of(x, axis), expected["amax"])
    q, scale, packed = twin.quantize_with_stats(x, axis, noise=noise, full=True)
    assert_same_result((q, scale), expected["scale"])
    monkeypatch.undo()
    assert torch.equal(packed, pack_stats(x, fmt, axis, q=q, scale=scale))


def test_a_transform_the_kernel_does_not_apply_leaves_the_statistics_to_torch(kernel_device):
    fmt = get_format("fp8_e4m3", scaling="block", block_shape=(1, 32), hadamard=16)  # groups of 16 in 32-blocks
    x = _input((32, 64), torch.bfloat16, kernel_device)
    q, scale, counts = triton_twin(fmt).quantize_with_stats(x, -1, full=True)
    assert counts is None
    assert_same_result((q, scale), fmt.quantize_with_scale(x, -1))



def test_statistics_launches_hold_16_values_a_thread_up_to_2048():
    """Fewer warps for the statistics' programs of up to 2048 values (their reductions across lanes and
    warps cost each thread alike, whatever its share of values); larger ones keep Triton's rule."""
    from megatron.quant.kernels.launch import launch_options
    from megatron.quant.kernels.stats import COUNTS, FULL, NONE

    assert [launch_options(n, FULL)["num_warps"] for n in (512, 1024, 2048)] == [1, 2, 4]
    assert launch_options(1024, COUNTS) == {**launch_options(1024), "num_warps": 2}
    assert launch_options(1024, NONE) == launch_options(1024)
    assert launch_options(16384, FULL) == launch_options(16384)
