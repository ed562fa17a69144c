"""The study plans (docs/study/*.yaml): the committed plans load, their recipes are the ones
`python -m megatron.quant.recipes show` knows, their order is the brief's, the anchor for 10-minute GPU
calls grows a wave per call, and bad plans are one line."""
import copy
import os
from pathlib import Path

import pytest
import yaml

from megatron.quant.lab.study_measure import describe
from megatron.quant.lab.study_plan import StudyPlanError, load_plan, parse_plan
from megatron.quant.recipes import cli as recipes_cli
from megatron.quant.training.presets import get_preset

STUDY = Path(__file__).resolve().parents[2] / "docs" / "study"
PLAN = STUDY / "plan.yaml"
COMMITTED = sorted(STUDY.glob("*.yaml"))
HEADLINE = ["bf16", "te-nvfp4", "mxfp4", "te-mxfp8"]


@pytest.fixture(scope="module")
def raw():
    return yaml.safe_load(PLAN.read_text())


@pytest.fixture(scope="module")
def plan():
    return load_plan(PLAN)


def test_the_committed_plan_runs_the_headline_first_then_the_ablations_then_the_third_seed(plan):
    names = [run.name for run in plan.order]
    assert names[:8] == HEADLINE + [f"{r}-seed2" for r in HEADLINE]
    assert {run.recipe for run in plan.order[8:18]} == set(plan.recipes) - set(HEADLINE)
    assert [run.seed for run in plan.order[18:]] == [3] * len(plan.recipes)
    assert len(set(names)) == len(names) == len(plan.recipes) * len(plan.seeds) == 27


def test_the_committed_plan_has_the_brief_sizes(plan):
    assert 7e6 < plan.non_embedding_parameters < 30e6 and 19 < plan.tokens_per_parameter < 26
    assert plan.tokens_per_run == plan.train_iters * plan.global_batch_size * plan.seq_length
    shape = get_preset(plan.preset)
    h, ffn, kv = shape["hidden_size"], shape["ffn_hidden_size"], shape["hidden_size"]  # no GQA: kv = hidden
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * ffn + 2 * h  # q, proj, k and v, fc1 (gate, up) and fc2, two norms
    assert plan.non_embedding_parameters == shape["num_layers"] * per_layer + h  # + the final norm


def test_run_times_are_the_estimate_until_a_gpu_measured_them(raw):
    plan = parse_plan(raw, PLAN)
    estimate = plan.flops_per_iteration / 130e12
    assert plan.step_seconds("bf16") == pytest.approx(estimate)
    assert plan.step_seconds("te-nvfp4") == pytest.approx(1.75 * estimate)  # the default overhead
    evaluations = plan.train_iters // plan.eval_interval * plan.eval_iters
    assert plan.run_seconds("bf16") == pytest.approx(45 + (plan.train_iters + evaluations / 3) * estimate)
    measured = copy.deepcopy(raw)
    measured["step_time"]["measured"] = {"device": "NVIDIA H100 80GB HBM3", "step_s": {"te-nvfp4": 0.05}}
    plan = parse_plan(measured, PLAN)
    assert plan.step_seconds("te-nvfp4") == 0.05 and plan.step_seconds("bf16") == pytest.approx(estimate)
    assert "te-nvfp4         0.050 s/iteration" in describe(plan) and "(measured)" in describe(plan)


def test_runs_at_once_share_the_gpu_in_waves_gaining_nothing_until_measured(raw):
    shared = copy.deepcopy(raw)
    shared["runs_at_once"] = 2
    plan = parse_plan(shared, PLAN)
    assert plan.slowdown(1) == 1.0 and plan.slowdown(2) == 2.0 and plan.slowdown(3) == 3.0
    assert plan.wave_seconds(["bf16", "te-nvfp4"]) == 2 * plan.run_seconds("te-nvfp4")
    assert "2 runs at once share the GPU, each taking 2.00x as long as alone (assumed until measured)" in (
        describe(plan))
    shared["step_time"]["measured"] = {"device": "NVIDIA H100 80GB HBM3", "shared_slowdown": {2: 1.25}}
    plan = parse_plan(shared, PLAN)
    assert plan.wave_seconds(["bf16", "te-nvfp4"]) == pytest.approx(1.25 * plan.run_seconds("te-nvfp4"))
    assert "1.25x as long as alone (measured): 1.60x the throughput" in describe(plan)
    shared["step_time"]["measured"]["shared_slowdown"] = {5: 1.15}  # the first tier's H200 measurement
    plan = parse_plan(shared, PLAN)
    # fewer than measured share no worse than 5 did (a wave of 3 was once estimated at 3x alone);
    # more than measured gain nothing beyond 5's throughput
    assert plan.slowdown(3) == plan.slowdown(5) == pytest.approx(1.15) and plan.slowdown(10) == pytest.approx(2.3)
    sequential = sum(plan.run_seconds(run.recipe) for run in plan.order) / 60
    assert f"all runs: {sequential:.0f} minutes" not in describe(plan)  # the waves' time, shorter


@pytest.mark.parametrize("path", COMMITTED, ids=lambda path: path.name)
def test_every_recipe_is_one_recipes_show_knows(path, capsys):
    plan = load_plan(path)
    for recipe in plan.recipes:
        assert recipes_cli.main(["show", recipe]) == 0, recipe
    assert capsys.readouterr().out.count("recipe ") >= len(plan.recipes)


def _edit(raw, path, value):
    plan = copy.deepcopy(raw)
    node = plan
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return plan


