"""Modules here build models in-process: each ends with no parallel state left behind."""
import pytest


@pytest.fixture(scope="module", autouse=True)
def _leave_no_parallel_state():
    yield
    import torch.distributed as dist

    if dist.is_initialized():
        from megatron.quant import cpu

        cpu.destroy_parallel()
