"""What differs between the megatron-core releases this package supports (0.16 to 0.19).

Every difference that needs code is handled here, once, by looking at what the installed
megatron-core provides rather than at its version number. Differences the rest of the package
absorbs without a branch, for the record:

- 0.19: ``ParamAndGradBuffer``'s gradient sync waits on CUDA-graph events through
  ``torch.cuda.current_stream()`` with no GPU check; ``cpu.py`` gives CPU runs a stream that
  waits on nothing.
- 0.19: ``dist_checkpointing`` stores the non-tensor state inside the PyTorch DCP files instead
  of a separate ``common.pt``; ``training/checkpoint_files.py`` checks the files the
  checkpoint's own metadata names.
- 0.19: constructing ``GPTModel`` logs that it is deprecated in favour of ``HybridModel``, which
  0.16 does not have; the Llama model stays a GPTModel (docs/training.md#megatron-core-versions).
"""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any


def replace_mlp_submodules(mlp: Any, **linears: type) -> Any:
    """``mlp`` (the ``mlp`` entry of a layer spec) with the named linear submodules replaced.

    0.19 changed the local spec's MLP from ``ModuleSpec(module=MLP, submodules=...)`` to
    ``functools.partial(MLP.as_mlp_submodule, submodules=...)``; both carry an ``MLPSubmodules``.
    """
    if isinstance(mlp, functools.partial):
        return functools.partial(mlp.func, *mlp.args,
                                 **{**mlp.keywords, "submodules": replace(mlp.keywords["submodules"], **linears)})
    return replace(mlp, submodules=replace(mlp.submodules, **linears))


# 0.19 (Megatron-LM PR 5160): dist_checkpointing.save stores the common (non-tensor) state as the ShardedObject
# "common_state" inside the PyTorch DCP files, listed in their index under this key, and its loader
# reads that layout or the older one; earlier releases write and read only a separate torch file.
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
