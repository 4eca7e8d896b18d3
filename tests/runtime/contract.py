"""The runtime contract: what every :class:`Runtime` must do, written only against the seam.

Each ``check_*`` is an ``async def`` that every rank runs with its own runtime.
It asserts what protocol code relies on (bytes survive copies bit for bit,
collectives give the right values, groups can be rebuilt, the clock never goes
back, release returns memory) and returns a small picklable observation the
driver compares across ranks. Two drivers run the same checks:
``test_contract_torch.py`` (TorchRuntime on real Gloo processes) and
``test_contract_sim.py`` (SimRuntime ranks in the simulator).

Tensor values are moved on and off the device only with ``copy_async``, so a
runtime whose device tensors are not directly readable still passes.
"""
from __future__ import annotations

from typing import Any

import torch

from refimpl.runtime.base import WORLD, CopyKind, GroupError, GroupSpec, ReduceOp, Runtime

#: dtypes of the copy round trip (bf16 and fp16 as training state uses them, ints for exact bytes)
COPY_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.uint8)
#: odd sizes, so no power-of-two alignment is assumed anywhere
COPY_SIZES = (1, 7, 1023, 4099)

SUBGROUP = "contract.sub"


# --------------------------------------------------------------------------- moving values


async def upload(rt: Runtime, values: torch.Tensor) -> torch.Tensor:
    """A new device buffer holding ``values`` (via a pinned host buffer and an H2D copy)."""
    values = values.reshape(-1)
    staging = rt.alloc_host(values.numel(), values.dtype, pinned=True, tag="contract.staging")
    staging.copy_(values)
    dev = rt.alloc_device(values.numel(), values.dtype, tag="contract.device")
    await rt.copy_async(dev, staging, CopyKind.H2D)
    rt.free_host(staging)
    return dev


async def download(rt: Runtime, dev: torch.Tensor) -> torch.Tensor:
    """A plain CPU copy of a device buffer (via a D2H copy)."""
    host = rt.alloc_host(dev.numel(), dev.dtype, pinned=False, tag="contract.readback")
    await rt.copy_async(host, dev, CopyKind.D2H)
    return host.clone()


def _random_bytes(numel: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """``numel`` elements of ``dtype`` with random bit patterns (NaNs and infs included)."""
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen).view(dtype)


def _bits(t: torch.Tensor) -> bytes:
    # clone first: exporting a runtime-owned buffer to numpy would pin its storage's size
    return t.clone().view(torch.uint8).numpy().tobytes()


# --------------------------------------------------------------------------- copies and memory


async def check_copy_round_trip(rt: Runtime) -> dict[str, Any]:
    """device -> host -> device -> device -> host returns the same bits, for every dtype and odd size."""
    cases = 0
    total = 0
    host_copies_before = rt.copy_stats.host_copies
    for i, dtype in enumerate(COPY_DTYPES):
        for j, n in enumerate(COPY_SIZES):
            original = _random_bytes(n, dtype, seed=1000 * rt.rank + 10 * i + j)
            dev = await upload(rt, original)
            pinned = rt.alloc_host(n, dtype, pinned=True, tag="contract.offload")
            assert pinned.numel() == n and pinned.dtype == dtype and pinned.device.type == "cpu"
            await rt.copy_async(pinned, dev, CopyKind.D2H)
            assert _bits(pinned) == _bits(original), f"D2H changed bytes ({dtype}, n={n})"
            back = rt.alloc_device(n, dtype, tag="contract.reload")
            await rt.copy_async(back, pinned, CopyKind.H2D)
            twin = rt.alloc_device(n, dtype, tag="contract.twin")
            await rt.copy_async(twin, back, CopyKind.D2D)
            seen = await download(rt, twin)
            assert _bits(seen) == _bits(original), f"round trip changed bytes ({dtype}, n={n})"
            rt.free_host(pinned)
            for t in (dev, back, twin):
                rt.release(t)
            cases += 1
            total += n * original.element_size()
    # each case: upload H2D, D2H, H2D, download D2H (the D2D is not a host copy)
    assert rt.copy_stats.host_copies - host_copies_before == 4 * cases, "copy_stats missed host copies"
    return {"cases": cases, "bytes": total}


