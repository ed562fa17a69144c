"""Every kernel specialization the formats launch builds for a Hopper GPU (Triton IR, sm_90), checked
on any machine: the interpreter runs the kernels' Python without the GPU compiler's type checks (a
function returning differently shaped tensors from two branches ran in the interpreter and failed to
compile on a GPU). The heaviest ones compile to cubins through ptxas, where a thread's registers and
spills show (``python -m bench.gpu.kernel_build --cubin``)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron.quant.kernels.registry import KERNELS


def test_every_kernel_specialization_builds_for_sm90():
    pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton without its NVIDIA backend")
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-m", "bench.gpu.kernel_build"], cwd=root, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "0 failed" in run.stdout


def test_every_kernel_specialization_builds_under_the_oldest_supported_triton():
    """Triton 3.6 (torch 2.11's) is stricter than newer Triton and the interpreter: a tuple nested in a
    grouped constexpr and passed on to a ``@triton.jit`` callee compiled under 3.9 and failed under 3.6,
    so every NVFP kernel failed on a GPU. MEGATRON_QUANT_TRITON_OLDEST: a folder holding Triton 3.6
    (``pip install --no-deps --target DIR triton==3.6.0``; .ci/run makes one)."""
    oldest = os.environ.get("MEGATRON_QUANT_TRITON_OLDEST")
    if not oldest:
        pytest.skip("MEGATRON_QUANT_TRITON_OLDEST names no Triton 3.6 install")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([oldest, str(root), os.environ.get("PYTHONPATH", "")]))
    env.pop("TRITON_INTERPRET", None)  # the check below imports Triton before the build can unset it
    run = subprocess.run([sys.executable, "-c", "import triton, runpy; assert triton.__version__.startswith('3.6'), "
                          "triton.__version__; runpy.run_module('bench.gpu.kernel_build', run_name='__main__')"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "0 failed" in run.stdout


# The specializations that spilled: the full statistics' tree sums (every thread held the whole run:
# 9 KB of stack a thread with Triton 3.9, 40 KB with 3.6) and 128 x 128 FP8 tiles on 4 warps (4-9 KB).
HEAVIEST = ("bf16 float32 with full statistics", "fp8_e4m3 bfloat16 both axes",
            "fp8_e4m3 bfloat16 with full statistics")
MAX_STACK = 4096  # bytes a thread; those kernels need 0 to 2.3 KB now
INSTRUCTION_CEILINGS = json.loads((Path(__file__).with_name("instruction_ceilings.json")).read_text())


@pytest.fixture(scope="module")
def heaviest_cubins(tmp_path_factory) -> dict:
    """The HEAVIEST calls' specializations compiled to cubins once, for the tests below."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton without its NVIDIA backend")
    root = Path(__file__).resolve().parents[2]
    out = tmp_path_factory.mktemp("cubins") / "k.json"
    run = subprocess.run([sys.executable, "-m", "bench.gpu.kernel_build", "--cubin", "--json", str(out),
                          "--select", *HEAVIEST], cwd=root, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_heaviest_specializations_compile_to_cubins_without_large_spills(heaviest_cubins):
    rows = heaviest_cubins["rows"]
    kernels = {row["kernel"] for row in rows}
    assert {kernel.name for kernel in KERNELS if kernel.role == "quantize"} <= kernels, kernels
    spilling = [f"{row['first_launched_by']}: {row['stack_bytes']} B ({row['constexprs']})" for row in rows
                if row["stack_bytes"] > MAX_STACK]
    assert not spilling, spilling


def test_the_kernels_stay_within_their_instruction_budgets_or_their_ceilings(heaviest_cubins):
    """The work model (``bench.gpu.work_model``): each specialization's SASS instructions a processed
    element against its class's budget at the H100's issue rate over HBM bandwidth. Those over budget
    today may not grow past today's count (INSTRUCTION_CEILINGS, per Triton version, whose code differs);
    a new specialization must meet its budget."""
    ceilings = INSTRUCTION_CEILINGS.get(heaviest_cubins["triton"].rsplit(".", 1)[0])
    if ceilings is None:
        pytest.skip(f"no instruction ceilings recorded for Triton {heaviest_cubins['triton']}")
    assert {row["class"] for row in heaviest_cubins["rows"]} >= {"cast", "both axes", "statistics", "amax"}
    grown = []
    for row in heaviest_cubins["rows"]:
        label = f"{row['first_launched_by']}: {row['kernel']} {row['constexprs']}"
        allowed = ceilings.get(label, row["budget_per_element"])
        print(f"{label}: {row['instructions_per_element']} instructions an element, budget "
              f"{row['budget_per_element']}, allowed {allowed}")
        if row["instructions_per_element"] > allowed + 1e-9:
            grown.append(f"{label}: {row['instructions_per_element']} > {allowed} (budget {row['budget_per_element']})")
    assert not grown, grown
