"""The study runner: which runs a budget buys (a pure choice), the ledger entries it writes, and
the whole path (corpus, tokenizer, sweep, ledger) as a dry run on CPU."""
import dataclasses
import json
import os
from pathlib import Path

import pytest

from megatron.quant.analysis.runs import ledger
from megatron.quant.analysis.runs import report as runs_report
from megatron.quant.lab import corpus, study
from megatron.quant.lab.study_plan import PlannedRun, load_plan

PLAN = Path(__file__).resolve().parents[2] / "docs" / "study" / "plan.yaml"
COST = {"bf16": 100.0, "te-nvfp4": 200.0, "mxfp4": 150.0, "te-mxfp8": 150.0}


def _cost(recipes, slowdown=1.5):
    """A wave's seconds: its slowest run, 1.5x as long when it shares the GPU."""
    return max(COST[recipe] for recipe in recipes) * (slowdown if len(recipes) > 1 else 1.0)


def _runs(*names):
    return [PlannedRun(name.split("-seed")[0], 1, name) for name in names]


@pytest.mark.parametrize("budget, chosen", [
    (99, []), (100, ["bf16"]), (299, ["bf16"]), (300, ["bf16", "te-nvfp4"]), (1000, ["bf16", "te-nvfp4", "mxfp4"]),
])
def test_select_runs_takes_the_longest_prefix_that_fits(budget, chosen):
    pending = _runs("bf16", "te-nvfp4", "mxfp4")
    assert [run.name for run in study.select_runs(pending, budget, _cost)] == chosen


def test_a_cheap_later_run_does_not_jump_the_queue():
    pending = _runs("te-nvfp4", "bf16")
    assert study.select_runs(pending, 150, _cost) == []  # bf16 would fit alone, but te-nvfp4 goes first


@pytest.mark.parametrize("budget, chosen", [
    (299, ["bf16"]), (300, ["bf16", "te-nvfp4"]), (449, ["bf16", "te-nvfp4"]), (450, ["bf16", "te-nvfp4", "mxfp4"]),
    (525, ["bf16", "te-nvfp4", "mxfp4", "te-mxfp8"]),
])
def test_runs_at_once_are_chosen_in_waves_that_share_the_gpu(budget, chosen):
    """Waves of two: (bf16, te-nvfp4) 200 x 1.5 = 300 s, then mxfp4 alone 150 s or with te-mxfp8 225 s."""
    pending = _runs("bf16", "te-nvfp4", "mxfp4", "te-mxfp8")
    assert [run.name for run in study.select_runs(pending, budget, _cost, at_once=2)] == chosen


def test_a_wave_goes_to_the_sweep_at_once_on_one_gpu_with_its_own_caches(tmp_path, monkeypatch):
    plan = load_plan(PLAN)
    calls = []
    monkeypatch.setattr(study.sweep, "main", lambda argv: calls.append(argv) or 1)
    built = corpus.Corpus(data_path="d", split="1,1,0", train_documents=1, valid_documents=1, bytes=1, source=[],
                          seed=1, tokens=2, train_tokens=1, sha256="c" * 64)
    flags = study.training_flags(plan, built, None, dry_run=False)
    assert "--data-cache-path" not in flags  # the sweep gives each run at once its own
    assert study.run_wave(plan, plan.order[:2], tmp_path, flags, "python") == ["crashed", "crashed"]  # no run.json
    [argv] = calls
    assert argv[:8] == ["--only", "bf16,te-nvfp4", "--launcher", "python", "--parallel", "2", "--runs-per-gpu", "2"]
    study.run_wave(plan, plan.order[:1], tmp_path, [*flags, "--data-cache-path", "c"], "python")
    assert "--parallel" not in calls[1] and calls[1][:2] == ["--only", "bf16"]


def _entry(run, recipe, sha="a" * 64, study_name="s", status="finished", device="NVIDIA H100 80GB HBM3"):
    return ledger.LedgerEntry(
        study=study_name, run=run, recipe=recipe, seed=1, status=status, device=device,
        start_time="2026-11-26T10:00:00+00:00", end_time="2026-11-26T10:02:00+00:00", wall_s=120.0, step_s=0.02,
        iterations=4, tokens=4096, commit="abc", tree_clean=True, corpus={"sha256": sha, "tokens": 10}, recipe_env={},
        recipe_resolved=[], flags=[], machine={}, scalars={"train/lm loss": ([2, 4], [5.0, float("nan")])})


