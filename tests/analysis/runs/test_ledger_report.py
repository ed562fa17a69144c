"""The runs report from a study ledger: entries become runs (seeds grouped into the recipe table,
devices labelled), entries on different corpora are refused unless one is picked."""
import csv

import numpy as np
import pytest

from megatron.quant.analysis.runs import ledger, report
from megatron.quant.analysis.runs.html import CSV_NAME, RECIPES_CSV

STEPS = list(range(10, 101, 10))
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def _entry(run, level, device, sha="a" * 64):
    recipe = run.split("-seed")[0]
    loss = [float(level * (2 + 4 * np.exp(-s / 30))) for s in STEPS]
    return ledger.LedgerEntry(
        study="gpu-8m-d20", run=run, recipe=recipe, seed=int(run.split("-seed")[1]) if "-seed" in run else 1,
        status="finished", device=device, start_time="2026-11-26T10:00:00+00:00",
        end_time="2026-11-26T10:02:00+00:00", wall_s=120.0, step_s=0.02, iterations=100, tokens=100 * 32768,
        commit="abc", corpus={"sha256": sha}, recipe_env={"CUSTOM_QUANT_TYPE": recipe}, recipe_resolved=[],
        flags=[], machine={"host": "gpu"}, scalars={"train/lm loss": (STEPS, loss),
                                                   "validation/lm loss": ([100], [loss[-1] + 0.05]),
                                                   "train/tokens/s": (STEPS, [1e6] * len(STEPS))})


@pytest.fixture(scope="module")
def ledger_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("ledger")
    for run, level, device in (("bf16", 1.0, H100), ("bf16-seed2", 1.01, H200), ("te-nvfp4", 1.03, H100),
                               ("te-nvfp4-seed2", 1.04, H200), ("mxfp4", 1.02, H100)):
        ledger.write_entry(_entry(run, level, device), root / "gpu-8m-d20")
    return root


def test_the_report_reads_the_ledger_seeds_grouped_and_devices_labelled(ledger_dir, tmp_path, capsys):
    out = tmp_path / "report"
    assert report.main(["--ledger", str(ledger_dir), "--output_dir", str(out)]) == 0
    with open(out / RECIPES_CSV) as handle:
        recipes = {row["recipe"]: row for row in csv.DictReader(handle)}
    assert {name: int(row["seeds"]) for name, row in recipes.items()} == {"bf16": 2, "te-nvfp4": 2, "mxfp4": 1}
    assert float(recipes["te-nvfp4"]["gap to baseline"]) == pytest.approx(1.035 / 1.005 - 1, rel=1e-3)
    with open(out / CSV_NAME) as handle:
        notes = {row["run"]: row["notes"] for row in csv.DictReader(handle)}
    assert notes["bf16-seed2"] == f"ran on {H200}" and notes["bf16"] == f"ran on {H100}"
    assert "5 runs compared" in capsys.readouterr().out


def test_runs_on_two_corpora_are_refused_unless_one_is_picked(ledger_dir, tmp_path, capsys):
    ledger.write_entry(_entry("hifp8", 1.0, H100, sha="b" * 64), ledger_dir / "gpu-8m-d20")
    try:
        assert report.main(["--ledger", str(ledger_dir), "--output_dir", str(tmp_path / "r")]) == 2
        [line] = capsys.readouterr().err.splitlines()
        assert "different corpora" in line and "aaaaaaaa: 5 runs" in line and "bbbbbbbb: 1 runs" in line
        assert report.main(["--ledger", str(ledger_dir), "--corpus", "aaaa", "--output_dir", str(tmp_path / "r")]) == 0
    finally:
        (ledger_dir / "gpu-8m-d20" / "hifp8.bbbbbbbb.json").unlink()


def test_a_ledger_without_runs_dir_needs_an_output_dir(ledger_dir, capsys):
    with pytest.raises(SystemExit) as exit_:
        report.main(["--ledger", str(ledger_dir)])
    assert exit_.value.code == 2 and "with --ledger alone, give --output_dir" in capsys.readouterr().err


