"""An interrupt on one rank (``KeyboardInterrupt``: Ctrl-C, a cancelled Ray call) ends every rank FAILED, on real Gloo.

The interrupt comes inside the pause's memory release (the store's offload), inside
the weight sync's function, or at a point of the lifecycle's own destroy walk, on
rank 0 only. It used to bypass the agreed fallback (it is no ``Exception``): rank 0
ended DESTROYED with its groups half taken down, rank 1 FAILED after the agreement
timeout, and a later ``resume()`` on rank 0 waited in ``new_group`` for a peer that
never came. Now it is agreed like any failure: every rank ends FAILED at once with
its groups aborted, rank 0 re-raises its ``KeyboardInterrupt``, rank 1 raises
``PeerFailedError`` naming rank 0, and a later call on any rank raises
``LifecycleFailedError`` at once.
"""
from __future__ import annotations

import time

import pytest

from tests._dist import run_distributed

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

AGREE_S = 8.0


def _interrupted(rank, world_size, where):
    from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
    from refimpl.runtime import GroupSpec
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime()
    groups = [GroupSpec(f"ki.{n}", (0, 1), timeout_s=10.0) for n in ("dp", "tp")]
    lc = PGLifecycle(rt, groups, config=LifecycleConfig(policy=PGPolicy.DESTROY, cooldown_s=0.1,
                                                        agree_timeout_s=AGREE_S, canary_timeout_s=5,
                                                        control_group="ki.control"))
    lc.sync.start()

    def interrupt():
        if rank == 0:
            raise KeyboardInterrupt

    if where == "walk":
        rt.on_point("lifecycle.destroy", interrupt)
    out = {}
    t0 = time.monotonic()
    try:
        if where == "weight_sync":
            lc.sync.pause()
        lc.sync.pause(release_memory=interrupt) if where == "release_memory" else \
            lc.sync.weight_sync(interrupt) if where == "weight_sync" else lc.sync.pause()
        out["raised"] = None
    except BaseException as exc:  # noqa: BLE001 - which error, is the assertion (KeyboardInterrupt included)
        out["raised"] = (type(exc).__name__, str(exc), getattr(exc, "ranks", None))
    out.update(took=time.monotonic() - t0, state=lc.state.name, live=[g for g in lc.groups if rt.group_live(g)])
    later = {}
    for op in ("resume", "pause"):
        t1 = time.monotonic()
        try:
            getattr(lc.sync, op)()
            later[op] = (None, time.monotonic() - t1)
        except Exception as exc:  # noqa: BLE001
            later[op] = (type(exc).__name__, time.monotonic() - t1)
    out["later"] = later
    return out


@pytest.mark.parametrize("where", ["release_memory", "weight_sync", "walk"])
def test_an_interrupt_on_one_rank_ends_every_rank_failed_at_once_and_is_reraised_where_it_came(where):
    out = run_distributed(_interrupted, 2, (where,), timeout=120)
    assert [o["state"] for o in out] == ["FAILED", "FAILED"], out
    assert [o["live"] for o in out] == [[], []], "every role group aborted"
    assert out[0]["raised"][0] == "KeyboardInterrupt", out[0]
    name, msg, ranks = out[1]["raised"]
    assert name == "PeerFailedError" and ranks == (0,) and "rank 0 failed" in msg, out[1]
    for o in out:
        assert o["took"] < AGREE_S, "the peer heard of it at the step's agreement, not by its timeout"
        for op, (err, took) in o["later"].items():
            assert err == "LifecycleFailedError" and took < 1.0, (op, o["later"])
