"""For every schedule Hypothesis draws: correct protocols finish with the same results,
wrong ones are always caught.

The :class:`sim.HypothesisChooser` decides, at every instant where several
events are ready at once, which runs first; Hypothesis explores those choices
and shrinks a failure toward FIFO order. Protocols are drawn too: a random
sequence of collectives over random subgroups that every rank issues in the
same order, with per-rank delays that make ranks arrive at different times.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import sim
from refimpl.runtime import CopyKind, GroupSpec, ReduceOp
from tests._hypothesis import BUDGET

SETTINGS = BUDGET.settings(40)

OPS = ("all_reduce_sum", "all_reduce_max", "all_gather", "broadcast", "barrier", "copy")


@st.composite
def protocols(draw):
    """A world size, its groups, and a list of (group, op, per-rank delay) steps."""
    n = draw(st.integers(2, max(6, BUDGET.max_ranks)))
    groups = {"world": tuple(range(n))}
    for i in range(draw(st.integers(0, 3))):
        members = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
        groups[f"g{i}"] = tuple(sorted(members))
    steps = draw(st.lists(
        st.tuples(
            st.sampled_from(sorted(groups)),
            st.sampled_from(OPS),
            st.lists(st.sampled_from([0.0, 0.0, 0.001, 0.002]), min_size=n, max_size=n),
        ),
        min_size=1, max_size=BUDGET.max_steps,
    ))
    return n, groups, steps


def _skippable(groups, steps):
    """Indices of the steps a rank could skip and leave a peer waiting: collectives of groups of two or more."""
    return [i for i, (g, op, _) in enumerate(steps) if op != "copy" and len(groups[g]) > 1]


@st.composite
def protocols_with_a_skippable_collective(draw):
    """:func:`protocols` with at least one collective on a group of two or more ranks (added when missing)."""
    n, groups, steps = draw(protocols())
    if not _skippable(groups, steps):
        op = draw(st.sampled_from([o for o in OPS if o != "copy"]))
        steps = [*steps, ("world", op, [0.0] * n)]
    return n, groups, steps


def make_protocol(groups, steps):
    """A correct protocol: every member issues the same collectives in the same order."""

    async def protocol(rt):
        for name, ranks in groups.items():
            if name != "world":
                await rt.new_group(GroupSpec(name, ranks, backend="gloo" if len(ranks) % 2 else "nccl"))
        x = rt.alloc_device(3, torch.float64, tag="x")
        x.copy_(torch.tensor([rt.rank + 1.0, -rt.rank, 0.5]))
        log = []
        for name, op, delays in steps:
            await rt.sleep(delays[rt.rank])
            if rt.rank not in groups[name]:
                continue
            if op == "all_reduce_sum":
                await rt.all_reduce(x, ReduceOp.SUM, group=name)
            elif op == "all_reduce_max":
                await rt.all_reduce(x, ReduceOp.MAX, group=name)
            elif op == "all_gather":
                out = torch.empty(3 * len(groups[name]), dtype=torch.float64)
                await rt.all_gather_into_tensor(out, x, group=name)
                x.copy_(out.view(-1, 3).sum(0))
            elif op == "broadcast":
                await rt.broadcast(x, src=groups[name][-1], group=name)
            elif op == "barrier":
                await rt.barrier(group=name)
            else:
                h = rt.alloc_host(3, torch.float64)
                await rt.copy_async(h, x, CopyKind.D2H)
                rt.release(x)
                x = rt.alloc_device(3, torch.float64)
                await rt.copy_async(x, h, CopyKind.H2D)
            log.append(x.tolist())
        return log

    return protocol


@SETTINGS
@given(protocols(), st.data())
def test_correct_protocols_never_deadlock_and_results_do_not_depend_on_the_schedule(proto, data):
    n, groups, steps = proto
    reference = sim.run_ranks(n, make_protocol(groups, steps))
    world = sim.SimWorld(n, chooser=sim.HypothesisChooser(data, max_choices=BUDGET.chooser_depth))
    assert world.run(make_protocol(groups, steps)) == reference
    # every rank's device memory is its communicators plus the one live 3 x float64 buffer
    for rt in world.runtimes:
        comm = sum(rt.comm_memory(g).suspendable + rt.comm_memory(g).persistent
                   for g in rt.group_names() if rt.is_member(g))
        assert rt.memory_info().used - comm == 24


@SETTINGS
@given(protocols_with_a_skippable_collective(), st.data(), st.integers(0, 63))
def test_a_rank_that_skips_a_collective_is_always_caught(proto, data, victim):
    n, groups, steps = proto
    skip = data.draw(st.sampled_from(_skippable(groups, steps)), label="skipped step")
    group = steps[skip][0]
    victim = groups[group][victim % len(groups[group])]
    correct = make_protocol(groups, steps)
    skipping = make_protocol(groups, steps[:skip] + steps[skip + 1:])

    async def protocol(rt):
        return await (skipping if rt.rank == victim else correct)(rt)

    with pytest.raises((sim.DeadlockError, sim.CollectiveMismatchError)) as info:
        sim.SimWorld(n, chooser=sim.HypothesisChooser(data, max_choices=BUDGET.chooser_depth)).run(protocol)
    if isinstance(info.value, sim.DeadlockError):
        assert victim in info.value.absent or victim in info.value.blocked


@SETTINGS
@given(st.data(), st.integers(2, max(5, BUDGET.max_ranks)))
def test_opposite_group_order_deadlocks_under_every_schedule(data, n):
    async def protocol(rt):
        await rt.new_group(GroupSpec("a", tuple(range(n))))
        await rt.new_group(GroupSpec("b", tuple(range(n))))
        order = ("a", "b") if rt.rank == 0 else ("b", "a")
        for g in order:
            await rt.barrier(g)

    with pytest.raises(sim.DeadlockError) as info:
        sim.SimWorld(n, chooser=sim.HypothesisChooser(data, max_choices=BUDGET.chooser_depth)).run(protocol)
    assert 0 in info.value.cycle and len(info.value.cycle) == 2