def test_entries_of_two_studies_or_one_run_twice_are_refused():
    import dataclasses

    bf16 = _entry("bf16", 1.0, H100)
    with pytest.raises(ledger.LedgerError, match="the ledger mixes studies .*study other"):
        ledger.select_entries([bf16, dataclasses.replace(bf16, study="other", run="mxfp4")])
    with pytest.raises(ledger.LedgerError, match=r"run\(s\) bf16 appear twice"):
        ledger.select_entries([bf16, dataclasses.replace(bf16, device=H200)])
    with pytest.raises(ledger.LedgerError, match="no ledger entry on a corpus whose hash starts with 'ff'"):
        ledger.select_entries([bf16], corpus="ff")


# recipes show's lines of te-nvfp4's dgrad operand, as two versions of the code printed them
TABLE = ["recipe te-nvfp4, 4 decoder layers", "layers 0-3:", " qkv, proj, fc1, fc2:",
         "  operand            format  block  axis  rounding",
         "  dgrad.grad_output  nvfp4   1x16   -1    stochastic", " core_attention: not quantized",
         " output_layer: not quantized"]
LATER = [*TABLE[:3], "  operand            format  block  axis  rounding   ",
         "  dgrad.grad_output  nvfp4   1x16   -1    stochastic8", " core_attention: not quantized",
         " router: not quantized", " output_layer: not quantized"]


def test_a_recipe_change_is_the_operands_not_the_tables_layout():
    relaid = [*TABLE[:3], "  operand format block axis rounding", "  dgrad.grad_output nvfp4 1x16 -1 stochastic",
              *TABLE[5:], " router: not quantized"]  # other column widths, a module the model lacks
    assert ledger.recipe_change(TABLE, relaid) is None
    assert ledger.recipe_change(TABLE, LATER) == ("'dgrad.grad_output nvfp4 1x16 -1 stochastic' -> "
                                                  "'dgrad.grad_output nvfp4 1x16 -1 stochastic8'")
    quantized = [*TABLE[:5], " core_attention:", "  fprop.query  mxfp8  1x32  -1  nearest", TABLE[6]]
    assert ledger.recipe_change(TABLE, quantized) == "'(nothing)' -> 'core_attention:'"  # attention now quantized


def test_exact_sums_said_today_are_what_entries_before_ran_and_a_hopper_accumulator_is_a_change():
    exact = [*TABLE, "accumulate: exact FP32 sums; TE on Hopper: fprop fast, dgrad promoted, wgrad promoted"]
    assert ledger.recipe_change(TABLE, exact) is None  # entries recorded before recipes said how GEMMs sum
    hopper = [*TABLE, "accumulate: fprop fast, dgrad promoted, wgrad promoted (a Hopper FP8 tensor core's accumulator)"]
    assert ledger.recipe_change(TABLE, hopper) == f"'(nothing)' -> {hopper[-1]!r}"


def test_seeds_of_a_recipe_that_changed_between_them_are_noted(tmp_path):
    import dataclasses

    root = tmp_path / "ledger"
    for run, resolved, commit in (("te-nvfp4", TABLE, "1111111111"), ("te-nvfp4-seed2", LATER, "2222222222"),
                                  ("bf16", [], "1111111111")):
        ledger.write_entry(dataclasses.replace(_entry(run, 1.0, H100), recipe_resolved=resolved, commit=commit),
                           root / "gpu-8m-d20")
    notes = {run.name: run.notes for run in ledger.ledger_runs(root)}
    assert notes["bf16"] == [] and notes["te-nvfp4-seed2"] == []  # the first of the recipe's files is the reference
    [note] = notes["te-nvfp4"]
    assert note.startswith("recipe te-nvfp4 resolved otherwise than in te-nvfp4-seed2 (commit 22222222 -> 11111111)")
    assert note.endswith("'dgrad.grad_output nvfp4 1x16 -1 stochastic8' -> "
                         "'dgrad.grad_output nvfp4 1x16 -1 stochastic'")
