"""Delayed scaling: the amax-history update against a loop written from Transformer Engine's
kernel (amax_and_scale_update), and a linear layer whose GEMM operands are scaled from the
amaxes of earlier calls, checked step by step against formats applied by hand."""
import math

import numpy as np
import pytest
import torch

from megatron.quant.layers.delayed import AmaxHistory, updated_history
from tests.layers._helpers import gemm, transformer_config

TARGET = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}


def te_update(history: list, scale: float, amax: float, algo: str, target: float) -> tuple[list, float]:
    """TE PyTorch's default update for one tensor, the fused ``kernel_bulk`` (TE d0067d0,
    ``transformer_engine/common/recipe/delayed_scaling.cu`` lines 163-252), in its own layout:
    slot 0 stages the new amax; only when it is not 0 (``if (last_amax != 0.0f)``, line 186) the
    roll moves entries 1..L-1 down, appends slot 0 last and zeroes slot 0, and amax = fmaxf over
    them (from 0); ``most_recent`` takes slot 0; scale = target / amax unless that amax is 0 or
    not finite (then kept, lines 237-242)."""
    staged = [amax] + history[1:]
    length = len(staged)
    chosen = 0.0
    rolled = staged
    if amax != 0:
        rolled = [staged[i + 1] if i < length - 1 else staged[0] for i in range(length)]
        for value in rolled:
            chosen = chosen if math.isnan(value) else max(chosen, value)  # fmaxf skips NaN
        rolled = [0.0] + rolled[1:]
    if algo == "most_recent":
        chosen = amax
    new_scale = float(np.float32(target) / np.float32(chosen)) if math.isfinite(chosen) and chosen > 0 else scale
    return rolled, new_scale


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("length", [1, 2, 5])
def test_history_window_matches_te_kernel(algo, length):
    amaxes = [3.0, 0.5, 7.0, 0.0, float("nan"), 2.0, float("inf"), 1.0, 0.0, 0.0, 0.25, 0.125, 4.0, 0.1]
    te_history, te_scale = [0.0] * length, 1.0
    history, for_scale = torch.zeros(length), torch.tensor(math.inf)
    for amax in amaxes:
        te_history, te_scale = te_update(te_history, te_scale, amax, algo, 448.0)
        history, for_scale = updated_history(history, for_scale, torch.tensor(amax), algo)
        encode = 1.0 if not math.isfinite(for_scale.item()) else float(np.float32(448.0) / np.float32(for_scale.item()))
        assert encode == te_scale, (amax, history, for_scale)
        # TE's history after a roll is [0, the L-1 newest]; ours keeps the L newest.
        assert torch.allclose(history[1:], torch.tensor(te_history[1:], dtype=torch.float32), rtol=0, atol=0,
                              equal_nan=True)


def test_an_all_zero_operand_neither_rolls_the_history_nor_changes_the_scale():
    """The issue's case: with "max" and a history of 2, the step after an all-zero tensor still
    sees the large amax (TE PR #825, "Avoid amax roll for non-run modules"); rolling the zero in
    would drop it and scale the next tensor 4x too large."""
    history = AmaxHistory(2, "max")
    for amax in (8.0, 2.0, 0.0):
        history.record(torch.tensor(amax))
    assert history.amax_history.tolist() == [8.0, 2.0] and history.amax_for_scale.item() == 8.0
    history.record(torch.tensor(1.0))
    assert history.amax_history.tolist() == [2.0, 1.0] and history.amax_for_scale.item() == 2.0


def test_record_reduces_nothing_without_a_group_and_follows_the_device():
    history = AmaxHistory(3, "max")
    assert history.scale_amax(torch.device("cpu")).item() == math.inf  # TE's initial scale 1
    history.record(torch.tensor(2.0))
    history.record(torch.tensor(5.0))
    history.record(torch.tensor(1.0))
    assert history.amax_history.tolist() == [2.0, 5.0, 1.0] and history.amax_for_scale.item() == 5.0
    history.record(torch.tensor(1.5))
    history.record(torch.tensor(0.5))  # 5.0 has left the window of 3
    assert history.amax_for_scale.item() == 1.5


