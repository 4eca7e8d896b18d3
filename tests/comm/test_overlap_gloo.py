"""The overlapped and streamed switch (refimpl.comm.overlap) on real Gloo processes with a real store.

Each rank trains a small model with AdamW, registers it with an OffloadStore and
switches through a PGLifecycle (DESTROY_DEFERRED over a real Gloo group). The
overlapped switch must leave the state bitwise where the sequential one does,
on every rank; a failure in the offload beside the walk is the agreed fallback
on every rank with the state on the device; a streamed reload makes the first
optimizer step (and a forward that touches the state early) wait for it; a
failure mid-stream leaves the state offloaded and a second reload brings every
byte back. Faults are injected at the store's named points (TorchRuntime.on_point).
"""
from __future__ import annotations

import threading
import time

import pytest

from tests._dist import run_distributed

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]


def _setup(rank, prefix="t", seed=0):
    import torch

    from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
    from refimpl.runtime import GroupSpec
    from refimpl.store import OffloadStore
    from refimpl.torch_runtime import TorchRuntime

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rt = TorchRuntime("cpu")
    rt.run(rt.new_group(GroupSpec(f"{prefix}.dp", tuple(range(rt.world_size)))))
    lc = PGLifecycle(rt, [f"{prefix}.dp"], config=LifecycleConfig(
        policy=PGPolicy.DESTROY_DEFERRED, cooldown_s=0.05, agree_timeout_s=30, control_group=f"{prefix}.control"))
    lc.sync.start()
    store = OffloadStore(rt)
    store.attach_module(model)
    store.attach_optimizer(opt)
    return torch, rt, lc, store, model, opt


def _train(torch, model, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 16, generator=g)
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _state(torch, model, opt):
    """Every parameter and optimizer tensor's bits, as integers (bitwise comparison)."""
    ts = [p.detach() for p in model.parameters()] + [t for s in opt.state.values() for t in s.values()]
    return [t.clone().view(torch.int32 if t.element_size() == 4 else torch.int64).tolist() if t.dim()
            else [float(t)] for t in ts]


def _cycles(rank, overlapped):
    from refimpl.comm.overlap import OverlappedSwitch

    torch, rt, lc, store, model, opt = _setup(rank, "ovl" if overlapped else "seq")
    sw = OverlappedSwitch(lc) if overlapped else None
    seen = []
    for step in range(3):
        _train(torch, model, opt, step)
        before = _state(torch, model, opt)
        if sw is None:
            lc.sync.pause(release_memory=store.offload)
            lc.sync.weight_sync(lambda: store.reload("params"))
            lc.sync.resume()
            store.reload()
        else:
            sw.pause(store.offload, issued_point="store.offload.wait")
            sw.weight_sync(lambda: (store.reload("params"), sw.start("rest", store.reload)))
            sw.resume()
            assert sw.pending == []
        seen.append((before == _state(torch, model, opt), lc.state.name, store.is_offloaded("optimizer")))
    return _state(torch, model, opt), seen, lc.stats.destroys, lc.stats.rebuilds


def _second_thread_while_resuming(rank):
    """A resume runs on a worker thread (held at its rebuild's preflight) while the caller's thread calls the
    lifecycle's weight sync: refused before it does anything; then the resume is joined and a sync runs."""
    import threading

    from refimpl.comm import LifecycleStateError
    from refimpl.comm.overlap import OverlappedSwitch

    torch, rt, lc, store, model, opt = _setup(rank, "two")
    sw = OverlappedSwitch(lc)
    _train(torch, model, opt, 0)
    sw.pause(store.offload, issued_point="store.offload.wait")
    entered, release = threading.Event(), threading.Event()
    remove = rt.on_point("lifecycle.rebuild.preflight", lambda: (entered.set(), release.wait(60)))
    sw.resume(join=False, background=True)
    assert entered.wait(60), "the background resume never reached its preflight"
    called, refused = [], ""
    try:
        lc.sync.weight_sync(lambda: called.append(1))
    except LifecycleStateError as exc:
        refused = str(exc)
    syncs = lc.stats.weight_syncs
    release.set()
    sw.join()
    store.reload()
    # a window the state allows (ACTIVE: use() is allowed and agrees nothing): a call from another thread while the
    # caller's weight sync runs is refused by the one-thread rule alone
    during = []

    def from_another_thread():
        try:
            lc.sync.use()
            during.append("ran")
        except LifecycleStateError as exc:
            during.append(str(exc))

    def sync_body():
        t = threading.Thread(target=from_another_thread)
        t.start()
        t.join(60)

    lc.sync.weight_sync(sync_body)
    refused_active = during[0]
    lc.sync.pause(release_memory=store.offload)
    lc.sync.resume()
    remove()
    lc.sync.weight_sync(lambda: called.append(2))
    store.reload()
    return refused, called, syncs, lc.stats.weight_syncs, lc.state.name, refused_active


