"""Map a function over items in worker processes, with a progress bar on stderr."""
from __future__ import annotations

import gc
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Iterator, Optional, Sequence, TypeVar

from tqdm import tqdm

Item = TypeVar("Item")
Result = TypeVar("Result")


def default_workers() -> int:
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        available = os.cpu_count() or 1
    return max(1, min(8, available))


def _init_worker() -> None:
    # Each worker handles whole tensors; intra-op threads would only fight the other workers.
    import torch
    torch.set_num_threads(1)


def parallel_map(fn: Callable[[Item], Result], items: Sequence[Item], workers: int,
                 description: str, progress: bool = True,
                 chunksize: Optional[int] = None) -> Iterator[Result]:
    """``fn`` over ``items`` in order. ``fn`` must be a module-level function (it is pickled).

    ``chunksize`` None batches many small items per task; use 1 for few slow ones."""
    bar = tqdm(total=len(items), desc=description, unit="item", file=sys.stderr,
               disable=not progress, dynamic_ncols=True, leave=False)
    try:
        if workers <= 1 or len(items) <= 1:
            for item in items:
                yield fn(item)
                bar.update()
            return
        # fork shares the already imported torch/matplotlib: workers start in milliseconds. The parent's
        # objects are frozen while the workers fork (CPython's advice for fork without exec), so a worker's
        # garbage collections never walk them: a collection in a forked worker that walked the parent's
        # objects (in a process that had run torch.compile) crashed.
        forking = "fork" in multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if forking else None)
        if chunksize is None:
            chunksize = max(1, min(16, len(items) // (workers * 8)))
        if forking:
            gc.freeze()
        try:
            with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker) as pool:
                for result in pool.map(fn, items, chunksize=chunksize):
                    yield result
                    bar.update()
        finally:
            if forking:
                gc.unfreeze()
    finally:
        bar.close()
