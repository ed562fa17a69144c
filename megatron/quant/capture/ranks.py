"""This process's ranks, from torch.distributed and megatron-core's parallel state."""
from __future__ import annotations

from typing import Optional

import torch.distributed as dist


def current_ranks() -> dict[str, Optional[int]]:
    """``rank`` (global), ``tp_rank``, ``pp_rank``, ``dp_rank``.

    Without torch.distributed the process is a world of one (all 0). With torch.distributed
    but no megatron-core parallel state, the model-parallel ranks are unknown (None).
    """
    if not (dist.is_available() and dist.is_initialized()):
        return {"rank": 0, "tp_rank": 0, "pp_rank": 0, "dp_rank": 0}
    from megatron.core import parallel_state as ps

    ranks: dict[str, Optional[int]] = {"rank": dist.get_rank(), "tp_rank": None, "pp_rank": None, "dp_rank": None}
    if ps.model_parallel_is_initialized():
        ranks.update(tp_rank=ps.get_tensor_model_parallel_rank(), pp_rank=ps.get_pipeline_model_parallel_rank(),
                     dp_rank=ps.get_data_parallel_rank())
    return ranks
