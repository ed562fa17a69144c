"""A per-tensor scale from the tensor's own amax (FP8 current scaling) in two launches: the amax kernel's
rows, then the quantizing kernel, which folds them into the scale itself (no host sync, no torch op
between the two), bit for bit the torch path's (``formats.base.encode_scale``), NaN, Inf, zeros and
subnormal amaxes included."""
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


@pytest.fixture
def many_programs(monkeypatch):
    """Small programs: amax rows from more blocks than rows (each program walks several), and many
    quantizing programs, as on a GPU."""
    from megatron.quant.kernels import amax, elementwise

    monkeypatch.setattr(amax, "program_elements", lambda on_device: 64)
    monkeypatch.setattr(amax, "MAX_ROWS", 8)
    monkeypatch.setattr(elementwise, "program_elements", lambda on_device: 256)


@pytest.mark.parametrize("name, options, dtype", CASES, ids=str)
def test_the_two_launch_tensor_scale_is_the_torch_paths(name, options, dtype, kernel_device, many_programs):
    fmt = get_format(name, **options)
    twin = triton_twin(fmt)
    cases = {"values": wide_values((4, 1040), seed=5, dtype=dtype, device=kernel_device, specials=False),
             "specials": wide_values((24, 64), seed=6, dtype=dtype, device=kernel_device),
             "zeros": -torch.zeros(70, device=kernel_device, dtype=dtype),
             "all NaN": torch.full((9,), float("nan"), device=kernel_device, dtype=dtype),
             "tiny": torch.tensor([1e-38, -2e-39, 0.0]).to(kernel_device, dtype)}
    for case, x in cases.items():
        assert_same_result(twin.quantize_for_gemm(x, -1), fmt.quantize_for_gemm(x, -1), f"{case}, the GEMM operand")
        assert_same_result(twin.quantize(x, -1), fmt.quantize(x, -1), f"{case}, quantized")


def test_two_launches_and_nothing_between(kernel_device, monkeypatch):
    from megatron.quant.kernels import amax, elementwise, ops

    launched = []
    kernels = {(module, name): getattr(module, name) for module, name in
               ((amax, "_amax_kernel"), (elementwise, "_elementwise_kernel"))}
    for (module, name), kernel in kernels.items():
        monkeypatch.setattr(module, name, _Counted(kernel, name, launched))
    twin = triton_twin(get_format("fp8_e4m3"))
    x = wide_values((16, 128), seed=7, dtype=torch.bfloat16, device=kernel_device, specials=False)
    with WorkCount() as outside:
        twin.quantize_for_gemm(x, -1)
    assert outside.ops == Counter({"elementwise_tensor_scaled": 1}), outside.ops  # one operator, no torch op
    assert launched == ["_amax_kernel", "_elementwise_kernel"]
    for (module, name), kernel in kernels.items():  # the launches recorded, not run (the interpreter copies)
        monkeypatch.setattr(module, name, _Counted(None, name, launched))
    with WorkCount() as inside:  # the operator's body: two allocations and the two launches
        ops.quantize_elementwise_tensor_scaled._init_fn(x, [0, 0, 1, 1, 0, 1], twin._contract_json, x.dtype, True)
    assert inside.launches == 0 and inside.host_syncs == 0, inside.ops
    assert launched[2:] == ["_amax_kernel", "_elementwise_kernel"]


class _Counted:
    """A kernel whose launches are recorded by name, then run (``kernel`` None: not run)."""

    def __init__(self, kernel, name: str, launched: list) -> None:
        self.kernel, self.name, self.launched = kernel, name, launched

    def __getitem__(self, grid):
        self.launched.append(self.name)
        return (lambda *args, **kwargs: None) if self.kernel is None else self.kernel[grid]
