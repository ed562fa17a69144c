"""A sweep's runs and locks under kill -9 and careless paths: the trainer (and the workers its
launcher started) die with the sweep, the run's lock lives as long as any of them, a restart resumes
the run with no second writer; lock paths in the way, a launcher that does not exist and a bad
training-flag value are one line before any run starts."""
import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from megatron.quant.lab import sweep
from megatron.quant.lab.run_lock import RunLockedError, run_locks
from tests.reliability._faults import REPO
from tests.reliability.test_sweep_signals import _alive
from tests.training.test_sweep import FAKE_TRAIN

FLAGS = ["--model", "llama-tiny", "--mock-data", "--train-iters", "4"]
LIFETIME = REPO / "megatron" / "quant" / "training" / "lifetime.py"
# Stand-in for torchrun: writes its pid, starts a "worker" (closing its descriptors, as torchrun does)
# that asks to die with its parent as the trainer does under a sweep, and waits for it.
FAKE_TORCHRUN = r'''
import os, subprocess, sys
pids = sys.argv[1]
open(pids, "a").write(f"{os.getpid()}\n")
worker = r"""
import importlib.util, os, sys, time
spec = importlib.util.spec_from_file_location("lifetime", sys.argv[1])
lifetime = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lifetime)
lifetime.trainer_dies_with_parent()
open(sys.argv[2], "a").write(f"{os.getpid()}\n")
time.sleep(120)
"""
subprocess.run([sys.executable, "-c", worker, sys.argv[2], pids])
'''


@pytest.fixture
def fake_launcher(tmp_path) -> str:
    (tmp_path / "fake_train.py").write_text(FAKE_TRAIN)
    return shlex.join([sys.executable, str(tmp_path / "fake_train.py")])


def _pids(path, count: int, process: subprocess.Popen) -> list[int]:
    for _ in range(600):
        pids = [int(line) for line in path.read_text().split()] if path.is_file() else []
        if len(pids) == count or process.poll() is not None:
            return pids
        time.sleep(0.1)
    return []


def test_kill_9_of_a_sweep_ends_its_trainer_and_a_restart_resumes_the_run(tmp_path, fake_launcher, capsys):
    (tmp_path / "torchrun.py").write_text(FAKE_TORCHRUN)
    pidfile, out = tmp_path / "pids", tmp_path / "out"
    launcher = shlex.join([sys.executable, str(tmp_path / "torchrun.py"), str(pidfile), str(LIFETIME)])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-m", "megatron.quant.lab.sweep", "--launcher", launcher,
                                str(out), "bf16", "--", *FLAGS], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, start_new_session=True)
    pids = []
    try:
        pids = _pids(pidfile, 2, process)
        assert len(pids) == 2, process.communicate(timeout=60)[1]
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        for _ in range(100):
            if not any(map(_alive, pids)):
                break
            time.sleep(0.1)
        assert not any(map(_alive, pids)), "the killed sweep's launcher or worker still runs: a second writer"
    finally:
        for pid in [process.pid, *pids]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert json.loads((out / "bf16" / "run.json").read_text())["status"] == "running"  # kill -9 records nothing
    assert sweep.main(["--launcher", fake_launcher, str(out), "bf16", "--", *FLAGS]) == 0  # the lock is free
    said = capsys.readouterr().out
    assert "resuming bf16" in said and "its last sweep was killed while it ran" in said, said
    assert json.loads((out / "bf16" / "run.json").read_text())["status"] == "finished"


def test_a_trainer_holds_its_runs_lock_after_its_sweep_let_go(tmp_path):
    with run_locks(tmp_path, ["bf16"]) as locks:
        trainer = subprocess.Popen(["sleep", "60"], pass_fds=(locks["bf16"],))  # as the sweep starts it
    try:
        with pytest.raises(RunLockedError, match=f"run bf16 in {tmp_path} is being run by another sweep"):
            with run_locks(tmp_path, ["bf16"]):
                pass
    finally:
        trainer.kill()
        trainer.wait()
    with run_locks(tmp_path, ["bf16"]):  # free once the trainer has gone
        pass


