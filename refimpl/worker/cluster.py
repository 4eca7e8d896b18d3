"""The driver side of roles as Ray actors sharing GPUs: :class:`ResourcePool` and :class:`Cluster`.

Theory of operation
-------------------
A :class:`ResourcePool` is one Ray placement group of ``world_size`` bundles, one
per rank (a GPU each on CUDA; on a CPU machine a share of the CPUs stands in for
a GPU). Every role colocated on the pool starts its rank ``i`` on bundle ``i``
and asks for ``1 / roles`` of it (fractional GPUs, as ROLL and verl colocate),
so ``roles`` roles fit on the same devices and Ray gives each rank of each
role the same GPU.

A :class:`Cluster` is one role on a pool: it starts rank 0, asks it for its
master address and port, starts the other ranks with them (each rank then
forms the role's own process group), and makes every method its worker class
marked with :func:`~refimpl.worker.role.register` a method of the cluster: an
RPC to every rank. ``cluster.compute_log_probs(batch)`` reloads each rank's
state, runs, and offloads it again unless ``batch.meta_info["is_offload_states"]
is False``; ``blocking=False`` returns a :class:`ClusterFuture`;
``cluster.offload_states()`` / ``reload_states()`` move state explicitly. Calls
are numbered as they are sent; on a threaded actor an explicit move runs after
every call sent before it, and a call that moves state around itself after the
last explicit move sent before it (:class:`~refimpl.worker.role.CallOrder`), so
every rank ends where the order of the calls puts it. Each
call's per-rank metrics (onload / execute / offload seconds, device memory after
each phase, bytes moved) come back to the driver with the driver's own RPC time
(:class:`CallRecord`).

Faults. A group's ranks are one unit: a call's outcome is decided for all of them.

* A rank raises, is interrupted (``KeyboardInterrupt``) or its call is cancelled
  (``ray.cancel``): the driver gives the other ranks ``settle_s`` to finish. If
  they do, :class:`WorkerCallError` names the role, the ranks, what happened
  ("raised", "was interrupted", "was cancelled") and the method, and the group
  stays usable in one state: where some ranks' state ended offloaded and others'
  resident (an interrupted offload), the offload is completed on the resident
  ones if moving the state is rank-local; if it runs collectives (a lifecycle,
  ``local_dedup``) the group is stopped. If some ranks do not finish (they wait in
  a collective for the rank that failed), the whole group is stopped: no rank is
  left in a half-done call.
* A failed call nobody read: a future's failure is raised by its :meth:`ClusterFuture.get`;
  if nobody has read it when the next call on the role is made, that call is not
  sent and raises :class:`DroppedCallError` naming the failed call and ranks (a
  call sent before the failure was known raises it from its own ``get``). Never
  lost, raised once.
* ``get(timeout_s=...)`` runs out: :class:`CallPendingError` (a ``TimeoutError``);
  the call goes on, the role is untouched, ``get()`` again.
* A rank dies: :class:`WorkerDiedError` as soon as Ray reports it; the group's
  other ranks are stopped with it (a group with a missing rank cannot run a
  collective).
* No answer within ``call_timeout_s`` of the first wait for it: :class:`WorkerTimeoutError`
  naming the ranks that did not answer; the group is stopped.

A stopped group refuses every later call with :class:`ClusterFailedError` (start a
new :class:`Cluster` for the role). Other roles' actors are separate processes:
their state, resident or offloaded, is untouched by one role's failure.

Ray is imported lazily: :mod:`refimpl.worker` imports without it.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Sequence

from refimpl.arguments import expect, expect_int, expect_name, expect_seconds
from refimpl.worker.control import find_meta_info, wants_offload
from refimpl.worker.role import CallInterruptedError, RoleWorker, registration

logger = logging.getLogger(__name__)

STOP_CONFIRM_S = 30.0
"""How long stopping a role waits for Ray to report each killed rank dead before it logs and goes on."""


class ClusterError(RuntimeError):
    """A call to a role's ranks failed; ``role``, ``ranks`` and ``method`` say where."""

    def __init__(self, message: str, *, role: str, ranks: Sequence[int] = (), method: str = "") -> None:
        super().__init__(message)
        self.role, self.ranks, self.method = role, tuple(ranks), method


