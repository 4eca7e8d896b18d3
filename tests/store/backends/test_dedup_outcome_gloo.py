"""Every local_dedup offload ends the same way on every rank, and a rank's own state reloads without its peers.

Real Gloo processes (tests/_dist.py), TorchRuntime on CPU, two ranks that replicate ``m.w`` over (0, 1) and
keep ``o.*`` (optimizer state) rank-local:

* pinning fails, or a copy raises, on rank 1 after the replica checks: before, rank 1 rolled back and
  rank 0 completed (a permanent split: rank 0's reload then timed out on every retry). Now both roll back,
  rank 0's error names rank 1, and the next offload and reload work bitwise on both.
* rank 1 dies in the reload's all-gather: rank 0's error names rank 1 within the timeout; a reload of
  rank-local state alone rebuilds no group and names rank 1 too, and ``reload(local_only=True)`` brings
  rank 0's own state back without any peer (before, every reload rebuilt every replica group first and
  failed on a ``new_group`` that waited for the dead rank, naming no one).
"""
from __future__ import annotations

import time

import pytest

from tests._dist import EXITED, run_distributed

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TIMEOUT_S = 3.0


def _make(rank, rt):
    import torch

    from refimpl.store import OffloadStore, StoreConfig
    from refimpl.store.backends.dedup_config import DedupConfig
    from refimpl.store.backends.replica import ReplicaGroup, ReplicaPolicy

    tensors = {"w": torch.arange(40, dtype=torch.float32), "v": torch.full((24,), 3.0)}
    local = {"exp_avg": torch.arange(16, dtype=torch.float32) * (rank + 2)}
    policy = ReplicaPolicy(overrides={"m.*": ReplicaGroup((0, 1))})
    store = OffloadStore(rt, backend="local_dedup", config=StoreConfig(alignment_bytes=16, pin_ahead="off"),
                         dedup=DedupConfig(policy=policy, timeout_s=TIMEOUT_S))
    store.attach_tensors("params", tensors, name="m")
    store.attach_tensors("optimizer", local, name="o")
    return store, {**tensors, **local}


def _failing_runtime(kind):
    """A CPU TorchRuntime whose next pinning (``kind="pinning"``) or D2H copy (``"copy"``) fails once armed."""
    from refimpl.runtime.base import CopyKind, PinningError
    from refimpl.torch_runtime import TorchRuntime

    class Failing(TorchRuntime):
        armed = False

        def alloc_host(self, numel, dtype, *, pinned=True, tag=""):
            if self.armed and kind == "pinning" and pinned:
                self.armed = False
                raise PinningError(f"injected: cannot pin {numel} elements ({tag})")
            return super().alloc_host(numel, dtype, pinned=pinned, tag=tag)

        def copy_async(self, dst, src, kind_):
            if self.armed and kind == "copy" and kind_ is CopyKind.D2H:
                self.armed = False
                raise RuntimeError("injected: a D2H copy failed")
            return super().copy_async(dst, src, kind_)

    return Failing("cpu")


def _fail_on_rank_1(rank, world_size, kind):
    import torch

    from refimpl.store import is_parked

    rt = _failing_runtime(kind)
    store, tensors = _make(rank, rt)
    want = {k: t.clone() for k, t in tensors.items()}
    rt.armed = rank == 1
    out = {}
    try:
        store.offload()
        out["error"] = None
    except Exception as e:  # noqa: BLE001 - which error, is the assertion
        out["error"] = (type(e).__name__, str(e), getattr(e, "ranks", None))
    out["offloaded"] = store.is_offloaded("params") or store.is_offloaded("optimizer")
    out["on_device"] = all(not is_parked(t) and torch.equal(t, want[k]) for k, t in tensors.items())
    store.offload()
    store.reload()
    out["cycle"] = all(torch.equal(t, want[k]) for k, t in tensors.items())
    return out


@pytest.mark.parametrize("kind", ["pinning", "copy"])
def test_a_failure_on_one_rank_after_the_replica_checks_rolls_the_offload_back_on_every_rank(kind):
    r0, r1 = run_distributed(_fail_on_rank_1, 2, args=(kind,), timeout=120)
    assert r1["error"][0] == ("PinningError" if kind == "pinning" else "RuntimeError"), r1
    assert r0["error"] is not None, "rank 0 completed an offload its replica peer rolled back: a split"
    name, msg, ranks = r0["error"]
    assert name == "PeerFailedError" and ranks == (1,) and "rank 1" in msg, r0["error"]
    for r in (r0, r1):
        assert not r["offloaded"] and r["on_device"], r
        assert r["cycle"], "the next offload and reload work, bitwise"


def _die_in_the_gather(rank, world_size):
    import os

    import torch

    from refimpl.store import is_parked
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime("cpu")
    store, tensors = _make(rank, rt)
    want = {k: t.clone() for k, t in tensors.items()}
    store.offload()
    if rank == 1:
        rt.on_point("dedup.reload.all_gather", lambda: os._exit(0))  # dies before its first all-gather
    out = {}
    t0 = time.monotonic()
    try:
        store.reload()
        out["error"] = None
    except Exception as e:  # noqa: BLE001 - which error, is the assertion
        out["error"] = (type(e).__name__, str(e), getattr(e, "ranks", None))
    out["took"] = time.monotonic() - t0
    out["still_offloaded"] = store.is_offloaded("params") and store.is_offloaded("optimizer")
    try:  # rank-local layouts only: no collective, no group rebuilt; but its outcome is agreed, with rank 1 gone
        store.reload("optimizer")
        out["agreed_local"] = None
    except Exception as e:  # noqa: BLE001
        out["agreed_local"] = (type(e).__name__, str(e), getattr(e, "ranks", None))
    t0 = time.monotonic()
    store.reload(local_only=True)  # this rank alone: its own state comes back, the replicated slices stay
    out["local_took"] = time.monotonic() - t0
    out["optimizer_back"] = torch.equal(tensors["exp_avg"], want["exp_avg"]) and not store.is_offloaded("optimizer")
    out["params_left"] = store.is_offloaded("params") and is_parked(tensors["w"]) and is_parked(tensors["v"])
    time.sleep(1.0)  # rank 0 hosts the rendezvous store: stay up until the test has read everything
    return out


def test_a_peer_dying_in_the_reload_all_gather_is_named_and_rank_local_state_still_reloads():
    r0, r1 = run_distributed(_die_in_the_gather, 2, timeout=120, may_exit=(1,))
    assert r1 == EXITED
    name, msg, ranks = r0["error"]
    assert name == "PeerUnavailableError" and ranks == (1,) and "ranks [1]" in msg, r0["error"]
    assert r0["took"] < 3 * TIMEOUT_S, f"the survivor's reload failed after {r0['took']:.1f} s"
    assert r0["still_offloaded"], "a failed reload keeps the state offloaded (host copies kept)"
    name, msg, ranks = r0["agreed_local"]
    assert name == "PeerUnavailableError" and ranks == (1,) and "local_only=True" in msg, r0["agreed_local"]
    assert "new_group" not in msg, "no replica group is rebuilt for rank-local layouts"
    assert r0["optimizer_back"] and r0["local_took"] < TIMEOUT_S, r0
    assert r0["params_left"], "the replicated slices need rank 1: they stay offloaded"
