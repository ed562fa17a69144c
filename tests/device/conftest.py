"""Device tests: run on CPU by default, on the GPU with ``pytest --device cuda`` (``-m device`` for
just these). One process group for the folder, on the test device (gloo on CPU, nccl on CUDA)."""
import pytest


@pytest.fixture(scope="module")
def parallel(device):
    from megatron.quant import cpu

    cpu.init_parallel(seed=11)
    yield
    cpu.destroy_parallel()
