"""Worker-level state control: offload/reload around a worker's RPC-style methods.

A role's worker (actor_train, critic, reference) owns an :class:`~refimpl.store.OffloadStore`.
Between its turns on the GPU its state lives in host memory; a call that needs the
GPU reloads first and offloads after. This is ROLL's control surface:

* :meth:`WorkerStateControl.offload_states` / :meth:`WorkerStateControl.reload_states`
  move the state explicitly;
* :func:`auto_offload` wraps an RPC-style method: reload before, offload after,
  unless the call's ``meta_info["is_offload_states"]`` is ``False`` (the state then
  stays on the GPU for the next call, e.g. LoRA reference log-probs on the actor);
* :func:`state_offload_manager` is the same as a context manager and records
  onload / execute / offload times and device memory into a metrics dict;
* :func:`log_gpu_memory_usage` logs the driver's view of device memory.

Everything goes through the runtime seam, so it runs on TorchRuntime and in the simulator.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import threading
from typing import Any, Callable, Iterable, Iterator, Mapping, MutableMapping, Protocol, TypeVar

from refimpl.arguments import ArgumentTypeError, describe, expect, expect_bool
from refimpl.runtime.base import Runtime

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
GiB = float(1 << 30)


def memory_metrics(rt: Runtime, prefix: str) -> dict[str, float]:
    """``{prefix}/used_gib`` and ``{prefix}/free_gib`` from the driver (``cudaMemGetInfo``), not the allocator."""
    info = rt.memory_info()
    return {f"{prefix}/used_gib": info.used / GiB, f"{prefix}/free_gib": info.free / GiB}


def log_gpu_memory_usage(head: str, rt: Runtime, logger: logging.Logger | None = None,
                         rank: int | None = 0, level: int = logging.INFO) -> dict[str, float]:
    """Log device memory in use as the driver reports it, prefixed by ``head``.

    ``rank``: log only on this global rank (``None``: every rank). Returns the
    figures logged (also on ranks that do not log), so callers can keep them.
    """
    figures = memory_metrics(rt, head)
    if rank is None or rt.rank == rank:
        (logger or globals()["logger"]).log(
            level, "%s: device memory used %.2f GiB, free %.2f GiB (rank %d)",
            head, figures[f"{head}/used_gib"], figures[f"{head}/free_gib"], rt.rank,
        )
    return figures


class StateInUseError(RuntimeError):
    """An explicit offload was refused: a call inside :func:`state_offload_manager` still uses the state.

    Raised when the calling thread is itself inside such a call (waiting would deadlock), when
    ``offload_states(timeout_s=...)`` ran out of time waiting for the running calls to finish, and by
    :meth:`WorkerStateControl.offload_states_async` whenever a call is inside (a coroutine cannot wait
    on threads).
    """


class WorkerStateControl:
    """Offload and reload of one worker's state through its store.

    ``store`` is an :class:`~refimpl.store.OffloadStore` with the worker's model
    and optimizer attached, or a client of one (:mod:`refimpl.store.clients`: torch
    DDP, Megatron-core), which has the same ``offload_async``/``reload_async``. ``include`` limits the categories moved (default:
    all); ``drop_grads`` releases gradients without copying (zeros on reload).
    ``lifecycle``: the role's :class:`~refimpl.comm.PGLifecycle`, if its
    communicators move with its state: an offload is then ``lifecycle.pause``
    with the store's offload as the memory release, and a reload is
    ``lifecycle.resume`` before the store's reload. The worker's state starts
    on the device.

    Thread safety (a threaded Ray actor serves calls from several threads):
    calls inside :func:`state_offload_manager` are counted; an explicit
    :meth:`offload_states` from another thread **waits** until the last of them
    has left (``timeout_s`` bounds the wait, then :class:`StateInUseError`), and
    refuses at once from a thread that is itself inside a call. No state is ever
    moved from under a running call.
    """

    def __init__(self, store: Any, *, include: Iterable[str] | None = None, drop_grads: bool = False,
                 lifecycle: Any = None) -> None:
        from refimpl.store import Category

        call = "WorkerStateControl(store, ...)"
        if not hasattr(store, "offload_async") or not isinstance(getattr(store, "rt", None), Runtime):
            raise ArgumentTypeError(
                f"{call}: WorkerStateControl needs an OffloadStore (with the worker's state attached) or a client "
                f"of one, got {describe(store)}: build one with OffloadStore(rt) and attach_module(model)")
        self.store = store
        self.rt: Runtime = store.rt
        # a single name stays one name ("params", not "p", "a", ...); a typo fails here, not at the first move
        self.include = tuple(c.value for c in Category.select(include)) if include is not None else None
        self.drop_grads = expect_bool(drop_grads, call, "drop_grads")
        if lifecycle is not None and not (callable(getattr(lifecycle, "pause", None))
                                          and callable(getattr(lifecycle, "resume", None))):
            raise ArgumentTypeError(f"{call}: lifecycle must be a PGLifecycle or None, got {describe(lifecycle)}")
        self.lifecycle = lifecycle
        self.metrics: dict[str, float] = {}
        #: how many times state actually moved (a no-op offload or reload is not counted)
        self.moves: dict[str, int] = {"reload": 0, "offload": 0}
        self._paused = False  # the lifecycle's groups are paused (only with a lifecycle)
        self._users = 0  # calls inside state_offload_manager now (nested or from several threads)
        self._users_lock = threading.Condition()  # an RLock inside: a nested call re-enters it
        self._local = threading.local()  # this thread's depth inside calls

    @property
    def users(self) -> int:
        """Calls running inside :func:`state_offload_manager` now (only the outermost one moves state)."""
        return self._users

    @property
    def moves_are_rank_local(self) -> bool:
        """True when moving this rank's state runs no collective: no lifecycle, and a store (or a client's store)
        whose backend keeps each rank's bytes on its own (``"local"``). Only then can one rank's move be
        completed alone (what the cluster does after a call left its ranks split)."""
        if self.lifecycle is not None:
            return False
        store = getattr(self.store, "store", self.store)  # a client (DDP, Megatron) wraps its store
        return getattr(getattr(store, "backend", None), "name", None) == "local"

    @property
    def offloaded(self) -> bool:
        """True when any category of this worker's state is in host memory."""
        from refimpl.store import Category

        return any(self.store.is_offloaded(c) for c in Category.select(self.include))

    async def _offload(self) -> None:
        """The move itself, unguarded (callers hold the lock or run single-threaded)."""
        moved = not self.offloaded

        async def release() -> None:
            await self.store.offload_async(self.include, drop_grads=self.drop_grads)

        if self.lifecycle is not None and not self._paused:
            await self.lifecycle.pause(release_memory=release)
            self._paused = True
        else:
            await release()
        self.moves["offload"] += int(moved)

    async def _reload(self) -> None:
        moved = self.offloaded
        if self.lifecycle is not None and self._paused:
            await self.lifecycle.resume()
            self._paused = False
        await self.store.reload_async(self.include)
        self.moves["reload"] += int(moved)

    def _refuse_inside(self, what: str) -> None:
        if getattr(self._local, "depth", 0):
            raise StateInUseError(
                f"{what}() called from inside a state_offload_manager call on the same thread: the call still "
                "uses the state (waiting would deadlock); offload after the call returns, or let the outermost "
                "call offload (is_offload_states=True)")

    async def offload_states_async(self) -> None:
        """Move the state to host memory (no-op for state already there); refused while a call is inside."""
        self._refuse_inside("offload_states_async")
        if self._users:
            raise StateInUseError(f"offload_states_async(): {self._users} call(s) inside state_offload_manager "
                                  "still use the state; use offload_states() from a thread to wait for them")
        await self._offload()

    async def reload_states_async(self) -> None:
        """Bring the state back to the device (no-op for state already there)."""
        await self._reload()

    def offload_states(self, timeout_s: float | None = None) -> None:
        """Move the state to host memory, after every running call has left (``timeout_s``: bound on that wait).

        Raises :class:`StateInUseError` at once when this thread is inside a call, or when the wait
        runs out; then nothing moved.
        """
        self._refuse_inside("offload_states")
        with self._users_lock:
            if not self._users_lock.wait_for(lambda: self._users == 0, timeout=timeout_s):
                raise StateInUseError(f"offload_states(): {self._users} call(s) still use the state after "
                                      f"{timeout_s} s; nothing was moved")
            self.rt.run(self._offload())

    def reload_states(self) -> None:
        """Synchronous :meth:`reload_states_async` (serialised with calls and offloads of other threads)."""
        with self._users_lock:
            self.rt.run(self._reload())

    def enter_call(self) -> bool:
        """Count a call in; the first one in reloads the state. True for that outermost call.

        Used by :func:`state_offload_manager`; pair every call with :meth:`leave_call`.
        """
        with self._users_lock:  # the first caller reloads while later ones wait here: nobody runs on offloaded state
            outermost = self._users == 0
            if outermost:
                self.rt.run(self._reload())
            self._users += 1
            self._local.depth = getattr(self._local, "depth", 0) + 1
        return outermost

    def leave_call(self, offload: bool) -> bool:
        """Count a call out; the last one out offloads if ``offload``. True when this call offloaded."""
        with self._users_lock:
            self._users -= 1
            self._local.depth -= 1
            last = self._users == 0
            try:
                if last and offload:
                    self.rt.run(self._offload())
            finally:
                self._users_lock.notify_all()  # explicit offloads waiting for the calls to leave
        return last and offload


