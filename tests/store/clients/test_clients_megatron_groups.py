"""Megatron-core's process groups through :class:`PGLifecycle`, on 2 Gloo ranks (TP=1, EP=2, DP=2; MoE
GPTModel, distributed optimizer) through the test-only device shim of tests/_megatron.py.

The families ``initialize_model_parallel`` made are adopted (``adopt_megatron_groups``) and driven
through pause -> weight sync -> resume three times: PAUSED_LIVE's first pause destroys them
(two-phase enabling), its second keeps them live, then DESTROY_DEFERRED destroys them. The weight
sync and the training steps after every wake run on the group objects Megatron itself holds; the
losses and the whole training state are bitwise those of the run without the lifecycle, every group
works after every wake, no reference to a destroyed group is left anywhere, and the ranks went
through the same states."""
import pytest

from tests._dist import run_distributed
from tests._megatron import needs_megatron

pytestmark = [needs_megatron, pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

CYCLES = ("PAUSED_LIVE", "PAUSED_LIVE", "DESTROY_DEFERRED")


def _groups(ps):
    """Megatron's group objects now, by ``parallel_state`` global (those that exist on this rank)."""
    from refimpl.store.clients.megatron_groups import MEGATRON_GROUP_FAMILIES

    return {attr: getattr(ps, attr) for _, attr in MEGATRON_GROUP_FAMILIES if getattr(ps, attr, None) is not None}


def _sums(groups, device):
    """all_reduce(SUM) of 1 on each group Megatron holds: its size when the group works."""
    import torch
    import torch.distributed as dist

    out = {}
    for attr, pg in groups.items():
        t = torch.ones(1, device=device)
        dist.all_reduce(t, group=pg)
        out[attr] = (int(t.item()), dist.get_world_size(pg))
    return out


def _held_elsewhere(objs, mine, roots):
    """Types of whatever still holds one of ``objs``: what the garbage collector tracks (frames and the
    test's own containers aside), and what is reachable from ``roots`` (untracked dicts and tuples too)."""
    import gc
    import types

    skip = {id(m) for m in mine}
    found = {type(r).__name__ for r in gc.get_referrers(*objs) if id(r) not in skip
             and not isinstance(r, types.FrameType)}
    targets, seen, stack = {id(o) for o in objs}, set(), list(roots)
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, (type, str, bytes, int, float)) or o is None:
            continue
        seen.add(id(o))
        if isinstance(o, types.FunctionType):  # its closure and defaults, not every module's globals
            refs = [*(o.__closure__ or ()), *(o.__defaults__ or ())]
        elif isinstance(o, types.ModuleType) and o not in roots:
            continue
        else:
            refs = gc.get_referents(o)
        for r in refs:
            if id(r) in targets:
                found.add(type(o).__name__)
            else:
                stack.append(r)
    return sorted(found)


def _weight_sync(ps, device):
    """A stand-in for the weight sync: collectives on the data- and expert-parallel groups Megatron holds."""
    import torch
    import torch.distributed as dist

    out = []
    for pg in (ps.get_data_parallel_group(), ps.get_expert_model_parallel_group()):
        t = torch.tensor([dist.get_rank() + 1.0], device=device)
        dist.all_reduce(t, group=pg)
        out.append(t.item())
    return out


def _cycles(rank, ps, model, opt, g, device):
    from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
    from refimpl.torch_runtime import TorchRuntime
    from refimpl.store import OffloadStore, StoreConfig
    from refimpl.store.clients.megatron import attach_megatron
    from refimpl.store.clients.megatron_groups import adopt_megatron_groups
    from tests._megatron import step

    rt = TorchRuntime(device)
    names = adopt_megatron_groups(rt)
    config = LifecycleConfig(policy=PGPolicy.PAUSED_LIVE, cooldown_s=0.05, agree_timeout_s=60, canary_timeout_s=30)
    lc = PGLifecycle(rt, names, config=config)
    client = attach_megatron(OffloadStore(rt, config=StoreConfig(alignment_bytes=16)), model, opt)
    losses, facts = [], []
    for policy in CYCLES:
        before = _groups(ps)
        state = lc.sync.pause(release_memory=client.offload, policy=PGPolicy[policy])
        synced = lc.sync.weight_sync(lambda: _weight_sync(ps, device))
        lc.sync.resume()
        client.reload()
        losses.append(step(model, opt, g, device).numpy().tobytes())
        after = _groups(ps)
        replaced = [a for a in before if after[a] is not before[a]]
        olds = [before[a] for a in replaced]
        # the objects Megatron holds are the runtime's live groups (on Gloo a destroyed group would still work)
        current = {pg.group_name for pg in after.values()} == {rt.torch_group_name(n) for n in names if rt.is_member(n)}
        facts.append(dict(state=state.name, synced=synced, sums=_sums(after, device), replaced=replaced,
                          current=current, held=_held_elsewhere(olds, [before, olds], [ps, model, opt]) if olds else []))
        del before, olds
    history = [(a.name, e.name, b.name) for _, a, e, b in lc.history]
    return names, losses, facts, history, lc.state.name


