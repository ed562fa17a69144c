"""The recipe sweep: one run per recipe, run.json, skip/resume, divergence recorded, --print.

The sweep's bookkeeping runs against a stand-in trainer (a script that writes the checkpoint
tracker as training would); the divergence itself comes from a real tiny-model run."""
import importlib.util
import json
import shlex
import sys
from pathlib import Path

import pytest

from megatron.quant.lab import sweep, sweep_plan
from megatron.quant.training.arguments import ArgumentError, parse_args, validate_args

FLAGS = ["--model", "llama-tiny", "--mock-data", "--train-iters", "4"]

# Stand-in for `-m megatron.quant.training`: resumes from --load's tracker, then crashes at
# iteration 2 if its recipe is $FAKE_CRASH, diverges if it is $FAKE_DIVERGE, else finishes.
FAKE_TRAIN = r'''
import json, os, sys
argv = sys.argv[3:]  # after "-m megatron.quant.training"
flag = lambda name, default=None: argv[argv.index(name) + 1] if name in argv else default
save, iters = flag("--save"), int(flag("--train-iters"))
tracker = os.path.join(save, "latest_checkpointed_iteration.txt")
start = int(open(tracker).read()) if os.path.exists(tracker) else 0
recipe = os.environ.get("CUSTOM_QUANT_TYPE") or os.environ.get("CUSTOM_QUANT_RECIPE")
os.makedirs(save, exist_ok=True)
with open(os.path.join(os.path.dirname(save), "calls.jsonl"), "a") as f:
    f.write(json.dumps({"start": start, "recipe": recipe, "seed": flag("--seed"), "env": {
        k: os.environ.get(k) for k in ("CUSTOM_QUANT_TYPE", "CUSTOM_QUANT_RECIPE")}}) + "\n")
if recipe == os.environ.get("FAKE_DIVERGE"):
    json.dump({"iteration": 1, "lm loss": "nan"}, open(os.path.join(save, "diverged.json"), "w"))
    sys.exit(0)
crash = recipe == os.environ.get("FAKE_CRASH")
open(tracker, "w").write(str(2 if crash else iters))
sys.exit(1 if crash else 0)
'''


@pytest.fixture
def fake_launcher(tmp_path) -> str:
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    return shlex.join([sys.executable, str(script)])


def _calls(run_dir: Path) -> list[dict]:
    path = run_dir / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_sweep_records_runs_resumes_the_interrupted_and_skips_the_done(tmp_path, fake_launcher, monkeypatch):
    recipe_file = tmp_path / "mine.yaml"
    recipe_file.write_text("format: mxfp8\nscope: [linear]\n")
    out = tmp_path / "sweep"
    argv = ["--launcher", fake_launcher, "--seeds", "7", str(out), f"bf16 mxfp4,nvfp4 {recipe_file}", "--", *FLAGS]
    monkeypatch.setenv("CUSTOM_QUANT_RECIPE", "/inherited/recipe.yaml")  # must not leak into format runs
    monkeypatch.setenv("FAKE_CRASH", "mxfp4")
    monkeypatch.setenv("FAKE_DIVERGE", "nvfp4")

    assert sweep.main(argv) == 1  # mxfp4 crashed
    status = {name: json.loads((out / name / "run.json").read_text())["status"]
              for name in ("bf16", "mxfp4", "nvfp4", "mine", "bf16-seed7")}
    assert status == {"bf16": "finished", "mxfp4": "crashed", "nvfp4": "diverged", "mine": "finished",
                      "bf16-seed7": "finished"}
    assert _calls(out / "bf16") == [{"start": 0, "recipe": "bf16", "seed": None,
                                     "env": {"CUSTOM_QUANT_TYPE": "bf16", "CUSTOM_QUANT_RECIPE": None}}]
    assert _calls(out / "mine")[0]["env"] == {"CUSTOM_QUANT_TYPE": None, "CUSTOM_QUANT_RECIPE": str(recipe_file)}
    assert _calls(out / "bf16-seed7")[0]["seed"] == "7"
    record = json.loads((out / "nvfp4" / "run.json").read_text())
    assert record["divergence"]["iteration"] == 1
    assert record["flags"] == FLAGS and record["recipe"] == "nvfp4" and record["machine"]["cpus"] >= 1
    assert {"start_time", "end_time", "git_commit"} <= set(record)

    monkeypatch.delenv("FAKE_CRASH")
    assert sweep.main(argv) == 0
    assert [c["start"] for c in _calls(out / "mxfp4")] == [0, 2]  # resumed from its checkpoint
    for name in ("bf16", "nvfp4", "mine", "bf16-seed7"):  # finished and diverged runs are not re-run
        assert len(_calls(out / name)) == 1, name
    record = json.loads((out / "mxfp4" / "run.json").read_text())
    assert record["status"] == "finished"
    assert [a["status"] for a in record["attempts"]] == ["crashed", "finished"]


