"""Layer tests run in one process with megatron-core parallel state at TP=1 (gloo, CPU)."""
import pytest


@pytest.fixture(scope="module")
def parallel():
    from megatron.quant import cpu

    cpu.init_parallel(seed=11)
    yield
    cpu.destroy_parallel()
