"""Roles as Ray actors on the same CPU "GPUs" (a local Ray cluster, 2 roles x 2 ranks, real Gloo groups):
ROLL's reload-before / offload-after per call, ``meta_info["is_offload_states"]``, futures, explicit moves,
nested and concurrent calls, metrics at the driver, and faults that name the role and rank."""
import time

import pytest
import torch


@pytest.fixture(scope="module")
def roles(ray_module):
    """Roles ``a`` (6 calls at once per actor) and ``b`` colocated on one pool; room for 2 sacrificial roles."""
    from refimpl.worker import Cluster, ResourcePool
    from tests.worker.ray_workers import ToyWorker

    pool = ResourcePool(2, device="cpu", roles=4)
    a = Cluster("a", ToyWorker, pool, max_concurrency=6, call_timeout_s=60, settle_s=2)
    b = Cluster("b", ToyWorker, pool, call_timeout_s=60)
    fa, fb = a.setup(0, blocking=False), b.setup(1, blocking=False)
    assert fa.get() == [(0, 2), (1, 2)] and fb.get() == [(0, 2), (1, 2)]
    return pool, a, b


def _x():
    return torch.arange(32, dtype=torch.float32).reshape(2, 16) / 7


def test_ranks_form_their_role_group_on_shared_bundles(roles):
    pool, a, b = roles
    assert a.master != b.master, "each role has its own rendezvous"
    assert len(set(a.pids + b.pids)) == 4


def test_call_reloads_before_offloads_after_unless_meta_info_keeps(roles):
    from tests.worker.ray_workers import batch

    _, a, _ = roles
    a.offload_states()
    assert all(m["offloaded"] for m in a.moves())
    before = a.moves()
    out = a.forward(batch(_x()))
    assert [resident for resident, _ in out] == [True, True], "every rank ran on resident state"
    after = a.moves()
    assert all(m["offloaded"] for m in after)
    assert [m["reload"] - n["reload"] for m, n in zip(after, before)] == [1, 1]
    assert [m["offload"] - n["offload"] for m, n in zip(after, before)] == [1, 1]
    kept = a.forward(batch(_x(), is_offload_states=False))
    assert not any(m["offloaded"] for m in a.moves()), "is_offload_states=False keeps it on the device"
    assert torch.equal(out[0][1], kept[0][1]), "the same output with the state moved and kept"
    rec = a.records[-2]  # the offloading call's metrics, gathered from both ranks
    assert rec.method == "forward" and len(rec.per_rank) == 2
    for m in rec.per_rank:
        assert {"time/onload/forward", "time/execute/forward", "time/offload/forward", "time/call/forward",
                "bytes/onload/forward", "bytes/offload/forward", "memory/after_offload/forward/used_gib"} <= m.keys()
        assert m["bytes/offload/forward"] >= 16 * 4 * 4, "the weight's bytes moved"
    assert rec.rpc_s >= rec.worst()["time/call/forward"] and rec.overhead_s() >= 0
    assert "time/offload/forward" not in a.records[-1].worst()
    with pytest.raises(TypeError, match="must be a bool"):
        a.forward(batch(_x(), is_offload_states="false"))


def test_non_blocking_call_is_a_future(roles):
    from tests.worker.ray_workers import batch

    _, a, b = roles
    fa = a.forward(batch(_x()), blocking=False)
    fb = b.forward(batch(_x()), blocking=False)
    ra, rb = fa.get(), fb.get()
    assert fa.done() and len(ra) == len(rb) == 2
    assert not torch.equal(ra[0][1], rb[0][1]), "two roles, two models (seeds 0 and 1)"


def test_nested_call_moves_state_once(roles):
    from tests.worker.ray_workers import batch

    _, a, _ = roles
    a.offload_states()
    before = a.moves()
    out = a.nested(batch(_x()))
    after = a.moves()
    assert all(r == [True, True] for r in ([x[0] for x in rank] for rank in out))
    assert [(m["reload"] - n["reload"], m["offload"] - n["offload"]) for m, n in zip(after, before)] == [(1, 1)] * 2