@pytest.mark.parametrize("path, value, message", [
    (["recipes"], ["bf16", "mxfp5"], "recipes: mxfp5: format: unknown format or preset 'mxfp5'"),
    (["recipes"], ["bf16", "te-nvfp4-no-foo"], "unknown component 'foo'"),
    (["recipes"], ["bf16", "bf16"], "recipes: bf16 given twice"),
    (["seeds"], [1, 1], "seeds: seed(s) 1 given twice"),
    (["seeds"], [1, "two"], "seeds: expected an integer >= 0, got 'two'"),
    (["order", 0, "recipes"], ["bf16", "nvfp4"], "order[0].recipes: nvfp4 not among the plan's recipes"),
    (["order", 0, "seeds"], [1, 4], "order[0].seeds: seed(s) 4 not among the plan's seeds (1, 2, 3)"),
    (["order", 2, "seeds"], [2], "order[2]: run bf16-seed2 (recipe bf16, seed 2) is already in an earlier stage"),
    (["order", 2, "recipes"], ["bf16"], "order: leaves out run(s) te-nvfp4-seed3"),
    (["global_batch_size"], 100, "global_batch_size: 100 is not a multiple of micro_batch_size 64"),
    (["train_iters"], 0, "train_iters: expected an integer >= 1, got 0"),
    (["model", "seq_length"], 4096, "model.seq_length: 4096 exceeds the preset's 512 positions"),
    (["model", "preset"], "llama-huge", "model.preset: unknown model preset 'llama-huge'"),
    (["training_flags"], ["--lr", "1e-3", "--seed", "5"], "training_flags: --seed set by the plan's own keys"),
    (["data", "tokenizer_vocab"], 100, "data.tokenizer_vocab: expected an integer >= 257, got 100"),
    (["data", "colour"], "blue", "data: unknown key(s) colour"),
    (["version"], 2, "version: this code reads plan version 1, got 2"),
    (["step_time", "measured"], {"device": None, "step_s": {"bf16": 0.1}}, "measured step times need the device"),
    (["step_time", "measured"], {"device": "H100", "shared_slowdown": {1: 1.2}},
     "step_time.measured.shared_slowdown: expected an integer >= 2, got 1"),
    (["runs_at_once"], 0, "runs_at_once: expected an integer >= 1, got 0"),
    (["runs_at_once"], 9, "runs_at_once: expected at most 8 runs sharing the GPU, got 9"),
])
def test_bad_plans_are_one_line_naming_the_key(raw, path, value, message):
    with pytest.raises(StudyPlanError) as error:
        parse_plan(_edit(raw, path, value), PLAN)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert str(error.value).startswith(f"{PLAN}: ")


def test_unreadable_plans_are_one_line(tmp_path):
    with pytest.raises(StudyPlanError, match="none.yaml: cannot read"):
        load_plan(tmp_path / "none.yaml")
    (tmp_path / "bad.yaml").write_text("recipes: [bf16\n")
    with pytest.raises(StudyPlanError, match="not YAML"):
        load_plan(tmp_path / "bad.yaml")
    os.mkfifo(tmp_path / "fifo.yaml")  # read as before, a FIFO with no writer hung the runner
    with pytest.raises(StudyPlanError, match="fifo.yaml: is a FIFO"):
        load_plan(tmp_path / "fifo.yaml")
    with pytest.raises(StudyPlanError, match="is a directory"):
        load_plan(tmp_path)


@pytest.mark.parametrize("path", COMMITTED, ids=lambda path: path.name)
def test_the_committed_plans_flags_are_ones_training_accepts_on_a_gpu(path):
    from megatron.quant.training.arguments import parse_args, validate_args

    plan = load_plan(path)
    flags = [*plan.model_flags(), *plan.training_flags, "--mock-data", "--seed", "1", "--save", "ckpt"]
    args = validate_args(parse_args(flags), 1, True)  # what the sweep adds per run: data, seed, --save
    assert (args.train_iters, args.seq_length, args.global_batch_size, args.bf16) == (
        plan.train_iters, plan.seq_length, plan.global_batch_size, True)


def test_the_anchor_for_short_gpu_calls_grows_a_wave_per_call():
    """anchor-3m.yaml: plan.yaml's nine recipes at 3.0M parameters and 20 tokens per parameter; each wave
    of 5 (the NVFP4 family first) fits a 10-minute call beside the corpus, by the H200's measured steps."""
    from megatron.quant.lab.study_plan import waves

    anchor, full = load_plan(STUDY / "anchor-3m.yaml"), load_plan(PLAN)
    assert anchor.recipes == full.recipes and anchor.seeds == full.seeds and anchor.name != full.name
    assert 2.9e6 < anchor.non_embedding_parameters < 3.1e6 and 19.9 < anchor.tokens_per_parameter < 20.1
    assert [run.name for run in anchor.order[:5]] == ["bf16", "te-nvfp4", "te-nvfp4-no-sr", "te-nvfp4-no-rht",
                                                      "te-nvfp4-no-2d"]
    assert [run.seed for run in anchor.order] == [1] * 9 + [2] * 9 + [3] * 9
    corpus_s, call_s = 120, 540 - 20  # the corpus on a cold machine (80 MB took 24-47 s), the stage's budget
    assert all(corpus_s + anchor.wave_seconds([run.recipe for run in wave]) < call_s
               for wave in waves(anchor.order, anchor.runs_at_once))
