"""The ledger tells the truth about its runs: the runner trains for the ledger only from a clean git
checkout unless told (and the entry says so), an entry names no host and no working paths, ``--add``
refuses each bad entry on its own and keeps the good ones, ``--measured`` names and leaves out what it
cannot read, and a pair of runs of different code is shown as mixed."""
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from megatron.quant.analysis.runs import ledger, metrics, seed_stats
from megatron.quant.lab import study
from megatron.quant.lab.study_ledger import StudyError, portable
from megatron.quant.lab.study_plan import load_plan
from tests.training.test_study import _entry

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "docs" / "study" / "plan.yaml"
TIER1 = ROOT / "docs" / "study" / "ledger" / "gpu-tier1-d20"


def _stop(*args):
    raise StudyError("stopped before the corpus")


@pytest.mark.parametrize("commit", ["abc+dirty", None], ids=["dirty", "no-git"])
def test_the_runner_refuses_a_tree_whose_commit_would_not_name_the_code(tmp_path, capsys, monkeypatch, commit):
    monkeypatch.setattr(study.machine, "git_commit", lambda: commit)
    monkeypatch.setattr(study, "ensure_corpus", _stop)
    argv = ["--plan", str(PLAN), "--budget-s", "60", "--out", str(tmp_path / "out")]
    assert study.main(argv) == 2
    err = capsys.readouterr().err
    assert "give --allow-dirty" in err and len(err.splitlines()) == 1, err
    assert study.main([*argv, "--allow-dirty"]) == 2  # past the check, stopped at the corpus
    captured = capsys.readouterr()
    assert "--allow-dirty: this checkout" in captured.out and "stopped before the corpus" in captured.err
    assert study.main([*argv, "--dry-run"]) == 2  # a dry run writes no ledger entry: not checked
    assert "stopped before the corpus" in capsys.readouterr().err


def test_an_entry_names_no_host_and_no_working_paths():
    entry = dataclasses.replace(
        _entry("bf16", "bf16"), machine={"host": "node-17", "gpus": ["H200"]},
        flags=["--data-path", "/tmp/gpu_check_x/study/corpus/corpus_text_document", "--tokenizer-model",
               "/scratch/me/out/corpus", "--lr", "2e-3"],
        corpus={"sha256": "a" * 64, "source": ["/tmp/tmpab12/text", "/usr/lib/python3.12"]})
    clean = portable(entry)
    assert "host" not in clean.machine and clean.machine["gpus"] == ["H200"]
    assert clean.flags == ["--data-path", "corpus/corpus_text_document", "--tokenizer-model", "corpus", "--lr", "2e-3"]
    assert clean.corpus["source"] == ["text", "/usr/lib/python3.12"]


def test_the_committed_entries_name_no_host_and_no_temporary_path():
    text = "".join(path.read_text() for path in TIER1.glob("*.json"))
    assert '"host"' not in text and "/tmp/" not in text


def _hostile(good: dict) -> dict:
    return {"string loss": {**good, "scalars": {"train/lm loss": {"iterations": [1], "values": ["3.2"]}}},
            "10^400 iterations": {**good, "iterations": 10**400},
            "10^400 steps": {**good, "scalars": {"train/lm loss": {"iterations": [10**400], "values": [1.0]}}},
            "boolean seed": {**good, "seed": True},
            "infinite wall time": {**good, "wall_s": BIG}}


BIG = "__1e400__"  # written as the JSON number 1e400, which Python reads as inf


def _text(data) -> str:
    return json.dumps(data).replace(f'"{BIG}"', "1e400")