def test_the_ledger_counts_a_run_done_only_for_the_same_study_and_corpus():
    plan = load_plan(PLAN)
    entries = [_entry("bf16", "bf16"), _entry("te-nvfp4", "te-nvfp4", sha="b" * 64),
               _entry("mxfp4", "mxfp4", study_name="other"), _entry("te-mxfp8", "te-mxfp8", status="crashed"),
               dataclasses.replace(_entry("bf16-seed2", "bf16"), dry_run=True)]
    done = study.done_in_ledger(entries, "s", "a" * 64)
    assert done == {"bf16"} and study.done_in_ledger(entries, "s", "a" * 64, dry_run=True) == {"bf16-seed2"}
    assert [run.name for run in study.pending_runs(plan, done)][:3] == ["te-nvfp4", "mxfp4", "te-mxfp8"]


def test_a_run_whose_recipe_changed_since_its_entry_is_trained_again():
    plan = load_plan(PLAN)
    then = ["recipe te-nvfp4, 4 decoder layers", "  wgrad.grad_output  nvfp4  1x16  0  stochastic"]
    entries = [dataclasses.replace(_entry("te-nvfp4", "te-nvfp4"), recipe_resolved=then),
               dataclasses.replace(_entry("bf16", "bf16"), recipe_resolved=["recipe bf16, 4 decoder layers"]),
               dataclasses.replace(_entry("mxfp4", "mxfp4", sha="b" * 64), recipe_resolved=then)]  # another corpus
    today = {"te-nvfp4": [then[0], "  wgrad.grad_output  nvfp4  1x16  0  stochastic8"],
             "bf16": ["recipe bf16, 4 decoder layers", " core_attention: not quantized"], "mxfp4": []}
    changed = study.changed_in_ledger(entries, "s", "a" * 64, False, today)
    assert changed == {"te-nvfp4": "'wgrad.grad_output nvfp4 1x16 0 stochastic' -> "
                                   "'wgrad.grad_output nvfp4 1x16 0 stochastic8'"}
    done = study.done_in_ledger(entries, "s", "a" * 64) - changed.keys()
    assert [run.name for run in study.pending_runs(plan, done)][:2] == ["te-nvfp4", "mxfp4"]


def test_the_committed_first_tier_holds_its_runs_but_the_24_bit_te_nvfp4():
    """The committed ledger against today's recipes: only te-nvfp4's rounding changed since its runs
    (24 random bits, then the hardware's 8); the table's layout changing must not re-run a study."""
    from megatron.quant.lab.study_ledger import resolved_today

    plan = load_plan(PLAN.parent / "first-tier.yaml")
    entries = ledger.read_ledger(PLAN.parent / "ledger" / plan.name)
    built = corpus.Corpus(data_path="d", split="1,1,0", train_documents=1, valid_documents=1, bytes=1, source=[],
                          seed=1, tokens=2, train_tokens=1, sha256=entries[0].corpus_hash)
    flags = study.training_flags(plan, built, None, dry_run=False)
    today = {recipe: resolved_today(recipe, plan.environment, flags) for recipe in plan.recipes}
    changed = study.changed_in_ledger(entries, plan.name, built.sha256, False, today)
    assert len(entries) == 15 and {run.split("-seed")[0] for run in changed} <= {"te-nvfp4"}
    assert all(change.endswith(" stochastic8'") for change in changed.values())


def test_a_ledger_entry_round_trips_through_its_file(tmp_path):
    entry = _entry("bf16-seed2", "bf16")
    path = ledger.write_entry(entry, tmp_path)
    assert path.name == "bf16-seed2.aaaaaaaa.json"
    data = json.loads(path.read_text())  # strict JSON: the NaN loss is null
    assert data["schema"] == ledger.SCHEMA_VERSION and data["scalars"]["train/lm loss"]["values"] == [5.0, None]
    again = ledger.read_entry(path)
    assert again.scalars["train/lm loss"][1][0] == 5.0 and again.scalars["train/lm loss"][1][1] != again.scalars[
        "train/lm loss"][1][1]  # NaN again
    assert ledger.read_ledger(tmp_path)[0].run == "bf16-seed2"
    older = {key: value for key, value in data.items() if key != "runs_at_once"}  # written before runs shared a GPU
    path.write_text(json.dumps(older))
    assert ledger.read_entry(path).runs_at_once == 1


