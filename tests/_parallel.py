"""megatron-core parallel state at TP=1 (gloo, CPU) for one test module: the ``parallel`` fixture
that the layer and recipe tests share (their conftests import it)."""
import pytest


@pytest.fixture(scope="module")
def parallel():
    from megatron.quant import cpu

    cpu.init_parallel(seed=11)
    yield
    cpu.destroy_parallel()