def test_histories_stay_float32_in_a_16_bit_model():
    """Float16Module calls .bfloat16() on the model: the amaxes must not be rounded to bf16."""
    history = AmaxHistory(2, "most_recent")
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    model.add_module("histories", history)
    model.bfloat16()
    assert model[0].weight.dtype == torch.bfloat16
    assert history.amax_history.dtype == history.amax_for_scale.dtype == torch.float32
    amax = torch.tensor(1.0 + 2.0**-20)  # not a bf16 value
    history.record(amax)
    assert history.amax_for_scale.item() == amax.item() and history.amax_history[-1].item() == amax.item()


def _linear(recipe_formats, parallel_config=None):
    from megatron.quant.layers.linear import QuantColumnParallelLinear
    from megatron.quant.layers.linear_function import LinearQuant

    config = transformer_config(**(parallel_config or {}))
    layer = QuantColumnParallelLinear(64, 32, config=config, init_method=torch.nn.init.normal_, bias=False,
                                      gather_output=False)
    layer.configure_quant(LinearQuant.from_formats(recipe_formats), None)
    return layer


def _delayed_formats(length: int, algo: str) -> dict:
    from megatron.quant.formats import get_format
    from megatron.quant.recipes.operands import LINEAR_OPERANDS

    e4m3 = get_format("fp8_e4m3", scaling="delayed", amax_history_len=length, amax_compute_algo=algo)
    e5m2 = get_format("fp8_e5m2", scaling="delayed", amax_history_len=length, amax_compute_algo=algo)
    return {key: e5m2 if "grad_output" in key else e4m3 for key in LINEAR_OPERANDS}


def _by_hand(fmt, x: torch.Tensor, axis: int, amax_for_scale: float):
    """The operand the format makes with the scale a history's amax gives (None: TE's scale 1)."""
    amax = torch.tensor(fmt.max_value if amax_for_scale is None else amax_for_scale)  # target / max = 1
    return fmt.quantize_for_gemm(x, axis=axis, amax=amax)


@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_linear_layer_scales_each_operand_from_earlier_amaxes(parallel, algo):
    """Three forward+backward calls with growing inputs: call t's operands use the amax of calls
    before t (by the window rule), Y/dX/dW equal the hand-made scaled GEMMs, and the histories
    hold the operands' amaxes."""
    formats = _delayed_formats(2, algo)
    layer = _linear(formats)
    gen = torch.Generator().manual_seed(0)
    seen = {"x": [], "w": [], "dy": []}
    for step, size in enumerate((1.0, 20.0, 0.05)):
        with torch.no_grad():  # an in-place update, as an optimizer step: the weight is quantized anew
            layer.weight.mul_(size)
        weight = layer.weight.detach().clone()
        x = (torch.randn(16, 1, 64, generator=gen) * size).requires_grad_()
        dy = torch.randn(16, 1, 32, generator=gen) * size * 3
        layer.weight.grad = None
        out, _ = layer(x)
        out.backward(dy)

        def previous(values):
            window = values[-2:] if algo == "max" else values[-1:]
            return max(window) if window else None

        x_op = _by_hand(formats["fprop.input"], x.detach(), -1, previous(seen["x"]))
        w_op = _by_hand(formats["fprop.weight"], weight, 1, previous(seen["w"]))
        dy_op = _by_hand(formats["dgrad.grad_output"], dy, -1, previous(seen["dy"]))
        assert torch.equal(out.detach(), gemm(lambda a, b: torch.matmul(a, b.t()), x_op, w_op)), step
        assert torch.equal(x.grad, gemm(lambda a, b: a.matmul(b), dy_op, w_op)), step
        expected_dw = gemm(lambda a, b: a.t().matmul(b), (dy_op[0].reshape(16, 32), dy_op[1]),
                           (x_op[0].reshape(16, 64), x_op[1]))
        assert torch.equal(layer.weight.grad, expected_dw), step
        seen["x"].append(x.detach().abs().max().item())
        seen["w"].append(weight.abs().max().item())
        seen["dy"].append(dy.abs().max().item())
    histories = layer.amax_histories
    assert histories["fprop_input"].amax_history.tolist() == pytest.approx(seen["x"][-2:], rel=0)
    assert histories["dgrad_grad_output"].amax_history.tolist() == pytest.approx(seen["dy"][-2:], rel=0)
    assert histories["fprop_weight"].amax_history.tolist() == pytest.approx(seen["w"][-2:], rel=0)
    # dgrad's weight is fprop's quantized copy (same format, no blocks): its history stays unused.
    assert histories["dgrad_weight"].amax_history.tolist() == [0.0, 0.0]


