"""The report's worker processes (``analysis.parallel.parallel_map``)."""
import gc
import multiprocessing

import pytest

from megatron.quant.analysis.parallel import parallel_map


def _frozen_in_worker(item: int) -> tuple[int, int]:
    return item, gc.get_freeze_count()


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork on this platform")
def test_forked_workers_never_collect_the_parents_objects_and_the_parent_unfreezes():
    """The parent's objects are frozen while the workers fork, so a worker's garbage collection never walks
    them (one that did, after torch.compile had run in the parent, crashed in CI); the parent unfreezes after."""
    keep = [object() for _ in range(1000)]  # objects of the parent's that a worker's collection would walk
    results = list(parallel_map(_frozen_in_worker, list(range(4)), workers=2, description="test", progress=False,
                                chunksize=1))
    assert [item for item, _ in results] == [0, 1, 2, 3]
    assert all(frozen >= len(keep) for _, frozen in results)
    assert gc.get_freeze_count() == 0