@pytest.mark.parametrize("change, message", [
    ({"schema": 2}, "ledger schema 2; this code reads schema 1"),
    ({"seed": "one"}, "seed: expected an integer, got 'one'"),
    ({"colour": "blue"}, "unknown key(s) colour"),
    ({"scalars": {"train/lm loss": {"iterations": [1], "values": []}}}, "expected {iterations, values} of equal"),
    ({"runs_at_once": 0}, "runs_at_once: expected an integer >= 1, got 0"),
])
def test_bad_entries_are_one_line(tmp_path, change, message):
    path = ledger.write_entry(_entry("bf16", "bf16"), tmp_path)
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(ledger.LedgerError) as error:
        ledger.read_entry(path)
    assert message in str(error.value) and str(path) in str(error.value) and "\n" not in str(error.value)


@pytest.mark.slow
def test_dry_run_end_to_end(tmp_path, capsys, monkeypatch):
    """Corpus with its own tokenizer, the plan's first run (the budget buys one), trained on a toy
    model through the sweep, its ledger entry written and read by the runs report; then the ledger
    says it is done."""
    source = tmp_path / "text"
    source.mkdir()
    for i in range(6):
        (source / f"m{i}.py").write_text(f'"""Module {i}: the quick brown fox jumps over the lazy dog."""\n' * 4)
    out = tmp_path / "out"
    monkeypatch.delenv("CUSTOM_QUANT_SCOPE", raising=False)
    # Two toy runs at once take 2 x 450 s (the sharing is assumed to gain nothing until measured): the
    # first wave fits 1000 s (after the corpus), a third run after it does not.
    monkeypatch.setattr(study, "DRY_RUN_RUN_S", 450.0)
    argv = ["--plan", str(PLAN), "--out", str(out), "--dry-run", "--corpus-source", str(source)]
    assert study.main([*argv, "--budget-s", "1000", "--runs-at-once", "2"]) == 0
    assert "2 fit the budget (2 at once): bf16, te-nvfp4" in capsys.readouterr().out
    entry, other = [ledger.read_entry(path) for path in sorted((out / study.LEDGER).iterdir())]
    assert other.run == "te-nvfp4" and entry.runs_at_once == other.runs_at_once == 2
    assert (out / study.RUNS / "te-nvfp4" / "data_cache").is_dir()  # runs at once: a cache each, no race
    manifest = json.loads((out / study.CORPUS / "corpus.json").read_text())
    assert (entry.run, entry.status, entry.dry_run, entry.device) == ("bf16", "finished", True, "cpu")
    assert entry.corpus["sha256"] == manifest["sha256"] and (out / study.CORPUS / "tokenizer.json").is_file()
    assert entry.iterations == 2 and entry.tokens == 2 * 2 * 32 and entry.scalars["train/lm loss"][0] == [1, 2]
    assert entry.scalars["validation/lm loss"][0] == [2] and entry.recipe_env["CUSTOM_QUANT_SCOPE"] == "linear"
    assert entry.recipe_resolved[0].startswith("recipe bf16") and "CUSTOM_QUANT_SCOPE" not in os.environ
    # The entry as the runs report reads it.
    assert runs_report.main(["--ledger", str(out / study.LEDGER), "--output_dir", str(tmp_path / "report")]) == 0
    assert "2 runs compared" in capsys.readouterr().out and (tmp_path / "report" / "index.html").is_file()
    # Again with the new entries as the ledger: bf16 and te-nvfp4 are done, mxfp4 is next and does not fit.
    assert study.main([*argv, "--budget-s", "400", "--ledger", str(out / study.LEDGER)]) == 0
    assert "25 of 27 runs pending on this corpus; 0 fit the budget" in capsys.readouterr().out