class WorkerCallError(ClusterError):
    """A method raised on one or more ranks (the cause is chained and quoted)."""


class WorkerDiedError(ClusterError):
    """A rank's actor died during a call; the group's other ranks were stopped too."""


class WorkerTimeoutError(ClusterError):
    """Ranks did not answer within the call's bound; the group was stopped."""


class ClusterFailedError(ClusterError):
    """The group was stopped by an earlier failure; start a new Cluster for the role."""


class CallPendingError(ClusterError, TimeoutError):
    """A bounded ``get`` (``future.get(timeout_s=...)``, or a blocking call with ``timeout_s``) ran out before
    every rank answered. The call goes on and the role is untouched: ``future`` is the call's
    :class:`ClusterFuture`, whose ``get()`` returns its result later."""

    def __init__(self, message: str, *, role: str, ranks: Sequence[int] = (), method: str = "",
                 future: "ClusterFuture | None" = None) -> None:
        super().__init__(message, role=role, ranks=ranks, method=method)
        self.future = future


class DroppedCallError(ClusterError):
    """An earlier call on the role failed and nobody had read its future; raised once, by the next call on
    the role (or by a later call's ``get``). ``method`` and ``ranks`` name the failed call and the ranks that
    failed; its error is the cause. ``future``: the call that raised this, when it was already sent (its
    result is ``future.get()``)."""

    def __init__(self, message: str, *, role: str, ranks: Sequence[int] = (), method: str = "",
                 future: "ClusterFuture | None" = None) -> None:
        super().__init__(message, role=role, ranks=ranks, method=method)
        self.future = future


def require_ray() -> Any:
    """The ``ray`` module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("roles as Ray actors need Ray: pip install 'gpu-timeshare[ray]' (or pip install ray)") from e
    return ray


class ResourcePool:
    """``world_size`` placement-group bundles (one per rank) that up to ``roles`` colocated roles share.

    ``device``: ``"cuda"`` (a GPU per bundle) or ``"cpu"`` (``cpus_per_bundle`` CPUs stand in for a GPU;
    CI on a 2-core machine: 2 bundles of 1 CPU, each role's rank takes 1/roles of it).
    ``ready_timeout_s`` bounds the wait for Ray to reserve the bundles.
    """

    def __init__(self, world_size: int, *, device: str = "cuda", roles: int = 2, cpus_per_bundle: float = 1.0,
                 ready_timeout_s: float = 60.0, name: str = "") -> None:
        call = "ResourcePool(world_size, ...)"
        expect_int(world_size, call, "world_size", minimum=1)
        expect_int(roles, call, "roles", minimum=1)
        expect_seconds(cpus_per_bundle, call, "cpus_per_bundle")
        expect_seconds(ready_timeout_s, call, "ready_timeout_s")
        if device not in ("cuda", "cpu"):
            raise ValueError(f"ResourcePool(device={device!r}): expected 'cuda' or 'cpu'")
        ray = require_ray()
        from ray.util.placement_group import placement_group

        self.world_size, self.device, self.roles, self.cpus = world_size, device, roles, float(cpus_per_bundle)
        bundle = {"CPU": self.cpus, **({"GPU": 1.0} if device == "cuda" else {})}
        self.placement_group = placement_group([dict(bundle) for _ in range(world_size)], strategy="PACK", name=name)
        try:
            ray.get(self.placement_group.ready(), timeout=ready_timeout_s)
        except Exception as e:
            raise ClusterError(
                f"Ray could not reserve {world_size} bundles of {bundle} within {ready_timeout_s} s "
                f"(cluster resources: {ray.cluster_resources()}); start Ray with enough CPUs/GPUs",
                role="(pool)") from e
        self._taken = 0

    def actor_options(self, rank: int) -> dict[str, Any]:
        """Ray ``.options()`` for rank ``rank`` of one role: bundle ``rank``, ``1/roles`` of its resources."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        share = 1.0 / self.roles
        opts: dict[str, Any] = {"scheduling_strategy": PlacementGroupSchedulingStrategy(
            self.placement_group, placement_group_bundle_index=rank), "num_cpus": self.cpus * share}
        if self.device == "cuda":
            opts["num_gpus"] = share
        return opts

    def take_role(self, role: str) -> None:
        """Count one more role on the pool; raise if more than ``roles`` would share it."""
        if self._taken >= self.roles:
            raise ValueError(f"role {role!r}: the pool was made for {self.roles} colocated roles and has them all; "
                             "make it with roles=N for N roles")
        self._taken += 1

    def remove(self) -> None:
        """Give the bundles back to Ray (after every role on them has shut down)."""
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.placement_group)


