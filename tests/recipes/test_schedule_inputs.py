"""Malformed schedules, each refused in one line that names the phase (``schedule[i]``, the schedule itself,
the evaluation recipe or the base recipe) before any model exists."""
import pytest
import yaml

from megatron.quant.recipes.parse import RecipeError
from megatron.quant.recipes.precision import PrecisionConfig
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.recipes.schedule import MAX_PHASES

CASES = [
    ("schedule: {}", "schedule: expected a list of phases"),
    ("schedule: [7]", "schedule[0]: expected a mapping"),
    ("schedule: [{from: 2, forward: bf16}, null]", "schedule[1]: expected a mapping"),
    ("schedule: [{forward: bf16}]", "schedule[0]: a phase needs 'from'"),
    ("schedule: [{from: .nan, forward: bf16}]", "schedule[0].from: nan must be an iteration >= 1"),
    ("schedule: [{from: .inf, forward: bf16}]", "schedule[0].from: inf must be"),
    ("schedule: [{from: 0, forward: bf16}]", "schedule[0].from: 0 must be"),
    ("schedule: [{from: 1.0, forward: bf16}]", "schedule[0].from: 1.0 must be"),
    ("schedule: [{from: true, forward: bf16}]", "schedule[0].from: True is neither"),
    ("schedule: [{from: '2', forward: bf16}]", "schedule[0].from: '2' is neither"),
    ("schedule: [{from: 1e400, forward: bf16}]", "schedule[0].from: '1e400' is neither"),
    ("schedule: [{from: 3, until: 3, forward: bf16}]", "schedule[0].until: 3 is not after from 3"),
    ("schedule: [{from: 0.5, until: 3, forward: bf16}]", "schedule[0].until: 3 (iteration 3) is not after"),
    ("schedule: [{from: 0.1, until: 0.2, forward: bf16}]", "schedule[0].until: 0.2 (iteration 1) is not after"),
    ("schedule: [{from: 99999999999999999999, forward: bf16}]", "schedule[0].from: 99999999999999999999 is past"),
    ("schedule: [{from: 2, until: 9, forward: bf16}]", "schedule[0].until: 9 is past the end"),
    ("schedule: [{from: 2, forward: bf16}, {from: 3, backward: bf16}]", "schedule[1] (iterations 3-4) overlaps"),
    ("schedule: [{from: 2, forward: null}]", "schedule[0]: a phase needs 'forward' and/or 'backward'"),
    ("schedule: [{from: 2, forward: [bf16]}]", "schedule[0].forward: a recipe must be a mapping"),
    ("schedule: [{from: 2, forward: ''}]", "schedule[0].forward: format: unknown format or preset ''"),
    ("schedule: [{from: 2, backward: {format: mxfp8, scope: [nothing]}}]", "schedule[0].backward: scope:"),
    ("schedule: [{from: 2, forward: {format: bf16, schedule: []}}]", "schedule[0].forward: a phase's recipe has"),
    ("schedule: [{from: 2, 5: bf16}]", "schedule[0]: unknown key 5"),
    ("schedule: [{from: 2, forward: te-fp8-delayed}]", "schedule[0]: a recipe that changes during the run cannot"),
    ("schedule: [{from: 2, forward: bf16}]\nformat: te-fp8-delayed", "the base recipe: a recipe that changes"),
    ("evaluation: te-fp8-delayed", "evaluation: a recipe that changes during the run cannot use delayed"),
    ("evaluation: [bf16]", "evaluation: a recipe must be a mapping"),
    ("evaluation: {format: bf16, evaluation: mxfp8}", "evaluation: a phase's recipe has a schedule"),
    (f"schedule: [{', '.join(['{from: 2, forward: bf16}'] * (MAX_PHASES + 1))}]",
     f"schedule: {MAX_PHASES + 1} phases; at most {MAX_PHASES}"),
]


@pytest.mark.parametrize("text, expected", CASES, ids=[str(i) for i in range(len(CASES))])
def test_a_malformed_schedule_is_refused_in_one_line_naming_the_phase(text, expected):
    data = {"format": "mxfp8", "name": "r", **yaml.safe_load(text)}
    with pytest.raises(RecipeError) as error:
        PrecisionConfig.uniform(QuantRecipe.from_dict(data, source="r.yaml")).for_run(4, 2)
    message = str(error.value)
    assert expected in message and "\n" not in message and message.startswith("r"), message
