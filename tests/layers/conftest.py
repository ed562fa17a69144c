"""Layer tests run in one process with megatron-core parallel state at TP=1 (gloo, CPU)."""
import pytest

from megatron.quant.layers import scaled_gemm
from tests._parallel import parallel  # noqa: F401


@pytest.fixture
def gpu_gemm_path(monkeypatch):
    """The layers take the GPU's narrow GEMM into an FP32 output, which ``bench.gpu.step_work.WorkCount``
    computes on the CPU (tests/layers/test_step_work*.py)."""
    monkeypatch.setattr(scaled_gemm, "OUT_DTYPE_DEVICES", (*scaled_gemm.OUT_DTYPE_DEVICES, "cpu"))
