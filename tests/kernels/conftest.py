"""Kernel tests: Triton kernels against the torch path, bit for bit. On CPU (the default) they run
in Triton's interpreter; ``pytest --device cuda -m device`` runs them compiled on the GPU."""
import os

import pytest


def pytest_configure(config):
    # Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when its module is first
    # imported: this runs at collection in every (xdist) worker, before any test imports one.
    if config.getoption("--device") == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def kernel_device(device):
    """The test device, once Triton imports (else the test is skipped, saying why)."""
    pytest.importorskip("triton", reason="Triton does not import here: its kernels are not tested")
    return device
