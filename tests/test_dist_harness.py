"""The multi-process harness itself: results come back by rank, and a failing rank fails the test."""
import pytest

from tests._dist import DistributedTestError, run_distributed


def _sum_ranks(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.tensor([rank], dtype=torch.int64)
    dist.all_reduce(t)
    return rank, int(t.item())


def _fail_on_one(rank, world_size):
    if rank == 1:
        raise ValueError("boom on rank 1")
    return rank


def test_results_by_rank():
    out = run_distributed(_sum_ranks, 2)
    assert out == [(0, 1), (1, 1)]


def test_failure_is_reported_with_rank():
    with pytest.raises(DistributedTestError, match="rank 1 raised"):
        run_distributed(_fail_on_one, 2, timeout=60)
