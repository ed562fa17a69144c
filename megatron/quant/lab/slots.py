"""Running several sweep runs at once, each in its own slot of the machine (``--parallel N``).

A slot is the environment its runs start with: on a machine with GPUs, its share of the visible
devices (``CUDA_VISIBLE_DEVICES``), which ``runs_per_gpu`` runs may share (small models leave a GPU
idle between one process's kernel launches, which another process's kernels fill); on a CPU-only
machine, its share of the cores (``OMP_NUM_THREADS``, which torch takes as its thread count). A run
holds its slot until it ends; the next waiting run takes it.
"""
from __future__ import annotations

import queue
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Mapping, Sequence, TypeVar

T = TypeVar("T")


class SlotError(ValueError):
    """A parallelism the machine cannot give; the message names what it has."""


def visible_gpus(environ: Mapping[str, str], device_count: int) -> list[str]:
    """The GPU ids runs may use: ``CUDA_VISIBLE_DEVICES`` when set, else ``0 .. device_count - 1``."""
    given = environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [device.strip() for device in given.split(",") if device.strip()]
    return [str(i) for i in range(device_count)]


def slot_environments(parallel: int, gpus: Sequence[str], cpus: int, gpus_per_run: int = 1,
                      runs_per_gpu: int = 1) -> list[dict[str, str]]:
    """One environment per slot: ``gpus_per_run`` GPUs each, ``runs_per_gpu`` slots on the same GPUs
    (slots ``0 .. runs_per_gpu - 1`` on the first ones), or (no GPUs) ``cpus // parallel`` threads each."""
    if parallel < 1:
        raise SlotError(f"--parallel must be at least 1, got {parallel}")
    if runs_per_gpu < 1:
        raise SlotError(f"--runs-per-gpu must be at least 1, got {runs_per_gpu}")
    if gpus:
        groups = -(-parallel // runs_per_gpu)  # GPU groups the slots fill, runs_per_gpu to a group
        if groups * gpus_per_run > len(gpus):
            sharing = f", {runs_per_gpu} runs per GPU" if runs_per_gpu > 1 else ""
            raise SlotError(f"--parallel {parallel} with {gpus_per_run} GPU(s) per run{sharing} needs "
                            f"{groups * gpus_per_run} GPUs; {len(gpus)} visible ({','.join(gpus)})")
        return [{"CUDA_VISIBLE_DEVICES": ",".join(gpus[i // runs_per_gpu * gpus_per_run:
                                                       (i // runs_per_gpu + 1) * gpus_per_run])}
                for i in range(parallel)]
    if parallel > cpus:
        raise SlotError(f"--parallel {parallel} needs at least one CPU core per run; this node has {cpus}")
    return [{"OMP_NUM_THREADS": str(cpus // parallel)} for _ in range(parallel)]


def run_in_slots(jobs: Sequence[Callable[[dict[str, str]], T]], slots: Sequence[dict[str, str]]) -> list[T]:
    """Call every job with a free slot's environment, ``len(slots)`` at a time; the results in job order.

    A job's exception (or an interrupt) cancels the jobs not started; the running ones end first."""
    free: queue.Queue = queue.Queue()
    for slot in slots:
        free.put(slot)

    def call(job: Callable[[dict[str, str]], T]) -> T:
        slot = free.get()
        try:
            return job(slot)
        finally:
            free.put(slot)

    pool = ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="sweep-slot")
    try:
        return [future.result() for future in [pool.submit(call, job) for job in jobs]]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