def test_bad_runner_input_is_one_line(tmp_path, capsys):
    assert study.main(["--plan", str(tmp_path / "none.yaml"), "--budget-s", "10", "--out", str(tmp_path)]) == 2
    assert study.main(["--plan", str(PLAN), "--budget-s", "0", "--out", str(tmp_path)]) == 2
    assert study.main(["--plan", str(PLAN), "--budget-s", "9", "--out", str(tmp_path), "--runs-at-once", "9"]) == 2
    assert study.main(["--plan", str(PLAN), "--ledger", str(tmp_path), "--measured", "--target-s", "-1"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 4 and "cannot read" in errors[0] and "--budget-s must be positive" in errors[1]
    assert "--runs-at-once must be 1 to 8, got 9" in errors[2] and "--target-s must be positive, got -1" in errors[3]
    assert not (tmp_path / study.CORPUS).exists()  # nothing built


def test_add_puts_finished_runs_of_the_plan_into_the_ledger(tmp_path, capsys):
    plan = load_plan(PLAN)
    good = dataclasses.replace(_entry("te-nvfp4-seed2", "te-nvfp4", study_name=plan.name), seed=2, commit=None,
                               tree_clean=None, dirty_allowed=True)  # no git there, trained with --allow-dirty
    stage = tmp_path / "study.json"  # the GPU check's stage record: entries inside
    stage.write_text(json.dumps({"stage": "study", "entries": [ledger.to_json(good)]}))
    argv = ["--plan", str(PLAN), "--ledger", str(tmp_path / "ledger"), "--add"]
    assert study.main([*argv, str(stage)]) == 0
    [added] = ledger.read_ledger(tmp_path / "ledger")
    assert (tmp_path / "ledger" / plan.name / good.file_name).is_file() and added.run == "te-nvfp4-seed2"
    assert added.commit is None and added.tree_clean is None  # unknown stays unknown: no other checkout's commit
    for bad, message in ((dataclasses.replace(good, seed=3), "is not a run of the plan"),
                         (dataclasses.replace(good, study="other"), "is not a run of the plan"),
                         (dataclasses.replace(good, dry_run=True), "is a dry run: not for the ledger"),
                         (dataclasses.replace(good, status="crashed"), "is crashed: not for the ledger")):
        path = ledger.write_entry(bad, tmp_path / "bad")
        assert study.main([*argv, str(path)]) == 2
        assert message in capsys.readouterr().err


def test_runs_stop_when_this_sessions_pace_says_the_next_would_not_fit(tmp_path, monkeypatch, capsys):
    """Each run takes twice its estimate: after three the fourth would overrun; crashed runs get no entry."""
    plan = load_plan(PLAN)
    first, fourth = plan.order[:3], plan.order[3]
    budget = 2 * sum(plan.run_seconds(run.recipe) for run in first) + plan.run_seconds(fourth.recipe) / 2
    clock = [0.0]
    ran = []

    def run_wave(plan_, wave, runs_dir, flags, launcher):
        [run] = wave
        ran.append(run.name)
        clock[0] += 2 * plan.run_seconds(run.recipe)
        return ["crashed"]

    built = corpus.Corpus(data_path="d", split="1,1,0", train_documents=1, valid_documents=1, bytes=1, source=[],
                          seed=1, tokens=2, train_tokens=1, sha256="c" * 64)
    monkeypatch.setattr(study, "ensure_corpus", lambda *args: built)
    monkeypatch.setattr(study, "run_wave", run_wave)
    monkeypatch.setattr(study.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(study.machine, "git_commit", lambda: "f" * 40)  # a clean checkout
    assert study.main(["--plan", str(PLAN), "--budget-s", str(budget), "--out", str(tmp_path)]) == 1
    assert ran == [run.name for run in first]
    chosen = study.select_runs(plan.order, budget, plan.wave_seconds)
    out = capsys.readouterr().out
    assert len(chosen) > 4 and f"{len(chosen)} fit the budget" in out
    assert f"stopping before {fourth.name}: {plan.run_seconds(fourth.recipe) / 2:.0f} s left" in out
    assert f"{first[0].name}: crashed, no ledger entry" in out and not (tmp_path / study.LEDGER).exists()
