"""The run comparison report on synthetic TensorBoard event files whose gaps are known."""
import csv
import json
import math
import subprocess

import numpy as np
import pytest

from megatron.quant.analysis import cli
from megatron.quant.analysis.runs import metrics, read
from megatron.quant.analysis.runs import report as runs_report

STEPS = np.arange(1, 201)
BASE = 2 + 4 * np.exp(-STEPS / 40) * (1 + 0.01 * np.sin(STEPS))  # wiggles: smoothing matters


def _write(run_dir, scalars: dict, steps=STEPS, record: dict | None = None) -> None:
    """``scalars``: tag -> values over ``steps``, or tag -> {step: value}."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run_dir / "tensorboard"))
    for tag, values in scalars.items():
        points = values.items() if isinstance(values, dict) else zip(steps, values)
        for step, value in points:
            writer.add_scalar(tag, float(value), int(step))
    writer.close()
    if record is not None:
        (run_dir / "run.json").write_text(json.dumps(record))


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    spikes = np.ones(STEPS.size)
    spikes[[49, 149]] = 10.0
    stats = {"train/quant/qkv/input/underflow_ratio": np.full(STEPS.size, 0.01),
             "train/quant/fc1/weight/dynamic_range_log2": np.full(STEPS.size, 12.0)}  # a metric added later
    _write(root / "bf16", {"train/lm loss": BASE, "train/tokens/s": np.full(STEPS.size, 1000.0),
                           "train/grad norm": spikes, "train/learning rate": np.full(STEPS.size, 1e-3),
                           "validation/lm loss": {50: 3.0, 100: 2.5, 200: 2.25}, **stats},
           record={"recipe": "bf16", "status": "finished", "git_commit": "abc123", "machine": {"host": "node7"}})
    _write(root / "const2", {"train/lm loss": 1.02 * BASE, "train/tokens/s": np.full(STEPS.size, 500.0), **stats})
    _write(root / "jump", {"train/lm loss": BASE * np.where(STEPS >= 120, 1.08, 1.0)})
    _write(root / "sparse", {"train/lm loss": 0.97 * BASE[3::4]}, steps=STEPS[3::4])
    _write(root / "bf16-seed1", {"train/lm loss": 1.004 * BASE})
    _write(root / "bf16-seed2", {"train/lm loss": 0.995 * BASE})
    _write(root / "blowup", {"train/lm loss": BASE[:30], "train/diverged": {31: 1.0}}, steps=STEPS[:30])
    (root / "report").mkdir()  # a report directory inside the runs directory is not a run
    return root


@pytest.fixture(scope="module")
def report(runs_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    return out, runs_report.write_runs_report(runs_dir, out, "bf16", smoothing=0.0)


def _rows(report) -> dict[str, dict]:
    return {row["run"]: row for row in report[1].rows}


def test_gaps_equal_the_known_ones(report):
    rows = _rows(report)
    expected = {"bf16": 0.0, "const2": 0.02, "jump": 0.08, "sparse": -0.03, "bf16-seed1": 0.004,
                "bf16-seed2": -0.005}
    for name, gap in expected.items():
        assert rows[name]["gap at end"] == pytest.approx(gap, abs=1e-6), name
        assert rows[name]["gap last 10%"] == pytest.approx(gap, abs=1e-6), name
    assert rows["blowup"]["gap last 10%"] == pytest.approx(0.0, abs=1e-7)


def test_first_iteration_over_each_threshold(report):
    rows = _rows(report)
    over = {name: (row["first iteration gap > 1%"], row["first iteration gap > 5%"]) for name, row in rows.items()}
    assert over["const2"] == (1, None) and over["jump"] == (120, 120) and over["sparse"] == (None, None)
    assert over["bf16"] == (None, None)


def test_divergence_spikes_throughput_and_validation(report):
    rows = _rows(report)
    assert rows["blowup"]["diverged"] and not rows["const2"]["diverged"]
    assert rows["blowup"]["iterations"] == 30
    assert rows["bf16"]["grad-norm spikes"] == 2 and rows["const2"]["grad-norm spikes"] == 0
    assert rows["const2"]["tokens/s vs baseline"] == pytest.approx(0.5)
    assert math.isnan(rows["jump"]["tokens/s vs baseline"])  # it logged no throughput
    assert rows["bf16"]["final validation loss"] == 2.25
    assert rows["bf16"]["status"] == "finished" and rows["const2"]["status"] == "unknown"
    assert rows["bf16-seed1"]["recipe"] == "bf16"


def test_smoothed_gap_of_a_constant_ratio_is_that_ratio_and_lags_a_jump():
    base = (STEPS, BASE)
    steps, gap = metrics.relative_gap((STEPS, 1.02 * BASE), base, smoothing=0.9)
    assert gap == pytest.approx(np.full(STEPS.size, 0.02))
    jump = metrics.relative_gap((STEPS, BASE * np.where(STEPS >= 120, 1.08, 1.0)), base, smoothing=0.6)
    assert metrics.first_above(jump, 0.05) > 120 and metrics.first_above(jump, 0.01) == 120


def test_noise_band_spans_the_baseline_seeds(runs_dir):
    runs = {run.name: run for run in read.load_runs(runs_dir)}
    steps, low, high = metrics.noise_band(runs["bf16"], [runs["bf16-seed1"], runs["bf16-seed2"]], 0.6)
    assert steps.tolist() == STEPS.tolist()
    # event files store float32: equal to ~1e-7
    assert low == pytest.approx(np.full(STEPS.size, -0.005), abs=1e-6)
    assert high == pytest.approx(np.full(STEPS.size, 0.004), abs=1e-6)


def test_csv_has_one_row_per_run_with_the_table_numbers(report):
    out, result = report
    with open(out / "runs.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["run"] for row in rows] == ["bf16", "bf16-seed1", "bf16-seed2", "blowup", "const2", "jump",
                                            "sparse"]
    const2 = rows[4]
    assert float(const2["gap at end"]) == pytest.approx(0.02, abs=1e-6)
    assert const2["first iteration gap > 1%"] == "1" and const2["first iteration gap > 5%"] == ""
    assert float(const2["tokens/s vs baseline"]) == pytest.approx(0.5)
    assert rows[3]["diverged"] == "True"


def test_html_report_and_figures(report):
    out, result = report
    assert not result.failed and not result.warnings
    for png in ("loss.png", "training.png", "validation.png", "stats_underflow_ratio.png",
                "stats_dynamic_range_log2.png"):
        assert (out / png).stat().st_size > 1000, png
    page = result.index.read_text()
    assert "<img src='stats_dynamic_range_log2.png'" in page and "<img src='loss.png'" in page
    assert "node7" in page and "abc123" in page  # run.json details
    assert "-0.50 % to +0.40 %" in page  # baseline noise at the end


@pytest.mark.parametrize("make, message", [
    (lambda root: root / "missing", "does not exist"),
    (lambda root: (root / "empty" / "a").mkdir(parents=True) or root / "empty", "no runs in"),
])
def test_bad_directories_are_named(tmp_path, capsys, make, message):
    assert cli.main(["runs", str(make(tmp_path))]) == 2
    assert message in capsys.readouterr().err


def test_absent_baseline_names_the_runs(runs_dir, tmp_path, capsys):
    assert cli.main(["runs", str(runs_dir), "--output_dir", str(tmp_path), "--baseline", "fp32"]) == 2
    err = capsys.readouterr().err
    assert "baseline 'fp32' is not among the runs" in err and "bf16, bf16-seed1, bf16-seed2, blowup" in err


def test_compare_runs_script_writes_into_the_report_dir(runs_dir, tmp_path):
    done = subprocess.run(["bash", "script/compare_runs.sh", str(runs_dir), str(tmp_path / "r"), "--dpi", "30"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r" / "index.html").is_file() and (tmp_path / "r" / "runs.csv").is_file()


def test_a_figure_beyond_the_figure_budget_is_a_warning_not_a_failure(runs_dir, tmp_path, capsys, monkeypatch):
    """The report is complete (exit 0); the figure is drawn, with the problem on the page and on stderr."""
    from megatron.quant.analysis import figure_budget

    monkeypatch.setattr(figure_budget, "problems", lambda fig: ["panel 'x': text 'rel_mse' runs off the figure"])
    assert cli.main(["runs", str(runs_dir), "--output_dir", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "warning: figure loss.png is drawn, but may hide something" in err and "error" not in err
    page = (tmp_path / "out" / "index.html").read_text()
    assert "Warning: loss.png may hide something" in page and "<img src='loss.png'" in page
