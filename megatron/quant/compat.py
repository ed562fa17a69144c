"""What differs between the megatron-core releases this package supports (0.16 to 0.19).

Each difference that needs a branch is here, decided once from what the installed megatron-core
provides, not from its version number. Releases named are the two that ran (0.16.1, 0.19.2); 0.17
and 0.18 were not checked. Differences absorbed elsewhere without a branch:

- 0.19: ``ParamAndGradBuffer``'s gradient sync waits on CUDA-graph events through
  ``torch.cuda.current_stream()`` without checking for a GPU; ``cpu.py`` gives CPU runs a
  stream that waits on nothing.
- 0.19: constructing ``GPTModel`` logs that it is deprecated in favour of ``HybridModel``, which
  0.16 does not have; the Llama model stays a GPTModel (docs/training.md#megatron-core-versions).
"""
from __future__ import annotations

import functools
import importlib.util

# 0.19 (Megatron-LM PR 5160): dist_checkpointing.save stores the common (non-tensor) state as the
# ShardedObject "common_state" inside the PyTorch DCP files, listed in their index under this key,
# and its loader reads that layout or the older one; 0.16 writes and reads only a separate file.
# training/checkpoint_files.py checks what the index lists.
COMMON_STATE_KEY = "common_state/shard_0_1"
COMMON_STATE_FILE = "common.pt"


@functools.cache
def reads_indexed_common_state() -> bool:
    """Whether the installed megatron-core loads a common state kept inside the DCP files."""
    try:  # the separate file's load strategy went away with the file
        from megatron.core.dist_checkpointing.strategies.common import TorchCommonLoadStrategy  # noqa: F401
    except ImportError:
        return True
    return False


@functools.cache
def core_imports_triton() -> bool:
    """Whether ``import megatron.core`` itself imports Triton.

    0.19 does, unconditionally (``transformer/moe/ops/paged_stash.py``, reached from the pipeline
    schedules) and without declaring it: a missing or broken Triton then breaks megatron-core, and
    hiding a broken one (``kernels.select.triton_failure``) cannot help. 0.16 imports it only where
    it handles an ImportError.
    """
    try:
        return importlib.util.find_spec("megatron.core.transformer.moe.ops.paged_stash") is not None
    except ModuleNotFoundError:  # 0.16 has no moe/ops package
        return False
