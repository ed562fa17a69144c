"""Every kernel specialization the formats launch builds for a Hopper GPU (Triton IR, sm_90), checked
on any machine: the interpreter runs the kernels' Python without the GPU compiler's type checks (a
function returning differently shaped tensors from two branches ran in the interpreter and failed to
compile on a GPU)."""
import subprocess
import sys
from pathlib import Path

import pytest


def test_every_kernel_specialization_builds_for_sm90():
    pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton without its NVIDIA backend")
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-m", "bench.gpu.kernel_build"], cwd=root, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "0 failed" in run.stdout
