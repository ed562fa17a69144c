"""Shared test setup: every test starts from a clean environment for our env vars; one torch thread
per test process and per process a test launches; the ``slow`` marker; the capture-session fixture."""
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional

import pytest
import torch


def _device_argument(argv: list[str]) -> str:
    for i, arg in enumerate(argv):
        if arg.startswith("--device="):
            return arg.split("=", 1)[1]
        if arg == "--device" and i + 1 < len(argv):
            return argv[i + 1]
    return "cpu"


# Triton fixes its own jit functions (triton.language) and every kernel as interpreted or compiled when
# they are imported. A sub-folder's conftest is imported before pytest_configure runs, and importing the
# training package imports Triton (its broken-install guard, megatron.quant.kernels.triton_failure): so
# the interpreter is chosen here, on import, for the CPU run.
if _device_argument(sys.argv) == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

_OUR_ENV_PREFIXES = ("CUSTOM_QUANT_", "TENSOR_SAVE", "TENSOR_SAVER_")


@pytest.fixture(autouse=True)
def _clean_quant_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith(_OUR_ENV_PREFIXES):
            monkeypatch.delenv(key)
    yield


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu", choices=("cpu", "cuda"),
                     help="device for the tests marked `device` (default cpu; cuda runs them on the GPU)")


def pytest_configure(config):
    # Two cores are shared by test workers; more intra-op threads only add contention: with -n 2 on
    # 2 cores every worker's two OpenMP threads oversubscribe the machine (hifp8 on 16M floats took
    # 9 s at two threads beside one busy process, 0.33 s at one). The processes the tests launch
    # (training runs, scripts) read the variables at start; a value the developer set is kept.
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    config.addinivalue_line("markers", "device: runs on --device (cpu by default, cuda on a GPU machine)")
    config.addinivalue_line("markers", "slow: trains a model (training processes or many steps); CI runs them, "
                                       "-m 'not slow' leaves them out")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        # xdist workers compile in parallel already: one inductor compile thread each (16 workers each
        # starting a pool of 16 compile processes is 256), and a cache directory of their own (inductor's
        # default is one per user, written by every worker at once). On a 16-core GPU machine the
        # torch.compile device tests failed under 16 workers and passed in one process.
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(tempfile.gettempdir()) / f"torchinductor-{worker}"))
    if config.getoption("--device") == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda: torch sees no CUDA device")
    if config.getoption("--device") == "cpu":
        # Triton kernels run in its interpreter on CPU (tests/kernels); Triton reads this when a
        # kernel is decorated, so it is set before any test module is collected.
        os.environ.setdefault("TRITON_INTERPRET", "1")


# Fixtures that cost tens of seconds (training runs, whole reports). Every xdist worker that runs a test
# using a session- or module-scoped fixture builds it once more, so the tests using one run on one worker
# (`xdist_group`, scheduled by `--dist loadgroup` in pyproject.toml): a session fixture's tests form one
# group, and a file defining a module fixture keeps all its tests together (some take the fixture by
# `request.getfixturevalue`, which the collection cannot see).
SHARED_FIXTURES = {
    "one_rank": "session", "two_ranks": "session",  # tests/training/conftest.py: ~20 and 5 training runs
    "one_click": "module", "three_scripts": "module",  # tests/analysis/captures/test_analysis_commands.py
    "tp_runs": "module",  # tests/layers/test_tensor_parallel.py: spawned TP=2 runs
    "saved": "module",  # tests/reliability: checkpoints saved by a training run
    "runs": "module",  # tests/training: scheduled and cross-version training runs
}


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        for name, scope in SHARED_FIXTURES.items():
            if scope == "session" and name in item.fixturenames:
                item.add_marker(pytest.mark.xdist_group(name))
                break
            if scope == "module" and name in vars(item.module):
                item.add_marker(pytest.mark.xdist_group(str(item.path)))
                break


@pytest.fixture(scope="session")
def device(request) -> torch.device:
    """The device of the tests marked `device`."""
    return torch.device(request.config.getoption("--device"))


@pytest.fixture
def on_gpu(device) -> None:
    """Skips a test that only means something on a GPU (e.g. CUDA against CPU bits)."""
    if device.type == "cpu":
        pytest.skip("compares the GPU against the CPU: run with --device cuda")


@pytest.fixture
def capture_session(tmp_path) -> Callable[..., None]:
    """``capture_session(save_dir=tmp_path, *, run_iterations=None, **fields)`` starts the process's
    capture session with ``SaverConfig(enabled=True, save_dir=save_dir, **fields)`` (a later call
    replaces it, as ``tensor_saver.configure`` does); the session open at the test's end is closed,
    so its files and manifests are complete and no session leaks into the next test."""
    from megatron.quant import tensor_saver
    from megatron.quant.tensor_saver import SaverConfig

    def start(save_dir: Path | str = tmp_path, *, run_iterations: Optional[range] = None, **fields) -> None:
        fields.setdefault("enabled", True)
        tensor_saver.configure(SaverConfig(save_dir=str(save_dir), **fields), run_iterations=run_iterations)

    yield start
    tensor_saver.close()