def test_print_gives_one_command_per_run_that_runs_only_that_run(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert sweep.main(["--print", "--seeds", "1,2", str(out), "bf16 mxfp8", "--", *FLAGS]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = ["bf16", "mxfp8", "bf16-seed1", "mxfp8-seed1", "bf16-seed2", "mxfp8-seed2"]  # seeds of every recipe
    assert len(lines) == len(names)
    for line, name in zip(lines, names):
        argv = shlex.split(line)
        assert argv[1:4] == ["-m", "megatron.quant.lab.sweep", "--only"] and argv[4] == name
        assert argv[-len(FLAGS) - 1:] == ["--", *FLAGS]
    assert not out.exists()


@pytest.mark.parametrize("recipes, flags, message", [
    ("bf16 foo", FLAGS, "unknown recipe 'foo'"),
    ("bf16 mxfp8 bf16", FLAGS, "given twice"),
    ("bf16", [*FLAGS, "--save", "x"], "sets --save"),
    ("bf16 missing.yaml", FLAGS, "does not exist"),
])
def test_bad_input_is_refused_before_anything_runs(tmp_path, capsys, recipes, flags, message):
    assert sweep.main([str(tmp_path / "out"), recipes, "--", *flags]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_unknown_baseline_and_only_name_the_runs(tmp_path, capsys):
    assert sweep.main(["--seeds", "1", "--baseline", "fp8", str(tmp_path), "bf16 hifp8", "--", *FLAGS]) == 2
    assert "baseline 'fp8' is not one of the sweep's recipes: bf16, hifp8" in capsys.readouterr().err
    assert sweep.main(["--only", "bf16,nvfp4", str(tmp_path), "bf16 hifp8", "--", *FLAGS]) == 2
    assert "--only 'bf16,nvfp4': 'nvfp4' is not one of the sweep's runs: bf16, hifp8" in capsys.readouterr().err
    assert sweep.main(["--runs-per-gpu", "2", str(tmp_path), "bf16 hifp8", "--", *FLAGS]) == 2
    assert "--runs-per-gpu 2: runs share a GPU only when several go at once; give --parallel N" in (
        capsys.readouterr().err)


def test_only_takes_a_list_in_the_sweeps_order():
    runs = sweep_plan.plan_runs("bf16 mxfp8 hifp8")
    assert [run.name for run in sweep.only_runs(runs, "hifp8, bf16")] == ["bf16", "hifp8"]


@pytest.mark.slow
def test_a_diverging_run_stops_and_is_recorded_as_diverged(one_rank):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = Path(one_rank["diverged_run_dir"])
    assert len(one_rank["diverge"]) == 1  # stopped at the first loss above --divergence-threshold 1
    marker = json.loads((run_dir / "checkpoints" / "diverged.json").read_text())
    assert marker["iteration"] == 1 and float(marker["lm loss"]) > 1
    assert not (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").exists()  # NaN-prone state not saved
    assert sweep.outcome(run_dir, 0, 12) == "diverged"
    events = EventAccumulator(str(run_dir / "tensorboard")).Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/diverged")] == [(1, 1.0)]


def test_divergence_means_non_finite_or_above_the_threshold():
    from megatron.quant.training.loop import diverged

    assert diverged(float("nan"), None) and diverged(float("inf"), None) and diverged(5.0, 4.0)
    assert not diverged(5.0, None) and not diverged(4.0, 4.0)


def test_resumed_tensorboard_curve_replaces_the_steps_after_the_checkpoint(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from megatron.quant.training.metrics import MetricsLogger

    for first, last, value in ((1, 5, 1.0), (3, 4, 2.0)):  # crashed after 5, resumed from checkpoint 2
        logger = MetricsLogger(str(tmp_path), enabled=True)
        for step in range(first, last + 1):
            logger.scalars(step, {"lm loss": value})
        logger.close()
    events = EventAccumulator(str(tmp_path)).Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/lm loss")] == [(1, 1.0), (2, 1.0), (3, 2.0), (4, 2.0)]


def test_wandb_logs_offline_or_its_absence_is_a_clear_error(tmp_path, monkeypatch):
    # wandb is an optional extra that CI does not install: where it is, the scalars go to an offline run.
    args = parse_args([*FLAGS, "--wandb-project", "sweep", "--wandb-save-dir", str(tmp_path)])
    if importlib.util.find_spec("wandb") is None:
        with pytest.raises(ArgumentError, match="--wandb-project 'sweep' needs the wandb package"):
            validate_args(args, 1, False)
        return
    from megatron.quant.training.metrics import MetricsLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    validate_args(args, 1, False)
    logger = MetricsLogger(None, enabled=True)
    logger.start_wandb("sweep", "bf16", str(tmp_path), {"seed": 1})
    logger.scalars(1, {"lm loss": 2.0})
    logger.close()
    assert list((tmp_path / "wandb").glob("offline-run-*"))