@dataclasses.dataclass
class CallRecord:
    """One driver call: the method, the driver's time from submit to the last result (``rpc_s``), each rank's metrics."""

    role: str
    method: str
    rpc_s: float
    per_rank: list[dict[str, float]]

    def worst(self) -> dict[str, float]:
        """Every metric's maximum over the ranks (the slowest rank decides when a call ends)."""
        out: dict[str, float] = {}
        for m in self.per_rank:
            for k, v in m.items():
                out[k] = max(out.get(k, v), v)
        return out

    def overhead_s(self) -> float:
        """``rpc_s`` minus the slowest rank's time inside the call: what Ray and the driver add to the copies and work."""
        return self.rpc_s - self.worst().get(f"time/call/{self.method}", 0.0)


class ClusterFuture:
    """The pending result of a cluster call (``blocking=False``); :meth:`get` waits for it.

    A failed call is never lost: if nobody has read its future when the next call on the role is made (or
    when a later call's result comes back), that call raises :class:`DroppedCallError` naming it.
    """

    def __init__(self, cluster: "Cluster", method: str, refs: list[Any], collect: str, t0: float, seq: int) -> None:
        self._cluster, self.method, self._refs, self._collect, self._t0 = cluster, method, refs, collect, t0
        self.seq = seq  # the call's number in its role, in submission order
        self._outcome: tuple[bool, Any] | None = None
        self._since: float | None = None  # when the first wait for it began: call_timeout_s counts from there

    @property
    def refs(self) -> list[Any]:
        """The call's Ray object references, one per rank (for ``ray.wait``; a rank's call that ``ray.cancel``
        cancelled is reported by :meth:`get` as that rank's failure)."""
        return list(self._refs)

    def get(self, timeout_s: float | None = None) -> Any:
        """The call's result (every rank's, or rank 0's); raises the call's :class:`ClusterError`.

        ``timeout_s``: wait at most this long, then :class:`CallPendingError` (the call goes on, the role is
        untouched: ``get()`` again). The role is stopped (:class:`WorkerTimeoutError`) only when no rank has
        answered ``call_timeout_s`` after the first wait began. If this call succeeded but an earlier call
        whose future nobody read failed, raises that call's :class:`DroppedCallError` (once; ``get()`` again
        for this call's result).
        """
        ok, value = self._settle(timeout_s)
        self._cluster._mark_read(self.seq)
        if not ok:
            raise value
        self._cluster._raise_dropped(before=self.seq, current=self)
        return value

    def done(self) -> bool:
        """True when every rank has answered (no waiting)."""
        ray = require_ray()
        ready, _ = ray.wait(self._refs, num_returns=len(self._refs), timeout=0)
        return len(ready) == len(self._refs)

    def _settle(self, timeout_s: float | None) -> tuple[bool, Any]:
        """``(True, result)`` or ``(False, the call's ClusterError)``, waiting for the ranks' answers if not yet
        known; :class:`CallPendingError` (outcome still open) when ``timeout_s`` runs out first."""
        if self._outcome is None:
            if self._since is None:
                self._since = time.perf_counter()
            try:
                self._outcome = (True, self._cluster._gather(self, timeout_s))
            except CallPendingError:
                raise
            except ClusterError as e:
                self._outcome = (False, e)
        return self._outcome

    def _decided(self) -> bool:
        """True when the outcome can be had without waiting for a running call: every rank answered, or one
        failed (the others then get ``settle_s``)."""
        if self._outcome is not None:
            return True
        ray = require_ray()
        ready, _ = ray.wait(self._refs, num_returns=len(self._refs), timeout=0)
        if len(ready) == len(self._refs):
            return True
        for ref in ready:
            try:
                ray.get(ref, timeout=0)
            except Exception:  # noqa: BLE001 - any failure of a rank decides the call
                return True
        return False