async def check_copy_rejects_mismatch(rt: Runtime) -> bool:
    """copy_async refuses a dtype or size mismatch instead of casting or truncating."""
    host = rt.alloc_host(8, torch.float32, pinned=False)
    for dev in (rt.alloc_device(8, torch.bfloat16), rt.alloc_device(9, torch.float32)):
        try:
            rt.copy_async(dev, host, CopyKind.H2D)
        except ValueError:
            pass
        else:
            raise AssertionError(f"copy_async accepted {host.dtype}[8] -> {dev.dtype}[{dev.numel()}]")
        rt.release(dev)
    return True


async def check_release(rt: Runtime) -> int:
    """release() leaves the tensor object with a 0-byte storage, seen through every view."""
    dev = rt.alloc_device(4096, torch.bfloat16, tag="contract.release")
    view = dev[100:200]
    assert dev.untyped_storage().nbytes() == 4096 * 2
    rt.release(dev)
    assert dev.untyped_storage().nbytes() == 0, "release left storage attached"
    assert view.untyped_storage().nbytes() == 0, "a view still sees the released storage"
    info = rt.memory_info()
    assert 0 <= info.free <= info.total and info.total > 0, f"implausible memory_info {info}"
    return dev.untyped_storage().nbytes()


async def check_host_alloc(rt: Runtime) -> list[int]:
    """alloc_host gives exactly-sized 1-D CPU buffers, pinned or not, that can be written and freed."""
    sizes = []
    for pinned in (True, False):
        for n in (0, 1, 3, 4097, 65537):
            h = rt.alloc_host(n, torch.bfloat16, pinned=pinned, tag="contract.host")
            assert h.shape == (n,) and h.dtype == torch.bfloat16 and h.device.type == "cpu"
            h.fill_(1.5)
            assert bool((h == 1.5).all())
            rt.free_host(h)
            sizes.append(h.numel())
    return sizes


# --------------------------------------------------------------------------- collectives


def _ranks_values(ranks: tuple[int, ...]) -> dict[str, list[float]]:
    """Expected reductions of the vector ``[r + 1, -(r + 1), (3 r) % 5, 0.5 r]`` over ``ranks``."""
    vecs = [[r + 1.0, -(r + 1.0), float((3 * r) % 5), 0.5 * r] for r in ranks]
    return {
        "SUM": [sum(v[i] for v in vecs) for i in range(4)],
        "MIN": [min(v[i] for v in vecs) for i in range(4)],
        "MAX": [max(v[i] for v in vecs) for i in range(4)],
    }


async def _reduce_all(rt: Runtime, group: str) -> dict[str, list[float]]:
    out = {}
    r = rt.rank
    for op in (ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX):
        t = await upload(rt, torch.tensor([r + 1.0, -(r + 1.0), float((3 * r) % 5), 0.5 * r]))
        await rt.all_reduce(t, op, group)
        out[op.name] = (await download(rt, t)).tolist()
        rt.release(t)
    return out


