"""A study (corpus -> sweep -> report) under careless input: bad data, seeds, recipe names and
TRAIN_ITERS are one line at start with status 2, before any run and with no report of "no runs";
a run killed midway (run.json left "running") is resumed and its half-trained loss never averaged;
a second sweep into the same OUTPUT_DIR refuses while the first runs; an OUTPUT_DIR with spaces works."""
import json
import os
import shlex
import sys

import numpy as np
import pytest

from megatron.quant.lab import sweep
from megatron.quant.lab.run_lock import run_locks
from megatron.quant.training.preprocess import write_indexed_dataset
from tests.reliability._faults import run_command
from tests.training.test_sweep import FAKE_TRAIN

FLAGS = ["--model", "llama-tiny", "--mock-data", "--train-iters", "4"]


@pytest.fixture
def fake_launcher(tmp_path) -> str:
    (tmp_path / "fake_train.py").write_text(FAKE_TRAIN)
    return shlex.join([sys.executable, str(tmp_path / "fake_train.py")])


@pytest.mark.parametrize("seeds, message", [
    ("1 two", "'two' is not a seed; allowed: integers 0 to 4294967295"),
    ("1.5", "'1.5' is not a seed"),
    ("-3", "'-3' is not a seed"),
    (str(2**40), f"'{2**40}' is not a seed"),
    ("1 2 1", "seed 1 is given twice"),
    ("7" * 100_000, "'7777"),
    ("1234", "seed 1234 is the training flags' --seed"),
], ids=["word", "fraction", "negative", "huge", "duplicate", "100k digits", "base seed"])
def test_bad_seeds_are_one_bounded_line(tmp_path, capsys, seeds, message):
    assert sweep.main(["--seeds", seeds, str(tmp_path / "out"), "bf16", "--", *FLAGS]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1 and len(err) < 400, err
    assert not (tmp_path / "out").exists()


def test_unknown_ablation_is_refused_before_anything_runs(tmp_path, capsys):
    assert sweep.main(["--ablate", "te-nvfp9", str(tmp_path / "out"), "bf16", "--", *FLAGS]) == 2
    assert "te-nvfp9" in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage", ["missing", "truncated", "empty"])
def test_bad_data_path_is_checked_once_before_any_run(tmp_path, capsys, fake_launcher, damage):
    prefix = str(tmp_path / "data")
    if damage != "missing":
        write_indexed_dataset([] if damage == "empty" else [[1, 2, 3]], prefix, vocab_size=258)
    if damage == "truncated":
        os.truncate(prefix + ".bin", 2)
    flags = ["--model", "llama-tiny", "--data-path", prefix, "--split", "1,1,0", "--train-iters", "4"]
    assert sweep.main(["--launcher", fake_launcher, str(tmp_path / "out"), "bf16 hifp8", "--", *flags]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("sweep: error: --data-path: "), err
    assert not (tmp_path / "out").exists()  # no run started


def test_killed_run_is_resumed_and_a_second_sweep_refuses_meanwhile(tmp_path, capsys, fake_launcher):
    out = tmp_path / "out dir"  # spaces in OUTPUT_DIR
    assert sweep.main(["--launcher", fake_launcher, str(out), "bf16 hifp8", "--", *FLAGS]) == 0
    # kill -9 in the middle of hifp8: its run.json stays "running", its checkpoint at iteration 2
    record = json.loads((out / "hifp8" / "run.json").read_text())
    (out / "hifp8" / "run.json").write_text(json.dumps(dict(record, status="running")))
    (out / "hifp8" / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2")
    capsys.readouterr()
    with run_locks(out, ["hifp8"]):  # another sweep is running hifp8
        assert sweep.main(["--launcher", fake_launcher, str(out), "bf16 hifp8", "--", *FLAGS]) == 2
        err = capsys.readouterr().err
        assert f"run hifp8 in {out} is being run by another sweep (pid {os.getpid()})" in err
    assert sweep.main(["--launcher", fake_launcher, str(out), "bf16 hifp8", "--", *FLAGS]) == 0
    printed = capsys.readouterr().out
    assert "bf16: finished already, skipped" in printed and f"resuming hifp8 in {out / 'hifp8'}" in printed
    calls = [json.loads(line) for line in (out / "hifp8" / "calls.jsonl").read_text().splitlines()]
    assert [call["start"] for call in calls] == [0, 2]


def test_report_never_averages_a_half_trained_run(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from megatron.quant.analysis.runs.report import write_runs_report

    steps = np.arange(1, 41)
    for name, last, status in (("bf16", 40, "finished"), ("bf16-seed1", 40, "finished"),
                               ("hifp8", 40, "finished"), ("hifp8-seed1", 20, "running")):
        writer = SummaryWriter(str(tmp_path / "runs" / name / "tensorboard"))
        for step in steps[:last]:
            writer.add_scalar("train/lm loss", 5.0 - np.log(step) * (1.1 if name == "hifp8-seed1" else 1.0), step)
        writer.close()
        (tmp_path / "runs" / name / "run.json").write_text(json.dumps({"recipe": name[:4] if "bf" in name else
                                                                      "hifp8", "status": status}))
    recipes = {row["recipe"]: row for row in write_runs_report(tmp_path / "runs", tmp_path / "report", "bf16").recipes}
    assert recipes["hifp8"]["incomplete"] == 1
    mean = "last-10% loss mean"
    assert recipes["hifp8"][mean] == pytest.approx(recipes["bf16"][mean])  # seed1 not averaged in


def test_study_script_refuses_train_iters_with_shell_syntax_before_anything(tmp_path):
    marker = tmp_path / "ran"
    result = run_command(["bash", "examples/study_cpu.sh", str(tmp_path / "study")], timeout=60,
                         TRAIN_ITERS=f"a[$(touch {marker})]")
    assert result.returncode == 2 and not marker.exists(), result.stderr
    error = result.stderr.strip()  # the value is shown as a bounded excerpt: a long tmp path is cut short
    assert error.startswith("error: TRAIN_ITERS='a[$(touch ") and len(error.splitlines()) == 1, error
    assert error.endswith("' is not an iteration count; allowed: an integer from 1 to 999999999"), error
    assert not (tmp_path / "study").exists()


def test_runs_table_says_what_it_could_not_compare(tmp_path):
    """Runs of different lengths, uneven seed sets, a one-point run, a run without a loss tag and a
    NaN seed run: rows and notes, never a traceback."""
    from torch.utils.tensorboard import SummaryWriter

    from megatron.quant.analysis.runs.report import write_runs_report

    def run(name, steps, losses, tag="train/lm loss"):
        writer = SummaryWriter(str(tmp_path / "runs" / name / "tensorboard"))
        for step, value in zip(steps, losses):
            writer.add_scalar(tag, float(value), int(step))
        writer.close()
        (tmp_path / "runs" / name / "run.json").write_text(json.dumps({"recipe": name.split("-seed")[0],
                                                                      "status": "finished"}))

    steps = np.arange(1, 41)
    run("bf16", steps, 5 - np.log(steps))
    run("bf16-seed1", steps, 5 - np.log(steps) + 0.01)
    run("hifp8", np.arange(1, 61), 5 - np.log(np.arange(1, 61)))  # longer than the baseline
    run("hifp8-seed1", steps, 5 - np.log(steps))                     # and its seed ends elsewhere
    run("hifp8-seed2", steps, 5 - np.log(steps))
    run("mxfp8", [1], [5.0])                                        # one point
    run("mxfp8-seed1", steps, np.full(40, np.nan))                  # a NaN seed run
    run("notag", steps, 5 - np.log(steps), tag="train/grad norm")   # no loss tag
    report = write_runs_report(tmp_path / "runs", tmp_path / "report", "bf16")
    rows = {row["run"]: row for row in report.rows}
    assert rows["hifp8"]["notes"] == "compared up to iteration 40, where the baseline bf16 stops (this run: 60)"
    assert rows["mxfp8"]["notes"] == "stops at iteration 1, the baseline bf16 at 40"
    assert rows["notag"]["notes"] == "no train/lm loss logged: nothing to compare"
    assert "loss not finite from iteration 1" in rows["mxfp8-seed1"]["notes"]
    recipes = {row["recipe"]: row for row in report.recipes}
    assert recipes["hifp8"]["notes"] == "finished runs end at iterations 40, 60: not averaged"
    assert np.isnan(recipes["hifp8"]["last-10% loss mean"]) and np.isnan(recipes["hifp8"]["gap to baseline"])
    assert recipes["mxfp8"]["notes"] == "ends at iteration 1, the baseline at 40: no gap"
    assert recipes["mxfp8"]["diverged"] == 1
    assert recipes["notag"]["notes"] == "1 run(s) logged no training loss"
    assert "finished runs end at iterations 40, 60: not averaged" in report.index.read_text()
