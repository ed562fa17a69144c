"""Recipes that change during a run (``recipes.schedule``): a scheduled recipe trains on CPU, switches
at its iteration, resumes across the switch with the losses of the uninterrupted run, evaluates in its
own precision, and a malformed schedule is refused at start in one line naming the value."""
import pytest
import torch

from megatron.quant import position
from megatron.quant.position import Position
from megatron.quant.recipes.precision import PrecisionConfig
from megatron.quant.recipes.recipe import QuantRecipe, RecipeError
from megatron.quant.training.main import check_inputs
from tests._dist import run_distributed
from tests.training._workers import run_plan

ITERS = 2
# Unquantized at iteration 1, then the forward GEMMs in FP8 (elementwise: cheap on CPU); BF16
# evaluation. A quantized phase on an unquantized base shows the switch in the losses at once.
SCHEDULED = """\
format: bf16
scope: [linear]
schedule:
  - {from: 0.5, forward: fp8_e4m3}
evaluation: bf16
"""


def _argv(*extra: str) -> list[str]:
    return ["--model", "llama-tiny", "--mock-data", "--micro-batch-size", "2", "--global-batch-size", "2",
            "--seq-length", "32", "--train-iters", str(ITERS), "--lr", "3e-3", "--lr-warmup-iters", "1",
            "--eval-interval", str(ITERS), "--eval-iters", "1", "--log-interval", "1", "--seed", "5", *extra]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("scheduled")
    recipe = tmp / "scheduled.yaml"
    recipe.write_text(SCHEDULED)
    env, ckpt = {"CUSTOM_QUANT_RECIPE": str(recipe)}, str(tmp / "ckpt")
    plan = [("plain", "train", ({}, _argv())),
            ("scheduled", "train", (env, _argv())),
            ("part1", "train", (env, _argv("--save", ckpt, "--exit-interval", str(ITERS // 2)))),
            ("part2", "train", (env, _argv("--save", ckpt, "--load", ckpt)))]
    return run_distributed(run_plan, 1, plan, timeout=600)[0]


def _losses(history):
    return [h["lm loss"] for h in history]


@pytest.mark.slow  # four short training runs in a spawned process
def test_the_forward_switches_at_its_iteration_and_a_resume_lands_in_its_phase(runs):
    plain, scheduled = _losses(runs["plain"]), _losses(runs["scheduled"])
    assert scheduled[0] == plain[0]  # the base recipe (unquantized) at iteration 1
    assert scheduled[1] != plain[1]  # the FP8 forward from iteration 2 on
    assert len(runs["part2"]) == 1 and runs["part1"] + runs["part2"] == runs["scheduled"]  # bit for bit


def test_the_phase_follows_the_position_and_evaluation_runs_in_its_own_precision():
    recipe = QuantRecipe.from_dict({"format": "mxfp8", "scope": ["linear"], "evaluation": "bf16",
                                    "schedule": [{"from": 3, "until": 5, "backward": "fp8_e4m3"}]})
    precision = PrecisionConfig.uniform(recipe).for_run(10, 2)
    (bound,) = precision.configs.values()
    assert [bound.schedule.phase_of(Position(i)) for i in (1, 2, 3, 4, 5, 10)] == [0, 0, 1, 1, 0, 0]
    assert bound.schedule.phase_of(Position(3, evaluating=True)) == 2
    phases = bound.phase_choices("fc1", 0, 2)
    assert {k: c.name for k, c in phases[1].items()} == {
        "fprop.input": "mxfp8", "fprop.weight": "mxfp8", "dgrad.grad_output": "fp8_e4m3",
        "dgrad.weight": "fp8_e4m3", "wgrad.grad_output": "fp8_e4m3", "wgrad.input": "fp8_e4m3"}
    assert {c.name for c in phases[2].values()} == {"bf16"}
    described = precision.schedules()["mxfp8-linear"]
    assert described == "from 3 until 5: backward fp8_e4m3 (iterations 3-4); evaluation bf16"
    with position.evaluation():
        assert position.current().evaluating
    assert not position.current().evaluating


def test_linear_and_attention_layers_take_the_phase_of_the_position():
    from megatron.quant.cpu import init_parallel
    from megatron.quant.layers.spec import precision_config
    from megatron.quant.training.model import build_gpt, transformer_config
    from megatron.quant.training.presets import get_preset

    init_parallel()
    shape = dict(get_preset("llama-tiny"), seq_length=16, num_layers=1)
    recipe = QuantRecipe.from_dict({"format": "bf16", "scope": ["linear", "attention"],
                                    "schedule": [{"from": 2, "forward": "fp8_e4m3"}], "evaluation": "mxfp8"})
    model = build_gpt(transformer_config(shape, quant_recipe=precision_config(recipe).for_run(4, 1)), shape)
    fc1, attention = model.decoder.layers[0].mlp.linear_fc1, model.decoder.layers[0].self_attention.core_attention
    tokens = torch.randint(0, shape["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(0))
    names, attention_names = [], []
    for iteration, evaluating in ((1, False), (2, False), (2, True), (3, False)):
        position.set_iteration(iteration)
        with position.evaluation() if evaluating else torch.no_grad():
            model(tokens, torch.arange(16)[None], None)
        for fmt, found in ((fc1.quant["fprop.input"].fmt, names), (attention.quant.qk.a.fmt, attention_names)):
            found.append(None if fmt is None else fmt.name)
    assert names == attention_names == [None, "fp8_e4m3", "mxfp8_e4m3", "fp8_e4m3"]
    assert fc1.quant["dgrad.grad_output"].fmt is None and attention.quant.qk.grad_a_dc.fmt is None  # forward only
    caches = [state["weight_cache"] for state in fc1.phase_states]
    assert all(cache._entries for cache in caches[1:])  # the quantized phases cached their weights
    from megatron.quant.layers.linear import invalidate_quantized_weights

    invalidate_quantized_weights(model)  # after a step through .data: no phase keeps a stale weight
    assert not any(cache._entries for cache in caches)


@pytest.mark.parametrize("schedule, message", [
    ("[{from: 5, forward: bf16}]", r"schedule\[0\]\.from: 5 is past the end of training \(--train-iters 4\)"),
    ("[{from: 1.5, forward: bf16}]", r"schedule\[0\]\.from: 1.5 must be an iteration >= 1 or a fraction"),
    ("[{from: 2, until: 9, forward: bf16}]", r"schedule\[0\]\.until: 9 is past the end"),
    ("[{from: 0.5, forward: nvfp5}]", r"schedule\[0\]\.forward: format: unknown format or preset 'nvfp5'"),
    ("[{from: 2, forward: bf16}, {from: 3, backward: bf16}]", r"schedule\[1\] \(iterations 3-4\) overlaps "
                                                               r"schedule\[0\] \(iterations 2-4\)"),
    ("[{from: 2}]", r"schedule\[0\]: a phase needs 'forward' and/or 'backward'"),
    ("[{from: 2, forward: bf16, at: 3}]", r"schedule\[0\]: unknown key 'at'"),
    ("[{from: 2, forward: te-fp8-delayed}]",
     r"^bad: schedule\[0\]: a recipe that changes during the run cannot use delayed scaling \(fp8_e4m3:"),
])
def test_a_malformed_schedule_is_refused_at_start_in_one_line(tmp_path, monkeypatch, schedule, message):
    path = tmp_path / "bad.yaml"
    path.write_text(f"format: mxfp8\nschedule: {schedule}\n")
    monkeypatch.setenv("CUSTOM_QUANT_RECIPE", str(path))
    with pytest.raises(RecipeError, match=message) as error:
        check_inputs(_argv("--train-iters", "4"))
    assert "\n" not in str(error.value)


def test_sweeps_and_the_study_take_scheduled_recipes_and_the_sweep_refuses_a_bad_one_before_any_run(tmp_path):
    from megatron.quant.lab import sweep_plan
    from megatron.quant.lab.plan_checks import recipe_problem

    runs = sweep_plan.plan_runs("te-nvfp4 te-nvfp4+bf16-fwd-tail")
    sweep_plan.check_schedules(runs, 4)
    assert [run.name for run in runs] == ["te-nvfp4", "te-nvfp4+bf16-fwd-tail"]
    assert recipe_problem("te-nvfp4+bf16-fwd-tail") is None
    path = tmp_path / "late.yaml"
    path.write_text("format: mxfp8\nschedule: [{from: 10, forward: bf16}]\n")
    with pytest.raises(sweep_plan.SweepError, match=r"run late: schedule\[0\]\.from: 10 is past the end"):
        sweep_plan.check_schedules(sweep_plan.plan_runs(str(path)), 4)


def test_the_start_line_and_run_json_show_the_schedule(tmp_path, monkeypatch):
    from megatron.quant.training.main import _quantization

    path = tmp_path / "tail.yaml"
    path.write_text("format: te-nvfp4+bf16-fwd-tail\nevaluation: bf16\n")
    monkeypatch.setenv("CUSTOM_QUANT_RECIPE", str(path))
    inputs = check_inputs(_argv("--train-iters", "10"))
    described = "from 0.8: forward bf16 (iterations 9-10); evaluation bf16"
    assert inputs.record()["precision"]["schedules"] == {"tail": described}
    assert _quantization(inputs.precision, 2) == f"tail (schedule: {described})"
