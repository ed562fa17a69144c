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


def pytest_configure(config):
    # Two cores are shared by test workers; more intra-op threads only add contention.
    torch.set_num_threads(1)
