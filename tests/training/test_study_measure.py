"""What the ledger measured (``study --measured``): step times alone per device, the slowdown of runs
sharing the GPU, the start-up, the block that pastes into the plan, and the size that fits a target."""
import copy
import dataclasses
from pathlib import Path

import pytest
import yaml

from megatron.quant.analysis.runs import ledger
from megatron.quant.lab import study
from megatron.quant.lab.study_measure import fitting_iterations, measure
from megatron.quant.lab.study_plan import load_plan, parse_plan

PLAN = Path(__file__).resolve().parents[2] / "docs" / "study" / "plan.yaml"
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


@pytest.fixture(scope="module")
def plan():
    return load_plan(PLAN)


def _entry(plan, recipe, step_s, at_once=1, device=H100, seed=1, wall_s=None, **change):
    iterations = plan.train_iters
    evaluations = iterations // plan.eval_interval * plan.eval_iters
    entry = ledger.LedgerEntry(
        study=plan.name, run=f"{recipe}-seed{seed}", recipe=recipe, seed=seed, status="finished", device=device,
        start_time="2026-11-26T10:00:00+00:00", end_time="2026-11-26T10:02:00+00:00",
        wall_s=wall_s if wall_s is not None else 30.0 + (iterations + evaluations / 3) * (step_s or 0), step_s=step_s,
        iterations=iterations, tokens=1, commit="abc", corpus={"sha256": "a" * 64}, recipe_env={},
        recipe_resolved=[], flags=[], machine={}, scalars={}, runs_at_once=at_once)
    return dataclasses.replace(entry, **change)


def test_step_times_alone_and_the_slowdown_of_runs_at_once_per_device(plan):
    entries = [_entry(plan, "bf16", 0.020), _entry(plan, "bf16", 0.022, seed=2), _entry(plan, "te-nvfp4", 0.040),
               _entry(plan, "bf16", 0.0252, at_once=2), _entry(plan, "te-nvfp4", 0.056, at_once=2),
               _entry(plan, "mxfp4", 0.05, at_once=2),  # never alone: no slowdown from it
               _entry(plan, "te-nvfp4", 0.030, device=H200),
               _entry(plan, "bf16", 0.001, dry_run=True), _entry(plan, "bf16", 0.001, study="other"),
               _entry(plan, "bf16", 0.001, status="crashed"), _entry(plan, "bf16", None)]
    h100, h200 = measure(plan, entries)
    assert (h100.device, h100.runs, h200.device, h200.runs) == (H100, 6, H200, 1)
    assert h100.step_s == {"bf16": pytest.approx(0.021), "te-nvfp4": 0.040}
    assert h100.shared_slowdown == {2: pytest.approx((0.0252 / 0.021 + 0.056 / 0.040) / 2)}  # 1.2 and 1.4
    assert h100.startup_s == pytest.approx(30.0) and h200.step_s == {"te-nvfp4": 0.030} and not h200.shared_slowdown


def test_the_iterations_that_fit_a_target_time(plan):
    # 0.05 s an iteration, plus a third of one per validation iteration: 10 per 468 here.
    per_iteration = 0.05 * (1 + plan.eval_iters / (3 * plan.eval_interval))
    assert fitting_iterations(plan, 0.05, 30.0, 120.0) == int(90.0 / per_iteration)
    assert fitting_iterations(plan, 0.05, 200.0, 120.0) == 0


def test_measured_prints_the_block_that_pastes_into_the_plan(plan, tmp_path, capsys):
    for entry in (_entry(plan, "bf16", 0.020), _entry(plan, "te-nvfp4", 0.040), _entry(plan, "bf16", 0.026, 2, seed=2),
                  _entry(plan, "te-nvfp4", 0.052, 2, seed=2)):
        ledger.write_entry(entry, tmp_path / "ledger" / plan.name)
    argv = ["--plan", str(PLAN), "--ledger", str(tmp_path / "ledger"), "--measured", "--target-s", "150"]
    assert study.main(argv) == 0
    out = capsys.readouterr().out
    assert "2 at once: each run 1.30x as long as alone, 1.54x the throughput (worth it)" in out
    iterations = fitting_iterations(plan, 0.040, 30.0, 150.0)
    assert f"(te-nvfp4, 0.0400 s/iteration) to run 150 s: train_iters {iterations} =" in out
    raw = yaml.safe_load(PLAN.read_text())
    raw = copy.deepcopy(raw)
    raw["step_time"].update(yaml.safe_load(out))  # the block, comments and all, as a user pastes it
    pasted = parse_plan(raw, PLAN)
    assert pasted.step_time.measured_device == H100 and pasted.step_seconds("te-nvfp4") == 0.04
    assert pasted.slowdown(2) == pytest.approx(1.3)


def test_measured_without_runs_or_ledger_is_one_line(plan, tmp_path, capsys):
    assert study.main(["--plan", str(PLAN), "--ledger", str(tmp_path), "--measured"]) == 0
    assert f"holds no timed, finished runs of study {plan.name}" in capsys.readouterr().out
    assert study.main(["--plan", str(PLAN), "--measured"]) == 2
    assert "--measured needs --ledger" in capsys.readouterr().err
