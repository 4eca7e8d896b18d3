"""A rendezvous port really held on one rank's rebuild (Gloo processes here; NCCL in tests/multigpu).

The role group has its own rendezvous port (``GroupSpec`` option ``rendezvous_port``, see
:mod:`refimpl.torch_runtime.rendezvous`). After a pause destroys it, another socket on rank 0 listens on
that port (and drops whatever connects): the weight sync's rebuild fails on rank 0 with
``AddressInUseError`` and on rank 1 with a timeout reaching the master; every rank agrees, waits the
cooldown and retries; once the port is free the group comes back and its collectives work.
The holder gives the port back when rank 0 logs its failed bind (before the ranks agree to retry), not after
a fixed time: the outcome does not depend on how fast a loaded machine runs the ranks.
"""
from __future__ import annotations

import socket

from tests._dist import run_distributed, _free_port


class _PortHolder:
    """Listens on ``port`` (so no one else can bind it), dropping every connection, until :meth:`release` (or
    ``max_s``, a bound for a test gone wrong)."""

    def __init__(self, port: int, max_s: float = 60.0) -> None:
        import threading
        import time

        self.released_at: float | None = None
        self._done = threading.Event()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # bindable despite TIME_WAIT
        self._sock.bind(("0.0.0.0", port))
        self._sock.listen()
        self._sock.settimeout(0.1)
        end = time.monotonic() + max_s

        def drop():
            while not self._done.is_set() and time.monotonic() < end:
                try:
                    conn, _ = self._sock.accept()
                    conn.close()
                except OSError:
                    pass
            self.release()

        threading.Thread(target=drop, daemon=True).start()

    def release(self) -> None:
        """Close the listening socket now: the port is free once this returns."""
        import time

        if self.released_at is None:
            self._done.set()
            self._sock.close()
            self.released_at = time.monotonic()


def port_held_job(rank, world_size, port):
    """A DESTROY_DEFERRED lifecycle whose pair group rendezvous on ``port``; rank 0's port is taken at the rebuild
    and given back the moment rank 0 logs that it could not bind it (before the ranks agree to retry), so the
    retry finds it free however loaded the machine is: no race against a wall clock."""
    import logging
    import time

    from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
    from refimpl.runtime import GroupSpec
    from refimpl.torch_runtime import TorchRuntime
    from tests.multigpu._jobs import gather_ranks

    messages = []
    holder = []

    class Keep(logging.Handler):
        def emit(self, record):
            msg = record.getMessage()
            messages.append(msg)
            if holder and "could not bind its rendezvous port" in msg:
                holder[0].release()  # the failed attempt is over; the retry comes after the agreement

    logging.getLogger("refimpl.comm").addHandler(Keep())
    rt = TorchRuntime()
    spec = GroupSpec("held.pair", (0, 1), timeout_s=8.0, options=(("rendezvous_port", port),))
    lc = PGLifecycle(rt, [spec], config=LifecycleConfig(policy=PGPolicy.DESTROY_DEFERRED, cooldown_s=1.0,
                                                        agree_timeout_s=60, control_group="held.control"))
    sync = lc.sync
    sync.start()
    first = gather_ranks(rt, "held.pair")
    sync.pause()  # destroys the group and closes its store
    if rank == 0:
        holder.append(_PortHolder(port))
    gathered = sync.weight_sync(lambda: gather_ranks(rt, "held.pair"))
    back_at = time.monotonic()
    sync.resume()
    return dict(first=first, gathered=gathered, after=gather_ranks(rt, "held.pair"),
                waited_for_the_port=(holder[0].released_at is not None and back_at > holder[0].released_at)
                if holder else None,
                retries=lc.stats.address_in_use_retries, state=lc.state.name,
                generation=rt.group_spec("held.pair").generation,
                failures=[m for m in messages if "rebuilding" in m])


def check_port_held(results):
    for rank, r in enumerate(results):
        want = [0, 1] if rank < 2 else None  # ranks past 1 are not members but vote in every agreement
        assert r["first"] == r["gathered"] == r["after"] == want, f"rank {rank}: {r}"
        assert r["retries"] == 1, f"rank {rank}: expected one agreed retry, got {r['retries']}"
        assert r["state"] == "ACTIVE"
    assert results[0]["waited_for_the_port"] is True, "the group came back only after the port was free"
    assert any("could not bind its rendezvous port" in m for m in results[0]["failures"]), results[0]["failures"]
    assert results[1]["failures"] and "could not reach" in results[1]["failures"][0], results[1]["failures"]
    assert len({r["generation"] for r in results}) == 1


def test_a_port_held_on_one_rank_makes_every_rank_retry_the_rebuild_after_the_cooldown():
    results = run_distributed(port_held_job, 2, args=(_free_port(),), timeout=180)
    check_port_held(results)


def test_a_bad_rendezvous_port_is_refused_with_the_value_named():
    import pytest

    from refimpl.runtime import GroupError, GroupSpec
    from refimpl.torch_runtime.rendezvous import backend_options, rendezvous_port

    spec = GroupSpec("g", (0, 1), options=(("rendezvous_port", 70000), ("is_high_priority_stream", True)))
    with pytest.raises(GroupError, match="must be a TCP port 1-65535, got 70000"):
        rendezvous_port(spec)
    assert backend_options(spec) == (("is_high_priority_stream", True),), "the runtime's own option stays out of NCCL's"
    assert rendezvous_port(GroupSpec("h", (0,))) is None
