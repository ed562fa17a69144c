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
from dataclasses import dataclass

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


@dataclass(frozen=True)
class PrivateName:
    """A name megatron-core keeps private that the package still relies on, and why no public one serves."""

    module: str   # where it lives in megatron-core
    name: str     # attribute path inside that module
    used_in: str  # our module
    why: str


# Every private megatron-core name the package uses, checked on CHECKED_ON (tests/test_package.py holds
# that each exists in the installed release and that no other private megatron-core name is used).
CHECKED_ON = ("0.16.1", "0.19.2")
PRIVATE_NAMES = (
    PrivateName("megatron.core.tensor_parallel.layers", "_grad_accum_fusion_available", "layers/linear_function.py",
                "whether apex's fused wgrad kernel imported: gradient-accumulation fusion must add into main_grad "
                "as that kernel does"),
    PrivateName("megatron.core.tensor_parallel.random", "_CUDA_RNG_STATE_TRACKER", "cpu.py",
                "CPU runs only: the RNG tracker megatron-core builds holds CUDA generators"),
    PrivateName("megatron.core.tensor_parallel.random", "_CUDA_RNG_STATE_TRACKER_INITIALIZED", "cpu.py",
                "CPU runs only: marks the CPU tracker as the initialised one"),
    PrivateName("megatron.core.tensor_parallel.random", "_MODEL_PARALLEL_RNG_TRACKER_NAME", "cpu.py",
                "CPU runs only: the tracker's default stream name, which the CPU tracker's fork keeps"),
    PrivateName("megatron.core.tensor_parallel.random", "_get_cuda_rng_state", "cpu.py",
                "CPU runs only: activation recompute saves the CUDA RNG state"),
    PrivateName("megatron.core.tensor_parallel.random", "_set_cuda_rng_state", "cpu.py",
                "CPU runs only: and restores it"),
    PrivateName("megatron.core.extensions.transformer_engine", "_TE_CONFIG_TYPE_KEY", "recipes/precision_file.py",
                "the key of a TE per-module precision entry, spelled as its value (the module needs TE to import)"),
)


def grad_accum_fusion_available() -> bool:
    """Whether megatron-core found apex's fused wgrad-accumulation kernel (``PRIVATE_NAMES``)."""
    from megatron.core.tensor_parallel import layers

    return layers._grad_accum_fusion_available
