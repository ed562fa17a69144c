"""The study runner and its plan under careless and hostile input: numbers that are not numbers,
more runs at once than the machine has cores, a launcher or --out that cannot work, plan keys that
are no variable names, YAML alias bombs, recipe files, bad training-flag values and ledger times
are one line before anything starts; a signal stops the study, which starts no further run."""
import argparse
import copy
import dataclasses
import json
import signal
import time
from pathlib import Path

import pytest
import yaml

from megatron.quant.analysis.runs import ledger
from megatron.quant.lab import corpus, study
from megatron.quant.lab.signals import SweepInterrupted
from megatron.quant.lab.study_plan import StudyPlanError, load_plan, parse_plan
from tests.training.test_study import _entry

PLAN = Path(__file__).resolve().parents[2] / "docs" / "study" / "plan.yaml"


@pytest.mark.parametrize("argv, message", [
    (["--budget-s", "nan"], "--budget-s must be positive, got nan"),
    (["--budget-s", "inf"], "--budget-s must be positive, got inf"),
    (["--budget-s", "60", "--launcher", "no-such-python"], "'no-such-python' is not a program"),
    (["--budget-s", "60", "--runs-at-once", "3"], "--runs-at-once 3: needs at least one CPU core per run; "
                                                  "this node has 2"),
], ids=["nan", "inf", "launcher", "cores"])
def test_session_options_are_one_line_before_the_corpus(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.setattr(study.sweep.os, "sched_getaffinity", lambda pid: {0, 1})  # a 2-core CPU machine
    monkeypatch.setattr(study.sweep, "visible_gpus", lambda environ, count: [])
    assert study.main(["--plan", str(PLAN), "--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out" / study.CORPUS).exists()


def test_an_out_under_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert study.main(["--plan", str(PLAN), "--out", str(tmp_path / "file" / "out"), "--budget-s", "60"]) == 2
    assert "is an existing file, not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["nan", "inf", "-1"])
def test_measured_target_must_be_finite_seconds(tmp_path, capsys, target):
    assert study.main(["--plan", str(PLAN), "--ledger", str(tmp_path), "--measured", "--target-s", target]) == 2
    err = capsys.readouterr().err
    assert f"--target-s must be positive, got {target}" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("step_s", ["abc", float("nan"), -0.5, 0], ids=["text", "nan", "negative", "zero"])
def test_ledger_step_times_are_positive_seconds(tmp_path, step_s):
    path = ledger.write_entry(_entry("bf16", "bf16"), tmp_path)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "step_s": step_s}))
    with pytest.raises(ledger.LedgerError, match="step_s: expected seconds per iteration above 0|NaN is not JSON"):
        ledger.read_entry(path)  # strict JSON writes null, never NaN: a NaN literal is refused as it is read


def _bomb(levels: int = 6) -> object:
    """YAML text whose aliases expand to 9**levels values (a few hundred bytes)."""
    lines = ["- &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"- &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines)


@pytest.mark.parametrize("key", ["recipes", "training_flags", "environment"])
def test_alias_bombs_in_a_plan_are_refused_before_expansion(tmp_path, key):
    text = PLAN.read_text() + f"\nbomb_{key}:\n" + "\n".join("  " + line for line in _bomb().splitlines())
    text += f"\n{key}: *a6\n"  # the key again (the last one wins), an alias of the top: ~530,000 values
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    with pytest.raises(StudyPlanError, match="expands to more than 100000 values through YAML aliases") as error:
        load_plan(path)
    assert len(str(error.value)) < 300


@pytest.fixture(scope="module")
def raw():
    return yaml.safe_load(PLAN.read_text())


@pytest.mark.parametrize("change, message", [
    ({"environment": {"BAD=KEY": "1"}}, "environment: 'BAD=KEY' is not a variable name"),
    ({"environment": {"": "1"}}, "environment: '' is not a variable name"),
    ({"environment": {"X-" * 50_000: "1"}}, "environment: 'X-X-X-"),
    ({"environment": {"CUSTOM_QUANT_SCOPE": {"a": 1}}}, "environment: CUSTOM_QUANT_SCOPE: expected a string"),
    ({"training_flags": ["--lr", "abc", *(["--clip-grad", "1.0"] * 300)]},
     "training_flags: argument --lr: invalid float value: 'abc'"),
], ids=["equals", "empty", "long", "mapping", "lr"])
def test_bad_plan_values_are_one_bounded_line(raw, change, message):
    with pytest.raises(StudyPlanError) as error:
        parse_plan({**copy.deepcopy(raw), **change}, PLAN)
    assert message in str(error.value) and len(str(error.value)) < 400, str(error.value)[:500]


def test_a_recipe_file_is_refused_as_a_plan_recipe(raw, tmp_path):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("format: mxfp8\n")
    with pytest.raises(StudyPlanError, match="is a recipe file; allowed: presets"):
        parse_plan({**copy.deepcopy(raw), "recipes": [*raw["recipes"], str(recipe)]}, PLAN)


def test_a_signal_stops_the_study_after_the_wave_it_hit(tmp_path, monkeypatch):
    plan = load_plan(PLAN)
    calls = []
    monkeypatch.setattr(study.sweep, "main", lambda argv: calls.append(argv) or 128 + signal.SIGTERM)
    built = corpus.Corpus(data_path="d", split="1,1,0", train_documents=1, valid_documents=1, bytes=1, source=[],
                          seed=1, tokens=2, train_tokens=1, sha256="c" * 64)
    args = argparse.Namespace(out=tmp_path, dry_run=False, launcher="python")
    with pytest.raises(SweepInterrupted) as interrupt:
        study.run_chosen(plan, study.waves(plan.order[:5], 1), lambda recipes: 1.0, built, args,
                         deadline=time.monotonic() + 1e6)
    assert interrupt.value.signum == signal.SIGTERM and len(calls) == 1  # no run started after the signal


def test_a_cut_corpus_manifest_is_one_line(tmp_path, capsys):
    (tmp_path / corpus.MANIFEST).write_text('{"data_path": "x", "spl')
    assert corpus.main([str(tmp_path), "--print-data"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / corpus.MANIFEST} is not a corpus manifest" in err and len(err.splitlines()) == 1, err
    built = dataclasses.asdict(corpus.Corpus(data_path="a b/c", split="9,1,0", train_documents=1, valid_documents=1,
                                             bytes=1, source=[], seed=1, tokens=2, train_tokens=1, sha256="c"))
    (tmp_path / corpus.MANIFEST).write_text(json.dumps(built))
    assert corpus.main([str(tmp_path), "--print-data"]) == 0 and capsys.readouterr().out == "a b/c 9,1,0\n"


def test_a_hugging_face_tokenizer_without_a_model_is_one_line(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("hello world\n" * 50)
    status = corpus.main([str(tmp_path / "out"), "--source", str(tmp_path / "src"), "--tokenizer-type",
                          "HuggingFaceTokenizer"])
    err = capsys.readouterr().err
    assert status == 2 and "needs --tokenizer-model DIR" in err and len(err.splitlines()) == 1, err
