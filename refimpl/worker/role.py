"""The worker side of a role: one :class:`RoleWorker` per rank, run as a Ray actor by :class:`~refimpl.worker.cluster.Cluster`.

Theory of operation
-------------------
A role (actor_train, reference, actor_infer) is a class derived from
:class:`RoleWorker`. The cluster starts one actor of it per rank and hands each
its ``role``, ``rank``, ``world_size`` and the rank-0 actor's master address and
port (as verl's ``Worker`` and ROLL's ``Worker`` receive them); :meth:`RoleWorker.__init__`
puts them into the environment torch.distributed reads (``MASTER_ADDR``,
``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), so the worker's
own setup method calls ``init_process_group`` the way torchrun users do.

A method the driver may call is marked with :func:`register`: how the driver
splits its arguments over the ranks (``dispatch``), what it gathers back
(``collect``), and whether the call reloads the worker's state before and
offloads it after (``offload=True``, ROLL's default for every RPC). The marked
method itself is wrapped, so a registered method calling another one on the
same worker (a nested call) goes through the same reference-counted
:func:`~refimpl.worker.control.state_offload_manager`: only the outermost call
moves state. The state is whatever the worker puts in ``self.state_control``
(a :class:`~refimpl.worker.control.WorkerStateControl`, usually with the role's
``PGLifecycle`` so its communicators pause and resume with it); a worker
without one runs its calls with no moves.

The driver reaches every registered method through :meth:`RoleWorker.timeshare_call`,
which returns the method's result with the call's metrics (onload, execute,
offload seconds; device memory after each phase; bytes moved) for the driver to
gather.

Order. A threaded actor (``max_concurrency`` > 1) runs calls as they arrive, in
any order. The driver numbers every call of a role, and :class:`CallOrder` holds
a call back where the order decides where the state ends: an explicit move
(``offload_states`` / ``reload_states``: ``@register(ordered=True)``) starts once
every call submitted before it has finished, and a call that moves state around
itself (``offload=True``) starts once the last explicit move submitted before it
has finished. Other calls run at once (a call that releases a waiting one must
not wait behind it). Every rank thus ends in the state the submission order
gives it.

Interrupts. A ``KeyboardInterrupt`` inside a call (Ctrl-C, a cancelled call) comes
out of :meth:`RoleWorker.timeshare_call` as :class:`CallInterruptedError`, so the
driver names it (Ray would report only that a task was cancelled).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import socket
import threading
import time
from typing import Any, Callable, Mapping, TypeVar

from refimpl.arguments import expect, expect_int, expect_name
from refimpl.worker.control import (WorkerStateControl, find_meta_info, log_gpu_memory_usage, state_offload_manager,
                                    wants_offload)

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

#: how the driver hands a call's arguments to the ranks
DISPATCH_MODES = ("one_to_all", "scatter")
#: what the driver returns: every rank's result (a list in rank order) or rank 0's alone
COLLECT_MODES = ("all", "rank0")
REGISTER_ATTR = "_timeshare_register"


@dataclasses.dataclass(frozen=True)
class Registration:
    """How a :func:`register` ed method is called: ``dispatch`` (``"one_to_all"``: the same arguments to every
    rank; ``"scatter"``: each positional argument is a sequence of one item per rank), ``collect``
    (``"all"`` or ``"rank0"``), ``offload`` (reload before and offload after, unless the call's
    ``meta_info["is_offload_states"]`` is False), ``ordered`` (an explicit move of the state: on every rank
    it runs after the calls submitted before it, and calls with ``offload`` submitted after it run after
    it; see the module docstring)."""

    dispatch: str = "one_to_all"
    collect: str = "all"
    offload: bool = True
    ordered: bool = False

    def __post_init__(self) -> None:
        if self.dispatch not in DISPATCH_MODES:
            raise ValueError(f"register(dispatch={self.dispatch!r}): expected one of {DISPATCH_MODES}")
        if self.collect not in COLLECT_MODES:
            raise ValueError(f"register(collect={self.collect!r}): expected one of {COLLECT_MODES}")
        if not isinstance(self.offload, bool):
            raise TypeError(f"register(offload=...) takes a bool, got {self.offload!r}")
        if not isinstance(self.ordered, bool):
            raise TypeError(f"register(ordered=...) takes a bool, got {self.ordered!r}")


def registration(fn: Any) -> Registration | None:
    """The :class:`Registration` of a method marked with :func:`register`, else None."""
    return getattr(fn, REGISTER_ATTR, None)


def register(method: F | None = None, *, dispatch: str = "one_to_all", collect: str = "all",
             offload: bool = True, ordered: bool = False) -> Any:
    """Mark a :class:`RoleWorker` method as callable from the driver (``@register`` or ``@register(...)``).

    ROLL's and verl's ``@register(dispatch_mode=...)``: see :class:`Registration` for the arguments.
    With ``offload=True`` the method runs inside the worker's ``state_control`` manager, also when
    another method of the worker calls it directly (then it moves nothing: the outer call does).
    """
    reg = Registration(dispatch, collect, offload, ordered)

    def decorate(fn: F) -> F:
        if not reg.offload:
            setattr(fn, REGISTER_ATTR, reg)
            return fn

        @functools.wraps(fn)
        def managed(self: "RoleWorker", *args: Any, **kwargs: Any) -> Any:
            ctl = self.state_control
            if ctl is None:
                return fn(self, *args, **kwargs)
            keep = wants_offload(find_meta_info(args, kwargs))
            with state_offload_manager(ctl, self.call_metrics(), fn.__name__, is_offload_states=keep):
                return fn(self, *args, **kwargs)

        setattr(managed, REGISTER_ATTR, reg)
        return managed  # type: ignore[return-value]

    return decorate(method) if method is not None else decorate


class CallInterruptedError(RuntimeError):
    """A registered method was interrupted on this rank (``KeyboardInterrupt``: Ctrl-C, a cancelled call); the
    interrupt is the cause. The driver reports it as a :class:`~refimpl.worker.cluster.WorkerCallError`."""


class CallOrderError(RuntimeError):
    """A call waited longer than its bound for the calls it must follow (see :class:`CallOrder`): a call
    submitted before it never arrived or never finished on this rank, or every thread of the actor is taken
    by calls that wait; nothing of the call ran."""


class CallOrder:
    """Which of a role's numbered calls have finished on this rank; holds a call back until those it must
    follow have (see the module docstring). The driver numbers the calls 0, 1, 2, ... and sends every call
    to every rank, so "every call before ``n`` has finished" is one counter."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._finished: set[int] = set()
        self._below = 0  # every call numbered below this has finished

    @property
    def finished_below(self) -> int:
        """Every call numbered below this one has finished on this rank."""
        return self._below

    def wait(self, until: int, timeout_s: float | None, what: str) -> None:
        """Return once every call numbered below ``until`` has finished; :class:`CallOrderError` after
        ``timeout_s``."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._below >= until, timeout=timeout_s):
                missing = sorted(set(range(self._below, until)) - self._finished)
                raise CallOrderError(
                    f"{what} waited {timeout_s} s for the calls submitted before it; calls {missing[:8]} have not "
                    "finished on this rank (still running, never arrived, or no free thread: raise the cluster's "
                    "max_concurrency)")

    def finish(self, seq: int) -> None:
        """Record that call ``seq`` has finished (whatever its outcome) and wake the calls waiting for it."""
        with self._cond:
            if seq >= self._below:  # a call counted twice (skipped as cancelled, then run after all) is ignored
                self._finished.add(seq)
            while self._below in self._finished:
                self._finished.discard(self._below)
                self._below += 1
            self._cond.notify_all()


def free_port() -> int:
    """A TCP port free on this node now (for the rank-0 actor's process group)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class RoleWorker:
    """One rank of a role, run as a Ray actor; derive a role's worker from it.

    The constructor takes what the cluster hands every rank: ``role``,
    ``rank``, ``world_size``, ``master_addr`` / ``master_port`` (None on rank
    0: it picks them, the cluster asks it, then starts the other ranks with
    them) and ``config`` (anything the role needs, passed unchanged). A derived
    worker sets ``self.state_control`` once its state is in a store (usually in
    a registered setup method that also calls ``init_process_group``).
    """

    def __init__(self, role: str, rank: int, world_size: int, master_addr: str | None = None,
                 master_port: int | None = None, config: Mapping[str, Any] | None = None) -> None:
        call = f"{type(self).__name__}(role, rank, world_size, ...)"
        expect_name(role, call, "role")
        expect_int(world_size, call, "world_size", minimum=1)
        expect_int(rank, call, "rank", minimum=0)
        expect_name(master_addr, call, "master_addr", optional=True)
        expect_int(master_port, call, "master_port", minimum=0, optional=True)
        expect(config, Mapping, call, "config", "a mapping or None", optional=True)
        if not (0 <= rank < world_size):
            raise ValueError(f"rank {rank} outside a world of {world_size}")
        if master_addr is None:
            if rank != 0:
                raise ValueError(f"{role} rank {rank}: only rank 0 may start without a master address")
            master_addr, master_port = _node_ip(), free_port()
        self.role, self.rank, self.world_size = role, rank, world_size
        self.master_addr, self.master_port = master_addr, int(master_port)
        self.config = dict(config or {})
        self.state_control: WorkerStateControl | None = None
        self.call_order = CallOrder()
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(self.master_port), RANK=str(rank),
                          WORLD_SIZE=str(world_size), LOCAL_RANK="0")
        self._local = threading.local()

    # ------------------------------------------------------------------ the framework's entry points

    def master_address(self) -> tuple[str, int]:
        """``(address, port)`` of this rank's process-group rendezvous (asked of rank 0 by the cluster)."""
        return self.master_addr, self.master_port

    def call_metrics(self) -> dict[str, float]:
        """The metrics dict of the driver call running on this thread (the control's own dict outside one)."""
        current = getattr(self._local, "metrics", None)
        if current is not None:
            return current
        return self.state_control.metrics if self.state_control is not None else {}

    def timeshare_call(self, name: str, args: tuple, kwargs: dict,
                       order: tuple[int, int, float | None] | None = None) -> tuple[Any, dict[str, float]]:
        """Run the registered method ``name``; return ``(result, metrics of this call)``.

        ``order``: ``(number, after, timeout_s)`` from the driver: this call's number in the role, and the
        calls numbered below ``after`` must have finished first (waited for at most ``timeout_s``, then
        :class:`CallOrderError`); None runs it at once, unnumbered. A ``KeyboardInterrupt`` comes out as
        :class:`CallInterruptedError`.
        """
        try:
            if order is not None:
                seq, after, timeout_s = order
                self.call_order.wait(after, timeout_s, f"{self.role} rank {self.rank} call {seq} {name}()")
            return self._call(name, args, kwargs)
        except KeyboardInterrupt as e:
            raise CallInterruptedError(f"{name}() was interrupted: KeyboardInterrupt: {e}") from e
        finally:
            if order is not None:
                self.call_order.finish(order[0])

    def _call(self, name: str, args: tuple, kwargs: dict) -> tuple[Any, dict[str, float]]:
        fn = getattr(self, name, None)
        if fn is None or registration(fn) is None:
            raise AttributeError(f"{type(self).__name__} has no method {name!r} marked with @register")
        metrics: dict[str, float] = {}
        self._local.metrics = metrics
        ctl = self.state_control
        before = dict(ctl.moves) if ctl is not None else {}
        if ctl is not None:
            log_gpu_memory_usage(f"{self.role} {name} start", ctl.rt, logger)
        self.before_call(name)
        t0 = time.perf_counter()
        try:
            out = fn(*args, **kwargs)
        finally:
            self._local.metrics = None
        metrics[f"time/call/{name}"] = time.perf_counter() - t0
        self.after_call(name, metrics)
        ctl = self.state_control  # a setup call may have made it
        if ctl is not None:
            self._record_bytes(ctl, before, name, metrics)
            log_gpu_memory_usage(f"{self.role} {name} end", ctl.rt, logger)
        return out, metrics

    def before_call(self, name: str) -> None:
        """Hook run before every driver call of method ``name`` (default: nothing; e.g. reset a peak-memory counter)."""

    def after_call(self, name: str, metrics: dict[str, float]) -> None:
        """Hook run after every driver call, with the call's ``metrics`` to add to (default: nothing)."""

    @staticmethod
    def _record_bytes(ctl: WorkerStateControl, before: Mapping[str, int], name: str, metrics: dict[str, float]) -> None:
        st = ctl.store.stats()
        if ctl.moves["reload"] > before.get("reload", 0):
            metrics[f"bytes/onload/{name}"] = float(st.last_reload_bytes)
        if ctl.moves["offload"] > before.get("offload", 0):
            metrics[f"bytes/offload/{name}"] = float(st.last_offload_bytes)

    def timeshare_skip(self, seq: int) -> None:
        """Count call ``seq`` as finished on this rank without running it: Ray reported it cancelled, so it may
        never run here, and the calls ordered after it must not wait for it."""
        self.call_order.finish(seq)

    def timeshare_ping(self) -> tuple[str, int, int]:
        """``(role, rank, pid)``: the actor is up and serving calls."""
        return self.role, self.rank, os.getpid()

    def timeshare_moves(self) -> dict[str, Any]:
        """Where this rank's state is and how often it moved: ``{"offloaded", "reload", "offload", "users",
        "rank_local"}`` (``rank_local``: moving it runs no collective, see
        :attr:`~refimpl.worker.control.WorkerStateControl.moves_are_rank_local`)."""
        ctl = self.state_control
        if ctl is None:
            return {"offloaded": False, "reload": 0, "offload": 0, "users": 0, "rank_local": True}
        return {"offloaded": ctl.offloaded, **ctl.moves, "users": ctl.users, "rank_local": ctl.moves_are_rank_local}

    @register(offload=False, ordered=True)
    def offload_states(self, timeout_s: float | None = None) -> None:
        """Move this rank's state to host memory, after every call the driver sent before it (ROLL's
        ``offload_states``)."""
        if self.state_control is not None:
            t0 = time.perf_counter()
            self.state_control.offload_states(timeout_s=timeout_s)
            self.call_metrics()["time/offload/offload_states"] = time.perf_counter() - t0

    @register(offload=False, ordered=True)
    def reload_states(self) -> None:
        """Bring this rank's state back to the device (ROLL's ``reload_states``)."""
        if self.state_control is not None:
            t0 = time.perf_counter()
            self.state_control.reload_states()
            self.call_metrics()["time/onload/reload_states"] = time.perf_counter() - t0

    def publish(self, obj: Any) -> Any:
        """Put ``obj`` into Ray's object store; the returned reference can be handed to another role's call."""
        import ray

        return ray.put(obj)

    @staticmethod
    def fetch(obj: Any) -> Any:
        """The value behind an object reference another role :meth:`publish` ed (anything else unchanged)."""
        import ray

        return ray.get(obj) if isinstance(obj, ray.ObjectRef) else obj


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - outside Ray (a worker built directly in a test): this host
        return "127.0.0.1"


__all__ = [
    "COLLECT_MODES",
    "CallInterruptedError",
    "CallOrder",
    "CallOrderError",
    "DISPATCH_MODES",
    "Registration",
    "RoleWorker",
    "free_port",
    "register",
    "registration",
]