def _switch_interval_of_a_background_resume(rank):
    """The interpreter's switch interval read on a real background resume's thread (at its rebuild's preflight),
    with the switch's default and with None, and after each join ([Note: the GIL's switch interval])."""
    import sys

    from refimpl.comm.overlap import OverlappedSwitch
    from refimpl.runtime.switch_interval import SWITCH_INTERVAL

    torch, rt, lc, store, model, opt = _setup(rank, "gil")
    before, seen = sys.getswitchinterval(), []
    remove = rt.on_point("lifecycle.rebuild.preflight", lambda: seen.append(sys.getswitchinterval()))
    for sw in (OverlappedSwitch(lc), OverlappedSwitch(lc, switch_interval_s=None)):
        _train(torch, model, opt, 0)
        sw.pause(store.offload, issued_point="store.offload.wait")
        sw.resume(join=False, background=True)
        sw.join()
        store.reload()
        seen.append(("after", sys.getswitchinterval(), SWITCH_INTERVAL.users))
    remove()
    return before, seen


def _scenarios(rank, world_size):
    """Every scenario on one pair of processes (one spawn: spawning costs more than the scenarios)."""
    return {"seq": _cycles(rank, False), "ovl": _cycles(rank, True), "fail": _offload_fails_beside_walk(rank),
            "two": _second_thread_while_resuming(rank), "gil": _switch_interval_of_a_background_resume(rank),
            "stream": _streamed(rank, False), "sfail": _streamed(rank, True), "early": _early_forward(rank)}


@pytest.fixture(scope="module")
def scenarios():
    res = run_distributed(_scenarios, 2, timeout=240)
    return {k: [r[k] for r in res] for k in res[0]}


def test_a_second_thread_cannot_run_an_operation_while_a_background_resume_runs(scenarios):
    for refused, called, syncs_during, syncs_after, state, refused_active in scenarios["two"]:
        assert "use() while another thread runs an operation of this lifecycle" in refused_active, refused_active
        # refused by the state (RELOADING while the rebuild runs) or, in a window where the state would allow it,
        # by the lifecycle's one-thread rule; either way before anything ran
        assert "lifecycle is RELOADING" in refused or "while another thread runs an operation" in refused, refused
        assert called == [2] and syncs_during == 0 and syncs_after == 2  # nothing ran for the refused call
        assert state == "ACTIVE"


def test_a_background_resume_runs_at_the_lowered_switch_interval_and_restores_it(scenarios):
    from refimpl.runtime.switch_interval import RESPONSIVE_SWITCH_INTERVAL_S

    for before, seen in scenarios["gil"]:
        assert seen[0] == pytest.approx(RESPONSIVE_SWITCH_INTERVAL_S, abs=2e-6), seen  # the default: lowered
        assert seen[1] == ("after", pytest.approx(before), 0), seen  # restored once the thread ended
        assert seen[2] == pytest.approx(before), seen  # switch_interval_s=None: the interpreter's own
        assert seen[3] == ("after", pytest.approx(before), 0), seen


def test_overlapped_switch_is_bitwise_the_sequential_one_on_every_rank(scenarios):
    seq, ovl = scenarios["seq"], scenarios["ovl"]
    for (s_state, _, s_d, s_r), (o_state, seen, o_d, o_r) in zip(seq, ovl):
        assert o_state == s_state  # same final bits as the sequential switch
        assert all(ok and st == "ACTIVE" and not off for ok, st, off in seen)
        assert (o_d, o_r) == (s_d, s_r) and o_d >= 3  # the same lifecycle walks ran
    assert ovl[0][0] == ovl[1][0]  # same seeds, so every rank holds the same state


def _offload_fails_beside_walk(rank):
    from refimpl.comm import PeerFailedError
    from refimpl.comm.overlap import OverlappedSwitch

    torch, rt, lc, store, model, opt = _setup(rank, "fail")
    _train(torch, model, opt, 0)
    before = _state(torch, model, opt)
    if rank == 1:
        def boom():
            raise RuntimeError("injected copy failure")
        rt.on_point("store.offload.wait", boom)
    sw = OverlappedSwitch(lc)
    try:
        sw.pause(store.offload)
        outcome = "no error"
    except PeerFailedError:
        outcome = "peer failed"
    except RuntimeError as e:
        outcome = f"own: {e}"
    return outcome, lc.state.name, store.is_offloaded("params"), sw.pending, (
        before == _state(torch, model, opt) if not store.is_offloaded("params") else None)