@pytest.mark.parametrize("damage", ["locks_is_a_file", "lock_is_a_directory", "garbage_lock"])
def test_lock_paths_in_the_way_are_one_line(tmp_path, capsys, fake_launcher, damage):
    out = tmp_path / "out"
    out.mkdir()
    if damage == "locks_is_a_file":
        (out / ".locks").write_text("x")
    else:
        (out / ".locks").mkdir()
        if damage == "lock_is_a_directory":
            (out / ".locks" / "bf16.lock").mkdir()
        else:
            (out / ".locks" / "bf16.lock").write_bytes(os.urandom(200) + b"\xff" * 100)
    status = sweep.main(["--launcher", fake_launcher, str(out), "bf16", "--", *FLAGS])
    err = capsys.readouterr().err
    if damage == "garbage_lock":  # nobody holds it: the sweep takes it over
        assert status == 0 and "Traceback" not in err, err
        return
    assert status == 2 and len(err.splitlines()) == 1 and err.startswith("sweep: error: "), err
    assert ".locks" in err and "remove" in err and not (out / "bf16").exists()


def test_a_garbage_lock_held_by_another_names_no_garbage(tmp_path):
    with run_locks(tmp_path, ["bf16"]) as locks:
        os.pwrite(locks["bf16"], b"\x00\xffnot a pid" * 10, 0)
        with pytest.raises(RunLockedError, match=r"another sweep \(pid unknown\)"):
            with run_locks(tmp_path, ["bf16"]):
                pass


def test_a_launcher_that_does_not_exist_is_one_line_before_any_run(tmp_path, capsys):
    status = sweep.main(["--launcher", "no-such-torchrun --nproc-per-node 1", str(tmp_path / "out"), "bf16", "--",
                         *FLAGS])
    err = capsys.readouterr().err
    assert status == 2 and len(err.splitlines()) == 1 and "'no-such-torchrun' is not a program" in err, err
    assert not (tmp_path / "out" / "bf16").exists()


def test_a_bad_training_flag_value_names_the_flag_not_the_whole_line(tmp_path, capsys):
    flags = [*FLAGS, "--lr", "abc", *(["--log-interval", "1"] * 200)]
    assert sweep.main([str(tmp_path / "out"), "bf16", "--", *flags]) == 2
    err = capsys.readouterr().err
    assert "sweep: error: training flags: argument --lr: invalid float value: 'abc'" in err, err
    assert len(err) < 400


RECORD_ARGV = r"""
import json, os, sys
argv = sys.argv[3:]
save = argv[argv.index("--save") + 1]
os.makedirs(save, exist_ok=True)
json.dump(argv, open(os.path.join(os.path.dirname(save), "argv.json"), "w"))
"""


def test_every_run_keeps_its_index_cache_under_its_run(tmp_path):
    from megatron.quant.training.preprocess import write_indexed_dataset

    (tmp_path / "data").mkdir()
    prefix = str(tmp_path / "data" / "text")  # the data's folder may be read-only: nothing is written there
    write_indexed_dataset([[1, 2, 3, 4]] * 4, prefix, vocab_size=258)
    flags = ["--model", "llama-tiny", "--data-path", prefix, "--split", "1,1,0", "--train-iters", "4"]
    (tmp_path / "fake_train.py").write_text(RECORD_ARGV)
    launcher = shlex.join([sys.executable, str(tmp_path / "fake_train.py")])
    sweep.main(["--launcher", launcher, str(tmp_path / "out"), "bf16", "--", *flags])
    argv = json.loads((tmp_path / "out" / "bf16" / "argv.json").read_text())
    assert argv[argv.index("--data-cache-path") + 1] == str(tmp_path / "out" / "bf16" / sweep.DATA_CACHE)


@pytest.mark.parametrize("flags, message", [
    (["--micro-batch-size", str(2**40)], f"--micro-batch-size {2**40} x --seq-length 128"),
    (["--seq-length", str(2**31), "--max-position-embeddings", str(2**31)], f"--seq-length {2**31} = "),
], ids=["micro_batch", "seq_length"])
def test_a_micro_batch_beyond_int32_token_indices_is_refused_at_start(flags, message):
    from megatron.quant.training.arguments import ArgumentError, parse_args, validate_args

    args = parse_args(["--model", "llama-tiny", "--mock-data", "--train-iters", "2", *flags])
    with pytest.raises(ArgumentError, match="tokens cannot fit one micro-batch; allowed: at most 2,147,483,646") as e:
        validate_args(args, world_size=1, cuda=False)
    assert message in str(e.value)


def test_a_long_fusions_value_is_a_bounded_excerpt():
    from megatron.quant.layers import fusions

    with pytest.raises(ValueError) as error:
        fusions.choose({fusions.ENV: "x" * 100_000}, cuda=False, precision="bf16")
    assert f"{fusions.ENV}='xxx" in str(error.value) and len(str(error.value)) < 250