def test_an_unchanged_weight_is_quantized_once_with_its_first_scale(parallel):
    layer = _linear(_delayed_formats(4, "max"))
    for _ in range(3):
        out, _ = layer(torch.randn(8, 1, 64))
        out.sum().backward()
    assert layer.amax_histories["fprop_weight"].amax_history.tolist()[:3] == [0.0, 0.0, 0.0]
    assert layer.amax_histories["fprop_input"].amax_history.tolist()[0] == 0.0
    assert layer.amax_histories["fprop_input"].amax_history.tolist()[1] > 0


def test_histories_are_in_the_state_dict_and_reconfiguring_resets_them(parallel):
    from megatron.quant.layers.linear_function import LinearQuant

    layer = _linear(_delayed_formats(4, "max"))
    out, _ = layer(torch.randn(8, 1, 64))
    out.sum().backward()
    state = layer.state_dict()
    assert {"amax_histories.fprop_input.amax_history", "amax_histories.fprop_input.amax_for_scale",
            "amax_histories.dgrad_grad_output.amax_history"} <= set(state)
    other = _linear(_delayed_formats(4, "max"))
    other.load_state_dict(state)
    for key in ("fprop_input", "fprop_weight", "dgrad_grad_output"):
        assert torch.equal(other.amax_histories[key].amax_history, layer.amax_histories[key].amax_history)
    # The spec sees the loaded state (load_state_dict copies in place).
    assert other.quant["fprop.input"].history is other.amax_histories["fprop_input"]
    from tests.layers._helpers import linear_formats
    other.configure_quant(LinearQuant.from_formats(linear_formats("fp8_e4m3")), None)
    assert "amax_histories" not in other._modules and not any("amax" in key for key in other.state_dict())


def test_attention_operands_keep_histories_in_its_sharded_state_dict(parallel):
    from megatron.core.transformer.enums import AttnMaskType

    from megatron.quant.formats import get_format
    from megatron.quant.layers.attention import AttentionQuant, QuantDotProductAttention
    from megatron.quant.recipes.operands import ATTENTION_OPERANDS

    config = transformer_config()
    attn = QuantDotProductAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal,
                                    attention_type="self")
    fmt = get_format("fp8_e4m3", scaling="delayed", amax_history_len=3)
    attn.configure_quant(AttentionQuant.from_formats({k: fmt for k in ATTENTION_OPERANDS}), None)
    q = torch.randn(8, 2, 4, 32, requires_grad=True)
    k = torch.randn(8, 2, 2, 32, requires_grad=True)
    v = torch.randn(8, 2, 2, 32, requires_grad=True)
    attn(q, k, v, None).sum().backward()
    assert attn.amax_histories["qk_query"].amax_history[-1].item() == q.detach().abs().max().item()
    assert attn.amax_histories["pv_value"].amax_history[-1].item() == v.detach().abs().max().item()
    from megatron.core import parallel_state

    sharded = attn.sharded_state_dict(prefix="core_attention.", metadata={
        "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)})
    assert "core_attention.amax_histories.qk_query.amax_history" in sharded
    assert len([key for key in sharded if key.startswith("core_attention.amax_histories.")]) == 2 * 12
