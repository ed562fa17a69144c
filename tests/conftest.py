"""Shared test setup: every test starts from a clean environment for our env vars."""
import os

import pytest
import torch

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
    # Two cores are shared by test workers; more intra-op threads only add contention.
    torch.set_num_threads(1)
    config.addinivalue_line("markers", "device: runs on --device (cpu by default, cuda on a GPU machine)")
    if config.getoption("--device") == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda: torch sees no CUDA device")
    if config.getoption("--device") == "cpu":
        # Triton kernels run in its interpreter on CPU (tests/kernels); Triton reads this when a
        # kernel is decorated, so it is set before any test module is collected.
        os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def device(request) -> torch.device:
    """The device of the tests marked `device`."""
    return torch.device(request.config.getoption("--device"))


@pytest.fixture
def on_gpu(device) -> None:
    """Skips a test that only means something on a GPU (e.g. CUDA against CPU bits)."""
    if device.type == "cpu":
        pytest.skip("compares the GPU against the CPU: run with --device cuda")