def wants_offload(meta_info: Mapping[str, Any] | None, default: bool = True) -> bool:
    """Whether a call should offload afterwards: ``meta_info["is_offload_states"]``, else ``default``.

    Only a real bool is accepted, so a typo like ``"false"`` fails loudly instead of
    keeping a model on the GPU by accident.
    """
    if not meta_info or "is_offload_states" not in meta_info:
        return default
    value = meta_info["is_offload_states"]
    if not isinstance(value, bool):
        raise TypeError(f"meta_info['is_offload_states'] must be a bool, got {value!r} ({type(value).__name__})")
    return value


def find_meta_info(args: tuple, kwargs: dict) -> Mapping[str, Any] | None:
    """A call's ``meta_info``: the ``meta_info=`` keyword, else the ``meta_info`` mapping of the first argument that has one."""
    if isinstance(kwargs.get("meta_info"), Mapping):
        return kwargs["meta_info"]
    for a in (*args, *kwargs.values()):
        mi = getattr(a, "meta_info", None)
        if isinstance(mi, Mapping):
            return mi
    return None


def state_offload_manager(control: WorkerStateControl, metrics: dict[str, float] | None = None,
                          metric_infix: str = "", is_offload_states: bool = True) -> contextlib.AbstractContextManager:
    """Reload the worker's state, run the body, then offload it unless told not to.

    Re-entrant and reference-counted: a call made inside another one (one
    decorated method calling another, or a second thread while the first is
    inside) neither reloads nor offloads; only the first call in reloads and
    only the last call out offloads (if that call asks to). Records into
    ``metrics`` (``time/onload{infix}``, ``time/execute{infix}``,
    ``time/offload{infix}`` in seconds, and driver memory after each phase) for
    the calls that moved state. If the body raises, the state is still
    offloaded (when asked) and the error propagates: nothing is left half-moved. The arguments are
    checked at the call.
    """
    call = "state_offload_manager(control, metrics, metric_infix, is_offload_states)"
    expect(control, WorkerStateControl, call, "control", "a WorkerStateControl",
           hint="wrap the store: WorkerStateControl(store)" if hasattr(control, "offload_async") else "")
    expect(metrics, MutableMapping, call, "metrics", "a dict or None", optional=True)
    expect(metric_infix, str, call, "metric_infix", "a str")
    expect_bool(is_offload_states, call, "is_offload_states")
    return _managed(control, metrics, metric_infix, is_offload_states)


