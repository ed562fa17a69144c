"""The first tier's sizing (docs/study/first-tier.yaml, lab/study_sizing.py): the committed plan
loads with its sizing block; from measured steps the largest candidate whose waves fit is chosen, with
times computed here by hand; the size is written into the plan's text, comments kept; bad sizing blocks
are one line."""
import copy
from pathlib import Path

import pytest
import yaml

from megatron.quant.lab.study_plan import StudyPlanError, load_plan, non_embedding_parameters, parse_plan
from megatron.quant.lab.study_sizing import (
    SAFETY,
    Measurement,
    flops,
    iterations_for,
    size,
    sized_plan_text,
)
from megatron.quant.training.presets import get_preset

TIER = Path(__file__).resolve().parents[2] / "docs" / "study" / "first-tier.yaml"
HEADLINE = ["bf16", "te-nvfp4", "mxfp4", "te-mxfp8", "te-fp8-blockwise"]


@pytest.fixture(scope="module")
def plan():
    return load_plan(TIER)


def test_the_tier_is_the_headline_recipes_three_seeds_one_wave_per_seed(plan):
    assert list(plan.recipes) == HEADLINE and plan.seeds == (1, 2, 3) and plan.runs_at_once == 5
    assert [{run.seed for run in plan.order[i:i + 5]} for i in (0, 5, 10)] == [{1}, {2}, {3}]
    assert plan.sizing.measured == ("llama-study-1m", "llama-study-3m") and plan.sizing.alone == "te-nvfp4"
    assert plan.tokens_per_parameter >= 20


def test_iterations_give_the_tokens_per_parameter(plan):
    for preset in plan.sizing.candidates:
        iters = iterations_for(plan, preset)
        tokens = iters * 128 * 256
        params = non_embedding_parameters(get_preset(preset))
        assert 20 <= tokens / params < 20 + 32768 / params


def _fake_measure(steps):
    """measure() over a table {(preset, at_once): {recipe: step}}, start-up 10 s."""
    calls = []

    def measure(preset, recipes, at_once):
        calls.append((preset, tuple(recipes), at_once))
        measured = {r: steps[preset, at_once][r] for r in recipes if r in steps[preset, at_once]}
        return Measurement(preset, at_once, measured, {r: 10.0 for r in measured})
    return measure, calls


def test_size_measures_two_sizes_and_one_alone_then_keeps_the_largest_that_fits(plan):
    # every recipe 20 ms at the small size and 40 ms at the large one with 5 at once; te-nvfp4 alone 16 ms
    steps = {("llama-study-1m", 5): {r: 0.020 for r in HEADLINE}, ("llama-study-3m", 5): {r: 0.040 for r in HEADLINE},
             ("llama-study-3m", 1): {"te-nvfp4": 0.016}}
    measure, calls = _fake_measure(steps)
    f1, f3 = flops(plan, "llama-study-1m"), flops(plan, "llama-study-3m")

    def tier_s(preset):  # by hand: 3 waves of start-up 10 s + (iterations + validations) x the line's step
        iters = iterations_for(plan, preset)
        step = 0.020 + (0.040 - 0.020) * (flops(plan, preset) - f1) / (f3 - f1)
        validations = iters // max(1, iters // 5) * plan.eval_iters / 3
        return 3 * (10 + (iters + validations) * step)

    budget = tier_s("llama-study-2m") / SAFETY + 1  # 2m fits, 3m does not
    result = size(plan, measure, "GPU", lambda: budget, lambda line: None)
    assert calls == [("llama-study-1m", tuple(HEADLINE), 5), ("llama-study-3m", tuple(HEADLINE), 5),
                     ("llama-study-3m", ("te-nvfp4",), 1)]
    assert result.shared_slowdown == pytest.approx(2.5)
    assert [c.fits for c in result.choices] == [True, True, True, False]
    assert result.chosen.preset == "llama-study-2m"
    assert result.chosen.tier_s == pytest.approx(tier_s("llama-study-2m"), rel=1e-3)
    sized = result.plan
    assert sized.preset == "llama-study-2m" and sized.train_iters == iterations_for(plan, "llama-study-2m")
    assert sized.step_time.shared_slowdown[5] == pytest.approx(2.5)


def test_nothing_fits_nothing_is_chosen(plan):
    steps = {(p, k): {r: 1.0 for r in HEADLINE} for p in ("llama-study-1m", "llama-study-3m") for k in (1, 5)}
    result = size(plan, _fake_measure(steps)[0], "GPU", lambda: 60.0, lambda line: None)
    assert result.chosen is None and result.plan is None and not any(c.fits for c in result.choices)


def test_the_size_is_written_into_the_plan_text_and_reads_back(plan):
    text = sized_plan_text(TIER.read_text(), "llama-study-2m", 1081, 216, "NVIDIA H200, 2026-11-27")
    assert "# The GPU study's first tier" in text and "written by the sizing" in text  # comments kept
    again = parse_plan(yaml.safe_load(text), TIER)
    assert (again.preset, again.train_iters, again.eval_interval) == ("llama-study-2m", 1081, 216)
    assert again.sizing.fixed_on == "NVIDIA H200, 2026-11-27"


@pytest.mark.parametrize("change, message", [
    (lambda s: s.update(candidates=["llama-study-3m", "llama-study-1m"]), "growing size"),
    (lambda s: s.update(candidates=["llama-study-1m", "nope"]), "unknown model preset 'nope'"),
    (lambda s: s.update(candidates=["llama-study-1m", "llama-tiny"]), "needs vocab 8192"),
    (lambda s: s.update(measured=["llama-study-3m", "llama-study-1m"]), "smaller first"),
    (lambda s: s.update(measured=["llama-study-1m"]), "two of the candidates"),
    (lambda s: s.update(alone="hifp8"), "sizing.alone"),
    (lambda s: s.update(fixed_on=3), "sizing.fixed_on"),
    (lambda s: s.update(surprise=1), "unknown key(s) surprise"),
])
def test_bad_sizing_blocks_are_one_line(change, message):
    raw = copy.deepcopy(yaml.safe_load(TIER.read_text()))
    change(raw["sizing"])
    with pytest.raises(StudyPlanError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        parse_plan(raw, TIER)
    assert "\n" not in str(info.value) and "sizing" in str(info.value)


def test_without_the_alone_measurement_the_tier_is_still_sized_from_its_own_waves(plan):
    steps = {("llama-study-1m", 5): {r: 0.02 for r in HEADLINE}, ("llama-study-3m", 5): {r: 0.03 for r in HEADLINE},
             ("llama-study-3m", 1): {}}  # its wave ran out of time
    said = []
    result = size(plan, _fake_measure(steps)[0], "GPU", lambda: 1e6, said.append)
    assert any("te-nvfp4 alone was not measured" in line for line in said)
    assert result.chosen.preset == "llama-study-3m"
    assert result.chosen.tier_s == pytest.approx(3 * (10 + (iterations_for(plan, "llama-study-3m") + iterations_for(
        plan, "llama-study-3m") // max(1, iterations_for(plan, "llama-study-3m") // 5) * plan.eval_iters / 3) * 0.03),
        rel=1e-3)
