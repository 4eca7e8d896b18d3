"""FSDP2's all-gathers filled from the rollout's copy (bench/rl/rollout_gather.py), on real Gloo ranks.

The fill must give FSDP2 exactly the bytes its own all-gather gives (uneven shards, a rank with an empty chunk,
one- and two-dimensional params), come from the rollout's copy and not from a collective, and refuse a copy that
cannot stand in for the all-gather before it installs anything.
"""
from __future__ import annotations

import pytest
import torch

from tests._dist import run_distributed

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _model(world):
    """Three FSDP2 units and a root: rows that divide by the ranks and rows that do not (7 over 2 or 3; a bias of 2
    over 3 leaves a rank an empty chunk)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)  # 6 rows divide by 2 and 3 (one strided copy); 7 and 2 do not (chunk by chunk)
    m = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 6), torch.nn.ReLU(),
                            torch.nn.Linear(6, 2), torch.nn.LayerNorm(2))
    full = {n: p.detach().clone() for n, p in m.named_parameters()}
    mesh = init_device_mesh("cpu", (world,))
    for i in (0, 2, 4):
        fully_shard(m[i], mesh=mesh)
    fully_shard(m, mesh=mesh)  # the root holds the LayerNorm's params
    return m, full


def _bits(t):
    return t.detach().contiguous().view(torch.int32).clone()


def _fill_equals_all_gather(rank, world):
    from bench.rl.rollout_gather import ForwardFromRollout

    m, full = _model(world)
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    ref = m(x)
    ref.sum().backward()  # the backward's re-gathers too
    ref_grads = {n: _bits(p.grad.full_tensor()) for n, p in m.named_parameters()}
    m.zero_grad(set_to_none=True)
    served = ForwardFromRollout(m, full)
    served.arm()
    y = m(x)
    y.sum().backward()
    counts = served.disarm()
    same_out = torch.equal(_bits(ref), _bits(y))
    same_grads = all(torch.equal(ref_grads[n], _bits(p.grad.full_tensor())) for n, p in m.named_parameters())
    # the fill is the source: a changed rollout copy changes the armed forward, and disarmed FSDP2 gathers again
    full["0.weight"].add_(1.0)
    served.arm()
    changed = not torch.equal(_bits(ref), _bits(m(x)))
    served.disarm()
    back = torch.equal(_bits(ref), _bits(m(x)))
    return same_out, same_grads, counts, changed, back


@pytest.mark.parametrize("world", [2, 3])
def test_fill_gives_the_bytes_of_fsdp2s_all_gather(world):
    """Armed, the forward and the backward's re-gathers give the same output and gradients, bit for bit, as FSDP2's
    own all-gathers; every unit's gathers were served; the fill reads the rollout's copy; disarmed, FSDP2 gathers."""
    for same_out, same_grads, counts, changed, back in run_distributed(_fill_equals_all_gather, world, timeout=120):
        assert same_out and same_grads
        assert counts["units"] >= 4 and counts["bytes"] > 0  # three units and the root, each gathered at least once
        assert changed and back


def _armed_forward_alone(rank, world):
    import torch.distributed as dist

    from bench.rl.rollout_gather import ForwardFromRollout

    m, full = _model(world)
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    ref = m(x).detach()
    m.reshard()
    served = ForwardFromRollout(m, full)
    served.arm()
    out = None
    if rank == 0:  # only rank 0 runs the forward: a collective in it would meet rank 1's barrier and fail or hang
        with torch.no_grad():
            out = torch.equal(_bits(m(x)), _bits(ref))
    dist.barrier()
    return out, served.disarm()["units"]


def test_armed_forward_runs_no_collective():
    """One rank runs an armed forward while its peer waits in a barrier: it completes, right, with nothing from
    the peer."""
    (ok, units), (_, none) = run_distributed(_armed_forward_alone, 2, timeout=60)
    assert ok is True and units >= 4 and none == 0


def _refusals(rank, world):
    from bench.rl.rollout_gather import ForwardFromRollout, RolloutGatherError

    m, full = _model(world)
    m(torch.randn(2, 5))  # FSDP2's lazy init (its params' dtypes)
    out = {}
    for case, bad in (("dtype", {**full, "2.weight": full["2.weight"].to(torch.bfloat16)}),
                      ("shape", {**full, "0.bias": full["0.bias"][:3].clone()}),
                      ("missing", {k: v for k, v in full.items() if k != "5.weight"})):
        try:
            ForwardFromRollout(m, bad)
            out[case] = None
        except RolloutGatherError as e:
            out[case] = str(e)
    return out


def test_a_copy_that_cannot_stand_in_is_refused():
    """The wrong dtype, the wrong shape or a parameter missing from the rollout's copy: refused, naming it."""
    for out in run_distributed(_refusals, 2, timeout=60):
        assert "2.weight" in out["dtype"] and "bfloat16" in out["dtype"] and "float32" in out["dtype"]
        assert "(3,)" in out["shape"] and "(7,)" in out["shape"]
        assert "5.weight" in out["missing"]
