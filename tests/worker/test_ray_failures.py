"""A role's calls never end in a silent split (a local Ray cluster, 2 roles x 2 ranks, real Gloo groups).

* A failed call whose future nobody read is raised by the next call on the role, naming the failed call and
  rank (``DroppedCallError``), once.
* ``get(timeout_s=...)`` that runs out raises ``CallPendingError`` (a ``TimeoutError``) and leaves the role
  alive; a later ``get()`` returns the call's result.
* On a threaded actor (``max_concurrency=2``) an explicit offload runs after the calls submitted before it on
  every rank: a call that keeps its state, then ``offload_states()``, ends offloaded on every rank, every round.
* An offload interrupted on one rank (``KeyboardInterrupt``), or a call Ray cancelled on one rank, is a
  ``WorkerCallError`` naming that rank, and every rank of the role ends in one state, its values intact.
"""
import re

import pytest
import torch

ROUNDS = 40


@pytest.fixture(scope="module")
def roles(ray_module):
    """Role ``s`` (one call at a time per actor, an interruptible store) and role ``t`` (two at once)."""
    from refimpl.worker import Cluster, ResourcePool
    from tests.worker.ray_workers import ToyWorker

    pool = ResourcePool(2, device="cpu", roles=2)
    s = Cluster("s", ToyWorker, pool, call_timeout_s=60, settle_s=5)
    t = Cluster("t", ToyWorker, pool, max_concurrency=2, call_timeout_s=60, settle_s=5)
    fs, ft = s.setup(0, True, blocking=False), t.setup(1, blocking=False)
    assert fs.get() == [(0, 2), (1, 2)] and ft.get() == [(0, 2), (1, 2)]
    return s, t


def _x():
    return torch.arange(32, dtype=torch.float32).reshape(2, 16) / 7


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_failed_call_whose_future_was_dropped_is_raised_by_the_next_call(roles):
    from refimpl.worker import ClusterError, WorkerCallError

    s, _ = roles
    start = s.bump_count()
    s.bump()
    s.bump(1, blocking=False)  # rank 1 raises, rank 0 applies it; nobody reads the future
    with pytest.raises(ClusterError, match=r"s: an earlier call bump\(\).*rank 1.*planted failure of bump") as e:
        s.bump()
    assert type(e.value).__name__ == "DroppedCallError" and (e.value.method, e.value.ranks) == ("bump", (1,))
    assert isinstance(e.value.__cause__, WorkerCallError)
    counts = s.bump_count()  # raised once: the role serves calls again
    assert counts[0] - start[0] in (2, 3) and counts[0] - counts[1] == 1, "the ranks differ by the failed update"
    f = s.bump(1, blocking=False)
    with pytest.raises(WorkerCallError, match="planted failure of bump"):
        f.get()
    s.bump_count()  # a failure its future reported is not raised again


def test_a_bounded_get_that_runs_out_leaves_the_role_alive(roles):
    from refimpl.worker import ClusterError
    from tests.worker.ray_workers import batch

    _, t = roles
    t.offload_states()
    w = t.weights()
    f = t.hold("b1", blocking=False)
    with pytest.raises(ClusterError, match=r"hold\(\).*0.5 s") as e:
        f.get(timeout_s=0.5)
    assert isinstance(e.value, TimeoutError) and type(e.value).__name__ == "CallPendingError", repr(e.value)
    assert e.value.future is f
    t.release("b1")
    assert f.get() == [True, True], "the call went on and its result is there"
    with pytest.raises(TimeoutError) as e:
        t.hold("b2", timeout_s=0.3)  # a blocking call with a bound hands its future over
    t.release("b2")
    assert e.value.future.get() == [True, True]
    assert _same(t.weights(), w) and all(m["offloaded"] for m in t.moves()), "the state is where it was"
    assert len(t.forward(batch(_x()))) == 2, "the role still runs collectives"


def test_an_offload_runs_after_the_calls_submitted_before_it_on_every_rank(roles):
    from tests.worker.ray_workers import batch

    _, t = roles
    resident = []
    for i in range(ROUNDS):
        kept = t.forward(batch(_x(), is_offload_states=False), blocking=False)
        t.offload_states()
        kept.get()
        states = [m["offloaded"] for m in t.moves()]
        if not all(states):
            resident.append((i, states))
            t.offload_states()
    assert not resident, f"{len(resident)} of {ROUNDS} rounds left ranks resident after the offload: {resident[:5]}"


def test_an_interrupted_offload_on_one_rank_leaves_every_rank_in_one_state(roles):
    from refimpl.worker import ClusterError, WorkerCallError
    from tests.worker.ray_workers import batch

    s, _ = roles
    s.offload_states()
    w = s.weights()
    s.interrupt_next_offload(1)
    with pytest.raises(ClusterError) as e:
        s.forward(batch(_x()))
    assert [m["offloaded"] for m in s.moves()] == [True, True], "the offload completed on the interrupted rank"
    assert isinstance(e.value, WorkerCallError) and e.value.ranks == (1,)
    assert re.search(r"s rank 1 was interrupted in forward\(\).*KeyboardInterrupt.*completed on rank 1", str(e.value))
    assert _same(s.weights(), w), "bit for bit"
    assert len(s.forward(batch(_x()))) == 2


def test_a_call_ray_cancelled_on_one_rank_is_named_and_the_ranks_agree(roles):
    """On the threaded role: Ray skips a cancelled call still waiting for a thread. (On a single-threaded actor
    Ray 2.60 then waits 30 s for the skipped call's sequence number and fails the calls queued behind it; the
    cluster stops such a role as a unit.)"""
    from refimpl.worker import WorkerCallError
    from tests.worker.ray_workers import batch

    _, t = roles
    ray = pytest.importorskip("ray")
    t.offload_states()
    w = t.weights()
    busy = [t.sleep(1.0, blocking=False), t.sleep(1.0, blocking=False)]  # both threads of every rank
    queued = t.bump(blocking=False)
    ray.cancel(queued.refs[1])
    [b.get() for b in busy]
    with pytest.raises(WorkerCallError, match=r"t rank 1 was cancelled in bump\(\).*may have run") as e:
        queued.get()
    assert e.value.ranks == (1,)
    assert [m["offloaded"] for m in t.moves()] == [True, True]
    assert all(torch.equal(x, y) for x, y in zip(t.weights(), w)), "the weights: bump moves only the bias"
    t.offload_states()  # an explicit move does not wait for the call rank 1 never ran
    assert len(t.forward(batch(_x()))) == 2