@contextlib.contextmanager
def _managed(control: WorkerStateControl, metrics: dict[str, float] | None, metric_infix: str,
             is_offload_states: bool) -> Iterator[None]:
    rt = control.rt
    m = metrics if metrics is not None else control.metrics
    sfx = f"/{metric_infix}" if metric_infix else ""
    t0 = rt.now()
    outermost = control.enter_call()
    t1 = rt.now()
    if outermost:
        m[f"time/onload{sfx}"] = t1 - t0
        m.update(memory_metrics(rt, f"memory/after_onload{sfx}"))
    try:
        yield
    finally:
        t2 = rt.now()
        m[f"time/execute{sfx}"] = t2 - t1
        if control.leave_call(is_offload_states):
            m[f"time/offload{sfx}"] = rt.now() - t2
            m.update(memory_metrics(rt, f"memory/after_offload{sfx}"))


class StatefulWorker(Protocol):
    """What :func:`auto_offload` needs of the class it decorates: a :class:`WorkerStateControl` attribute.

    Its name is ``state`` unless the decorator is given another (``@auto_offload(control="ctl")``).
    """

    state: WorkerStateControl


def _control_of(obj: Any, attr: str, where: str) -> WorkerStateControl:
    control = getattr(obj, attr, None)
    if not isinstance(control, WorkerStateControl):
        raise TypeError(
            f"@auto_offload on {where} needs self.{attr} to be a WorkerStateControl, got "
            f"{type(control).__name__}: set it in __init__ (self.{attr} = WorkerStateControl(store)) or name the "
            "attribute that holds it with @auto_offload(control='name')")
    return control


