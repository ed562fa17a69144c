"""The sweep for a study: seeds of every recipe, --ablate, and --parallel runs in their own slots.

Runs use a stand-in trainer (no real training): it records its environment, waits at a barrier
until as many runs as the test expects have started (a sweep that ran them one after the other
would time out there), and crashes or finishes as told."""
import json
import shlex
import sys

import pytest
from test_sweep import _calls

from megatron.quant.lab import sweep, sweep_plan
from megatron.quant.lab.slots import SlotError, slot_environments, visible_gpus
from megatron.quant.training.preprocess import write_indexed_dataset

FLAGS = ["--model", "llama-tiny", "--mock-data", "--train-iters", "4"]

FAKE_TRAIN = r'''
import json, os, sys, time
argv = sys.argv[3:]  # after "-m megatron.quant.training"
flag = lambda name, default=None: argv[argv.index(name) + 1] if name in argv else default
save, iters = flag("--save"), int(flag("--train-iters"))
run_dir = os.path.dirname(save)
tracker = os.path.join(save, "latest_checkpointed_iteration.txt")
start = int(open(tracker).read()) if os.path.exists(tracker) else 0
recipe = os.environ["CUSTOM_QUANT_TYPE"]
barrier = os.environ.get("FAKE_BARRIER")
if barrier:  # wait until this many runs have started: they run at once
    os.makedirs(os.path.join(barrier, "started"), exist_ok=True)
    open(os.path.join(barrier, "started", os.path.basename(run_dir)), "w").close()
    deadline = time.time() + 30
    while len(os.listdir(os.path.join(barrier, "started"))) < int(os.environ["FAKE_AT_ONCE"]):
        if time.time() > deadline:
            sys.exit("barrier timed out: the runs did not start together")
        time.sleep(0.05)
os.makedirs(save, exist_ok=True)
print(f"training {recipe} from {start}")
with open(os.path.join(run_dir, "calls.jsonl"), "a") as f:
    f.write(json.dumps({"start": start, "recipe": recipe, "cache": flag("--data-cache-path"), "env": {
        k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")}}) + "\n")
crash = recipe == os.environ.get("FAKE_CRASH")
open(tracker, "w").write(str(2 if crash else iters))
sys.exit(1 if crash else 0)
'''


@pytest.fixture
def parallel_launcher(tmp_path) -> str:
    (tmp_path / "parallel_train.py").write_text(FAKE_TRAIN)
    return shlex.join([sys.executable, str(tmp_path / "parallel_train.py")])


def test_seeds_apply_to_every_recipe_unless_a_baseline_is_named():
    names = [run.name for run in sweep_plan.plan_runs("bf16 mxfp4", seeds=(1, 2))]
    assert names == ["bf16", "mxfp4", "bf16-seed1", "mxfp4-seed1", "bf16-seed2", "mxfp4-seed2"]
    runs = sweep_plan.plan_runs("bf16 mxfp4", seeds=(1, 2), baseline="mxfp4")
    assert [(run.name, run.extra_flags) for run in runs][2:] == [("mxfp4-seed1", ("--seed", "1")),
                                                                 ("mxfp4-seed2", ("--seed", "2"))]
    assert all(run.env == (("CUSTOM_QUANT_TYPE", "mxfp4"),) for run in runs[1:])


def test_ablate_adds_the_preset_and_its_variants_once():
    names = [run.name for run in sweep_plan.plan_runs("bf16 te-nvfp4", ablate=["te-nvfp4", "mxfp4"])]
    assert names == ["bf16", "te-nvfp4", "te-nvfp4-no-sr", "te-nvfp4-no-rht", "te-nvfp4-no-2d",
                     "te-nvfp4+bf16-layers", "te-nvfp4+bf16-fwd-tail", "mxfp4", "mxfp4+sr", "mxfp4+rht", "mxfp4+sr+rht"]
    with pytest.raises(sweep_plan.SweepError, match="--ablate 'fp5'"):
        sweep_plan.plan_runs("bf16", ablate=["fp5"])


