"""The GPU check's ``study`` stage: the runner called with the stage's time and the committed plan and
ledger, the finished runs' entries carried back inside the stage's record, and its summary."""
import io
import json
from dataclasses import dataclass

from bench.gpu import study_stage
from bench.gpu.budget import CommandResult
from bench.gpu.registry import STAGES
from bench.gpu.stage import Context


@dataclass(frozen=True)
class FakeRunner(Context):
    """A context whose child process is the runner's output and one entry file, not a training run."""

    def python(self, module, *args, env=None):
        out = self.scratch / "study" / "ledger"
        out.mkdir(parents=True)
        entry = {"run": "mxfp4+sr+rht", "status": "finished", "step_s": 0.031, "wall_s": 190.0,
                 "corpus": {"sha256": "ab" * 32}, "scalars": {"train/lm loss": {"iterations": [20], "values": [3.51]}}}
        (out / "mxfp4+sr+rht.abababab.json").write_text(json.dumps(entry))
        (self.scratch / "argv.json").write_text(json.dumps([module, *args]))
        return CommandResult(0, 200.0, "noise\nstudy: 1 of 27 runs pending on this corpus; 1 fit the budget: x\n")


def test_the_stage_gives_the_runner_its_time_and_returns_the_entries(tmp_path):
    clock = iter([1000.0] * 10).__next__
    context = FakeRunner(tmp_path, tmp_path, dry_run=True, device="cpu (dry run)", deadline=1300.0, log=io.StringIO(),
                         clock=clock)
    record = study_stage.run(context)
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[0] == "megatron.quant.lab.study" and argv[-1] == "--dry-run"
    assert argv[argv.index("--budget-s") + 1] == str(300 - study_stage.MARGIN_S)
    assert argv[argv.index("--plan") + 1] == str(study_stage.PLAN) and study_stage.PLAN.is_file()
    assert argv[argv.index("--ledger") + 1] == str(study_stage.LEDGER) and study_stage.LEDGER.is_dir()
    assert record["runner"] == ["1 of 27 runs pending on this corpus; 1 fit the budget: x"]
    assert [entry["run"] for entry in record["entries"]] == ["mxfp4+sr+rht"] and not record["stopped"]
    summary = "\n".join(study_stage.summarize(record))
    assert "| mxfp4+sr+rht | finished | 3.5100 | 0.0310 | 190 | 1 | abababab |" in summary
    assert "--plan docs/study/anchor-3m.yaml --add study.json" in summary  # the checkout's path of the plan run
    assert STAGES["study"].run is study_stage.run


@dataclass(frozen=True)
class FakeSizingRunner(Context):
    """A runner that sized the first tier: its plan.yaml and sizing.json in the stage's out folder."""

    def python(self, module, *args, env=None):
        out = self.scratch / "study"
        out.mkdir(parents=True)
        (out / "plan.yaml").write_text("name: gpu-tier1-d20\n")
        sizing = {"measurements": [{"preset": "llama-study-1m", "at_once": 5}], "shared_slowdown": 1.8,
                  "chosen": {"preset": "llama-study-1m", "parameters": 853120, "train_iters": 521, "tier_s": 120.0}}
        (out / "sizing.json").write_text(json.dumps(sizing))
        (self.scratch / "argv.json").write_text(json.dumps([module, *args]))
        return CommandResult(0, 150.0, "study: sized: llama-study-1m\n")


def test_the_stage_runs_the_plan_given_and_carries_the_sized_plan_back(tmp_path):
    tier = study_stage.REPO / "docs" / "study" / "first-tier.yaml"
    context = FakeSizingRunner(tmp_path, tmp_path, dry_run=False, device="GPU", deadline=1300.0, log=io.StringIO(),
                               clock=iter([1000.0] * 10).__next__, study_plan=tier)
    record = study_stage.run(context)
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[argv.index("--plan") + 1] == str(tier) and record["plan"] == str(tier)
    assert record["sized_plan"] == "name: gpu-tier1-d20\n" and record["sizing"]["chosen"]["train_iters"] == 521
    summary = "\n".join(study_stage.summarize(record))
    assert "sized: llama-study-1m (0.85M parameters, 521 iterations), the tier ~120 s; 5 at once: each step 1.80x" \
        in summary
    assert "--plan docs/study/first-tier.yaml --add study.json" in summary