async def check_collectives(rt: Runtime) -> dict[str, Any]:
    """all_gather_into_tensor, all_reduce (SUM/MIN/MAX), broadcast and barrier on ``"world"``."""
    n, r = rt.world_size, rt.rank
    width = 5
    inp = await upload(rt, torch.arange(width, dtype=torch.int64) + 100 * r)
    out = rt.alloc_device(n * width, torch.int64)
    await rt.all_gather_into_tensor(out, inp)
    gathered = (await download(rt, out)).tolist()
    assert gathered == [100 * q + k for q in range(n) for k in range(width)], f"all_gather gave {gathered}"

    bf = await upload(rt, torch.full((3,), float(r), dtype=torch.bfloat16))
    bf_out = rt.alloc_device(3 * n, torch.bfloat16)
    await rt.all_gather_into_tensor(bf_out, bf)
    assert (await download(rt, bf_out)).tolist() == [float(q) for q in range(n) for _ in range(3)]

    reduced = await _reduce_all(rt, WORLD)
    assert reduced == _ranks_values(tuple(range(n))), f"all_reduce gave {reduced}"

    sources = list(range(n)) if n <= 8 else [0, n // 2, n - 1]
    broadcasts = []
    for src in sources:
        t = await upload(rt, torch.full((4,), float(r * 10 + 1)))
        await rt.broadcast(t, src)
        got = (await download(rt, t)).tolist()
        assert got == [float(src * 10 + 1)] * 4, f"broadcast from {src} gave {got} on rank {r}"
        broadcasts.append(got[0])
        rt.release(t)
    await rt.barrier()
    return {"gathered": gathered, "reduced": reduced, "broadcasts": broadcasts}


# --------------------------------------------------------------------------- groups


def subgroup_ranks(world_size: int) -> tuple[int, ...]:
    """The contract subgroup: the even ranks from 4 ranks up, else all ranks but the last (one rank:
    rank 0), so larger worlds have non-members."""
    if world_size >= 4:
        return tuple(range(0, world_size, 2))
    return tuple(range(max(1, world_size - 1)))


async def _expect_group_error(coro: Any, what: str) -> None:
    try:
        await coro
    except GroupError:
        return
    raise AssertionError(f"{what} did not raise GroupError")


async def check_group_rebuild(rt: Runtime) -> dict[str, Any]:
    """A subgroup works, can be destroyed (gracefully and by abort) and recreated with a growing
    generation, works again each time; collectives on it while destroyed raise GroupError; non-members
    are refused; ``"world"`` cannot be destroyed."""
    ranks = subgroup_ranks(rt.world_size)
    member = rt.rank in ranks
    await rt.new_group(GroupSpec(SUBGROUP, ranks, timeout_s=60.0))
    assert rt.group_live(SUBGROUP) and SUBGROUP in rt.group_names() and WORLD in rt.group_names()
    assert rt.group_spec(SUBGROUP).ranks == ranks and rt.group_spec(SUBGROUP).generation == 0
    await _expect_group_error(rt.new_group(GroupSpec(SUBGROUP, ranks)), "new_group with a live name")
    generations = []
    sums = []
    for abort in (False, True, None):
        if member:
            res = await _reduce_all(rt, SUBGROUP)
            assert res == _ranks_values(ranks), f"subgroup all_reduce gave {res}"
            sums.append(res["SUM"][0])
        else:
            dummy = await upload(rt, torch.zeros(1))
            await _expect_group_error(rt.all_reduce(dummy, group=SUBGROUP), "all_reduce by a non-member")
        await rt.barrier()
        if abort is None:
            break
        await rt.destroy_group(SUBGROUP, abort=abort)
        assert not rt.group_live(SUBGROUP) and SUBGROUP in rt.group_names()
        dummy = await upload(rt, torch.zeros(1))
        await _expect_group_error(rt.all_reduce(dummy, group=SUBGROUP), "all_reduce on a destroyed group")
        await _expect_group_error(rt.barrier(SUBGROUP), "barrier on a destroyed group")
        await rt.barrier()
        spec = await rt.recreate_group(SUBGROUP)
        assert spec.ranks == ranks and spec.timeout_s == 60.0 and spec == rt.group_spec(SUBGROUP)
        generations.append(spec.generation)
    assert generations == [1, 2], f"generations did not grow by one per rebuild: {generations}"
    await _expect_group_error(rt.destroy_group(WORLD), "destroying 'world'")
    await _expect_group_error(rt.all_reduce(await upload(rt, torch.zeros(1)), group="contract.nosuch"),
                              "a collective on an unknown group")
    await rt.destroy_group(SUBGROUP)
    await rt.barrier()
    return {"member": member, "generations": generations, "sums": sums}


# --------------------------------------------------------------------------- time


async def check_clock(rt: Runtime) -> list[float]:
    """now() never goes back across sleeps and collectives, and sleep(s) lets at least s pass."""
    stamps = [rt.now()]
    await rt.sleep(0.01)
    stamps.append(rt.now())
    assert stamps[1] - stamps[0] >= 0.01 - 1e-9, f"sleep(0.01) advanced the clock by {stamps[1] - stamps[0]}"
    t = await upload(rt, torch.ones(16))
    for _ in range(3):
        await rt.all_reduce(t)
        stamps.append(rt.now())
        await rt.barrier()
        stamps.append(rt.now())
        await rt.sleep(0)
        stamps.append(rt.now())
    assert all(b >= a for a, b in zip(stamps, stamps[1:])), f"the clock went back: {stamps}"
    with rt.span("contract.phase"):
        await rt.sleep(0.001)
    name, start, end = rt.spans[-1]
    assert name == "contract.phase" and end - start >= 0.001 - 1e-9
    return [b - a for a, b in zip(stamps, stamps[1:])]


# --------------------------------------------------------------------------- votes


async def check_votes(rt: Runtime) -> dict[str, Any]:
    """A vote every rank joins is complete, with every ballot's code and marks; a vote the last rank joins late is
    settled timed out by a rank that waited, naming it, and the late rank reads that same verdict; arrival marks
    name the members that arrived fewer times."""
    ranks, last = tuple(range(rt.world_size)), rt.world_size - 1
    full = await rt.vote("contract/0", ranks, "contract.vote", int(rt.rank == last), {rt.rank}, timeout_s=30.0)
    assert full is not None and full.complete and full.marks == frozenset(ranks), full
    assert full.failures == {last: 1} and list(full.points) == ["contract.vote"], full
    late = None
    if rt.world_size > 1:
        if rt.rank == last:
            await rt.sleep(0.6)
        late = await rt.vote("contract/1", ranks, "contract.vote", timeout_s=0.2)
        assert late is not None and not late.complete and late.absent == (last,), late
        await rt.barrier()
    rt.mark_arrival(WORLD, "contract.arrive")
    if rt.rank == 0:
        rt.mark_arrival(WORLD, "contract.arrive")
    await rt.barrier()
    absent = rt.absent_ranks(WORLD, "contract.arrive")
    assert absent is None or absent == (ranks[1:] if rt.rank == 0 else ()), absent
    await rt.barrier()
    return {"full": full.encode(), "late": None if late is None else (late.absent, late.decided_by, late.points)}


async def check_vote_spaces(rt: Runtime) -> list[tuple[str, str]]:
    """Vote spaces are named by what their votes are about: two made in different orders on different ranks (two
    stores, two roles of one process) keep one name each on every rank, and their votes do not pair."""
    abouts = ("contract.actor", "contract.critic")
    order = abouts if rt.rank % 2 == 0 else abouts[::-1]
    spaces = {about: rt.vote_space("contract", about) for about in order}
    assert spaces[abouts[0]] != spaces[abouts[1]]
    ranks = tuple(range(rt.world_size))
    for mark, about in enumerate(abouts):
        verdict = await rt.vote(f"{spaces[about]}/0", ranks, "contract.space", 0, {mark}, timeout_s=30.0)
        assert verdict is not None and verdict.agreed and verdict.marks == frozenset({mark}), (about, verdict)
    return sorted(spaces.items())


# --------------------------------------------------------------------------- all together

CHECKS = {
    "copy_round_trip": check_copy_round_trip,
    "copy_rejects_mismatch": check_copy_rejects_mismatch,
    "release": check_release,
    "host_alloc": check_host_alloc,
    "collectives": check_collectives,
    "group_rebuild": check_group_rebuild,
    "clock": check_clock,
    "votes": check_votes,
    "vote_spaces": check_vote_spaces,
}


async def run_all(rt: Runtime) -> dict[str, Any]:
    """Every check in :data:`CHECKS`, in order; returns ``{name: observation}``."""
    return {name: await check(rt) for name, check in CHECKS.items()}


def verify_agreement(name: str, per_rank: list[Any], world_size: int) -> None:
    """Cross-rank assertions on the observations of one check (used by both drivers)."""
    assert len(per_rank) == world_size
    if name == "collectives":
        first = per_rank[0]
        assert all(obs == first for obs in per_rank), "ranks disagree on collective results"
        assert len(first["gathered"]) == 5 * world_size
    elif name == "group_rebuild":
        ranks = subgroup_ranks(world_size)
        for r, obs in enumerate(per_rank):
            assert obs["member"] == (r in ranks)
            assert obs["generations"] == [1, 2]
            assert obs["sums"] == ([float(sum(q + 1 for q in ranks))] * 3 if r in ranks else [])
    elif name == "copy_round_trip":
        assert all(obs["cases"] == len(COPY_DTYPES) * len(COPY_SIZES) for obs in per_rank)
    elif name == "release":
        assert per_rank == [0] * world_size
    elif name == "votes":
        assert all(obs == per_rank[0] for obs in per_rank), f"ranks read different verdicts: {per_rank}"
    elif name == "vote_spaces":
        assert all(obs == per_rank[0] for obs in per_rank), f"ranks named the spaces differently: {per_rank}"
