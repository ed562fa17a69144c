"""A per-tensor scale from the tensor's own amax (FP8 current scaling, NVFP4's FP32 tensor scale) in two
launches: the amax kernel's rows, then the quantizing kernel, which folds them into the scale itself (no
host sync, no torch op between the two), bit for bit the torch path's (``formats.base.encode_scale``,
``formats.nvfp``), NaN, Inf, zeros and subnormal amaxes included."""
from collections import Counter

import pytest
import torch

from bench.gpu.step_work import WorkCount
from megatron.quant.formats import get_format
from tests.kernels._compare import assert_same_result, triton_twin, wide_values

# (format, options, input dtype): NaN propagated and skipped, power-of-two scales, stochastic rounding
CASES = [("fp8_e4m3", {}, torch.bfloat16), ("fp8_e4m3", {"nonfinite": "te"}, torch.float32),
         ("fp8_e4m3", {"power_of_two_scales": True}, torch.bfloat16),
         ("fp8_e5m2", {"rounding": "stochastic"}, torch.float32)]
# NVFP4: per-tensor FP32 scales, 4over6 (which reads the amax too), NaN skipped (16x16 tiles and NVFP6 take
# the same path: test_block_kernels.py and test_nvfp6_kernels.py hold their bits, NaN and Inf included)
BLOCK_CASES = [("nvfp4", {}, torch.bfloat16), ("nvfp4", {"four_over_six": "mse", "e4m3_max": 256}, torch.bfloat16),
               ("nvfp4", {"nonfinite": "te", "rounding": "stochastic"}, torch.float32)]


@pytest.fixture
def many_programs(monkeypatch):
    """Small programs: amax rows from more blocks than rows (each program walks several), and many
    quantizing programs, as on a GPU."""
    from megatron.quant.kernels import amax, blocks, elementwise

    monkeypatch.setattr(amax, "program_elements", lambda on_device: 64)
    monkeypatch.setattr(amax, "MAX_ROWS", 8)
    monkeypatch.setattr(elementwise, "program_elements", lambda on_device: 256)
    monkeypatch.setattr(blocks, "program_elements", lambda on_device: 256)


def _amaxes(dtype, device, shape: tuple = (4, 1040)) -> dict:
    """Tensors whose amaxes are ordinary, NaN or Inf (propagated or skipped), zero, all NaN, subnormal."""
    return {"values": wide_values(shape, seed=5, dtype=dtype, device=device, specials=False),
            "specials": wide_values((24, 64), seed=6, dtype=dtype, device=device),
            "zeros": -torch.zeros(2, 70, device=device, dtype=dtype),
            "all NaN": torch.full((16, 16), float("nan"), device=device, dtype=dtype),
            "tiny": torch.tensor([[1e-38, -2e-39, 0.0] * 6]).to(device, dtype)}


@pytest.mark.parametrize("name, options, dtype", CASES, ids=str)
def test_the_two_launch_tensor_scale_is_the_torch_paths(name, options, dtype, kernel_device, many_programs):
    fmt = get_format(name, **options)
    twin = triton_twin(fmt)
    for case, x in _amaxes(dtype, kernel_device).items():
        assert_same_result(twin.quantize_for_gemm(x, -1), fmt.quantize_for_gemm(x, -1), f"{case}, the GEMM operand")
        assert_same_result(twin.quantize(x, -1), fmt.quantize(x, -1), f"{case}, quantized")


@pytest.mark.parametrize("name, options, dtype", BLOCK_CASES, ids=str)
def test_nvfp_tensor_scale_in_two_launches_is_the_torch_paths(name, options, dtype, kernel_device, many_programs):
    fmt = get_format(name, **options)
    twin = triton_twin(fmt)
    for case, x in _amaxes(dtype, kernel_device, (2, 160)).items():  # amax rows from several programs
        assert_same_result(twin.quantize_for_gemm(x, 0), fmt.quantize_for_gemm(x, 0), f"{case}, the GEMM operand")
        assert_same_result(twin.quantize_with_scale(x, -1), fmt.quantize_with_scale(x, -1), f"{case}, quantized")
        if twin.dual_axis and x.shape[-1] <= 70:  # both axes from one read (a few tiles: the interpreter is slow)
            assert_same_result(sum(twin.quantize_for_gemm_both(x), ()), sum(fmt.quantize_for_gemm_both(x), ()),
                               f"{case}, both axes")


# format, the quantization, its one operator, its kernels, the operator's body with arguments (contract, x)
LAUNCHES = [("fp8_e4m3", lambda fmt, x: fmt.quantize_for_gemm(x, -1), "elementwise_tensor_scaled",
             "_elementwise_kernel",
             lambda ops, c, x: ops.quantize_elementwise_tensor_scaled._init_fn(x, None, NOISE, c, x.dtype, True,
                                                                               False)),
            ("nvfp4", lambda fmt, x: fmt.quantize_for_gemm(x, -1), "blocks", "_block_kernel",
             lambda ops, c, x: ops.quantize_blocks._init_fn(x, None, NOISE, c, 1, True, 0, None, x.dtype, True)),
            ("nvfp4", lambda fmt, x: fmt.quantize_for_gemm_both(x), "blocks_both_axes", "_dual_kernel",
             lambda ops, c, x: ops.quantize_blocks_both_axes._init_fn(x, None, NOISE, NOISE, c, True, True))]
NOISE = [0, 0, 1, 1, 0, 1]  # no noise: ``noise.noise_args(None, ...)``


@pytest.mark.parametrize("name, quantize, operator, kernel_name, body", LAUNCHES, ids=lambda v: str(v)[:24])
def test_two_launches_and_nothing_between(name, quantize, operator, kernel_name, body, kernel_device, monkeypatch):
    from megatron.quant.kernels import amax, blocks, elementwise, ops

    module = blocks if kernel_name in ("_block_kernel", "_dual_kernel") else elementwise
    launched = []
    kernels = {(amax, "_amax_kernel"): amax._amax_kernel, (module, kernel_name): getattr(module, kernel_name)}
    for (owner, kernel), run in kernels.items():
        monkeypatch.setattr(owner, kernel, _Counted(run, kernel, launched))
    twin = triton_twin(get_format(name))
    x = wide_values((16, 128), seed=7, dtype=torch.bfloat16, device=kernel_device, specials=False)
    with WorkCount() as outside:
        quantize(twin, x)
    assert outside.ops == Counter({operator: 1}), outside.ops  # one operator, no torch op
    assert launched == ["_amax_kernel", kernel_name]
    for (owner, kernel), run in kernels.items():  # the launches recorded, not run (the interpreter copies)
        monkeypatch.setattr(owner, kernel, _Counted(None, kernel, launched))
    with WorkCount() as inside:  # the operator's body: allocations and the two launches
        body(ops, twin._contract_json, x)
    assert inside.launches == 0 and inside.host_syncs == 0, inside.ops
    assert launched[2:] == ["_amax_kernel", kernel_name]


class _Counted:
    """A kernel whose launches are recorded by name, then run (``kernel`` None: not run)."""

    def __init__(self, kernel, name: str, launched: list) -> None:
        self.kernel, self.name, self.launched = kernel, name, launched

    def __getitem__(self, grid):
        self.launched.append(self.name)
        return (lambda *args, **kwargs: None) if self.kernel is None else self.kernel[grid]
