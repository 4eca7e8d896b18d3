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


def _rank_sum(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    return float(t.item())


def test_a_launch_whose_port_was_taken_is_started_again_on_another(monkeypatch):
    """The port is picked free and released before rank 0 binds it; when another process holds it by then,
    the launch starts again on a new port instead of failing the test."""
    import socket

    import tests._dist as d

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    ports = iter([held.getsockname()[1]])
    real = d._free_port
    monkeypatch.setattr(d, "_free_port", lambda: next(ports, None) or real())
    try:
        assert d.run_distributed(_rank_sum, 2, timeout=60) == [3.0, 3.0]
    finally:
        held.close()