def test_add_refuses_each_bad_entry_by_name_and_keeps_every_good_one(tmp_path, capsys):
    plan = load_plan(PLAN)
    good = dataclasses.replace(_entry("te-nvfp4-seed2", "te-nvfp4", study_name=plan.name), seed=2)
    other = dataclasses.replace(good, run="mxfp4-seed2", recipe="mxfp4")
    data = ledger.to_json(good)
    stage = tmp_path / "study.json"
    stage.write_text(_text({"entries": [*_hostile(data).values(), data]}))
    files = {"bytes.json": b"\xff\xfe not utf-8", "nested.json": b"[" * 100_000, "nan.json":
             json.dumps({**ledger.to_json(other), "wall_s": float("nan")}).encode(), "list.json": b"[1, 2]"}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    dirty = ledger.write_entry(dataclasses.replace(other, commit="abc+dirty", tree_clean=False), tmp_path / "d")
    kept = ledger.write_entry(other, tmp_path / "good")
    argv = ["--plan", str(PLAN), "--ledger", str(tmp_path / "ledger"), "--add", str(stage),
            *(str(tmp_path / name) for name in files), str(dirty), str(kept)]
    assert study.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == len(_hostile(data)) + len(files) + 1 and all(line.startswith("study: error: refused ")
                                                                    for line in err)
    for i in range(len(_hostile(data))):
        assert any(f"entries[{i}]" in line for line in err)
    assert any("an integer of 401 digits" in line for line in err)
    for name in files:
        assert any(name in line for line in err)
    assert any("uncommitted changes" in line and "--allow-dirty" in line for line in err)
    assert sorted(e.run for e in ledger.read_ledger(tmp_path / "ledger")) == ["mxfp4-seed2", "te-nvfp4-seed2"]


def test_measured_names_a_hostile_entry_and_goes_on(tmp_path, capsys):
    plan = load_plan(PLAN)
    good = dataclasses.replace(_entry("bf16", "bf16", study_name=plan.name), step_s=0.05)
    ledger.write_entry(good, tmp_path / plan.name)
    for name, data in _hostile(ledger.to_json(good)).items():
        (tmp_path / plan.name / f"{name.replace(' ', '_')}.json").write_text(_text(data))
    assert study.main(["--plan", str(PLAN), "--ledger", str(tmp_path), "--measured"]) == 0
    captured = capsys.readouterr()
    assert len(captured.err.splitlines()) == len(_hostile({})) and "left out" in captured.err
    assert "step_s: {bf16: 0.05000}" in captured.out


def _seed(pair, commit, clean=True, definition=()):
    steps = np.arange(1, 11)
    return seed_stats.SeedRun((steps, np.full(10, 3.0)), (steps, np.full(10, 3.1 + 0.01 * len(pair))),
                              pair=pair, commit=commit, clean=clean, definition=definition)


def test_a_pair_of_different_code_is_shown_mixed():
    base = [_seed("", "a"), _seed("2", "a"), _seed("3", "a")]
    same = seed_stats.recipe_row("r", [_seed("", "a"), _seed("2", "a"), _seed("3", "a")], base)
    assert same["mixed pairs"] == 0 and same["notes"] == ""
    runs = [_seed("", "a", clean=False, definition=("x",)), _seed("2", "a", definition=("x",)),
            _seed("3", "b", definition=("y",))]
    row = seed_stats.recipe_row("r", runs, base)
    assert row["paired pairs"] == 3 and row["mixed pairs"] == 2
    assert "seed first: uncommitted changes" in row["notes"]
    assert "seed 3: commits b and a, another recipe definition" in row["notes"]


def test_the_committed_first_tier_shows_its_mixed_commits():
    """13 runs from a tree with uncommitted changes; two seed-3 runs from a later commit, paired with bf16's
    seed 3 from the earlier one: every pair is mixed, and the per-run table names each run's commit."""
    runs = ledger.ledger_runs(TIER1)
    rows = {row["recipe"]: row for row in metrics.recipe_table(metrics.recipe_groups(runs), "bf16")}
    assert all(row["mixed pairs"] == 3 for name, row in rows.items() if name != "bf16")
    assert "seed 3: commits 09369a9 and 2f83c28, uncommitted changes" in rows["te-mxfp8"]["notes"]
    base = next(run for run in runs if run.name == "bf16")
    trees = [metrics.summarize(run, base, 0.0)["tree"] for run in runs]
    assert trees.count("uncommitted changes") == 13 and trees.count("clean") == 2
    assert not math.isnan(rows["te-mxfp8"]["paired gap"])
