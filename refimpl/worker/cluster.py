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
``cluster.offload_states()`` / ``reload_states()`` move state explicitly. Each
call's per-rank metrics (onload / execute / offload seconds, device memory after
each phase, bytes moved) come back to the driver with the driver's own RPC time
(:class:`CallRecord`).

Faults. A group's ranks are one unit: a call's outcome is decided for all of them.

* A rank raises: the driver gives the other ranks ``settle_s`` to finish. If they
  do, :class:`WorkerCallError` names the role, the raising ranks and the method;
  every rank's state went through the same manager exit (offloaded, if the call
  asked for it), the group stays usable. If some do not finish (they wait in a
  collective for the rank that raised), the whole group is stopped: no rank is
  left in a half-done call.
* A rank dies: :class:`WorkerDiedError` as soon as Ray reports it; the group's
  other ranks are stopped with it (a group with a missing rank cannot run a
  collective).
* No answer within ``call_timeout_s``: :class:`WorkerTimeoutError` naming the ranks
  that did not answer; the group is stopped.

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
from refimpl.worker.role import RoleWorker, registration

logger = logging.getLogger(__name__)


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
    """The pending result of a non-blocking cluster call; :meth:`get` waits for it (within the call's bound)."""

    def __init__(self, cluster: "Cluster", method: str, refs: list[Any], collect: str, t0: float) -> None:
        self._cluster, self.method, self._refs, self._collect, self._t0 = cluster, method, refs, collect, t0
        self._done: tuple[bool, Any] | None = None

    def get(self, timeout_s: float | None = None) -> Any:
        """The call's result (every rank's, or rank 0's); raises the call's :class:`ClusterError`."""
        if self._done is None:
            try:
                self._done = (True, self._cluster.finish(self.method, self._refs, self._collect, self._t0, timeout_s))
            except ClusterError as e:
                self._done = (False, e)
        ok, value = self._done
        if not ok:
            raise value
        return value

    def done(self) -> bool:
        """True when every rank has answered (no waiting)."""
        ray = require_ray()
        ready, _ = ray.wait(self._refs, num_returns=len(self._refs), timeout=0)
        return len(ready) == len(self._refs)


class Cluster:
    """One role on a :class:`ResourcePool`: one Ray actor of ``worker_cls`` per rank, its methods RPCs to every rank.

    ``worker_cls`` derives from :class:`~refimpl.worker.role.RoleWorker`. ``config`` goes to every rank's
    constructor. ``max_concurrency``: calls one actor serves at once (2 or more lets an explicit
    ``offload_states`` arrive while a call runs; it waits for the call). ``call_timeout_s`` bounds every
    call; ``settle_s`` is how long the other ranks may take to finish after one raised.
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
        """Call the registered ``method`` on every rank; its result, or a :class:`ClusterFuture` if not ``blocking``."""
        reg = registration(getattr(self.worker_cls, method, None))
        if reg is None:
            raise AttributeError(f"{self.worker_cls.__name__} has no method {method!r} marked with @register")
        if self.failure is not None:
            raise ClusterFailedError(f"role {self.role!r} was stopped after an earlier failure ({self.failure}); "
                                     "start a new Cluster for it", role=self.role, method=method) from self.failure
        per_rank = self._split(method, reg, args)
        for a in per_rank:  # a bad is_offload_states fails here, at the driver, before any rank runs
            wants_offload(find_meta_info(a, kwargs))
        t0 = time.perf_counter()
        refs = [w.timeshare_call.remote(method, a, kwargs) for w, a in zip(self.workers, per_rank)]
        future = ClusterFuture(self, method, refs, reg.collect, t0)
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
        """Every rank's state to host memory (waits for any call running on a rank)."""
        return self.call("offload_states", blocking=blocking, timeout_s=timeout_s)

    def reload_states(self, blocking: bool = True, timeout_s: float | None = None) -> Any:
        """Every rank's state back to the device."""
        return self.call("reload_states", blocking=blocking, timeout_s=timeout_s)

    def moves(self) -> list[dict[str, Any]]:
        """Each rank's ``timeshare_moves()``: where its state is and how often it moved."""
        ray = require_ray()
        return ray.get([w.timeshare_moves.remote() for w in self.workers], timeout=self.call_timeout_s)

    # ------------------------------------------------------------------ gathering and faults

    def finish(self, method: str, refs: list[Any], collect: str, t0: float, timeout_s: float | None) -> Any:
        """Wait for every rank's answer to one call (see the module docstring for faults); the collected result."""
        ray = require_ray()
        from ray.exceptions import RayActorError, RayTaskError

        bound = self.call_timeout_s if timeout_s is None else timeout_s
        deadline = time.perf_counter() + bound
        pending = {ref: rank for rank, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        raised: dict[int, BaseException] = {}
        while pending:
            left = deadline - time.perf_counter()
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(left, 0.0))
            if not ready:
                self._on_silence(method, sorted(pending.values()), raised, bound)
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
                    deadline = min(deadline, time.perf_counter() + self.settle_s)
        if raised:
            raise self._raised_error(method, raised, "") from next(iter(raised.values()))
        rpc_s = time.perf_counter() - t0
        self.records.append(CallRecord(self.role, method, rpc_s, [m for _, m in results]))
        values = [v for v, _ in results]
        return values[0] if collect == "rank0" else values

    def _raised_error(self, method: str, raised: dict[int, BaseException], tail: str) -> WorkerCallError:
        ranks = sorted(raised)
        first = raised[ranks[0]]
        return WorkerCallError(f"{self.role} rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} raised "
                               f"in {method}(): {type(first).__name__}: {first}{tail}",
                               role=self.role, ranks=ranks, method=method)

    def _on_silence(self, method: str, silent: list[int], raised: dict[int, BaseException], bound: float) -> None:
        if raised:
            err: ClusterError = self._raised_error(
                method, raised, f"; ranks {silent} did not finish within {self.settle_s} s after that (waiting in a "
                "collective for it?): the role's ranks were all stopped")
        else:
            err = WorkerTimeoutError(f"{self.role} ranks {silent} did not answer {method}() within {bound} s; the "
                                     "role's ranks were all stopped", role=self.role, ranks=silent, method=method)
        self._stop(err)
        raise err

    def _stop(self, why: ClusterError) -> None:
        """Kill every rank of the role (a group never ends split) and remember why."""
        ray = require_ray()
        self.failure = why
        logger.error("%s: stopping all %d ranks: %s", self.role, self.world_size, why)
        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass

    def shutdown(self) -> None:
        """Stop every rank of the role (its state is lost; offload or checkpoint first if it matters)."""
        ray = require_ray()
        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        if self.failure is None:
            self.failure = ClusterFailedError(f"role {self.role!r} was shut down", role=self.role)


__all__ = [
    "CallRecord",
    "Cluster",
    "ClusterError",
    "ClusterFailedError",
    "ClusterFuture",
    "ResourcePool",
    "WorkerCallError",
    "WorkerDiedError",
    "WorkerTimeoutError",
    "require_ray",
]
