"""Run a function on N CPU processes joined by a gloo process group (multi-rank tests)."""
from __future__ import annotations

import os
import socket
import traceback
from typing import Any, Callable

import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, fn: Callable, args: tuple, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        results[rank] = ("ok", fn(rank, world_size, *args))
    except BaseException:  # reported to the parent, which fails the test with it
        results[rank] = ("error", traceback.format_exc())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(fn: Callable, world_size: int = 2, *args: Any, timeout: float = 300) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes; return their results.

    ``fn`` must be importable (module level) and return something picklable. A failure on
    any rank raises with that rank's traceback.
    """
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        results = manager.dict()
        port = free_port()
        procs = [ctx.Process(target=_worker, args=(r, world_size, port, fn, args, results))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout)
        for p in procs:
            if p.is_alive():
                p.kill()
                raise TimeoutError(f"distributed test did not finish in {timeout}s")
        out = []
        for rank in range(world_size):
            status, value = results.get(rank, ("error", f"rank {rank} exited with code {procs[rank].exitcode}"))
            if status != "ok":
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            out.append(value)
        return out