def auto_offload(method: F | None = None, *, control: str = "state") -> Any:
    """Decorate a worker method: reload the state before the call, offload it after.

    The class holds its :class:`WorkerStateControl` in the attribute named
    ``control`` (default ``state``; see :class:`StatefulWorker`); a missing or
    wrong attribute is a ``TypeError`` at the call that names it. The offload is
    skipped when the call carries ``meta_info["is_offload_states"] = False`` (as
    a ``meta_info=`` keyword or as the ``meta_info`` attribute of an argument,
    e.g. a batch). Timings go to the control's ``metrics`` under the method's
    name. Re-entrant: a decorated method calling another moves state only around
    the outer call. Use as ``@auto_offload`` or ``@auto_offload(control="ctl")``.
    """
    if not isinstance(control, str) or not control.isidentifier():
        raise ArgumentTypeError(f"auto_offload(control=...) takes an attribute name, got {control!r}")
    if method is not None and not callable(method):
        hint = f"; to name the attribute, write @auto_offload(control={method!r})" if isinstance(method, str) else ""
        raise ArgumentTypeError(f"auto_offload(method): method must be the function to decorate, got "
                                f"{describe(method)}{hint}")

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(self, *args: Any, **kwargs: Any) -> Any:
            ctl = _control_of(self, control, f"{type(self).__name__}.{fn.__name__}")
            keep = wants_offload(find_meta_info(args, kwargs))
            with state_offload_manager(ctl, ctl.metrics, fn.__name__, is_offload_states=keep):
                return fn(self, *args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate(method) if method is not None else decorate


__all__ = [
    "StateInUseError",
    "StatefulWorker",
    "WorkerStateControl",
    "auto_offload",
    "find_meta_info",
    "log_gpu_memory_usage",
    "memory_metrics",
    "state_offload_manager",
    "wants_offload",
]
