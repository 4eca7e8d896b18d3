"""Collectives that do not match at the same sequence number are reported, not silently run."""
from __future__ import annotations

import pytest
import torch

import sim
from refimpl.runtime import GroupSpec, ReduceOp


def _run_mismatch(per_rank, n=2):
    async def fn(rt):
        await per_rank(rt)
        return True

    with pytest.raises(sim.CollectiveMismatchError) as info:
        sim.run_ranks(n, fn)
    return info.value


def test_all_gather_against_all_reduce():
    async def per_rank(rt):
        x = torch.ones(4)
        await rt.all_reduce(x)  # seq 0 matches
        if rt.rank == 0:
            await rt.all_gather_into_tensor(torch.empty(8), x)
        else:
            await rt.all_reduce(x)

    err = _run_mismatch(per_rank)
    assert (err.group, err.generation, err.seq) == ("world", 0, 1)
    assert err.ops == {0: "all_gather(torch.float32, 4 elems per rank)", 1: "all_reduce(sum, torch.float32, 4 elems)"}
    assert "group 'world' (generation 0) at seq 1" in str(err)


@pytest.mark.parametrize(
    "kind",
    ["numel", "dtype", "reduce_op", "broadcast_src"],
)
def test_same_op_with_different_arguments(kind):
    async def per_rank(rt):
        if kind == "numel":
            await rt.all_reduce(torch.ones(4 + rt.rank))
        elif kind == "dtype":
            await rt.all_reduce(torch.ones(4, dtype=torch.float32 if rt.rank == 0 else torch.float64))
        elif kind == "reduce_op":
            await rt.all_reduce(torch.ones(4), ReduceOp.SUM if rt.rank == 0 else ReduceOp.MAX)
        else:
            await rt.broadcast(torch.ones(4), src=rt.rank)

    err = _run_mismatch(per_rank)
    assert err.seq == 0 and set(err.ops) == {0, 1}
    assert err.ops[0] != err.ops[1]


def test_mismatch_on_a_subgroup_names_its_generation_and_members():
    async def per_rank(rt):
        await rt.new_group(GroupSpec("dp", (1, 2)))
        await rt.destroy_group("dp")
        await rt.recreate_group("dp")
        if rt.rank == 1:
            await rt.barrier("dp")
        elif rt.rank == 2:
            await rt.all_reduce(torch.ones(1), group="dp")

    err = _run_mismatch(per_rank, n=3)
    assert (err.group, err.generation, err.seq) == ("dp", 1, 0)
    assert set(err.ops) == {1, 2}


def test_group_created_with_different_arguments():
    async def per_rank(rt):
        await rt.new_group(GroupSpec("tp", (0, 1), backend="nccl" if rt.rank == 0 else "gloo"))

    err = _run_mismatch(per_rank)
    assert err.seq == -1 and "backend=nccl" in err.ops[0] and "backend=gloo" in err.ops[1]


def test_gather_with_the_wrong_output_size_is_refused_on_the_caller():
    async def fn(rt):
        with pytest.raises(ValueError, match="needs an output of 2 x 4"):
            await rt.all_gather_into_tensor(torch.empty(7), torch.ones(4))
        return True

    assert sim.run_ranks(2, fn) == [True, True]
