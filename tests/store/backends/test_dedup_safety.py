"""Issue 14, the local_dedup rows: replicas that differ are caught by default; a reload some rank does not
join fails with the state still in host memory and a reload on every rank recovers it. Real Gloo processes."""
import os

from tests._dist import run_distributed


def _dedup_store(rank, *, verify=None, timeout_s=600.0):
    import torch

    from refimpl.torch_runtime import TorchRuntime
    from refimpl.store import OffloadStore, StoreConfig
    from refimpl.store.backends.dedup_config import DedupConfig
    from refimpl.store.backends.replica import ReplicaGroup, ReplicaPolicy

    rt = TorchRuntime()
    w = torch.arange(40, dtype=torch.float32) + (0.5 if rank == 1 else 0.0)  # declared replicated, but differs
    v = torch.ones(24) * 3
    policy = ReplicaPolicy(overrides={"m.*": ReplicaGroup((0, 1))})
    store = OffloadStore(rt, backend="local_dedup", config=StoreConfig(alignment_bytes=16),
                         dedup=DedupConfig(policy=policy, verify_replicas=verify, timeout_s=timeout_s))
    store.attach_tensors("params", {"w": w, "v": v}, name="m")
    return store, w, v


def _differing_replicas(rank, world_size, verify):
    import torch

    from refimpl.store import is_parked
    from refimpl.store.backends.dedup_config import ReplicaMismatchError

    os.environ.pop("TIMESHARE_DEBUG", None)
    store, w, v = _dedup_store(rank, verify=verify)
    out = {}
    try:
        store.offload()
        out["error"] = None
    except ReplicaMismatchError as e:
        out["error"] = str(e)
    out["on_device"] = not is_parked(w) and bool(w[5] == 5 + (0.5 if rank == 1 else 0.0))
    if out["error"] is None:
        store.reload()
        out["w_after"] = w.tolist()
        return out
    with torch.no_grad():
        w.sub_(0.5 if rank == 1 else 0.0)  # fixed: the same store goes through, and checks once
    store.offload()
    store.reload()
    checks = store.backend.verified_offloads
    store.offload()  # the layout is unchanged since its check: not checked again
    store.reload()
    out["checks"] = (checks, store.backend.verified_offloads)
    out["w_after"] = w.tolist()
    return out


def test_differing_replicas_are_refused_by_default_on_every_rank_and_nothing_moves():
    res = run_distributed(_differing_replicas, 2, args=(None,), timeout=120)
    for rank, r in enumerate(res):
        assert r["error"] is not None and "m.w" in r["error"] and "Nothing was released" in r["error"], (rank, r)
        assert r["on_device"], f"rank {rank}: a refused offload leaves the state where it was"
        assert r["w_after"] == [float(i) for i in range(40)]
        assert r["checks"][0] >= 1 and r["checks"][1] == r["checks"][0], ("checked when the layout is new, not at every offload", r["checks"])


def test_verify_replicas_false_turns_the_check_off_explicitly():
    res = run_distributed(_differing_replicas, 2, args=(False,), timeout=120)
    assert [r["error"] for r in res] == [None, None]
    assert res[0]["w_after"] == res[1]["w_after"], "unchecked, the replicas were made equal (the opt-out's risk)"


def _reload_not_joined(rank, world_size):
    import time

    import torch

    from refimpl.runtime.base import CollectiveFailedError, CollectiveTimeoutError
    from refimpl.store import is_parked

    store, w, v = _dedup_store(rank, timeout_s=3.0)
    with torch.no_grad():
        w.sub_(0.5 if rank == 1 else 0.0)
    want_w, want_v = w.clone(), v.clone()
    store.offload()
    out = {}
    if rank == 0:  # rank 1 does not join this reload
        t0 = time.monotonic()
        try:
            store.reload()
            out["alone"] = "no error"
        except (CollectiveTimeoutError, CollectiveFailedError) as e:
            out["alone"] = (type(e).__name__, isinstance(e, CollectiveTimeoutError), getattr(e, "ranks", None))
        out["alone_s"] = time.monotonic() - t0
        out["still_offloaded"] = store.is_offloaded("params") and is_parked(w) and is_parked(v)
    else:
        time.sleep(5.0)
    store.reload()  # every rank now
    out["back"] = torch.equal(w, want_w) and torch.equal(v, want_v) and not store.is_offloaded("params")
    store.offload()
    store.reload()
    out["cycle_after"] = torch.equal(w, want_w) and torch.equal(v, want_v)
    return out


def test_a_reload_one_rank_does_not_join_fails_keeps_the_state_and_a_reload_on_all_ranks_recovers():
    res = run_distributed(_reload_not_joined, 2, timeout=120)
    assert res[0]["alone"] == ("PeerUnavailableError", True, (1,)) and res[0]["alone_s"] < 30, res[0]
    assert res[0]["still_offloaded"], "the failed reload left the state in host memory, parked"
    assert all(r["back"] for r in res), res
    assert all(r["cycle_after"] for r in res), res