def test_concurrent_calls_move_state_once_and_an_explicit_offload_waits_for_them(roles):
    _, a, _ = roles
    a.offload_states()
    before = a.moves()
    h1 = a.hold("k1", blocking=False)
    h2 = a.hold("k2", blocking=False)
    deadline = time.time() + 30
    while not all(m["users"] == 2 for m in a.moves()):
        assert time.time() < deadline, a.moves()
        time.sleep(0.05)
    off = a.offload_states(blocking=False)  # arrives while both calls hold the state
    time.sleep(0.3)
    assert not off.done() and not any(m["offloaded"] for m in a.moves()), "the offload waits for the calls"
    a.release("k1")
    a.release("k2")
    assert h1.get() == [True, True] and h2.get() == [True, True], "no call saw its state pulled away"
    off.get()
    after = a.moves()
    assert all(m["offloaded"] for m in after)
    assert [(m["reload"] - n["reload"], m["offload"] - n["offload"]) for m, n in zip(after, before)] == [(1, 1)] * 2


def test_scatter_needs_one_item_per_rank(roles):
    _, a, _ = roles
    from refimpl.worker import Registration

    with pytest.raises(ValueError, match="expected one of"):
        Registration(dispatch="broadcast")
    with pytest.raises(AttributeError, match="registered: .*forward"):
        a.no_such_method()


def test_a_rank_that_raises_is_named_and_the_group_stays_usable(roles):
    from refimpl.worker import WorkerCallError
    from tests.worker.ray_workers import batch

    _, a, _ = roles
    a.offload_states()
    w = a.weights()
    t0 = time.perf_counter()
    with pytest.raises(WorkerCallError, match=r"a rank 1 raised in fail\(\): ValueError: planted failure") as e:
        a.fail(1, "raise_alone")
    assert (e.value.role, e.value.ranks, e.value.method) == ("a", (1,), "fail")
    assert time.perf_counter() - t0 < 30
    assert all(m["offloaded"] and m["users"] == 0 for m in a.moves()), "every rank's state in one place"
    assert all(torch.equal(x, y) for x, y in zip(a.weights(), w)), "and recoverable, bit for bit"
    assert len(a.forward(batch(_x()))) == 2, "the group still runs collectives"


def test_a_rank_that_raises_while_its_peers_wait_in_a_collective_stops_the_group(roles):
    from refimpl.worker import Cluster, ClusterFailedError, WorkerCallError
    from tests.worker.ray_workers import ToyWorker, batch

    pool, a, b = roles
    c = Cluster("c", ToyWorker, pool, call_timeout_s=60, settle_s=1.0)
    c.setup(2)
    b.offload_states()
    wb = b.weights()
    t0 = time.perf_counter()
    with pytest.raises(WorkerCallError, match=r"c rank 0 raised in fail\(\).*ranks \[1\] did not finish within 1.0 s"):
        c.fail(0, "raise")
    assert time.perf_counter() - t0 < 20, "within the settle bound, not the collective's timeout"
    with pytest.raises(ClusterFailedError, match="role 'c' was stopped"):
        c.forward(batch(_x()))
    assert all(torch.equal(x, y) for x, y in zip(b.weights(), wb)), "the other role's state is untouched"
    assert all(m["offloaded"] for m in b.moves())


def test_a_rank_that_dies_mid_call_is_named_and_its_peers_are_stopped(roles):
    from refimpl.worker import Cluster, WorkerDiedError
    from tests.worker.ray_workers import batch, ToyWorker

    pool, a, b = roles
    d = Cluster("d", ToyWorker, pool, call_timeout_s=60)
    d.setup(3)
    ray = pytest.importorskip("ray")
    t0 = time.perf_counter()
    with pytest.raises(WorkerDiedError, match=r"d rank 1 died during fail\(\)") as e:
        d.fail(1, "exit")
    assert e.value.ranks == (1,) and time.perf_counter() - t0 < 30
    survivor = d.workers[0]
    with pytest.raises(ray.exceptions.RayActorError):  # stopped with it: the group never ends split
        ray.get(survivor.timeshare_ping.remote(), timeout=30)
    assert len(b.forward(batch(_x()))) == 2, "the other role still serves calls"
