"""megatron-core on CPU, and the one place that sets up parallel state.

megatron-core assumes CUDA in a few places: its RNG tracker forks CUDA generator states,
several modules allocate on ``torch.cuda.current_device()``, the default causal mask is
built with ``device="cuda"``, the checkpoint writer calls ``torch.cuda.synchronize()`` and the
gradient sync ``torch.cuda.current_stream()``. On a machine without CUDA, :func:`enable_cpu_compat` swaps in
CPU equivalents so GPTModel builds, runs forward/backward, and runs tensor parallelism over
gloo. With CUDA present it does nothing.
"""
from __future__ import annotations

import contextlib
import socket

import torch
import torch.distributed as dist

from megatron.quant.settings.environment import read_environment

_CPU_COMPAT_ENABLED = False


def _cpu_current_device() -> torch.device:
    # megatron-core only passes the result as ``device=``; the CPU build would raise instead.
    return torch.device("cpu")


def _cpu_synchronize(device=None) -> None:
    # dist_checkpointing's writer synchronizes unconditionally; raising there on one rank
    # while the others wait in a collective is the checkpoint hang seen on CPU.
    return None


class _CpuStream:
    """The stream CPU work runs on: everything is already ordered, so it waits on nothing."""

    def wait_event(self, event) -> None:
        return None

    def wait_stream(self, stream) -> None:
        return None


def _cpu_current_stream(device=None) -> _CpuStream:
    # megatron-core 0.19's gradient sync waits on CUDA-graph events of the current stream
    # without asking whether there is a GPU.
    return _CpuStream()


def _make_cpu_rng_tracker():
    from megatron.core.tensor_parallel import random as mrandom

    class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):
        """megatron-core's named RNG states (data-/model-parallel), kept as CPU generator states."""

        def add(self, name: str, seed: int) -> None:
            self._is_initialized = True
            if seed in self.seeds_:
                raise ValueError(f"RNG seed {seed} is already tracked")
            if name in self.states_:
                raise ValueError(f"RNG state {name!r} is already tracked")
            self.seeds_.add(seed)
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name: str = mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise KeyError(f"RNG state {name!r} is not tracked; known: {sorted(self.states_)}")
            outer = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer)

    return CpuRNGStatesTracker


def _no_cuda_rng_state(*args, **kwargs) -> torch.Tensor:
    # Activation recompute (CheckpointFunction) saves and restores the CUDA generator next to the
    # CPU one, which it keeps itself: without CUDA there is no state to keep.
    return torch.empty(0, dtype=torch.uint8)


def _cpu_causal_mask(sq: int) -> torch.Tensor:
    return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)


def _cpu_sliding_window_mask(sq: int, skv: int, window_size) -> torch.Tensor:
    m = torch.ones(sq, skv, dtype=torch.bool)
    upper = torch.triu(m, diagonal=skv - sq - window_size[0])
    return ~torch.tril(upper, diagonal=skv - sq + window_size[1])


def enable_cpu_compat() -> bool:
    """Patch megatron-core's CUDA assumptions when CUDA is absent. Idempotent.

    Returns True when the CPU layer is active.
    """
    global _CPU_COMPAT_ENABLED
    if torch.cuda.is_available():
        return False
    if _CPU_COMPAT_ENABLED:
        return True
    from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer import utils as tutils

    torch.cuda.current_device = _cpu_current_device
    torch.cuda.synchronize = _cpu_synchronize
    torch.cuda.current_stream = _cpu_current_stream
    tracker_cls = _make_cpu_rng_tracker()
    mrandom._CUDA_RNG_STATE_TRACKER = tracker_cls()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    mrandom._get_cuda_rng_state = _no_cuda_rng_state
    mrandom._set_cuda_rng_state = lambda *args, **kwargs: None
    # fused_softmax imported the mask builders by name, so patch both modules.
    for module in (tutils, fused_softmax):
        module.get_default_causal_mask = _cpu_causal_mask
        module.get_sliding_window_causal_mask = _cpu_sliding_window_mask
    _CPU_COMPAT_ENABLED = True
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_parallel(
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    seed: int = 1234,
    expert_model_parallel_size: int = 1,
) -> None:
    """Initialise torch.distributed, megatron-core parallel state and its RNG tracker.

    Uses the launcher's env (RANK, WORLD_SIZE, MASTER_ADDR, ...) when present, otherwise a
    world of one process. Backend: nccl with CUDA, gloo without (after enabling the CPU layer).
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    for name, value in (("tensor_model_parallel_size", tensor_model_parallel_size),
                        ("pipeline_model_parallel_size", pipeline_model_parallel_size),
                        ("expert_model_parallel_size", expert_model_parallel_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    cpu = enable_cpu_compat()
    if not dist.is_initialized():
        environment = read_environment()
        if not cpu:
            torch.cuda.set_device(environment.local_rank)
        backend = "gloo" if cpu else "nccl"
        if environment.rank is not None:
            dist.init_process_group(backend)
        else:
            # A world of one; the environment is left alone so child processes start clean.
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    world = dist.get_world_size()
    model_parallel = tensor_model_parallel_size * pipeline_model_parallel_size
    if world % model_parallel:
        raise ValueError(
            f"world size {world} is not divisible by tensor_model_parallel_size "
            f"({tensor_model_parallel_size}) x pipeline_model_parallel_size ({pipeline_model_parallel_size})"
        )
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tensor_model_parallel_size,
        pipeline_model_parallel_size=pipeline_model_parallel_size,
        expert_model_parallel_size=expert_model_parallel_size,
        # Megatron-LM's default: the distributed optimizer and checkpointing need gloo groups on GPU too.
        create_gloo_process_groups=True,
    )
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)


def destroy_parallel() -> None:
    """Tear down megatron-core parallel state and the default process group."""
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