def _train(rank, with_lifecycle, device):
    import torch

    from tests._megatron import build, state_bytes, step
    from megatron.core import parallel_state as ps

    model, opt = build(True, experts=4)
    g = torch.Generator().manual_seed(rank)
    losses = [step(model, opt, g, device).numpy().tobytes()]
    if not with_lifecycle:
        losses += [step(model, opt, g, device).numpy().tobytes() for _ in CYCLES]
        return losses, state_bytes(model, opt), None
    names, more, facts, history, end = _cycles(rank, ps, model, opt, g, device)
    return losses + more, state_bytes(model, opt), dict(names=names, facts=facts, history=history, end=end)


def lifecycle_rank(rank, world_size, ep, device):
    """Training with and without Megatron's groups through the lifecycle, on this rank: what to check."""
    from tests._megatron import init_parallel

    ps = init_parallel(ep=ep)
    ref_losses, ref_state, _ = _train(rank, False, device)
    losses, state, report = _train(rank, True, device)
    ps.destroy_model_parallel()
    diffs = [k for k in ref_state if ref_state[k] != state.get(k)]
    return dict(losses=ref_losses == losses, n=len(ref_state), diffs=diffs[:5], **report)


def _rank(rank, world_size):
    from tests._megatron import cpu_shim

    with cpu_shim():
        return lifecycle_rank(rank, world_size, 2, "cpu")


def check_lifecycle(results):
    """Every rank: bitwise equal to training without the lifecycle, groups rebuilt in place, in step."""
    sync = float(sum(range(1, len(results) + 1)))
    for rank, r in enumerate(results):
        assert r["names"] == results[0]["names"], "every rank adopts the same groups"
        assert r["n"] > 20 and r["losses"], f"rank {rank}: losses differ from the run without the lifecycle"
        assert r["diffs"] == [], f"rank {rank}: {r['diffs']} differ from the run without the lifecycle"
        assert [f["state"] for f in r["facts"]] == ["DESTROYED", "PAUSED_LIVE", "DESTROYED"]
        assert r["end"] == "ACTIVE" and r["history"] == results[0]["history"]
        for cycle, f in zip(CYCLES, r["facts"]):
            assert f["synced"] == [sync, sync], f"{cycle}: the weight sync ran on Megatron's dp and ep groups"
            assert all(got == size for got, size in f["sums"].values()), f"{cycle}: {f['sums']}"
            assert f["current"], f"{cycle}: Megatron holds group objects that are not the runtime's live groups"
            assert f["held"] == [], f"{cycle}: a destroyed group is still held by {f['held']}"
        destroyed, live = r["facts"][0], r["facts"][1]
        assert "_DATA_PARALLEL_GROUP" in destroyed["replaced"] and "_EXPERT_MODEL_PARALLEL_GROUP" in destroyed["replaced"]
        assert live["replaced"] == [], "PAUSED_LIVE keeps Megatron's group objects"


def test_megatron_groups_through_the_lifecycle_train_bitwise():
    results = run_distributed(_rank, 2, timeout=400)
    check_lifecycle(results)
    for fam in ("megatron.tp0", "megatron.tp1", "megatron.dp", "megatron.ep", "megatron.edp0", "megatron.edp1"):
        assert fam in results[0]["names"], (fam, results[0]["names"])