class Cluster:
    """One role on a :class:`ResourcePool`: one Ray actor of ``worker_cls`` per rank, its methods RPCs to every rank.

    ``worker_cls`` derives from :class:`~refimpl.worker.role.RoleWorker`. ``config`` goes to every rank's
    constructor. ``max_concurrency``: calls one actor serves at once (2 or more lets an explicit
    ``offload_states`` arrive while a call runs; it runs after the calls sent before it). ``call_timeout_s``
    bounds every call (and how long a call waits on a rank for those it must follow); ``settle_s`` is how
    long the other ranks may take to finish after one failed.
    ``env``: environment variables for the actors (e.g. ``OMP_NUM_THREADS``).
    """

    def __init__(self, role: str, worker_cls: type, pool: ResourcePool, *, config: dict[str, Any] | None = None,
                 max_concurrency: int = 1, call_timeout_s: float = 600.0, settle_s: float = 10.0,
                 start_timeout_s: float = 300.0, env: dict[str, str] | None = None) -> None:
        call = f"Cluster({role!r}, worker_cls, pool, ...)"
        expect_name(role, call, "role")
        if not (isinstance(worker_cls, type) and issubclass(worker_cls, RoleWorker)):
            raise TypeError(f"Cluster({role!r}, ...) needs a RoleWorker subclass, got {worker_cls!r}")
        expect(pool, ResourcePool, call, "pool", "a ResourcePool", hint="ResourcePool(world_size, device=...)")
        expect(config, dict, call, "config", "a dict or None", optional=True)
        expect_int(max_concurrency, call, "max_concurrency", minimum=1)
        expect_seconds(call_timeout_s, call, "call_timeout_s")
        expect_seconds(settle_s, call, "settle_s", positive=False)
        expect_seconds(start_timeout_s, call, "start_timeout_s")
        expect(env, dict, call, "env", "a dict of str to str or None", optional=True)
        ray = require_ray()
        pool.take_role(role)
        self.role, self.worker_cls, self.pool, self.world_size = role, worker_cls, pool, pool.world_size
        self.call_timeout_s, self.settle_s = call_timeout_s, settle_s
        self.records: list[CallRecord] = []
        self.failure: ClusterError | None = None
        self._seq = 0  # the next call's number (every call goes to every rank: numbers are the same on all)
        self._last_move = -1  # the number of the last explicit move sent (@register(ordered=True))
        self._unread: dict[int, ClusterFuture] = {}  # calls sent whose outcome nobody has read yet
        remote = ray.remote(worker_cls)
        extra = {"max_concurrency": max_concurrency}
        if env:
            extra["runtime_env"] = {"env_vars": dict(env)}

        def start(rank: int, addr: str | None, port: int | None) -> Any:
            return remote.options(**pool.actor_options(rank), **extra).remote(
                role, rank, self.world_size, addr, port, config)

        self.workers: list[Any] = [start(0, None, None)]
        addr, port = ray.get(self.workers[0].master_address.remote(), timeout=start_timeout_s)
        self.master = (addr, port)
        self.workers += [start(r, addr, port) for r in range(1, self.world_size)]
        self.pids = [p for _, _, p in ray.get([w.timeshare_ping.remote() for w in self.workers],
                                              timeout=start_timeout_s)]
        logger.info("%s: %d ranks up, rendezvous %s:%d", role, self.world_size, addr, port)

    # ------------------------------------------------------------------ calls

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_") or "workers" not in self.__dict__:
            raise AttributeError(name)
        fn = getattr(self.worker_cls, name, None)
        if registration(fn) is None:
            marked = sorted(n for n in dir(self.worker_cls) if registration(getattr(self.worker_cls, n, None)))
            raise AttributeError(f"{self.worker_cls.__name__} (role {self.role!r}) has no method {name!r} marked "
                                 f"with @register; registered: {marked}")

        def rpc(*args: Any, blocking: bool = True, timeout_s: float | None = None, **kwargs: Any) -> Any:
            return self.call(name, *args, blocking=blocking, timeout_s=timeout_s, **kwargs)

        rpc.__name__ = rpc.__qualname__ = name
        rpc.__doc__ = fn.__doc__
        return rpc

    def call(self, method: str, *args: Any, blocking: bool = True, timeout_s: float | None = None, **kwargs: Any) -> Any:
        """Call the registered ``method`` on every rank; its result, or a :class:`ClusterFuture` if not ``blocking``.

        ``timeout_s`` bounds a blocking call's wait (then :class:`CallPendingError`, carrying the future).
        Raises :class:`DroppedCallError` instead of sending the call when an earlier call failed and nobody read
        its future."""
        reg = registration(getattr(self.worker_cls, method, None))
        if reg is None:
            raise AttributeError(f"{self.worker_cls.__name__} has no method {method!r} marked with @register")
        self._raise_dropped()
        if self.failure is not None:
            raise ClusterFailedError(f"role {self.role!r} was stopped after an earlier failure ({self.failure}); "
                                     "start a new Cluster for it", role=self.role, method=method) from self.failure
        per_rank = self._split(method, reg, args)
        for a in per_rank:  # a bad is_offload_states fails here, at the driver, before any rank runs
            wants_offload(find_meta_info(a, kwargs))
        seq, self._seq = self._seq, self._seq + 1
        if reg.ordered:  # an explicit move: after every call sent before it
            after, self._last_move = seq, seq
        else:  # a call that moves state around itself: after the last explicit move; others at once
            after = self._last_move + 1 if reg.offload else 0
        order = (seq, after, self.call_timeout_s)
        t0 = time.perf_counter()
        refs = [w.timeshare_call.remote(method, a, kwargs, order) for w, a in zip(self.workers, per_rank)]
        future = ClusterFuture(self, method, refs, reg.collect, t0, seq)
        self._unread[seq] = future
        return future.get(timeout_s) if blocking else future

    def _split(self, method: str, reg: Any, args: tuple) -> list[tuple]:
        if reg.dispatch == "one_to_all":
            return [args] * self.world_size
        for i, a in enumerate(args):
            if not isinstance(a, (list, tuple)) or len(a) != self.world_size:
                raise ValueError(f"{self.role}.{method} scatters its arguments: argument {i} must be a list of "
                                 f"{self.world_size} items (one per rank), got {type(a).__name__}")
        return [tuple(a[r] for a in args) for r in range(self.world_size)]

    def offload_states(self, blocking: bool = True, timeout_s: float | None = None) -> Any:
        """Every rank's state to host memory, after every call sent before it has finished on that rank."""
        return self.call("offload_states", blocking=blocking, timeout_s=timeout_s)

    def reload_states(self, blocking: bool = True, timeout_s: float | None = None) -> Any:
        """Every rank's state back to the device, after every call sent before it has finished on that rank."""
        return self.call("reload_states", blocking=blocking, timeout_s=timeout_s)

    def moves(self) -> list[dict[str, Any]]:
        """Each rank's ``timeshare_moves()``: where its state is and how often it moved."""
        ray = require_ray()
        return ray.get([w.timeshare_moves.remote() for w in self.workers], timeout=self.call_timeout_s)

    # ------------------------------------------------------------------ gathering and faults

    def _gather(self, future: ClusterFuture, timeout_s: float | None) -> Any:
        """Wait for every rank's answer to one call (see the module docstring for faults); the collected result.
        :class:`CallPendingError` when ``timeout_s`` runs out first and no rank failed."""
        ray = require_ray()
        from ray.exceptions import RayActorError, RayTaskError, TaskCancelledError

        method, now = future.method, time.perf_counter()
        hung_at = (future._since or now) + self.call_timeout_s
        deadline = hung_at if timeout_s is None else min(hung_at, now + timeout_s)
        pending = {ref: rank for rank, ref in enumerate(future._refs)}
        results: list[Any] = [None] * len(future._refs)
        raised: dict[int, BaseException] = {}
        while pending:
            left = deadline - time.perf_counter()
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(left, 0.0))
            if not ready:
                self._on_silence(future, sorted(pending.values()), raised, timeout_s, pending_only=deadline < hung_at)
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    results[rank] = ray.get(ref)
                except RayActorError as e:
                    self._stop(WorkerDiedError(
                        f"{self.role} rank {rank} died during {method}(): {str(e).splitlines()[0]}; the role's other "
                        "ranks were stopped with it (a group with a missing rank cannot continue)",
                        role=self.role, ranks=[rank], method=method))
                    raise self.failure from e  # type: ignore[misc]
                except RayTaskError as e:
                    raised[rank] = e.cause if getattr(e, "cause", None) is not None else e
                except TaskCancelledError as e:  # ray.cancel: reported cancelled, though it may have run
                    raised[rank] = e
                    self.workers[rank].timeshare_skip.remote(future.seq)  # explicit moves must not wait for it
                if rank in raised:  # the outcome is decided: the others get settle_s, whatever get's bound
                    deadline = min(hung_at, time.perf_counter() + self.settle_s)
        if raised:
            self._raise_failed(method, raised)
        rpc_s = time.perf_counter() - future._t0
        self.records.append(CallRecord(self.role, method, rpc_s, [m for _, m in results]))
        values = [v for v, _ in results]
        return values[0] if future._collect == "rank0" else values

    def _raise_failed(self, method: str, raised: dict[int, BaseException]) -> None:
        """Every rank answered and some failed: bring the ranks to one state, then raise :class:`WorkerCallError`."""
        err = self._raised_error(method, raised, "")
        note, stop = self._one_state()
        if note:
            err = WorkerCallError(f"{err}{note}", role=self.role, ranks=err.ranks, method=method)
        if stop:
            self._stop(err)
        raise err from raised[err.ranks[0]]

    def _one_state(self) -> tuple[str, bool]:
        """After a failed call: if some ranks' state is offloaded and others' resident (one was interrupted or
        failed between the two), complete the offload on the resident ones when moving the state is rank-local,
        else stop the role. Returns ``(what was done, for the error message; whether to stop the role)``."""
        ray = require_ray()
        try:
            states = ray.get([w.timeshare_moves.remote() for w in self.workers], timeout=self.call_timeout_s)
        except Exception as e:  # noqa: BLE001 - a rank that cannot say where its state is: nothing to agree on
            return (f"; the ranks' states could not be read ({type(e).__name__}: {e}): the role's ranks were all "
                    "stopped"), True
        offloaded = [r for r, m in enumerate(states) if m["offloaded"]]
        resident = [r for r, m in enumerate(states) if not m["offloaded"]]
        if not offloaded or not resident:
            return "", False
        split = f"; ranks {resident} were left resident while ranks {offloaded} had offloaded"
        if not all(m.get("rank_local", False) for m in states):
            return (f"{split}, and moving the state runs collectives (a lifecycle or local_dedup), so no rank can "
                    "complete it alone: the role's ranks were all stopped"), True
        try:
            ray.get([self.workers[r].timeshare_call.remote("offload_states", (), {}, None) for r in resident],
                    timeout=self.call_timeout_s)
            states = ray.get([w.timeshare_moves.remote() for w in self.workers], timeout=self.call_timeout_s)
        except Exception as e:  # noqa: BLE001 - the completion failed: the ranks stay split, so the role stops
            return (f"{split}; completing the offload failed ({type(e).__name__}: {e}): the role's ranks were all "
                    "stopped"), True
        if not all(m["offloaded"] for m in states):
            return f"{split}; completing the offload left {states}: the role's ranks were all stopped", True
        ranks = ", ".join(map(str, resident))
        logger.warning("%s: the offload was completed on rank(s) %s after a failed call", self.role, ranks)
        return (f"{split}: the offload was completed on rank{'s' if len(resident) > 1 else ''} {ranks}, every "
                "rank's state is in host memory"), False

    def _raised_error(self, method: str, raised: dict[int, BaseException], tail: str) -> WorkerCallError:
        from ray.exceptions import RayTaskError, TaskCancelledError

        ranks = sorted(raised)
        first = raised[ranks[0]]
        if isinstance(first, TaskCancelledError) and not isinstance(first, RayTaskError):
            verb, tail = "was cancelled", (" (Ray does not stop a call an actor has started or queued: it may have "
                                           f"run on that rank){tail}")
        elif isinstance(first, (CallInterruptedError, TaskCancelledError)):
            verb = "was interrupted"
        else:
            verb = "raised"
        return WorkerCallError(f"{self.role} rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} {verb} "
                               f"in {method}(): {type(first).__name__}: {first}{tail}",
                               role=self.role, ranks=ranks, method=method)

    def _on_silence(self, future: ClusterFuture, silent: list[int], raised: dict[int, BaseException],
                    timeout_s: float | None, pending_only: bool) -> None:
        method = future.method
        if not raised and pending_only:
            raise CallPendingError(
                f"{self.role}: {method}() has not finished on ranks {silent} within {timeout_s} s (get's timeout_s); "
                f"the call goes on and the role is untouched: get() its future again (the role is stopped only "
                f"after call_timeout_s={self.call_timeout_s} s without an answer)",
                role=self.role, ranks=silent, method=method, future=future)
        if raised:
            err: ClusterError = self._raised_error(
                method, raised, f"; ranks {silent} did not finish within {self.settle_s} s after that (waiting in a "
                "collective for it?): the role's ranks were all stopped")
        else:
            err = WorkerTimeoutError(f"{self.role} ranks {silent} did not answer {method}() within "
                                     f"{self.call_timeout_s} s; the role's ranks were all stopped",
                                     role=self.role, ranks=silent, method=method)
        self._stop(err)
        raise err

    def _mark_read(self, seq: int) -> None:
        """Call ``seq``'s outcome has been handed to the caller: no later call raises it."""
        self._unread.pop(seq, None)

    def _raise_dropped(self, before: int | None = None, current: ClusterFuture | None = None) -> None:
        """Raise :class:`DroppedCallError` for the first call numbered below ``before`` (any, if None) that
        failed while nobody had read its future; settle (and forget) the decided ones that succeeded."""
        for seq in sorted(self._unread):
            if before is not None and seq >= before:
                break
            future = self._unread[seq]
            if not future._decided():
                continue
            ok, err = future._settle(None)
            del self._unread[seq]
            if ok:
                continue
            if current is None:
                this = "this call was not sent"
            else:
                this = (f"this call, {current.method}(), was sent before that was known and ran on every rank: "
                        "its result is error.future.get()")
            raise DroppedCallError(
                f"{self.role}: an earlier call {future.method}() failed and its future was never read: {err}; {this}",
                role=self.role, ranks=err.ranks, method=future.method, future=current) from err

    def _stop(self, why: ClusterError) -> None:
        """Kill every rank of the role (a group never ends split) and remember why."""
        self.failure = why
        logger.error("%s: stopping all %d ranks: %s", self.role, self.world_size, why)
        self._kill_all()

    def _kill_all(self) -> None:
        """Kill every rank and return once Ray reports each one dead (``ray.kill`` only asks: a call sent
        right after it may still run on a rank not yet killed). A rank still answering after
        :data:`STOP_CONFIRM_S` is logged, not waited for longer."""
        ray = require_ray()
        from ray.exceptions import RayActorError

        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        deadline = time.perf_counter() + STOP_CONFIRM_S
        alive = {w.__ray_ready__.remote(): w for w in self.workers}
        while alive and time.perf_counter() < deadline:
            ready, _ = ray.wait(list(alive), num_returns=len(alive), timeout=0.5)
            for ref in ready:
                w = alive.pop(ref)
                try:
                    ray.get(ref)
                except RayActorError:
                    continue  # dead, as asked
                except Exception:  # noqa: BLE001 - any other answer: ask again
                    pass
                time.sleep(0.02)
                alive[w.__ray_ready__.remote()] = w
        if alive:
            logger.error("%s: %d rank(s) still answered %.0f s after being killed", self.role, len(alive),
                         STOP_CONFIRM_S)

    def shutdown(self) -> None:
        """Stop every rank of the role (its state is lost; offload or checkpoint first if it matters)."""
        self._kill_all()
        if self.failure is None:
            self.failure = ClusterFailedError(f"role {self.role!r} was shut down", role=self.role)


__all__ = [
    "CallPendingError",
    "CallRecord",
    "Cluster",
    "ClusterError",
    "ClusterFailedError",
    "ClusterFuture",
    "DroppedCallError",
    "ResourcePool",
    "WorkerCallError",
    "WorkerDiedError",
    "WorkerTimeoutError",
    "require_ray",
]
