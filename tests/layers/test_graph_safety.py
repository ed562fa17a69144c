"""The graph-safety checker (``layers.graph_safety``) finds what a CUDA graph cannot capture or would
replay wrongly, on the CPU: planted host synchronisations, data-dependent shapes, and steps whose work,
shapes, host values or input addresses change; and a quantized linear layer's forward and backward, for
each preset, has none of them but stochastic rounding's changing noise key."""
import pytest
import torch

from megatron.quant import position
from megatron.quant.layers.graph_safety import GraphSafety, check, replay_hazards_of
from megatron.quant.layers.linear import QuantColumnParallelLinear, invalidate_quantized_weights
from megatron.quant.layers.linear_function import LinearQuant
from megatron.quant.recipes.recipe import QuantRecipe
from tests.layers._helpers import transformer_config

PRESETS = ("bf16", "te-fp8-current", "te-fp8-delayed", "te-mxfp8", "te-nvfp4", "hifp8", "mxfp4")
HERE = "test_graph_safety.py"


def _kinds(findings) -> list[tuple[str, str]]:
    return [(finding.kind, finding.op) for finding in findings]


def test_a_planted_host_sync_is_found_with_its_place():
    x = torch.arange(6.0)

    def step():
        y = x * 2
        if y.sum() > 0:  # a Python branch on a tensor's value: the host waits for the device
            y = y + 1
        return y.max().item()

    (record,), _ = check(step, steps=1)
    assert _kinds(record.findings) == [("host sync", "_local_scalar_dense")] * 2
    assert all(HERE in finding.place and "(step)" in finding.place for finding in record.findings)


def test_data_dependent_shapes_are_found_but_a_masked_fill_by_index_is_not():
    x = torch.arange(6.0)
    with GraphSafety() as mode:
        mask = x > 2
        x[mask] = 0.0  # torch runs it as masked_fill_: no count needed
        torch.nonzero(mask)
        x[mask]  # noqa: B018  (a boolean mask's selection: its size is the count)
        x.masked_select(mask)
        torch.equal(x, x)
    assert _kinds(mode.record.findings) == [("data-dependent shape", "nonzero"), ("data-dependent shape", "index"),
                                            ("data-dependent shape", "masked_select"), ("host sync", "equal")]


def test_a_steady_step_has_no_replay_hazard():
    weight = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(2, 4)

    def step():
        weight.grad = None  # as an optimizer's zero_grad: each backward makes the gradient afresh
        (x @ weight).square().sum().backward()

    _, hazards = check(step, steps=3)
    assert hazards == []


def test_what_a_replay_would_get_wrong_is_found():
    state = {"step": 0, "outside": torch.ones(3)}

    def step():
        state["step"] += 1
        n = state["step"]
        torch.ones(3).mul(n)  # a host number that changes: frozen by a graph
        torch.ones(3 + n).sum()  # a size that changes (a host value), then a shape that changes
        state["outside"] = state["outside"] + 0  # made outside the next step, at a new address
        return state["outside"] * 2

    _, hazards = check(step, steps=2)
    assert [finding.kind for finding in hazards] == ["host value differs", "host value differs", "shape differs",
                                                     "input moved"]
    assert hazards[0].detail == "(1,) then (2,)"

    def branching():
        state["step"] += 1
        return torch.ones(2).exp() if state["step"] % 2 else torch.ones(2).sin()

    _, hazards = check(branching, steps=2)
    assert _kinds(hazards) == [("step differs", "exp.default")]
    assert "the next step runs sin.default" in hazards[0].detail


def _layer_steps(preset: str, steps: int = 2):
    """The records of ``steps`` forward-backward passes of a quantized linear layer after a first one,
    each at a new iteration after an optimizer-like update of the weight (the loop's cache reset included)."""
    recipe = QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": preset})
    layer = QuantColumnParallelLinear(64, 128, config=transformer_config(params_dtype=torch.bfloat16, bf16=True),
                                      init_method=torch.nn.init.normal_, bias=False, gather_output=False)
    layer.configure_quant(LinearQuant.from_formats(recipe.resolve("fc1", 0, 2), recipe.dequantized_sources()), None)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, 2, 64, generator=generator).to(torch.bfloat16).requires_grad_()
    grad = torch.randn(16, 2, 128, generator=generator).to(torch.bfloat16)
    records = []
    for iteration in range(steps + 1):  # the first fills the layer's caches, as a graph's warm-up does
        position.set_iteration(iteration + 1)
        position.set_microbatch(0, 0)
        with GraphSafety() as mode:
            layer(x)[0].backward(grad)
        records += [mode.record] if iteration else []
        x.grad = layer.weight.grad = None  # an optimizer's step: new weights, gradients made afresh
        with torch.no_grad():
            layer.weight.mul_(0.5)
        invalidate_quantized_weights(layer)
    position.set_iteration(0)
    return records


@pytest.mark.parametrize("preset", PRESETS)
def test_a_quantized_layer_step_is_graph_safe_but_for_stochastic_rounding(parallel, preset):
    records = _layer_steps(preset)
    assert [record.lines() for record in records] == [[], []]
    hazards = replay_hazards_of(records)
    if preset == "te-nvfp4":  # its gradients' stochastic rounding: a noise key from the iteration, on the host
        assert hazards and {(finding.kind, finding.place.split(":")[0]) for finding in hazards} == {
            ("host value differs", "megatron/quant/formats/random_bits.py")}
    else:
        assert hazards == []