def test_a_failed_offload_beside_the_walk_is_the_agreed_fallback_on_every_rank(scenarios):
    res = scenarios["fail"]
    assert res[1][0] == "own: injected copy failure" and res[0][0] == "peer failed"
    for outcome, state, offloaded, pending, same in res:
        assert state == "FAILED" and pending == []
    # the failing rank kept its state on the device, bit for bit (the store's rollback)
    assert res[1][2] is False and res[1][4] is True


def _streamed(rank, fail_mid_stream):
    from refimpl.comm.overlap import BackgroundMoveError, OverlappedSwitch

    torch, rt, lc, store, model, opt = _setup(rank, "sfail" if fail_mid_stream else "stream")
    _train(torch, model, opt, 0)
    # the reference: the same next step with everything reloaded first
    ref_model, ref_opt = _clone(torch, model, opt)
    _train(torch, ref_model, ref_opt, 1)
    want = _state(torch, ref_model, ref_opt)
    before = _state(torch, model, opt)
    sw = OverlappedSwitch(lc)
    sw.guard_optimizer(opt, names=("rest",))
    gate = threading.Event()

    def held():
        if not gate.wait(10):
            raise TimeoutError("test gate never opened")
        if fail_mid_stream and rank == 0:
            raise RuntimeError("injected failure mid-stream")
    sw.pause(store.offload)
    sw.weight_sync(lambda: store.reload("params"))
    remove = rt.on_point("store.reload.wait", held)
    sw.start("rest", store.reload)
    # the plain streamed case also resumes in the background (a rebuild: no canary), joined first at the step
    sw.resume(join=False, background=not fail_mid_stream)
    assert sorted(sw.pending) == (["lifecycle.resume", "rest"] if not fail_mid_stream else ["rest"])
    threading.Timer(0.3, gate.set).start()
    t0 = time.perf_counter()
    try:
        _train(torch, model, opt, 1)  # forward and backward run; the optimizer step waits for the stream
        error = None
    except BackgroundMoveError as e:
        error = str(e)
    waited = time.perf_counter() - t0
    remove()
    if error is None:
        return {"waited": waited, "same_as_reference": _state(torch, model, opt) == want, "error": None,
                "state": lc.state.name, "pending": sw.pending}
    offloaded = store.is_offloaded("optimizer")
    store.reload()  # every rank again: nothing was lost
    return {"waited": waited, "error": error, "offloaded_after_failure": offloaded,
            "recovered": _state(torch, model, opt) == before}


def _clone(torch, model, opt):
    import copy

    m = copy.deepcopy(model)
    o = torch.optim.AdamW(m.parameters(), lr=1e-2)
    o.load_state_dict(copy.deepcopy(opt.state_dict()))
    return m, o


def test_a_streamed_reload_is_waited_for_by_the_optimizer_step_and_is_bitwise(scenarios):
    for r in scenarios["stream"]:
        assert r["error"] is None and r["waited"] >= 0.25  # the step waited for the held stream
        assert r["same_as_reference"] and r["state"] == "ACTIVE" and r["pending"] == []


def test_a_failure_mid_stream_fails_every_rank_and_a_second_reload_recovers_every_byte(scenarios):
    res = scenarios["sfail"]
    assert "injected failure mid-stream" in res[0]["error"] and "another rank" in res[1]["error"]
    for r in res:
        assert r["recovered"]
    assert res[0]["offloaded_after_failure"] is True


def _early_forward(rank):
    from refimpl.comm.overlap import OverlappedSwitch

    torch, rt, lc, store, model, opt = _setup(rank, "early")
    _train(torch, model, opt, 0)
    before = _state(torch, model, opt)
    sw = OverlappedSwitch(lc)
    sw.guard_module(model, names=("params",))
    gate = threading.Event()
    sw.pause(store.offload)
    sw.weight_sync(lambda: None)
    remove = rt.on_point("store.reload.wait", lambda: gate.wait(10))
    sw.start("params", store.reload)
    sw.resume(join=False)
    threading.Timer(0.3, gate.set).start()
    t0 = time.perf_counter()
    y = model(torch.ones(2, 16))  # touches the parameters at once: waits for them
    waited = time.perf_counter() - t0
    remove()
    return waited, before == _state(torch, model, opt), bool(torch.isfinite(y).all())


def test_a_forward_that_touches_streamed_parameters_early_waits_for_them(scenarios):
    for waited, same, finite in scenarios["early"]:
        assert waited >= 0.25 and same and finite
