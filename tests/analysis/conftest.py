"""Capture directories shared by the analysis tests (written once per session)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from capture_fixture import tiny_run  # noqa: E402


@pytest.fixture(scope="session")
def tiny_logs(tmp_path_factory) -> Path:
    """hifp8/mxfp8/mxfp4/bf16; linear (qkv, fc2) and attention; forward and backward;
    layers 0-1, ranks 0-1; files for iteration 0, statistics-only entries for 1-3."""
    root = tmp_path_factory.mktemp("tensor_logs")
    tiny_run(root)
    return root
