"""The sweep on SIGTERM (what a scheduler sends) forwards it to the run's whole process group,
waits for it and records "interrupted" in run.json; an OUTPUT_DIR that is a file is one line."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.reliability._faults import REPO

FLAGS = ["--", "--model", "llama-tiny", "--train-iters", "1"]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in state  # a zombie has ended


def test_sigterm_reaches_the_run_and_is_recorded(tmp_path):
    pidfile = tmp_path / "worker.pid"
    # Stand-in for torchrun: a shell whose child (the "worker") sleeps; both must end.
    launcher = f"sh -c 'sleep 300 & echo $! > {pidfile}; wait' sh"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    sweep = subprocess.Popen([sys.executable, "-m", "megatron.quant.training.sweep", "--launcher", launcher,
                              str(tmp_path / "out"), "bf16", *FLAGS], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    worker = None
    try:
        for _ in range(600):
            if pidfile.is_file() and pidfile.read_text().strip():
                worker = int(pidfile.read_text())
                break
            time.sleep(0.1)
        assert worker is not None, sweep.communicate(timeout=60)
        sweep.send_signal(signal.SIGTERM)
        _, err = sweep.communicate(timeout=90)
        assert sweep.returncode == 128 + signal.SIGTERM, err
        assert "SIGTERM received: the running runs stopped and are recorded as interrupted" in err, err
        assert "Traceback" not in err
        for _ in range(50):  # the group got the signal; give the kernel a moment to reap
            if not _alive(worker):
                break
            time.sleep(0.1)
        assert not _alive(worker), "the run's worker is still running"
        record = json.loads((tmp_path / "out" / "bf16" / "run.json").read_text())
        assert record["status"] == "interrupted" and record["attempts"][-1]["status"] == "interrupted"
    finally:
        if sweep.poll() is None:
            sweep.kill()
        if worker is not None and _alive(worker):
            os.kill(worker, signal.SIGKILL)


def test_output_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    from megatron.quant.training.sweep import main

    target = tmp_path / "out"
    target.write_text("a file")
    assert main([str(target), "bf16", *FLAGS]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"sweep: error: OUTPUT_DIR {target} is an existing file, not a directory; give a directory path"
