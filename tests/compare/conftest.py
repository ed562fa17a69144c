"""Modules here build models in-process: each ends with no parallel state and no launcher
variables left behind (init_parallel exports RANK, MASTER_PORT, ... for a one-process world,
which child processes of later tests would otherwise inherit)."""
import os

import pytest

_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="module", autouse=True)
def _leave_no_parallel_state():
    saved = {key: os.environ.get(key) for key in _LAUNCHER_VARS}
    yield
    import torch.distributed as dist

    if dist.is_initialized():
        from megatron.quant import cpu

        cpu.destroy_parallel()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
