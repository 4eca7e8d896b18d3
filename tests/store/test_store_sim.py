"""The same store code on the simulator (SimRuntime): real payloads come back bit-exact, and the
simulator's ledgers see device memory returned and exactly the layout's bytes pinned."""
import pytest
import torch

import sim
from refimpl.store import Category, OffloadStore, StoreConfig

SMALL = StoreConfig(segment_bytes=64 << 10, pack_below_bytes=2048, staging_bytes=16 << 10)
DIRECT = StoreConfig(segment_bytes=64 << 10, pack_below_bytes=0, staging_bytes=16 << 10)


def _state(rt, n, seed, real):
    g = torch.Generator().manual_seed(seed)
    params, optim = {}, {}
    for i in range(n):
        p = rt.alloc_device(64 + 17 * (i % 13), torch.bfloat16, tag="param")
        m = rt.alloc_device(p.numel(), torch.float32, tag="master")
        if real:
            p.copy_(torch.randn(p.numel(), generator=g).to(torch.bfloat16))
            m.copy_(torch.randn(m.numel(), generator=g))
        params[f"p{i}"], optim[f"m{i}"] = p, m
    return params, optim


@pytest.mark.parametrize("config", [SMALL, DIRECT], ids=["packed", "direct"])
def test_store_on_simulated_ranks_round_trips_real_bytes_and_balances_ledgers(config):
    """Simulated copies land when the transport says so, reading their source then: a storage
    released before its own copy completed would fail here."""
    world = sim.SimWorld(4, payload="real", seed=0)

    async def job(rt):
        params, optim = _state(rt, 150, rt.rank, real=True)
        state_bytes = sum(t.numel() * t.element_size() for t in [*params.values(), *optim.values()])
        store = OffloadStore(rt, config=config)
        store.attach_tensors(Category.PARAMS, params)
        store.attach_tensors(Category.OPTIMIZER, optim, name="master", kind="master_weights")
        facts = []
        for cycle in range(3):
            for t in [*params.values(), *optim.values()]:
                t.add_(1)  # training changes the values between cycles
            want = [t.clone() for t in [*params.values(), *optim.values()]]
            ledger = world.memory.ledger(rt.rank)
            used0 = ledger.device_used
            await store.offload_async()
            freed = used0 - ledger.device_used
            pinned = ledger.host_pinned
            copies = dict(store.stats().copies) | {"early": store.stats().last_early_releases}
            await store.reload_async()
            exact = all(torch.equal(a, b) for a, b in zip([*params.values(), *optim.values()], want))
            facts.append((freed, pinned, copies, exact))
        layout_bytes = sum(lay.nbytes for lay in store.layouts.values())
        spans = [name for name, *_ in rt.spans]
        return state_bytes, layout_bytes, facts, spans

    for state_bytes, layout_bytes, facts, spans in world.run(job):
        assert spans.count("offload") == 3 and spans.count("reload") == 3
        for cycle, (freed, pinned, copies, exact) in enumerate(facts):
            assert exact, f"cycle {cycle}: bytes differ after reload"
            assert freed >= state_bytes, f"cycle {cycle}: the device ledger got {freed} of {state_bytes} bytes back"
            # exact size: the layouts' bytes, i.e. the state plus < alignment_bytes per storage
            assert pinned == layout_bytes < state_bytes + 300 * SMALL.alignment_bytes
        first, later = facts[0][2], facts[1][2]
        path = "packed" if config is SMALL else "direct"
        assert first[path] > 0 and first["flat"] == 0, f"first offload: {first}"
        assert first["early"] == 300, "every scattered storage released as soon as its copy completed"
        assert later["direct"] == later["packed"] == later["early"] == 0 and later["flat"] > 0


def test_store_on_meta_payloads_moves_no_bytes_but_accounts_them():
    world = sim.SimWorld(8, payload="meta", seed=0)

    async def job(rt):
        params, optim = _state(rt, 400, rt.rank, real=False)
        store = OffloadStore(rt, config=SMALL)
        store.attach_tensors(Category.PARAMS, params)
        store.attach_tensors(Category.OPTIMIZER, optim, name="optim")
        free0 = rt.memory_info().free
        t0 = rt.now()
        await store.offload_async()
        t1 = rt.now()
        free1 = rt.memory_info().free
        await store.reload_async()
        t2 = rt.now()
        await store.offload_async()
        t3 = rt.now()
        await store.reload_async()
        return free1 - free0, store.stats().state_bytes, (t1 - t0, t2 - t1, t3 - t2), rt.copy_stats.host_copies

    for freed, state, (cold_off, reload, steady_off), copies in world.run(job):
        assert freed >= state > 0
        assert cold_off > 0 and reload > 0 and steady_off > 0, "simulated time passes for the copies"
        assert copies < 800, "hundreds of tensors leave in a few packed or flat copies"