def test_print_keeps_ablate_in_each_runs_command(tmp_path, capsys):
    assert sweep.main(["--print", "--ablate", "te-mxfp8", str(tmp_path), "bf16", "--", *FLAGS]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [shlex.split(line)[4] for line in lines] == ["bf16", "te-mxfp8", "te-mxfp8-no-rceil"]
    assert all("--ablate te-mxfp8" in line for line in lines)


def test_slots_share_the_gpus_or_the_cores():
    assert slot_environments(2, ["0", "1", "2", "3"], 16, gpus_per_run=2) == [
        {"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]
    assert slot_environments(3, [], 8) == [{"OMP_NUM_THREADS": "2"}] * 3
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "3, 5"}, 8) == ["3", "5"]
    assert visible_gpus({}, 2) == ["0", "1"] and visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, 2) == []
    with pytest.raises(SlotError, match="needs 4 GPUs; 2 visible"):
        slot_environments(4, ["0", "1"], 16)


def test_runs_per_gpu_puts_that_many_slots_on_each_gpu():
    assert slot_environments(3, ["0", "1"], 16, runs_per_gpu=2) == [
        {"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
    assert slot_environments(4, ["0", "1", "2", "3"], 16, gpus_per_run=2, runs_per_gpu=2) == [
        {"CUDA_VISIBLE_DEVICES": "0,1"}] * 2 + [{"CUDA_VISIBLE_DEVICES": "2,3"}] * 2
    assert slot_environments(4, [], 8, runs_per_gpu=4) == [{"OMP_NUM_THREADS": "2"}] * 4  # no GPUs: the cores
    with pytest.raises(SlotError, match="2 runs per GPU needs 3 GPUs; 2 visible"):
        slot_environments(5, ["0", "1"], 16, runs_per_gpu=2)
    with pytest.raises(SlotError, match="--runs-per-gpu must be at least 1, got 0"):
        slot_environments(2, ["0"], 16, runs_per_gpu=0)
    with pytest.raises(SlotError, match="one CPU core per run; this node has 2"):
        slot_environments(3, [], 2)


def test_parallel_refuses_a_launcher_with_a_fixed_port(tmp_path, capsys):
    argv = ["--parallel", "2", "--launcher", "torchrun --nproc-per-node 1 --master-port 29512", str(tmp_path / "out"),
            "bf16 mxfp4", "--", *FLAGS]
    assert sweep.main(argv) == 2
    assert "fixes --master-port" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_parallel_runs_go_at_once_each_in_its_slot_and_each_resumes(tmp_path, parallel_launcher, monkeypatch):
    out = tmp_path / "sweep"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the CPU slots, on any machine
    monkeypatch.setattr(sweep.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setenv("FAKE_BARRIER", str(tmp_path))
    monkeypatch.setenv("FAKE_AT_ONCE", "2")
    monkeypatch.setenv("FAKE_CRASH", "mxfp4")
    write_indexed_dataset([[1, 2, 3]], str(tmp_path / "text_document"), vocab_size=258)  # checked before runs
    flags = ["--model", "llama-tiny", "--data-path", str(tmp_path / "text_document"), "--train-iters", "4"]
    argv = ["--parallel", "2", "--launcher", parallel_launcher, str(out), "bf16 mxfp4", "--", *flags]
    assert sweep.main(argv) == 1  # both started before either ended (the barrier), mxfp4 crashed at iteration 2
    for name, status in (("bf16", "finished"), ("mxfp4", "crashed")):
        record = json.loads((out / name / "run.json").read_text())
        assert record["status"] == status and record["attempts"][0]["status"] == status
        assert _calls(out / name)[0]["env"] == {"OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": ""}
        assert _calls(out / name)[0]["cache"] == str(out / name / sweep.DATA_CACHE)  # no race on a shared one
        assert f"training {name} from 0" in (out / name / sweep.TRAIN_LOG).read_text()

    monkeypatch.delenv("FAKE_CRASH")
    monkeypatch.setenv("FAKE_AT_ONCE", "1")
    assert sweep.main(argv) == 0
    assert [c["start"] for c in _calls(out / "mxfp4")] == [0, 2]  # resumed from its checkpoint
    assert len(_calls(out / "bf16")) == 1  # finished: skipped
    record = json.loads((out / "mxfp4" / "run.json").read_text())
    assert [a["status"] for a in record["attempts"]] == ["crashed", "finished"]
