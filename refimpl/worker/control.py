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
from typing import Any, Callable, Iterable, Iterator, Mapping, TypeVar

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


class WorkerStateControl:
    """Offload and reload of one worker's state through its store.

    ``store`` is an :class:`~refimpl.store.OffloadStore` with the worker's model
    and optimizer attached. ``include`` limits the categories moved (default:
    all); ``drop_grads`` releases gradients without copying (zeros on reload).
    The worker's state starts on the device.
    """

    def __init__(self, store: Any, *, include: Iterable[str] | None = None, drop_grads: bool = False) -> None:
        self.store = store
        self.rt: Runtime = store.rt
        self.include = tuple(include) if include is not None else None
        self.drop_grads = drop_grads
        self.metrics: dict[str, float] = {}
        self._users = 0  # calls inside state_offload_manager now (nested or from several threads)
        self._users_lock = threading.Condition()

    @property
    def users(self) -> int:
        """Calls running inside :func:`state_offload_manager` now (only the outermost one moves state)."""
        return self._users

    @property
    def offloaded(self) -> bool:
        """True when any category of this worker's state is in host memory."""
        from refimpl.store import Category

        return any(self.store.is_offloaded(c) for c in Category.select(self.include))

    async def offload_states_async(self) -> None:
        """Move the state to host memory (no-op for state already there)."""
        await self.store.offload_async(self.include, drop_grads=self.drop_grads)

    async def reload_states_async(self) -> None:
        """Bring the state back to the device (no-op for state already there)."""
        await self.store.reload_async(self.include)

    def offload_states(self) -> None:
        """Synchronous :meth:`offload_states_async`."""
        self.rt.run(self.offload_states_async())

    def reload_states(self) -> None:
        """Synchronous :meth:`reload_states_async`."""
        self.rt.run(self.reload_states_async())


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


def _find_meta_info(args: tuple, kwargs: dict) -> Mapping[str, Any] | None:
    if isinstance(kwargs.get("meta_info"), Mapping):
        return kwargs["meta_info"]
    for a in (*args, *kwargs.values()):
        mi = getattr(a, "meta_info", None)
        if isinstance(mi, Mapping):
            return mi
    return None


@contextlib.contextmanager
def state_offload_manager(control: WorkerStateControl, metrics: dict[str, float] | None = None,
                          metric_infix: str = "", is_offload_states: bool = True) -> Iterator[None]:
    """Reload the worker's state, run the body, then offload it unless told not to.

    Re-entrant and reference-counted: a call made inside another one (one
    decorated method calling another, or a second thread while the first is
    inside) neither reloads nor offloads; only the first call in reloads and
    only the last call out offloads (if that call asks to). Records into
    ``metrics`` (``time/onload{infix}``, ``time/execute{infix}``,
    ``time/offload{infix}`` in seconds, and driver memory after each phase) for
    the calls that moved state. If the body raises, the state is still
    offloaded (when asked) and the error propagates: nothing is left half-moved.
    """
    rt = control.rt
    m = metrics if metrics is not None else control.metrics
    sfx = f"/{metric_infix}" if metric_infix else ""
    cond = control._users_lock
    t0 = rt.now()
    with cond:  # the first caller reloads while later ones wait here, so nobody runs on offloaded state
        outermost = control._users == 0
        if outermost:
            control.reload_states()
        control._users += 1
    t1 = rt.now()
    if outermost:
        m[f"time/onload{sfx}"] = t1 - t0
        m.update(memory_metrics(rt, f"memory/after_onload{sfx}"))
    try:
        yield
    finally:
        t2 = rt.now()
        m[f"time/execute{sfx}"] = t2 - t1
        with cond:
            control._users -= 1
            last = control._users == 0
            if last and is_offload_states:
                control.offload_states()
        if last and is_offload_states:
            m[f"time/offload{sfx}"] = rt.now() - t2
            m.update(memory_metrics(rt, f"memory/after_offload{sfx}"))


def auto_offload(method: F) -> F:
    """Decorate a worker method (on a class with a ``state`` :class:`WorkerStateControl`).

    The state is reloaded before the call and offloaded after it, unless the call
    carries ``meta_info["is_offload_states"] = False`` (as a ``meta_info=`` keyword
    or as the ``meta_info`` attribute of an argument, e.g. a batch). Timings go to
    ``self.state.metrics`` under the method's name. Re-entrant: a decorated
    method calling another moves state only around the outer call.
    """

    @functools.wraps(method)
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        control: WorkerStateControl = self.state
        keep = wants_offload(_find_meta_info(args, kwargs))
        with state_offload_manager(control, control.metrics, method.__name__, is_offload_states=keep):
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


__all__ = [
    "WorkerStateControl",
    "auto_offload",
    "log_gpu_memory_usage",
    "memory_metrics",
    "state_offload_manager",
    "wants_offload",
]
