"""Checkpoints across the supported megatron-core releases: one written by the older release
resumes under the newer exactly where the older's own run goes; the older release refuses the
newer's layout in one line. Runs only where MEGATRON_QUANT_OTHER_PYTHON names an interpreter
with another megatron-core (.ci/run sets it for its Python 3.12 run)."""
import os
import re
import subprocess
import sys

import pytest

from tests.reliability._faults import assert_one_line_error, run_command

OTHER = os.environ.get("MEGATRON_QUANT_OTHER_PYTHON")
pytestmark = pytest.mark.skipif(not OTHER, reason="MEGATRON_QUANT_OTHER_PYTHON names no second interpreter")
RUN = ["--model", "llama-tiny", "--num-layers", "1", "--seq-length", "32", "--mock-data", "--micro-batch-size", "2",
       "--global-batch-size", "2", "--train-iters", "4", "--lr", "1e-3", "--eval-iters", "0", "--log-interval", "1",
       "--seed", "3"]
LOSS = re.compile(r"^iteration\s+(\d+)/\s*\d+ \| lm loss: (\S+)", re.MULTILINE)


def _version(python: str) -> tuple[int, ...]:
    out = subprocess.run([python, "-c", "import megatron.core; print(megatron.core.__version__)"],
                         capture_output=True, text=True, check=True).stdout
    return tuple(int(part) for part in out.strip().split(".")[:2])


@pytest.fixture(scope="module")
def pythons() -> tuple[str, str]:
    """(older, newer) interpreters by their megatron-core release."""
    older, newer = sorted((sys.executable, OTHER), key=_version)
    if _version(older) == _version(newer):
        pytest.skip(f"both interpreters have megatron-core {_version(older)}")
    return older, newer


def _train(python: str, *flags: str) -> subprocess.CompletedProcess:
    return run_command([python, "-m", "megatron.quant.training", *RUN, *flags], timeout=300)


def _losses(result: subprocess.CompletedProcess) -> dict[int, str]:
    assert result.returncode == 0, result.stderr[-3000:]
    return {int(iteration): loss for iteration, loss in LOSS.findall(result.stdout)}


@pytest.fixture(scope="module")
def runs(pythons, tmp_path_factory) -> dict:
    """The older release trains 4 iterations saving at 2 and 4; the newer resumes its iteration 2
    and saves iteration 4 in its own layout."""
    older, newer = pythons
    root = tmp_path_factory.mktemp("versions")
    whole = _losses(_train(older, "--save", str(root / "older"), "--save-interval", "2"))
    resumed = _train(newer, "--load", str(root / "older"), "--ckpt-step", "2", "--save", str(root / "newer"),
                     "--save-interval", "2")
    return {"whole": whole, "resumed": resumed, "newer_checkpoints": root / "newer"}


def test_older_checkpoint_resumes_under_newer_release(runs):
    assert "resumed from" in runs["resumed"].stdout
    whole = runs["whole"]
    assert _losses(runs["resumed"]) == {3: whole[3], 4: whole[4]}  # as printed, 4 significant digits


def test_older_release_refuses_newer_layout_in_one_line(pythons, runs):
    if (runs["newer_checkpoints"] / "iter_0000004" / "common.pt").exists():
        pytest.skip("the newer release still writes common.pt, which the older one reads")
    assert_one_line_error(_train(pythons[0], "--load", str(runs["newer_checkpoints"])),
                          "iter_0000004 cannot be loaded here", "common.pt", "megatron-core 0.19 or later")
