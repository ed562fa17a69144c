"""The GPU check's budget: stages that would not fit are skipped and recorded, commands past their
deadline are killed with their process group, and what finished is still written."""
import json
import os
import sys
import time

import pytest

from bench.gpu.budget import run_command
from bench.gpu.runner import LOG_NAME, SUMMARY_NAME, run_stages
from bench.gpu.stage import Stage


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _stage(name, estimate, run):
    return Stage(name, run, lambda record: [f"{name} summary: {record.get('value')}"], estimate, estimate)


def test_a_stage_whose_estimate_exceeds_the_budget_left_is_skipped_and_recorded(tmp_path):
    clock = FakeClock()

    def slow(context):
        clock.now += 8  # ran 8 of the 10 s
        return {"value": 1}

    stages = {"a": _stage("a", 5, slow), "b": _stage("b", 5, lambda context: {"value": 2}),
              "c": _stage("c", 1, lambda context: {"value": 3})}
    records = run_stages(["a", "b", "c"], stages, tmp_path, budget_s=10, dry_run=True, device="fake", clock=clock)
    assert [records[n]["status"] for n in "abc"] == ["done", "skipped", "done"]
    skipped = json.loads((tmp_path / "b.json").read_text())
    assert skipped["device"] == "fake" and "exceeds the budget left (2 s)" in skipped["reason"]
    assert json.loads((tmp_path / "c.json").read_text())["value"] == 3
    summary = (tmp_path / SUMMARY_NAME).read_text()
    assert "| b | skipped |" in summary and "c summary: 3" in summary


def test_a_stage_that_fits_itself_runs_from_its_smallest_work_to_the_budgets_end(tmp_path):
    """The study runner fits its runs to the time given: a budget under its cold estimate still runs it
    (it had been skipped with 235 s left for a 400 s estimate), with the whole rest as its deadline."""
    clock, seen = FakeClock(), {}

    def fitting(context):
        seen[context.device] = context.remaining()
        return {"value": 1}

    stage = Stage("study", fitting, lambda record: [], estimate_s=400, dry_estimate_s=90, fits_itself_from_s=150)
    records = run_stages(["study"], {"study": stage}, tmp_path / "a", budget_s=235, dry_run=False, device="a",
                         clock=clock)
    assert records["study"]["status"] == "done" and seen["a"] == 235  # not capped at 1.5x an estimate
    records = run_stages(["study"], {"study": stage}, tmp_path / "b", budget_s=120, dry_run=False, device="b",
                         clock=clock)
    assert records["study"]["status"] == "skipped"
    assert "its smallest useful work (150 s) exceeds the budget left (120 s)" in records["study"]["reason"]


def test_a_stage_that_raises_is_recorded_and_the_next_one_runs(tmp_path):
    def broken(context):
        raise RuntimeError("no GPU today")

    stages = {"a": _stage("a", 1, broken), "b": _stage("b", 1, lambda context: {"value": 2})}
    records = run_stages(["a", "b"], stages, tmp_path, budget_s=10, dry_run=True, device="fake", clock=FakeClock())
    assert records["a"]["status"] == "error" and records["a"]["error"] == "RuntimeError: no GPU today"
    assert records["b"]["status"] == "done"
    assert "no GPU today" in (tmp_path / LOG_NAME).read_text()  # the traceback


def test_a_command_past_the_budget_is_killed_and_the_stage_still_written(tmp_path):
    def sleeper(context):
        result = context.command([sys.executable, "-c", "print('started', flush=True); import time; time.sleep(60)"])
        return {"value": result.output.strip(), "stopped": result.killed}

    stages = {"a": _stage("a", 1, sleeper), "b": _stage("b", 1, lambda context: {"value": 2})}
    start = time.monotonic()
    records = run_stages(["a", "b"], stages, tmp_path, budget_s=1.2, dry_run=True, device="fake")
    assert time.monotonic() - start < 30
    assert records["a"]["status"] == "stopped at its deadline" and records["a"]["value"] == "started"
    assert records["b"]["status"] == "skipped"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json", LOG_NAME, SUMMARY_NAME]


def test_the_deadline_kills_the_whole_process_group(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    grandchild = "import time; time.sleep(60)"
    child = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {grandchild!r}]); "
             f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('spawned', flush=True); time.sleep(60)")
    with open(tmp_path / "log", "w") as log:
        result = run_command([sys.executable, "-c", child], time.monotonic() + 3, log)
    assert result.killed and result.returncode is None and "spawned" in result.output
    pid = int(pid_file.read_text())
    for _ in range(50):  # the kill is delivered at once; reaping by init may take a moment
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        if open(f"/proc/{pid}/stat").read().split()[2] == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"grandchild {pid} outlived the deadline")


def test_a_command_that_ends_in_time_returns_its_exit_code_and_output(tmp_path):
    with open(tmp_path / "log", "w") as log:
        result = run_command([sys.executable, "-c", "import sys; print('hello'); sys.exit(3)"],
                             time.monotonic() + 60, log)
    assert (result.returncode, result.output, result.killed) == (3, "hello\n", False)
    assert "exit 3" in (tmp_path / "log").read_text()
