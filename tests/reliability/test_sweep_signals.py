"""The sweep on SIGTERM (what a scheduler sends) forwards it to the run's whole process group,
waits for it and records "interrupted" in run.json; an OUTPUT_DIR that is a file is one line."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability._faults import REPO

FLAGS = ["--", "--model", "llama-tiny", "--train-iters", "1"]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in state  # a zombie has ended


@pytest.mark.parametrize("parallel", [1, 2], ids=["one_at_a_time", "two_slots"])
def test_sigterm_reaches_the_run_and_is_recorded(tmp_path, parallel):
    pidfile = tmp_path / "workers.pid"
    # Stand-in for torchrun: a shell whose child (the "worker") sleeps; all of them must end.
    launcher = f"sh -c 'sleep 300 & echo $! >> {pidfile}; wait' sh"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    recipes = ["bf16", "mxfp8"][:parallel]
    sweep = subprocess.Popen([sys.executable, "-m", "megatron.quant.lab.sweep", "--launcher", launcher,
                              "--parallel", str(parallel), str(tmp_path / "out"), " ".join(recipes), *FLAGS],
                             cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        for _ in range(600):
            workers = [int(line) for line in pidfile.read_text().split()] if pidfile.is_file() else []
            if len(workers) == parallel:
                break
            time.sleep(0.1)
        assert len(workers) == parallel, sweep.communicate(timeout=60)
        sweep.send_signal(signal.SIGTERM)
        _, err = sweep.communicate(timeout=90)
        assert sweep.returncode == 128 + signal.SIGTERM, err
        assert "SIGTERM received: the running runs stopped and are recorded as interrupted" in err, err
        assert "Traceback" not in err
        for _ in range(50):  # the groups got the signal; give the kernel a moment to reap
            if not any(map(_alive, workers)):
                break
            time.sleep(0.1)
        assert not any(map(_alive, workers)), "a run's worker is still running"
        for recipe in recipes:
            record = json.loads((tmp_path / "out" / recipe / "run.json").read_text())
            assert record["status"] == "interrupted" and record["attempts"][-1]["status"] == "interrupted"
    finally:
        if sweep.poll() is None:
            sweep.kill()
        for worker in workers:
            if _alive(worker):
                os.kill(worker, signal.SIGKILL)


def test_output_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    from megatron.quant.lab.sweep import main

    target = tmp_path / "out"
    target.write_text("a file")
    assert main([str(target), "bf16", *FLAGS]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"sweep: error: OUTPUT_DIR {target} is an existing file, not a directory; give a directory path"
