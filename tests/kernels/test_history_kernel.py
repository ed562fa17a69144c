"""Delayed scaling on the device: the quantizing kernel takes its scale from the history's amax itself, and
one launch of the history kernel records the tensor's amax; the history and the next scale's amax are the
torch path's bit for bit (``layers.delayed.updated_history``, held to Transformer Engine's loop in
tests/layers/test_delayed.py), NaN, Inf, zero and subnormal amaxes included, with no torch op and no
host sync between the launches of a delayed-scaled GEMM operand."""
import math
from collections import Counter

import pytest
import torch

from bench.gpu.step_work import WorkCount
from megatron.quant.formats import get_format
from megatron.quant.layers.delayed import AmaxHistory, updated_history
from megatron.quant.layers.operand import quantize_operand
from megatron.quant.recipes.operands import OperandSpec
from tests.kernels._compare import assert_same_bits, triton_twin, wide_values

AMAXES = [3.0, 0.5, 7.0, 0.0, -0.0, float("nan"), 2.0, float("inf"), 1e-40, 0.0, 0.25, 6e4, 1.0]


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("length, dtype", [(1, torch.float32), (3, torch.bfloat16), (1500, torch.float32)], ids=str)
def test_the_history_kernel_updates_as_the_torch_path(algo, length, dtype, kernel_device):
    """1500: longer than one step of the kernel's loop, its oldest entries random, some NaN."""
    from megatron.quant.kernels.history import updated_history as on_device

    history = wide_values((length,), seed=3, device=kernel_device).abs() if length > 3 else torch.zeros(length)
    history, for_scale = history.to(kernel_device), torch.tensor(math.inf, device=kernel_device)
    ours = history, for_scale
    for value in AMAXES:
        amax = torch.tensor(value, dtype=dtype, device=kernel_device)
        history, for_scale = updated_history(history, for_scale, amax.float(), algo)
        ours = on_device(*ours, amax, algo)
        assert_same_bits(ours[0], history, f"history after {value}")
        assert_same_bits(ours[1], for_scale, f"the scale's amax after {value}")


def test_a_delayed_operand_takes_three_kernels_and_no_host_sync(kernel_device, monkeypatch):
    """The quantizing kernel (the scale from the history's amax, x's amax rows written), their fold into
    x's amax, the history update; the only torch ops are the copy of the scale's amax (the operand keeps
    the amax it was scaled from) and the record's two copies into the history's buffers, which keep their
    addresses for a CUDA graph's replays (tests/layers/test_graph_safety.py)."""
    from megatron.quant.kernels import amax, elementwise, history

    monkeypatch.setenv("CUSTOM_QUANT_KERNELS", "triton")
    fmt = get_format("fp8_e4m3", scaling="delayed", amax_history_len=4)
    spec = OperandSpec(fmt=triton_twin(fmt), name="fprop.input", history=AmaxHistory(4, "max").to(kernel_device))
    x = wide_values((16, 128), seed=7, dtype=torch.bfloat16, device=kernel_device, specials=False)
    top = x.abs().max().float()
    for step in range(2):
        done = quantize_operand(x, spec, None, None)
        assert done.amax.item() == (math.inf if step == 0 else top)  # the scale's amax, kept as it was
    assert_same_bits(spec.history.amax_history.cpu(), torch.stack([top * 0, top * 0, top, top]), "x's amax recorded")
    assert_same_bits(done.values, fmt.quantize_for_gemm(x, -1, done.amax)[0], "scaled from the history")
    launched = []
    for owner, name in ((elementwise, "_elementwise_kernel"), (amax, "_fold_kernel"), (amax, "_amax_kernel"),
                        (history, "_history_kernel")):  # recorded, not run: the interpreter copies tensors
        monkeypatch.setattr(owner, name, _Counted(name, launched))
    with WorkCount() as count:
        quantize_operand(x, spec, None, None)
    assert count.ops == Counter({"elementwise_tensor_scaled": 1, "clone": 1, "copy_": 2}), count.ops
    assert count.host_syncs == 0
    assert launched == ["_elementwise_kernel", "_fold_kernel", "_history_kernel"]


class _Counted:
    """A kernel whose launches are recorded by name and not run."""

    def __init__(self, name: str, launched: list) -> None:
        self.name, self.launched = name, launched

    def __getitem__(self, grid):
        self.launched.append(self.name)
        return lambda *args, **kwargs: None
