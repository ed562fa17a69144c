"""Power before runs: the interval a recipe's paired gap will have with n seeds (Student-t against an
independent formula), the seeds a target needs, the evaluation noise measured from the committed
ledger, and the plans of the second tier and of Quartet-II's 30M grid (sizes, shapes, GPU-hours)."""
import dataclasses
import math
from pathlib import Path

import pytest

from megatron.quant.analysis.runs import ledger
from megatron.quant.lab import study, study_power
from megatron.quant.lab.study_measure import describe
from megatron.quant.lab.study_plan import StudyPlanError, load_plan, parse_plan
from tests.training.test_study import _entry

STUDY = Path(__file__).resolve().parents[2] / "docs" / "study"
LEDGER = STUDY / "ledger"


def test_the_interval_is_students_t_and_the_target_takes_the_fewest_seeds():
    # t(0.975, 4) = 2.7764451051977987 (tables); 5 seeds of spread 1 %
    assert study_power.half_width(0.01, 5) == pytest.approx(2.7764451051977987 * 0.01 / math.sqrt(5))
    assert study_power.half_width(0.01, 1) == math.inf
    n = study_power.seeds_for(0.005, 0.003)
    assert study_power.half_width(0.005, n) <= 0.003 < study_power.half_width(0.005, n - 1)
    assert study_power.seeds_for(1.0, 0.001) is None  # beyond MAX_SEEDS


def _pair(run, recipe, seed, validation, losses):
    steps = list(range(1, len(losses) + 1))
    return dataclasses.replace(_entry(run, recipe, study_name="p"), seed=seed, iterations=len(losses),
                               tokens=1000 * len(losses),
                               scalars={"train/lm loss": (steps, losses), "validation/lm loss": ([len(losses)],
                                                                                               [validation])})


def test_the_paired_spread_and_the_evaluation_noise_come_from_pairs_of_one_seed():
    flat = [3.0] * 400
    rng = __import__("numpy").random.default_rng(0)
    noisy = list(3.0 * (1 + 0.01 * rng.standard_normal(400)))  # 1 % around a flat trend
    entries = [_pair("bf16", "bf16", 1, 3.0, flat), _pair("bf16-seed2", "bf16", 2, 3.0, flat),
               _pair("m", "m", 1, 3.03, noisy), _pair("m-seed2", "m", 2, 3.06, noisy)]
    [spread] = study_power.paired_spreads(entries, "p")
    assert (spread.recipe, spread.pairs) == ("m", 2) and spread.std == pytest.approx(math.sqrt(2) * 0.005)
    relative, tokens = study_power.evaluation_noise(entries, "p")
    assert tokens == 1000 and relative == pytest.approx(0.01, rel=0.2)  # a running median's residual
    assert study_power.gap_noise((relative, tokens), 4000) == pytest.approx(relative / 2)
    assert study_power.gap_noise((relative, tokens), study_power.tokens_for((relative, tokens), 0.003)) <= 0.001


def test_the_first_tiers_evaluation_noise_is_below_its_seed_noise():
    entries = ledger.read_ledger(LEDGER)
    text = study_power.describe_power(load_plan(STUDY / "first-tier.yaml"), entries)
    assert "te-nvfp4           spread 0.53 % over 3 pairs: ± 1.33 % (95 %)" in text  # the README's interval
    assert "below a third of the smallest seed spread" in text and "NOT below" not in text


def test_a_target_interval_keeps_the_seeds_it_needs(tmp_path):
    plan = dataclasses.replace(load_plan(STUDY / "first-tier.yaml"), seeds=tuple(range(1, 21)), target_interval=0.01)
    plan = dataclasses.replace(plan, order=tuple(study.PlannedRun(r, s, f"{r}-seed{s}") for s in plan.seeds
                                                 for r in plan.recipes))
    trimmed, line = study_power.for_target(plan, ledger.read_ledger(LEDGER))
    assert trimmed.seeds == (1, 2, 3, 4) and line == "target ± 1.00 %: 4 seeds (1, 2, 3, 4)"
    assert {run.seed for run in trimmed.order} == {1, 2, 3, 4}


def test_the_second_tier_and_the_30m_grid_have_the_asked_sizes():
    tier2, grid = load_plan(STUDY / "tier2.yaml"), load_plan(STUDY / "quartet2-30m.yaml")
    assert 9e6 < tier2.non_embedding_parameters < 11e6 and tier2.shape["hidden_size"] >= 256
    assert tier2.tokens_per_parameter == pytest.approx(25, abs=0.1) and len(tier2.seeds) >= 5
    assert len(tier2.recipes) == 7 and tier2.target_interval == 0.003
    assert grid.non_embedding_parameters == 30_482_560  # Quartet-II's released N for its 30M model
    assert grid.tokens_per_parameter == pytest.approx(24.6, abs=0.1)
    assert "--hidden-size" in grid.model_flags() and grid.model_flags()[grid.model_flags().index("--hidden-size") + 1] \
        == "640"
    text = describe(grid)
    assert "30.48M non-embedding parameters (40.97M with the embeddings)" in text and "GPU-hours" in text


def test_a_shape_that_cannot_be_built_is_one_line():
    raw = __import__("yaml").safe_load((STUDY / "tier2.yaml").read_text())
    raw["model"]["shape"] = {"hidden_size": 322}  # 5 heads
    with pytest.raises(StudyPlanError, match="heads must divide the hidden size"):
        parse_plan(raw, STUDY / "tier2.yaml")
    raw["model"]["shape"] = {"depth": 3}
    with pytest.raises(StudyPlanError, match="model.shape: unknown key"):
        parse_plan(raw, STUDY / "tier2.yaml")
