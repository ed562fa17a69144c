"""Kernel tests: Triton kernels against the torch path, bit for bit. On CPU (the default) they run
in Triton's interpreter (the root conftest sets TRITON_INTERPRET=1); ``pytest --device cuda -m device``
runs them compiled on the GPU."""
import importlib
import os

import pytest


def pytest_configure(config):
    # Triton fixes a kernel as interpreted or compiled when it is decorated, i.e. when its module is
    # first imported: import them here, under TRITON_INTERPRET, so that no test run earlier in this
    # worker (with another environment) decides it. Set here too: when pytest is given paths in this
    # folder, this hook runs before the root conftest's.
    if config.getoption("--device") == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if config.getoption("--device") == "cpu" and os.environ["TRITON_INTERPRET"] == "1":
        try:
            importlib.import_module("triton")
        except ImportError:
            return
        importlib.import_module("megatron.quant.kernels.triton_format")


@pytest.fixture(autouse=True)
def _interpreter_on_cpu(request, monkeypatch):
    """launch.interpreting() reads the variable at call time: keep it set for every kernel test."""
    if request.config.getoption("--device") == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def kernel_device(device):
    """The test device, once Triton imports (else the test is skipped, saying why)."""
    pytest.importorskip("triton", reason="Triton does not import here: its kernels are not tested")
    return device
